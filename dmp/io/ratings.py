"""Explicit-rating datasets (users x items, for matrix factorisation) as Zarr v3 groups.

Layout of a dataset at ``<path>``::

    <path>/                 zarr v3 group, attrs: dmp_format, kind="ratings", shape
                            [n_users, n_items], splits, nnz {split: count}, duplicates,
                            dtype, rating_range, ids, complete, created_by
      train/rows/indptr     int64[n_users+1]   CSR by user
      train/rows/indices    int32[nnz]         item ids, strictly increasing within a row
      train/rows/data       float64[nnz]       ratings (0 is a valid rating and is kept)
      train/cols/indptr     int64[n_items+1]   CSC by item: the same ratings again
      train/cols/indices    int32[nnz]         user ids, strictly increasing within a column
      train/cols/data       float64[nnz]
      valid/..., test/...   the same, for the splits that hold ratings
      user_ids, item_ids    optional: the original label of each index, int64 when every
                            label is an integer, else a variable-length UTF-8 string array

Every split is stored twice (by user and by item), so alternating methods can read a
contiguous block of users or of items cheaply; the arrays are chunked along their length
(`CHUNK` elements).  A (user, item) pair appears in at most one split.  Workers open the
dataset by path (`dmp.io.open_dataset` returns a `RatingsDataset`) and read only the rows
or columns they own.

Converters read MovieLens ``::`` files, delimited files with a header (MovieLens
``ratings.csv``, RecBole ``.inter``) and generic ``user item rating`` triplets; labels are
mapped to indices in sorted order (numerically when every label of an axis is an integer).
"""

from __future__ import annotations

import csv
import math
import os
import re
from array import array
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..utils.text import plural, shown
from ._store import (FORMAT_VERSION, DatasetError, _atomic_write, _balanced_bounds,
                     _check_dest, _normalize_path, _StoredDataset, attr_int, attr_ints,
                     check_compressed, check_read, open_dataset, store_kind)

__all__ = ["RatingsDataset", "InMemoryRatingsDataset", "write_ratings", "read_ratings_file",
           "convert_ratings"]

KIND = "ratings"
SPLITS = ("train", "valid", "test")
DUPLICATES = ("error", "mean", "last", "sum")
FORMATS = ("auto", "movielens", "csv", "triplets")
CHUNK = 1 << 20
_REQUIRED_ATTRS = ("shape", "splits", "nnz", "duplicates", "dtype", "complete")
_INT32_MAX = int(np.iinfo(np.int32).max)


# --------------------------------------------------------------------------- validation


def _check_policy(duplicates) -> str:
    if not isinstance(duplicates, str) or duplicates not in DUPLICATES:
        raise ValueError(f"duplicates must be one of {', '.join(map(repr, DUPLICATES))}, "
                         f"got {shown(duplicates)}")
    return duplicates


def _as_index(name: str, a) -> np.ndarray:
    """``a`` as a 1-D int64 array of non-negative integers (integral floats accepted)."""
    a = np.asarray(a)
    if a.ndim != 1:
        raise DatasetError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a) | (a != np.floor(a))
        if bad.any():
            k = int(np.argmax(bad))
            raise DatasetError(f"{name} must be integers: {name}[{k}] = {a[k].item()!r}")
    elif a.dtype.kind not in "iu":
        raise DatasetError(f"{name} must be integers, got dtype {a.dtype}")
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        k = int(np.argmax(a > np.iinfo(np.int64).max))
        raise DatasetError(f"{name} too large: {name}[{k}] = {a[k]}")
    a = a.astype(np.int64)
    if a.size and a.min() < 0:
        k = int(np.argmax(a < 0))
        raise DatasetError(f"{name} must be non-negative: {name}[{k}] = {a[k]}")
    return a


def _as_ratings(a) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1:
        raise DatasetError(f"ratings must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "iuf":
        raise DatasetError(f"ratings must be real numbers, got dtype {a.dtype}")
    a = a.astype(np.float64)
    bad = ~np.isfinite(a)
    if bad.any():
        raise DatasetError(f"ratings contain {int(bad.sum())} NaN or infinite values "
                           f"(first at position {int(np.argmax(bad))})")
    return a


def _check_shape(shape, u: np.ndarray, i: np.ndarray) -> tuple[int, int]:
    if shape is None:
        shape = (int(u.max()) + 1, int(i.max()) + 1)
    try:
        ok = len(shape) == 2 and all(
            not isinstance(s, bool) and isinstance(s, (int, np.integer)) and s >= 1
            for s in shape)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"shape must be a pair of positive integers, got {shown(shape)}")
    n_users, n_items = (int(s) for s in shape)
    for what, n, a in (("users", n_users, u), ("items", n_items, i)):
        if n > _INT32_MAX:
            raise DatasetError(f"{n} {what}: indices are stored as int32 "
                               f"(at most {_INT32_MAX})")
        if a.size and a.max() >= n:
            k = int(np.argmax(a >= n))
            raise DatasetError(f"{what} must be < n_{what} = {n} (shape {(n_users, n_items)}): "
                               f"{what}[{k}] = {a[k]}")
    return n_users, n_items


def _split_codes(split, n: int) -> np.ndarray:
    """Split codes (int8: 0 train, 1 valid, 2 test) from ``None``, codes or a dict."""
    if split is None:
        return np.zeros(n, dtype=np.int8)
    if isinstance(split, dict):
        unknown = [k for k in split if k not in SPLITS]
        if unknown:
            raise DatasetError(f"unknown split name(s) {', '.join(map(repr, unknown))} "
                               f"(known: {', '.join(SPLITS)})")
        codes = np.full(n, -1, dtype=np.int8)
        for name, sel in split.items():
            sel = np.asarray(sel)
            if sel.dtype == bool:
                if sel.shape != (n,):
                    raise DatasetError(f"split[{name!r}]: boolean mask has shape {sel.shape}, "
                                       f"expected ({n},)")
                idx = np.flatnonzero(sel)
            else:
                idx = _as_index(f"split[{name!r}]", sel)
                if idx.size and idx.max() >= n:
                    raise DatasetError(f"split[{name!r}]: index {int(idx.max())} out of range "
                                       f"for {plural(n, 'rating')}")
                if len(np.unique(idx)) != len(idx):
                    raise DatasetError(f"split[{name!r}] repeats a rating index")
            taken = codes[idx] >= 0
            if taken.any():
                k = int(idx[np.argmax(taken)])
                raise DatasetError(f"rating {k} is in both {SPLITS[codes[k]]!r} and {name!r}")
            codes[idx] = SPLITS.index(name)
        free = codes < 0
        if free.any():
            n_free = int(free.sum())
            raise DatasetError(f"{plural(n_free, 'rating')} {'is' if n_free == 1 else 'are'} "
                               f"in no split (first at position "
                               f"{int(np.argmax(free))}); every rating needs one")
        return codes
    codes = np.asarray(split)
    if codes.ndim != 1 or len(codes) != n:
        raise DatasetError(f"split codes must be a 1-D array of length {n} (one per rating), "
                           f"got shape {codes.shape}")
    if codes.dtype.kind not in "iu":
        raise DatasetError(f"split codes must be integers 0 (train), 1 (valid) or 2 (test), "
                           f"got dtype {codes.dtype}")
    bad = (codes < 0) | (codes > 2)
    if bad.any():
        k = int(np.argmax(bad))
        raise DatasetError(f"split codes must be 0 (train), 1 (valid) or 2 (test): "
                           f"split[{k}] = {codes[k]}")
    return codes.astype(np.int8)


def _as_labels(name: str, ids, n: int) -> np.ndarray | None:
    """Original labels of the ``n`` indices: int64 or StringDType, distinct."""
    if ids is None:
        return None
    a = np.asarray(ids)
    if a.ndim != 1 or len(a) != n:
        raise DatasetError(f"{name} must be 1-D of length {n}, got shape {a.shape}")
    if a.dtype.kind in "iu":
        a = a.astype(np.int64)
    elif a.dtype.kind in "UT" or (a.dtype.kind == "O" and all(isinstance(x, str) for x in a)):
        a = a.astype(np.dtypes.StringDType())
    else:
        raise DatasetError(f"{name} must hold integers or strings, got dtype {a.dtype}")
    u, c = np.unique(a, return_counts=True)
    if len(u) != n:
        raise DatasetError(f"{name} has repeated labels (e.g. {shown(u[np.argmax(c > 1)])})")
    return a


# --------------------------------------------------------------------------- building


def _aggregate(u, i, r, codes, n_items: int, duplicates: str, *, name_pair=None,
               locate=None):
    """Sort the ratings by (user, item) and resolve duplicate pairs per ``duplicates``.

    Returns ``(u, i, r, codes)`` sorted by (user, item) with unique pairs.  ``name_pair(u,
    i)`` and ``locate(position)`` word error messages.
    """
    name_pair = name_pair or (lambda a, b: f"user {a}, item {b}")
    locate = locate or (lambda p: f"position {p}")
    key = u * np.int64(n_items) + i
    order = np.argsort(key, kind="stable")
    ks = key[order]
    new = np.ones(len(ks), dtype=bool)
    new[1:] = ks[1:] != ks[:-1]
    if new.all():
        return u[order], i[order], r[order], codes[order]
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(ks)))
    if duplicates == "error":
        p = int(order[~new].min())  # the earliest repeated occurrence in input order
        first = int(np.flatnonzero(key == key[p])[0])
        n_pairs = int(np.count_nonzero(counts > 1))
        raise DatasetError(f"{n_pairs} duplicate (user, item) pair(s); the first is "
                           f"{name_pair(int(u[p]), int(i[p]))} at {locate(first)} and "
                           f"{locate(p)}; pass duplicates='mean', 'last' or 'sum' to "
                           "aggregate them")
    cs = codes[order]
    lo, hi = np.minimum.reduceat(cs, starts), np.maximum.reduceat(cs, starts)
    if np.any(lo != hi):
        g = int(np.argmax(lo != hi))
        p = int(order[starts[g]])
        raise DatasetError(f"{name_pair(int(u[p]), int(i[p]))} has ratings in the "
                           f"{SPLITS[lo[g]]!r} and {SPLITS[hi[g]]!r} splits; a pair must be "
                           "in exactly one split (aggregate duplicates before splitting)")
    rs = r[order]
    if duplicates == "last":
        vals = rs[starts + counts - 1]  # stable sort: the group's last is the input's last
    else:
        vals = np.add.reduceat(rs, starts)
        if duplicates == "mean":
            vals = vals / counts
    sel = order[starts]
    return u[sel], i[sel], vals, cs[starts]


def _compress(u, i, r, n_users: int, n_items: int) -> dict:
    """CSR (by user) and CSC (by item) arrays of ratings sorted by (user, item)."""
    rows_ptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(u, minlength=n_users), out=rows_ptr[1:])
    o = np.argsort(i, kind="stable")  # by item, then user (input sorted by user)
    cols_ptr = np.zeros(n_items + 1, dtype=np.int64)
    np.cumsum(np.bincount(i, minlength=n_items), out=cols_ptr[1:])
    return {"rows": {"indptr": rows_ptr, "indices": i.astype(np.int32),
                     "data": np.ascontiguousarray(r, dtype=np.float64)},
            "cols": {"indptr": cols_ptr, "indices": u[o].astype(np.int32),
                     "data": np.ascontiguousarray(r[o], dtype=np.float64)}}


def _prepare(users, items, ratings, shape, split, duplicates, *, name_pair=None,
             locate=None):
    """Validate and compress; return ``(arrays {split: {part: {name: array}}}, shape,
    rating_range)``."""
    duplicates = _check_policy(duplicates)
    u, i = _as_index("users", users), _as_index("items", items)
    r = np.asarray(ratings)
    if r.ndim == 1 and not (len(u) == len(i) == len(r)):
        raise DatasetError(f"users, items and ratings must have the same length, got "
                           f"{len(u)}, {len(i)} and {len(r)}")
    r = _as_ratings(r)
    if len(r) == 0:
        raise DatasetError("no ratings: users, items and ratings are empty")
    n_users, n_items = _check_shape(shape, u, i)
    codes = _split_codes(split, len(r))
    u, i, r, codes = _aggregate(u, i, r, codes, n_items, duplicates, name_pair=name_pair,
                                locate=locate)
    if not np.any(codes == 0):
        raise DatasetError("the train split is empty; it must hold at least one rating")
    arrays = {}
    for c, name in enumerate(SPLITS):
        m = codes == c
        if m.any():
            arrays[name] = _compress(u[m], i[m], r[m], n_users, n_items)
    return arrays, (n_users, n_items), [float(r.min()), float(r.max())]


# --------------------------------------------------------------------------- writing


def _write_chunked(group, name: str, values: np.ndarray, dtype) -> None:
    """Create the 1-D array ``name`` (chunks of `CHUNK` elements) and fill it."""
    n = int(values.shape[0])
    chunks = (max(1, min(n, CHUNK)),)
    if dtype == "str":
        z = group.create_array(name, shape=(n,), dtype=str, chunks=chunks)
    else:
        from zarr.codecs import BloscCodec, ZstdCodec

        values = np.ascontiguousarray(values, dtype=dtype)
        comp = (BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")
                if np.dtype(dtype).kind == "f" else ZstdCodec(level=3))
        z = group.create_array(name, shape=(n,), dtype=dtype, chunks=chunks,
                               compressors=comp)
    if n:
        z[:] = values


def _write_store(path, storage_options, overwrite, arrays, shape, rating_range, duplicates,
                 user_ids, item_ids, extra_attrs=None) -> "RatingsDataset":
    ids = None
    if user_ids is not None or item_ids is not None:
        if user_ids is None or item_ids is None:
            raise DatasetError("give both user_ids and item_ids, or neither")
        ids = {"user_ids": "int64" if user_ids.dtype.kind == "i" else "string",
               "item_ids": "int64" if item_ids.dtype.kind == "i" else "string"}
    attrs: dict[str, Any] = {
        "dmp_format": FORMAT_VERSION, "kind": KIND, "shape": [int(s) for s in shape],
        "splits": list(arrays), "nnz": {s: int(len(a["rows"]["data"]))
                                        for s, a in arrays.items()},
        "duplicates": duplicates, "dtype": "float64", "rating_range": rating_range,
        "ids": ids, "complete": False, "created_by": "dmp",
    }
    attrs.update(extra_attrs or {})

    def fill(g):
        g.attrs.update(attrs)
        for s, parts in arrays.items():
            for part, arr in parts.items():
                pg = g.require_group(f"{s}/{part}")
                _write_chunked(pg, "indptr", arr["indptr"], "int64")
                _write_chunked(pg, "indices", arr["indices"], "int32")
                _write_chunked(pg, "data", arr["data"], "float64")
        if ids is not None:
            for name, a in (("user_ids", user_ids), ("item_ids", item_ids)):
                _write_chunked(g, name, a, "int64" if ids[name] == "int64" else "str")
        g.attrs.update({"complete": True})  # last

    _atomic_write(path, storage_options, overwrite, fill)
    return open_dataset(path, storage_options=storage_options)


def write_ratings(path, users, items, ratings, *, shape=None, split=None, duplicates="error",
                  user_ids=None, item_ids=None, overwrite=False,
                  storage_options=None) -> "RatingsDataset":
    """Write explicit ratings as a ratings dataset (CSR by user and CSC by item per split).

    Parameters
    ----------
    path : str or os.PathLike
        Destination (local path or fsspec URL).
    users, items : array-like of int, shape (n,)
        0-based user and item indices (integral floats are accepted).
    ratings : array-like of float, shape (n,)
        Finite ratings; 0 is a rating like any other and is stored.
    shape : (int, int), optional
        ``(n_users, n_items)``; default ``(max(users) + 1, max(items) + 1)``.
    split : None, array-like of int or dict, optional
        None: every rating is in "train".  An array of codes, one per rating: 0 train,
        1 valid, 2 test.  Or a dict ``{"train": sel, "valid": sel, "test": sel}`` (any
        subset of the names) of boolean masks or index arrays that together assign every
        rating exactly once.  Splits that end up with no ratings are omitted; train must
        hold at least one.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        What to do with repeated (user, item) pairs: raise, average them, keep the last
        in input order, or add them up.  Repeats of a pair must all be in the same split.
    user_ids, item_ids : array-like, optional
        Original labels (int or str) of each user / item index, of length ``n_users`` /
        ``n_items``, all distinct; stored as ``user_ids`` / ``item_ids`` (give both).
    overwrite : bool, default False
        Replace an existing dataset at ``path`` (removed only once the new one is complete;
        anything there that is not a dmp dataset is refused, never replaced).
    storage_options : dict, optional
        fsspec options for remote URLs.

    Returns
    -------
    RatingsDataset

    Raises
    ------
    DatasetError
        Invalid data: lengths differ, no ratings, NaN/inf ratings, negative, non-integer or
        out-of-range indices, duplicates (with "error"), a pair in two splits, bad split
        codes or names, empty train split.
    ValueError
        Unknown ``duplicates`` policy or malformed ``shape``.
    FileExistsError
        ``path`` exists and ``overwrite`` is False.
    """
    path = _normalize_path(path)
    _check_dest(path, storage_options, overwrite)
    arrays, shape, rr = _prepare(users, items, ratings, shape, split, duplicates)
    uids = _as_labels("user_ids", user_ids, shape[0])
    iids = _as_labels("item_ids", item_ids, shape[1])
    return _write_store(path, storage_options, overwrite, arrays, shape, rr, duplicates,
                        uids, iids)


# --------------------------------------------------------------------------- reading


class _RatingsBase:
    """The reading API shared by `RatingsDataset` and `InMemoryRatingsDataset`.

    Subclasses set ``shape``, ``splits``, ``_nnz`` and implement ``_source()`` (what
    ``_array`` reads from) and ``_array(src, split, part, name, sel)``.
    """

    path = None
    storage_options = None

    def _init_meta(self, shape, nnz: dict) -> None:
        self.shape = (int(shape[0]), int(shape[1]))
        self.n_users, self.n_items = self.shape
        self.splits = tuple(s for s in SPLITS if s in nnz)
        self._nnz = {s: int(nnz[s]) for s in self.splits}
        self.nnz = self._nnz["train"]
        self.dtype = np.dtype(np.float64)

    def __repr__(self) -> str:
        where = "" if self.path is None else f"{self.path!r}, "
        return f"{type(self).__name__}({where}shape={self.shape}, nnz={self._nnz})"

    # -- helpers
    def _check_split(self, split) -> str:
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r}; this dataset has "
                             f"{', '.join(self.splits)}")
        return split

    def _extent(self, part: str) -> tuple[int, int]:
        """(extent of the compressed axis, range of the stored indices)."""
        return (self.n_users, self.n_items) if part == "rows" else (self.n_items, self.n_users)

    def _indptr(self, src, split: str, part: str, sel: slice = slice(None)) -> np.ndarray:
        """``indptr[sel]`` of ``split``/``part``, checked: in [0, nnz], non-decreasing, and
        starting at 0 / ending at nnz where the selection includes the ends."""
        split = self._check_split(split)
        extent, _ = self._extent(part)
        nnz = self._nnz[split]
        ptr = self._array(src, split, part, "indptr", sel)
        what = f"split {split!r} {part}"
        start, stop, _ = sel.indices(extent + 1)
        if len(ptr) and (np.any(np.diff(ptr) < 0) or ptr[0] < 0 or ptr[-1] > nnz
                         or (start == 0 and ptr[0] != 0)
                         or (stop == extent + 1 and ptr[-1] != nnz)):
            raise DatasetError(f"{what}: 'indptr' is corrupted (not non-decreasing from 0 "
                               f"to nnz = {nnz})")
        return ptr.astype(np.int64, copy=False)

    def _load(self, a0, a1, split: str, part: str):
        extent, m = self._extent(part)
        what = "users" if part == "rows" else "items"
        for v in (a0, a1):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{part} bounds must be integers, got {shown(v)}")
        a0, a1 = int(a0), int(a1)
        if not 0 <= a0 <= a1 <= extent:
            raise ValueError(f"{part} {a0}:{a1} out of range: need 0 <= start <= stop <= "
                             f"{extent} ({what})")
        src = self._source()
        ptr = self._indptr(src, split, part, slice(a0, a1 + 1))
        s, e = int(ptr[0]), int(ptr[-1])
        indices = self._array(src, split, part, "indices", slice(s, e))
        data = self._array(src, split, part, "data", slice(s, e))
        ptr = ptr - s
        check_compressed(ptr, indices, data, m, f"split {split!r} {part}",
                         "row" if part == "rows" else "column",
                         bad_indptr="'indices'/'data' are shorter than 'indptr' says")
        return ptr, indices, data

    # -- public
    def nnz_of(self, split: str) -> int:
        """Number of ratings in ``split``."""
        return self._nnz[self._check_split(split)]

    def row_indptr(self, split: str = "train") -> np.ndarray:
        """CSR row pointer of ``split`` (int64, length ``n_users + 1``): ratings per user
        are ``diff(row_indptr)``."""
        return self._indptr(self._source(), split, "rows").copy()

    def col_indptr(self, split: str = "train") -> np.ndarray:
        """CSC column pointer of ``split`` (int64, length ``n_items + 1``)."""
        return self._indptr(self._source(), split, "cols").copy()

    def load_rows(self, r0: int, r1: int, split: str = "train"):
        """Ratings of users ``r0:r1`` in CSR form.

        Returns
        -------
        indptr : numpy.ndarray of int64, shape (r1 - r0 + 1,)
            Starts at 0.
        indices : numpy.ndarray of int32
            Item ids, strictly increasing within each row.
        data : numpy.ndarray of float64
            Ratings.

        Raises
        ------
        DatasetError
            Corrupted arrays (the message names the array).
        """
        return self._load(r0, r1, split, "rows")

    def load_cols(self, c0: int, c1: int, split: str = "train"):
        """Ratings of items ``c0:c1`` in CSC form: ``(indptr, indices, data)`` as in
        `load_rows`, with user ids as ``indices``."""
        return self._load(c0, c1, split, "cols")

    def to_coo(self, split: str = "train"):
        """All ratings of ``split`` sorted by (user, item): ``(users int32, items int32,
        ratings float64)``."""
        ptr, items, data = self.load_rows(0, self.n_users, split)
        users = np.repeat(np.arange(self.n_users, dtype=np.int32), np.diff(ptr))
        return users, items, data

    def balanced_bounds(self, n_parts: int, axis: int, split: str = "train") -> np.ndarray:
        """Contiguous boundaries of users (``axis=0``) or items (``axis=1``) giving
        ``n_parts`` parts of roughly equal numbers of ratings of ``split``.

        Returns
        -------
        numpy.ndarray of int64, shape (n_parts + 1,)
            ``[0, ..., extent]``, strictly increasing: every part holds at least one
            user/item (possibly with no ratings).

        Raises
        ------
        ValueError
            ``n_parts`` is not an integer in ``[1, extent]`` or ``axis`` not 0 or 1.
        """
        if axis not in (0, 1) or isinstance(axis, bool):
            raise ValueError(f"axis must be 0 (users) or 1 (items), got {shown(axis)}")
        extent = self.shape[axis]
        what = "users" if axis == 0 else "items"
        if (isinstance(n_parts, bool) or not isinstance(n_parts, (int, np.integer))
                or n_parts < 1):
            raise ValueError(f"n_parts must be a positive integer, got {shown(n_parts)}")
        if n_parts > extent:
            raise ValueError(f"cannot split {extent} {what} into {n_parts} non-empty parts")
        ptr = self.row_indptr(split) if axis == 0 else self.col_indptr(split)
        return _balanced_bounds(np.diff(ptr), int(n_parts))

    def load_ids(self):
        """Original ``(user_ids, item_ids)`` labels of the indices, or ``(None, None)``."""
        return None, None

    def validate(self):
        """Read everything and check it; raise `DatasetError` on the first problem.

        Checks every split's row and column arrays (see `load_rows`), that both hold the
        same (user, item, rating) triplets, that the counts match the ``nnz`` attribute,
        that no pair is in two splits, and the id arrays.
        """
        keys = []
        for s in self.splits:
            ru, ri, rr = self.to_coo(s)
            ptr, cu, cr = self.load_cols(0, self.n_items, s)
            ci = np.repeat(np.arange(self.n_items, dtype=np.int32), np.diff(ptr))
            if len(rr) != self._nnz[s] or len(cr) != self._nnz[s]:
                raise DatasetError(f"split {s!r}: rows hold {len(rr)} and cols {len(cr)} "
                                   f"ratings, attribute 'nnz' says {self._nnz[s]}")
            o = np.lexsort((ci, cu))
            if not (np.array_equal(ru, cu[o]) and np.array_equal(ri, ci[o])
                    and np.array_equal(rr, cr[o])):
                raise DatasetError(f"split {s!r}: 'rows' and 'cols' hold different ratings")
            keys.append(ru.astype(np.int64) * self.n_items + ri)
        allk = np.concatenate(keys)
        if len(np.unique(allk)) != len(allk):
            raise DatasetError("a (user, item) pair is in more than one split")
        uids, iids = self.load_ids()
        for name, ids, n in (("user_ids", uids, self.n_users), ("item_ids", iids, self.n_items)):
            if ids is not None and (len(ids) != n or len(np.unique(ids)) != n):
                raise DatasetError(f"dataset: {name!r} must hold {n} distinct labels")
        return self


@store_kind("a ratings store (`dmp data convert ratings`, `dmp.io.write_ratings`)")
class RatingsDataset(_RatingsBase):
    """Handle on a stored ratings dataset (metadata only; picklable).

    Arrays are read on demand, each call opening the Zarr group afresh, so the object can
    be shipped to Dask workers.  Obtain one from `write_ratings`, `convert_ratings` or
    `dmp.io.open_dataset`.

    Attributes
    ----------
    path, storage_options, shape, n_users, n_items, splits, nnz (train), duplicates,
    rating_range, dtype
    """

    KIND = KIND
    REQUIRED_ATTRS = _REQUIRED_ATTRS

    def __init__(self, path: str, attrs: dict, *, storage_options=None):
        self.path = path
        self.storage_options = storage_options
        try:
            shape = attr_ints(attrs["shape"], "shape", low=1).tolist()
            splits = list(attrs["splits"])
            nnz = {str(k): attr_int(v, "nnz") for k, v in dict(attrs["nnz"]).items()}
            self.duplicates = _check_policy(attrs["duplicates"])
            if np.dtype(attrs["dtype"]) != np.float64:
                raise ValueError(f"dtype {attrs['dtype']!r} is not float64")
            rr = attrs.get("rating_range")
            if rr is not None:
                if (not isinstance(rr, list) or len(rr) != 2
                        or any(isinstance(x, bool) or not isinstance(x, (int, float))
                               for x in rr)
                        or not (np.isfinite(rr).all() and rr[0] <= rr[1])):
                    raise ValueError(f"'rating_range' must be [lowest, highest], two finite "
                                     f"numbers, got {shown(rr)}")
                rr = (float(rr[0]), float(rr[1]))
            self.rating_range = rr
            ids = attrs.get("ids")
            self._ids = None if ids is None else {k: str(ids[k]) for k in ("user_ids",
                                                                           "item_ids")}
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{path!r}: malformed attributes ({type(e).__name__}: {e})") \
                from None
        if (len(shape) != 2 or shape[0] * shape[1] >= 2**62
                or any(v > shape[0] * shape[1] for v in nnz.values()) or "train" not in splits
                or any(s not in SPLITS for s in splits) or len(set(splits)) != len(splits)
                or sorted(nnz) != sorted(splits) or any(v < 0 for v in nnz.values())
                or nnz["train"] < 1):
            raise DatasetError(f"{path!r}: inconsistent attributes: shape={shape}, "
                               f"splits={splits}, nnz={nnz}")
        if self._ids is not None and any(v not in ("int64", "string")
                                         for v in self._ids.values()):
            raise DatasetError(f"{path!r}: attribute 'ids' is malformed: {self._ids}")
        self._init_meta(shape, nnz)

    def _source(self):
        return _StoredDataset._group(self)

    def _array(self, g, split, part, name, sel):
        extent, _ = self._extent(part)
        dtype, length = {"indptr": ("int64", extent + 1),
                         "indices": ("int32", self._nnz[split]),
                         "data": ("float64", self._nnz[split])}[name]
        return _StoredDataset._read(self, g, f"{split}/{part}/{name}",
                                    f"split {split!r} {part}", dtype, length, sel)

    def load_ids(self):
        """Original ``(user_ids, item_ids)`` (int64 or numpy string arrays), or
        ``(None, None)`` when the dataset has none."""
        if self._ids is None:
            return None, None
        g = self._source()
        out = []
        for name, n in (("user_ids", self.n_users), ("item_ids", self.n_items)):
            if self._ids[name] == "int64":
                out.append(_StoredDataset._read(self, g, name, "dataset", "int64", n))
                continue
            try:
                z = g[name]
            except KeyError:
                raise DatasetError(f"dataset: array {name!r} is missing "
                                   f"({self.path}/{name})") from None
            except Exception as e:   # zarr rejects its metadata
                raise DatasetError(f"dataset: array {name!r} has corrupt metadata "
                                   f"({type(e).__name__}: {e})") from None
            if not hasattr(z, "dtype") or z.shape != (n,) or z.dtype.kind != "T":
                raise DatasetError(f"dataset: {name!r} must be a string array of length {n}, "
                                   f"has shape {z.shape} and dtype {z.dtype}")
            check_read(z, n, f"dataset: {name!r}")
            try:
                out.append(np.asarray(z[:]))
            except Exception as e:
                raise DatasetError(f"dataset: cannot read {name!r} "
                                   f"({type(e).__name__}: {e})") from None
        return out[0], out[1]


class InMemoryRatingsDataset(_RatingsBase):
    """Ratings held in memory, with the reading API of `RatingsDataset` (``path`` is None).

    Built exactly as `write_ratings` would store them, so every ``load_*`` method returns
    the same arrays as the stored dataset.  Loaded ``indices``/``data`` are views of the
    internal arrays: do not modify them in place.

    Parameters
    ----------
    R : scipy.sparse matrix/array or tuple (users, items, ratings)
        The train ratings.  Every stored entry of a sparse matrix is a rating, explicit
        zeros included (COO, CSR and CSC are read directly; other formats via ``tocoo()``).
    valid, test : same kinds as ``R``, optional
        Validation and test ratings, of the same shape.
    shape : (int, int), optional
        For tuple inputs; default from the sparse inputs, else the largest indices + 1.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        Repeated pairs within one input (see `write_ratings`); a pair in two inputs is
        an error.
    user_ids, item_ids : array-like, optional
        Original labels (see `write_ratings`).

    Raises
    ------
    DatasetError, ValueError, TypeError
        Invalid input (the checks of `write_ratings`).
    """

    def __init__(self, R, *, valid=None, test=None, shape=None, duplicates="error",
                 user_ids=None, item_ids=None):
        parts, shapes = [], []
        for name, M in (("R", R), ("valid", valid), ("test", test)):
            if M is None and name != "R":
                parts.append(None)
                continue
            if sp.issparse(M):
                if len(M.shape) != 2:
                    raise DatasetError(f"{name} must be 2-D, got shape {M.shape}")
                shapes.append((name, tuple(int(s) for s in M.shape)))
                parts.append(_sparse_triplets(M))
            elif isinstance(M, tuple) and len(M) == 3:
                parts.append(M)
            else:
                raise TypeError(f"{name} must be a scipy.sparse matrix or a (users, items, "
                                f"ratings) tuple, got {type(M).__name__}")
        if shape is not None:
            shapes.insert(0, ("shape", tuple(shape)))
        if shapes:
            for name, s in shapes[1:]:
                if s != shapes[0][1]:
                    raise DatasetError(f"{name} has shape {s} but {shapes[0][0]} has "
                                       f"shape {shapes[0][1]}")
            shape = shapes[0][1]
        us, its, rs, codes = [], [], [], []
        for c, p in enumerate(parts):
            if p is None:
                continue
            u, i, r = (np.asarray(x) for x in p)
            if not len(u) == len(i) == len(r):
                raise DatasetError(f"{SPLITS[c]}: users, items and ratings must have the same "
                                   f"length, got {len(u)}, {len(i)} and {len(r)}")
            us.append(_as_index("users", u))
            its.append(_as_index("items", i))
            rs.append(r)
            codes.append(np.full(len(r), c, dtype=np.int8))
        self._arrays, shape, self.rating_range = _prepare(
            np.concatenate(us), np.concatenate(its), np.concatenate(rs), shape,
            np.concatenate(codes), duplicates)
        self.duplicates = duplicates
        self._uids = _as_labels("user_ids", user_ids, shape[0])
        self._iids = _as_labels("item_ids", item_ids, shape[1])
        if (self._uids is None) != (self._iids is None):
            raise DatasetError("give both user_ids and item_ids, or neither")
        self._init_meta(shape, {s: len(a["rows"]["data"]) for s, a in self._arrays.items()})

    def _source(self):
        return None

    def _array(self, src, split, part, name, sel):
        return self._arrays[split][part][name][sel]

    def load_ids(self):
        """Original ``(user_ids, item_ids)``, or ``(None, None)``."""
        return self._uids, self._iids


def _sparse_triplets(M):
    """Every stored entry of a sparse matrix as ``(rows, cols, values)`` (no summing of
    duplicates, no dropping of zeros)."""
    fmt = M.format
    if fmt in ("csr", "csc"):
        ptr = np.asarray(M.indptr, dtype=np.int64)
        major = np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
        minor = np.asarray(M.indices[:ptr[-1]], dtype=np.int64)
        data = np.asarray(M.data[:ptr[-1]])
        return (major, minor, data) if fmt == "csr" else (minor, major, data)
    C = M if fmt == "coo" else M.tocoo()
    return np.asarray(C.row), np.asarray(C.col), np.asarray(C.data)


# --------------------------------------------------------------------------- text files

_USER_NAMES = {"user", "userid", "uid", "users", "customer", "customerid", "reviewerid"}
_ITEM_NAMES = {"item", "itemid", "iid", "items", "movie", "movieid", "product", "productid",
               "asin", "book", "bookid", "isbn", "track", "trackid"}
_RATING_NAMES = {"rating", "ratings", "score", "stars", "overall", "bookrating"}
#: names of columns that are not ratings but show that a first line is a header
_OTHER_NAMES = {"timestamp", "time", "date", "datetime", "ts", "unixtime", "unixreviewtime"}
_CLI_COLUMNS = "on the command line --columns USER,ITEM,RATING"
_INT_RE = re.compile(r"^-?(0|[1-9][0-9]*)$")


def _norm_name(field: str) -> str:
    """``" User_Id:token "`` -> ``"userid"``."""
    f = field.strip().strip('"').split(":")[0].lower()
    return f.replace("_", "").replace("-", "").replace(" ", "")


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _named_columns(fields) -> tuple[int, int, int] | None:
    """Positions of the user, item and rating columns of a header, or None."""
    names = [_norm_name(f) for f in fields]
    found = []
    for known in (_USER_NAMES, _ITEM_NAMES, _RATING_NAMES):
        pos = [k for k, n in enumerate(names) if n in known]
        if len(pos) != 1:
            return None
        found.append(pos[0])
    return found[0], found[1], found[2]


def _unnamed_columns(fields) -> str | None:
    """Why a header that names columns (user, item, rating or time ones) does not locate
    exactly one user, one item and one rating column; None when it names no known column
    at all, or locates all three."""
    names = [_norm_name(f) for f in fields]
    known = (("user", _USER_NAMES), ("item", _ITEM_NAMES), ("rating", _RATING_NAMES))
    if not any(n in _OTHER_NAMES or any(n in k for _, k in known) for n in names):
        return None
    found, missing, located = [], [], 0
    for what, k in known:
        pos = [j for j, n in enumerate(names) if n in k]
        if len(pos) == 1:
            found.append(f"{what} {fields[pos[0]]!r}")
            located += 1
        elif pos:
            found.append(f"{len(pos)} {what} columns "
                         f"({', '.join(repr(fields[j]) for j in pos)})")
        else:
            missing.append(what)
    if located == 3:
        return None
    if not found:
        return "names none of them"
    why = f"names {', '.join(found)}"
    if missing:
        why += f" but no {' and no '.join(missing)} column"
        if "rating" in missing:
            why += f" (a rating column is named one of {', '.join(sorted(_RATING_NAMES))})"
    return why


def _sniff_sep(line: str) -> str | None:
    """Delimiter of a data line: ``::``, tab, comma, semicolon, or None (whitespace)."""
    for sep in ("::", "\t", ",", ";"):
        if sep in line:
            return sep
    return None


def _norm_sep(sep):
    if sep is None or sep in (" ", "whitespace"):
        return sep if sep is None else "whitespace"
    if not isinstance(sep, str) or not sep:
        raise ValueError(f"sep must be a non-empty string, got {shown(sep)}")
    return {"\\t": "\t", "tab": "\t"}.get(sep, sep)


def _split(line: str, sep, quoting: bool) -> list[str]:
    """Fields of a line; with ``quoting``, double-quoted fields may hold ``sep``."""
    if quoting and '"' in line:
        return next(csv.reader([line], delimiter=sep))
    return line.split(sep)


class _Parsed:
    """Result of `_parse_file`: per-rating codes into first-appearance label lists."""

    def __init__(self, ucodes, icodes, ratings, lines, ulabels, ilabels, path):
        self.ucodes, self.icodes, self.ratings, self.lines = ucodes, icodes, ratings, lines
        self.ulabels, self.ilabels, self.path = ulabels, ilabels, path


def _parse_file(path, fmt="auto", sep=None, header="auto", columns=None) -> _Parsed:
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(map(repr, FORMATS))}, "
                         f"got {shown(fmt)}")
    if header not in ("auto", True, False):
        raise ValueError(f"header must be 'auto', True or False, got {shown(header)}")
    if columns is not None and (len(columns) != 3 or not (
            all(isinstance(c, str) for c in columns)
            or all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                   for c in columns))):
        raise ValueError("columns must be three column positions (ints >= 0) or three "
                         f"header names (user, item, rating), got {shown(columns)}")
    sep = _norm_sep(sep)
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ratings file {path!r} does not exist")

    def fail(lineno, msg):
        raise DatasetError(f"{path}:{lineno}: {msg}")

    umap: dict[str, int] = {}
    imap: dict[str, int] = {}
    uc, ic, rv, ln = array("q"), array("q"), array("d"), array("q")
    cu = ci = cr = None
    n_fields = None  # exact field count (csv with a header) or None
    need = 3
    delim = None
    saw_header = False
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                fail(lineno, f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column "
                             f"{e.start + 1})")
            if not line:
                continue
            if cu is None:  # first non-blank line: work out the layout
                kind = fmt
                delim = sep
                if delim is None:
                    delim = "::" if kind == "movielens" else _sniff_sep(line)
                if kind == "auto":
                    kind = "movielens" if delim == "::" else "delimited"
                split_on = None if delim == "whitespace" else delim
                quoting = delim in (",", ";", "\t")  # quoted fields, csv style
                fields = [x.strip() for x in _split(line, split_on, quoting)]
                named = _named_columns(fields)
                if header == "auto":
                    pos = 2 if columns is None or isinstance(columns[0], str) else columns[2]
                    is_header = named is not None or (
                        len(fields) > pos and not _is_number(fields[pos]))
                else:
                    is_header = header
                if columns is not None and isinstance(columns[0], str):
                    if not is_header:
                        fail(lineno, f"columns={columns!r} names header columns but the "
                                     "file has no header")
                    names = [_norm_name(x) for x in fields]
                    try:
                        cu, ci, cr = (names.index(_norm_name(c)) for c in columns)
                    except ValueError:
                        fail(lineno, f"header {fields} lacks one of the columns {columns}")
                elif columns is not None:
                    cu, ci, cr = columns
                elif is_header and named is not None and kind in ("csv", "delimited"):
                    cu, ci, cr = named
                elif is_header and kind != "movielens" and _unnamed_columns(fields):
                    # a header that names its columns is read by name, never by position:
                    # "userId,movieId,timestamp" must not make the timestamps ratings
                    fail(lineno, f"cannot find the user, item and rating columns in the "
                                 f"header {fields}: it {_unnamed_columns(fields)}; pass "
                                 f"columns=(user, item, rating) ({_CLI_COLUMNS})")
                elif is_header and kind == "csv":
                    fail(lineno, f"cannot find the user, item and rating columns in the "
                                 f"header {fields}; pass columns=(user, item, rating) "
                                 f"({_CLI_COLUMNS})")
                elif is_header and named is not None and named != (0, 1, 2):
                    fail(lineno, f"the header {fields} puts the user, item and rating "
                                 f"columns at positions {list(named)}, but format "
                                 f"'triplets' reads the first three; use format 'csv' or "
                                 f"pass columns=(user, item, rating) ({_CLI_COLUMNS})")
                else:
                    cu, ci, cr = 0, 1, 2
                need = max(cu, ci, cr) + 1
                if kind == "movielens":
                    need = max(need, 3)
                if is_header:
                    if kind == "csv" or (kind == "delimited" and named is not None):
                        n_fields = len(fields)
                    saw_header = True
                    continue
            fields = _split(line, split_on, quoting)
            nf = len(fields)
            if n_fields is not None and nf != n_fields:
                fail(lineno, f"expected {n_fields} fields like the header, got {nf}")
            if nf < need or (kind == "movielens" and nf > 4):
                by = "whitespace" if delim == "whitespace" else repr(delim)
                want = ("3 or 4 (user::item::rating[::timestamp])" if kind == "movielens"
                        else f"at least {need}")
                fail(lineno, f"expected {want} fields separated by {by}, got {nf}")
            ul, il, rs = fields[cu].strip(), fields[ci].strip(), fields[cr].strip()
            try:
                x = float(rs)
            except ValueError:
                fail(lineno, f"rating {rs!r} is not a number")
            if not math.isfinite(x):
                fail(lineno, f"rating {rs!r} is not finite")
            if not ul or not il:
                fail(lineno, "empty user or item label")
            u = umap.get(ul)
            if u is None:
                u = umap[ul] = len(umap)
            i = imap.get(il)
            if i is None:
                i = imap[il] = len(imap)
            uc.append(u)
            ic.append(i)
            rv.append(x)
            ln.append(lineno)
    if not rv:
        if saw_header:
            raise DatasetError(f"{path}: the file has a header but no ratings")
        raise DatasetError(f"{path}: the file is empty (no ratings)")
    return _Parsed(np.frombuffer(uc, dtype=np.int64), np.frombuffer(ic, dtype=np.int64),
                   np.frombuffer(rv, dtype=np.float64), np.frombuffer(ln, dtype=np.int64),
                   list(umap), list(imap), path)


def _sorted_labels(labels: list[str], codes: np.ndarray):
    """Sort labels (numerically when all are integers that fit in int64, else as strings);
    return ``(ids, new_codes)`` with ``ids[new_codes] == labels[codes]``."""
    ints = all(_INT_RE.match(s) for s in labels)
    if ints:
        vals = [int(s) for s in labels]
        ints = all(-(2 ** 63) <= v < 2 ** 63 for v in vals)
    arr = (np.array(vals, dtype=np.int64) if ints
           else np.array(labels, dtype=np.dtypes.StringDType()))
    order = np.argsort(arr, kind="stable")
    rank = np.empty(len(arr), dtype=np.int64)
    rank[order] = np.arange(len(arr))
    return arr[order], rank[codes]


def _read_indexed(path, format, sep, header, columns):
    p = _parse_file(path, format, sep, header, columns)
    uids, u = _sorted_labels(p.ulabels, p.ucodes)
    iids, i = _sorted_labels(p.ilabels, p.icodes)
    return p, u, i, uids, iids


def read_ratings_file(path, *, format="auto", sep=None, header="auto", columns=None):
    """Read a ratings text file.

    Parameters
    ----------
    path : str or os.PathLike
        UTF-8 text file (``~`` is expanded).  Blank lines are skipped.
    format : {"auto", "movielens", "csv", "triplets"}, default "auto"
        "movielens": ``user::item::rating[::timestamp]`` lines (ML-1M/10M ``ratings.dat``).
        "csv": delimited with a header naming the columns (case-insensitive, ``_`` and a
        ``:type`` suffix ignored: user/userId/user_id:token, item/itemId/movieId/
        item_id:token, rating/rating:float, ...), or headerless user, item, rating columns.
        "triplets": ``user item rating`` in the first three columns (extra columns
        ignored), optional header.  "auto": ``::`` means movielens; otherwise a header
        with recognised names locates the columns, else the first three are used.
    sep : str, optional
        Delimiter; default sniffed from the first line (``::``, tab, ``,``, ``;``, else
        runs of whitespace).  ``"\\t"``/``"tab"`` mean tab, ``" "``/``"whitespace"`` runs
        of whitespace.
    header : {"auto", True, False}, default "auto"
        "auto": the first line is a header when it names the columns or its rating field
        is not a number.
    columns : tuple of 3 ints or 3 str, optional
        Positions (0-based) or header names of the user, item and rating columns.

    Returns
    -------
    user_labels, item_labels : numpy.ndarray, shape (n,)
        Labels of each rating: int64 when every label of that axis is an integer, else a
        numpy string array.
    ratings : numpy.ndarray of float64, shape (n,)

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    DatasetError
        Malformed file; the message gives ``path:line``: wrong field count, rating not a
        number or not finite, invalid UTF-8, empty file or header only.
    """
    p, u, i, uids, iids = _read_indexed(path, format, sep, header, columns)
    return uids[u], iids[i], p.ratings.copy()


def _check_fractions(split) -> tuple[float, float, float]:
    try:
        fr = tuple(float(x) for x in split)
    except (TypeError, ValueError):
        raise ValueError(f"split must be three fractions (train, valid, test), "
                         f"got {shown(split)}") from None
    if (len(fr) != 3 or not all(math.isfinite(x) and x >= 0 for x in fr)
            or abs(sum(fr) - 1) > 1e-9 or fr[0] <= 0):
        raise ValueError(f"split must be three non-negative fractions (train, valid, test) "
                         f"summing to 1 with train > 0, got {shown(split)}")
    return fr


def _random_split(n: int, fractions, seed) -> np.ndarray:
    """Codes 0/1/2 drawn independently per rating; a zero fraction gets no ratings."""
    f_train, f_valid, f_test = fractions
    x = np.random.default_rng(seed).random(n)
    codes = np.zeros(n, dtype=np.int8)
    if f_valid > 0:
        codes[x >= f_train] = 1
    if f_test > 0:
        codes[x >= (f_train + f_valid if f_valid > 0 else f_train)] = 2
    return codes


def convert_ratings(source, dest, *, format="auto", split=(0.8, 0.1, 0.1), seed=0,
                    duplicates="error", sep=None, header="auto", columns=None,
                    overwrite=False, storage_options=None) -> RatingsDataset:
    """Convert a ratings text file to a ratings dataset with a random split.

    Labels are mapped to indices in sorted order (numerically when all labels of an axis
    are integers) and stored as ``user_ids``/``item_ids``.  Duplicate (user, item) pairs
    are resolved first (``duplicates``), then each remaining rating, in (user, item)
    order, draws ``numpy.random.default_rng(seed).random()`` and goes to train, valid or
    test by the cumulative ``split`` fractions.  Users or items without train ratings are
    allowed.

    Parameters
    ----------
    source : str or os.PathLike
        Ratings file (see `read_ratings_file` for ``format``, ``sep``, ``header`` and
        ``columns``).
    dest : str or os.PathLike
        Dataset path or URL.
    split : (float, float, float), default (0.8, 0.1, 0.1)
        Train, valid and test fractions: non-negative, summing to 1, train > 0.  A split
        with fraction 0 (or that draws no rating) is omitted.
    seed : int, default 0
        Seed of the split.
    duplicates : {"error", "mean", "last", "sum"}, default "error"
        See `write_ratings`; "last" means the last in file order.
    overwrite : bool, default False
    storage_options : dict, optional

    Returns
    -------
    RatingsDataset

    Raises
    ------
    FileNotFoundError, DatasetError, ValueError, FileExistsError
    """
    fractions = _check_fractions(split)
    duplicates = _check_policy(duplicates)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ValueError(f"seed must be an integer or None, got {shown(seed)}")
    dest = _normalize_path(dest)
    _check_dest(dest, storage_options, overwrite)
    p, u, i, uids, iids = _read_indexed(source, format, sep, header, columns)
    shape = (len(uids), len(iids))
    _check_shape(shape, u[:0], i[:0])

    def name_pair(a, b):
        return f"user {shown(uids[a])}, item {shown(iids[b])}"

    def locate(pos):
        return f"line {int(p.lines[pos])}"

    codes0 = np.zeros(len(u), dtype=np.int8)
    u, i, r, _ = _aggregate(u, i, p.ratings, codes0, shape[1], duplicates,
                            name_pair=name_pair, locate=locate)
    codes = _random_split(len(r), fractions, seed)
    if not np.any(codes == 0):
        raise DatasetError(f"{p.path}: the random split left the train split empty "
                           f"({plural(len(r), 'rating')}); use a larger train fraction")
    arrays, shape, rr = _prepare(u, i, r, shape, codes, "error")
    extra = {"source": os.path.basename(p.path), "split_fractions": list(fractions),
             "split_seed": None if seed is None else int(seed)}
    return _write_store(dest, storage_options, overwrite, arrays, shape, rr, duplicates,
                        uids, iids, extra)
