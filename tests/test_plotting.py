"""The figures of `dmp.plotting`, inspected through matplotlib's objects (lines, labels,
legends, scales), on small hand-made histories whose expected values are computed here."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dmp.plotting import (plot_convergence, plot_loglik, plot_rmse, plot_speedup,  # noqa: E402
                          plot_suboptimality, plot_training)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _mf_history(n_iter=6, per_iter=3, rate=0.5):
    """An MF-like history: objective decreasing geometrically towards 100, rounds grouped in
    iterations (iteration 0 is the starting point), still decreasing at the last round."""
    it = np.r_[0, np.repeat(np.arange(1, n_iter + 1), per_iter)]
    f = 100.0 + 50.0 * rate ** np.arange(len(it))
    return {"round": np.arange(len(it)), "time": 0.1 * np.arange(1, len(it) + 1),
            "iteration": it, "objective": f,
            "push_s": np.full((len(it), 2), 0.01), "idle_s": np.full((len(it), 2), 0.002)}


def _lasso_history(gaps_at=(0, 3, 6, 9), n=10, p_star=1.0):
    """A Lasso-like history: the gap is computed at some rounds and repeated in between
    (as `history_` does), ``kind`` marks the gap rounds."""
    f = p_star + 0.5 * 0.3 ** np.arange(n)
    kind = np.array(["cd"] * n, dtype=object)
    gap = np.full(n, np.inf)
    last = np.inf
    for r in range(n):
        if r in gaps_at:
            kind[r] = "gap"
            last = 2.0 * (f[r] - p_star) + 1e-9   # a valid gap: >= P - P*
        gap[r] = last
    return {"round": np.arange(n), "time": 0.2 * np.arange(1, n + 1), "objective": f,
            "dual_gap": gap, "kind": kind}


def test_convergence_without_a_gap_leaves_out_the_point_compared_with_itself():
    """mf_small stops at max_iter while still decreasing: no point may draw as a
    suboptimality of ~1e-16 (today the best run's last point plunges to 1e-20)."""
    h = _mf_history()
    fig = plot_convergence({"ccd++": h})
    ax = fig.axes[0]
    (line,) = ax.lines
    f = h["objective"]
    best = f.min()
    expected = (f[:-1] - best) / best
    np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-12)
    np.testing.assert_allclose(line.get_xdata(), h["time"][:-1])
    assert min(line.get_ydata()) > 1e-8
    assert "best seen" in ax.get_title() and "omitted" in ax.get_title()


def test_convergence_with_a_gap_is_measured_from_the_best_dual_bound():
    """Lasso: the reference is max(P - gap) over every run's gap rounds, a certified lower
    bound, so the best run's last point is its gap, not zero."""
    a, b = _lasso_history(), _lasso_history(gaps_at=(0, 4, 8))
    fig = plot_convergence({"priority": a, "round_robin": b})
    ax = fig.axes[0]
    bounds = []
    for h in (a, b):
        at = h["kind"] == "gap"
        bounds.append(np.max(h["objective"][at] - h["dual_gap"][at]))
    d_best = max(bounds)
    assert d_best < 1.0   # below P* = 1: certified
    for line, h in zip(ax.lines, (a, b)):
        np.testing.assert_allclose(line.get_ydata(), (h["objective"] - d_best) / d_best,
                                   rtol=1e-12)
    assert min(min(line.get_ydata()) for line in ax.lines) > 1e-9
    assert "dual" in ax.get_title() and "certified" in ax.get_title()
    # the gap panel: one point per gap computation, not the repeated values in between
    gap_ax = fig.axes[1]
    for line, h in zip(gap_ax.lines, (a, b)):
        at = (h["kind"] == "gap") & np.isfinite(h["dual_gap"])
        np.testing.assert_allclose(line.get_xdata(), h["time"][at])
        np.testing.assert_allclose(line.get_ydata(), h["dual_gap"][at])


def test_convergence_without_a_gap_shows_no_raw_objective_on_a_log_axis():
    """The right panel without a gap: the relative decrease per iteration (what tol bounds),
    not the raw objective (a flat line on a log axis)."""
    h = _mf_history()
    fig = plot_convergence({"ccd++": h})
    (line,) = fig.axes[1].lines
    ends = np.r_[h["iteration"][1:] != h["iteration"][:-1], True]
    f = h["objective"][ends]
    np.testing.assert_allclose(line.get_ydata(), (f[:-1] - f[1:]) / f[1:], rtol=1e-12)
    assert "decrease" in fig.axes[1].get_title()


def test_time_axes_say_they_start_with_the_round_loop():
    h = _mf_history()
    h.update(train_rmse=np.linspace(1, 0.5, len(h["round"])),
             valid_rmse=np.linspace(1.1, 0.6, len(h["round"])))
    figs = [plot_convergence({"a": h}), plot_rmse({"a": h}), plot_training(h),
            plot_loglik({"a": {**h, "ll_per_token": -np.linspace(8, 7, len(h["round"])),
                               "sweep": h["iteration"]}})]
    for fig in figs:
        assert "round loop" in fig.axes[0].get_xlabel()


def test_whole_fit_wall_time_is_in_the_legend():
    h = _mf_history()
    fig = plot_convergence({"ccd++": h}, wall_time={"ccd++": 11.09})
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert texts == ["ccd++ (whole fit 11.09 s)"]


def test_rmse_test_line_is_labelled():
    h = _mf_history()
    h.update(train_rmse=np.linspace(1, 0.5, len(h["round"])),
             valid_rmse=np.linspace(1.1, 0.6, len(h["round"])))
    fig = plot_rmse({"ccd++": h}, test_rmse={"ccd++": 0.62})
    ax = fig.axes[1]
    dotted = [ln for ln in ax.lines if ln.get_linestyle() == ":"]
    assert len(dotted) == 1 and np.allclose(dotted[0].get_ydata(), 0.62)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert dotted[0].get_label() in texts and "test" in dotted[0].get_label()


def test_training_legend_fits_with_many_partitions_and_names_partitions():
    n, parts = 30, 10
    rng = np.random.default_rng(0)
    h = {"round": np.arange(n), "time": np.linspace(0.1, 3, n),
         "objective": 0.3 + 0.01 * 0.8 ** np.arange(n),
         "push_s": rng.uniform(0.01, 0.02, (n, parts)),
         "idle_s": rng.uniform(0.0, 0.01, (n, parts))}
    fig = plot_training(h, title="SparsifiedSGDClassifier blocks_per_worker=1")
    ax = fig.axes[2]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(texts) <= 4
    assert all("worker" not in t for t in texts) and any("partition" in t for t in texts)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), np.median(h["push_s"], axis=1))
    # a raw objective that moves by a few percent: linear axes, not a flat line on log
    assert fig.axes[0].get_yscale() == "linear" and fig.axes[1].get_yscale() == "linear"
    assert fig._suptitle.get_text() == "SparsifiedSGDClassifier blocks_per_worker=1"
    # few partitions: one line each, named partitions
    h2 = {**h, "push_s": h["push_s"][:, :2], "idle_s": h["idle_s"][:, :2]}
    texts = [t.get_text() for t in plot_training(h2).axes[2].get_legend().get_texts()]
    assert texts == ["push, partition 0", "idle, partition 0",
                     "push, partition 1", "idle, partition 1"]


def test_training_keeps_a_log_axis_for_a_metric_spanning_decades():
    n = 20
    h = {"round": np.arange(n), "time": np.linspace(0.1, 2, n),
         "dual_gap": 10.0 ** -np.arange(n), "objective": np.ones(n)}
    fig = plot_training(h, metric="dual_gap")
    assert fig.axes[0].get_yscale() == "log"


def test_lda_convergence_is_not_the_training_figure():
    """Linear axis for the (negative) log-likelihood and the sweep-to-sweep change on a log
    axis; two panels, not the training figure's four."""
    sweeps = np.repeat(np.arange(1, 11), 2)
    ll = -3.0 - 2.0 * 0.5 ** sweeps.astype(float)
    ll[:2] = np.nan   # no likelihood before the first sweep ends
    h = {"round": np.arange(len(sweeps)), "time": np.linspace(0.1, 1, len(sweeps)),
         "sweep": sweeps, "ll_per_token": ll}
    fig = plot_loglik({"LatentDirichletAllocation": h}, wall_time={
        "LatentDirichletAllocation": 4.45})
    assert len(fig.axes) == 2
    assert fig.axes[0].get_yscale() == "linear" and fig.axes[1].get_yscale() == "log"
    (line,) = fig.axes[1].lines
    per_sweep = -3.0 - 2.0 * 0.5 ** np.arange(2, 11, dtype=float)
    np.testing.assert_allclose(line.get_ydata(), np.abs(np.diff(per_sweep)))
    np.testing.assert_allclose(line.get_xdata(), np.arange(3, 11))
    assert "4.45 s" in fig.axes[0].get_legend().get_texts()[0].get_text()


def test_speedup_labels_the_extrapolation_and_what_the_model_is_fitted_from():
    P = np.array([1, 2, 4, 8, 16, 32, 64, 128])
    fig = plot_speedup({1: 1.0, 2: 0.42}, (P, P / (1 + 0.1 * P)),
                       fitted_from="one 1-worker fit and one 2-worker fit")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("extrapolated" in t for t in texts)
    assert any("one 1-worker fit and one 2-worker fit" in t for t in texts)
    solid = next(ln for ln in ax.lines if ln.get_label().startswith("model T(1)/T(P)"))
    assert max(solid.get_xdata()) == 2
    dashed = next(ln for ln in ax.lines if "extrapolated" in ln.get_label())
    assert dashed.get_linestyle() == "--" and max(dashed.get_xdata()) == 128
    span = [p for p in ax.patches if "extrapolated" in p.get_label()]
    assert len(span) == 1
    assert "MAC iteration" in ax.get_ylabel()


def test_suboptimality_without_reference_leaves_out_the_best_point():
    f = 0.5 + 0.1 * 0.5 ** np.arange(8)
    h = {"objective": f, "blocks_uploaded": np.full(8, 3)}
    fig = plot_suboptimality({"3": h})
    (line,) = fig.axes[0].lines
    np.testing.assert_allclose(line.get_ydata(), (f[:-1] - f[-1]) / f[-1])
    assert "best seen" in fig.axes[0].get_title()


def test_a_real_lasso_history_and_its_timing_fields():
    """A fitted Lasso's ``history_`` marks its gap rounds (``kind``), the convergence figure
    draws one gap point per computation and never reaches zero, and the pipeline's timing
    fields split the fit's wall time into the round loop (the figures' time axis) and the
    rest."""
    import time

    from conftest import alpha_max, make_problem

    from dmp.linear_model import Lasso
    from dmp.reports import loop_times

    X, y = make_problem(n=200, p=600, density=0.05, seed=1)
    est = Lasso(alpha=0.05 * alpha_max(X, y), tol=1e-8, random_state=0, n_workers=2,
                backend="local", show_progress=False)
    t0 = time.perf_counter()
    est.fit(X, y)
    wall = time.perf_counter() - t0
    h = est.history_
    kind = np.asarray(h["kind"]).astype(str)
    assert (kind == "gap").sum() >= 2
    fig = plot_convergence({"Lasso": h})
    (gap_line,) = fig.axes[1].lines
    at = (kind == "gap") & np.isfinite(np.asarray(h["dual_gap"], dtype=float))
    np.testing.assert_allclose(gap_line.get_xdata(), np.asarray(h["time"])[at])
    assert gap_line.get_ydata()[-1] == pytest.approx(est.dual_gap_)
    assert min(fig.axes[0].lines[0].get_ydata()) > 1e-14
    times = loop_times(est.history_, wall)
    assert times["round_loop_time_s"] == float(h["time"][-1]) > 0
    assert times["setup_time_s"] == pytest.approx(wall - times["round_loop_time_s"])
    assert times["setup_time_s"] >= 0


def test_mf_plot_draws_its_raw_objective_on_a_linear_axis():
    from scipy import sparse

    from dmp.decomposition import MatrixFactorization

    rng = np.random.default_rng(0)
    R = sparse.random(30, 20, density=0.3, random_state=rng, format="coo")
    R.data = 1 + 4 * R.data
    mf = MatrixFactorization(3, alpha=0.1, method="ccd", max_iter=4, tol=None,
                             random_state=0).fit(R)
    ax = mf.plot()
    obj = np.asarray(mf.history_["objective"], float)
    np.testing.assert_allclose(ax[0].lines[0].get_ydata(), obj)
    assert ax[0].get_yscale() == "linear"
    assert "round loop" in ax[0].get_xlabel()
