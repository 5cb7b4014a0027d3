"""Row-block sparse datasets stored as Zarr v3 groups (for data-parallel algorithms).

Layout of a dataset at ``<path>``::

    <path>/                 zarr v3 group, attrs: dmp_format, kind="sparse-rows", shape, nnz,
                            n_shards, row_bounds, shard_nnz, dtype, complete, created_by
      y                     float64[n]
      shards/s0000/indptr   int64[r1-r0+1]  CSR of rows [r0, r1), all p columns
      shards/s0000/indices  int32[nnz_k]    sorted column indices, no duplicates
      shards/s0000/data     float64[nnz_k]  no explicit zeros
      shards/s0001/...

Shard ``k`` holds the samples ``row_bounds[k]:row_bounds[k + 1]`` (and their targets
``y[row_bounds[k]:row_bounds[k + 1]]``).  Row bounds are chosen so that shards hold roughly
equal numbers of nonzeros, each at least one row.  Workers open the dataset by path (plus
``storage_options``) and read only the shards they own; `dmp.io.open_dataset` returns a
`SparseRowDataset` for such a path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ._input import _prepare_input
from ._store import (FORMAT_VERSION, DatasetError, _atomic_write, _balanced_bounds,
                     _check_dest, _check_n_shards, _default_n_shards, _normalize_path,
                     _StoredDataset, _write_array, check_read, open_dataset, partition_shards,
                     sklearn_indices, store_kind)

__all__ = ["SparseRowDataset", "InMemorySparseRowDataset", "write_sparse_rows"]

KIND = "sparse-rows"
_REQUIRED_ATTRS = ("shape", "nnz", "n_shards", "row_bounds", "dtype", "complete")


# --------------------------------------------------------------------------- writing


def _row_bounds(src, n_shards):
    """``(row_bounds, n_shards, total_nnz)`` for a source: the split used by both
    `write_sparse_rows` and `InMemorySparseRowDataset`."""
    n = src.shape[0]
    row_nnz = src.slice_nnz()
    total = int(row_nnz.sum())
    if n_shards is None:
        n_shards = _default_n_shards(total, n)
    n_shards = _check_n_shards(n_shards, n, "rows")
    return _balanced_bounds(row_nnz, n_shards), n_shards, total


def write_sparse_rows(path, X, y, *, n_shards=None, overwrite=False,
                      storage_options=None, vocabulary=None,
                      names=None) -> "SparseRowDataset":
    """Write a design matrix and targets as a row-block sparse dataset.

    Parameters
    ----------
    path : str or os.PathLike
        Destination (local path or fsspec URL such as ``s3://bucket/ds.zarr``).
    X : array-like of shape (n, p)
        Numpy array, scipy.sparse matrix/array, or dask array (converted one row block at
        a time).  Explicit zeros are dropped.
    y : array-like of shape (n,)
        Targets.
    n_shards : int, optional
        Number of row shards, in ``[1, n]``.  Default: about 2M stored values per shard.
        Row bounds are chosen so that shards hold roughly equal numbers of nonzeros.
    overwrite : bool, default False
        Replace an existing dataset at ``path`` (removed only once the new one is complete;
        anything there that is not a dmp dataset is refused, never replaced).
    storage_options : dict, optional
        fsspec options for remote URLs.
    vocabulary : sequence of str, optional
        One name per column (a corpus's words), stored as the string array ``vocabulary``.
    names : sequence of str, optional
        One name per row (a corpus's documents: file names, source lines), stored as the
        string array ``names`` and read back by `SparseRowDataset.load_names`.

    Returns
    -------
    SparseRowDataset

    Raises
    ------
    DatasetError
        Invalid ``X``, ``y`` or ``n_shards``.
    FileExistsError
        ``path`` exists and ``overwrite`` is False.
    """
    path = _normalize_path(path)
    _check_dest(path, storage_options, overwrite)
    src, y = _prepare_input(X, y, "csr", copy=False)
    n, p = src.shape
    row_bounds, n_shards, total = _row_bounds(src, n_shards)
    if vocabulary is not None:
        vocabulary = np.asarray([str(w) for w in vocabulary], dtype=np.dtypes.StringDType())
        if vocabulary.shape != (p,):
            raise DatasetError(f"vocabulary has {len(vocabulary)} entries, X has {p} columns")
    if names is not None:
        names = np.asarray([str(w) for w in names], dtype=np.dtypes.StringDType())
        if names.shape != (n,):
            raise DatasetError(f"names has {len(names)} entries, X has {n} rows")

    attrs: dict[str, Any] = {
        "dmp_format": FORMAT_VERSION, "kind": KIND, "shape": [int(n), int(p)],
        "nnz": total, "n_shards": n_shards, "row_bounds": [int(r) for r in row_bounds],
        "dtype": "float64", "complete": False, "created_by": "dmp",
        "vocabulary": vocabulary is not None, "column_sums": True, "names": names is not None,
    }

    def fill(g):
        g.attrs.update(attrs)
        _write_array(g, "y", y, "float64")
        if vocabulary is not None:
            z = g.create_array("vocabulary", shape=(p,), dtype=str,
                               chunks=(max(1, min(p, 1 << 20)),))
            z[:] = vocabulary
        if names is not None:
            z = g.create_array("names", shape=(n,), dtype=str, chunks=(max(1, min(n, 1 << 20)),))
            z[:] = names
        shard_nnz = []
        col_sums = np.zeros(p)
        for k in range(n_shards):
            M = src.block(int(row_bounds[k]), int(row_bounds[k + 1]))
            sg = g.require_group(f"shards/s{k:04d}")
            _write_array(sg, "indptr", M.indptr, "int64")
            _write_array(sg, "indices", M.indices, "int32")
            _write_array(sg, "data", M.data, "float64")
            shard_nnz.append(int(M.nnz))
            col_sums += np.bincount(M.indices, weights=M.data, minlength=p)
        _write_array(g, "column_sums", col_sums, "float64")
        if sum(shard_nnz) != total:
            raise DatasetError(f"X changed while being written: counted {total} nonzeros, "
                               f"wrote {sum(shard_nnz)}")
        g.attrs.update({"shard_nnz": shard_nnz})
        g.attrs.update({"complete": True})  # last

    _atomic_write(path, storage_options, overwrite, fill)
    return open_dataset(path, storage_options=storage_options)


# --------------------------------------------------------------------------- reading


def _csr(data, indices, indptr, shape) -> sp.csr_matrix:
    """A CSR matrix on these (already checked) arrays, with the index dtypes scikit-learn
    takes (`dmp.io.sparse.sklearn_indices`: int32 unless too large).

    Not ``csr_matrix((data, indices, indptr))``: scipy copies any array that is a small
    view of a larger one, which would defeat the views of `InMemorySparseRowDataset`.
    """
    M = sp.csr_matrix(shape, dtype=np.float64)
    M.data, M.indices, M.indptr = data, indices, indptr
    return sklearn_indices(M)


def _check_ks(ks, check_k) -> list[int]:
    ks = [check_k(k) for k in ks]
    if not ks:
        raise ValueError("ks must contain at least one shard index")
    if len(set(ks)) != len(ks):
        raise ValueError(f"ks must not repeat a shard, got {ks}")
    return ks


def _concat_csr(parts, p: int) -> sp.csr_matrix:
    """Stack CSR pieces ``(indptr, indices, data)`` vertically, in the given order."""
    ptrs, inds, datas, offset, rows = [], [], [], 0, 0
    for i, (indptr, indices, data) in enumerate(parts):
        ptrs.append(np.asarray(indptr[(1 if i else 0):], dtype=np.int64) + offset)
        offset += int(indptr[-1])
        rows += len(indptr) - 1
        inds.append(indices)
        datas.append(data)
    indptr = np.concatenate(ptrs)
    indices = np.concatenate(inds)
    data = np.concatenate(datas)
    M = _csr(data, indices, indptr, (rows, p))
    M.has_canonical_format = True  # each piece is canonical; rows are not mixed
    return M


@store_kind("a row-sharded sparse store (`dmp data convert svmlight --layout rows`, a corpus "
            "from `dmp data convert uci|text`, `dmp.io.write_sparse_rows`)")
class SparseRowDataset(_StoredDataset):
    """Handle on a row-block sparse dataset (metadata only; picklable).

    Arrays are read on demand by the ``load_*`` methods, each of which opens the Zarr
    group afresh, so the object can be shipped to workers.  Obtain one from
    `write_sparse_rows` or `dmp.io.open_dataset`.

    Parameters
    ----------
    path : str
        Dataset location.
    attrs : dict
        Group attributes (as written by `write_sparse_rows`).
    storage_options : dict, optional
        fsspec options for remote URLs.

    Attributes
    ----------
    path, storage_options, shape, n_samples, n_features, nnz, n_shards, row_bounds, dtype
    """

    KIND = KIND
    BOUNDS = "row_bounds"
    AXIS = 0
    REQUIRED_ATTRS = _REQUIRED_ATTRS

    def _rows(self, g, k: int):
        indptr, indices, data, _ = self._load_arrays(g, k)
        return indptr, indices, data

    def load_rows(self, k: int) -> tuple[sp.csr_matrix, np.ndarray]:
        """Load and validate shard ``k``.

        Returns
        -------
        X_k : scipy.sparse.csr_matrix
            Rows ``row_bounds[k]:row_bounds[k+1]``, all ``n_features`` columns; float64
            data, sorted column indices; int32 ``indices`` and ``indptr`` (int64 for both
            beyond 2**31 - 1 values), as scikit-learn's estimators take them.
        y_k : numpy.ndarray
            Their targets, float64.

        Raises
        ------
        DatasetError
            ``k`` out of range (also an `IndexError`), or a missing or corrupted array
            (named in the message).
        """
        k = self._check_k(k)
        g = self._group()
        r0, r1 = int(self.row_bounds[k]), int(self.row_bounds[k + 1])
        X = _concat_csr([self._rows(g, k)], self.n_features)
        return X, self._read_y(g, slice(r0, r1))

    def load_row_shards(self, ks) -> tuple[sp.csr_matrix, np.ndarray]:
        """Load shards ``ks`` and stack their rows in the order given.

        Parameters
        ----------
        ks : sequence of int
            Distinct shard indices, in any order, e.g. ``[4, 0, 2]``.

        Returns
        -------
        X : scipy.sparse.csr_matrix
            The rows of ``ks[0]``, then those of ``ks[1]``, ... (index dtypes as in
            `load_rows`).
        y : numpy.ndarray
            Their targets, in the same order.
        """
        ks = _check_ks(ks, self._check_k)
        g = self._group()
        parts = [self._rows(g, k) for k in ks]
        y_all = self._read_y(g)
        y = np.concatenate([y_all[self.row_bounds[k]:self.row_bounds[k + 1]] for k in ks])
        return _concat_csr(parts, self.n_features), y

    def validate(self) -> "SparseRowDataset":
        """Read every array, shard by shard; raise `DatasetError` on the first problem
        (``indptr`` monotone and of the right length, ``indices`` in range and strictly
        increasing within each row, finite ``data`` and ``y``, nonzero counts matching
        the attributes)."""
        self.load_y()
        g = self._group()
        total = 0
        for k in range(self.n_shards):
            _, _, data = self._rows(g, k)
            total += len(data)
        if total != self.nnz:
            raise DatasetError(f"dataset: shards hold {total} nonzeros, attribute 'nnz' "
                               f"says {self.nnz}")
        self.load_vocabulary()
        self.load_names()
        return self

    def _strings(self, name: str, n: int, sel: slice = slice(None)):
        """``sel`` of the string array ``name`` of length ``n``, checked."""
        g = self._group()
        try:
            z = g[name]
        except KeyError:
            raise DatasetError(f"dataset: array {name!r} is missing "
                               f"({self.path}/{name})") from None
        except Exception as e:
            raise DatasetError(f"dataset: array {name!r} has corrupt metadata "
                               f"({type(e).__name__}: {e})") from None
        if not hasattr(z, "dtype") or z.shape != (n,) or z.dtype.kind != "T":
            raise DatasetError(f"dataset: {name!r} must be a string array of length {n}")
        check_read(z, len(range(*sel.indices(n))), f"dataset: {name!r}")
        try:
            return np.asarray(z[sel])
        except Exception as e:
            raise DatasetError(f"dataset: cannot read {name!r} "
                               f"({type(e).__name__}: {e})") from None

    def load_vocabulary(self):
        """The column names (a corpus's words) as a numpy string array, or None."""
        if not self._attrs_vocabulary:
            return None
        return self._strings("vocabulary", self.n_features)

    def load_names(self, start: int = 0, stop: int | None = None):
        """The names of rows ``start:stop`` (default all; a corpus's documents) as a numpy
        string array, or None.

        `dmp.io.convert_corpus` stores them: the file name of each document (text, one
        document per file), ``"line N"`` of the source (text, one per line) or
        ``"docID N"`` (UCI), so that every row can be traced to its source although
        documents left without words are dropped.  Other stores have none.
        """
        if not self._attrs_names:
            return None
        return self._strings("names", self.n_samples, slice(start, stop))

    def column_sums(self):
        """Sum of every column (a corpus's word frequencies), or None for a store written
        before dmp kept them."""
        if not self._attrs_column_sums:
            return None
        # shape and dtype checked before anything is read (a hostile shape allocates nothing)
        sums = self._read(self._group(), "column_sums", "dataset", "float64", self.n_features)
        if not np.all(np.isfinite(sums)):
            raise DatasetError(f"dataset: 'column_sums' must hold {self.n_features} finite "
                               f"values")
        return sums

    def row_partition(self, n_parts: int) -> list[list[int]]:
        """Split the shards into ``n_parts`` contiguous groups of roughly equal nnz.

        Parameters
        ----------
        n_parts : int
            Number of groups, ``1 <= n_parts <= n_shards``.

        Returns
        -------
        list of list of int
            Shard indices of each group, in order; every group is non-empty.
        """
        return partition_shards(self.shard_nnz(), n_parts)


class InMemorySparseRowDataset:
    """A CSR design matrix and targets held in memory, split into row shards.

    The same reading interface as `SparseRowDataset` (``path`` is None) and the same row
    bounds as `write_sparse_rows` would choose for ``(X, y, n_shards)``.  An ``X`` that is
    already canonical float64 CSR (sorted indices, no duplicates, no stored zeros) is not
    copied: loaded shards are views of its arrays (of ``indices`` where they are int32, as
    shards hand them out, and of ``y`` when that is float64), so do not modify them in
    place.

    Parameters
    ----------
    X : array-like of shape (n, p)
        Numpy array, scipy.sparse matrix/array or dask array (computed into memory).
    y : array-like of shape (n,)
    n_shards : int, optional
        In ``[1, n]``; default as in `write_sparse_rows`.

    Raises
    ------
    DatasetError
        Invalid ``X``, ``y`` or ``n_shards`` (the checks of `write_sparse_rows`).
    """

    path = None
    storage_options = None

    def __init__(self, X, y, n_shards=None):
        src, y = _prepare_input(X, y, "csr", copy=False)
        self.row_bounds, self.n_shards, self.nnz = _row_bounds(src, n_shards)
        if hasattr(src, "M"):
            M = src.M
        else:  # dask
            M = src.block(0, src.shape[0])
        self._X = M
        self._y = y
        self.shape = tuple(int(s) for s in M.shape)
        self.n_samples, self.n_features = self.shape
        self.dtype = np.dtype(np.float64)

    def __repr__(self) -> str:
        return (f"InMemorySparseRowDataset(shape={self.shape}, nnz={self.nnz}, "
                f"n_shards={self.n_shards})")

    def _check_k(self, k) -> int:
        return SparseRowDataset._check_k(self, k)

    def _view(self, r0: int, r1: int) -> sp.csr_matrix:
        X = self._X
        s, e = int(X.indptr[r0]), int(X.indptr[r1])
        indptr = np.asarray(X.indptr[r0:r1 + 1], dtype=np.int64) - s
        M = _csr(X.data[s:e], X.indices[s:e], indptr, (r1 - r0, X.shape[1]))
        M.has_canonical_format = True
        return M

    def load_y(self) -> np.ndarray:
        """Return the targets, float64 of shape (n_samples,)."""
        return self._y

    def column_sums(self) -> np.ndarray:
        """Sum of every column (a corpus's word frequencies)."""
        return np.bincount(self._X.indices, weights=self._X.data, minlength=self.shape[1])

    def shard_nnz(self) -> np.ndarray:
        """Return the number of stored values per shard (int64)."""
        return np.diff(np.asarray(self._X.indptr, dtype=np.int64)[self.row_bounds])

    def load_rows(self, k: int) -> tuple[sp.csr_matrix, np.ndarray]:
        """Rows of shard ``k`` and their targets (views; see the class docstring)."""
        k = self._check_k(k)
        r0, r1 = int(self.row_bounds[k]), int(self.row_bounds[k + 1])
        return self._view(r0, r1), self._y[r0:r1]

    def load_row_shards(self, ks) -> tuple[sp.csr_matrix, np.ndarray]:
        """Rows of shards ``ks`` stacked in the order given, and their targets.

        Consecutive increasing ``ks`` give views; any other order gives copies.
        """
        ks = _check_ks(ks, self._check_k)
        if all(b == a + 1 for a, b in zip(ks, ks[1:])):
            r0, r1 = int(self.row_bounds[ks[0]]), int(self.row_bounds[ks[-1] + 1])
            return self._view(r0, r1), self._y[r0:r1]
        views = [self._view(int(self.row_bounds[k]), int(self.row_bounds[k + 1]))
                 for k in ks]
        X = _concat_csr([(v.indptr, v.indices, v.data) for v in views], self.n_features)
        y = np.concatenate([self._y[self.row_bounds[k]:self.row_bounds[k + 1]] for k in ks])
        return X, y

    def row_partition(self, n_parts: int) -> list[list[int]]:
        """Split the shards into ``n_parts`` contiguous groups of roughly equal nnz."""
        return partition_shards(self.shard_nnz(), n_parts)
