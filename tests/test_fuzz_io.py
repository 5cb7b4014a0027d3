"""Property-based fuzzing of the converters and the Zarr reader: arbitrary, truncated and
mutated inputs either parse into consistent, finite data or raise a clear error (ValueError /
DatasetError / FileNotFoundError) -- never another exception, and never partial output."""

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dmp.io import (open_dataset, read_vecs, write_dense, write_ratings,  # noqa: E402
                    write_sparse, write_sparse_rows)
from dmp.io.ratings import read_ratings_file  # noqa: E402
from dmp.io.sparse import DatasetError  # noqa: E402
from dmp.io.svmlight import convert_svmlight, read_svmlight  # noqa: E402

CLEAR = (ValueError, FileNotFoundError)   # DatasetError and UnicodeDecodeError are ValueErrors
#: examples per property; DMP_FUZZ_EXAMPLES=2000 for a deep run outside the test suite
EXAMPLES = int(os.environ.get("DMP_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
#: the store properties copy a store per example: fewer of them in the suite
STORE_FUZZ = settings(FUZZ, max_examples=max(EXAMPLES // 3, 10))

VALID_SVM = (b"1 1:0.5 3:1.25\n-1 2:2 4:-1\n0.5 1:1 2:1 3:1 4:1\n2 4:3e-2\n")
VALID_RATINGS = b"userId,movieId,rating\n1,10,4.0\n1,11,3.5\n2,10,5\n3,12,1\n"


def _mutations():
    """Valid files truncated, with bytes replaced, or with lines duplicated."""
    base = st.sampled_from([VALID_SVM, VALID_RATINGS])

    def mutate(args):
        data, cut, pos, junk = args
        kind = cut % 3
        if kind == 0:
            return data[: cut % (len(data) + 1)]
        if kind == 1:
            p = pos % max(len(data), 1)
            return data[:p] + junk + data[p + len(junk):]
        return data + data[: pos % (len(data) + 1)]

    return st.tuples(base, st.integers(0, 10_000), st.integers(0, 10_000),
                     st.binary(min_size=1, max_size=8)).map(mutate)


FILES = st.one_of(st.binary(max_size=300), _mutations(),
                  st.text(alphabet=" \t\n:,.-+eE0123456789naifNIF#", max_size=200).map(
                      lambda s: s.encode()))


def _write(data: bytes) -> Path:
    d = Path(tempfile.mkdtemp(prefix="dmp-fuzz-"))
    p = d / "input.txt"
    p.write_bytes(data)
    return p


@FUZZ
@given(FILES)
def test_svmlight_reader_parses_or_says_why(data):
    path = _write(data)
    try:
        X, y = read_svmlight(path)
    except CLEAR:
        return
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
    assert X.shape[0] == y.shape[0] > 0
    assert np.all(np.isfinite(X.data)) and np.all(np.isfinite(y))


@FUZZ
@given(FILES)
def test_svmlight_converter_leaves_nothing_half_written(data):
    path = _write(data)
    dest = path.parent / "out.zarr"
    try:
        convert_svmlight(path, dest, n_shards=2)
    except CLEAR:
        assert not dest.exists()
        assert not [p for p in path.parent.iterdir() if p.name.startswith("out.zarr")]
        return
    finally:
        if not dest.exists():
            shutil.rmtree(path.parent, ignore_errors=True)
    ds = open_dataset(dest)
    assert ds.shape[0] > 0 and ds.nnz >= 0
    shutil.rmtree(path.parent, ignore_errors=True)


@FUZZ
@given(st.one_of(st.binary(max_size=300),
                 st.tuples(st.integers(1, 6), st.integers(0, 5), st.binary(max_size=40)).map(
                     lambda a: (np.int32(a[0]).tobytes() + bytes(4 * a[0])) * a[1] + a[2])),
       st.sampled_from(["fvecs", "bvecs", "ivecs"]))
def test_vecs_reader_parses_or_says_why(data, ext):
    d = Path(tempfile.mkdtemp(prefix="dmp-fuzz-"))
    path = d / f"input.{ext}"
    path.write_bytes(data)
    try:
        X = read_vecs(path, mmap=False)
    except CLEAR:
        return
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert X.ndim == 2 and X.shape[0] >= 1 and X.shape[1] >= 1


@FUZZ
@given(FILES)
def test_ratings_reader_parses_or_says_why(data):
    path = _write(data)
    try:
        out = read_ratings_file(path)
    except CLEAR:
        return
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
    users, items, ratings = out[0], out[1], out[2]
    assert len(users) == len(items) == len(ratings) > 0
    assert np.all(np.isfinite(np.asarray(ratings, dtype=float)))


@pytest.fixture(scope="module")
def valid_stores(tmp_path_factory):
    """One small store of each kind: column blocks, row blocks, ratings (three splits, ids)."""
    import scipy.sparse as sp

    X = sp.random(40, 30, density=0.2, random_state=0, format="csc")
    root = tmp_path_factory.mktemp("stores")
    write_sparse(root / "columns.zarr", X, np.arange(40.0), n_shards=3)
    write_sparse_rows(root / "rows.zarr", X.tocsr(), np.arange(40.0), n_shards=3)
    R = sp.random(50, 20, density=0.3, random_state=1, format="coo")
    codes = np.random.default_rng(0).integers(0, 3, R.nnz)
    write_ratings(root / "ratings.zarr", R.row, R.col, 5 * R.data, shape=R.shape, split=codes,
                  user_ids=np.arange(100, 150), item_ids=[f"m{j}" for j in range(20)])
    rng = np.random.default_rng(2)
    write_dense(root / "dense.zarr", rng.standard_normal((40, 6)), n_shards=3,
                queries=rng.standard_normal((5, 6)))
    return {"columns": root / "columns.zarr", "rows": root / "rows.zarr",
            "ratings": root / "ratings.zarr", "dense": root / "dense.zarr"}


def _read_everything(path):
    """Open the store and read every array the way the estimators do, checking that what
    comes back is consistent and finite."""
    ds = open_dataset(path)
    if ds.KIND == "sparse-columns":
        for k in range(ds.n_shards):
            M = ds.load_shard(k)
            assert M.shape == (ds.shape[0], int(ds.col_bounds[k + 1] - ds.col_bounds[k]))
            assert np.all(np.isfinite(M.data))
        assert np.all(np.isfinite(ds.load_y()))
    elif ds.KIND == "sparse-rows":
        for k in range(ds.n_shards):
            M, y = ds.load_rows(k)
            assert M.shape == (int(ds.row_bounds[k + 1] - ds.row_bounds[k]), ds.shape[1])
            assert len(y) == M.shape[0] and np.all(np.isfinite(M.data))
        ds.validate()
    elif ds.KIND == "dense-rows":
        for k in range(ds.n_shards):
            X = ds.load_shard(k)
            assert X.shape == (int(ds.row_bounds[k + 1] - ds.row_bounds[k]), ds.shape[1])
            assert np.all(np.isfinite(X))
        Q = ds.load_queries()
        assert Q is None or (Q.shape == (ds.n_queries, ds.shape[1]) and np.all(np.isfinite(Q)))
    else:
        ds.validate()
        for split in ds.splits:
            u, i, r = ds.to_coo(split)
            assert len(u) == len(i) == len(r) == ds.nnz_of(split)
            assert np.all((0 <= u) & (u < ds.n_users)) and np.all((0 <= i) & (i < ds.n_items))
            assert np.all(np.isfinite(r))


def _corrupt(victim: Path, how: int, junk: bytes) -> None:
    raw = victim.read_bytes()
    if how == 0:
        victim.write_bytes(raw[: len(raw) // 2])            # truncated
    elif how == 1:
        victim.write_bytes(junk)                             # replaced
    elif how == 2:
        victim.unlink()                                      # missing
    else:
        p = len(raw) // 3                                    # bytes flipped inside
        victim.write_bytes(raw[:p] + bytes(b ^ 0xFF for b in raw[p:p + 8]) + raw[p + 8:])


def _copy(store: Path) -> tuple[Path, Path]:
    d = Path(tempfile.mkdtemp(prefix="dmp-fuzz-store-"))
    copy = d / store.name
    shutil.copytree(store, copy)
    return d, copy


KINDS = ["columns", "rows", "ratings", "dense"]


@pytest.mark.parametrize("kind", KINDS)
@STORE_FUZZ
@given(which=st.integers(0, 10_000), how=st.integers(0, 3), junk=st.binary(max_size=64))
def test_corrupt_store_is_rejected_clearly(valid_stores, kind, which, how, junk):
    store = valid_stores[kind]
    files = sorted(p for p in store.rglob("*") if p.is_file())
    d, copy = _copy(store)
    try:
        _corrupt(copy / files[which % len(files)].relative_to(store), how, junk)
        try:
            _read_everything(copy)
        except CLEAR:
            pass
    finally:
        shutil.rmtree(d, ignore_errors=True)


#: values an attacker or a buggy writer could declare: huge sizes (no allocation may happen
#: before they are checked against the arrays), negative, fractional, wrong types
HOSTILE = st.one_of(
    st.sampled_from([2**62, 2**40, -1, 0, 1, 3, 1.5, float("nan"), "", "float64", None,
                     True, [], [2**62, 2**62], [-5, 3], [0, 2**40, 30], {"train": 2**50}]),
    st.integers(-2**63, 2**63 - 1),
    st.lists(st.integers(-2**40, 2**40), max_size=5))


@pytest.mark.parametrize("kind", KINDS)
@STORE_FUZZ
@given(which=st.integers(0, 10_000), value=HOSTILE, in_array=st.booleans())
def test_hostile_metadata_is_rejected_before_allocating(valid_stores, kind, which, value,
                                                        in_array):
    """Any attribute of the dataset, or the declared shape of any array, replaced by a
    hostile value: the store reads consistently or fails with a clear error -- never a
    MemoryError from allocating a declared size, never another exception, never a hang."""
    import json

    store = valid_stores[kind]
    d, copy = _copy(store)
    try:
        if in_array:
            metas = sorted(p for p in copy.rglob("zarr.json")
                           if json.loads(p.read_text())["node_type"] == "array")
            meta = metas[which % len(metas)]
            doc = json.loads(meta.read_text())
            key = "shape"
        else:
            meta = copy / "zarr.json"
            doc = json.loads(meta.read_text())
            attrs = doc["attributes"]
            key = sorted(attrs)[which % len(attrs)]
            doc = {**doc, "attributes": {**attrs, key: value}}
        if in_array:
            doc[key] = value
        meta.write_text(json.dumps(doc))
        try:
            _read_everything(copy)
        except CLEAR:
            pass
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_fuzz_sanity(tmp_path):
    """The strategies do produce both valid and invalid inputs."""
    assert isinstance(DatasetError("x"), ValueError)
    files = {"svm": VALID_SVM, "bad": b"1 3:x\n", "ratings": VALID_RATINGS}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    X, y = read_svmlight(tmp_path / "svm")
    assert X.shape == (4, 4)
    with pytest.raises(CLEAR):
        read_svmlight(tmp_path / "bad")
    users, items, ratings = read_ratings_file(tmp_path / "ratings")
    assert len(users) == len(items) == len(ratings) == 4


@pytest.mark.parametrize("kind", ["columns", "rows"])
def test_huge_declared_size_is_refused_before_allocating(valid_stores, kind):
    """A store declaring 2**40 samples consistently (attributes and array metadata) is
    refused with a message naming the size, without trying to allocate 8 TiB."""
    import json

    d, copy = _copy(valid_stores[kind])
    try:
        root = json.loads((copy / "zarr.json").read_text())
        attrs = root["attributes"]
        huge = 2**40
        attrs["shape"] = [huge, attrs["shape"][1]]
        meta = copy / "y" / "zarr.json"
        if kind == "rows":
            attrs["row_bounds"] = [*attrs["row_bounds"][:-1], huge]
            meta = copy / "shards" / f"s{attrs['n_shards'] - 1:04d}" / "indptr" / "zarr.json"
        (copy / "zarr.json").write_text(json.dumps(root))
        doc = json.loads(meta.read_text())
        doc["shape"] = [huge if kind == "columns" else huge - attrs["row_bounds"][-2] + 1]
        meta.write_text(json.dumps(doc))
        ds = open_dataset(copy)
        with pytest.raises(DatasetError, match=r"declares [\d,]+\.\d GiB, more than"):
            ds.load_y() if kind == "columns" else ds.load_rows(ds.n_shards - 1)
    finally:
        shutil.rmtree(d, ignore_errors=True)


VALID_DOCWORD = b"3\n5\n6\n1 1 2\n1 3 1\n2 2 4\n2 5 1\n3 1 1\n3 4 3\n"
DOCWORDS = st.one_of(
    st.binary(max_size=200),
    st.tuples(st.just(VALID_DOCWORD), st.integers(0, 10_000), st.integers(0, 10_000),
              st.binary(min_size=1, max_size=6)).map(
        lambda a: (a[0][: a[1] % (len(a[0]) + 1)] if a[1] % 2 else
                   a[0][: a[2] % len(a[0])] + a[3] + a[0][a[2] % len(a[0]) + len(a[3]):])),
    st.text(alphabet=" \n-0123456789", max_size=120).map(lambda s: s.encode()))


@FUZZ
@given(DOCWORDS, st.booleans())
def test_uci_converter_parses_or_says_why(data, gz):
    import gzip as gzip_

    from dmp.io import convert_corpus

    d = Path(tempfile.mkdtemp(prefix="dmp-fuzz-uci-"))
    try:
        src = d / ("docword.txt.gz" if gz else "docword.txt")
        src.write_bytes(gzip_.compress(data) if gz else data)
        dest = d / "c.zarr"
        try:
            ds = convert_corpus(src, dest)
        except CLEAR:
            assert not dest.exists() and [p.name for p in d.iterdir()] == [src.name]
            return
        X, _ = ds.load_row_shards(list(range(ds.n_shards)))
        assert X.nnz > 0 and np.all(X.data >= 1) and np.all(X.data == np.round(X.data))
    finally:
        shutil.rmtree(d, ignore_errors=True)


@FUZZ
@given(st.one_of(st.binary(max_size=200),
                 st.text(max_size=200).map(lambda s: s.encode("utf-8"))),
       st.integers(1, 3))
def test_text_converter_parses_or_says_why(data, min_count):
    from dmp.io import convert_corpus

    d = Path(tempfile.mkdtemp(prefix="dmp-fuzz-text-"))
    try:
        src = d / "docs.txt"
        src.write_bytes(data)
        dest = d / "c.zarr"
        try:
            ds = convert_corpus(src, dest, format="text", min_count=min_count,
                                stop_words=None)
        except CLEAR:
            assert not dest.exists()
            return
        X, _ = ds.load_row_shards(list(range(ds.n_shards)))
        vocab = ds.load_vocabulary()
        assert X.shape[1] == len(vocab) and np.all(np.diff(X.indptr) > 0)
        assert np.all(np.asarray(X.sum(axis=0)).ravel() >= min_count)
    finally:
        shutil.rmtree(d, ignore_errors=True)
