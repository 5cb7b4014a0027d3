"""Tests for dmp.io.ratings (ratings stores, converters), make_ratings, ratings recipes and
the `dmp data` ratings commands."""

import json
import os
import pickle
import re
import shutil
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

import dmp.io.ratings as ratings_mod
import dmp.io.recipes as recipes_mod
from dmp.cli import main
from dmp.io import (DatasetError, InMemoryRatingsDataset, RatingsDataset, build_dataset,
                    convert_ratings, load_recipe, make_ratings, open_dataset,
                    read_ratings_file, write_ratings)

REPO_DATASETS = Path(__file__).resolve().parents[2] / "dmp" / "datasets"
SPLITS = ("train", "valid", "test")


def _data(n_users=12, n_items=9, n=60, seed=0):
    """Distinct (user, item) pairs with some explicit zero ratings and split codes; user
    ``n_users - 2`` and item 3 have no ratings at all."""
    rng = np.random.default_rng(seed)
    users_ok = np.delete(np.arange(n_users), n_users - 2)
    items_ok = np.delete(np.arange(n_items), 3)
    pairs = np.array([(a, b) for a in users_ok for b in items_ok])
    pairs = pairs[rng.permutation(len(pairs))[:n]]
    u, i = pairs[:, 0], pairs[:, 1]
    r = rng.integers(0, 6, n).astype(float) * 0.5  # many explicit zeros
    r[:3] = 0.0
    codes = rng.choice(3, n, p=[0.6, 0.2, 0.2])
    codes[:2] = 0
    for c in range(3):
        r[np.flatnonzero(codes == c)[0]] = 0.0  # a zero rating in every split
    return u, i, r, codes


def _scipy_ref(u, i, r, shape, fmt):
    """scipy CSR/CSC of explicit entries (checked to keep the zero ratings)."""
    M = sp.coo_matrix((r, (u, i)), shape=shape).asformat(fmt)
    M.sort_indices()
    assert M.nnz == len(r)  # the reference itself keeps explicit zeros
    return M


def _assert_same_as_scipy(ds, u, i, r, codes):
    for c, s in enumerate(SPLITS):
        m = codes == c
        assert ds.nnz_of(s) == m.sum()
        R = _scipy_ref(u[m], i[m], r[m], ds.shape, "csr")
        C = _scipy_ref(u[m], i[m], r[m], ds.shape, "csc")
        ptr, ind, dat = ds.load_rows(0, ds.n_users, s)
        assert ptr.dtype == np.int64 and ind.dtype == np.int32 and dat.dtype == np.float64
        np.testing.assert_array_equal(ptr, R.indptr)
        np.testing.assert_array_equal(ind, R.indices)
        np.testing.assert_array_equal(dat, R.data)
        np.testing.assert_array_equal(ds.row_indptr(s), R.indptr)
        ptr, ind, dat = ds.load_cols(0, ds.n_items, s)
        assert ptr.dtype == np.int64 and ind.dtype == np.int32 and dat.dtype == np.float64
        np.testing.assert_array_equal(ptr, C.indptr)
        np.testing.assert_array_equal(ind, C.indices)
        np.testing.assert_array_equal(dat, C.data)
        np.testing.assert_array_equal(ds.col_indptr(s), C.indptr)
        cu, ci, cr = ds.to_coo(s)
        assert cu.dtype == np.int32 and ci.dtype == np.int32
        o = np.lexsort((i[m], u[m]))
        np.testing.assert_array_equal(cu, u[m][o])
        np.testing.assert_array_equal(ci, i[m][o])
        np.testing.assert_array_equal(cr, r[m][o])
        assert np.count_nonzero(cr == 0) == np.count_nonzero(r[m] == 0) > 0
        # partial ranges, rebased
        for a0, a1 in [(0, 1), (2, 7), (5, 5), (ds.n_users - 3, ds.n_users)]:
            ptr, ind, dat = ds.load_rows(a0, a1, s)
            P = R[a0:a1]
            np.testing.assert_array_equal(ptr, P.indptr)
            np.testing.assert_array_equal(ind, P.indices)
            np.testing.assert_array_equal(dat, P.data)
        for a0, a1 in [(0, 2), (3, 4), (4, ds.n_items), (6, 6)]:
            ptr, ind, dat = ds.load_cols(a0, a1, s)
            P = C[:, a0:a1]
            np.testing.assert_array_equal(ptr, P.indptr)
            np.testing.assert_array_equal(ind, P.indices)
            np.testing.assert_array_equal(dat, P.data)


# --------------------------------------------------------------------------- stores


def test_roundtrip_every_split_matches_scipy(tmp_path):
    u, i, r, codes = _data()
    ds = write_ratings(tmp_path / "r.zarr", u, i, r, split=codes)
    assert isinstance(ds, RatingsDataset)
    assert ds.shape == (12, 9) and ds.n_users == 12 and ds.n_items == 9
    assert ds.splits == SPLITS and ds.nnz == int((codes == 0).sum())
    assert ds.path == str(tmp_path / "r.zarr")
    _assert_same_as_scipy(ds, u, i, r, codes)
    ds2 = open_dataset(tmp_path / "r.zarr")
    assert isinstance(ds2, RatingsDataset) and ds2.splits == SPLITS
    _assert_same_as_scipy(pickle.loads(pickle.dumps(ds2)), u, i, r, codes)
    assert ds2.validate() is ds2
    assert ds2.load_ids() == (None, None)
    assert "RatingsDataset(" in repr(ds2) and "'valid'" in repr(ds2)
    attrs = dict(zarr.open_group(str(tmp_path / "r.zarr"), mode="r").attrs)
    assert attrs["kind"] == "ratings" and attrs["complete"] is True
    assert attrs["dmp_format"] == 1 and attrs["splits"] == list(SPLITS)
    assert attrs["nnz"] == {s: int((codes == c).sum()) for c, s in enumerate(SPLITS)}
    assert attrs["shape"] == [12, 9] and attrs["duplicates"] == "error"
    z = zarr.open_array(str(tmp_path / "r.zarr" / "train" / "rows" / "indices"), mode="r")
    assert z.dtype == np.int32 and z.chunks[0] == min(z.shape[0], ratings_mod.CHUNK)


def test_shape_default_explicit_and_split_dict(tmp_path):
    u, i, r, codes = _data(seed=1)
    ds = write_ratings(tmp_path / "a.zarr", u, i, r, shape=(20, 15), split={
        "train": codes == 0, "valid": np.flatnonzero(codes == 1),
        "test": np.flatnonzero(codes == 2)})
    assert ds.shape == (20, 15)
    _assert_same_as_scipy(ds, u, i, r, codes)
    ds = write_ratings(tmp_path / "b.zarr", u.astype(float), i.tolist(), r.astype(np.float32))
    assert ds.splits == ("train",) and ds.nnz == len(r)
    with pytest.raises(ValueError, match="unknown split 'valid'; this dataset has train"):
        ds.nnz_of("valid")
    # a split holding no ratings is omitted
    ds = write_ratings(tmp_path / "c.zarr", u, i, r, split=np.where(codes == 1, 2, codes))
    assert ds.splits == ("train", "test")


def test_in_memory_matches_stored(tmp_path):
    u, i, r, codes = _data(seed=2)
    shape = (12, 9)
    ds = write_ratings(tmp_path / "r.zarr", u, i, r, split=codes, shape=shape)
    parts = [(u[codes == c], i[codes == c], r[codes == c]) for c in range(3)]
    coo = [sp.coo_matrix((p[2], (p[0], p[1])), shape=shape) for p in parts]
    assert coo[0].nnz == len(parts[0][2])  # explicit zeros are entries
    # CSR/CSC built by hand so that the explicit zeros are certainly stored
    o = np.lexsort((parts[0][1], parts[0][0]))
    csr = sp.csr_matrix(shape)
    csr.indptr = np.concatenate([[0], np.cumsum(np.bincount(parts[0][0], minlength=12))])
    csr.indices, csr.data = parts[0][1][o].astype(np.int32), parts[0][2][o]
    o = np.lexsort((parts[2][0], parts[2][1]))
    csc = sp.csc_matrix(shape)
    csc.indptr = np.concatenate([[0], np.cumsum(np.bincount(parts[2][1], minlength=9))])
    csc.indices, csc.data = parts[2][0][o].astype(np.int32), parts[2][2][o]
    assert csr.nnz == len(parts[0][2]) and (csr.data == 0).any()
    variants = [InMemoryRatingsDataset(parts[0], valid=parts[1], test=parts[2], shape=shape),
                InMemoryRatingsDataset(coo[0], valid=coo[1], test=coo[2]),
                InMemoryRatingsDataset(csr, valid=sp.coo_array(coo[1]), test=csc)]
    for m in variants:
        assert m.path is None and m.shape == ds.shape and m.splits == ds.splits
        assert m.nnz == ds.nnz and "InMemoryRatingsDataset(" in repr(m)
        _assert_same_as_scipy(m, u, i, r, codes)
        for s in SPLITS:
            for a, b in [(0, 12), (3, 8)]:
                for x, y in zip(m.load_rows(a, b, s), ds.load_rows(a, b, s)):
                    assert x.dtype == y.dtype
                    np.testing.assert_array_equal(x, y)
            for x, y in zip(m.load_cols(2, 9, s), ds.load_cols(2, 9, s)):
                assert x.dtype == y.dtype
                np.testing.assert_array_equal(x, y)
            for x, y in zip(m.to_coo(s), ds.to_coo(s)):
                np.testing.assert_array_equal(x, y)
            for ax in (0, 1):
                np.testing.assert_array_equal(m.balanced_bounds(3, ax, s),
                                              ds.balanced_bounds(3, ax, s))
        m.validate()
    with pytest.raises(DatasetError, match=r"valid has shape \(12, 10\) but R has shape"):
        InMemoryRatingsDataset(coo[0], valid=sp.coo_matrix((12, 10)))
    with pytest.raises(TypeError, match="R must be a scipy.sparse matrix or a"):
        InMemoryRatingsDataset(np.ones((3, 3)))


def test_balanced_bounds_properties(tmp_path):
    rng = np.random.default_rng(5)
    n_users, n_items, n = 40, 30, 500
    keys = rng.choice(n_users * n_items, n, replace=False)
    u, i = keys // n_items, keys % n_items
    u[:100] = 0  # (not unique any more: rebuild keys) heavy first user
    keys = np.unique(u * n_items + i)
    u, i = keys // n_items, keys % n_items
    ds = write_ratings(tmp_path / "r.zarr", u, i, rng.standard_normal(len(u)),
                       shape=(n_users, n_items))
    for axis, extent, counts in ((0, n_users, np.bincount(u, minlength=n_users)),
                                 (1, n_items, np.bincount(i, minlength=n_items))):
        for n_parts in (1, 2, 3, 7, extent):
            b = ds.balanced_bounds(n_parts, axis)
            assert b.dtype == np.int64 and len(b) == n_parts + 1
            assert b[0] == 0 and b[-1] == extent and np.all(np.diff(b) >= 1)
            part = np.add.reduceat(counts, b[:-1])
            assert part.sum() == len(u)
            assert part.max() <= len(u) / n_parts + counts.max()
        with pytest.raises(ValueError, match=f"cannot split {extent} "
                                             f"{'users' if axis == 0 else 'items'} into"):
            ds.balanced_bounds(extent + 1, axis)
    with pytest.raises(ValueError, match="n_parts must be a positive integer"):
        ds.balanced_bounds(0, 0)
    with pytest.raises(ValueError, match="axis must be 0 .users. or 1 .items."):
        ds.balanced_bounds(2, 2)


def test_load_range_checks(tmp_path):
    u, i, r, codes = _data()
    ds = write_ratings(tmp_path / "r.zarr", u, i, r)
    with pytest.raises(ValueError, match="rows 3:13 out of range"):
        ds.load_rows(3, 13)
    with pytest.raises(ValueError, match="cols 5:4 out of range"):
        ds.load_cols(5, 4)
    with pytest.raises(TypeError, match="must be integers"):
        ds.load_rows(0.0, 2)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        ds.load_rows(0, 2, "test")


# --------------------------------------------------------------------------- duplicates


def _dups():
    u = np.array([0, 1, 0, 2, 0, 1, 3])
    i = np.array([1, 1, 1, 0, 1, 2, 3])
    r = np.array([1.0, 2.0, 4.0, 0.0, 2.5, 5.0, 3.0])
    return u, i, r


def _dedup_reference(u, i, r, policy):
    """Pure Python: first-seen dict of lists, in input order."""
    groups = {}
    for a, b, x in zip(u.tolist(), i.tolist(), r.tolist()):
        groups.setdefault((a, b), []).append(x)
    out = {}
    for k, xs in groups.items():
        out[k] = {"mean": sum(xs) / len(xs), "sum": sum(xs), "last": xs[-1]}[policy]
    keys = sorted(out)
    return (np.array([k[0] for k in keys]), np.array([k[1] for k in keys]),
            np.array([out[k] for k in keys]))


def test_duplicates_error_names_first_pair(tmp_path):
    u, i, r = _dups()
    u2 = np.append(u, 1)
    i2, r2 = np.append(i, 2), np.append(r, 1.0)
    with pytest.raises(DatasetError, match=r"2 duplicate \(user, item\) pair\(s\); the first "
                                           r"is user 0, item 1 at position 0 and position 2"):
        write_ratings(tmp_path / "r.zarr", u2, i2, r2)
    assert not (tmp_path / "r.zarr").exists()
    coo = sp.coo_matrix((r, (u, i)), shape=(4, 4))
    with pytest.raises(DatasetError, match="duplicate"):
        InMemoryRatingsDataset(coo)


@pytest.mark.parametrize("policy", ["mean", "last", "sum"])
def test_duplicates_policies(tmp_path, policy):
    u, i, r = _dups()
    eu, ei, er = _dedup_reference(u, i, r, policy)
    ds = write_ratings(tmp_path / "r.zarr", u, i, r, duplicates=policy)
    cu, ci, cr = ds.to_coo()
    np.testing.assert_array_equal(cu, eu)
    np.testing.assert_array_equal(ci, ei)
    np.testing.assert_allclose(cr, er, rtol=1e-15)
    assert ds.duplicates == policy and ds.nnz == 5
    m = InMemoryRatingsDataset(sp.coo_matrix((r, (u, i)), shape=(4, 4)), duplicates=policy)
    np.testing.assert_array_equal(m.to_coo()[2], cr)
    ds.validate()
    # duplicates in one split are fine, across splits they are not
    same = np.array([0, 0, 0, 0, 0, 1, 2])
    ds = write_ratings(tmp_path / "s.zarr", u, i, r, duplicates=policy, split=same)
    assert ds.nnz_of("valid") == 1 and ds.nnz_of("test") == 1
    across = np.array([0, 0, 2, 0, 0, 1, 0])
    with pytest.raises(DatasetError, match=r"user 0, item 1 has ratings in the 'train' and "
                                           r"'test' splits"):
        write_ratings(tmp_path / "t.zarr", u, i, r, duplicates=policy, split=across)
    with pytest.raises(DatasetError, match="'train' and 'valid' splits"):
        InMemoryRatingsDataset((u[:2], i[:2], r[:2]), valid=(u[2:3], i[2:3], r[2:3]),
                               duplicates=policy)


# --------------------------------------------------------------------------- bad input

_U, _I, _R = np.array([0, 1, 2]), np.array([0, 1, 1]), np.array([1.0, 2.0, 3.0])


@pytest.mark.parametrize("kw, exc, match", [
    (dict(users=[0, 1]), DatasetError, "same length, got 2, 3 and 3"),
    (dict(users=[], items=[], ratings=[]), DatasetError, "no ratings"),
    (dict(ratings=[1.0, np.nan, np.inf]), DatasetError,
     r"2 NaN or infinite values \(first at position 1\)"),
    (dict(ratings=["a", "b", "c"]), DatasetError, "ratings must be real numbers"),
    (dict(users=[0, -1, 2]), DatasetError, r"users must be non-negative: users\[1\] = -1"),
    (dict(items=[0, 1, 5], shape=(3, 4)), DatasetError,
     r"items must be < n_items = 4 .*items\[2\] = 5"),
    (dict(users=[0, 1.5, 2]), DatasetError, r"users must be integers: users\[1\] = 1.5"),
    (dict(items=["a", "b", "c"]), DatasetError, "items must be integers, got dtype"),
    (dict(duplicates="max"), ValueError, "duplicates must be one of 'error', 'mean'"),
    (dict(split={"train": [0, 1], "validation": [2]}), DatasetError,
     "unknown split name.*'validation'"),
    (dict(split={"train": [0, 1], "test": [1, 2]}), DatasetError,
     "rating 1 is in both 'train' and 'test'"),
    (dict(split={"train": [0]}), DatasetError, r"2 ratings are in no split"),
    (dict(split=[0, 3, 0]), DatasetError, r"split codes must be 0 .* split\[1\] = 3"),
    (dict(split=[1, 2, 1]), DatasetError, "train split is empty"),
    (dict(split=[0, 1]), DatasetError, "split codes must be a 1-D array of length 3"),
    (dict(shape=(3,)), ValueError, "shape must be a pair of positive integers"),
    (dict(user_ids=["a", "b", "a"], item_ids=[1, 2]), DatasetError,
     "user_ids has repeated labels"),
    (dict(user_ids=["a", "b"], item_ids=[1, 2]), DatasetError,
     r"user_ids must be 1-D of length 3"),
])
def test_bad_input_names_the_problem(tmp_path, kw, exc, match):
    args = dict(users=_U, items=_I, ratings=_R)
    args.update(kw)
    with pytest.raises(exc, match=match):
        write_ratings(tmp_path / "r.zarr", **args)
    assert not (tmp_path / "r.zarr").exists()


def test_existing_destination(tmp_path):
    write_ratings(tmp_path / "r.zarr", _U, _I, _R)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_ratings(tmp_path / "r.zarr", _U, _I, _R)
    ds = write_ratings(tmp_path / "r.zarr", _U, _I, _R * 2, overwrite=True)
    np.testing.assert_array_equal(ds.to_coo()[2], _R * 2)


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    u, i, r, codes = _data()
    real = ratings_mod._write_chunked
    calls = []

    def flaky(group, name, values, dtype):
        calls.append(name)
        if len(calls) == 8:
            raise OSError("disk full")
        real(group, name, values, dtype)

    monkeypatch.setattr(ratings_mod, "_write_chunked", flaky)
    with pytest.raises(OSError, match="disk full"):
        write_ratings(tmp_path / "r.zarr", u, i, r, split=codes)
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        open_dataset(tmp_path / "r.zarr")
    # an existing store survives a failed overwrite
    monkeypatch.setattr(ratings_mod, "_write_chunked", real)
    write_ratings(tmp_path / "r.zarr", u, i, r, split=codes)
    monkeypatch.setattr(ratings_mod, "_write_chunked", flaky)
    calls.clear()
    with pytest.raises(OSError, match="disk full"):
        write_ratings(tmp_path / "r.zarr", u, i, -r, split=codes, overwrite=True)
    assert os.listdir(tmp_path) == ["r.zarr"]
    _assert_same_as_scipy(open_dataset(tmp_path / "r.zarr"), u, i, r, codes)


# --------------------------------------------------------------------------- corruption


@pytest.fixture
def store(tmp_path):
    u, i, r, codes = _data()
    write_ratings(tmp_path / "r.zarr", u, i, r, split=codes, user_ids=np.arange(12) * 10,
                  item_ids=[f"it{k}" for k in range(9)])
    return tmp_path / "r.zarr"


def _edit_attrs(path, **changes):
    meta = path / "zarr.json"
    d = json.loads(meta.read_text())
    for k, v in changes.items():
        if v is None:
            d["attributes"].pop(k)
        else:
            d["attributes"][k] = v
    meta.write_text(json.dumps(d))


def test_missing_path():
    with pytest.raises(FileNotFoundError, match="no dmp dataset"):
        open_dataset("/nonexistent/ratings.zarr")


def test_ids_roundtrip(store):
    ds = open_dataset(store)
    uids, iids = ds.load_ids()
    assert uids.dtype == np.int64 and uids.tolist() == list(range(0, 120, 10))
    assert iids.tolist() == [f"it{k}" for k in range(9)]
    ds.validate()


def test_deleted_array(store):
    shutil.rmtree(store / "train" / "cols" / "indices")
    ds = open_dataset(store)
    ds.load_rows(0, 5)  # other arrays still fine
    with pytest.raises(DatasetError, match=r"split 'train' cols: array 'indices' is missing"):
        ds.load_cols(0, 3)
    with pytest.raises(DatasetError, match="'indices' is missing"):
        ds.validate()
    shutil.rmtree(store / "item_ids")
    with pytest.raises(DatasetError, match="array 'item_ids' is missing"):
        ds.load_ids()


def test_truncated_chunk(store):
    chunk = store / "valid" / "rows" / "data" / "c" / "0"
    chunk.write_bytes(chunk.read_bytes()[:7])
    ds = open_dataset(store)
    with pytest.raises(DatasetError, match=r"split 'valid' rows: cannot read 'data'"):
        ds.load_rows(0, ds.n_users, "valid")
    with pytest.raises(DatasetError, match="cannot read 'data'"):
        ds.validate()


def test_resized_array(store):
    a = zarr.open_array(str(store / "test" / "cols" / "data"), mode="r+")
    a.resize((a.shape[0] - 1,))
    with pytest.raises(DatasetError, match=r"'data' has length \d+, expected \d+"):
        open_dataset(store).load_cols(0, 9, "test")


@pytest.mark.parametrize("array, index, value, match", [
    ("train/rows/indices", 0, 99, r"split 'train' rows: 'indices' has values outside \[0, 9\)"),
    ("train/cols/indptr", 3, 0, r"split 'train' cols: 'indptr' is corrupted"),
    ("train/rows/data", 1, np.nan, r"'data' contains NaN or infinite values"),
    ("valid/cols/data", 0, 123.0, r"split 'valid': 'rows' and 'cols' hold different"),
])
def test_corrupted_values(store, array, index, value, match):
    a = zarr.open_array(str(store / array), mode="r+")
    a[index] = value
    with pytest.raises(DatasetError, match=match):
        open_dataset(store).validate()


@pytest.mark.parametrize("changes, match", [
    (dict(complete=False), "incomplete"),
    (dict(splits=None), "attributes missing: splits"),
    (dict(nnz={"train": 1}), "inconsistent attributes"),
    (dict(shape=[3]), "inconsistent attributes"),
    (dict(shape="x"), "malformed attributes"),
    (dict(splits=["valid", "test"]), "inconsistent attributes"),
    (dict(dtype="float32"), "malformed attributes"),
    (dict(kind="ratingz"), "unknown dataset kind 'ratingz'"),
])
def test_bad_attributes(store, changes, match):
    _edit_attrs(store, **changes)
    with pytest.raises(DatasetError, match=match):
        open_dataset(store)


def test_nnz_attribute_mismatch(store):
    d = json.loads((store / "zarr.json").read_text())["attributes"]["nnz"]
    _edit_attrs(store, nnz={**d, "train": d["train"] + 1})
    with pytest.raises(DatasetError, match=r"split 'train' rows: 'indices' has length"):
        open_dataset(store).load_rows(0, 3)


# --------------------------------------------------------------------------- converters


def _write(path, text, mode="w"):
    with open(path, mode) as f:
        f.write(text)
    return path


def test_movielens_file(tmp_path):
    f = _write(tmp_path / "ratings.dat",
               "10::1193::5::978300760\n2::661::3::978302109\n10::914::0::978301968\n\n"
               "2::3408::4.5::978300275\n")
    uu, ii, rr = read_ratings_file(f)
    assert uu.tolist() == [10, 2, 10, 2] and ii.tolist() == [1193, 661, 914, 3408]
    np.testing.assert_array_equal(rr, [5, 3, 0, 4.5])
    ds = convert_ratings(f, tmp_path / "r.zarr", split=(1, 0, 0))
    assert ds.shape == (2, 4) and ds.splits == ("train",)
    uids, iids = ds.load_ids()
    assert uids.tolist() == [2, 10] and iids.tolist() == [661, 914, 1193, 3408]
    cu, ci, cr = ds.to_coo()
    got = {(int(uids[a]), int(iids[b])): x for a, b, x in zip(cu, ci, cr)}
    assert got == {(10, 1193): 5.0, (2, 661): 3.0, (10, 914): 0.0, (2, 3408): 4.5}
    assert read_ratings_file(f, format="movielens")[0].tolist() == uu.tolist()


@pytest.mark.parametrize("fmt", ["auto", "csv"])
def test_csv_with_header_by_name(tmp_path, fmt):
    f = _write(tmp_path / "r.csv", "movieId,userId,timestamp,Rating\n"
                                   "31,1,1260759144,2.5\n1029,1,1260759179,3.0\n"
                                   "31,7,1260759182,0\n")
    uu, ii, rr = read_ratings_file(f, format=fmt)
    assert uu.tolist() == [1, 1, 7] and ii.tolist() == [31, 1029, 31]
    np.testing.assert_array_equal(rr, [2.5, 3.0, 0.0])


def test_recbole_tab_header_and_udata(tmp_path):
    f = _write(tmp_path / "ml.inter", "user_id:token\titem_id:token\trating:float\t"
                                      "timestamp:float\n196\t242\t3\t881250949\n"
                                      "186\t302\t3\t891717742\n22\t377\t1\t878887116\n")
    g = _write(tmp_path / "u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n"
                                    "22\t377\t1\t878887116\n")
    for path, fmt in [(f, "auto"), (f, "csv"), (g, "auto"), (g, "csv"), (g, "triplets")]:
        uu, ii, rr = read_ratings_file(path, format=fmt)
        assert uu.tolist() == [196, 186, 22] and ii.tolist() == [242, 302, 377]
        np.testing.assert_array_equal(rr, [3, 3, 1])


def test_triplets_string_labels_and_separators(tmp_path):
    text = "alice  b2 4 extra\nbob b10 1.5 x\n alice   a 0\n"
    f = _write(tmp_path / "t.txt", text)
    uu, ii, rr = read_ratings_file(f, format="triplets")
    assert uu.tolist() == ["alice", "bob", "alice"] and ii.tolist() == ["b2", "b10", "a"]
    np.testing.assert_array_equal(rr, [4, 1.5, 0])
    ds = convert_ratings(f, tmp_path / "r.zarr", split=(1, 0, 0))
    uids, iids = ds.load_ids()
    assert uids.tolist() == ["alice", "bob"] and iids.tolist() == ["a", "b10", "b2"]
    ptr, ind, dat = ds.load_rows(0, 2)
    assert ptr.tolist() == [0, 2, 3] and ind.tolist() == [0, 2, 1]
    np.testing.assert_array_equal(dat, [0, 4, 1.5])
    g = _write(tmp_path / "s.txt", "u;i;r\n1;x;2\n01;x;3\n")  # "01" is not the label "1"
    uu, ii, rr = read_ratings_file(g)
    assert uu.tolist() == ["1", "01"]
    h = _write(tmp_path / "h.csv", 'a,b,c\n"u 1","i,1",3\n')  # quoted, with a comma
    uu, ii, rr = read_ratings_file(h)
    assert uu.tolist() == ["u 1"] and ii.tolist() == ["i,1"] and rr.tolist() == [3.0]
    k = _write(tmp_path / "k.csv", '"u1","i1","3"\n')
    assert read_ratings_file(k)[0].tolist() == ["u1"]
    np.testing.assert_array_equal(read_ratings_file(g, sep=";", header=True)[2], [2, 3])
    m = _write(tmp_path / "m.tsv", "5\t7\t1\n")
    assert read_ratings_file(m, sep="\\t")[1].tolist() == [7]
    assert read_ratings_file(m, columns=(1, 0, 2))[0].tolist() == [7]


@pytest.mark.parametrize("text, fmt, match", [
    ("1::2::3::4\n1::2\n", "auto", r":2: expected 3 or 4 .*fields separated by '::', got 2"),
    ("1,2,3\n4,5\n", "auto", r":2: expected at least 3 fields separated by ',', got 2"),
    ("user,item,rating\n1,2,3\n1,2\n", "csv", r":3: expected 3 fields like the header"),
    ("1,2,3\n4,5,good\n", "auto", r":2: rating 'good' is not a number"),
    ("1,2,3\n4,5,nan\n", "triplets", r":2: rating 'nan' is not finite"),
    ("1\t2\t3\n4\t5\t-inf\n", "auto", r":2: rating '-inf' is not finite"),
    ("", "auto", "the file is empty"),
    ("\n\n", "auto", "the file is empty"),
    ("userId,movieId,rating\n", "auto", "has a header but no ratings"),
    ("a,b,c\n1,2,3\n", "csv", r":1: cannot find the user, item and rating columns"),
])
def test_bad_files_name_the_line(tmp_path, text, fmt, match):
    f = _write(tmp_path / "bad.txt", text)
    with pytest.raises(DatasetError, match=match) as e:
        read_ratings_file(f, format=fmt)
    assert str(f) in str(e.value)
    with pytest.raises(DatasetError, match=match):
        convert_ratings(f, tmp_path / "r.zarr", format=fmt)
    assert not (tmp_path / "r.zarr").exists()


def test_non_utf8_file(tmp_path):
    f = _write(tmp_path / "latin1.csv", "user,item,rating\n1,2,3\n".encode() +
               "2,caf\xe9,4\n".encode("latin-1"), mode="wb")
    with pytest.raises(DatasetError, match=r"latin1.csv:3: not valid UTF-8 \(byte 0xe9 at "
                                           r"column 6\)"):
        read_ratings_file(f)
    g = _write(tmp_path / "bom.csv", "\ufeffuserId,movieId,rating\n1,2,3\n".encode(), "wb")
    assert read_ratings_file(g)[1].tolist() == [2]


def test_read_errors_and_options(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_ratings_file(tmp_path / "none.csv")
    f = _write(tmp_path / "r.csv", "1,2,3\n")
    with pytest.raises(ValueError, match="format must be one of"):
        read_ratings_file(f, format="parquet")
    with pytest.raises(ValueError, match="columns must be three"):
        read_ratings_file(f, columns=(0, 1))
    for bad in [(0.5, 0.6, 0.1), (0.0, 0.5, 0.5), (0.8, 0.2), (1.2, -0.1, -0.1)]:
        with pytest.raises(ValueError, match="split must be three"):
            convert_ratings(f, tmp_path / "r.zarr", split=bad)
    with pytest.raises(ValueError, match="duplicates must be one of"):
        convert_ratings(f, tmp_path / "r.zarr", duplicates="first")


def test_file_duplicates(tmp_path):
    f = _write(tmp_path / "d.csv", "user,item,rating\na,x,1\nb,x,2\na,x,4\nb,y,5\nb,x,3\n")
    with pytest.raises(DatasetError, match=r"2 duplicate .* user 'a', item 'x' at line 2 "
                                           r"and line 4"):
        convert_ratings(f, tmp_path / "r.zarr")
    ds = convert_ratings(f, tmp_path / "m.zarr", duplicates="mean", split=(1, 0, 0))
    assert ds.duplicates == "mean"
    np.testing.assert_array_equal(ds.to_coo()[2], [2.5, 2.5, 5])
    ds = convert_ratings(f, tmp_path / "l.zarr", duplicates="last", split=(1, 0, 0))
    np.testing.assert_array_equal(ds.to_coo()[2], [4, 3, 5])


def _big_file(path, n_users=300, n_items=200, n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.choice(n_users * n_items, n, replace=False)
    u, i = keys // n_items + 1, keys % n_items + 1
    r = rng.integers(1, 11, n) / 2
    with open(path, "w") as f:
        f.write("userId,movieId,rating,timestamp\n")
        for a, b, x in zip(u, i, r):
            f.write(f"{a},{b},{x},0\n")
    return u, i, r


def test_random_split_fractions(tmp_path):
    f = tmp_path / "big.csv"
    u, i, r = _big_file(f)
    n = len(r)
    ds = convert_ratings(f, tmp_path / "a.zarr", split=(0.7, 0.2, 0.1), seed=4)
    assert ds.splits == SPLITS
    for s, p in zip(SPLITS, (0.7, 0.2, 0.1)):
        assert abs(ds.nnz_of(s) - p * n) < 5 * np.sqrt(n * p * (1 - p))
    # disjoint and covering: the union of the splits is the file's ratings
    uids, iids = ds.load_ids()
    seen = {}
    for s in SPLITS:
        for a, b, x in zip(*ds.to_coo(s)):
            key = (int(uids[a]), int(iids[b]))
            assert key not in seen
            seen[key] = x
    assert seen == {(int(a), int(b)): x for a, b, x in zip(u, i, r)}
    # reproducible by seed, different for another seed
    again = convert_ratings(f, tmp_path / "b.zarr", split=(0.7, 0.2, 0.1), seed=4)
    other = convert_ratings(f, tmp_path / "c.zarr", split=(0.7, 0.2, 0.1), seed=5)
    for s in SPLITS:
        np.testing.assert_array_equal(again.to_coo(s)[1], ds.to_coo(s)[1])
    assert not np.array_equal(other.to_coo("test")[0], ds.to_coo("test")[0])
    # the documented draw: rng.random per rating in (user, item) order
    cu, ci, _ = InMemoryRatingsDataset(ds.to_coo("train"), valid=ds.to_coo("valid"),
                                       test=ds.to_coo("test"), shape=ds.shape).to_coo()
    x = np.random.default_rng(4).random(n)
    keys = np.sort((np.searchsorted(uids, u) * ds.n_items + np.searchsorted(iids, i)))
    expect_train = keys[x < 0.7]
    np.testing.assert_array_equal(cu.astype(np.int64) * ds.n_items + ci, expect_train)
    # zero fractions: split omitted
    ds = convert_ratings(f, tmp_path / "d.zarr", split=(0.9, 0.0, 0.1))
    assert ds.splits == ("train", "test")
    attrs = dict(zarr.open_group(str(tmp_path / "d.zarr"), mode="r").attrs)
    assert attrs["split_fractions"] == [0.9, 0.0, 0.1] and attrs["source"] == "big.csv"


def test_convert_speed_100k(tmp_path):
    f = tmp_path / "big.csv"
    _big_file(f, n_users=943, n_items=1682, n=100_000)
    t = time.perf_counter()
    ds = convert_ratings(f, tmp_path / "r.zarr")
    assert time.perf_counter() - t < 10.0
    assert sum(ds.nnz_of(s) for s in ds.splits) == 100_000


# --------------------------------------------------------------------------- make_ratings


def _reference_make_ratings(n_users, n_items, n_obs, rank, noise, test_frac, seed):
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((n_users, rank)) / rank ** 0.25
    Vt = rng.standard_normal((n_items, rank)) / rank ** 0.25
    keys = np.unique(rng.integers(0, n_users * n_items, int(n_obs * 1.05)))
    while len(keys) < n_obs:
        extra = rng.integers(0, n_users * n_items, n_obs - len(keys) + n_obs // 10)
        keys = np.unique(np.concatenate([keys, extra]))
    keys = keys[rng.permutation(len(keys))[:n_obs]]
    u = (keys // n_items).astype(np.int32)
    i = (keys % n_items).astype(np.int32)
    r = np.einsum("ij,ij->i", U[u], Vt[i]) + noise * rng.standard_normal(n_obs)
    perm = rng.permutation(n_obs)
    nt = int(test_frac * n_obs)
    te, tr = perm[:nt], perm[nt:]
    return (u[tr], i[tr], r[tr]), (u[te], i[te], r[te]), U, Vt


@pytest.mark.parametrize("args", [(40, 25, 300, 4, 0.3, 0.2, 7),
                                  (10, 10, 98, 2, 0.0, 0.1, 1),  # dense: top-up loop
                                  (500, 300, 5000, 20, 0.5, 0.1, 3)])
def test_make_ratings_matches_reference(args):
    got = make_ratings(*args)
    ref = _reference_make_ratings(*args)
    for g, e in zip(got[:2], ref[:2]):
        for a, b in zip(g, e):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got[2], ref[2])
    np.testing.assert_array_equal(got[3], ref[3])
    (tu, ti, _), (eu, ei, _), _, _ = got
    keys = np.concatenate([tu, eu]).astype(np.int64) * args[1] + np.concatenate([ti, ei])
    assert len(np.unique(keys)) == args[2] and len(eu) == int(args[5] * args[2])


@pytest.mark.parametrize("kw, match", [
    (dict(n_users=0), "n_users must be an integer >= 1"),
    (dict(n_items=2.5), "n_items must be an integer"),
    (dict(rank=True), "rank must be an integer"),
    (dict(n_obs=101, n_users=10, n_items=10), "n_obs = 101 exceeds n_users"),
    (dict(noise=-0.1), r"noise must be in \[0.0, inf\]"),
    (dict(noise=float("nan")), "noise must be a finite real"),
    (dict(test_frac=1.0), r"test_frac must be in \[0, 1\)"),
])
def test_make_ratings_validates(kw, match, monkeypatch):
    def no_rng(*a, **k):
        raise AssertionError("rng created before validation")

    monkeypatch.setattr(np.random, "default_rng", no_rng)
    args = dict(n_users=10, n_items=10, n_obs=50, rank=2)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        make_ratings(**args)


# --------------------------------------------------------------------------- recipes


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("DMP_CACHE_DIR", str(d))
    return d


def _triples(u, i, r, n_items):
    k = u.astype(np.int64) * n_items + i
    o = np.argsort(k)
    return k[o], r[o]


def test_generator_recipe(cache):
    params = dict(n_users=60, n_items=40, n_obs=900, rank=3, noise=0.1, test_frac=0.2,
                  seed=11)
    ds = build_dataset({"name": "rt", "generator": "make_ratings",
                        "params": {**params, "valid_frac": 0.25}})
    assert isinstance(ds, RatingsDataset) and Path(ds.path).parent == cache
    assert ds.shape == (60, 40) and ds.splits == SPLITS
    (tu, ti, tr), (eu, ei, er), _, _ = make_ratings(**params)
    k, v = _triples(eu, ei, er, 40)
    gk, gv = _triples(*ds.to_coo("test"), 40)
    np.testing.assert_array_equal(gk, k)
    np.testing.assert_array_equal(gv, v)
    is_valid = np.random.default_rng([11, 1]).random(len(tr)) < 0.25
    for s, m in (("train", ~is_valid), ("valid", is_valid)):
        k, v = _triples(tu[m], ti[m], tr[m], 40)
        gk, gv = _triples(*ds.to_coo(s), 40)
        np.testing.assert_array_equal(gk, k)
        np.testing.assert_array_equal(gv, v)
    ds.validate()
    # no valid_frac: only train and test; a loaded recipe can be built as it is
    rec = load_recipe({"name": "rt2", "generator": "make_ratings", "params": params})
    assert "layout" not in rec and "n_shards" not in rec
    ds = build_dataset(rec)
    assert ds.splits == ("train", "test") and ds.nnz == len(tr)


def test_ratings_recipe_validation(tmp_path):
    gen = {"name": "x", "generator": "make_ratings", "params": {"n_users": 5}}
    for key, val in (("n_shards", 2), ("layout", "rows")):
        with pytest.raises(ValueError, match=f"'{key}' does not apply to ratings"):
            load_recipe({**gen, key: val})
    with pytest.raises(ValueError, match=r"'valid_frac' must be a number in \[0, 1\)"):
        load_recipe({**gen, "params": {"valid_frac": 1.5}})
    with pytest.raises(ValueError, match="unknown params for make_sparse_lasso.*'valid_frac'"):
        load_recipe({"name": "x", "generator": "make_sparse_lasso",
                     "params": {"valid_frac": 0.1}})
    conv = {"name": "x", "convert": "ratings", "source": "r.csv"}
    with pytest.raises(ValueError, match="unknown params for convert_ratings: 'dest'"):
        load_recipe({**conv, "params": {"dest": "y"}})
    with pytest.raises(ValueError, match="unknown params for convert_ratings: 'shards'"):
        load_recipe({**conv, "params": {"shards": 2}})
    with pytest.raises(ValueError, match="must pin one version"):
        load_recipe({**conv, "source": {"pypi": "recbole", "member": "a/b"}})
    with pytest.raises(ValueError, match="exactly the keys 'pypi' and 'member'"):
        load_recipe({**conv, "source": {"pypi": "recbole==1.2.1"}})
    with pytest.raises(ValueError, match="relative path without"):
        load_recipe({**conv, "source": {"pypi": "a==1", "member": "../etc/passwd"}})


@pytest.mark.parametrize("name", ["ratings_small", "ml100k"])
def test_shipped_ratings_recipes_are_valid(name):
    r = load_recipe(REPO_DATASETS / f"{name}.yaml")
    assert r["name"] == name and "n_shards" not in r


def test_convert_recipe_local_file(tmp_path, cache):
    f = tmp_path / "big.csv"
    _big_file(f, n=2000)
    rec = tmp_path / "r.yaml"
    rec.write_text("name: loc\nconvert: ratings\nsource: big.csv\n"
                   "params: {format: csv, split: [0.5, 0.5, 0.0], seed: 2, "
                   "duplicates: error}\n")
    ds = build_dataset(rec)
    assert isinstance(ds, RatingsDataset) and ds.splits == ("train", "valid")
    ref = convert_ratings(f, tmp_path / "ref.zarr", split=(0.5, 0.5, 0.0), seed=2)
    for s in ds.splits:
        for a, b in zip(ds.to_coo(s), ref.to_coo(s)):
            np.testing.assert_array_equal(a, b)
    assert build_dataset(rec).path == ds.path  # cached


def _fake_wheel(path, member="fakepkg/data/r.tsv", text="u\ti\tr\n1\t1\t2\n2\t1\t0\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("fakepkg/__init__.py", "")
        z.writestr(member, text)
    return path


def test_pypi_source_extracts_from_cached_wheel(cache, monkeypatch):
    _fake_wheel(cache / "wheels" / "fakepkg-1.0-py3-none-any.whl")
    _fake_wheel(cache / "wheels" / "fakepkg-1.1-py3-none-any.whl", text="9\t9\t9\n")

    def no_network(spec, dest):
        raise AssertionError("downloaded although the wheel is cached")

    monkeypatch.setattr(recipes_mod, "_pip_download", no_network)
    p = recipes_mod.fetch_pypi_member("fakepkg==1.0", "fakepkg/data/r.tsv")
    assert p == cache / "sources" / "fakepkg==1.0" / "fakepkg" / "data" / "r.tsv"
    assert p.read_text() == "u\ti\tr\n1\t1\t2\n2\t1\t0\n"
    ds = build_dataset({"name": "pp", "convert": "ratings",
                        "source": {"pypi": "fakepkg==1.0", "member": "fakepkg/data/r.tsv"},
                        "params": {"split": [1, 0, 0]}})
    assert isinstance(ds, RatingsDataset) and ds.shape == (2, 1)
    np.testing.assert_array_equal(ds.to_coo()[2], [2, 0])
    with pytest.raises(DatasetError, match="has no member 'fakepkg/data/missing.tsv'"):
        recipes_mod.fetch_pypi_member("fakepkg==1.0", "fakepkg/data/missing.tsv")
    (cache / "wheels" / "fakepkg-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match="not a valid wheel"):
        recipes_mod.fetch_pypi_member("fakepkg==1.0", "fakepkg/other.tsv")


def test_pypi_source_downloads_once(tmp_path, cache, monkeypatch):
    wheel = _fake_wheel(tmp_path / "dist" / "Fake_Pkg-2.0-py3-none-any.whl")
    calls = []

    def fake_download(spec, dest):
        calls.append((spec, Path(dest)))
        shutil.copy(wheel, dest)

    monkeypatch.setattr(recipes_mod, "_pip_download", fake_download)
    p = recipes_mod.fetch_pypi_member("fake-pkg==2.0", "fakepkg/data/r.tsv")
    assert calls == [("fake-pkg==2.0", cache / "wheels")] and p.is_file()
    p.unlink()  # re-extracted from the cached wheel, not downloaded again
    assert recipes_mod.fetch_pypi_member("fake-pkg==2.0", "fakepkg/data/r.tsv") == p
    assert len(calls) == 1 and p.is_file()

    def failing(spec, dest):
        raise ConnectionError("no network")

    monkeypatch.setattr(recipes_mod, "_pip_download", failing)
    with pytest.raises(ConnectionError, match="no network"):
        recipes_mod.fetch_pypi_member("other==1.0", "x/y")


def test_pip_download_command(tmp_path, monkeypatch):
    seen = {}

    class Done:
        returncode = 1
        stdout = ""
        stderr = "ERROR: No matching distribution found for nope==9"

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return Done()

    monkeypatch.setattr(recipes_mod.subprocess, "run", fake_run)
    with pytest.raises(ConnectionError, match="No matching distribution"):
        recipes_mod._pip_download("nope==9", tmp_path)
    cmd = seen["cmd"]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
    assert "--only-binary=:all:" in cmd and cmd[-1] == "nope==9"
    assert cmd[cmd.index("-d") + 1] == str(tmp_path)


def test_ml100k_recipe_from_cache(cache):
    home = Path("~/.cache/dmp").expanduser()
    wheel = home / "wheels" / "recbole-1.2.1-py3-none-any.whl"
    member = home / "sources" / "recbole==1.2.1" / "recbole" / "dataset_example" / \
        "ml-100k" / "ml-100k.inter"
    if not (wheel.is_file() or member.is_file()):
        pytest.skip("recbole 1.2.1 wheel not in ~/.cache/dmp (run `dmp data make ml100k`)")
    if wheel.is_file():
        (cache / "wheels").mkdir(parents=True)
        shutil.copy(wheel, cache / "wheels")
    else:
        dest = cache / member.relative_to(home)
        dest.parent.mkdir(parents=True)
        shutil.copy(member, dest)
    ds = build_dataset("ml100k")
    assert ds.shape == (943, 1682) and ds.splits == SPLITS
    assert sum(ds.nnz_of(s) for s in SPLITS) == 100_000
    assert ds.rating_range == (1.0, 5.0)
    uids, iids = ds.load_ids()
    assert uids.tolist() == list(range(1, 944)) and iids.tolist() == list(range(1, 1683))
    for s, p in zip(SPLITS, (0.8, 0.1, 0.1)):
        assert abs(ds.nnz_of(s) - p * 1e5) < 5 * np.sqrt(1e5 * p * (1 - p))
    ds.validate()


# --------------------------------------------------------------------------- CLI


def test_cli_convert_and_info(tmp_path, capsys):
    f = tmp_path / "big.csv"
    _big_file(f, n=3000)
    dest = tmp_path / "r.zarr"
    assert main(["data", "convert", "ratings", str(f), str(dest), "--split", "0.6,0.2,0.2",
                 "--seed", "3", "--format", "csv"]) == 0
    ds = open_dataset(dest)
    assert isinstance(ds, RatingsDataset) and ds.splits == SPLITS
    ref = convert_ratings(f, tmp_path / "ref.zarr", split=(0.6, 0.2, 0.2), seed=3)
    assert {s: ds.nnz_of(s) for s in SPLITS} == {s: ref.nnz_of(s) for s in SPLITS}
    capsys.readouterr()
    assert main(["data", "info", str(dest), "--validate"]) == 0
    out = capsys.readouterr().out
    assert "kind: ratings" in out and "shape: 300 users x 200 items" in out
    assert "splits: train, valid, test" in out and "validated: ok" in out
    for s in SPLITS:
        assert f"nnz[{s}]: {ds.nnz_of(s)}" in out
    # existing destination, then --overwrite
    assert main(["data", "convert", "ratings", str(f), str(dest)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["data", "convert", "ratings", str(f), str(dest), "--overwrite",
                 "--duplicates", "mean", "--sep", ","]) == 0


def test_cli_errors(tmp_path, capsys):
    f = _write(tmp_path / "r.csv", "1,2,3\n1,x\n")
    assert main(["data", "convert", "ratings", str(f), str(tmp_path / "r.zarr")]) == 2
    assert "r.csv:2: expected at least 3 fields" in capsys.readouterr().err
    for argv in (["data", "convert", "ratings", str(f), "d", "--format", "xml"],
                 ["data", "convert", "parquet", str(f), "d"],
                 ["data", "convert", "ratings", str(f), "d", "--split", "0.5,0.5"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "invalid choice" in err or "three comma-separated fractions" in err
    for argv, words in ((["ratings", "--shards", "3"], "--shards: not an option of ratings "
                                                        "conversion"),
                        (["svmlight", "--seed", "3"], "--seed: not an option of svmlight")):
        with pytest.raises(SystemExit) as e:   # an argparse error
            main(["data", "convert", argv[0], str(f), "d", *argv[1:]])
        assert e.value.code == 2
        assert words in capsys.readouterr().err


# --------------------------------------------------------------------------- headers that name
# their columns are read by name, never by position


@pytest.mark.parametrize("fmt", ["auto", "csv", "triplets"])
def test_a_header_without_a_rating_column_is_refused(tmp_path, fmt, capsys):
    f = _write(tmp_path / "r.csv", "userId,movieId,timestamp\n1,10,1500000000\n"
                                   "1,20,1500000001\n2,10,1500000002\n2,30,1500000003\n")
    match = (r"r\.csv:1: cannot find the user, item and rating columns in the header "
             r"\['userId', 'movieId', 'timestamp'\]: it names user 'userId', item 'movieId' "
             r"but no rating column")
    with pytest.raises(DatasetError, match=match):
        read_ratings_file(f, format=fmt)
    with pytest.raises(DatasetError, match=match):
        convert_ratings(f, tmp_path / "r.zarr", format=fmt)
    assert not (tmp_path / "r.zarr").exists()
    # the command line refuses it too, and says how to name the columns there
    assert main(["data", "convert", "ratings", str(f), str(tmp_path / "r.zarr")]) == 2
    err = capsys.readouterr().err
    assert "no rating column" in err and "--columns USER,ITEM,RATING" in err
    assert not (tmp_path / "r.zarr").exists()


@pytest.mark.parametrize("header, why", [
    ("user,item,score,rating", "2 rating columns ('score', 'rating')"),
    ("movieId,rating,timestamp", "no user column"),
    ("timestamp,a,b", "header ['timestamp', 'a', 'b']: it names none of them"),
])
def test_headers_that_do_not_locate_the_columns(tmp_path, header, why):
    row = ",".join(str(v) for v in range(1, header.count(",") + 2))
    f = _write(tmp_path / "r.csv", f"{header}\n{row}\n")
    with pytest.raises(DatasetError, match=re.escape(why)):
        read_ratings_file(f)


def test_named_columns_on_the_command_line(tmp_path, capsys):
    f = _write(tmp_path / "r.csv", "uid_a,stars,movie,when\n1,4,10,0\n2,5,10,0\n1,3,20,0\n")
    dest = tmp_path / "r.zarr"
    assert main(["data", "convert", "ratings", str(f), str(dest), "--split", "1,0,0",
                 "--columns", "uid_a,movie,stars"]) == 0
    ds = open_dataset(dest)
    uids, iids = ds.load_ids()
    got = {(int(uids[a]), int(iids[b])): x for a, b, x in zip(*ds.to_coo())}
    assert got == {(1, 10): 4.0, (2, 10): 5.0, (1, 20): 3.0}
    assert main(["data", "convert", "ratings", str(f), str(tmp_path / "p.zarr"), "--split",
                 "1,0,0", "--columns", "0,2,1"]) == 0
    np.testing.assert_array_equal(open_dataset(tmp_path / "p.zarr").to_coo()[2],
                                  ds.to_coo()[2])
    with pytest.raises(SystemExit):
        main(["data", "convert", "ratings", str(f), "d", "--columns", "a,b"])
    assert "three comma-separated columns" in capsys.readouterr().err


def test_triplets_refuse_a_header_that_puts_the_columns_elsewhere(tmp_path):
    f = _write(tmp_path / "r.txt", "item user rating\n10 1 4\n")
    with pytest.raises(DatasetError, match=r"r\.txt:1: .* positions \[1, 0, 2\], but format "
                                           r"'triplets' reads the first three"):
        read_ratings_file(f, format="triplets")
    assert read_ratings_file(f)[0].tolist() == [1]   # auto reads it by name
