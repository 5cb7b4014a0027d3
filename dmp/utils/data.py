"""In-memory stand-in for a Zarr sparse dataset (same interface as ``dmp.io.SparseDataset``).

The local backend reads partitions straight from it; the Dask backend never ships it (in-memory
inputs are written to a temporary Zarr store that the workers open themselves).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..io.sparse import _balanced_bounds, column_stats


class InMemorySparseDataset:
    """A CSC design matrix and target held in memory, split into column shards."""

    path = None

    def __init__(self, X, y, n_shards: int = 1):
        X = sp.csc_matrix(X, dtype=np.float64)
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
        c0, c1 = self.col_bounds[ks[0]], self.col_bounds[ks[-1] + 1]
        return self._X[:, c0:c1]

    def column_partition(self, n_parts: int) -> list[list[int]]:
        b = _balanced_bounds(self.shard_nnz(), n_parts)
        return [list(range(int(b[i]), int(b[i + 1]))) for i in range(n_parts)]
