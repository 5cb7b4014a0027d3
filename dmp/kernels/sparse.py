"""Generic sparse-matrix kernels (no model logic)."""

import numpy as np
from ._jit import njit


def csc_column_stats(indptr, data):
    """Column sums and squared norms of a CSC matrix, in one pass and no temporaries."""
    p = indptr.shape[0] - 1
    sums = np.empty(p)
    sq = np.empty(p)
    _csc_column_stats(indptr, data, sums, sq)
    return sums, sq


# (the `_` kernels below take their arrays from their callers: dmp.kernels._jit)
@njit(cache=True, nogil=True)
def _csc_column_stats(indptr, data, sums, sq):
    p = indptr.shape[0] - 1
    for j in range(p):
        s = 0.0
        q2 = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            v = data[k]
            s += v
            q2 += v * v
        sums[j] = s
        sq[j] = q2


@njit(cache=True, nogil=True)
def csc_check(indptr, indices, data, n_rows):
    """Validate CSC arrays in one pass, without temporaries.

    Returns 0 when valid, else a code: 1 indptr not starting at 0 or decreasing,
    2 row index out of range, 3 rows not strictly increasing within a column,
    4 non-finite value.
    """
    if indptr.shape[0] == 0 or indptr[0] != 0:
        return 1
    # indptr first: the scan below indexes indices/data through it
    for j in range(indptr.shape[0] - 1):
        if indptr[j + 1] < indptr[j]:
            return 1
    if indptr[indptr.shape[0] - 1] > indices.shape[0] or indices.shape[0] != data.shape[0]:
        return 1
    for j in range(indptr.shape[0] - 1):
        a, b = indptr[j], indptr[j + 1]
        prev = -1
        for q in range(a, b):
            i = indices[q]
            if i < 0 or i >= n_rows:
                return 2
            if i <= prev:
                return 3
            prev = i
            v = data[q]
            if not np.isfinite(v):
                return 4
    return 0
