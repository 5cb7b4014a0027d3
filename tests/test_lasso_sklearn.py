"""dmp.linear_model.Lasso against scikit-learn: solutions, API conventions, estimator checks."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Lasso as SkLasso
from sklearn.utils.estimator_checks import parametrize_with_checks

from dmp.io import lasso_alpha_max
from dmp.linear_model import Lasso

N, P_FEAT = 120, 400


def _make(kind, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "sparse":
        X = sp.random(N, P_FEAT, density=0.05, random_state=rng, format="csr",
                      data_rvs=rng.standard_normal)
    else:
        X = rng.standard_normal((N, P_FEAT))
    beta = np.zeros(P_FEAT)
    beta[rng.choice(P_FEAT, 12, replace=False)] = 2.0 * rng.standard_normal(12)
    y = np.asarray(X @ beta).ravel() + 0.1 * rng.standard_normal(N) + 1.5
    return X, y


@pytest.fixture(scope="module")
def problems():
    return {kind: _make(kind) for kind in ("dense", "sparse")}


_SK_CACHE = {}


def _sk_fit(problems, kind, fit_intercept):
    key = (kind, fit_intercept)
    if key not in _SK_CACHE:
        X, y = problems[kind]
        alpha = 0.05 * lasso_alpha_max(X, y, fit_intercept=fit_intercept)
        sk = SkLasso(alpha=alpha, fit_intercept=fit_intercept, tol=1e-12,
                     max_iter=100000).fit(X, y)
        _SK_CACHE[key] = (alpha, sk)
    return _SK_CACHE[key]


def _objective(X, y, coef, b, alpha):
    res = y - np.asarray(X @ coef).ravel() - b
    return 0.5 * np.mean(res ** 2) + alpha * np.abs(coef).sum()


@pytest.mark.parametrize("n_workers", [1, 3])
@pytest.mark.parametrize("schedule", ["priority", "round_robin", "random"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_matches_sklearn(problems, kind, fit_intercept, schedule, n_workers):
    X, y = problems[kind]
    alpha, sk = _sk_fit(problems, kind, fit_intercept)
    m = Lasso(alpha=alpha, fit_intercept=fit_intercept, schedule=schedule,
              n_workers=n_workers, backend="local", tol=1e-10, random_state=0,
              max_iter=100000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        m.fit(X, y)
    o_dmp = _objective(X, y, m.coef_, m.intercept_, alpha)
    o_sk = _objective(X, y, sk.coef_, sk.intercept_, alpha)
    assert abs(o_dmp - o_sk) / o_sk <= 1e-6
    assert np.count_nonzero(sk.coef_) > 3
    np.testing.assert_array_equal(m.coef_ != 0, sk.coef_ != 0)
    np.testing.assert_allclose(m.coef_, sk.coef_, rtol=0, atol=1e-5)
    assert abs(m.intercept_ - sk.intercept_) <= 1e-5 * max(1.0, abs(sk.intercept_))
    if not fit_intercept:
        assert m.intercept_ == 0.0
    assert m.coef_.shape == (P_FEAT,)
    assert m.n_features_in_ == P_FEAT
    # reported objective and gap are those of the returned model
    np.testing.assert_allclose(m.objective_, o_dmp, rtol=1e-9)
    assert 0.0 <= m.dual_gap_ <= 1e-10 * np.sum((y - y.mean() * fit_intercept) ** 2) / N


def test_alpha_above_alpha_max_gives_zero(problems):
    X, y = problems["sparse"]
    a = 1.01 * lasso_alpha_max(X, y, fit_intercept=True)
    m = Lasso(alpha=a, backend="local", n_workers=3, random_state=0).fit(X, y)
    assert np.all(m.coef_ == 0)
    np.testing.assert_allclose(m.intercept_, y.mean(), rtol=1e-12)


# every scikit-learn estimator check passes; none is expected to fail
@parametrize_with_checks([Lasso(backend="local")])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_get_set_params_roundtrip():
    m = Lasso(alpha=0.3, schedule="random", rho=None, n_workers=2, backend="local",
              random_state=4, tol=1e-6)
    params = m.get_params()
    assert params["alpha"] == 0.3 and params["schedule"] == "random"
    assert params["rho"] is None and params["n_workers"] == 2
    m2 = Lasso().set_params(**params)
    assert m2.get_params() == params
    c = clone(m)
    assert c.get_params() == params and c is not m
    assert m.set_params(alpha=0.7, fit_intercept=False) is m
    assert m.get_params()["alpha"] == 0.7 and m.get_params()["fit_intercept"] is False
    with pytest.raises(ValueError):
        m.set_params(not_a_param=1)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_fit_returns_self_and_predict(problems, kind):
    X, y = problems[kind]
    m = Lasso(alpha=0.05, backend="local", n_workers=3, random_state=0, tol=1e-8)
    assert m.fit(X, y) is m
    pred = m.predict(X)
    Xd = X.toarray() if sp.issparse(X) else X
    ref = Xd @ m.coef_ + m.intercept_
    np.testing.assert_allclose(pred, ref, rtol=1e-12, atol=1e-12)
    assert pred.shape == (N,)
    assert m.intercept_ != 0.0
    # predict on other sparse formats
    if kind == "sparse":
        np.testing.assert_allclose(m.predict(sp.csc_matrix(X)), ref, rtol=1e-12, atol=1e-12)
    # score is R^2 of predict
    ss_res = np.sum((y - ref) ** 2)
    ss_tot = np.sum((y - y.mean()) ** 2)
    np.testing.assert_allclose(m.score(X, y), 1 - ss_res / ss_tot, rtol=1e-12)


@pytest.mark.parametrize("schedule", ["priority", "round_robin"])
def test_history_consistent(problems, schedule):
    X, y = problems["sparse"]
    m = Lasso(alpha=0.05, schedule=schedule, backend="local", n_workers=3,
              random_state=0, tol=1e-8).fit(X, y)
    h = m.history_
    for key in ("round", "time", "round_s", "push_s", "bytes_schedule", "bytes_push",
                "bytes_pull", "objective", "dual_gap", "updates", "kind", "n_candidates",
                "n_kept", "step"):
        assert key in h, key
        assert len(h[key]) == m.n_iter_, key
    assert len(h["objective"]) == m.n_iter_
    np.testing.assert_array_equal(h["round"], np.arange(m.n_iter_))
    assert h["push_s"].shape == (m.n_iter_, 3)
    assert np.all(h["push_s"] >= 0) and np.all(h["round_s"] >= 0)
    assert np.all(np.diff(h["time"]) >= 0)
    for key in ("bytes_schedule", "bytes_push", "bytes_pull"):
        assert np.issubdtype(h[key].dtype, np.integer)
        assert np.all(h[key] >= 0)
    assert h["bytes_push"].max() > 0 and h["bytes_pull"].max() > 0
    kinds = set(h["kind"].tolist())
    assert kinds <= {"cd", "gap", "refresh"} and {"cd", "gap"} <= kinds
    assert h["kind"][0] == "gap"
    cd = h["kind"] == "cd"
    assert np.all(h["n_kept"][cd] <= h["n_candidates"][cd])
    assert np.all(h["n_kept"][~cd] == 0)
    # updates is the running count of kept variables
    np.testing.assert_array_equal(h["updates"], np.cumsum(h["n_kept"]))
    assert h["updates"][-1] == m.n_updates_
    assert np.all((h["step"][cd] > 0) & (h["step"][cd] <= 1))
    obj = h["objective"].astype(float)
    assert np.all(np.diff(obj) <= 1e-10 * obj[:-1])
    assert obj[-1] == m.objective_
    np.testing.assert_allclose(
        m.objective_, _objective(X, y, m.coef_, m.intercept_, 0.05), rtol=1e-9)
    gap_rounds = h["kind"] == "gap"
    assert h["dual_gap"][-1] == m.dual_gap_
    assert np.isfinite(h["dual_gap"][gap_rounds]).all()
    assert m.dual_gap_ <= 1e-8 * np.sum((y - y.mean()) ** 2) / N


@pytest.mark.parametrize("one_sweep_above", [None, 1])
def test_auto_inner_sweeps_by_partition_size(problems, dask_settings, one_sweep_above):
    """``inner_sweeps="auto"``: 50 on one partition; on several, 3 for small partitions and 1
    above ``dmp.lasso.one-sweep-values-per-partition`` stored values; both reach
    scikit-learn's optimum."""
    if one_sweep_above is not None:
        dask_settings({"dmp.lasso.one-sweep-values-per-partition": one_sweep_above})
    X, y = problems["sparse"]
    alpha, sk = _sk_fit(problems, "sparse", True)
    o_sk = _objective(X, y, sk.coef_, sk.intercept_, alpha)
    for n_workers, expected in [(1, 50), (2, 3 if one_sweep_above is None else 1)]:
        m = Lasso(alpha=alpha, n_workers=n_workers, backend="local", tol=1e-10,
                  random_state=0, max_iter=100000).fit(X, y)
        assert m.inner_sweeps_ == expected
        o_dmp = _objective(X, y, m.coef_, m.intercept_, alpha)
        assert abs(o_dmp - o_sk) / o_sk <= 1e-6
    rr = Lasso(alpha=alpha, schedule="round_robin", n_workers=2, backend="local",
               tol=1e-6, random_state=0, max_iter=100000).fit(X, y)
    assert rr.inner_sweeps_ == 1
