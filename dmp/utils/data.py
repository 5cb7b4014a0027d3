"""In-memory stand-in for a Zarr sparse dataset (same interface as ``dmp.io.SparseDataset``).

The local backend reads partitions straight from it; the Dask backend never ships it (in-memory
inputs are written to a temporary Zarr store that the workers open themselves).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def balanced_contiguous_groups(weights, n_parts: int) -> list[list[int]]:
    """Split ``range(len(weights))`` into ``n_parts`` contiguous, non-empty groups of about
    equal total weight."""
    weights = np.asarray(weights, dtype=np.float64)
    n = len(weights)
    if not 1 <= n_parts <= n:
        raise ValueError(f"cannot split {n} shard(s) into {n_parts} partition(s)")
    cum = np.concatenate([[0.0], np.cumsum(weights + 1e-12)])
    targets = cum[-1] * np.arange(1, n_parts) / n_parts
    cuts = np.searchsorted(cum, targets, side="left")
    bounds = [0]
    for i, c in enumerate(cuts):
        c = int(min(max(c, bounds[-1] + 1), n - (n_parts - 1 - i)))
        bounds.append(c)
    bounds.append(n)
    return [list(range(bounds[i], bounds[i + 1])) for i in range(n_parts)]


class InMemorySparseDataset:
    """A CSC design matrix and target held in memory, split into column shards."""

    path = None

    def __init__(self, X, y, n_shards: int = 1):
        X = sp.csc_matrix(X, dtype=np.float64)
        X.sum_duplicates()
        X.sort_indices()
        self._X = X
        self._y = np.asarray(y, dtype=np.float64)
        n, p = X.shape
        self.shape = (n, p)
        self.n_samples, self.n_features = n, p
        self.nnz = int(X.nnz)
        n_shards = max(1, min(int(n_shards), p))
        self.n_shards = n_shards
        nnz_col = np.diff(X.indptr)
        groups = balanced_contiguous_groups(nnz_col + 1.0, n_shards)
        self.col_bounds = np.array([g[0] for g in groups] + [p], dtype=np.int64)

    def load_y(self) -> np.ndarray:
        return self._y

    def load_col_stats(self):
        X = self._X
        col_sums = np.asarray(X.sum(axis=0)).ravel()
        col_sq = np.asarray(X.multiply(X).sum(axis=0)).ravel()
        return col_sums, col_sq

    def shard_nnz(self) -> np.ndarray:
        return np.diff(self._X.indptr[self.col_bounds])

    def load_shards(self, ks):
        c0, c1 = self.col_bounds[ks[0]], self.col_bounds[ks[-1] + 1]
        return self._X[:, c0:c1]

    def column_partition(self, n_parts: int) -> list[list[int]]:
        return balanced_contiguous_groups(self.shard_nnz().astype(float), n_parts)
