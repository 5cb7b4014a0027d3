"""Tests for dmp.io.synthetic."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Lasso

from dmp.io import lasso_alpha_max, make_correlated_lasso, make_sparse_lasso


def test_make_sparse_lasso_shape_nnz_determinism():
    X, y, beta = make_sparse_lasso(n=100, p=1000, seed=0)
    assert isinstance(X, sp.csc_matrix) and X.shape == (100, 1000)
    assert y.shape == (100,) and beta.shape == (1000,)
    # independent count: distinct positions among the round(density*n*p) draws
    rng = np.random.default_rng(0)
    rows, cols = rng.integers(0, 100, 100), rng.integers(0, 1000, 100)
    assert X.nnz == len(set(zip(rows.tolist(), cols.tolist())))
    assert X.has_sorted_indices
    assert np.count_nonzero(beta) == 10
    X2, y2, beta2 = make_sparse_lasso(n=100, p=1000, seed=0)
    assert (X != X2).nnz == 0
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(beta, beta2)
    X3, _, _ = make_sparse_lasso(n=100, p=1000, seed=1)
    assert (X != X3).nnz > 0
    # noise level: residual std about noise_rel * std(X beta)
    X, y, beta = make_sparse_lasso(n=500, p=2000, density=0.01, seed=0)
    Xb = X @ beta
    ratio = np.std(y - Xb) / np.std(Xb)
    assert 0.05 < ratio < 0.2


def _cosines(X, group_size, n_cols):
    D = X[:, :n_cols].toarray()
    norms = np.linalg.norm(D, axis=0)
    keep = norms > 0
    C = (D.T @ D) / np.outer(np.where(keep, norms, 1), np.where(keep, norms, 1))
    g = np.arange(n_cols) // group_size
    valid = keep[:, None] & keep[None, :]
    same = (g[:, None] == g[None, :]) & ~np.eye(n_cols, dtype=bool) & valid
    diff = (g[:, None] != g[None, :]) & valid
    return C[same].mean(), np.abs(C[diff]).mean()


@pytest.mark.parametrize("group_corr", [0.8, 0.5])
def test_make_correlated_lasso_correlation(group_corr):
    X, y, beta = make_correlated_lasso(n=1000, p=600, density=0.03, group_size=10,
                                       group_corr=group_corr, seed=3)
    assert isinstance(X, sp.csc_matrix) and X.shape == (1000, 600)
    within, across = _cosines(X, 10, 600)
    assert abs(within - group_corr) < 0.15
    assert across < 0.1
    assert np.count_nonzero(beta) == 6 and y.shape == (1000,)


def test_make_correlated_lasso_defaults_and_determinism():
    X, y, beta = make_correlated_lasso()
    assert X.shape == (2000, 20000)
    within, across = _cosines(X, 10, 400)
    assert abs(within - 0.8) < 0.15 and across < 0.1
    X2, y2, _ = make_correlated_lasso()
    assert (X != X2).nnz == 0
    np.testing.assert_array_equal(y, y2)


@pytest.mark.parametrize("kw, name", [({"n": 0}, "n"), ({"density": 0.0}, "density"),
                                      ({"group_corr": 1.5}, "group_corr"),
                                      ({"group_size": 2.5}, "group_size"),
                                      ({"noise_rel": -1}, "noise_rel")])
def test_make_correlated_lasso_validation(kw, name):
    with pytest.raises(ValueError, match=name):
        make_correlated_lasso(**kw)


@pytest.mark.parametrize("fit_intercept", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
def test_lasso_alpha_max_against_sklearn(fit_intercept, sparse):
    X, y, _ = make_sparse_lasso(n=60, p=80, density=0.1, frac_nz=0.1, seed=4)
    y = y + 3.0
    Xin = X if sparse else X.toarray()
    a = lasso_alpha_max(Xin, y, fit_intercept=fit_intercept)
    above = Lasso(alpha=a * 1.001, fit_intercept=fit_intercept, tol=1e-10).fit(Xin, y)
    below = Lasso(alpha=a * 0.99, fit_intercept=fit_intercept, tol=1e-10).fit(Xin, y)
    assert np.count_nonzero(above.coef_) == 0
    assert np.count_nonzero(below.coef_) > 0
