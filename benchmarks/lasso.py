#!/usr/bin/env python
"""Lasso benchmark: dmp's STRADS Lasso against scikit-learn, celer and skglm.

Run from the repository root with the project's environment active::

    python benchmarks/lasso.py                     # problems (a) and (b), about 15 min
    python benchmarks/lasso.py --problem a         # (a) only, about 1-2 min
    python benchmarks/lasso.py --quick             # smoke test: (a) once, a tiny (b)
    python benchmarks/lasso.py --problem b --repeats 1

It prints tables and a JSON blob, which is also written to
``benchmarks/results/lasso-<date>[-<problem>][-quick].json``.

Problems (all from ``dmp.io.make_sparse_lasso``, ``fit_intercept=False``, objective
``P(b) = 1/(2n) ||y - X b||^2 + alpha ||b||_1``, ``alpha = f * alpha_max`` with
``alpha_max = ||X^T y||_inf / n``):

* (a) the generator's defaults: n=10,000, p=100,000, density 1e-3 (1M stored values),
  f = 0.1 and 0.01 (the problem scikit-learn, celer and skglm were first compared on).
* (b) n=100,000, p=1,000,000, density 2.5e-3 (250M stored values, 3 GB in CSC), f = 0.01.
  Sized so that scikit-learn needs at least 30 s on the 2-core reference machine: a probe
  took 35 s (46 epochs at tol=1e-4, already within 1e-6 of the optimum); at density 1.5e-3
  it took 20 s.  Generating it takes about 60 s and peaks at 11 GB RSS; the Zarr write about
  50 s.  To keep the whole run near 15 minutes, dmp fits and reference sweeps on (b) have a
  150 s budget each, and every dmp fit after the first one (priority, which runs to its
  tol) stops as soon as its objective certifies the target against the best lower bound
  known; such fits are reported as stopped.  ``--quick`` replaces (b) by n=5,000,
  p=50,000, density 2e-3 (same code path).

What is measured, per problem and alpha (all solvers in the same process):

* Time to reach relative suboptimality ``(P - P_best) / P_best <= 1e-6``, where ``P_best``
  is the lowest objective reached by any solver (recomputed from each final solution).
  - dmp (``backend="local", n_workers=1``, schedule "priority" and "round_robin") runs
    first: one fit with ``tol=1e-8`` per repeat (seeds 0, 1, ...).  Time to target is read
    from ``history_["time"]`` at the first round whose objective meets the target (that
    clock starts after setup: validation, partitioning, column statistics); the setup time,
    the time to target including setup, and the full fit time are reported too.  Medians
    over repeats.
  - scikit-learn, celer, skglm: ``tol`` is swept over 1e-4, 1e-5, ..., 1e-10, one fit each.
    The sweep stops at the first fit certified to meet the target, ``P - L <= 1e-6 L``,
    where ``L`` is the best lower bound on the optimum so far (``P - duality gap`` of any
    solution; the dmp fits' tight gaps usually provide it), since no slower tol can come
    first after that.  The first (fastest) tol whose solution meets the target is refitted
    until there are ``--repeats`` fits; the median fit time is the time to target.
* (a): coordinate updates (``history_["updates"]``) needed to reach relative
  suboptimality 1e-4, priority vs round_robin (target ratio <= 0.5).
* (b): dmp on a ``distributed.LocalCluster`` (processes, 1 thread each) with 1 and 2
  workers, fitting a Zarr store written once with ``dmp.io.write_sparse(..., n_shards=16)``
  (workers read their shards themselves): time to target, speedup 1-worker / 2-worker
  (target >= 1.6), and the fraction of fit wall time outside kernels,
  ``1 - sum_rounds mean_workers push_s / wall_time_`` (target < 25%).

Every fit runs under ``threadpoolctl.threadpool_limits(1)`` (the solvers are single-threaded
coordinate descent; this keeps BLAS threads from distorting the driver's vector operations).
Numba (dmp, skglm) is warmed up on a tiny problem before anything is timed.  A solver that
raises is reported as failed; one whose sweep exceeds its time budget is reported as timed
out (a running fit cannot be interrupted: budgets are checked between fits, and dmp fits
are stopped by a callback).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
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
from threadpoolctl import threadpool_limits

from dmp.io import make_sparse_lasso, write_sparse
from dmp.linear_model import Lasso

TARGET = 1e-6  # relative suboptimality for the time to target
UPDATES_TARGET = 1e-4  # relative suboptimality for the update counts
REF_TOLS = (1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10)
DMP_TOL = 1e-8
SCHEDULES = ("priority", "round_robin")
DASK_WORKERS = (1, 2)
DASK_MEMORY_LIMIT = "8GiB"  # per worker; (b) puts about 3 GB of shards in one worker
N_SHARDS = 16

PROBLEMS = {
    "a": dict(name="(a) 10k x 100k, 1M nnz", gen={}, fractions=(0.1, 0.01), repeats=3,
              max_epochs=10_000, budget_s=120.0, stop_at_target=False, dask=False),
    "b": dict(name="(b) 100k x 1M, 250M nnz",
              gen=dict(n=100_000, p=1_000_000, density=2.5e-3), fractions=(0.01,), repeats=1,
              max_epochs=1_000, budget_s=150.0, stop_at_target=True, dask=True),
}
QUICK_B = dict(name="(b, quick) 5k x 50k, 0.5M nnz", gen=dict(n=5_000, p=50_000, density=2e-3),
               fractions=(0.01,), repeats=1, max_epochs=10_000, budget_s=60.0,
               stop_at_target=True, dask=True)


# ----------------------------------------------------------------------------- helpers
def evaluate(X, y, w, alpha):
    """Objective and duality gap (scikit-learn's dual point) of ``w``."""
    n = X.shape[0]
    r = y - X @ w
    l1 = float(np.abs(w).sum())
    R2 = float(r @ r)
    dual_norm = float(np.abs(X.T @ r).max())
    alpha_n = alpha * n
    const = min(1.0, alpha_n / dual_norm) if dual_norm > 0 else 1.0
    gap = 0.5 * R2 * (1 + const * const) + alpha_n * l1 - const * float(r @ y)
    return 0.5 * R2 / n + alpha * l1, max(gap, 0.0) / n


def rel(P, P_best):
    return (P - P_best) / abs(P_best)


def median(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def fmt(x, spec=".3f", none="-"):
    return none if x is None else format(x, spec)


def machine_info():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem_gb = None
    try:
        with open("/proc/meminfo") as f:
            mem_gb = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) / 2**20
    except (OSError, StopIteration):
        pass
    versions = {"python": platform.python_version()}
    for mod in ("numpy", "scipy", "sklearn", "celer", "skglm", "dask", "distributed", "numba",
                "zarr", "threadpoolctl", "dmp"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as exc:  # reported, not fatal
            versions[mod] = f"unavailable ({type(exc).__name__})"
    try:  # the dmp version measured
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
            "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
            "mem_gib": mem_gb, "loadavg": os.getloadavg(), "platform": platform.platform(),
            "versions": versions}


def reference_solvers(max_epochs):
    """name -> (factory(alpha, tol) or None, note)."""
    from sklearn.linear_model import Lasso as SkLasso

    out = {"sklearn": (lambda a, tol: SkLasso(alpha=a, fit_intercept=False, tol=tol,
                                              max_iter=max_epochs), "")}
    try:
        import celer

        out["celer"] = (lambda a, tol: celer.Lasso(alpha=a, fit_intercept=False, tol=tol), "")
    except Exception as exc:
        out["celer"] = (None, f"not importable: {exc}")
    try:
        import skglm

        out["skglm"] = (lambda a, tol: skglm.Lasso(alpha=a, fit_intercept=False, tol=tol), "")
    except Exception as exc:
        out["skglm"] = (None, f"not importable: {exc}")
    return out


def warm_up(solvers):
    """Compile Numba code (dmp kernels, skglm) on a tiny problem."""
    X, y, _ = make_sparse_lasso(n=50, p=200, density=0.05, seed=1)
    a = 0.1 * np.abs(X.T @ y).max() / X.shape[0]
    for schedule in SCHEDULES:
        Lasso(alpha=a, fit_intercept=False, schedule=schedule, backend="local", n_workers=1,
              tol=1e-6).fit(X, y)
    for make, _ in solvers.values():
        if make is not None:
            try:
                timed_fit(make(a, 1e-6), X, y)
            except Exception:
                pass  # reported when the real fit fails


def timed_fit(est, X, y):
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        est.fit(X, y)
        t = time.perf_counter() - t0
    n_iter = getattr(est, "n_iter_", None)
    return t, np.asarray(est.coef_, dtype=np.float64).ravel(), \
        (int(np.max(n_iter)) if n_iter is not None else None)


# ----------------------------------------------------------------------------- reference solvers
def sweep(make, X, y, alpha, budget_s, bound):
    """Fit with decreasing tol until a fit is certified to meet the target.

    ``bound`` is a one-element list holding the best lower bound on the optimum seen so far
    (``P - gap`` of any solution; the dmp fits run first, to a tight gap); a fit is certified
    when ``P - bound <= TARGET * bound``, and no later (slower) tol can then come first.
    """
    fits, spent = [], 0.0
    for tol in REF_TOLS:
        if spent > budget_s:
            return fits, "timeout"
        try:
            t, w, n_iter = timed_fit(make(alpha, tol), X, y)
        except Exception as exc:
            return fits, f"failed: {type(exc).__name__}: {exc}"
        spent += t
        P, gap = evaluate(X, y, w, alpha)
        bound[0] = max(bound[0], P - gap)
        fits.append(dict(tol=tol, time=t, objective=P, gap=gap, nnz=int(np.count_nonzero(w)),
                         n_iter=n_iter))
        if P - bound[0] <= TARGET * bound[0]:
            break
    return fits, "ok"


def finish_reference(make, fits, status, X, y, alpha, P_best, repeats):
    """Pick the first tol meeting the target and refit it to ``repeats`` fits."""
    out = {"status": status, "sweep": fits}
    chosen = next((f for f in fits if rel(f["objective"], P_best) <= TARGET), None)
    if chosen is None:
        out["status"] = status if status != "ok" else "target not reached (tol 1e-10)"
        return out
    times = [chosen["time"]]
    for _ in range(repeats - 1):
        try:
            times.append(timed_fit(make(alpha, chosen["tol"]), X, y)[0])
        except Exception as exc:
            out["repeat_error"] = f"{type(exc).__name__}: {exc}"
            break
    out.update(status="ok", tol=chosen["tol"], times=times, time_to_target=median(times),
               fit_s=median(times), objective=chosen["objective"],
               rel_subopt=rel(chosen["objective"], P_best), nnz=chosen["nnz"],
               n_iter=chosen["n_iter"])
    return out


# ----------------------------------------------------------------------------- dmp
def run_dmp(X, y, alpha, schedule, seed, budget_s, X_eval, y_eval, backend="local",
            n_workers=1, stop_below=None):
    """One dmp fit; per-round clocks from history_ and from a callback started before fit().

    The callback stops the fit after ``budget_s`` seconds, or once the objective is at most
    ``stop_below`` (a value that certifies the target: ``(1 + TARGET) * lower bound``).
    """
    stamps, why = [], []
    t0 = time.perf_counter()

    def callback(round_, metrics):
        stamps.append(time.perf_counter() - t0)
        if stop_below is not None and metrics["objective"] <= stop_below:
            why.append("stopped at target")
        elif stamps[-1] > budget_s:
            why.append("timeout")
        return bool(why)

    est = Lasso(alpha=alpha, fit_intercept=False, schedule=schedule, tol=DMP_TOL,
                max_iter=1_000_000, backend=backend, n_workers=n_workers, random_state=seed,
                callback=callback)
    try:
        with warnings.catch_warnings(), threadpool_limits(1):
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            est.fit(X, y)
            fit_total = time.perf_counter() - t0
    except Exception as exc:
        return {"status": f"failed: {type(exc).__name__}: {exc}"}
    h = est.history_
    push = [float(np.mean(p)) for p in h["push_s"]]
    P, gap = evaluate(X_eval, y_eval, est.coef_, alpha)
    t = np.asarray(h["time"], dtype=float)
    return {
        "status": why[0] if why else "ok",
        "seed": seed, "time": t, "objective": np.asarray(h["objective"], dtype=float),
        "updates": np.asarray(h["updates"], dtype=np.int64), "stamps": np.asarray(stamps),
        "setup_s": float(stamps[0] - t[0]) if stamps else None,
        "wall_s": float(est.wall_time_), "fit_s": fit_total, "kernel_s": float(np.sum(push)),
        "rounds": int(est.n_iter_), "n_updates": int(est.n_updates_), "final_objective": P,
        "final_gap": gap, "reported_objective": float(est.objective_),
        "nnz": int(np.count_nonzero(est.coef_)),
    }


def first_reach(run, P_best, level):
    """(loop time, time since fit() was called, updates) at the first round within ``level``."""
    hit = np.flatnonzero((run["objective"] - P_best) <= level * abs(P_best))
    if len(hit) == 0:
        return None, None, None
    i = int(hit[0])
    return float(run["time"][i]), float(run["stamps"][i]), int(run["updates"][i])


def summarize_dmp(runs, P_best):
    ok = [r for r in runs if "time" in r]
    if not ok:
        return {"status": runs[0]["status"] if runs else "not run"}
    reach = [first_reach(r, P_best, TARGET) for r in ok]
    upd = [first_reach(r, P_best, UPDATES_TARGET)[2] for r in ok]
    reached = all(x[0] is not None for x in reach)
    stopped = any(r["status"] == "timeout" for r in ok)
    at_target = any(r["status"] == "stopped at target" for r in ok)
    kernel_frac = [r["kernel_s"] / r["wall_s"] for r in ok]
    return {
        "status": (("ok (fit stopped at budget)" if stopped else
                    "ok (fit stopped at target)" if at_target else "ok") if reached
                   else ("timeout" if stopped else "target not reached")),
        "time_to_target": median([x[0] for x in reach]) if reached else None,
        "time_to_target_incl_setup": median([x[1] for x in reach]) if reached else None,
        "times": [x[0] for x in reach],
        "setup_s": median([r["setup_s"] for r in ok]),
        "wall_s": median([r["wall_s"] for r in ok]), "fit_s": median([r["fit_s"] for r in ok]),
        "kernel_s": median([r["kernel_s"] for r in ok]),
        "outside_kernels_frac": median([1.0 - f for f in kernel_frac]),
        "updates_to_1e-4": median(upd) if all(u is not None for u in upd) else None,
        "updates_to_1e-6": median([x[2] for x in reach]) if reached else None,
        "rounds": median([r["rounds"] for r in ok]),
        "n_updates": median([r["n_updates"] for r in ok]),
        "objective": min(r["final_objective"] for r in ok),
        "rel_subopt": max(rel(r["final_objective"], P_best) for r in ok),
        "final_gap": max(r["final_gap"] for r in ok),
        "objective_drift": max(abs(r["reported_objective"] - r["final_objective"]) for r in ok),
        "nnz": ok[0]["nnz"], "seeds": [r["seed"] for r in ok],
    }


def run_dask(ds, X, y, amax, stops, budget_s, repeats):
    """dmp priority on a LocalCluster with 1 and 2 workers: {(W, f): [runs]}."""
    from distributed import Client

    from dmp.engine.backends.dask import quiet_local_cluster

    Xs, ys, _ = make_sparse_lasso(n=50, p=400, density=0.05, seed=1)
    out = {}
    for W in DASK_WORKERS:
        try:
            # the cluster `dmp run` embeds (quiet Dask housekeeping)
            with quiet_local_cluster(W, memory_limit=DASK_MEMORY_LIMIT, dashboard_address=None,
                                     silence_logs=logging.ERROR) as cluster, Client(cluster):
                # warm-up: Numba kernels, actors and the dataset path in every worker
                Lasso(alpha=0.1 * np.abs(Xs.T @ ys).max() / 50, fit_intercept=False,
                      backend="dask", n_workers=W, tol=1e-6).fit(Xs, ys)
                for f, stop in stops.items():
                    out[W, f] = [run_dmp(ds, None, f * amax, "priority", seed, budget_s, X, y,
                                         backend="dask", n_workers=W, stop_below=stop)
                                 for seed in range(repeats)]
        except Exception as exc:
            for f in stops:
                out.setdefault((W, f), [{"status": f"failed: {type(exc).__name__}: {exc}"}])
    return out


# ----------------------------------------------------------------------------- driver
def bench_problem(spec, repeats, solvers):
    print(f"\n=== {spec['name']} ===", flush=True)
    t0 = time.perf_counter()
    X, y, _ = make_sparse_lasso(**spec["gen"])
    gen_s = time.perf_counter() - t0
    n, p = X.shape
    amax = float(np.abs(X.T @ y).max()) / n
    P0 = 0.5 * float(y @ y) / n
    info = {"name": spec["name"], "n": n, "p": p, "nnz": int(X.nnz), "gen": spec["gen"],
            "generate_s": gen_s, "alpha_max": amax, "P0": P0, "repeats": repeats}
    print(f"n={n} p={p} nnz={X.nnz} generated in {gen_s:.1f} s; alpha_max={amax:.6g} "
          f"P(0)={P0:.6g}; repeats={repeats}", flush=True)

    tmpdir, ds, dask_runs = None, None, {}
    if spec["dask"]:
        tmpdir = tempfile.mkdtemp(prefix="dmp-bench-lasso-")
        t0 = time.perf_counter()
        try:
            ds = write_sparse(os.path.join(tmpdir, "lasso.zarr"), X, y, n_shards=N_SHARDS)
            info["zarr_write_s"] = time.perf_counter() - t0
            print(f"Zarr store ({N_SHARDS} shards) written in {info['zarr_write_s']:.1f} s",
                  flush=True)
        except Exception as exc:
            info["zarr_error"] = f"{type(exc).__name__}: {exc}"
            print(f"Zarr write failed: {info['zarr_error']}", flush=True)
    try:
        runs = {}
        for f in spec["fractions"]:
            alpha = f * amax
            bound = [-np.inf]  # best lower bound on the optimum (P - gap of any solution)
            local = {s: [] for s in SCHEDULES}
            for s in SCHEDULES:
                for seed in range(repeats):
                    stop = (1 + TARGET) * bound[0] if spec["stop_at_target"] else None
                    r = run_dmp(X, y, alpha, s, seed, spec["budget_s"], X, y,
                                stop_below=stop if np.isfinite(bound[0]) else None)
                    local[s].append(r)
                    if "final_gap" in r:
                        bound[0] = max(bound[0], r["final_objective"] - r["final_gap"])
            done = "; ".join(f"{s} {[round(r.get('fit_s', np.nan), 2) for r in rs]} s"
                             for s, rs in local.items())
            print(f"  f={f}: dmp local fits {done}", flush=True)
            sweeps = {}
            for name, (make, note) in solvers.items():
                if make is None:
                    sweeps[name] = ([], note)
                    continue
                sweeps[name] = sweep(make, X, y, alpha, spec["budget_s"], bound)
                print(f"  f={f}: {name} sweep (tol, s) "
                      f"{[(x['tol'], round(x['time'], 3)) for x in sweeps[name][0]]} "
                      f"{sweeps[name][1]}", flush=True)
            runs[f] = (alpha, sweeps, local, bound[0])
        if ds is not None:
            stops = {f: (1 + TARGET) * v[3] if spec["stop_at_target"] and np.isfinite(v[3])
                     else None for f, v in runs.items()}
            dask_runs = run_dask(ds, X, y, amax, stops, spec["budget_s"], 1)
            print("  dask runs done", flush=True)

        results = []
        for f, (alpha, sweeps, local, _) in runs.items():
            dask_here = {W: dask_runs.get((W, f), []) for W in DASK_WORKERS} if ds else {}
            finals = [x["objective"] for fits, _ in sweeps.values() for x in fits]
            finals += [r["final_objective"] for rs in [*local.values(), *dask_here.values()]
                       for r in rs if "final_objective" in r]
            P_best = min(finals, default=np.nan)
            ref = {}
            for name, (fits, st) in sweeps.items():
                make = solvers[name][0]
                ref[name] = (finish_reference(make, fits, st, X, y, alpha, P_best, repeats)
                             if make is not None else {"status": st, "sweep": []})
            dmp = {s: summarize_dmp(rs, P_best) for s, rs in local.items()}
            dask = {W: summarize_dmp(rs, P_best) for W, rs in dask_here.items()}
            res = {"fraction": f, "alpha": alpha, "P_best": P_best, "reference": ref,
                   "dmp_local": dmp}
            if dask:
                res["dmp_dask"] = {str(W): v for W, v in dask.items()}
            results.append(res)
            print_alpha(spec, res, dask)
        info["alphas"] = results
        print_updates(results)
        return info
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def print_alpha(spec, res, dask):
    print(f"\n{spec['name']}, alpha = {res['fraction']} x alpha_max = {res['alpha']:.6g}, "
          f"P_best = {res['P_best']:.12g}; time to rel. suboptimality {TARGET:g}")
    head = (f"{'solver':<22}{'tol':>8}{'t_target s':>12}{'setup s':>9}{'fit s':>9}"
            f"{'final P':>18}{'rel.subopt':>11}{'nnz':>8}{'iters':>8}  status")
    print(head)
    print("-" * len(head))
    for name, r in res["reference"].items():
        print(f"{name:<22}{fmt(r.get('tol'), '.0e'):>8}{fmt(r.get('time_to_target')):>12}"
              f"{'':>9}{fmt(r.get('fit_s')):>9}{fmt(r.get('objective'), '.12g'):>18}"
              f"{fmt(r.get('rel_subopt'), '.1e'):>11}{fmt(r.get('nnz'), 'd'):>8}"
              f"{fmt(r.get('n_iter'), 'd'):>8}  {r['status']}")
    rows = [(f"dmp local {s}", v) for s, v in res["dmp_local"].items()]
    rows += [(f"dmp dask W={W} priority", v) for W, v in dask.items()]
    for name, r in rows:
        print(f"{name:<22}{fmt(DMP_TOL, '.0e'):>8}{fmt(r.get('time_to_target')):>12}"
              f"{fmt(r.get('setup_s')):>9}{fmt(r.get('fit_s')):>9}"
              f"{fmt(r.get('objective'), '.12g'):>18}{fmt(r.get('rel_subopt'), '.1e'):>11}"
              f"{fmt(r.get('nnz'), 'd'):>8}{fmt(r.get('rounds'), '.0f'):>8}  {r['status']}")
    print("iters: sklearn epochs, celer/skglm outer iterations, dmp rounds.  dmp: t_target from "
          "history_['time'] (after setup), fit s = whole fit() call")
    refs = list(res["reference"])
    ratios = {}
    print(f"\n{'ratio dmp / reference':<34}" + "".join(f"{k:>10}" for k in refs))
    for s, r in res["dmp_local"].items():
        for label, key in ((f"local {s}", "time_to_target"),
                           (f"local {s} incl. setup", "time_to_target_incl_setup")):
            row = {}
            for k in refs:
                a, b = r.get(key), res["reference"][k].get("time_to_target")
                row[k] = a / b if a is not None and b else None
            ratios[label] = row
            print(f"{label:<34}" + "".join(f"{fmt(row[k]):>10}" for k in refs))
    res["ratios"] = ratios
    if dask:
        t1, t2 = (dask.get(W, {}).get("time_to_target") for W in DASK_WORKERS)
        w1, w2 = (dask.get(W, {}).get("fit_s") for W in DASK_WORKERS)
        speed = t1 / t2 if t1 and t2 else None
        res["dask_speedup"] = speed
        res["dask_speedup_fit"] = w1 / w2 if w1 and w2 else None
        print(f"\n{'dask workers':<14}{'t_target s':>11}{'setup s':>9}{'wall s':>9}"
              f"{'kernel s':>10}{'outside kernels':>17}{'rounds':>8}  status")
        for W, r in dask.items():
            frac = r.get("outside_kernels_frac")
            print(f"{W:<14}{fmt(r.get('time_to_target')):>11}{fmt(r.get('setup_s')):>9}"
                  f"{fmt(r.get('wall_s')):>9}{fmt(r.get('kernel_s')):>10}"
                  f"{fmt(None if frac is None else 100 * frac, '.1f'):>16}%"
                  f"{fmt(r.get('rounds'), '.0f'):>8}  {r['status']}")
        print(f"speedup 1 worker / 2 workers, time to target: {fmt(speed, '.2f')} "
              f"(target >= 1.6); full fit: {fmt(res['dask_speedup_fit'], '.2f')}")
        print("outside kernels = 1 - sum over rounds of mean over workers of push_s / wall_time_"
              " (target < 25%)")


def print_updates(results):
    print(f"\nCoordinate updates to rel. suboptimality {UPDATES_TARGET:g} (dmp local, median)")
    print(f"{'alpha/alpha_max':<18}{'priority':>12}{'round_robin':>14}{'ratio':>8}"
          "  (target <= 0.5)")
    for res in results:
        pr = res["dmp_local"]["priority"].get("updates_to_1e-4")
        rr = res["dmp_local"]["round_robin"].get("updates_to_1e-4")
        ratio = pr / rr if pr and rr else None
        res["updates_ratio_priority_rr"] = ratio
        print(f"{res['fraction']:<18g}{fmt(pr, '.0f'):>12}{fmt(rr, '.0f'):>14}"
              f"{fmt(ratio, '.3f'):>8}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problem", choices=("a", "b", "all"), default="all")
    ap.add_argument("--repeats", type=int, default=None,
                    help="fits per solver (default: 3 on (a), 1 on (b), 1 with --quick; "
                         "the Dask fits run once)")
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny (b), one repeat")
    ap.add_argument("--out", default=None, help="JSON output path")
    args = ap.parse_args(argv)

    info = machine_info()
    print("Lasso benchmark:", " ".join(sys.argv))
    print(f"date {info['date']}; cpu {info['cpu']}; {info['cores']} cores "
          f"({info['cores_usable']} usable); {fmt(info['mem_gib'], '.1f')} GiB; "
          f"loadavg {', '.join(f'{x:.2f}' for x in info['loadavg'])}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    print(f"BLAS threads limited to 1 during fits; dmp tol {DMP_TOL:g}; reference tols "
          f"{REF_TOLS[0]:g}..{REF_TOLS[-1]:g}")

    solvers = reference_solvers(10_000)
    warm_up(solvers)
    keys = ("a", "b") if args.problem == "all" else (args.problem,)
    out = {"machine": info, "target_rel_subopt": TARGET, "updates_target": UPDATES_TARGET,
           "dmp_tol": DMP_TOL, "ref_tols": REF_TOLS, "argv": sys.argv[1:], "problems": {}}
    t_all = time.perf_counter()
    for key in keys:
        spec = QUICK_B if (args.quick and key == "b") else PROBLEMS[key]
        repeats = args.repeats or (1 if args.quick else spec["repeats"])
        solvers = reference_solvers(spec["max_epochs"])
        try:
            out["problems"][key] = bench_problem(spec, repeats, solvers)
        except Exception as exc:  # keep the other problem's results
            out["problems"][key] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"problem {key} failed: {type(exc).__name__}: {exc}")
    out["total_s"] = time.perf_counter() - t_all
    out["loadavg_end"] = os.getloadavg()
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    suffix = ("" if args.problem == "all" else f"-{args.problem}") + \
        ("-quick" if args.quick else "")
    name = f"lasso-{datetime.date.today().isoformat()}{suffix}.json"
    path = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = json.dumps(out, indent=1, default=_json_default)
    path.write_text(blob)
    print(f"\ntotal {out['total_s']:.0f} s, peak RSS {out['peak_rss_gib']:.1f} GiB, loadavg "
          f"{', '.join(f'{x:.2f}' for x in out['loadavg_end'])}")
    print(blob)
    print(f"written to {path}")


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    return str(o)


if __name__ == "__main__":
    main()
