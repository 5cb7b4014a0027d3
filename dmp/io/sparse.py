"""Column-block sparse datasets stored as Zarr v3 groups.

Layout of a dataset at ``<path>``::

    <path>/                 zarr v3 group, attrs: dmp_format, kind, shape, nnz, n_shards,
                            col_bounds, shard_nnz, dtype, complete, created_by
      y                     float64[n]
      col_sums              float64[p]   (sum_i X_ij)
      col_sq_norms          float64[p]   (sum_i X_ij**2)
      shards/s0000/indptr   int64[c1-c0+1]  CSC of columns [c0, c1), all n rows
      shards/s0000/indices  int32[nnz_k]    sorted row indices, no duplicates
      shards/s0000/data     float64[nnz_k]
      shards/s0001/...

Shard ``k`` holds the columns ``col_bounds[k]:col_bounds[k + 1]``.  Workers open the
dataset by path (plus ``storage_options``) and read only the shards they own.

What every kind of store shares (`DatasetError`, paths, atomic writes, the checks on reading,
`open_dataset`) is in ``dmp.io._store``; row-block datasets (``kind="sparse-rows"``, for
data-parallel algorithms) live in `dmp.io.rows`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ._input import _prepare_input
from ._store import (FORMAT_VERSION, DatasetError, _atomic_write, _balanced_bounds,
                     _check_dest, _check_n_shards, _default_n_shards, _normalize_path,
                     _StoredDataset, _write_array, open_dataset, partition_shards,
                     sklearn_indices, store_kind)
# names the estimators and the pipeline import from here (their homes: _input, _store)
from ._input import _is_dask  # noqa: F401
from ._store import (STORE_KINDS, _group_has_attrs, attr_int, attr_ints,  # noqa: F401
                     check_allocation, check_compressed, check_read, require_store_kind)

__all__ = ["DatasetError", "SparseDataset", "write_sparse", "open_dataset"]

KIND = "sparse-columns"
_REQUIRED_ATTRS = ("shape", "nnz", "n_shards", "col_bounds", "dtype", "complete")


def column_stats(M: sp.csc_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Column sums and squared norms of a CSC block (one summation order everywhere, so
    in-memory and stored datasets agree to the last bit)."""
    from ..kernels.sparse import csc_column_stats

    return csc_column_stats(np.asarray(M.indptr, dtype=np.int64),
                            np.asarray(M.data, dtype=np.float64))


# --------------------------------------------------------------------------- writing


def write_sparse(path, X, y, *, n_shards=None, overwrite=False,
                 storage_options=None) -> "SparseDataset":
    """Write a design matrix and targets as a column-block sparse dataset.

    Parameters
    ----------
    path : str or os.PathLike
        Destination (local path or fsspec URL such as ``s3://bucket/ds.zarr``).
    X : array-like of shape (n, p)
        Numpy array, scipy.sparse matrix/array, or dask array (converted one column
        block at a time).  Explicit zeros are dropped.
    y : array-like of shape (n,)
        Targets.
    n_shards : int, optional
        Number of column shards, in ``[1, p]``.  Default: about 2M stored values per shard.
        Column bounds are chosen so that shards hold roughly equal numbers of nonzeros.
    overwrite : bool, default False
        Replace an existing dataset at ``path`` (removed only once the new one is complete;
        anything there that is not a dmp dataset is refused, never replaced).
    storage_options : dict, optional
        fsspec options for remote URLs.

    Returns
    -------
    SparseDataset

    Raises
    ------
    DatasetError
        Invalid ``X``, ``y`` or ``n_shards``.
    FileExistsError
        ``path`` exists and ``overwrite`` is False.
    """
    path = _normalize_path(path)
    _check_dest(path, storage_options, overwrite)
    src, y = _prepare_input(X, y, "csc", copy=False)
    n, p = src.shape

    col_nnz = src.slice_nnz()
    total = int(col_nnz.sum())
    if n_shards is None:
        n_shards = _default_n_shards(total, p)
    n_shards = _check_n_shards(n_shards, p)
    col_bounds = _balanced_bounds(col_nnz, n_shards)

    attrs: dict[str, Any] = {
        "dmp_format": FORMAT_VERSION, "kind": KIND, "shape": [int(n), int(p)],
        "nnz": total, "n_shards": n_shards, "col_bounds": [int(c) for c in col_bounds],
        "dtype": "float64", "complete": False, "created_by": "dmp",
    }

    def fill(g):
        g.attrs.update(attrs)
        _write_array(g, "y", y, "float64")
        col_sums = np.zeros(p)
        col_sq = np.zeros(p)
        shard_nnz = []
        for k in range(n_shards):
            c0, c1 = int(col_bounds[k]), int(col_bounds[k + 1])
            M = src.block(c0, c1)
            col_sums[c0:c1], col_sq[c0:c1] = column_stats(M)
            sg = g.require_group(f"shards/s{k:04d}")
            _write_array(sg, "indptr", M.indptr, "int64")
            _write_array(sg, "indices", M.indices, "int32")
            _write_array(sg, "data", M.data, "float64")
            shard_nnz.append(int(M.nnz))
        if sum(shard_nnz) != total:
            raise DatasetError(f"X changed while being written: counted {total} nonzeros, "
                               f"wrote {sum(shard_nnz)}")
        _write_array(g, "col_sums", col_sums, "float64")
        _write_array(g, "col_sq_norms", col_sq, "float64")
        g.attrs.update({"shard_nnz": shard_nnz})
        g.attrs.update({"complete": True})  # last

    _atomic_write(path, storage_options, overwrite, fill)
    return open_dataset(path, storage_options=storage_options)


# --------------------------------------------------------------------------- reading


@store_kind("a column-sharded sparse store (`dmp data convert svmlight`, `dmp.io.write_sparse`)")
class SparseDataset(_StoredDataset):
    """Handle on a column-block sparse dataset (metadata only; picklable).

    Arrays are read on demand by the ``load_*`` methods, each of which opens the Zarr
    group afresh, so the object can be shipped to workers.

    Parameters
    ----------
    path : str
        Dataset location.
    attrs : dict
        Group attributes (as written by `write_sparse`).
    storage_options : dict, optional
        fsspec options for remote URLs.

    Attributes
    ----------
    path, storage_options, shape, n_samples, n_features, nnz, n_shards, col_bounds, dtype
    """

    KIND = KIND
    BOUNDS = "col_bounds"
    AXIS = 1
    REQUIRED_ATTRS = _REQUIRED_ATTRS

    def load_col_stats(self, cols: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(col_sums, col_sq_norms)`` of the columns ``cols`` (all by default), float64
        each (a partition reads only its own columns' statistics)."""
        g = self._group()
        out = []
        for name in ("col_sums", "col_sq_norms"):
            a = self._read(g, name, "dataset", "float64", self.n_features, cols)
            if not np.all(np.isfinite(a)):
                raise DatasetError(f"dataset: {name!r} contains NaN or infinite values")
            out.append(a)
        if np.any(out[1] < 0):
            raise DatasetError("dataset: 'col_sq_norms' has negative values")
        return out[0], out[1]

    @staticmethod
    def _csc(data, indices, indptr, shape) -> sp.csc_matrix:
        # set, not passed to the constructor: scipy would check the (already checked)
        # arrays again and pick the index dtype itself
        M = sp.csc_matrix(shape, dtype=np.float64)
        M.data, M.indices, M.indptr = data, indices, indptr
        M.has_canonical_format = True
        return sklearn_indices(M)

    def load_shard(self, k: int) -> sp.csc_matrix:
        """Load and validate shard ``k``.

        Returns
        -------
        scipy.sparse.csc_matrix
            Shape ``(n_samples, col_bounds[k+1] - col_bounds[k])``; float64 data, sorted
            row indices; int32 ``indices`` and ``indptr`` (int64 for both beyond 2**31 - 1
            values), as scikit-learn's estimators take them.

        Raises
        ------
        DatasetError
            ``k`` out of range, or a missing or corrupted array (named in the message).
        """
        indptr, indices, data, w = self._load_arrays(self._group(), k)
        return self._csc(data, indices, indptr, (self.n_samples, w))

    def load_shards(self, ks) -> sp.csc_matrix:
        """Load consecutive shards ``ks`` and stack them horizontally.

        Parameters
        ----------
        ks : sequence of int
            Contiguous increasing shard indices, e.g. ``[3, 4, 5]``.

        Returns
        -------
        scipy.sparse.csc_matrix
            Columns ``col_bounds[ks[0]]:col_bounds[ks[-1] + 1]`` (index dtypes as in
            `load_shard`).
        """
        ks = [self._check_k(k) for k in ks]
        if not ks:
            raise ValueError("ks must contain at least one shard index")
        if any(b != a + 1 for a, b in zip(ks, ks[1:])):
            raise ValueError(f"ks must be contiguous and increasing, got {ks}")
        g = self._group()
        ptrs, inds, datas, width = [], [], [], 0
        offset = 0
        for i, k in enumerate(ks):
            indptr, indices, data, w = self._load_arrays(g, k)
            ptrs.append(indptr[(1 if i else 0):] + offset)
            offset += int(indptr[-1])
            inds.append(indices)
            datas.append(data)
            width += w
        return self._csc(np.concatenate(datas), np.concatenate(inds),
                         np.concatenate(ptrs), (self.n_samples, width))

    def validate(self) -> "SparseDataset":
        """Read every array, shard by shard; raise `DatasetError` on the first problem."""
        self.load_y()
        col_sums, col_sq = self.load_col_stats()
        g = self._group()
        total = 0
        for k in range(self.n_shards):
            indptr, indices, data, w = self._load_arrays(g, k)
            total += len(data)
            c0, c1 = self.col_bounds[k], self.col_bounds[k + 1]
            cols = np.repeat(np.arange(w), np.diff(indptr))
            s = np.bincount(cols, weights=data, minlength=w)
            q = np.bincount(cols, weights=data * data, minlength=w)
            if not (np.allclose(s, col_sums[c0:c1], rtol=1e-9, atol=1e-9)
                    and np.allclose(q, col_sq[c0:c1], rtol=1e-9, atol=1e-9)):
                raise DatasetError(f"shard {k}: 'col_sums'/'col_sq_norms' do not match the "
                                   "shard data")
        if total != self.nnz:
            raise DatasetError(f"dataset: shards hold {total} nonzeros, attribute 'nnz' "
                               f"says {self.nnz}")
        return self

    def column_partition(self, n_parts: int) -> list[list[int]]:
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


class InMemorySparseDataset:
    """A CSC design matrix and target held in memory, split into column shards: the same
    interface as `SparseDataset`.

    The local backend reads partitions straight from it; the Dask backend never ships it
    (in-memory inputs are written to a temporary store that the workers open themselves).
    """

    path = None

    def __init__(self, X, y, n_shards: int = 1):
        # no copy of an input that is already canonical float64 CSC without stored zeros
        # (a copy, never an in-place change of the caller's matrix, otherwise)
        if type(X) is not sp.csc_matrix or X.dtype != np.float64:
            X = sp.csc_matrix(X, dtype=np.float64)
        if not X.has_canonical_format or (X.nnz and not np.all(X.data)):
            X = X.copy()
            X.sum_duplicates()
            X.eliminate_zeros()
            X.sort_indices()
        self._X = X
        self._y = np.asarray(y, dtype=np.float64)
        self._stats = None
        n, p = X.shape
        self.shape = (n, p)
        self.n_samples, self.n_features = n, p
        self.nnz = int(X.nnz)
        n_shards = max(1, min(int(n_shards), p))
        self.n_shards = n_shards
        # the same split as dmp.io.write_sparse, so both backends see the same partitions
        self.col_bounds = _balanced_bounds(np.diff(X.indptr), n_shards)

    def load_y(self) -> np.ndarray:
        return self._y

    def load_col_stats(self, cols: slice = slice(None)):
        if self._stats is None:
            self._stats = column_stats(self._X)
        return self._stats[0][cols], self._stats[1][cols]

    def shard_nnz(self) -> np.ndarray:
        return np.diff(self._X.indptr[self.col_bounds])

    def load_shards(self, ks):
        """Columns of shards ``ks`` as a CSC matrix sharing ``indices``/``data`` (views; the
        matrix itself when ``ks`` are all its shards)."""
        c0, c1 = int(self.col_bounds[ks[0]]), int(self.col_bounds[ks[-1] + 1])
        X = self._X
        if c0 == 0 and c1 == X.shape[1] and X.indices.dtype == X.indptr.dtype == np.int32:
            return X   # (scikit-learn's index dtypes already: `test_sklearn_shards`)
        s, e = int(X.indptr[c0]), int(X.indptr[c1])
        indptr = (X.indptr[c0:c1 + 1] - s).astype(np.int64)
        M = sp.csc_matrix((X.data[s:e], X.indices[s:e], indptr),
                          shape=(X.shape[0], c1 - c0), copy=False)
        M.has_canonical_format = True   # columns of a canonical matrix (scipy checks otherwise)
        return M

    def column_partition(self, n_parts: int) -> list[list[int]]:
        return partition_shards(self.shard_nnz(), n_parts)
