import numpy as np
import pytest
import scipy.sparse as sp

from dmp.kernels.sparse import csc_check, csc_column_stats


def _csc(seed=0):
    X = sp.random(40, 30, density=0.2, format="csc", random_state=seed)
    X.sort_indices()
    return X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data.copy(), X


def test_column_stats_match_numpy():
    indptr, _, data, X = _csc()
    sums, sq = csc_column_stats(indptr, data)
    np.testing.assert_allclose(sums, X.toarray().sum(0), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(sq, (X.toarray() ** 2).sum(0), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("seed", range(4))
def test_column_stats_sum_each_column_in_its_own_order(seed):
    """Columns of unequal lengths, taken four at a time: each sum is still the sequential
    one, bit for bit (stored and in-memory datasets must agree to the last bit)."""
    rng = np.random.default_rng(seed)
    for _ in range(30):
        n, p = rng.integers(1, 40, 2)
        X = sp.random(n, p, density=rng.random(), format="csc", random_state=rng,
                      data_rvs=rng.standard_normal)
        indptr = X.indptr.astype(np.int64)
        sums, sq = csc_column_stats(indptr, X.data)
        for j in range(p):
            s = q = 0.0
            for v in X.data[indptr[j]:indptr[j + 1]].tolist():
                s += v
                q += v * v
            assert sums[j] == s and sq[j] == q


def test_csc_check_accepts_valid():
    indptr, indices, data, X = _csc()
    assert csc_check(indptr, indices, data, X.shape[0]) == 0


@pytest.mark.parametrize("corrupt, code", [
    (lambda p, i, d: p.__setitem__(0, 1), 1),
    (lambda p, i, d: p.__setitem__(3, 10**6), 1),         # would index past the arrays
    (lambda p, i, d: i.__setitem__(0, 40), 2),
    (lambda p, i, d: i.__setitem__(0, -1), 2),
    (lambda p, i, d: d.__setitem__(5, np.nan), 4),
    (lambda p, i, d: d.__setitem__(5, -np.inf), 4),
])
def test_csc_check_codes(corrupt, code):
    indptr, indices, data, X = _csc(1)
    corrupt(indptr, indices, data)
    assert csc_check(indptr, indices, data, X.shape[0]) == code


def test_csc_check_unsorted_or_duplicate_rows():
    indptr, indices, data, X = _csc(2)
    j = int(np.argmax(np.diff(indptr) >= 2))
    a = indptr[j]
    dup = indices.copy()
    dup[a + 1] = dup[a]
    assert csc_check(indptr, dup, data, X.shape[0]) == 3
    swapped = indices.copy()
    swapped[a], swapped[a + 1] = swapped[a + 1], swapped[a]
    assert csc_check(indptr, swapped, data, X.shape[0]) == 3
