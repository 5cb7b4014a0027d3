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
    # four columns at a time, over the entries they all have, then each one's rest: every
    # column is still summed in its own order (the same sums, bit for bit), with eight
    # chains of additions in flight instead of two
    p = indptr.shape[0] - 1
    j = 0
    while j + 4 <= p:
        a0 = indptr[j]
        a1 = indptr[j + 1]
        a2 = indptr[j + 2]
        a3 = indptr[j + 3]
        m = min(min(a1 - a0, indptr[j + 2] - a1), min(a3 - a2, indptr[j + 4] - a3))
        s0 = s1 = s2 = s3 = 0.0
        q0 = q1 = q2 = q3 = 0.0
        for k in range(m):
            v0 = data[a0 + k]
            v1 = data[a1 + k]
            v2 = data[a2 + k]
            v3 = data[a3 + k]
            s0 += v0
            s1 += v1
            s2 += v2
            s3 += v3
            q0 += v0 * v0
            q1 += v1 * v1
            q2 += v2 * v2
            q3 += v3 * v3
        for k in range(a0 + m, a1):
            s0 += data[k]
            q0 += data[k] * data[k]
        for k in range(a1 + m, a2):
            s1 += data[k]
            q1 += data[k] * data[k]
        for k in range(a2 + m, a3):
            s2 += data[k]
            q2 += data[k] * data[k]
        for k in range(a3 + m, indptr[j + 4]):
            s3 += data[k]
            q3 += data[k] * data[k]
        sums[j] = s0
        sums[j + 1] = s1
        sums[j + 2] = s2
        sums[j + 3] = s3
        sq[j] = q0
        sq[j + 1] = q1
        sq[j + 2] = q2
        sq[j + 3] = q3
        j += 4
    for jj in range(j, p):
        s = 0.0
        q = 0.0
        for k in range(indptr[jj], indptr[jj + 1]):
            v = data[k]
            s += v
            q += v * v
        sums[jj] = s
        sq[jj] = q


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
