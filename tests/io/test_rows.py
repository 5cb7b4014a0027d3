"""Tests for dmp.io.rows: row-block sparse datasets on Zarr v3.

Every expectation is computed independently with numpy/scipy from the input matrix.
"""

import os
import pickle
import shutil

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from sklearn.datasets import dump_svmlight_file

import dmp.io.rows as rows_mod
import dmp.io._input as input_mod
import dmp.io._store as store_mod
import dmp.io.sparse as sparse_mod
from dmp.cli import main
from dmp.io import (DatasetError, InMemorySparseRowDataset, SparseDataset, SparseRowDataset,
                    convert_svmlight, open_dataset, write_sparse, write_sparse_rows)


def _random_sparse(n=60, p=25, density=0.15, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, format="csr", random_state=rng,
                  data_rvs=rng.standard_normal)
    y = rng.standard_normal(n)
    return X, y


def _skewed(n=100, p=30, seed=3):
    """First 10 rows dense, the rest nearly empty: an even split by rows is unbalanced."""
    rng = np.random.default_rng(seed)
    dense = np.zeros((n, p))
    dense[:10] = rng.standard_normal((10, p))
    dense[rng.integers(10, n, 40), rng.integers(0, p, 40)] = 1.0
    return dense, rng.standard_normal(n)


def _inputs(dense):
    X = sp.csr_matrix(dense)
    return {"dense": dense, "csr": X, "csr_array": sp.csr_array(X), "csc": X.tocsc(),
            "coo": X.tocoo(), "dask": da.from_array(dense, chunks=(13, 7))}


def _assert_canonical_csr(M, shape):
    assert isinstance(M, sp.csr_matrix)
    assert M.shape == shape
    assert M.data.dtype == np.float64 and M.indptr.dtype == M.indices.dtype == np.int32
    assert M.indptr[0] == 0 and np.all(np.diff(M.indptr) >= 0)
    assert M.indptr[-1] == len(M.indices) == len(M.data)
    assert np.all(M.data != 0) and np.all(np.isfinite(M.data))
    for i in range(M.shape[0]):  # strictly increasing column indices within each row
        idx = M.indices[M.indptr[i]:M.indptr[i + 1]]
        assert np.all(np.diff(idx) > 0)
        assert np.all((idx >= 0) & (idx < shape[1]))


def _assert_roundtrip(ds, dense, y):
    n, p = dense.shape
    assert ds.shape == (n, p) and ds.n_samples == n and ds.n_features == p
    assert ds.nnz == np.count_nonzero(dense)
    b = np.asarray(ds.row_bounds)
    assert b.shape == (ds.n_shards + 1,) and b[0] == 0 and b[-1] == n
    assert np.all(np.diff(b) >= 1)
    ref = sp.csr_matrix(dense)  # scipy's canonical CSR of the same matrix
    ref.sort_indices()
    for k in range(ds.n_shards):
        r0, r1 = int(b[k]), int(b[k + 1])
        M, yk = ds.load_rows(k)
        if ds.path is not None:
            assert M.indices.dtype == np.int32
        _assert_canonical_csr(M, (r1 - r0, p))
        np.testing.assert_array_equal(M.toarray(), dense[r0:r1])
        np.testing.assert_array_equal(M.indices, ref[r0:r1].indices)
        np.testing.assert_array_equal(M.data, ref[r0:r1].data)
        np.testing.assert_array_equal(yk, y[r0:r1])
        assert ds.shard_nnz()[k] == np.count_nonzero(dense[r0:r1])
    M, yy = ds.load_row_shards(list(range(ds.n_shards)))
    np.testing.assert_array_equal(M.toarray(), dense)
    np.testing.assert_array_equal(M.indptr, ref.indptr)
    np.testing.assert_array_equal(yy, y)
    np.testing.assert_array_equal(ds.load_y(), y)
    v = np.arange(p, dtype=float)
    np.testing.assert_allclose(M @ v, dense @ v, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("kind", ["dense", "csr", "csr_array", "csc", "coo", "dask"])
def test_roundtrip_input_kinds(tmp_path, kind):
    X, y = _random_sparse()
    dense = X.toarray()
    ds = write_sparse_rows(tmp_path / "ds.zarr", _inputs(dense)[kind], y, n_shards=5)
    assert isinstance(ds, SparseRowDataset) and ds.n_shards == 5
    _assert_roundtrip(ds, dense, y)
    _assert_roundtrip(open_dataset(tmp_path / "ds.zarr").validate(), dense, y)


def test_dask_converted_in_small_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(input_mod, "_DENSE_BLOCK_ELEMS", 25 * 3)  # 3 rows at a time
    X, y = _random_sparse(seed=1)
    dense = X.toarray()
    calls = []
    real = input_mod._canonical

    def spy(block, fmt="csc", **kw):
        calls.append(np.shape(block))
        return real(block, fmt, **kw)

    monkeypatch.setattr(input_mod, "_canonical", spy)
    ds = write_sparse_rows(tmp_path / "ds.zarr", da.from_array(dense, chunks=(25, 7)), y,
                           n_shards=4)
    assert calls and max(s[0] for s in calls) <= 3 and all(s[1] == 25 for s in calls)
    _assert_roundtrip(ds, dense, y)


def test_duplicates_unsorted_and_explicit_zeros(tmp_path):
    # row 0: columns 3, 1, 3 (duplicate, unsorted); row 1: an explicit zero; row 2: empty
    data = np.array([1.0, 2.0, 0.5, 0.0, 4.0])
    indices = np.array([3, 1, 3, 2, 0], dtype=np.int32)
    indptr = np.array([0, 3, 5, 5])
    X = sp.csr_matrix((data, indices, indptr), shape=(3, 5))
    saved = (X.data.copy(), X.indices.copy(), X.indptr.copy())
    expected = np.zeros((3, 5))
    expected[0, 3], expected[0, 1], expected[1, 0] = 1.5, 2.0, 4.0
    y = np.array([1.0, 2.0, 3.0])
    ds = write_sparse_rows(tmp_path / "ds.zarr", X, y, n_shards=3)
    assert ds.nnz == 3 and ds.shard_nnz().tolist() == [2, 1, 0]
    _assert_roundtrip(ds, expected, y)
    mem = InMemorySparseRowDataset(X, y, 3)
    _assert_roundtrip(mem, expected, y)
    for a, b in zip(saved, (X.data, X.indices, X.indptr)):  # the caller's X is untouched
        np.testing.assert_array_equal(a, b)


def test_all_zero_matrix_and_extreme_shard_counts(tmp_path):
    ds = write_sparse_rows(tmp_path / "z.zarr", np.zeros((4, 3)), np.ones(4), n_shards=4)
    assert ds.nnz == 0 and ds.row_bounds.tolist() == [0, 1, 2, 3, 4]
    _assert_roundtrip(ds, np.zeros((4, 3)), np.ones(4))
    X, y = _random_sparse(n=12, p=8, density=0.3, seed=2)
    for n_shards in (1, 12):
        ds = write_sparse_rows(tmp_path / f"s{n_shards}.zarr", X, y, n_shards=n_shards)
        assert ds.n_shards == n_shards
        _assert_roundtrip(ds, X.toarray(), y)


def test_bounds_balanced_by_nnz(tmp_path):
    dense, y = _skewed()
    ds = write_sparse_rows(tmp_path / "ds.zarr", dense, y, n_shards=4)
    b = ds.row_bounds
    assert b[0] == 0 and b[-1] == 100 and np.all(np.diff(b) >= 1)
    row_nnz = np.count_nonzero(dense, axis=1)
    loads = [int(row_nnz[a:c].sum()) for a, c in zip(b, b[1:])]
    assert loads == ds.shard_nnz().tolist()
    total = row_nnz.sum()
    assert max(loads) <= total / 4 + row_nnz.max()
    assert b[1] <= 5  # an even split by rows would put all 10 dense rows in shard 0
    # the shards together hold every row exactly once
    M, _ = ds.load_row_shards(list(range(4)))
    np.testing.assert_array_equal(M.toarray(), dense)


def test_default_n_shards(tmp_path, monkeypatch):
    X, y = _random_sparse(n=10, p=8, density=0.5)
    assert write_sparse_rows(tmp_path / "a.zarr", X, y).n_shards == 1
    monkeypatch.setattr(store_mod, "TARGET_SHARD_NNZ", 7)
    ds = write_sparse_rows(tmp_path / "b.zarr", X, y)
    assert ds.n_shards == int(np.ceil(X.nnz / 7)) < 10
    assert InMemorySparseRowDataset(X, y).n_shards == ds.n_shards
    monkeypatch.setattr(store_mod, "TARGET_SHARD_NNZ", 1)
    assert write_sparse_rows(tmp_path / "c.zarr", X, y).n_shards == 10  # capped at n


def test_attrs_layout_and_codecs(tmp_path):
    X, y = _random_sparse()
    write_sparse_rows(str(tmp_path / "ds.zarr"), X, y, n_shards=3)
    g = zarr.open_group(str(tmp_path / "ds.zarr"), mode="r")
    a = dict(g.attrs)
    assert a["dmp_format"] == sparse_mod.FORMAT_VERSION and a["kind"] == "sparse-rows"
    assert a["complete"] is True and a["created_by"] == "dmp" and a["dtype"] == "float64"
    assert a["shape"] == [60, 25] and a["nnz"] == X.nnz and a["n_shards"] == 3
    assert len(a["row_bounds"]) == 4 and a["row_bounds"][0] == 0 and a["row_bounds"][-1] == 60
    assert a["shard_nnz"] == [int(X[r0:r1].nnz) for r0, r1 in
                              zip(a["row_bounds"], a["row_bounds"][1:])]
    assert "col_bounds" not in a
    assert g["y"].shape == (60,) and g["y"].dtype == np.float64
    r0, r1 = a["row_bounds"][2], a["row_bounds"][3]
    assert g["shards/s0002/indptr"].dtype == np.int64
    assert g["shards/s0002/indptr"].shape == (r1 - r0 + 1,)
    assert g["shards/s0002/indices"].dtype == np.int32
    assert g["shards/s0002/data"].dtype == np.float64
    assert sorted(g["shards"].group_keys()) == ["s0000", "s0001", "s0002"]
    assert "blosc" in type(g["shards/s0000/data"].compressors[0]).__name__.lower()
    assert "zstd" in type(g["shards/s0000/indices"].compressors[0]).__name__.lower()


def test_load_row_shards_order(tmp_path):
    X, y = _random_sparse()
    dense = X.toarray()
    ds = write_sparse_rows(tmp_path / "ds.zarr", X, y, n_shards=5)
    b = ds.row_bounds
    for ks in ([3, 0, 4], [1, 2], [4, 3, 2, 1, 0], [2]):
        M, yy = ds.load_row_shards(ks)
        _assert_canonical_csr(M, (sum(b[k + 1] - b[k] for k in ks), 25))
        np.testing.assert_array_equal(
            M.toarray(), np.vstack([dense[b[k]:b[k + 1]] for k in ks]))
        np.testing.assert_array_equal(yy, np.concatenate([y[b[k]:b[k + 1]] for k in ks]))
        assert M.nnz == sum(ds.shard_nnz()[k] for k in ks)
    with pytest.raises(ValueError, match="at least one"):
        ds.load_row_shards([])
    with pytest.raises(ValueError, match="repeat"):
        ds.load_row_shards([1, 1])
    with pytest.raises(DatasetError, match="shard 5 out of range"):
        ds.load_row_shards([0, 5])
    with pytest.raises(IndexError):
        ds.load_rows(-1)
    with pytest.raises(TypeError):
        ds.load_rows(1.0)


def test_loaded_matrices_work_with_scipy(tmp_path):
    X, y = _random_sparse()
    dense = X.toarray()
    ds = write_sparse_rows(tmp_path / "ds.zarr", X, y, n_shards=3)
    M, _ = ds.load_row_shards([2, 0])
    b = ds.row_bounds
    ref = np.vstack([dense[b[2]:b[3]], dense[b[0]:b[1]]])
    v = np.linspace(-1, 1, 25)
    np.testing.assert_allclose(M @ v, ref @ v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(M.T @ np.ones(M.shape[0]), ref.sum(axis=0), rtol=1e-12)
    np.testing.assert_array_equal(M[3:7].toarray(), ref[3:7])
    np.testing.assert_array_equal(sp.vstack([M, M]).toarray(), np.vstack([ref, ref]))


def test_row_partition(tmp_path):
    dense, y = _skewed()
    ds = write_sparse_rows(tmp_path / "ds.zarr", dense, y, n_shards=12)
    nnz = ds.shard_nnz()
    for parts in range(1, 13):
        groups = ds.row_partition(parts)
        assert len(groups) == parts and all(groups)
        assert sum(groups, []) == list(range(12))
        assert all(g == list(range(g[0], g[-1] + 1)) for g in groups)
    loads = [nnz[g].sum() for g in ds.row_partition(3)]
    assert max(loads) - min(loads) <= nnz.max()
    with pytest.raises(ValueError, match="only 12 shards"):
        ds.row_partition(13)
    with pytest.raises(ValueError, match="n_parts"):
        ds.row_partition(0)


def test_pickle_repr_and_open(tmp_path):
    X, y = _random_sparse()
    ds = write_sparse_rows(tmp_path / "ds.zarr", X, y, n_shards=3)
    ds2 = pickle.loads(pickle.dumps(ds))
    assert isinstance(ds2, SparseRowDataset) and ds2.path == ds.path
    np.testing.assert_array_equal(ds2.row_bounds, ds.row_bounds)
    np.testing.assert_array_equal(ds2.load_rows(2)[0].toarray(), ds.load_rows(2)[0].toarray())
    r = repr(ds)
    assert r.startswith("SparseRowDataset(") and "ds.zarr" in r and "n_shards=3" in r
    assert ds.storage_options is None and ds.dtype == np.float64


def test_tilde_and_memory_url(tmp_path, monkeypatch):
    import fsspec

    monkeypatch.setenv("HOME", str(tmp_path))
    X, y = _random_sparse(seed=4)
    ds = write_sparse_rows("~/t.zarr", X, y, n_shards=2)
    assert ds.path == str(tmp_path / "t.zarr") and (tmp_path / "t.zarr").is_dir()
    url = "memory://dmp-rows-test/ds.zarr"
    try:
        write_sparse_rows(url, X, y, n_shards=4)
        _assert_roundtrip(open_dataset(url), X.toarray(), y)
        with pytest.raises(FileExistsError):
            write_sparse_rows(url, X, y)
    finally:
        fs = fsspec.filesystem("memory")
        if fs.exists("/dmp-rows-test"):
            fs.rm("/dmp-rows-test", recursive=True)


# ------------------------------------------------------------------ in memory


@pytest.mark.parametrize("kind", ["dense", "csr", "csc", "coo", "dask"])
def test_in_memory_matches_written(tmp_path, kind):
    dense, y = _skewed(n=50, p=20, seed=6)
    inp = _inputs(dense)[kind]
    ds = write_sparse_rows(tmp_path / "ds.zarr", inp, y, n_shards=6)
    mem = InMemorySparseRowDataset(inp, y, 6)
    assert mem.path is None
    assert (mem.shape, mem.n_samples, mem.n_features, mem.nnz, mem.n_shards) == \
        (ds.shape, ds.n_samples, ds.n_features, ds.nnz, ds.n_shards)
    np.testing.assert_array_equal(mem.row_bounds, ds.row_bounds)
    np.testing.assert_array_equal(mem.shard_nnz(), ds.shard_nnz())
    np.testing.assert_array_equal(mem.load_y(), ds.load_y())
    for k in range(6):
        (A, ya), (B, yb) = mem.load_rows(k), ds.load_rows(k)
        assert A.shape == B.shape
        for name in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(A, name), getattr(B, name))
        np.testing.assert_array_equal(ya, yb)
    for ks in ([0, 1, 2], [5, 1, 3], [4]):
        (A, ya), (B, yb) = mem.load_row_shards(ks), ds.load_row_shards(ks)
        _assert_canonical_csr(A, B.shape)
        np.testing.assert_array_equal(A.toarray(), B.toarray())
        np.testing.assert_array_equal(A.indptr, B.indptr)
        np.testing.assert_array_equal(ya, yb)
    assert mem.row_partition(4) == ds.row_partition(4)
    _assert_roundtrip(mem, dense, y)
    assert "n_shards=6" in repr(mem)


def test_in_memory_no_copy_of_csr():
    X, y = _random_sparse()
    X.sort_indices()
    assert X.has_canonical_format and X.dtype == np.float64
    mem = InMemorySparseRowDataset(X, y, 4)
    for k in range(4):
        M, yk = mem.load_rows(k)
        assert np.shares_memory(M.data, X.data) and np.shares_memory(M.indices, X.indices)
        assert np.shares_memory(yk, y)
    M, _ = mem.load_row_shards([1, 2])
    assert np.shares_memory(M.data, X.data)
    M, _ = mem.load_row_shards([2, 1])  # reordered: a copy, the same rows
    b = mem.row_bounds
    np.testing.assert_array_equal(
        M.toarray(), np.vstack([X[b[2]:b[3]].toarray(), X[b[1]:b[2]].toarray()]))
    # a non-canonical float64 CSR is not modified, so it must be copied
    Z = X.copy()
    Z.data[0] = 0.0
    data = Z.data.copy()
    mem = InMemorySparseRowDataset(Z, y, 2)
    np.testing.assert_array_equal(Z.data, data)
    assert mem.nnz == X.nnz - 1 and not np.shares_memory(mem.load_rows(0)[0].data, Z.data)


# ------------------------------------------------------------------ open_dataset dispatch


def test_open_dataset_dispatch(tmp_path):
    X, y = _random_sparse()
    write_sparse_rows(tmp_path / "r.zarr", X, y, n_shards=2)
    write_sparse(tmp_path / "c.zarr", X, y, n_shards=2)
    r, c = open_dataset(tmp_path / "r.zarr"), open_dataset(tmp_path / "c.zarr")
    assert type(r) is SparseRowDataset and type(c) is SparseDataset
    assert hasattr(r, "row_bounds") and not hasattr(r, "col_bounds")
    assert hasattr(c, "col_bounds") and not hasattr(c, "row_bounds")
    g = zarr.open_group(str(tmp_path / "r.zarr"), mode="r+")
    g.attrs["kind"] = "sparse-diagonal"
    with pytest.raises(DatasetError, match="unknown dataset kind 'sparse-diagonal'"):
        open_dataset(tmp_path / "r.zarr")
    del g.attrs["kind"]
    with pytest.raises(DatasetError, match="kind"):
        open_dataset(tmp_path / "r.zarr")


def test_open_bad_attributes(tmp_path):
    X, y = _random_sparse()
    path = tmp_path / "r.zarr"
    write_sparse_rows(path, X, y, n_shards=3)
    g = zarr.open_group(str(path), mode="r+")
    good = dict(g.attrs)
    g.attrs["complete"] = False
    with pytest.raises(DatasetError, match="incomplete"):
        open_dataset(path)
    g.attrs.update(good)
    del g.attrs["row_bounds"]
    with pytest.raises(DatasetError, match="attributes missing: row_bounds"):
        open_dataset(path)
    g.attrs.update({**good, "row_bounds": [0, 10, 20, 59]})  # does not end at n = 60
    with pytest.raises(DatasetError, match="row_bounds"):
        open_dataset(path)
    g.attrs.update({**good, "row_bounds": [0, 10, 10, 60]})  # an empty shard
    with pytest.raises(DatasetError, match="row_bounds"):
        open_dataset(path)
    g.attrs.update({**good, "shard_nnz": [1, 2, 3]})
    with pytest.raises(DatasetError, match="shard_nnz"):
        open_dataset(path)
    g.attrs.update(good)
    open_dataset(path).validate()


# ------------------------------------------------------------------ writing errors


@pytest.mark.parametrize(
    "X, y, kw, match",
    [
        (np.array([[1.0, np.nan], [0.0, 1.0]]), [0.0, 1.0], {}, "X contains NaN"),
        (sp.csr_matrix(np.array([[np.inf, 0.0], [0.0, 1.0]])), [0.0, 1.0], {},
         "X contains NaN or infinite"),
        (da.from_array(np.array([[1.0, 0.0], [0.0, -np.inf]]), chunks=1), [0.0, 1.0], {},
         "X contains NaN or infinite"),
        (np.eye(2), [0.0, np.inf], {}, "y contains NaN"),
        (np.eye(2), [np.nan, 0.0], {}, "y contains NaN"),
        (np.eye(2), [[0.0, 1.0]], {}, "y must be 1-D"),
        (np.eye(2), ["a", "b"], {}, "y must be numeric"),
        (np.eye(2), [0.0, 1.0, 2.0], {}, r"len\(y\) = 3 does not match X.shape\[0\] = 2"),
        (np.zeros((0, 3)), [], {}, "non-empty"),
        (np.zeros((3, 0)), [0.0, 0.0, 0.0], {}, "non-empty"),
        (np.zeros(3), [0.0, 0.0, 0.0], {}, "2-D"),
        (np.zeros((2, 2, 2)), [0.0, 0.0], {}, "2-D"),
        (da.zeros(3), [0.0, 0.0, 0.0], {}, "2-D"),
        (np.array([["a", "b"], ["c", "d"]]), [0.0, 1.0], {}, "X must be numeric"),
        (np.eye(2) * 1j, [0.0, 1.0], {}, "X must be real"),
        (sp.csr_matrix(np.eye(2) * 1j), [0.0, 1.0], {}, "X must be real"),
        (np.eye(2), [0.0, 1.0], {"n_shards": 0}, r"n_shards must be in \[1, 2\].*rows"),
        (np.eye(2), [0.0, 1.0], {"n_shards": 3}, r"n_shards must be in \[1, 2\]"),
        (np.eye(2), [0.0, 1.0], {"n_shards": 1.5}, "n_shards must be an integer"),
        (np.eye(2), [0.0, 1.0], {"n_shards": True}, "n_shards must be an integer"),
    ],
)
def test_write_rejects_bad_input(tmp_path, X, y, kw, match):
    with pytest.raises(DatasetError, match=match):
        write_sparse_rows(tmp_path / "ds.zarr", X, y, **kw)
    assert os.listdir(tmp_path) == []
    with pytest.raises(DatasetError, match=match):
        InMemorySparseRowDataset(X, y, kw.get("n_shards"))


def test_n_shards_counts_rows_not_columns(tmp_path):
    # 5 rows, 2 columns: 5 row shards are fine (write_sparse would allow at most 2)
    X = np.arange(10.0).reshape(5, 2) + 1
    ds = write_sparse_rows(tmp_path / "ds.zarr", X, np.zeros(5), n_shards=5)
    assert ds.row_bounds.tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(DatasetError, match="n_shards"):
        write_sparse(tmp_path / "c.zarr", X, np.zeros(5), n_shards=5)


def test_existing_path_and_overwrite(tmp_path):
    X, y = _random_sparse()
    path = tmp_path / "ds.zarr"
    write_sparse(path, X, y, n_shards=2)  # a column dataset is there first
    with pytest.raises(FileExistsError, match="overwrite"):
        write_sparse_rows(path, X, y)
    assert isinstance(open_dataset(path), SparseDataset)  # untouched
    ds = write_sparse_rows(path, 3 * X, -y, n_shards=3, overwrite=True)
    assert isinstance(open_dataset(path), SparseRowDataset)
    M, yy = ds.load_row_shards([0, 1, 2])
    np.testing.assert_array_equal(M.toarray(), 3 * X.toarray())
    np.testing.assert_array_equal(yy, -y)
    assert sorted(os.listdir(tmp_path)) == ["ds.zarr"]
    assert not (path / "col_sums").exists()  # nothing left of the old dataset
    # overwrite=True on a fresh path is fine too
    write_sparse_rows(tmp_path / "new.zarr", X, y, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["ds.zarr", "new.zarr"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch, overwrite):
    X, y = _random_sparse()
    path = tmp_path / "ds.zarr"
    if overwrite:
        write_sparse_rows(path, X, y, n_shards=2)
    calls = []
    real = rows_mod._write_array

    def failing(group, name, values, dtype):
        calls.append(name)
        if len(calls) == 5:
            raise RuntimeError("simulated crash")
        return real(group, name, values, dtype)

    monkeypatch.setattr(rows_mod, "_write_array", failing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        write_sparse_rows(path, 2 * X, y, n_shards=3, overwrite=overwrite)
    assert len(calls) == 5
    assert [f for f in os.listdir(tmp_path) if ".tmp-" in f] == []
    if overwrite:  # the old dataset is untouched
        ds = open_dataset(path)
        assert ds.n_shards == 2
        np.testing.assert_array_equal(ds.load_row_shards([0, 1])[0].toarray(), X.toarray())
    else:
        assert os.listdir(tmp_path) == []


def test_complete_is_written_last(tmp_path, monkeypatch):
    X, y = _random_sparse()
    seen = []
    real = rows_mod._write_array

    def spy(group, name, values, dtype):
        root = zarr.open_group(group.store, mode="r")
        seen.append((group.path + "/" + name, root.attrs["complete"]))
        return real(group, name, values, dtype)

    monkeypatch.setattr(rows_mod, "_write_array", spy)
    ds = write_sparse_rows(tmp_path / "ds.zarr", X, y, n_shards=2)
    # y, three arrays per shard, the column sums
    assert len(seen) == 1 + 3 * 2 + 1 and all(c is False for _, c in seen)
    assert zarr.open_group(str(tmp_path / "ds.zarr"), mode="r").attrs["complete"] is True
    assert ds.nnz == X.nnz
    np.testing.assert_allclose(ds.column_sums(), np.asarray(X.sum(axis=0)).ravel())


def test_column_sums_missing_or_corrupt(tmp_path):
    X, y = _random_sparse()
    ds = write_sparse_rows(tmp_path / "ds.zarr", X, y, n_shards=2)
    g = zarr.open_group(str(tmp_path / "ds.zarr"), mode="r+")
    g.attrs["column_sums"] = False                   # a store from before dmp kept them
    assert open_dataset(tmp_path / "ds.zarr").column_sums() is None
    g.attrs["column_sums"] = "yes"
    with pytest.raises(DatasetError, match="'column_sums' must be true or false"):
        open_dataset(tmp_path / "ds.zarr")
    g.attrs["column_sums"] = True
    del g["column_sums"]
    g.create_array("column_sums", data=np.full(3, np.nan))
    with pytest.raises(DatasetError, match=rf"'column_sums' has length 3, expected {X.shape[1]}"):
        open_dataset(tmp_path / "ds.zarr").column_sums()
    del g["column_sums"]
    g.create_array("column_sums", data=np.full(X.shape[1], np.nan))
    with pytest.raises(DatasetError, match="'column_sums' must hold"):
        open_dataset(tmp_path / "ds.zarr").column_sums()
    del g["column_sums"]
    with pytest.raises(DatasetError, match="array 'column_sums' is missing"):
        open_dataset(tmp_path / "ds.zarr").column_sums()
    assert ds.n_features == X.shape[1]


def test_nan_in_late_dask_block_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(input_mod, "_DENSE_BLOCK_ELEMS", 4)  # one row at a time
    dense = np.eye(6, 4)
    dense[5, 1] = np.nan  # only seen while writing the last shard
    with pytest.raises(DatasetError, match=r"X contains NaN.*rows 5:6"):
        write_sparse_rows(tmp_path / "ds.zarr", da.from_array(dense, chunks=2), np.zeros(6),
                          n_shards=3)
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ reading errors


def _corrupt(path, name, fn):
    fn(zarr.open_array(str(path / name), mode="r+"))


def _set(sl, v):
    return lambda z: z.__setitem__(sl, v)


@pytest.mark.parametrize(
    "name, fn, match",
    [
        ("shards/s0001/indices", lambda z: z.resize((z.shape[0] - 1,)),
         r"shard 1: 'indices' has length \d+, expected \d+"),
        ("shards/s0001/indices", _set(slice(0, 1), 25),
         r"shard 1: 'indices' has values outside \[0, 25\)"),
        ("shards/s0001/indices", _set(slice(1, 2), -1),
         r"shard 1: 'indices' has values outside \[0, 25\)"),
        ("shards/s0001/indices", _set(slice(None), 0),
         r"shard 1: 'indices' are not strictly increasing within a row \(unsorted or "
         r"duplicate column indices\)"),
        ("shards/s0001/data", lambda z: z.resize((z.shape[0] - 1,)),
         r"shard 1: 'data' has length"),
        ("shards/s0001/data", _set(slice(0, 1), np.nan), r"shard 1: 'data' contains NaN"),
        ("shards/s0001/data", _set(slice(0, 1), np.inf), r"shard 1: 'data' contains NaN"),
        ("shards/s0001/indptr", lambda z: z.resize((z.shape[0] - 1,)),
         r"shard 1: 'indptr' has length"),
        ("shards/s0001/indptr", _set(slice(0, 1), 1), r"shard 1: 'indptr' starts at 1"),
        ("shards/s0001/indptr", _set(slice(2, 3), 10**6),
         r"shard 1: 'indptr' is not non-decreasing"),
    ],
)
def test_corrupted_shard(tmp_path, name, fn, match):
    X, y = _random_sparse()
    path = tmp_path / "ds.zarr"
    write_sparse_rows(path, X, y, n_shards=3)
    _corrupt(path, name, fn)
    ds = open_dataset(path)
    ds.load_rows(0)
    ds.load_rows(2)
    with pytest.raises(DatasetError, match=match):
        ds.load_rows(1)
    with pytest.raises(DatasetError, match=match):
        ds.load_row_shards([2, 1])
    with pytest.raises(DatasetError, match=match):
        ds.validate()


def test_missing_arrays(tmp_path):
    X, y = _random_sparse()
    path = tmp_path / "ds.zarr"
    write_sparse_rows(path, X, y, n_shards=3)
    shutil.rmtree(path / "shards" / "s0001" / "indices")
    ds = open_dataset(path)  # metadata only: still opens
    assert ds.shard_nnz().sum() == X.nnz
    ds.load_rows(0)
    with pytest.raises(DatasetError, match=r"shard 1: array 'indices' is missing"):
        ds.load_rows(1)
    with pytest.raises(DatasetError, match=r"shard 1: array 'indices' is missing"):
        ds.validate()
    shutil.rmtree(path / "y")
    with pytest.raises(DatasetError, match=r"array 'y' is missing"):
        ds.load_rows(0)
    with pytest.raises(DatasetError, match=r"array 'y' is missing"):
        ds.validate()


def test_wrong_dtype_bad_y_and_nnz_mismatch(tmp_path):
    X, y = _random_sparse()
    path = tmp_path / "ds.zarr"
    write_sparse_rows(path, X, y, n_shards=2)
    g = zarr.open_group(str(path), mode="r+")
    old = g["shards/s0000/indices"][:]
    del g["shards/s0000/indices"]
    g.create_array("shards/s0000/indices", shape=old.shape, dtype="int64")[:] = old
    r0 = int(g.attrs["row_bounds"][1])
    g["y"][r0 + 1] = np.nan  # in shard 1
    ds = open_dataset(path)
    with pytest.raises(DatasetError, match=r"shard 0: 'indices' has dtype int64"):
        ds.load_rows(0)
    with pytest.raises(DatasetError, match="'y' contains NaN"):
        ds.load_rows(1)
    with pytest.raises(DatasetError, match="'y' contains NaN"):
        ds.load_y()
    with pytest.raises(DatasetError):
        ds.validate()
    # shard 1's last row dropped consistently: indptr no longer matches 'shard_nnz'
    path2 = tmp_path / "b.zarr"
    dense = X.toarray()
    dense[:, 0] = 1.0  # every row has a nonzero
    write_sparse_rows(path2, dense, y, n_shards=2)
    g = zarr.open_group(str(path2), mode="r+")
    ip = g["shards/s0001/indptr"][:]
    end = int(ip[-2])
    g["shards/s0001/indptr"][-1] = end
    g["shards/s0001/indices"].resize((end,))
    g["shards/s0001/data"].resize((end,))
    ds = open_dataset(path2)
    ds.load_rows(0)
    with pytest.raises(DatasetError, match=r"shard 1: 'indptr' gives \d+ nonzeros, "
                                           r"attribute 'shard_nnz' says"):
        ds.validate()


# ------------------------------------------------------------------ svmlight and CLI


def _svm(tmp_path):
    rng = np.random.default_rng(0)
    X = sp.random(30, 15, density=0.2, format="csr", random_state=rng,
                  data_rvs=rng.standard_normal).tolil()
    X[0, 14] = 1.25  # the last column is non-empty, so p is inferred exactly
    X = X.tocsr()
    y = rng.standard_normal(30)
    f = tmp_path / "data.svm"
    dump_svmlight_file(X, y, str(f), zero_based=False)
    return f, X, y


def test_convert_svmlight_rows(tmp_path):
    f, X, y = _svm(tmp_path)
    ds = convert_svmlight(f, tmp_path / "r.zarr", n_shards=4, layout="rows")
    assert isinstance(ds, SparseRowDataset) and ds.shape == (30, 15) and ds.n_shards == 4
    M, yy = ds.load_row_shards(range(4))
    np.testing.assert_allclose(M.toarray(), X.toarray(), rtol=1e-15)
    np.testing.assert_allclose(yy, y, rtol=1e-15)
    ds.validate()
    assert isinstance(convert_svmlight(f, tmp_path / "c.zarr", n_shards=3), SparseDataset)
    with pytest.raises(ValueError, match="layout"):
        convert_svmlight(f, tmp_path / "x.zarr", layout="diagonal")
    assert not (tmp_path / "x.zarr").exists()
    with pytest.raises(FileExistsError):
        convert_svmlight(f, tmp_path / "r.zarr", layout="rows")


def test_cli_convert_layout_and_info(tmp_path, capsys):
    f, X, y = _svm(tmp_path)
    dest = tmp_path / "r.zarr"
    assert main(["data", "convert", "svmlight", str(f), str(dest), "--layout", "rows",
                 "--shards", "3"]) == 0
    ds = open_dataset(dest)
    assert isinstance(ds, SparseRowDataset) and ds.n_shards == 3
    np.testing.assert_allclose(ds.load_row_shards([0, 1, 2])[0].toarray(), X.toarray())
    capsys.readouterr()
    assert main(["data", "info", str(dest), "--validate"]) == 0
    out = capsys.readouterr().out
    assert "sparse-rows" in out
    assert f"row_bounds: {ds.row_bounds.tolist()}" in out
    # the default layout is still columns, and info does not print row bounds for it
    assert main(["data", "convert", "svmlight", str(f), str(tmp_path / "c.zarr")]) == 0
    assert isinstance(open_dataset(tmp_path / "c.zarr"), SparseDataset)
    capsys.readouterr()
    assert main(["data", "info", str(tmp_path / "c.zarr")]) == 0
    assert "row_bounds" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["data", "convert", "svmlight", str(f), str(tmp_path / "x.zarr"),
              "--layout", "diagonal"])
    assert e.value.code == 2
    assert not (tmp_path / "x.zarr").exists()
    # a corrupted row dataset: info --validate reports it, exit status 2
    zarr.open_array(str(dest / "shards/s0002/indices"), mode="r+")[:1] = 99
    assert main(["data", "info", str(dest), "--validate"]) == 2
    assert "shard 2: 'indices' has values outside [0, 15)" in capsys.readouterr().err
