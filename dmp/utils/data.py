"""In-memory stand-in for a Zarr sparse dataset (same interface as ``dmp.io.SparseDataset``).

The local backend reads partitions straight from it; the Dask backend never ships it (in-memory
inputs are written to a temporary Zarr store that the workers open themselves).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..io.sparse import _balanced_bounds, column_stats, partition_shards


class InMemorySparseDataset:
    """A CSC design matrix and target held in memory, split into column shards."""

    path = None

    def __init__(self, X, y, n_shards: int = 1):
        # no copy of an input that is already canonical float64 CSC without stored zeros
        # (a copy, never an in-place change of the caller's matrix, otherwise)
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

    def load_col_stats(self):
        if self._stats is None:
            self._stats = column_stats(self._X)
        return self._stats

    def shard_nnz(self) -> np.ndarray:
        return np.diff(self._X.indptr[self.col_bounds])

    def load_shards(self, ks):
        """Columns of shards ``ks`` as a CSC matrix sharing ``indices``/``data`` (views)."""
        c0, c1 = int(self.col_bounds[ks[0]]), int(self.col_bounds[ks[-1] + 1])
        X = self._X
        s, e = int(X.indptr[c0]), int(X.indptr[c1])
        indptr = (X.indptr[c0:c1 + 1] - s).astype(np.int64)
        return sp.csc_matrix((X.data[s:e], X.indices[s:e], indptr),
                             shape=(X.shape[0], c1 - c0), copy=False)

    def column_partition(self, n_parts: int) -> list[list[int]]:
        return partition_shards(self.shard_nnz(), n_parts)
