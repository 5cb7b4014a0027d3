#!/usr/bin/env python
"""Independent sparsification benchmark: the shape of "99% of distributed optimization is a
waste of time" (Mishchenko, Hanzely, Richtarik; docs/algorithms.md, "Independent
sparsification") with dmp's
``SparsifiedSGDRegressor`` / ``SparsifiedSGDClassifier``.

Run from the repository root with the project's environment active::

    python benchmarks/sparsification.py              # everything, about 7 min on 2 cores
    python benchmarks/sparsification.py --quick      # smoke test, about a minute
    python benchmarks/sparsification.py --problems breast_cancer --no-dask
    python benchmarks/sparsification.py --heterogeneous   # issue 27 grid, about 8 min
    python benchmarks/sparsification.py --null-space      # issue 27 collinear-feature tail, 10 s

It prints one table per problem, a summary with PASS/MISS per target and the Dask byte check,
and writes a JSON file (default ``benchmarks/results/sparsification.json``, with
``--quick`` ``sparsification-quick.json``).

Problems (n workers simulated by the local backend, contiguous row split, exact local
gradients, ``tol=None``):

1. ``ridge``: squared loss, ``penalty="l2"``, ``fit_intercept=False``, N=2,000, d=500,
   ``n_blocks=500`` (single coordinates), in the paper's "parallel" setting: identical
   f_i = f (every worker holds the same N rows, so L_i = L).
   X is a sparse Gaussian design (density ``--ridge-density``, default 0.05; 1.0 gives a
   dense one) with columns scaled by ``logspace(0, -1, d) / sqrt(density)``, so
   ``X^T X / N`` has eigenvalues spread over about two decades; alpha = 3e-3.
   ``y = X w + noise`` with unit signal and noise variance.  F* from the closed form.
2. ``breast_cancer``: logistic loss on scikit-learn's breast-cancer data, standardised, rows
   sorted by feature 0 (heterogeneous split), alpha = 1e-2, ``fit_intercept=True``
   (31 single-coordinate blocks).  F* by ``dmp.linear_model._reference.lbfgs_optimum``.
3. ``classification``: logistic loss on ``make_classification(n_samples=20000,
   n_features=200, n_informative=20, n_redundant=0, random_state=0)``, standardised, rows sorted by the feature most
   correlated with y (an informative or redundant one), alpha = 1e-3, intercept (201 blocks).
   F* by L-BFGS.

For every problem, n in {10, 20, 100} and tau in {1, m/(2n), m/n, 2m/n, m} (each
``max(1, round(.))``, deduplicated; the actual tau is reported), method ``isega``; plus
``isgd`` at tau = m/n (step rule (a)) to show the noise floor of heterogeneous splits.  Step
rules, the same for every tau: (a) ``step_size = 1/L`` with L the exact smoothness of the
objective, ``c * lambda_max([X 1]^T [X 1] / N) + alpha`` (c = 1 squared, 1/4 logistic;
no ones column without an intercept), computed with numpy; (b) ``step_size="auto"``
(dmp's rule from the workers' local smoothness constants; docs/algorithms.md, "Step rule as
implemented").

Per run: iterations to reach relative suboptimality ``(F - F*) / |F*| <= 1e-6`` and blocks
uploaded to get there.  ``history_["objective"][t]`` is F at the point the workers used in
round t (round 0: the starting point; round t >= 1: x^(t-1)), so the iterate x^(t-1) first
meets the target at the first such t, after ``t - 1`` iterations, and the blocks uploaded to
produce it are the uploads of rounds 1 .. t-1 (``sum(history_["blocks_uploaded"][:t])``,
``= (t - 1) n tau``).  A run stops at the round that meets the target (a callback; the
iterations to target are unaffected, the final suboptimality is then the value at the
target), when its suboptimality grows 1e4-fold over the start (reported as diverged), or at
its iteration cap.  Caps: ``max_iter`` of the problem (ridge 4000, breast cancer 6000,
classification 3000) for tau >= m/n; for tau < m/n ``min(max_iter, 3 x the iterations
tau = m/n needed)``, at most ``small_cap`` (classification: 600); for isgd also at most
``isgd_cap`` (2000; classification 600), enough to show its floor.  A run that has not
reached the target by its cap is reported as not reached (``None``).

Summary per (problem, n, rule): ``iters(tau=m/n) / iters(tau=m)`` (target <= 1.5) and
``blocks(tau=m) / blocks(tau=m/n)`` to reach 1e-6 (target >= 0.6 n).  A target that cannot
be met by construction (m < n: at tau = 1 every worker already uploads more than m/n blocks)
is flagged.

Reductions to fit about 8 minutes on 2 shared cores (printed and stored in the JSON under
``skipped``): step rule (b) only for ridge n = 10 and breast cancer (the auto step shrinks
with sum_i w_i L_i, up to 8x below 1/L for ridge at n = 100, so those runs are long);
classification (18 ms a round) without n = 100 and rule (b), and its tau < m/n and isgd
runs capped at 600 iterations.

4. A real Dask run (``distributed.LocalCluster(n_workers=2, threads_per_worker=1,
   processes=True)``) of the breast-cancer problem with tau = m/n, step 1/L: the program
   and ``DaskBackend`` are built as ``_SparsifiedBase._fit`` builds them, from a Zarr row
   store (``dmp.io.write_sparse_rows(..., n_shards=2)``), with a ``SparsifiedProgram``
   subclass whose ``pull`` serialises every partial with
   ``distributed.protocol.serialize.serialize_bytelist`` (the frames distributed makes of an
   object: prelude, msgpack header, one frame per array; compression is off by default)
   and, for the whole message, with ``distributed.protocol.dumps`` of the actor reply
   ``{"status": "OK", "result": to_serialize({"partial", "push_s", "round"})}`` plus the TCP
   comm's framing (8-byte length and frame prelude).
   Reported: the counted ``history_["upload_bytes"]``, the serialised bytes, their ratio
   and the per-message overhead (serialised - counted), and the max abs coefficient
   difference to the local backend with the same seed and 2 workers (same store, and the
   in-memory estimator).

Every fit runs under ``threadpoolctl.threadpool_limits(1)``; Numba is warmed up first.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from dmp.linear_model import SparsifiedSGDClassifier, SparsifiedSGDRegressor
from dmp.linear_model._reference import lbfgs_optimum

TARGET = 1e-6  # relative suboptimality
WORKERS = (10, 20, 100)
DIVERGE = 1e4  # suboptimality growth over the start that counts as divergence
SMALL_TAU_CAP = 3  # cap of tau < m/n and isgd runs, in iterations of tau = m/n
RULES = ("1/L", "auto")
SEED = 0
CURVE_POINTS = 120  # suboptimality samples per run stored in the JSON

PROBLEMS = {
    # identical f_i: the basic method (ISGD with exact local gradients = the independent
    # parallel block CD of the paper's v1); ISEGA at tau = m/n for comparison
    "ridge": dict(title="ridge, identical f_i, N=2000 d=500, m=500", max_iter=4000,
                  workers=WORKERS, rule_b_workers=(10,), small_cap=None, isgd_cap=2000,
                  method="isgd"),
    "breast_cancer": dict(title="logistic, breast cancer (sorted), m=31", max_iter=6000,
                          workers=WORKERS, rule_b_workers=WORKERS, small_cap=None,
                          isgd_cap=2000, method="isega"),
    "classification": dict(title="logistic, make_classification 20000x200 (sorted), m=201",
                           max_iter=3000, workers=(10, 20), rule_b_workers=(),
                           small_cap=600, isgd_cap=600, method="isega"),
}
QUICK = {"ridge": dict(max_iter=1500, workers=(10,), rule_b_workers=()),
         "breast_cancer": dict(max_iter=3000, workers=(10,), rule_b_workers=(10,)),
         "classification": dict(max_iter=300, workers=(10,), rule_b_workers=(),
                                small_cap=100, isgd_cap=100)}
DASK_ITERS = 300


# ----------------------------------------------------------------------------- helpers
def fmt(x, spec=".3g", none="-"):
    return none if x is None else format(x, spec)


def machine_info():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True,
                                   timeout=10).stdout.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        nproc = None
    versions = {"python": platform.python_version()}
    for mod in ("numpy", "scipy", "sklearn", "numba", "dask", "distributed", "zarr",
                "threadpoolctl", "dmp"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as exc:  # reported, not fatal
            versions[mod] = f"unavailable ({type(exc).__name__})"
    try:
        repo = Path(__file__).resolve().parent.parent
        git = ["git", "-C", str(repo)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "dmp"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        versions["dmp_commit"] = f"{commit}{' (dmp/ modified)' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        versions["dmp_commit"] = None
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu,
            "nproc": nproc, "cores": os.cpu_count(),
            "cores_usable": len(os.sched_getaffinity(0)), "loadavg": os.getloadavg(),
            "platform": platform.platform(), "versions": versions}


def taus_for(m, n):
    """{label: tau} for tau in {1, m/(2n), m/n, 2m/n, m}; labels of equal taus are joined."""
    raw = [("1", 1.0), ("m/(2n)", m / (2 * n)), ("m/n", m / n), ("2m/n", 2 * m / n),
           ("m", float(m))]
    out = {}
    for label, v in raw:
        tau = min(m, max(1, int(round(v))))
        out.setdefault(tau, []).append(label)
    return {tau: "=".join(labels) for tau, labels in sorted(out.items())}


def exact_L(X, loss, alpha, fit_intercept):
    """``c * lambda_max([X 1]^T [X 1] / N) + alpha`` with numpy (dense eigvalsh), and the
    number of null directions of ``[X 1]`` (eigenvalues below 1e-10 lambda_max)."""
    Z = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    if fit_intercept:
        Z = np.hstack([Z, np.ones((Z.shape[0], 1))])
    c = 1.0 if loss == "squared_error" else 0.25
    ev = np.linalg.eigvalsh(Z.T @ Z / Z.shape[0])
    return c * float(ev[-1]) + alpha, int(np.sum(ev < 1e-10 * ev[-1]))


# ----------------------------------------------------------------------------- problems
def make_ridge(density):
    rng = np.random.default_rng(SEED)
    N, d, alpha = 2000, 500, 3e-3
    scale = np.logspace(0, -1, d) / math.sqrt(density)
    if density >= 1.0:
        X = sp.csr_matrix(rng.standard_normal((N, d)) * scale)
    else:
        S = sp.random(N, d, density=density, format="csr", random_state=SEED,
                      data_rvs=rng.standard_normal)
        X = (S @ sp.diags(scale)).tocsr()
    w = rng.standard_normal(d)
    w /= math.sqrt(np.mean(np.asarray(X @ w) ** 2))  # unit signal variance
    y = np.asarray(X @ w).ravel() + rng.standard_normal(N)
    H = (X.T @ X).toarray() / N + alpha * np.eye(d)
    v = np.linalg.solve(H, np.asarray(X.T @ y).ravel() / N)
    r = y - X @ v
    fstar = 0.5 * float(r @ r) / N + 0.5 * alpha * float(v @ v)
    ev = np.linalg.eigvalsh(H)
    L, null = exact_L(X, "squared_error", alpha, False)
    # the paper's "parallel" setting: identical f_i = f (every worker holds the same rows),
    # so L_i = L; the objective of the stacked data equals that of X
    return dict(X=X, y=y, loss="squared_error", alpha=alpha, fit_intercept=False, m=d,
                fstar=fstar, kappa=float(ev[-1] / ev[0]), L=L, null_dims=null,
                replicate=True,
                note=(f"sparse Gaussian design, density {density}, nnz {X.nnz}"
                      if density < 1.0 else "dense Gaussian design")
                + "; identical f_i (each worker holds all rows)")


def make_breast_cancer():
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    order = np.argsort(X[:, 0], kind="stable")
    X, y = X[order], y[order]
    alpha = 1e-2
    fstar = lbfgs_optimum(X, y, loss="log_loss", alpha=alpha)[0]
    L, null = exact_L(X, "log_loss", alpha, True)
    return dict(X=X, y=y, loss="log_loss", alpha=alpha, fit_intercept=True, m=31,
                fstar=fstar, L=L, null_dims=null,
                note="standardised, sorted by feature 0")


def make_classification_problem():
    from sklearn.datasets import make_classification
    from sklearn.preprocessing import StandardScaler

    # no redundant (exactly collinear) features: with them the full-gradient iterates stay
    # in the row space and tau = m finishes in a few dozen iterations (see BENCHMARKS.md)
    X, y = make_classification(n_samples=20000, n_features=200, n_informative=20,
                               n_redundant=0, random_state=0)
    X = StandardScaler().fit_transform(X)
    corr = np.abs(X.T @ (y - y.mean())) / len(y) / y.std()
    j = int(np.argmax(corr))
    order = np.argsort(X[:, j], kind="stable")
    X, y = X[order], y[order]
    alpha = 1e-3
    fstar = lbfgs_optimum(X, y, loss="log_loss", alpha=alpha)[0]
    L, null = exact_L(X, "log_loss", alpha, True)
    return dict(X=X, y=y, loss="log_loss", alpha=alpha, fit_intercept=True, m=201,
                fstar=fstar, L=L, null_dims=null,
                note=f"standardised, sorted by feature {j} (|corr with y| = {corr[j]:.3f})")


# ----------------------------------------------------------------------------- fits
def estimator(prob, **kw):
    cls = SparsifiedSGDRegressor if prob["loss"] == "squared_error" else SparsifiedSGDClassifier
    return cls(penalty="l2", alpha=prob["alpha"], fit_intercept=prob["fit_intercept"],
               n_blocks=prob["m"], tol=None, backend="local", random_state=SEED, **kw)


def first_hit(subopt):
    hit = np.flatnonzero(subopt <= TARGET)
    return int(hit[0]) if len(hit) else None


def curve(subopt):
    """Suboptimality at up to CURVE_POINTS rounds (log-spaced, plus the last one)."""
    T = len(subopt)
    idx = np.unique(np.concatenate([np.geomspace(1, T, CURVE_POINTS).astype(int) - 1,
                                    [T - 1]]))
    return {"round": idx.tolist(), "subopt": [float(subopt[i]) for i in idx]}


def run_one(prob, n, tau, method, rule, max_iter):
    """One fit; the callback stops it at the target or on divergence."""
    fstar = prob["fstar"]
    state = {"start": None, "why": None}

    def callback(r, rec):
        s = (rec["objective"] - fstar) / abs(fstar)
        if r == 0:
            state["start"] = s
        if not math.isfinite(s) or (state["start"] is not None
                                    and s > DIVERGE * max(state["start"], TARGET)):
            state["why"] = "diverged"
            return True
        if s <= TARGET:
            state["why"] = "stopped at target"
            return True
        return False

    step = 1.0 / prob["L"] if rule == "1/L" else "auto"
    est = estimator(prob, method=method, blocks_per_worker=tau, step_size=step,
                    max_iter=max_iter, n_workers=n, callback=callback)
    status = None
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        try:
            if prob.get("replicate"):
                est.fit(sp.vstack([prob["X"]] * n, format="csr"), np.tile(prob["y"], n))
            else:
                est.fit(prob["X"], prob["y"])
        except FloatingPointError:
            status = "diverged (inf)"
        wall = time.perf_counter() - t0
    h = est.history_
    f = np.asarray(h["objective"], dtype=float)
    subopt = (f - fstar) / abs(fstar)
    t = first_hit(subopt)
    blocks = np.asarray(h["blocks_uploaded"], dtype=np.int64)
    finite = subopt[np.isfinite(subopt)]
    rounds = len(f) - 1
    if status is None:
        status = state["why"] or ("not reached" if t is None else "ok")
    return {
        "n": n, "tau": int(est.blocks_per_worker_), "method": method, "rule": rule,
        "step": float(est.step_size_), "L_used": float(est.lipschitz_),
        "iters": None if t is None else t - 1,
        "blocks": None if t is None else int(blocks[:t].sum()),
        "final_subopt": float(finite[-1]) if len(finite) else None,
        "min_subopt": float(finite.min()) if len(finite) else None,
        "rounds": rounds, "max_iter": max_iter, "wall_s": wall,
        "ms_per_round": 1000 * float(h["time"][-1] - h["time"][0]) / max(rounds, 1),
        "status": status, "curve": curve(subopt),
    }


def warm_up():
    """Compile the Numba kernels (every path the runs take) on a tiny problem."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((60, 9))
    y = rng.standard_normal(60)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")
        for method in ("isega", "isgd"):
            for tau in (2, "all"):
                SparsifiedSGDRegressor(method=method, n_blocks=5, blocks_per_worker=tau,
                                       max_iter=3, tol=None, n_workers=3,
                                       backend="local").fit(X, y)
                SparsifiedSGDClassifier(method=method, n_blocks=5, blocks_per_worker=tau,
                                        max_iter=3, tol=None, n_workers=3,
                                        backend="local").fit(X, y > 0)


def small_cap(spec, ref_iters):
    """Iteration cap of the tau < m/n and isgd runs."""
    cap = spec["max_iter"]
    if ref_iters is not None:
        cap = min(cap, max(SMALL_TAU_CAP * ref_iters, 10))
    if spec.get("small_cap"):
        cap = min(cap, spec["small_cap"])
    return cap


def bench_problem(key, prob, spec, out_rows, log):
    m = prob["m"]
    for n in spec["workers"]:
        taus = taus_for(m, n)
        inv = {lab: tau for tau, labels in taus.items() for lab in labels.split("=")}
        for rule in RULES:
            if rule == "auto" and n not in spec["rule_b_workers"]:
                continue
            done = {}
            # tau = m and m/n first: they set the cap of the smaller taus
            order = [inv["m"], inv["m/n"], inv["2m/n"], inv["m/(2n)"], inv["1"]]
            for tau in dict.fromkeys(order):
                cap = spec["max_iter"]
                if tau < inv["m/n"]:
                    cap = small_cap(spec, done[inv["m/n"]]["iters"])
                row = run_one(prob, n, tau, spec["method"], rule, cap)
                row.update(problem=key, tau_label=taus[tau])
                done[tau] = row
                out_rows.append(row)
                log(row)
            if rule == "1/L":
                cap = min(small_cap(spec, done[inv["m/n"]]["iters"]), spec["isgd_cap"])
                other = "isega" if spec["method"] == "isgd" else "isgd"
                row = run_one(prob, n, inv["m/n"], other, rule, cap)
                row.update(problem=key, tau_label=taus[inv["m/n"]])
                out_rows.append(row)
                log(row)


def summarize(key, prob, rows, spec):
    m = prob["m"]
    out = []
    for n in spec["workers"]:
        taus = taus_for(m, n)
        inv = {lab: tau for tau, labels in taus.items() for lab in labels.split("=")}
        for rule in RULES:
            sel = {r["tau"]: r for r in rows if r["problem"] == key and r["n"] == n
                   and r["rule"] == rule and r["method"] == spec["method"]}
            if not sel:
                continue
            a, b = sel.get(inv["m/n"]), sel.get(inv["m"])
            ia, ib = (a or {}).get("iters"), (b or {}).get("iters")
            ba, bb = (a or {}).get("blocks"), (b or {}).get("blocks")
            it_ratio = ia / ib if ia is not None and ib else None
            bl_ratio = bb / ba if ba and bb is not None else None
            note = []
            if m < n:
                note.append(f"m={m} < n: tau=m/n rounds up to 1, blocks ratio at most "
                            f"m/tau={m}, target {0.6 * n:g} unattainable")
            if prob["null_dims"] and ia is not None and ib is not None and ia > 1.5 * ib:
                note.append(f"[X 1] has {prob['null_dims']} null directions (redundant "
                            f"features): full-gradient steps from 0 never leave the row "
                            f"space, sparsified ones do, and there only alpha contracts")
            if ia is None or ib is None:
                note.append("target not reached by " + " and ".join(
                    lab for lab, v in (("tau=m/n", ia), ("tau=m", ib)) if v is None))
            out.append({
                "problem": key, "n": n, "rule": rule, "tau_mn": inv["m/n"], "m": m,
                "iters_mn": ia, "iters_m": ib, "iters_ratio": it_ratio,
                "iters_pass": it_ratio is not None and it_ratio <= 1.5,
                "blocks_mn": ba, "blocks_m": bb, "blocks_ratio": bl_ratio,
                "blocks_target": 0.6 * n,
                "blocks_pass": bl_ratio is not None and bl_ratio >= 0.6 * n,
                "note": "; ".join(note),
            })
    return out


def print_header(key, prob):
    print(f"\n=== {key}: {PROBLEMS[key]['title']} ===")
    extra = f", kappa {prob['kappa']:.1f}" if "kappa" in prob else ""
    print(f"N={prob['X'].shape[0]} d={prob['X'].shape[1]} m={prob['m']} "
          f"loss={prob['loss']} alpha={prob['alpha']:g} fit_intercept={prob['fit_intercept']}; "
          f"{prob['note']}; F*={prob['fstar']:.12g}; exact L={prob['L']:.6g}{extra}; "
          f"null directions of the design: {prob['null_dims']}",
          flush=True)
    print(f"{'n':>4} {'tau':>5} {'tau=':<18}{'method':<7}{'rule':<6}{'step':>9}"
          f"{'iters':>7}{'blocks':>11}{'final':>10}{'rounds':>7}{'wall s':>8}"
          f"{'ms/rd':>7}  status", flush=True)


def print_row(r):
    print(f"{r['n']:>4} {r['tau']:>5} {r['tau_label']:<18}{r['method']:<7}{r['rule']:<6}"
          f"{r['step']:>9.3g}{fmt(r['iters'], 'd'):>7}{fmt(r['blocks'], 'd'):>11}"
          f"{fmt(r['final_subopt'], '.1e'):>10}{r['rounds']:>7}{r['wall_s']:>8.1f}"
          f"{r['ms_per_round']:>7.1f}  {r['status']}"
          + (f" (cap {r['max_iter']})" if r["status"] == "not reached" else ""), flush=True)


def print_summary(summary):
    print("\n=== Summary: isgd for ridge (identical f_i), isega for the heterogeneous "
          "logistic problems; tau = m/n against tau = m, to rel. suboptimality "
          f"{TARGET:g} ===")
    print(f"{'problem':<15}{'n':>4}{'rule':>6}{'tau':>5}{'it m/n':>8}{'it m':>7}"
          f"{'it ratio':>9}{'<=1.5':>6}{'blk m/n':>10}{'blk m':>10}{'blk ratio':>10}"
          f"{'>=0.6n':>8}  note")
    print("it ratio = iters(tau=m/n) / iters(tau=m); blk ratio = blocks(tau=m) / "
          "blocks(tau=m/n); '-' = target not reached (diverged or capped)")
    for s in summary:
        print(f"{s['problem']:<15}{s['n']:>4}{s['rule']:>6}{s['tau_mn']:>5}"
              f"{fmt(s['iters_mn'], 'd'):>8}{fmt(s['iters_m'], 'd'):>7}"
              f"{fmt(s['iters_ratio'], '.3f'):>9}{'PASS' if s['iters_pass'] else 'MISS':>6}"
              f"{fmt(s['blocks_mn'], 'd'):>10}{fmt(s['blocks_m'], 'd'):>10}"
              f"{fmt(s['blocks_ratio'], '.1f'):>10}"
              f"{('PASS' if s['blocks_pass'] else 'MISS'):>8}  {s['note']}")


# ----------------------------------------------------------------------------- Dask
def dask_check(prob, seed=SEED, n=2):
    """Counted against serialised upload bytes on a real 2-process LocalCluster."""
    from distributed import Client, LocalCluster
    from distributed.protocol import dumps, to_serialize
    from distributed.protocol.serialize import serialize_bytelist
    from distributed.protocol.utils import pack_frames_prelude

    from dmp.engine import run
    from dmp.engine.backends.dask import DaskBackend
    from dmp.engine.backends.local import LocalBackend
    from dmp.engine.runner import history_arrays
    from dmp.io import write_sparse_rows
    from dmp.linear_model._sparsified_program import SparsifiedProgram

    def nbytes(frames):
        return sum(memoryview(f).nbytes for f in frames)

    def wire(frames):
        """What distributed's TCP comm writes for these frames: an 8-byte length, the
        frame-count-and-lengths prelude, the frames."""
        return 8 + len(pack_frames_prelude(frames)) + nbytes(frames)

    class MeasuredProgram(SparsifiedProgram):
        """Records the serialised size of every partial the driver receives."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.serialized = []  # per round >= 1: [bytes per worker]
            self.messages = []

        def pull(self, round, partials):
            if round > 0:
                self.serialized.append([nbytes(serialize_bytelist(p)) for p in partials])
                self.messages.append([
                    wire(dumps({"status": "OK", "result": to_serialize(
                        {"partial": p, "push_s": 0.0, "round": round})}))
                    for p in partials])
            return super().pull(round, partials)

    m = prob["m"]
    tau = max(1, int(round(m / n)))
    X, y = prob["X"], prob["y"]
    params = dict(loss="log_loss", labels=(0.0, 1.0), method="isega", alpha=prob["alpha"],
                  l1_ratio=0.0, fit_intercept=True, n_blocks=m, tau=tau, batch_size=None,
                  step_size=1.0 / prob["L"], momentum="auto", tol=None, n_iter_no_change=10,
                  eval_every=1, seed=seed)
    tmp = tempfile.mkdtemp(prefix="dmp-bench-sparsified-")
    out = {"n_workers": n, "m": m, "tau": tau, "iterations": DASK_ITERS, "seed": seed,
           "step": 1.0 / prob["L"]}
    try:
        ds = write_sparse_rows(os.path.join(tmp, "bc.zarr"), X, y.astype(np.float64),
                               n_shards=n)
        t0 = time.perf_counter()
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                          dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
                Client(cluster) as client:
            out["cluster_start_s"] = time.perf_counter() - t0
            prog = MeasuredProgram(ds, **params)
            backend = DaskBackend(client, n_workers=n)
            try:
                t0 = time.perf_counter()
                res = run(prog, backend, max_iter=DASK_ITERS + 1)
                out["dask_wall_s"] = time.perf_counter() - t0
            finally:
                backend.close()
        h = history_arrays(res.history)
        counted = np.asarray(h["upload_bytes"][1:], dtype=np.int64)  # rounds x workers
        ser = np.asarray(prog.serialized, dtype=np.int64)
        msg = np.asarray(prog.messages, dtype=np.int64)
        over, over_msg = ser - counted, msg - counted
        out.update(
            rounds=int(counted.shape[0]),
            counted_bytes_per_message=sorted(set(counted.ravel().tolist())),
            serialized_bytes_per_message=sorted(set(ser.ravel().tolist())),
            actor_reply_bytes_per_message=sorted(set(msg.ravel().tolist())),
            counted_total=int(counted.sum()), serialized_total=int(ser.sum()),
            actor_reply_total=int(msg.sum()),
            ratio_serialized_to_counted=float(ser.sum() / counted.sum()),
            ratio_reply_to_counted=float(msg.sum() / counted.sum()),
            overhead_per_message=sorted(set(over.ravel().tolist())),
            reply_overhead_per_message=sorted(set(over_msg.ravel().tolist())),
            bytes_push_equals_counted=bool(np.array_equal(
                np.asarray(h["bytes_push"][1:], dtype=np.int64), counted.sum(axis=1))),
            final_objective=float(prog.driver["objective"]),
            final_subopt=float((prog.driver["objective"] - prob["fstar"]) / prob["fstar"]),
        )
        # the overhead for other upload sizes (same message layout, synthetic partials)
        from dmp.linear_model._sparsified_program import _upload_bytes

        sizes = {}
        for t in sorted({1, tau, m}):
            p = {"blocks": None if t == m else np.arange(t, dtype=np.int32),
                 "values": np.zeros(t), "loss": 0.5}
            c, b = _upload_bytes(p), nbytes(serialize_bytelist(p))
            sizes[str(t)] = {"counted": c, "serialized": b, "overhead": b - c}
        out["overhead_by_tau"] = sizes
        x_dask = prog.driver["x"].copy()
        # the same program on the local backend, same store, seed and worker count
        local = SparsifiedProgram(ds, **params)
        backend = LocalBackend(n)
        try:
            run(local, backend, max_iter=DASK_ITERS + 1)
        finally:
            backend.close()
        out["max_abs_diff_local_same_store"] = float(np.abs(local.driver["x"] - x_dask).max())
        # and the estimator with in-memory data (the estimators' local path)
        with warnings.catch_warnings(), threadpool_limits(1):
            warnings.simplefilter("ignore")
            est = estimator(prob, method="isega", blocks_per_worker=tau,
                            step_size=1.0 / prob["L"], max_iter=DASK_ITERS, n_workers=n)
            est.fit(X, y)
        x_est = np.append(est.coef_.ravel(), est.intercept_)
        out["max_abs_diff_local_estimator"] = float(np.abs(x_est - x_dask).max())
        out["max_abs_coef"] = float(np.abs(x_dask).max())
        out["status"] = "ok"
    except Exception as exc:  # reported, not fatal
        out["status"] = f"failed: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def print_dask(d):
    print("\n=== Dask LocalCluster (2 processes): breast cancer, isega, tau = m/n ===")
    if d.get("status") != "ok":
        print(d.get("status"))
        return
    print(f"m={d['m']} tau={d['tau']} rounds={d['rounds']} wall {d['dask_wall_s']:.1f} s "
          f"(cluster start {d['cluster_start_s']:.1f} s); final subopt "
          f"{d['final_subopt']:.2e}")
    print(f"per upload message: counted {d['counted_bytes_per_message']} B, serialised "
          f"(serialize_bytelist) {d['serialized_bytes_per_message']} B, whole actor reply on "
          f"the wire (protocol.dumps + TCP framing) {d['actor_reply_bytes_per_message']} B")
    print(f"totals: counted {d['counted_total']} B, serialised {d['serialized_total']} B "
          f"(ratio {d['ratio_serialized_to_counted']:.3f}), actor replies "
          f"{d['actor_reply_total']} B (ratio {d['ratio_reply_to_counted']:.3f})")
    print(f"overhead per message: serialised - counted = {d['overhead_per_message']} B; "
          f"reply - counted = {d['reply_overhead_per_message']} B; "
          f"history bytes_push == sum of upload_bytes: {d['bytes_push_equals_counted']}")
    print("synthetic partials (tau: counted / serialised / overhead B): " + ", ".join(
        f"{t}: {v['counted']} / {v['serialized']} / {v['overhead']}"
        for t, v in d["overhead_by_tau"].items()))
    print(f"max |x_dask - x_local| : same store {d['max_abs_diff_local_same_store']:.3g}, "
          f"in-memory estimator {d['max_abs_diff_local_estimator']:.3g} "
          f"(max |x| = {d['max_abs_coef']:.3g})")


# ----------------------------------------------------------------------------- issue 27
HET_TARGETS = (1e-4, 1e-6, 1e-8)
HET_DATASETS = ("synthetic_logistic", "breast_cancer", "digits", "wine", "diabetes",
                "synthetic_squares")
HET_SPLITS = ("feature", "label", "random")


def het_data(name):
    """(X standardised, y, loss, alpha) of the heterogeneous-split study (issue 27)."""
    from sklearn import datasets as D
    from sklearn.preprocessing import StandardScaler

    if name == "synthetic_logistic":
        X, y = D.make_classification(n_samples=6000, n_features=60, n_redundant=0,
                                     random_state=0)
        loss, alpha = "log_loss", 1e-3
    elif name == "breast_cancer":
        X, y = D.load_breast_cancer(return_X_y=True)
        loss, alpha = "log_loss", 1e-2
    elif name == "digits":
        X, y = D.load_digits(return_X_y=True)
        y, loss, alpha = (y >= 5).astype(int), "log_loss", 1e-2
    elif name == "wine":
        X, y = D.load_wine(return_X_y=True)
        y, loss, alpha = (y == 0).astype(int), "log_loss", 1e-2
    elif name == "diabetes":
        X, y = D.load_diabetes(return_X_y=True)
        y, loss, alpha = (y - y.mean()) / y.std(), "squared_error", 1e-3
    elif name == "synthetic_squares":
        X, y = D.make_regression(n_samples=4000, n_features=60, noise=10, random_state=0)
        y, loss, alpha = y / y.std(), "squared_error", 1e-3
    else:
        raise ValueError(f"unknown data set {name!r}")
    return StandardScaler().fit_transform(X), np.asarray(y, dtype=np.float64), loss, alpha


def het_order(X, y, split):
    """Row order of a split: sorted by the feature most correlated with y, by y, random."""
    if split == "feature":
        c = np.abs((X - X.mean(0)).T @ (y - y.mean()))
        return np.argsort(X[:, int(np.argmax(c))], kind="stable")
    if split == "label":
        return np.argsort(y, kind="stable")
    return np.random.default_rng(SEED).permutation(len(y))


def het_fit(X, y, loss, alpha, fstar, n, tau, max_iter, tol=None):
    """One fit with the default (auto) step; with tol=None it stops at the last target."""
    cls = SparsifiedSGDRegressor if loss == "squared_error" else SparsifiedSGDClassifier

    def callback(r, rec):
        return tol is None and (rec["objective"] - fstar) / abs(fstar) <= HET_TARGETS[-1]

    est = cls(alpha=alpha, n_workers=n, blocks_per_worker=tau, max_iter=max_iter, tol=tol,
              backend="local", random_state=SEED, callback=callback)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")
        est.fit(X, y)
    s = (np.asarray(est.history_["objective"], dtype=float) - fstar) / abs(fstar)
    hits = []
    for t in HET_TARGETS:
        k = np.flatnonzero(s <= t)
        hits.append(int(k[0]) - 1 if len(k) else None)
    return est, hits, float((est.objective_ - fstar) / abs(fstar))


def heterogeneous_study(datasets, workers, max_iter, log=print):
    """ISEGA at tau = m/n against the dense method (tau = m), both with the default auto
    step, on heterogeneous splits: iterations to each target and, with the default tol,
    the final suboptimalities."""
    rows = []
    log(f"ISEGA at tau=m/n vs dense (tau=m), step auto, tol=None, cap {max_iter}; "
        f"ratio target <= 2 at {HET_TARGETS}")
    log(f"{'data':18s} {'split':7s} {'n':>4s} {'tau/m':>6s}  dense iters     isega iters"
        f"       ratios          default-tol final (dense / isega)")
    for name in datasets:
        X0, y0, loss, alpha = het_data(name)
        fstar = lbfgs_optimum(X0, y0, loss=loss, alpha=alpha)[0]
        for split in HET_SPLITS:
            o = het_order(X0, y0, split)
            X, y = X0[o], y0[o]
            for n in workers:
                if n > len(y):
                    continue
                t0 = time.perf_counter()
                dense, hd, _ = het_fit(X, y, loss, alpha, fstar, n, "all", max_iter)
                sparse, hs, _ = het_fit(X, y, loss, alpha, fstar, n, "auto", max_iter)
                _, _, fd = het_fit(X, y, loss, alpha, fstar, n, "all", max_iter, tol=1e-6)
                _, _, fs = het_fit(X, y, loss, alpha, fstar, n, "auto", max_iter, tol=1e-6)
                ratio = [None if a is None or b is None else b / max(a, 1)
                         for a, b in zip(hd, hs)]
                ok = all(r is not None and r <= 2 for r in ratio)
                row = {"data": name, "split": split, "n": n, "m": int(sparse.n_blocks_),
                       "tau": int(sparse.blocks_per_worker_), "dense_iters": hd,
                       "isega_iters": hs, "ratio": ratio, "pass": ok,
                       "step_dense": float(dense.step_size_),
                       "step_isega": float(sparse.step_size_),
                       "default_tol_final": [fd, fs], "wall_s": time.perf_counter() - t0}
                rows.append(row)
                log(f"{name:18s} {split:7s} {n:4d} {row['tau']:>2d}/{row['m']:<3d}  "
                    f"{str(hd):15s} {str(hs):17s} "
                    f"{' '.join(fmt(r, '.2f') for r in ratio):16s} "
                    f"{fd:.1e} / {fs:.1e}  {'PASS' if ok else 'MISS'}", flush=True)
    return rows


def null_space_tail(max_iter=3000, log=print):
    """The slow tail on exactly collinear features (issue 27): ISEGA at tau = m/n on
    ``make_classification(6000, 60)`` (2 redundant features), sorted by feature 0, n = 10,
    alpha 1e-3.  Reports the tail's contraction per iteration against 1 - 2 step alpha and
    the share of the final suboptimality carried by the design's null directions."""
    from sklearn.datasets import make_classification
    from sklearn.preprocessing import StandardScaler

    alpha = 1e-3
    X, y = make_classification(n_samples=6000, n_features=60, random_state=0)
    X = StandardScaler().fit_transform(X)
    o = np.argsort(X[:, 0], kind="stable")
    X, y = X[o], y[o]
    fstar, w, b = lbfgs_optimum(X, y, loss="log_loss", alpha=alpha)
    Z = np.hstack([X, np.ones((len(y), 1))])
    ev, V = np.linalg.eigh(Z.T @ Z / len(y))
    null = V[:, ev < 1e-10 * ev[-1]]
    out = {}
    for tau in ("all", "auto"):
        est, hits, _ = het_fit(X, y, "log_loss", alpha, fstar, 10, tau, max_iter)
        s = (np.asarray(est.history_["objective"], dtype=float) - fstar) / abs(fstar)
        x = np.append(est.coef_.ravel(), est.intercept_)
        z = null.T @ x
        k0, k1 = len(s) // 2, len(s) - 1
        rate = float((s[k1] / s[k0]) ** (1.0 / (k1 - k0))) if s[k1] > 0 else None
        out[tau] = {"iters": hits, "final": float(s[-1]), "step": float(est.step_size_),
                    "tail_rate": rate, "predicted": 1 - 2 * est.step_size_ * alpha,
                    "null_norm": float(np.linalg.norm(z)),
                    "null_share": float(0.5 * alpha * z @ z / (s[-1] * abs(fstar)))
                    if s[-1] > 0 else None}
        log(f"tau={tau}: iterations to {HET_TARGETS}: {hits}; final {s[-1]:.2e}; "
            f"null directions {null.shape[1]}, |null part of x| {out[tau]['null_norm']:.3f} "
            f"({fmt(out[tau]['null_share'], '.0%')} of the final suboptimality); tail rate "
            f"{fmt(rate, '.6f')} per iteration vs 1 - 2 step alpha = "
            f"{out[tau]['predicted']:.6f}", flush=True)
    return out


# ----------------------------------------------------------------------------- driver
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", nargs="+", choices=tuple(PROBLEMS), default=list(PROBLEMS))
    ap.add_argument("--quick", action="store_true", help="smoke test: n=10 only, small caps")
    ap.add_argument("--no-dask", action="store_true", help="skip the LocalCluster check")
    ap.add_argument("--ridge-density", type=float, default=0.05,
                    help="density of the ridge design (1.0 = dense)")
    ap.add_argument("--out", default=None, help="JSON output path")
    ap.add_argument("--heterogeneous", action="store_true",
                    help="only the issue-27 study: ISEGA at tau=m/n vs dense on "
                         "heterogeneous splits (writes sparsification-heterogeneous.json)")
    ap.add_argument("--het-data", nargs="+", choices=HET_DATASETS, default=list(HET_DATASETS))
    ap.add_argument("--het-workers", nargs="+", type=int, default=[10, 100])
    ap.add_argument("--het-max-iter", type=int, default=4000)
    ap.add_argument("--null-space", action="store_true",
                    help="only the issue-27 check of the slow tail on collinear features")
    args = ap.parse_args(argv)
    if args.null_space:
        warm_up()
        null_space_tail()
        return 0
    if args.heterogeneous:
        info = machine_info()
        print("date", info["date"], "loadavg", info["loadavg"], info["versions"]["dmp_commit"])
        warm_up()
        rows = heterogeneous_study(args.het_data, args.het_workers, args.het_max_iter)
        out = Path(args.out or Path(__file__).parent / "results"
                   / "sparsification-heterogeneous.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": info, "rows": rows}, indent=1,
                                  default=_json_default))
        print(f"{sum(r['pass'] for r in rows)} of {len(rows)} PASS; wrote {out}")
        return 0

    info = machine_info()
    print("Sparsification benchmark:", " ".join([sys.executable, *sys.argv]))
    print(f"date {info['date']}; cpu {info['cpu']}; nproc {info['nproc']} "
          f"({info['cores_usable']} usable); loadavg "
          f"{', '.join(f'{x:.2f}' for x in info['loadavg'])}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    specs = {}
    for key in args.problems:
        spec = dict(PROBLEMS[key])
        if args.quick:
            spec.update(QUICK[key])
        specs[key] = spec
    skipped = []
    for key, s in specs.items():
        no_n = [n for n in WORKERS if n not in s["workers"]]
        if no_n:
            skipped.append(f"{key}: n={no_n} not run")
        no_b = [n for n in s["workers"] if n not in s["rule_b_workers"]]
        if no_b:
            skipped.append(f"{key}: step rule (b) 'auto' not run for n={no_b}")
        if s.get("small_cap"):
            skipped.append(f"{key}: tau < m/n runs capped at {s['small_cap']} iterations")
        skipped.append(f"{key}: isgd runs capped at {s['isgd_cap']} iterations")
    if args.quick:
        skipped.append("--quick: n=10 only, smaller iteration caps")
    for key in PROBLEMS:
        if key not in specs:
            skipped.append(f"{key}: not selected")
    if args.no_dask:
        skipped.append("Dask check: --no-dask")
    print("skipped / reduced:" + "".join(f"\n  - {x}" for x in skipped) if skipped
          else "skipped / reduced: nothing", flush=True)

    t_all = time.perf_counter()
    warm_up()
    makers = {"ridge": lambda: make_ridge(args.ridge_density),
              "breast_cancer": make_breast_cancer,
              "classification": make_classification_problem}
    out = {"command": [sys.executable, *sys.argv], "argv": sys.argv[1:], "machine": info,
           "target_rel_subopt": TARGET, "workers": WORKERS, "rules": {
               "1/L": "step_size = 1 / (c lambda_max([X 1]^T [X 1] / N) + alpha), numpy",
               "auto": "step_size='auto' (dmp)"},
           "small_tau_cap_factor": SMALL_TAU_CAP, "divergence_factor": DIVERGE,
           "seed": SEED, "skipped": skipped, "problems": {}, "summary": []}
    cache = {}
    for key in args.problems:
        t0 = time.perf_counter()
        prob = makers[key]()
        cache[key] = prob
        setup = time.perf_counter() - t0
        print_header(key, prob)
        rows = []
        try:
            bench_problem(key, prob, specs[key], rows, print_row)
            status = "ok"
        except Exception as exc:  # keep the other problems
            status = f"failed: {type(exc).__name__}: {exc}"
            print(status, flush=True)
        summ = summarize(key, prob, rows, specs[key])
        out["summary"] += summ
        out["problems"][key] = {
            "title": PROBLEMS[key]["title"], "shape": list(prob["X"].shape),
            "nnz": int(sp.csr_matrix(prob["X"]).nnz), "m": prob["m"], "loss": prob["loss"],
            "alpha": prob["alpha"], "fit_intercept": prob["fit_intercept"],
            "note": prob["note"], "fstar": prob["fstar"], "L_exact": prob["L"],
            "kappa": prob.get("kappa"), "null_dims": prob["null_dims"],
            "max_iter": specs[key]["max_iter"],
            "workers": list(specs[key]["workers"]),
            "rule_b_workers": list(specs[key]["rule_b_workers"]),
            "small_cap": specs[key].get("small_cap"), "isgd_cap": specs[key]["isgd_cap"],
            "setup_s": setup,
            "seconds": time.perf_counter() - t0, "status": status, "runs": rows}
        print(f"({key}: {time.perf_counter() - t0:.0f} s)", flush=True)

    print_summary(out["summary"])
    if not args.no_dask:
        prob = cache.get("breast_cancer") or make_breast_cancer()
        out["dask"] = dask_check(prob)
        print_dask(out["dask"])
    out["total_s"] = time.perf_counter() - t_all
    out["loadavg_end"] = os.getloadavg()
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    name = "sparsification-quick.json" if args.quick else "sparsification.json"
    path = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=_json_default))
    n_pass = sum(s["iters_pass"] + s["blocks_pass"] for s in out["summary"])
    print(f"\n{n_pass} of {2 * len(out['summary'])} targets PASS; total "
          f"{out['total_s']:.0f} s, peak RSS {out['peak_rss_gib']:.2f} GiB, loadavg "
          f"{', '.join(f'{x:.2f}' for x in out['loadavg_end'])}")
    print(f"written to {path}")


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    return str(o)


if __name__ == "__main__":
    main()
