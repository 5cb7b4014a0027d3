"""Generic sparse-matrix kernels (no model logic)."""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def csc_column_stats(indptr, data):
    """Column sums and squared norms of a CSC matrix, in one pass and no temporaries."""
    p = indptr.shape[0] - 1
    sums = np.zeros(p)
    sq = np.zeros(p)
    for j in range(p):
        s = 0.0
        q2 = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            v = data[k]
            s += v
            q2 += v * v
        sums[j] = s
        sq[j] = q2
    return sums, sq
