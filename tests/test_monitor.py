"""Live monitor: event aggregation, JSON route, Prometheus series, Bokeh page, CLI follower."""

import json
import logging
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import numpy as np
import pytest

from conftest import alpha_max, make_problem
from dmp.engine.events import FitEvents, finite_or_none, monitor_enabled, jsonable
from dmp.monitor import JSON_PATH, DMPMonitor, MonitorState, ensure_monitor, plot_history

# ---------------------------------------------------------------------------------------
# helpers


def _round_msg(fit, r, n_workers=2, objective=None, **extra):
    push = [0.01 * (r + 1) * (k + 1) for k in range(n_workers)]
    return {"kind": "round", "fit": fit, "round": r, "time": 0.1 * (r + 1),
            "round_s": 0.05 * (r + 1), "push_s": push, "idle_s": [0.001 * r] * n_workers,
            "bytes_push": 100 * (r + 1), "bytes_pull": 10, "bytes_schedule": 3,
            "objective": 1.0 / (r + 1) if objective is None else objective, **extra}


def _base(client):
    return client.dashboard_link.rsplit("/status", 1)[0]


def _get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode()


def _dmp_series(text):
    """{(name, frozenset(labels)): value} of the dmp_* samples in a Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("dmp_"):
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _same(a, b):
    """JSON value vs history value: exact, NaN <-> None, sequences elementwise."""
    if isinstance(b, np.ndarray) or isinstance(b, (list, tuple)):
        b = list(np.asarray(b).tolist())
        return isinstance(a, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(b, (float, np.floating)) and not math.isfinite(b):
        return a is None
    if isinstance(b, np.generic):
        b = b.item()
    return a == b


def _assert_rounds_match_history(rounds, history):
    n = len(history["round"])
    assert len(rounds) == n
    for key, values in history.items():
        jkey = "round_kind" if key == "kind" else key
        for i in range(n):
            assert _same(rounds[i][jkey], values[i]), (key, i, rounds[i][jkey], values[i])


# ---------------------------------------------------------------------------------------
# state, events, plotting (no cluster)


def test_state_totals_and_bounds():
    state = MonitorState(max_fits=2, max_rounds=5)
    state.handle({"kind": "fit_start", "fit": "Lasso-aaaa0001", "estimator": "Lasso",
                  "params": {"alpha": 0.1}, "workers": ["w0", "w1"], "max_iter": 50})
    for r in range(12):
        state.handle(_round_msg("Lasso-aaaa0001", r))
    fit = state.fits["Lasso-aaaa0001"]
    assert fit.n_rounds == 12 and len(fit.rounds) == 5           # bounded
    assert [r["round"] for r in fit.rounds] == list(range(7, 12))
    msgs = [_round_msg("x", r) for r in range(12)]
    for k in range(2):                                             # totals count every round
        assert fit.push_total[k] == pytest.approx(sum(m["push_s"][k] for m in msgs), rel=1e-12)
    assert fit.bytes_total == {"push": sum(m["bytes_push"] for m in msgs), "pull": 120,
                               "schedule": 36}
    assert fit.worker_names() == ["w0", "w1"]
    assert fit.summary()["value"] == pytest.approx(1 / 12)
    # sequence numbers: only what is still kept, from 'since' on
    assert [r["round"] for r in fit.rounds_since(0)] == list(range(7, 12))
    assert [r["round"] for r in fit.rounds_since(10)] == [10, 11]
    assert fit.rounds_since(12) == []
    snap = state.snapshot(since=9)
    assert snap["fits"][0]["first_seq"] == 9 and len(snap["fits"][0]["rounds"]) == 3


def test_state_drops_finished_fits_first_and_ignores_foreign_events():
    state = MonitorState(max_fits=2, max_rounds=10)
    state.handle(_round_msg("A-1", 0))
    state.handle({"kind": "fit_end", "fit": "A-1", "status": "converged"})
    state.handle(_round_msg("B-2", 0))
    state.handle(_round_msg("C-3", 0))
    assert list(state.fits) == ["B-2", "C-3"]
    for junk in (None, "text", {"kind": "round"}, {"fit": 3}, ["a"]):
        state.handle(junk)
    assert state.n_events == 4
    state.handle({"kind": "checkpoint", "fit": "B-2", "round": 10})
    state.handle({"kind": "worker_lost", "fit": "B-2", "round": 12, "error": "boom"})
    state.handle({"kind": "recovered", "fit": "B-2", "resumed_round": 10, "workers": ["z"]})
    b = state.fits["B-2"]
    assert (b.n_checkpoints, b.last_checkpoint_round, b.n_worker_losses, b.n_recoveries) == \
        (1, 10, 1, 1)
    assert [e["kind"] for e in b.events] == ["checkpoint", "worker_lost", "recovered"]
    with pytest.raises(ValueError):
        MonitorState(max_rounds=0)


def test_state_unpacks_batches_in_order():
    """The Dask backend sends a fit's queued events as one "batch" message."""
    state = MonitorState()
    batch = {"kind": "batch", "events": [_round_msg("F-1", r) for r in range(3)]
             + [{"kind": "fit_end", "fit": "F-1", "status": "max_iter"}]}
    state.handle(batch)
    fit = state.fits["F-1"]
    assert [r["round"] for r in fit.rounds] == [0, 1, 2] and fit.status == "max_iter"
    assert state.n_events == 4


def test_plain_and_json_safety():
    msg = jsonable({"a": np.float64(1.5), "b": np.int64(3), "c": np.arange(3), "d": (1, 2),
                 "e": {"f": np.bool_(True)}, "g": object, "h": float("nan")})
    assert msg["a"] == 1.5 and type(msg["b"]) is int and msg["c"] == [0, 1, 2]
    assert msg["d"] == [1, 2] and msg["e"] == {"f": True} and isinstance(msg["g"], str)
    text = json.dumps(finite_or_none(msg), allow_nan=False)
    assert json.loads(text)["h"] is None


def test_events_disabled_on_local_backend_and_by_config():
    import dask

    from dmp.engine.backends.local import LocalBackend

    ev = FitEvents(LocalBackend(1), program=None, desc="Lasso")
    assert not ev.enabled and ev.fit_id.startswith("Lasso-")
    assert monitor_enabled()
    with dask.config.set({"dmp.monitor": False}):
        assert not monitor_enabled()
    with dask.config.set({"dmp.monitor": "off"}):
        assert not monitor_enabled()


def test_prometheus_collector_matches_state():
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    from dmp.monitor import prometheus

    mon = DMPMonitor(max_rounds=3)
    mon.log_event("dmp", {"kind": "fit_start", "fit": "MF-00000001",
                          "estimator": "MatrixFactorization", "workers": ["a", "b"]})
    msgs = [_round_msg("MF-00000001", r) for r in range(7)]
    for m in msgs:
        mon.log_event("dmp", m)
    mon.log_event("other-topic", _round_msg("MF-00000001", 99))  # not ours: ignored
    mon.log_event("dmp", {"kind": "worker_lost", "fit": "MF-00000001", "round": 5})
    assert prometheus.track(mon)
    try:
        series = _dmp_series(generate_latest().decode())
    finally:
        prometheus.untrack(mon)
    lab = {"fit": "MF-00000001", "estimator": "MatrixFactorization"}

    def get(name, **more):
        return series[(name, frozenset({**lab, **more}.items()))]

    assert get("dmp_rounds_total") == 7
    assert get("dmp_objective") == 1 / 7
    assert get("dmp_worker_losses_total") == 1
    for k, w in enumerate("ab"):
        assert get("dmp_push_seconds_total", worker=w) == pytest.approx(
            sum(m["push_s"][k] for m in msgs), rel=1e-12)
    assert get("dmp_bytes_total", primitive="push") == sum(m["bytes_push"] for m in msgs)
    assert get("dmp_fit_running", status="running") == 1
    # untracked: gone from the exposition
    assert not any(k[0] == "dmp_rounds_total" and ("fit", "MF-00000001") in k[1]
                   for k in _dmp_series(generate_latest().decode()))


def test_page_view_streams_rounds():
    pytest.importorskip("bokeh")
    from dmp.monitor.page import DMPPage

    mon = DMPMonitor()

    class FakeScheduler:
        plugins = {"dmp-monitor": mon}

    page = DMPPage(FakeScheduler())
    page.update()                                    # nothing yet: no error, no view
    assert page.view is None
    mon.log_event("dmp", {"kind": "fit_start", "fit": "Lasso-00000002", "estimator": "Lasso",
                          "params": {"alpha": 0.5}, "max_iter": 40, "workers": ["w0", "w1"]})
    for r in range(4):
        mon.log_event("dmp", _round_msg("Lasso-00000002", r, dual_gap=0.1 / (r + 1),
                                        n_candidates=8, n_kept=5,
                                        priority_q=(0.0, 1.0, 2.0, 3.0, 4.0)))
    page.update()
    src = page.view.source.data
    assert src["round"] == [0, 1, 2, 3]
    assert src["primary"] == [1.0, 0.5, 1 / 3, 0.25]
    assert src["m_dual_gap"] == pytest.approx([0.1, 0.05, 0.1 / 3, 0.025])
    assert src["cum_bytes_push"] == [100, 300, 600, 1000]
    assert src["push_1"] == pytest.approx([0.02, 0.04, 0.06, 0.08])
    assert src["pq4"] == [4.0] * 4 and src["s_n_kept"] == [5] * 4
    assert "round 3</b> / 40" in page.status.text and "alpha=0.5" in page.status.text
    for r in range(4, 6):
        mon.log_event("dmp", _round_msg("Lasso-00000002", r, dual_gap=0.01, n_candidates=8,
                                        n_kept=5, priority_q=(0.0, 1.0, 2.0, 3.0, 4.0)))
    page.update()                                    # only the new rounds are streamed
    assert page.view.source.data["round"] == list(range(6))
    # a second fit starts: the page follows the newest running fit, the table lists both
    mon.log_event("dmp", {"kind": "fit_end", "fit": "Lasso-00000002", "status": "converged"})
    mon.log_event("dmp", _round_msg("SGD-00000003", 0))
    page.update()
    assert page.fits.data["fit"] == ["SGD-00000003", "Lasso-00000002"]   # newest first
    assert page.fits.data["status"] == ["running", "converged"]
    assert page.select.value == "SGD-00000003" and page.view.fit_id == "SGD-00000003"
    assert list(page.fits.selected.indices) == [0]                        # highlighted


class _FakeScheduler:
    def __init__(self, mon):
        self.plugins = {"dmp-monitor": mon}


def _glyph_columns(view):
    """{figure title: [(glyph field, values)]} of a FitView's figures."""
    out = {}
    for row in view.root.children:
        for fig in getattr(row, "children", []):
            if not hasattr(fig, "renderers"):
                continue
            cols = []
            for r in fig.renderers:
                for attr in ("y", "y1", "y2"):
                    spec = getattr(r.glyph, attr, None)
                    if isinstance(spec, str) or hasattr(spec, "field"):
                        name = spec if isinstance(spec, str) else spec.field
                        cols.append((name, list(r.data_source.data[name])))
            out[fig.title.text] = (type(fig.y_scale).__name__, cols)
    return out


def _assert_every_glyph_has_data(view):
    for title, (_, cols) in _glyph_columns(view).items():
        for name, values in cols:
            assert any(isinstance(v, (int, float)) and math.isfinite(v) for v in values), \
                f"panel {title!r}: nothing to draw in {name!r}: {values}"


@pytest.mark.parametrize("case", ["negative_max", "nan_then_zero", "constant", "decades"])
def test_page_panels_draw_every_kind_of_metric(case):
    """Negative (LDA's log-likelihood), zero, NaN at the start and constant metrics all
    draw; only a positive minimised metric spanning decades gets a log axis."""
    pytest.importorskip("bokeh")
    from dmp.monitor.page import DMPPage

    n = 8
    primary, direction = ("ll_per_token", "max") if case == "negative_max" else \
        ("objective", "min")
    values = {"negative_max": [math.nan, math.nan] + [-8.0 + 0.1 * r for r in range(n - 2)],
              "nan_then_zero": [math.nan, math.nan] + [0.0] * (n - 2),
              "constant": [3.0] * n,
              "decades": [10.0 ** -r for r in range(n)]}[case]
    mon = DMPMonitor()
    mon.log_event("dmp", {"kind": "fit_start", "fit": "M-1", "estimator": "M",
                          "primary_metric": primary, "primary_direction": direction,
                          "workers": ["w0", "w1"]})
    page = DMPPage(_FakeScheduler(mon))
    for r in range(n):
        extra = {primary: values[r], "other": -1.0 * r, "zero": 0.0,
                 "late": math.nan if r < 4 else 2.0, "never": math.nan,
                 "batch": r - r % 2, "worker_losses": 0}
        mon.log_event("dmp", {k: v for k, v in _round_msg("M-1", r).items()
                              if k != "objective"} | extra)
        page.update()
    panels = _glyph_columns(page.view)
    _assert_every_glyph_has_data(page.view)
    scale = {t: sc for t, (sc, _) in panels.items()}
    want = "LogScale" if case == "decades" else "LinearScale"
    better = "higher" if direction == "max" else "lower"
    assert scale[f"{primary} vs round ({better} is better)"] == want
    assert scale[f"{primary} vs time ({better} is better)"] == want
    # a metric that was NaN at first got its panel once it had a value; one never finite
    # gets none; bookkeeping counters are no curves
    assert {"other vs round", "zero vs round", "late vs round"} <= set(scale)
    assert not any(t.split()[0] in ("never", "batch", "worker_losses") for t in scale)
    assert "8 rounds in 4 batches" in page.status.text


def test_axis_choice():
    from dmp.monitor.page import choose_axis

    assert choose_axis(1e-8, 1.0, 5) == "log"
    assert choose_axis(0.5, 1.0, 5) == "linear"             # less than a decade
    assert choose_axis(0.0, 1.0, 5) == "linear"             # zero
    assert choose_axis(-9.0, -1.0, 5) == "linear"           # negative
    assert choose_axis(1e-8, 1.0, 5, "max") == "linear"     # maximised
    assert choose_axis(math.inf, -math.inf, 0) == "linear"  # no data yet


def test_fits_table_newest_first_labelled_by_the_differing_parameter():
    pytest.importorskip("bokeh")
    from dmp.monitor.page import DMPPage

    mon = DMPMonitor()
    page = DMPPage(_FakeScheduler(mon))
    ids = []
    for k, schedule in enumerate(["priority", "round_robin"] * 4 + ["priority"]):
        fit = f"Lasso-0000000{k}"
        ids.append(fit)
        mon.log_event("dmp", {"kind": "fit_start", "fit": fit, "estimator": "Lasso",
                              "params": {"alpha": 0.1, "schedule": schedule,
                                         "checkpoint": f"/tmp/{schedule}-{k}.zarr"}})
        mon.log_event("dmp", _round_msg(fit, 0))
        if k < 8:
            mon.log_event("dmp", {"kind": "fit_end", "fit": fit, "status": "converged"})
    mon.log_event("dmp", _round_msg("MF-1", 0))            # another estimator: no label
    mon.log_event("dmp", {"kind": "fit_end", "fit": "MF-1", "status": "max_iter"})
    page.update()
    data = page.fits.data
    assert data["fit"] == ["MF-1"] + ids[::-1]
    assert data["run"][1:3] == ["schedule=priority", "schedule=round_robin"]
    assert data["run"][0] == ""
    # the running fit is shown and highlighted, and every row fits in the table's height
    assert page.select.value == ids[-1] and list(page.fits.selected.indices) == [1]
    assert page.table.height >= page.table.row_height * (len(data["fit"]) + 1)
    assert dict(page.select.options)[ids[-1]].startswith("schedule=priority")
    # a row clicked in the table shows that fit
    page.fits.selected.indices = [2]
    page.update()
    assert page.select.value == ids[-2] and page.view.fit_id == ids[-2]
    assert list(page.fits.selected.indices) == [2]


def test_prometheus_objective_only_for_minimised_metrics():
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    from dmp.monitor import prometheus

    mon = DMPMonitor()
    mon.log_event("dmp", {"kind": "fit_start", "fit": "LDA-1", "estimator": "LDA",
                          "primary_metric": "ll_per_token", "primary_direction": "max"})
    mon.log_event("dmp", {"kind": "fit_start", "fit": "BA-1", "estimator": "BA",
                          "primary_metric": "E_BA", "primary_direction": "min"})
    for r in range(4):
        mon.log_event("dmp", _round_msg("LDA-1", r, ll_per_token=-7.5 + r, batch=r - r % 2,
                                        worker_losses=0))
        mon.log_event("dmp", _round_msg("BA-1", r, E_BA=2.0 - r / 10, batch=r,
                                        worker_losses=0))
    assert prometheus.track(mon)
    try:
        series = _dmp_series(generate_latest().decode())
    finally:
        prometheus.untrack(mon)

    def get(name, fit, **more):
        return series.get((name, frozenset({"fit": fit, "estimator": fit.split("-")[0],
                                            **more}.items())))

    assert get("dmp_objective", "LDA-1") is None            # maximised: never an objective
    assert get("dmp_primary_metric", "LDA-1", metric="ll_per_token", direction="max") == -4.5
    assert get("dmp_objective", "BA-1") == pytest.approx(1.7)
    assert get("dmp_primary_metric", "BA-1", metric="E_BA", direction="min") == \
        pytest.approx(1.7)
    assert get("dmp_batches_total", "LDA-1") == 2 and get("dmp_batches_total", "BA-1") == 4
    for fit in ("LDA-1", "BA-1"):                            # counters, not metric curves
        assert get("dmp_metric", fit, metric="batch") is None
        assert get("dmp_metric", fit, metric="worker_losses") is None
    snap = json.loads(mon.to_json())["fits"]
    lda = next(f for f in snap if f["fit"] == "LDA-1")
    assert (lda["primary_metric"], lda["direction"], lda["value"]) == \
        ("ll_per_token", "max", -4.5)
    assert "batch" not in lda["metrics"] and lda["n_batches"] == 2


def test_follower_summarises_checkpoints():
    import io

    from dmp.monitor.follow import _Printer

    out = io.StringIO()
    printer = _Printer(out, interval=1e9)
    printer.handle((0, {"kind": "fit_start", "fit": "L-1", "estimator": "Lasso",
                        "n_partitions": 2, "max_iter": 1000}))
    for r in range(1000):
        printer.handle((r, _round_msg("L-1", r)))
        if r % 25 == 24:
            printer.handle((r, {"kind": "checkpoint", "fit": "L-1", "round": r + 1}))
    printer.handle((1001, {"kind": "fit_end", "fit": "L-1", "status": "max_iter",
                           "n_rounds": 1000, "wall_s": 9.0}))
    lines = out.getvalue().splitlines()
    assert len(lines) <= 5, lines
    assert sum("checkpoint" in line for line in lines) == 2
    assert "40 checkpoint(s), the last at round 1000" in lines[-1]


def test_cli_monitor_unresolvable_host_says_so(capsys):
    from dmp.cli import main

    t0 = time.monotonic()
    assert main(["monitor", "tcp://no-such-host.invalid:8786", "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert "'no-such-host.invalid' does not resolve" in err and "Timed out" not in err
    assert time.monotonic() - t0 < 5
    # the one place dmp connects to a scheduler (dmp run --scheduler, dmp monitor)
    from dmp.engine.backends.dask import connect

    with pytest.raises(ConnectionError, match="'no-such-host.invalid' does not resolve"):
        connect("tls://no-such-host.invalid:8786")


def test_plot_history_writes_png(tmp_path):
    history = {"round": np.arange(5), "time": np.linspace(0.1, 0.5, 5),
               "objective": 1.0 / np.arange(1, 6), "push_s": np.full((5, 2), 0.01),
               "idle_s": np.full((5, 2), 0.002), "bytes_push": np.full(5, 100)}
    path = plot_history(history, path=str(tmp_path / "training.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no 'dual_gap'"):
        plot_history(history, metric="dual_gap")
    with pytest.raises(ValueError, match="empty"):
        plot_history({})


# ---------------------------------------------------------------------------------------
# a real LocalCluster


@pytest.mark.dask
def test_fit_registers_monitor_json_and_prometheus_match_history(dask_client):
    from dmp.decomposition import MatrixFactorization
    from dmp.linear_model import Lasso

    X, y = make_problem(n=200, p=400, seed=3)
    lasso = Lasso(alpha=0.05 * alpha_max(X, y), random_state=0, n_workers=2).fit(X, y)
    rng = np.random.default_rng(0)
    import scipy.sparse as sp
    R = sp.random(60, 40, density=0.3, random_state=1, format="coo")
    R.data = rng.uniform(1, 5, R.nnz)
    mf = MatrixFactorization(n_components=3, max_iter=3, random_state=0, n_workers=2).fit(R)

    base = _base(dask_client)
    status, text = _get(base + JSON_PATH)
    assert status == 200
    fits = {f["estimator"]: f for f in json.loads(text)["fits"]}
    assert set(fits) >= {"Lasso", "MatrixFactorization"}    # shown separately
    fl, fm = fits["Lasso"], fits["MatrixFactorization"]
    assert fl["params"]["alpha"] == lasso.alpha and fm["params"]["n_components"] == 3
    assert fl["status"] == "converged" and fl["n_rounds"] == lasso.n_iter_
    _assert_rounds_match_history(fl["rounds"], lasso.history_)
    _assert_rounds_match_history(fm["rounds"], mf.history_)
    assert fl["value"] == lasso.history_["objective"][-1]
    # one fit by query argument; 'since' pages through rounds
    _, one = _get(f"{base}{JSON_PATH}?fit={fl['fit']}&since=2")
    one = json.loads(one)["fits"]
    assert len(one) == 1 and one[0]["rounds"][0]["round"] == lasso.history_["round"][2]
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(f"{base}{JSON_PATH}?since=abc")
    assert err.value.code == 400

    _, prom = _get(base + "/metrics")
    series = _dmp_series(prom)
    lab = {"fit": fl["fit"], "estimator": "Lasso"}
    assert series[("dmp_rounds_total", frozenset(lab.items()))] == len(lasso.history_["round"])
    assert series[("dmp_objective", frozenset(lab.items()))] == lasso.history_["objective"][-1]
    push = np.asarray(lasso.history_["push_s"])
    for k, worker in enumerate(fl["workers"]):
        got = series[("dmp_push_seconds_total", frozenset({**lab, "worker": worker}.items()))]
        assert got == pytest.approx(push[:, k].sum(), rel=1e-12)
    for prim in ("push", "pull", "schedule"):
        got = series[("dmp_bytes_total", frozenset({**lab, "primitive": prim}.items()))]
        assert got == lasso.history_[f"bytes_{prim}"].sum()

    # registering again (idempotent, or a replacing instance) keeps what was collected
    assert ensure_monitor(dask_client)
    replacing = DMPMonitor()
    replacing.idempotent = False
    dask_client.register_plugin(replacing, name="dmp-monitor")
    _, again = _get(base + JSON_PATH)
    assert {f["fit"] for f in json.loads(again)["fits"]} >= {fl["fit"], fm["fit"]}
    status, page = _get(base + "/dmp")
    assert status == 200 and "bokeh" in page.lower()


def _five_models(backend):
    """One tiny fit of each of dmp's five models: ``[(estimator, fit arguments)]``."""
    import scipy.sparse as sp
    from sklearn.datasets import load_digits

    from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
    from dmp.hashing import BinaryAutoencoder
    from dmp.linear_model import Lasso, SparsifiedSGDClassifier
    from test_lda import lda_corpus

    rng = np.random.default_rng(0)
    X, y = make_problem(n=200, p=400, seed=3)
    R = sp.random(60, 40, density=0.3, random_state=1, format="coo")
    R.data = rng.uniform(1, 5, R.nnz)
    docs, _, _ = lda_corpus(n_docs=60, n_words=80, n_topics=4, doc_len=30, seed=7)
    Xc = rng.standard_normal((200, 20))
    kw = dict(n_workers=2, backend=backend, random_state=0)
    return [
        (Lasso(alpha=0.05 * alpha_max(X, y), **kw), (X, y)),
        (MatrixFactorization(n_components=3, max_iter=3, tol=0, **kw), (R,)),
        (LatentDirichletAllocation(4, max_iter=4, **kw), (docs,)),
        (BinaryAutoencoder(8, max_iter=2, **kw), (load_digits().data[:300],)),
        (SparsifiedSGDClassifier(alpha=1e-2, max_iter=30, tol=None, **kw),
         (Xc, (Xc[:, 0] > 0).astype(int))),
    ]


@pytest.fixture(scope="module")
def five_fits(dask_client):
    """``{estimator name: (fitted estimator, fit id)}`` of `_five_models` on the cluster."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    fitted = {}
    assert ensure_monitor(dask_client)
    for est, args in _five_models(dask_client):
        before = {f["fit"] for f in json.loads(_get(_base(dask_client) + JSON_PATH)[1])["fits"]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)   # tiny budgets on purpose
            est.fit(*args)
        fits = json.loads(_get(_base(dask_client) + JSON_PATH)[1])["fits"]
        new = [f["fit"] for f in fits if f["fit"] not in before]
        assert len(new) == 1, new
        fitted[type(est).__name__] = (est, new[0])
    return fitted


def _rounds_of(est):
    return getattr(est, "round_history_", est.history_)


@pytest.mark.dask
def test_every_model_reports_its_declared_primary_metric(five_fits, dask_client):
    """One definition of the primary metric per fit: the JSON route and Prometheus carry the
    name, direction and value the program declares and ``history_`` holds; dmp_objective only
    for minimised metrics; batch and worker_losses are counters, not metrics."""
    from dmp.decomposition._lda_program import LDAProgram
    from dmp.decomposition._mf_program import _MFBase
    from dmp.engine.events import primary_of
    from dmp.hashing._parmac import ParMACProgram
    from dmp.linear_model._lasso_program import LassoProgram
    from dmp.linear_model._sparsified_program import SparsifiedProgram

    programs = {"Lasso": LassoProgram, "MatrixFactorization": _MFBase,
                "LatentDirichletAllocation": LDAProgram, "BinaryAutoencoder": ParMACProgram,
                "SparsifiedSGDClassifier": SparsifiedProgram}
    assert primary_of(LDAProgram) == ("ll_per_token", "max")
    base = _base(dask_client)
    fits = {f["fit"]: f for f in json.loads(_get(base + JSON_PATH)[1])["fits"]}
    series = _dmp_series(_get(base + "/metrics")[1])
    for name, (est, fit_id) in five_fits.items():
        metric, direction = primary_of(programs[name])
        got = fits[fit_id]
        value = float(_rounds_of(est)[metric][-1])
        assert (got["primary_metric"], got["direction"], got["value"]) == \
            (metric, direction, value), name
        lab = {"fit": fit_id, "estimator": name}
        assert series[("dmp_primary_metric", frozenset(
            {**lab, "metric": metric, "direction": direction}.items()))] == value
        objective = series.get(("dmp_objective", frozenset(lab.items())))
        assert objective == (value if direction == "min" else None), name
        assert "batch" not in got["metrics"] and "worker_losses" not in got["metrics"]
        assert got["n_batches"] == len(set(_rounds_of(est)["batch"].tolist()))
        assert series[("dmp_batches_total", frozenset(lab.items()))] == got["n_batches"]
        assert not any(k[0] == "dmp_metric" and ("metric", "batch") in k[1] for k in series)


@pytest.mark.dask
def test_plot_history_works_for_every_model(five_fits, tmp_path):
    """The README's ``plot_history(est.history_, path=...)``, no other argument, for each."""
    for name, (est, _) in five_fits.items():
        path = plot_history(est.history_, path=str(tmp_path / f"{name}.png"))
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
    # the binary autoencoder's rounds (its history_ holds MAC iterations), also from the
    # estimator itself
    ba = five_fits["BinaryAutoencoder"][0]
    for i, what in enumerate((ba.round_history_, ba)):
        path = plot_history(what, path=str(tmp_path / f"ba-rounds-{i}.png"))
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.dask
@pytest.mark.slow
def test_lda_pipeline_names_its_primary_metric_everywhere(dask_client, tmp_path, capsys):
    """The issue's repro: ``dmp run pipelines/lda_small.yaml --scheduler ...``: the console,
    metrics.json, the JSON route and Prometheus give the same name and value (the
    log-likelihood per token, maximised), and nothing calls it or its negative "objective"."""
    from pathlib import Path

    from dmp.cli import main

    repo = Path(__file__).resolve().parents[1]
    base = _base(dask_client)
    assert ensure_monitor(dask_client)
    before = {f["fit"] for f in json.loads(_get(base + JSON_PATH)[1])["fits"]}
    out = tmp_path / "lda"
    assert main(["run", str(repo / "pipelines" / "lda_small.yaml"), "--output", str(out),
                 "--no-progress", "--scheduler", dask_client.scheduler.address]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    run = metrics["runs"]["LatentDirichletAllocation"]
    assert (run["primary_metric"], run["direction"]) == ("ll_per_token", "max")
    assert "objective" not in run and "best_objective" not in metrics
    assert run["value"] == pytest.approx(run["ll_per_token"], rel=1e-12) and run["value"] < 0
    assert metrics["best_value"] == run["value"]
    assert f"ll_per_token {run['value']:.10g} (higher is better)" in printed
    assert "objective" not in printed
    fit = next(f for f in json.loads(_get(base + JSON_PATH)[1])["fits"]
               if f["fit"] not in before)
    assert (fit["primary_metric"], fit["direction"], fit["value"]) == \
        ("ll_per_token", "max", run["value"])
    series = _dmp_series(_get(base + "/metrics")[1])
    lab = {"fit": fit["fit"], "estimator": "LatentDirichletAllocation"}
    assert ("dmp_objective", frozenset(lab.items())) not in series
    assert series[("dmp_primary_metric", frozenset(
        {**lab, "metric": "ll_per_token", "direction": "max"}.items()))] == run["value"]


@pytest.mark.dask
def test_monitor_off_by_config_sends_nothing():
    import dask
    from distributed import Client, LocalCluster

    from dmp.linear_model import Lasso

    X, y = make_problem(n=100, p=200, seed=4)
    with dask.config.set({"dmp.monitor": False}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                         dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        Lasso(alpha=0.1 * alpha_max(X, y), backend="dask").fit(X, y)
        assert "dmp-monitor" not in cluster.scheduler.plugins
        assert client.get_events("dmp") == ()


@pytest.mark.dask
def test_preload_lists_page_in_dashboard_menu():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR,
                      scheduler_kwargs={"preload": ["dmp.monitor.preload"]}) as cluster, \
            Client(cluster) as client:
        assert isinstance(cluster.scheduler.plugins.get("dmp-monitor"), DMPMonitor)
        # an in-process scheduler's link names the machine's host name; it listens on 127.0.0.1
        base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
        _, status_page = _get(base + "/status")
        assert "individual-dmp-training" in status_page         # the "More..." menu
        code, page = _get(base + "/individual-dmp-training")
        assert code == 200 and "bokeh" in page.lower()
        code, page = _get(base + "/dmp")
        assert code == 200 and "bokeh" in page.lower()
        _, data = _get(base + JSON_PATH)
        assert json.loads(data)["fits"] == []


_NO_MODULE_SCHEDULER = textwrap.dedent("""
    import asyncio, json, sys, urllib.request
    sys.modules[sys.argv[1]] = None          # as if it were not installed
    from distributed import Scheduler

    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
            from dmp.monitor import DMPMonitor
            await s.register_scheduler_plugin(DMPMonitor(), name="dmp-monitor",
                                              idempotent=True)
            s.log_event("dmp", {"kind": "round", "fit": "X-1", "round": 0, "time": 0.5,
                                "push_s": [0.1], "objective": 2.0})
            port = s.http_server.port
            def fetch(path):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                                timeout=20) as r:
                        return [r.status, r.read().decode()]
                except Exception as exc:
                    return [getattr(exc, "code", -1), str(exc)]

            loop = asyncio.get_running_loop()
            out = {}
            for path in ("/dmp", "/dmp/api/metrics.json", "/metrics"):
                out[path] = await loop.run_in_executor(None, fetch, path)
            print("RESULT" + json.dumps(out))

    asyncio.run(main())
""")


@pytest.mark.dask
@pytest.mark.parametrize("missing", ["bokeh", "prometheus_client"])
def test_scheduler_without_bokeh_or_prometheus_degrades_gracefully(missing):
    proc = subprocess.run([sys.executable, "-c", _NO_MODULE_SCHEDULER, missing],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.split("RESULT", 1)[1])
    code, body = out["/dmp/api/metrics.json"]
    assert code == 200 and json.loads(body)["fits"][0]["value"] == 2.0
    code, body = out["/dmp"]
    if missing == "bokeh":
        assert code == 200 and "needs bokeh" in body
    else:
        assert code == 200 and "bokeh" in body.lower()
        assert "dmp_" not in out["/metrics"][1]


_SCHEDULER_WITHOUT_DMP = textwrap.dedent("""
    import asyncio, sys
    sys.modules["dmp"] = None                # the scheduler cannot import dmp
    from distributed import Nanny, Scheduler

    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
            async with Nanny(s.address, nthreads=1, name="w0") as n:
                print("ADDRESS", s.address, flush=True)
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())
""")


@pytest.mark.dask
def test_scheduler_without_dmp_warns_and_stays_healthy():
    """Registration on a scheduler that cannot import dmp: a warning, no exception, and the
    scheduler keeps working (dmp fits themselves need dmp there: Dask unpickles their task
    graphs on the scheduler)."""
    from distributed import Client

    proc = subprocess.Popen([sys.executable, "-c", _SCHEDULER_WITHOUT_DMP],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ADDRESS"), line
        with Client(line.split()[1], timeout="10s") as client:
            with pytest.warns(RuntimeWarning, match="dmp monitor could not be registered"):
                assert ensure_monitor(client) is False
            assert client.submit(sum, [1, 2, 3]).result(timeout=30) == 6
            assert client.run_on_scheduler(lambda dask_scheduler: sorted(
                dask_scheduler.plugins)).count("dmp-monitor") == 0
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def _dmp_subscribers(dask_scheduler):
    """How many clients subscribe to the dmp topic (None: this Dask keeps no such list)."""
    topics = getattr(getattr(dask_scheduler, "_broker", None), "_topics", None)
    if topics is None:
        return None
    topic = topics.get("dmp")
    return 0 if topic is None else len(topic.subscribers)


@pytest.mark.dask
def test_cli_follows_a_running_fit(dask_client):
    from dmp.linear_model import Lasso

    addr = dask_client.scheduler.address
    before = dask_client.run_on_scheduler(_dmp_subscribers)
    proc = subprocess.Popen([sys.executable, "-m", "dmp.cli", "monitor", addr,
                             "--exit-when-done", "--timeout", "120", "--interval", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # let it subscribe before the fit starts: until the scheduler lists one more subscriber
    # of the topic (distributed's broker; a fixed 3 s where it has none)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        n = dask_client.run_on_scheduler(_dmp_subscribers)
        if n is None:
            time.sleep(3.0)
        if n is None or n > before:
            break
        time.sleep(0.1)
    X, y = make_problem(n=200, p=400, seed=8)
    est = Lasso(alpha=0.05 * alpha_max(X, y), random_state=0, n_workers=2).fit(X, y)
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, err[-2000:]
    assert "started: Lasso(" in out
    assert f"round {est.history_['round'][-1]}/" in out
    assert "finished (converged)" in out


def test_cli_monitor_unreachable_scheduler():
    from dmp.cli import main

    assert main(["monitor", "tcp://127.0.0.1:9", "--timeout", "1"]) == 2


# ---------------------------------------------------------------------------------------
# a real browser


def _chromium():
    for path in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.path.exists(path):
            return path
    return None


_LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync"]

# In the page: every glyph of the shown fit's figures, with the values of its data fields.
_GLYPHS_JS = """() => {
  const doc = Bokeh.documents[0];
  const out = [];
  const walk = (m) => {
    if (m.renderers !== undefined && m.title !== undefined) {
      for (const r of m.renderers) {
        if (r.glyph === undefined) continue;
        const fields = [];
        for (const attr of ["y", "y1", "y2"]) {
          const spec = r.glyph[attr];
          if (spec !== undefined && spec !== null && typeof spec.field === "string") {
            const col = r.data_source.data.get !== undefined
                ? r.data_source.data.get(spec.field) : r.data_source.data[spec.field];
            const vals = col === undefined ? [] : Array.from(col);
            fields.push({field: spec.field, n: vals.length,
                         finite: vals.filter(v => typeof v === "number" && isFinite(v)).length});
          }
        }
        out.push({figure: m.title ? m.title.text : "?", glyph: r.glyph.type, fields,
                  y_scale: m.y_scale ? m.y_scale.type : "?"});
      }
    }
    for (const c of (m.children || [])) walk(Array.isArray(c) ? c[0] : c);
  };
  for (const root of doc.roots()) walk(root);
  return out;
}"""

# (the models are found by their type, not only by name: the test must run on older pages)
_STATUS_JS = """() => {
  const doc = Bokeh.documents[0];
  const div = doc.get_model_by_name("dmp-status") || [...doc.all_models].find(
      m => typeof m.text === "string" && m.text.includes("<code>"));
  return div ? div.text : "";
}"""

_SELECT_JS = """(fit) => {
  const doc = Bokeh.documents[0];
  const sel = doc.get_model_by_name("dmp-fit-select") || [...doc.all_models].find(
      m => Array.isArray(m.options) && typeof m.value === "string");
  sel.value = fit;
}"""


def _bokeh_problems(messages):
    """Console messages of the page that report a problem (Bokeh's own warnings included,
    e.g. "could not determine minimum data value for log axis")."""
    return [f"{kind}: {text}" for kind, text in messages
            if kind in ("error", "warning") or "could not" in text.lower()]


def _undrawn(glyphs):
    """The glyphs with nothing to draw: no finite value in one of their data fields."""
    return [f"{g['figure']!r}: {f['field']} ({f['n']} values, none finite)"
            for g in glyphs for f in g["fields"] if f["finite"] == 0]


def _launch(sync_api, pw):
    chromium = _chromium()
    if chromium is None:
        if os.environ.get("DMP_REQUIRE_BROWSER"):
            pytest.fail("DMP_REQUIRE_BROWSER is set but /usr/bin/chromium is missing")
        pytest.skip("no Chromium: install Debian's chromium package (.ci/install-browser)")
    return pw.chromium.launch(executable_path=chromium, args=_LAUNCH_ARGS)


def _artifacts():
    path = os.environ.get("DMP_TEST_ARTIFACTS",
                          os.path.join(os.path.dirname(__file__), "..", "test-artifacts"))
    os.makedirs(path, exist_ok=True)
    return path


@pytest.mark.dask
@pytest.mark.browser
def test_dashboard_draws_every_panel_of_every_model(five_fits, dask_client):
    """Each model's fit selected in turn on the /dmp page: every glyph of every figure has
    data to draw, and the browser console reports no problem (an empty LDA page passed the
    older test: its values were negative on log axes)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if _chromium() is None and not os.environ.get("DMP_REQUIRE_BROWSER"):
        pytest.skip("no Chromium: install Debian's chromium package (.ci/install-browser)")
    artifacts = _artifacts()
    with sync_api.sync_playwright() as pw:
        browser = _launch(sync_api, pw)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1700})
            messages = []
            page.on("console", lambda m: messages.append((m.type, m.text)))
            page.on("pageerror", lambda exc: messages.append(("error", str(exc))))
            page.goto(_base(dask_client) + "/dmp")
            page.locator("canvas").first.wait_for(timeout=60_000)
            fits = {f["fit"]: f for f in json.loads(_get(_base(dask_client) + JSON_PATH)[1])
                    ["fits"]}
            problems = {}
            for name, (est, fit_id) in five_fits.items():
                page.evaluate(_SELECT_JS, fit_id)
                deadline = time.monotonic() + 30
                while True:
                    page.wait_for_timeout(700)   # an update (every 500 ms) and its render
                    status = page.evaluate(_STATUS_JS)
                    glyphs = page.evaluate(_GLYPHS_JS)
                    if ((fit_id in status and glyphs and not _undrawn(glyphs))
                            or time.monotonic() > deadline):
                        break
                page.screenshot(path=os.path.join(artifacts, f"dmp-{name}.png"),
                                full_page=True)
                # (every model is looked at before the test fails: the report names them all)
                bad = [] if fit_id in status else [f"not shown: {status[:200]}"]
                bad += _undrawn(glyphs)
                n_rounds = fits[fit_id]["n_rounds"]   # each round drawn once
                bad += [f"{g['figure']!r}: {f['field']} has {f['n']} values for {n_rounds} "
                        f"rounds" for g in glyphs for f in g["fields"] if f["n"] != n_rounds]
                figures = {g["figure"] for g in glyphs}
                primary = fits[fit_id].get("primary_metric", "objective")
                want = {f"{primary} vs {x}" for x in ("time", "round")}
                bad += [f"no panel {t!r}" for t in want - {t.split(" (")[0] for t in figures}]
                bad += [f"no panel {t!r}" for t in ("push time per worker (s)",
                                                     "bytes moved, cumulative")
                        if t not in figures]
                if bad:
                    problems[name] = bad
            problems["console"] = _bokeh_problems(messages)
            if any(problems.values()):
                pytest.fail("the /dmp page does not draw everything:\n" + "\n".join(
                    f"  {name}: {p}" for name, ps in problems.items() for p in ps))
        finally:
            browser.close()


@pytest.mark.dask
@pytest.mark.browser
def test_dashboard_page_in_headless_chromium(dask_client):
    import re

    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = _chromium()
    if chromium is None:
        if os.environ.get("DMP_REQUIRE_BROWSER"):
            pytest.fail("DMP_REQUIRE_BROWSER is set but /usr/bin/chromium is missing")
        pytest.skip("no Chromium: install Debian's chromium package (.ci/install-browser)")
    from dmp.linear_model import Lasso

    X, y = make_problem(n=200, p=400, seed=9)
    # rounds slowed down while the page is watched (its status must find the fit running);
    # once the page has been checked the rest of the 400 run at full speed
    watched = threading.Event()

    def slow_while_watched(round, rec):
        if not watched.is_set():
            time.sleep(0.03)
        return False

    est = Lasso(alpha=0.05 * alpha_max(X, y), random_state=0, tol=0, max_iter=400,
                n_workers=2, callback=slow_while_watched)
    errors = []

    def fit():
        try:
            est.fit(X, y)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    assert ensure_monitor(dask_client)   # /dmp exists before the page is opened
    worker = threading.Thread(target=fit)
    worker.start()
    artifacts = os.environ.get("DMP_TEST_ARTIFACTS",
                               os.path.join(os.path.dirname(__file__), "..", "test-artifacts"))
    os.makedirs(artifacts, exist_ok=True)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync"])
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 1700})
                messages = []
                page.on("console", lambda m: messages.append((m.type, m.text)))
                page.goto(_base(dask_client) + "/dmp")
                status = page.get_by_text(re.compile(r"round \d+ / 400"))
                status.first.wait_for(timeout=60_000)
                first = int(re.search(r"round (\d+)", status.first.text_content()).group(1))
                page.locator("canvas").first.wait_for(timeout=30_000)
                deadline = time.monotonic() + 30
                later = first
                while later <= first and time.monotonic() < deadline:
                    page.wait_for_timeout(500)
                    text = page.get_by_text(re.compile(r"round \d+ / 400")).first.text_content()
                    later = int(re.search(r"round (\d+)", text).group(1))
                page.screenshot(path=os.path.join(artifacts, "dmp-dashboard.png"),
                                full_page=True)
                assert later > first, "the page did not update while the fit ran"
                assert "objective" in text and "Lasso" in text
                assert page.locator("canvas").count() >= 6
                # the rounds streamed while the fit runs draw in every panel
                assert not _undrawn(page.evaluate(_GLYPHS_JS))
                assert not _bokeh_problems(messages), _bokeh_problems(messages)
            finally:
                browser.close()
    finally:
        watched.set()
        worker.join(timeout=120)
    assert not errors
    assert len(est.history_["round"]) == 400


@pytest.mark.dask
def test_workers_holding_partitions_are_not_retired(dask_client):
    """Downscaling (adaptive, the operator's DaskAutoscaler, retire_workers(n=...)) never picks
    a worker that holds a partition while a fit runs; afterwards it may (on the session's
    cluster: nothing an earlier fit left behind keeps a worker either)."""
    from dmp.linear_model import Lasso

    def closable(dask_scheduler):
        return dask_scheduler.workers_to_close(n=2)

    seen = []
    X, y = make_problem(n=150, p=300, seed=11)
    client = dask_client

    def during(round, rec):
        if round == 3:
            seen.append(client.run_on_scheduler(closable))
        return False

    Lasso(alpha=0.05 * alpha_max(X, y), n_workers=2, tol=0, max_iter=8,
          callback=during).fit(X, y)
    assert seen == [[]]
    deadline = time.monotonic() + 20
    after = []
    while len(after) < 2 and time.monotonic() < deadline:
        after = client.run_on_scheduler(closable)
        time.sleep(0.2)
    assert len(after) == 2
