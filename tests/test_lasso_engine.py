"""Tests of the STRADS Lasso Program driven through the engine (local backend)."""

import numpy as np
import pytest
import scipy.sparse as sp

from dmp.engine import Broadcast, LocalBackend, run
from dmp.io import lasso_alpha_max, make_correlated_lasso
from dmp.linear_model._lasso_program import CDPlan, GapPlan, LassoProgram, RefreshPlan
from dmp.io.sparse import InMemorySparseDataset

SCHEDULES = ["priority", "round_robin", "random"]


def _program(X, y, P, *, alpha_frac=0.1, fit_intercept=True, schedule="priority",
             schedule_size=24, check_every=60, refresh_every=2, rho=0.1, seed=0, tol=0.0):
    ds = InMemorySparseDataset(X, y, n_shards=P)
    alpha = alpha_frac * lasso_alpha_max(X, y, fit_intercept=fit_intercept)
    prog = LassoProgram(ds, alpha=alpha, fit_intercept=fit_intercept, schedule=schedule,
                        schedule_size=schedule_size, eta=1e-3, rho=rho, oversample=2.0,
                        tol=tol, check_every=check_every, refresh_every=refresh_every,
                        seed=seed)
    return prog


def _start(prog, P):
    backend = LocalBackend(P)
    backend.start(prog, prog.partition_specs(P))
    prog.start(P)
    return backend


def _round(prog, backend, t):
    """One bulk-synchronous round by hand (as the runner does with staleness 0)."""
    plans = prog.schedule(t)
    partials = [w.step(t, None, plans[k])["partial"] for k, w in enumerate(backend.workers)]
    update = prog.pull(t, partials)
    assert update is None or isinstance(update, Broadcast)
    backend.apply_all(update)
    return plans, partials, update


def _gather_w(backend):
    return np.concatenate([w.collect()["w"] for w in backend.workers])


def _centred(X, y, fit_intercept):
    X = X.toarray() if sp.issparse(X) else np.asarray(X)
    if fit_intercept:
        return X - X.mean(axis=0), y - y.mean()
    return X, y.copy()


@pytest.fixture(scope="module")
def data():
    X, y, _ = make_correlated_lasso(n=120, p=240, density=0.06, group_size=6,
                                    group_corr=0.7, seed=3)
    # a few columns with large means so that centring matters
    X = X.tolil()
    rng = np.random.default_rng(0)
    for j in (5, 100, 230):
        rows = rng.choice(120, 40, replace=False)
        X[rows, j] = rng.uniform(1.0, 2.0, 40)
    X = X.tocsc()
    y = y + 0.5 * np.asarray(X[:, 100].todense()).ravel() + 3.0
    return X, y


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_residual_replicas_stay_exact(data, schedule, fit_intercept):
    X, y = data
    P = 3
    prog = _program(X, y, P, fit_intercept=fit_intercept, schedule=schedule)
    backend = _start(prog, P)
    Xc, ytil = _centred(X, y, fit_intercept)
    scale = np.linalg.norm(ytil)
    kinds = []
    steps = []
    for t in range(30):
        plans, partials, _ = _round(prog, backend, t)
        kinds.append(type(plans[0]))
        if isinstance(plans[0], CDPlan):
            steps.append(prog.driver["last"]["step"])
        w = _gather_w(backend)
        r_true = ytil - Xc @ w
        for k, wk in enumerate(backend.workers):
            err = np.linalg.norm(wk.state["r"] - r_true)
            assert err <= 1e-10 * scale, (t, k, err)
            assert wk.state["pending"] == {}
        assert np.linalg.norm(prog.driver["r"] - r_true) <= 1e-10 * scale
        obj = 0.5 * r_true @ r_true / len(y) + prog.alpha * np.abs(w).sum()
        np.testing.assert_allclose(prog.driver["objective"], obj, rtol=1e-10)
    assert {CDPlan, GapPlan, RefreshPlan} <= set(kinds)
    assert np.count_nonzero(_gather_w(backend)) > 0
    assert all(0.0 <= s <= 1.0 for s in steps)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_no_variable_scheduled_twice(data, schedule):
    X, y = data
    P = 3
    prog = _program(X, y, P, schedule=schedule, schedule_size=60)
    backend = _start(prog, P)
    starts = prog.driver["starts"]
    n_cd = 0
    for t in range(25):
        plans, partials, _ = _round(prog, backend, t)
        if not isinstance(plans[0], CDPlan):
            continue
        n_cd += 1
        g = np.concatenate([pl.idx + starts[k] for k, pl in enumerate(plans)])
        assert len(g) > 0
        assert len(np.unique(g)) == len(g)
        for k, pl in enumerate(plans):  # local indices inside the partition's block
            assert np.all((pl.idx >= 0) & (pl.idx < starts[k + 1] - starts[k]))
        kept = np.concatenate([pt.kept + starts[k] for k, pt in enumerate(partials)])
        assert len(np.unique(kept)) == len(kept)
        assert set(kept.tolist()) <= set(g.tolist())
        if schedule != "priority":
            assert len(g) == 60
    assert n_cd >= 10


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("rho", [0.1, 0.4])
def test_priority_kept_pairs_pass_filter(data, fit_intercept, rho):
    X, y = data
    P = 3
    prog = _program(X, y, P, fit_intercept=fit_intercept, schedule="priority",
                    schedule_size=60, rho=rho)
    backend = _start(prog, P)
    Xc, _ = _centred(X, y, fit_intercept)
    sq = (Xc ** 2).sum(axis=0)
    starts = prog.driver["starts"]
    n_pairs = 0
    n_dropped = 0
    for t in range(25):
        plans, partials, _ = _round(prog, backend, t)
        if not isinstance(plans[0], CDPlan):
            continue
        for k, pt in enumerate(partials):
            g = pt.kept + starts[k]
            assert len(g) <= plans[k].keep
            # kept are distinct candidates of this partition (sweep order is free)
            cand = plans[k].idx
            assert len(np.unique(pt.kept)) == len(pt.kept)
            assert np.isin(pt.kept, cand).all()
            n_dropped += len(cand) - len(g)
            C = Xc[:, g]
            cos = np.abs(C.T @ C) / np.sqrt(np.outer(sq[g], sq[g]))
            np.fill_diagonal(cos, 0.0)
            assert np.all(cos < rho)
            n_pairs += len(g) * (len(g) - 1) // 2
    assert n_pairs > 50
    assert n_dropped > 0


def _numpy_cyclic_cd(Xc, ytil, alpha, n_epochs):
    n, p = Xc.shape
    sq = (Xc ** 2).sum(axis=0)
    w = np.zeros(p)
    r = ytil.copy()
    out = []
    for _ in range(n_epochs):
        for j in range(p):
            if sq[j] <= 0:
                continue
            z = Xc[:, j] @ r + sq[j] * w[j]
            new = np.sign(z) * max(abs(z) - n * alpha, 0.0) / sq[j]
            r -= (new - w[j]) * Xc[:, j]
            w[j] = new
        out.append(w.copy())
    return out


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_single_worker_round_robin_is_cyclic_cd(fit_intercept):
    rng = np.random.default_rng(11)
    n, p = 50, 30
    X = sp.random(n, p, density=0.3, random_state=rng, format="csc",
                  data_rvs=rng.standard_normal)
    X = X.tolil()
    X[:, 4] = 0.0
    X[rng.choice(n, 20, replace=False), 9] = 1.5
    X = X.tocsc()
    y = np.asarray(X[:, :5] @ rng.standard_normal(5)).ravel() + rng.standard_normal(n) + 1.0
    prog = _program(X, y, 1, alpha_frac=0.05, fit_intercept=fit_intercept,
                    schedule="round_robin", schedule_size=1, check_every=7,
                    refresh_every=3)
    backend = _start(prog, 1)
    Xc, ytil = _centred(X, y, fit_intercept)
    ref = _numpy_cyclic_cd(Xc, ytil, prog.alpha, 3)
    n_cd = 0
    epoch = 0
    kinds = set()
    t = 0
    while epoch < 3:
        plans, partials, _ = _round(prog, backend, t)
        t += 1
        kinds.add(type(plans[0]))
        if not isinstance(plans[0], CDPlan):
            continue
        assert list(plans[0].idx) == [n_cd % p]
        assert prog.driver["last"]["step"] == 1.0
        n_cd += 1
        if n_cd % p == 0:
            np.testing.assert_allclose(_gather_w(backend), ref[epoch], rtol=1e-10,
                                       atol=1e-10)
            epoch += 1
    assert kinds == {CDPlan, GapPlan, RefreshPlan}
    assert np.count_nonzero(ref[-1]) > 2
    assert not np.allclose(ref[0], ref[-1])


@pytest.mark.parametrize("schedule", ["priority", "round_robin"])
def test_objective_non_increasing(schedule):
    X, y, _ = make_correlated_lasso(n=200, p=600, seed=0)
    P = 3
    prog = _program(X, y, P, alpha_frac=0.05, fit_intercept=True, schedule=schedule,
                    schedule_size=75, check_every=600, refresh_every=3, rho=0.1)
    res = run(prog, LocalBackend(P), max_iter=150)
    hist = res.history
    cd = [h for h in hist if h["kind"] == "cd"]
    assert len(cd) >= 100
    obj = np.array([h["objective"] for h in cd])
    assert np.all(np.diff(obj) <= 1e-12 * obj[:-1])
    assert obj[-1] < 0.9 * obj[0]
    # every round (gap / refresh included) keeps the objective up to rounding
    allobj = np.array([h["objective"] for h in hist])
    assert np.all(np.diff(allobj) <= 1e-10 * allobj[:-1])
    # the recorded objective is the true one of the final coefficients
    coef = np.concatenate([a["w"] for a in res.partition_arrays])
    Xd = X.toarray()
    b = prog.driver["intercept"]
    # the intercept from the partitions' shares of col_sums . coef: the closed form
    np.testing.assert_allclose(b, y.mean() - Xd.mean(axis=0) @ coef, rtol=1e-12, atol=1e-12)
    true = 0.5 * np.mean((y - Xd @ coef - b) ** 2) + prog.alpha * np.abs(coef).sum()
    np.testing.assert_allclose(hist[-1]["objective"], true, rtol=1e-10)
    steps = np.array([h["step"] for h in cd])
    assert np.all((steps >= 0) & (steps <= 1))


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_damped_step_with_conflicting_partitions(schedule, fit_intercept):
    """Three partitions holding copies of the same columns: the summed (block Jacobi)
    update overshoots, the pull must take t < 1, and the objective still decreases while
    the replicas stay exact."""
    rng = np.random.default_rng(5)
    n, q = 80, 20
    A = sp.random(n, q, density=0.3, random_state=rng, format="csc",
                  data_rvs=rng.standard_normal)
    X = sp.hstack([A, A * 1.01, A * 0.99]).tocsc()
    y = np.asarray(A[:, :4] @ np.array([2.0, -1.0, 1.5, 1.0])).ravel() \
        + 0.1 * rng.standard_normal(n) + 0.7
    P = 3
    prog = _program(X, y, P, alpha_frac=0.05, fit_intercept=fit_intercept,
                    schedule=schedule, schedule_size=30, check_every=30, refresh_every=2,
                    rho=0.1)
    backend = _start(prog, P)
    assert list(prog.driver["starts"]) == [0, q, 2 * q, 3 * q]
    Xc, ytil = _centred(X, y, fit_intercept)
    scale = np.linalg.norm(ytil)
    objs, steps = [], []
    for t in range(40):
        plans, _, _ = _round(prog, backend, t)
        w = _gather_w(backend)
        r_true = ytil - Xc @ w
        for wk in backend.workers:
            assert np.linalg.norm(wk.state["r"] - r_true) <= 1e-10 * scale
        obj = 0.5 * r_true @ r_true / n + prog.alpha * np.abs(w).sum()
        np.testing.assert_allclose(prog.driver["objective"], obj, rtol=1e-10)
        if isinstance(plans[0], CDPlan):
            steps.append(prog.driver["last"]["step"])
        objs.append(obj)
    objs = np.array(objs)
    assert np.all(np.diff(objs) <= 1e-12 * objs[:-1])
    assert min(steps) < 0.9
    assert objs[-1] < 0.5 * objs[0]


@pytest.mark.parametrize("P", [1, 2])
def test_one_sweep_rounds_check_the_gap_once_the_working_set_is_solved(P):
    """With one sweep per round the rounds together are the working-set solve: the driver
    must notice it is solved (largest step at most inner_tol times the largest coefficient)
    and check the gap, rather than sweep the same set until an epoch of updates is spent."""
    X, y, _ = make_correlated_lasso(n=150, p=900, density=0.05, seed=2)
    ds = InMemorySparseDataset(X, y, n_shards=P)
    alpha = 0.05 * lasso_alpha_max(X, y, fit_intercept=False)
    prog = LassoProgram(ds, alpha=alpha, fit_intercept=False, schedule="priority",
                        schedule_size=900, eta=1e-3, rho=None, oversample=2.0, tol=1e-8,
                        check_every=10**9, refresh_every=10, seed=0, inner_sweeps=1)
    # (340-590 rounds over seeds 0-3 at P = 1 and 2: the budget has room for any of them)
    res = run(prog, LocalBackend(P), max_iter=1000)
    assert res.converged
    d = prog.driver
    # gap checks: gap rounds on one partition, in the coordinate-descent rounds on two
    # (`CDPlan.gap_first`)
    assert d["n_checks"] >= 3
    # and the result is the Lasso optimum (coordinate-wise KKT conditions)
    coef = np.concatenate([a["w"] for a in res.partition_arrays])
    Xd = X.toarray()
    grad = Xd.T @ (y - Xd @ coef) / len(y)
    assert np.all(np.abs(grad) <= alpha * (1 + 1e-3) + 1e-9)
    on = coef != 0
    np.testing.assert_allclose(grad[on], alpha * np.sign(coef[on]), rtol=1e-3, atol=1e-7)
    assert d["gap"] <= 1e-8 * d["ynorm2"] / len(y)


def test_a_converged_gap_first_round_is_undone_bit_for_bit():
    """On several partitions every gap check after the first rides on a coordinate-descent
    round, computed before its sweeps (`CDPlan.gap_first`); when it shows convergence the
    driver takes the sweeps back (`CDUpdate.undo`): every replica's residual and
    coefficients are again those before the round, bit for bit, and the fit ends there."""
    X, y, _ = make_correlated_lasso(n=120, p=60, density=0.3, seed=1)
    prog = _program(X, y, 3, tol=1e-3, rho=None)
    backend = _start(prog, 3)
    t, n_first = 0, 0
    while not prog.converged():
        before = [(w.state["w"].copy(), w.state["r"].copy()) for w in backend.workers]
        plans, partials, update = _round(prog, backend, t)
        assert isinstance(plans[0], GapPlan) == (t == 0)
        if isinstance(plans[0], CDPlan) and plans[0].gap_first:
            n_first += 1
            assert all(pt.gap_before is not None for pt in partials)
        t += 1
        assert t < 500
    assert n_first >= 2 and plans[0].gap_first and update.value.undo
    # the sweeps of the last round moved coefficients, and were taken back
    assert any(np.any(pt.delta != 0) for pt in partials)
    for (w0, r0), worker in zip(before, backend.workers):
        np.testing.assert_array_equal(worker.state["w"], w0)
        np.testing.assert_array_equal(worker.state["r"], r0)
        assert not worker.state["pending"]


@pytest.mark.parametrize("staleness", [0, 2])
def test_a_fit_ending_on_an_undone_round_returns_the_certified_coefficients(staleness):
    """The fit's coefficients are those the last gap check certified, with rounds in flight
    too (a gap-first round starts drained and the round after it waits for its pull): the
    objective recomputed from ``coef_`` is the reported one, and the gap is within tol."""
    from dmp.linear_model import Lasso

    X, y, _ = make_correlated_lasso(n=200, p=300, density=0.1, seed=3)
    alpha = 0.05 * lasso_alpha_max(X, y, fit_intercept=True)
    # a loose tol: the sweeps of the last round still move the coefficients
    est = Lasso(alpha=alpha, tol=1e-3, staleness=staleness, backend="local", n_workers=3,
                random_state=0).fit(X, y)
    assert est.history_["kind"][-1] == "gap"   # the check that converged undid its round
    r = y - X @ est.coef_ - est.intercept_
    assert 0.5 * r @ r / len(y) + alpha * np.abs(est.coef_).sum() == pytest.approx(
        est.objective_, rel=1e-13)
    yc = y - y.mean()
    assert est.dual_gap_ <= 1e-3 * (yc @ yc) / len(y)
