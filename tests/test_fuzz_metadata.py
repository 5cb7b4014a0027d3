"""Hostile store metadata: the dmp attributes of every kind of store dmp writes, and the
``zarr.json`` of every array in it (shape, chunk shape, data type, fill value), replaced by
absurd, negative, huge, mistyped or path-like values or deleted.  Opening the store
(`dmp.io.open_dataset`), ``dmp data info --validate`` and loading its shards the way the
estimators' workers do either succeed or raise a `DatasetError` -- never a MemoryError, a raw
numpy / zarr error, a KeyError or a TypeError -- before anything large is allocated, and
nothing is written anywhere."""

import contextlib
import io
import json
import os
import shutil
import tempfile
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dmp.exceptions import DMPError  # noqa: E402
from dmp.io import (DatasetError, convert_corpus, open_dataset, write_dense,  # noqa: E402
                    write_ratings, write_sparse, write_sparse_rows)

#: examples per store kind; DMP_FUZZ_EXAMPLES=2000 for a deep run outside the test suite
EXAMPLES = max(int(os.environ.get("DMP_FUZZ_EXAMPLES", "36")) // 3, 4)
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
#: what one hostile example may allocate while it is opened, validated and read
PEAK_BYTES = 64 * 2**20

KINDS = ["columns", "rows", "dense", "ratings", "corpus", "factors", "coef"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One small store of every kind dmp writes: column blocks, row blocks, dense rows,
    ratings (three splits, ids), a corpus (vocabulary, names, column sums), the factors of a
    `MatrixFactorization(factors_store=...)` fit and the ``coef.zarr`` of ``dmp run``."""
    from dmp.decomposition import MatrixFactorization
    from dmp.linear_model import Lasso
    from dmp.reports import _write_coef

    root = tmp_path_factory.mktemp("hostile")
    X = sp.random(40, 30, density=0.2, random_state=0, format="csc")
    y = np.arange(40.0)
    write_sparse(root / "columns.zarr", X, y, n_shards=3)
    write_sparse_rows(root / "rows.zarr", X.tocsr(), y, n_shards=3)
    rng = np.random.default_rng(2)
    write_dense(root / "dense.zarr", rng.standard_normal((40, 6)), n_shards=3,
                queries=rng.standard_normal((5, 6)))
    R = sp.random(50, 20, density=0.3, random_state=1, format="coo")
    codes = np.random.default_rng(0).integers(0, 3, R.nnz)
    write_ratings(root / "ratings.zarr", R.row, R.col, 1 + 4 * R.data, shape=R.shape,
                  split=codes, user_ids=np.arange(100, 150),
                  item_ids=[f"m{j}" for j in range(20)])
    words = ["alpha", "beta", "gamma", "delta", "omega"]
    (root / "docs.txt").write_text("\n".join(" ".join(rng.choice(words, 6))
                                             for _ in range(30)))
    convert_corpus(root / "docs.txt", root / "corpus.zarr", format="text", min_count=1,
                   stop_words=None, n_shards=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # ConvergenceWarning of the tiny fits
        MatrixFactorization(n_components=3, max_iter=2, backend="local", n_workers=2,
                            factors_store=str(root / "factors.zarr")).fit(R.tocsr())
        _write_coef(root / "coef.zarr", Lasso(alpha=0.1, max_iter=5).fit(X, y))
    return {k: root / f"{k}.zarr" for k in KINDS}


def read_like_a_fit(path) -> None:
    """Open the store and read it as the estimators do: the driver's metadata and
    statistics, every shard the way a worker loads it (`validate` is `cli_validate`'s)."""
    ds = open_dataset(path)
    if ds.KIND == "sparse-columns":       # Lasso
        ds.column_partition(min(2, ds.n_shards))
        ds.load_y()
        ds.load_col_stats()
        for k in range(ds.n_shards):
            ds.load_shard(k)
        ds.load_shards(list(range(ds.n_shards)))
    elif ds.KIND == "sparse-rows":        # sparsified SGD, LDA
        ds.row_partition(min(2, ds.n_shards))
        ds.column_sums()
        for k in range(ds.n_shards):
            ds.load_rows(k)
        ds.load_row_shards(list(range(ds.n_shards))[::-1])
        ds.load_vocabulary()
        ds.load_names(0, 3)
    elif ds.KIND == "dense-rows":         # binary autoencoders
        ds.row_partition(min(2, ds.n_shards))
        for k in range(ds.n_shards):
            ds.load_shard(k)
        ds.load_points([0, ds.n_samples - 1])
        ds.load_queries()
    else:                                 # matrix factorisation
        for split in ds.splits:
            ds.balanced_bounds(1, 0, split)
            ds.balanced_bounds(1, 1, split)
            ds.load_rows(0, ds.n_users, split)
            ds.load_cols(0, ds.n_items, split)
            ds.to_coo(split)
        ds.load_ids()


def cli_validate(path) -> int:
    """``dmp data info --validate PATH``: its exit status; a failure is one line naming a
    `DatasetError`, never a traceback."""
    from dmp.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["data", "info", "--validate", str(path)])
    assert rc in (0, 2), rc
    if rc:
        assert err.getvalue().startswith("dmp: error: ") and "Traceback" not in err.getvalue()
    return rc


#: values a buggy writer or an attacker could declare: huge (34 billion rows, 2**62, ...),
#: negative, fractional, not a number, of the wrong type, path-like, empty
HOSTILE = st.one_of(
    st.sampled_from([2**62, 2**40, 34_000_000_000, 2**31, -1, 0, 1, 3, 1.5, float("nan"),
                     float("inf"), "", "float64", "int8", "float32", "string", "bool",
                     "../../outside", "/tmp/elsewhere", "..", None, True, False, [], {},
                     [2**62], [2**40], [34_000_000_000], [0], [-1], [1.5], [2**62, 2**62],
                     [-5, 3], [0, 2**40, 30], [0, 34_000_000_000], ["../x"],
                     {"train": 2**50}, {"name": "regular", "configuration": {}}]),
    st.integers(-2**63, 2**63 - 1),
    st.lists(st.integers(-2**40, 2**40), max_size=4))

#: the fields of an array's zarr.json that a mutation targets
ARRAY_FIELDS = ["shape", "chunk_grid.configuration.chunk_shape", "data_type", "fill_value",
                "chunk_grid", "codecs"]

DELETE = object()


def _mutated(doc: dict, field: str, value) -> dict:
    doc = json.loads(json.dumps(doc))
    *parents, last = field.split(".")
    d = doc
    for p in parents:
        d = d.get(p) if isinstance(d, dict) else None
    if isinstance(d, dict):
        if value is DELETE:
            d.pop(last, None)
        else:
            d[last] = value
    return doc


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(which=st.one_of(st.just(0), st.integers(0, 10_000)),   # 0: the dmp attributes
       field=st.integers(0, 10_000),
       value=st.one_of(HOSTILE, st.just(DELETE)))
def test_hostile_metadata_is_a_dataset_error_before_any_allocation(stores, kind, which, field,
                                                                  value):
    store = stores[kind]
    d = Path(tempfile.mkdtemp(prefix="dmp-hostile-"))
    try:
        copy = d / store.name
        shutil.copytree(store, copy)
        metas = sorted(copy.rglob("zarr.json"), key=lambda p: (p != copy / "zarr.json", p))
        meta = metas[which % len(metas)]
        doc = json.loads(meta.read_text())
        if doc["node_type"] == "array":
            key = ARRAY_FIELDS[field % len(ARRAY_FIELDS)]
        else:
            keys = ["attributes." + a for a in sorted(doc.get("attributes", {}))]
            keys = (keys or ["attributes.dmp_format"]) + ["consolidated_metadata"]
            key = keys[field % len(keys)]
        meta.write_text(json.dumps(_mutated(doc, key, value)))
        before = _snapshot(d)
        tracemalloc.start()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # zarr's warnings about what it repaired
                for step in (read_like_a_fit, cli_validate):
                    try:
                        step(copy)
                    except DatasetError as e:
                        assert isinstance(e, DMPError) and str(e)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MiB allocated for {key}={value!r}"
        assert _snapshot(d) == before, "reading a store wrote something"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_dataset_error_is_a_dmp_error_and_a_value_error():
    assert issubclass(DatasetError, DMPError) and issubclass(DatasetError, ValueError)


@pytest.mark.parametrize("kind, words", [("factors", "the factors of a MatrixFactorization"),
                                         ("coef", "a model written by `dmp run`")])
def test_a_model_store_is_named_not_taken_for_a_dataset(stores, kind, words):
    with pytest.raises(DatasetError, match=rf"is not a dmp dataset: attribute 'dmp_format' is "
                                           rf"missing; it (holds|is) {words}"):
        open_dataset(stores[kind])


# ------------------------------------------------------------------ the cases named in the issue


def _edit(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def _copy(stores, kind, tmp_path) -> Path:
    copy = tmp_path / f"{kind}.zarr"
    shutil.copytree(stores[kind], copy)
    return copy


HUGE = 34_000_000_000   # rows one shard claims


def _claim_huge_shard(copy: Path, kind: str) -> None:
    """Make the last shard (for ratings: the users) claim `HUGE` rows, consistently in the
    attributes and in every array's metadata, as a hostile writer would."""
    def shape(rel, n):
        _edit(copy / rel / "zarr.json", lambda d: d.update(shape=[n, *d["shape"][1:]]))

    root = copy / "zarr.json"
    attrs = json.loads(root.read_text())["attributes"]
    if kind == "ratings":
        def users(d):
            d["attributes"]["shape"][0] = HUGE
        _edit(root, users)
        for split in attrs["splits"]:
            shape(f"{split}/rows/indptr", HUGE + 1)
        shape("user_ids", HUGE)
        return
    last = attrs["n_shards"] - 1
    if kind == "columns":
        def rows(d):
            d["attributes"]["shape"][0] = HUGE
        _edit(root, rows)
        shape("y", HUGE)
        return
    start = attrs["row_bounds"][last]

    def rows(d):
        d["attributes"]["shape"][0] = HUGE
        d["attributes"]["row_bounds"][-1] = HUGE
    _edit(root, rows)
    if kind == "dense":
        shape(f"shards/s{last:04d}", HUGE - start)
        return
    shape(f"shards/s{last:04d}/indptr", HUGE - start + 1)
    shape("y", HUGE)
    if (copy / "names").exists():
        shape("names", HUGE)


def _fit(kind, ds, backend):
    from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
    from dmp.hashing import BinaryAutoencoder
    from dmp.linear_model import Lasso, SparsifiedSGDRegressor

    kw = dict(backend=backend) if not isinstance(backend, str) else dict(backend=backend,
                                                                           n_workers=2)
    est = {"columns": lambda: Lasso(alpha=0.1, max_iter=3, **kw),
           "rows": lambda: SparsifiedSGDRegressor(max_iter=2, **kw),
           "corpus": lambda: LatentDirichletAllocation(2, max_iter=2, **kw),
           "ratings": lambda: MatrixFactorization(n_components=2, max_iter=2, **kw),
           "dense": lambda: BinaryAutoencoder(n_bits=2, max_iter=1, **kw)}[kind]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(ds)


FIT_KINDS = ["columns", "rows", "corpus", "ratings", "dense"]


@pytest.mark.parametrize("kind", FIT_KINDS)
def test_a_shard_claiming_34_billion_rows_is_refused_before_allocating(stores, kind, tmp_path):
    """Consistent metadata (attributes and arrays agree) claiming 34 billion rows: opened
    (it is only metadata), and refused with a `DatasetError` naming the size where the data
    is read -- by ``--validate`` and by a fit without it -- with nothing large allocated."""
    copy = _copy(stores, kind, tmp_path)
    _claim_huge_shard(copy, kind)
    tracemalloc.start()
    try:
        try:
            ds = open_dataset(copy)
        except DatasetError as e:      # refused at open already: as good
            assert "34000000000" in str(e) or "GiB" in str(e), e
            return
        assert HUGE in (ds.shape[0], getattr(ds, "n_users", None))
        with pytest.raises(DatasetError, match=r"declares [\d,.]+ GiB, more than"):
            ds.validate()
        assert cli_validate(copy) == 2
        with pytest.raises(DatasetError, match=r"declares [\d,.]+ GiB|GiB"):
            _fit(kind, ds, "local")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES


#: an array of a middle shard (not read when the store is opened) and what it declares
SHARD_ARRAYS = {"columns": "shards/s0001/indices", "rows": "shards/s0001/indices",
                "corpus": "shards/s0001/data", "ratings": "train/rows/indices",
                "dense": "shards/s0001"}


@pytest.mark.parametrize("kind", FIT_KINDS)
@pytest.mark.parametrize("hostile", ["shape", "data_type", "chunk_shape"])
def test_a_fit_without_validate_refuses_a_hostile_shard_where_it_loads(stores, kind, hostile,
                                                                       tmp_path):
    """Metadata that opening the store does not read (one array of one shard) is checked
    where the shard loads: a fit fails with a `DatasetError` naming the array."""
    copy = _copy(stores, kind, tmp_path)
    name = SHARD_ARRAYS[kind]
    change = {"shape": lambda d: d.update(shape=[2**40, *d["shape"][1:]]),
              "data_type": lambda d: d.update(data_type="int8" if kind != "dense"
                                              else "float64"),
              "chunk_shape": lambda d: d["chunk_grid"]["configuration"].update(
                  chunk_shape=[2**30, *d["shape"][1:]])}[hostile]
    _edit(copy / name / "zarr.json", change)
    ds = open_dataset(copy)
    where = "shard 1" if kind == "dense" else name.rsplit("/", 1)[-1]
    with pytest.raises(DatasetError, match=where):
        _fit(kind, ds, "local")


@pytest.mark.dask
@pytest.mark.timeout(240)
def test_workers_refuse_a_hostile_shard(dask_client, stores, tmp_path):
    """On Dask the shards load on the workers: the same `DatasetError` comes back from
    there, and the cluster still fits a good store afterwards."""
    copy = _copy(stores, "columns", tmp_path)
    _edit(copy / "shards/s0001/indices/zarr.json", lambda d: d.update(shape=[2**40]))
    with pytest.raises(DatasetError, match=r"shard 1: 'indices' has length 1099511627776, "
                                           r"expected \d+"):
        _fit("columns", open_dataset(copy), dask_client)
    _fit("columns", open_dataset(stores["columns"]), dask_client)


# ------------------------------------------------------------------ single fixes


def test_column_sums_declared_huge_are_refused_before_reading(stores, tmp_path):
    """A corpus's word frequencies (read on the driver by LDA) are checked like every other
    array: their declared length against the vocabulary, before zarr allocates it."""
    copy = _copy(stores, "corpus", tmp_path)
    _edit(copy / "column_sums" / "zarr.json", lambda d: d.update(shape=[2**40]))
    ds = open_dataset(copy)
    with pytest.raises(DatasetError, match=r"'column_sums' has length 1099511627776, "
                                           r"expected 5$"):
        ds.column_sums()


def test_the_shard_nnz_fallback_is_checked(stores, tmp_path):
    """A store without attribute 'shard_nnz' counts its shards' values from their 'indptr'
    arrays: a missing or mistyped one is a `DatasetError` naming the shard."""
    copy = _copy(stores, "columns", tmp_path)

    def drop(d):
        del d["attributes"]["shard_nnz"]
    _edit(copy / "zarr.json", drop)
    assert open_dataset(copy).shard_nnz().tolist() == \
        open_dataset(stores["columns"]).shard_nnz().tolist()
    _edit(copy / "shards/s0001/indptr/zarr.json", lambda d: d.update(data_type="float32"))
    with pytest.raises(DatasetError, match=r"shard 1: 'indptr' has dtype float32, expected "
                                           r"int64"):
        open_dataset(copy).column_partition(2)
    shutil.rmtree(copy / "shards/s0001/indptr")
    with pytest.raises(DatasetError, match=r"shard 1: array 'indptr' is missing"):
        open_dataset(copy).shard_nnz()


@pytest.mark.parametrize("kind, name", [("columns", "y"), ("corpus", "vocabulary"),
                                        ("ratings", "item_ids"), ("dense", "queries")])
def test_a_chunk_larger_than_its_array_is_refused(stores, kind, name, tmp_path):
    """A chunk shape no dmp writer produces (larger than the array and than 64 MiB) is named
    as corrupt metadata before zarr decodes anything."""
    copy = _copy(stores, kind, tmp_path)
    _edit(copy / name / "zarr.json", lambda d: d["chunk_grid"]["configuration"].update(
        chunk_shape=[2**28] + d["shape"][1:]))
    ds = open_dataset(copy)
    with pytest.raises(DatasetError, match=r"chunk shape \(268435456,?.*\) is larger than the "
                                           r"array \(shape \(\d+,?.*\)\); the store's metadata "
                                           r"is corrupt"):
        ds.validate()


@pytest.mark.parametrize("kind", ["columns", "rows", "dense"])
def test_more_shards_than_exist_are_refused(stores, kind, tmp_path):
    """Attributes declaring one shard more than the store holds (bounds, counts and number
    consistent): the shards that do not match are named where they load, by a fit and by
    --validate."""
    copy = _copy(stores, kind, tmp_path)
    bounds = "col_bounds" if kind == "columns" else "row_bounds"

    def extra_shard(d):
        a = d["attributes"]
        b = a[bounds]
        a[bounds] = [*b[:-1], b[-1] - 1, b[-1]]   # the last row or column: a new shard
        a["n_shards"] += 1
        if "shard_nnz" in a:
            a["shard_nnz"] = [*a["shard_nnz"], 0]
    _edit(copy / "zarr.json", extra_shard)
    ds = open_dataset(copy)
    last = ds.n_shards - 1
    named = rf"shard ({last - 1}|{last}).*(missing|expected)"
    with pytest.raises(DatasetError, match=named):
        ds.validate()
    assert cli_validate(copy) == 2
    with pytest.raises(DatasetError, match=named):
        _fit(kind, ds, "local")
    # and the shard that is not there, alone
    with pytest.raises(DatasetError, match=rf"shard {last}: .*(missing|expected)"):
        ds.load_rows(last) if kind == "rows" else ds.load_shard(last)


def test_consolidated_metadata_is_not_trusted(stores, tmp_path):
    """dmp never consolidates a store's metadata: a consolidated copy in the root zarr.json
    (stale, or declaring other shapes, dtypes or nodes named with '..') is ignored, every array
    is read with its own metadata."""
    copy = _copy(stores, "columns", tmp_path)
    y = json.loads((copy / "y" / "zarr.json").read_text())
    lie = {"kind": "inline", "must_understand": False,
           "metadata": {"y": {**y, "shape": [2**40], "data_type": "int8"}, "../evil": y}}
    _edit(copy / "zarr.json", lambda d: d.update(consolidated_metadata=lie))
    ds = open_dataset(copy)
    np.testing.assert_array_equal(ds.load_y(), np.arange(40.0))
    ds.validate()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["columns.zarr"]


@pytest.mark.parametrize("key, value", [("rating_range", [5]), ("rating_range", [5, 1]),
                                        ("rating_range", ["1", 5]),
                                        ("rating_range", [1, float("nan")]),
                                        ("duplicates", "../../outside"), ("duplicates", 3)])
def test_ratings_attributes_are_checked_at_open(stores, key, value, tmp_path):
    """The ratings store's descriptive attributes (printed by ``dmp data info``) are checked
    when it is opened, like its sizes."""
    copy = _copy(stores, "ratings", tmp_path)

    def set_(d):
        d["attributes"][key] = value
    _edit(copy / "zarr.json", set_)
    with pytest.raises(DatasetError, match=rf"malformed attributes .*{key}"):
        open_dataset(copy)
    assert cli_validate(copy) == 2
