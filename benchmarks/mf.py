#!/usr/bin/env python
"""Matrix factorisation benchmark: ``dmp.decomposition.MatrixFactorization`` (STRADS CCD++ /
CCD) against cmfrec (ALS), libmf (FPSGD) and scikit-surprise (SGD), all in one process run.

Run from the repository root with the project's environment active (the references are the
``bench`` extra: ``pip install -e ".[bench]"``)::

    python benchmarks/mf.py                        # wp at ranks 20 and 200, spec; 20-30 min
    python benchmarks/mf.py --quick                # smoke test on small data, about a minute
    python benchmarks/mf.py --problems wp --ranks 20 --no-dask --skip-surprise
    python benchmarks/mf.py --speedup --ranks 200  # 1 vs 2 workers only, interleaved; ~5 min

It prints the machine, one table per (problem, rank, regularisation) setting, ratio lines
with PASS/MISS against the targets, a summary, and writes a JSON file
(``benchmarks/results/mf.json``; with ``--quick`` ``mf-quick.json``).

Problems (``dmp.io.synthetic.make_ratings``, the low-rank ratings generator: true factors
with N(0, 1/sqrt(rank)) entries so <u, v> has unit variance, Gaussian noise sd 0.5, hence a
test-RMSE floor of about 0.50; uniform distinct (user, item) pairs; random 90/10 train/test
split; seed 3):

* ``wp`` ("well-posed"): ``make_ratings(n_users=10_000, n_items=2_000)``, 2M ratings (1.8M
  train, about 180 per user and 900 per item), true rank 20, fitted at every rank of
  ``--ranks`` (default 20 and 200) with the unscaled ``alpha = 0.05``.
* ``spec``: ``make_ratings()`` defaults, 50,000 x 10,000, 2M ratings, true rank 20, fitted at
  rank 20 only (``--ranks`` applies to wp).  1.8M training ratings for 1.2M parameters, so
  regularisation decides the test RMSE: unscaled ``alpha = 0.05`` overfits (measured: cmfrec's
  test RMSE grows from 1.82 after one ALS iteration to 2.68 after 20), unscaled
  ``alpha = 10`` is the best of a cmfrec scan (0.866 after 20 iterations), and the per-rating
  form with 0.05 (``reg_scaling="count"`` in dmp, ``scale_lam=True`` in cmfrec; libmf and
  surprise only have this form) is the third setting.
* ``--quick``: wp = ``make_ratings(2_000, 500, n_obs=100_000, rank=10)`` at rank 10 (and 30
  standing in for 200), spec = ``make_ratings(10_000, 2_000, n_obs=100_000, rank=10)`` at
  rank 10, fewer iterations and counts, fit cap 10 s, budget 20 s.  It checks the code path,
  not the targets.

Regularisation forms (stated on every table): "unscaled" is the CCD++ / STRADS objective
``sum_obs (r - w_u.h_i)^2 + alpha (|W|^2 + |H|^2)`` (dmp ``reg_scaling="none"``, cmfrec
``scale_lam=False``); "per-rating" multiplies the penalty of a user's / item's factors by its
rating count (dmp ``reg_scaling="count"``, cmfrec ``scale_lam=True``), which is what SGD with
``reg * |p_u|^2`` on every rating (libmf, surprise) minimises.  libmf and surprise therefore
solve a different objective than the unscaled settings: on wp they are listed for their test
RMSE and times to the fixed levels only.  No centring, no biases anywhere.

Solvers (every reference fit is timed from scratch at each iteration count, since none of
them reports progress per iteration):

* cmfrec ``CMF(method="als", k, lambda_=alpha, scale_lam, center=False, user_bias=False,
  item_bias=False, niter=n, nthreads=1|2, use_cg=False|True, finalize_chol=False,
  precompute_for_predictions=False, random_state=0)`` ("ALS-chol": Cholesky solves, "ALS-cg":
  cmfrec's conjugate-gradient solves, its default); float32 factors (its default).  Test RMSE
  and the objective of the setting's form (float64 arithmetic; see "Regularisation forms")
  from its factors ``A_``, ``B_``.  Iteration counts 1, 2, 3, 5, 8, 12, 20 on wp, 1, 3, 5,
  10, 20 on spec (the counts cmfrec was first measured at).  ALS-cg only on wp.
* libmf 0.9.2 ``MF(fun=0, k, nr_threads=1|2, nr_iters=n, lambda_p2=lambda_q2=alpha,
  lambda_p1=lambda_q1=0, eta=0.1)`` (FPSGD; L2 per rating).  Its ``predict()`` is broken in
  0.9.2, so RMSE comes from ``p_factors()`` / ``q_factors()``.  Epochs 5, 10, 20, 40.  wp
  (per-rating 0.05) and the spec per-rating setting.
* scikit-surprise ``SVD(biased=False, n_factors=k, n_epochs=n, lr_all=0.005, reg_all=alpha,
  random_state=0)``, single-threaded.  Its Trainset is built directly from the arrays (inner
  id = our id; the build time is printed and not in the fit time).  RMSE from ``pu``, ``qi``.
  Epochs 5, 20.  Same settings as libmf; ``--skip-surprise`` leaves it out.
* dmp ``MatrixFactorization(n_components=k, alpha, reg_scaling, method, max_iter, center=False,
  tol=None, random_state=0)`` fitted with ``X_val`` = the test ratings:
  - ``backend="local", n_workers=1``: method "ccd++" (every setting) and "ccd" (wp);
  - ``backend=distributed.Client`` of a ``LocalCluster(n_workers=W, threads_per_worker=1,
    processes=True)`` (created under ``dmp.engine.backends.dask.QUIET_DASK_CONFIG``, as
    ``dmp run``'s embedded cluster) with ``n_workers=W``, W = 1 and 2, methods "ccd++" and
    "ccd" (wp; ``--no-dask`` skips it).  The ratings go to the workers through a temporary Zarr store
    that ``fit`` writes (part of its setup).
  Iterations: 15 (ccd++) / 20 (ccd) at rank <= 50, 20 at higher rank, 20 on spec (quick: 15,
  3 and 10); a fit is stopped after ``--budget`` seconds (callback) and then flagged.  At rank
  200 (3-6 s per iteration with one worker, ccd++ and ccd alike) this budget can cut the
  local ccd and the Dask fits short, so the 1- and 2-worker runs of a method may complete
  different numbers of iterations (the speedups use the common count).
  dmp's ``history_["objective"]`` (every round) is the objective of the setting's form with
  ``center=False``, the same function as computed for cmfrec.

Sweeps and caps (all references).  On wp a sweep stops once two consecutive counts agree on
test RMSE to 1e-4 relative while below 0.95 x the zero predictor's test RMSE ("converged";
the guard keeps a start that sits on the zero plateau for a few iterations from passing for
converged), or once test RMSE rose at two consecutive counts while train RMSE fell at both
("test RMSE rising": overfitting, the best is behind).  On spec the test-RMSE paths are not
monotone (measured: cmfrec scale_lam 1.12, 1.29, 0.93 at 1, 5, 20 iterations), so every count
runs.  Everywhere, a sweep stops before a fit whose predicted time exceeds ``--fit-cap``
(default 60 s) or would take the sweep past ``--budget`` (default 90 s).  The
prediction is proportional to the last fit of the same sweep; the first fit at a new rank is
predicted from the same solver at the previous rank, scaled by (k / k_prev)^2 for
ALS-Cholesky (nnz k^2 Gram products) and k / k_prev for the others; a solver whose first fit
is predicted over the cap is reported as skipped with that prediction.

``--speedup`` runs only the model-parallel speed-up at the largest ``--ranks`` on wp: for ccd
(4 iterations) and ccd++ (2 iterations), ``--repeat`` pairs of a 1-worker and a 2-worker fit,
interleaved, each on a fresh LocalCluster under ``QUIET_DASK_CONFIG``; the ratio is the
median over pairs of the loop times after round 0 (the first round loads the ratings on the
workers: setup, not speed).  This is the measurement of the "2 workers at least 1.7x faster"
target; the full run's 1- and 2-worker clusters run minutes apart and this machine's speed
drifts by up to 2x within minutes.

What the numbers mean:

* ``target``: the best (lowest) test RMSE of any cmfrec fit in the setting (any count, solver
  and thread count, with the setting's regularisation form), times (1 + 1e-3).  The line
  names the cmfrec sweeps that did not converge (capped, or counts exhausted), and a NOTE
  flags an overfitting setting (the best cmfrec sweep ended more than 1e-3 above its best:
  there the target is an early-stopped value and "time to target" rewards early stopping).
* ``target objective`` (optimisation speed, independent of over-fitting): the lowest cmfrec
  objective of any fit in the setting, times (1 + 1e-4).  The line names the fit, its test
  RMSE, how much higher the objective was at the sweep's previous count, and "not converged"
  unless that sweep ended "converged" (a sweep cut by a cap, the budget, the counts or "test
  RMSE rising" may still be lowering its objective: the target is then cmfrec's best, not its
  minimum).  When no dmp run reaches the target test RMSE, a NOTE gives the reason (see the
  ratio lines).
* table columns: ``par`` threads (T) or workers (w); ``iters`` the largest iteration count
  (references) or outer iterations run (dmp); ``fit s`` the fit time of that last fit (dmp:
  the whole ``fit()`` call, setup included); ``setup s`` (dmp) the time from the ``fit()``
  call to the end of round 0 minus that round's loop time (validation, partitioning, store
  write, worker start); ``test`` the final test RMSE and ``best`` the lowest seen; ``train`` the final train RMSE; ``t_target`` / ``t<=L`` the time to reach the
  target / test RMSE <= L for the fixed levels L of the problem (wp 0.60, 0.55, 0.54; spec
  1.0, 0.9).  References: the shortest fit time among the fits reaching it (quantised by the
  counts).  dmp: ``history_["time"]`` (the STRADS loop clock, which starts after setup) at
  the first round whose ``history_["valid_rmse"]`` (the exact test RMSE of the current
  factors, recorded every round) reaches it, round 0 excluded (W = 0 predicts 0 everywhere);
  ``+setup`` adds the setup; ``best`` also excludes round 0.  "-": not reached.
  ``objective`` the final objective (cmfrec: of the last fit; dmp: ``objective_``; libmf and
  surprise: "-"), ``t_obj`` the time to the target objective, measured as ``t_target``
  (dmp: first round whose ``history_["objective"]`` reaches it).  ``load`` is the 1-minute
  load average when the fit (or sweep) started.
* curve lines: ``iterations:seconds/test RMSE`` per fit (references) or per outer
  iteration (dmp, loop clock at its last round); objective curves
  ``iterations:(objective / target objective - 1) x 1e4`` (cmfrec and dmp; <= 0: reached).
* ratio lines:
  - "dmp local 1w ccd++ / cmfrec 1T, time to target": dmp's t_target over the fastest
    cmfrec 1-thread time to target (min over ALS-chol and ALS-cg); target <= 1.0 (wp).
    Also printed including dmp's setup, for local ccd, for the Dask W=1 runs, the 2-worker
    runs against cmfrec 2T, and on spec (information, no target).  When it is missed because
    no dmp run reaches the target test RMSE, the reason follows: "overfitting" when some dmp
    run reaches cmfrec's best objective (so optimises further) with a higher test RMSE there
    (with the test RMSE at that round, its final objective and train / test RMSE, the lowest
    test RMSE of any dmp run, and where cmfrec's value came from), else "not reached".
  - "... / cmfrec 1T, time to cmfrec's best objective": the same with t_obj over the fastest
    cmfrec time to the target objective, per dmp run, with the iteration reaching it and the
    test RMSE there; information, except for local ccd++ at rank 200 on wp, where it is the
    comparison with the target <= 1.0 (objective-based, since there the test-RMSE target is
    an early-stopping value of an unconverged cmfrec).
  - "Dask W=1 / W=2 <method>", for ccd++ and for ccd: loop time for the same number of
    completed outer iterations (the smaller of the two runs' counts), time to the target
    test RMSE (with the whole fit() calls and the times to the fixed levels) and time to the
    target objective, each 1-worker over 2-worker; target >= 1.7 at rank 200 (at other
    ranks: information); a target not reached is named with the runs' best test RMSE.
    Below them, per W: the loop time, rounds and ms per round, the kernel time (sum over
    rounds of the slowest worker's ``push_s``, and of the mean worker's) and the loop time
    outside kernels (driver, scheduling, transfers; total, share and ms per round).
  PASS / MISS lines are repeated in the summary: on wp at rank 20 the test-RMSE comparison
  (and the objective-based one as "info"), at rank 200 the objective-based comparison, the
  test-RMSE one (with the reason when missed), and the three Dask ratios of each method.

Threads: every reference fit runs under ``threadpoolctl.threadpool_limits(nthreads)`` (its
BLAS and OpenMP pools), dmp local fits under ``threadpool_limits(1)``; the Dask workers get
OMP/MKL/OpenBLAS_NUM_THREADS=1 from distributed's ``nanny.pre-spawn-environ`` (checked and
printed).  dmp's Numba kernels are single-threaded.  Numba is warmed up (in-process and on
every cluster) before anything is timed.  The machine may be shared: read ratios, and the
load column.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import io
import json
import logging
import math
import os
import platform
import resource
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_info, threadpool_limits

from dmp.decomposition import MatrixFactorization
from dmp.io.synthetic import make_ratings

SEED = 0
TARGET_SLACK = 1e-3  # target = best cmfrec test RMSE x (1 + TARGET_SLACK)
OBJ_SLACK = 1e-4  # target objective = best cmfrec objective x (1 + OBJ_SLACK)
CONV_TOL = 1e-4  # reference sweep: consecutive counts agreeing to this (relative) = converged
PLATEAU = 0.95  # ... but only below this fraction of the zero predictor's test RMSE
SPEEDUP_TARGET = 1.7  # Dask 1 worker / 2 workers at rank 200
SPEEDUP_RANK = 200
RATIO_TARGET = 1.0  # dmp 1 worker / cmfrec 1 thread, time to target

CMFREC_COUNTS = (1, 2, 3, 5, 8, 12, 20)
SPEC_CMFREC_COUNTS = (1, 3, 5, 10, 20)  # every count runs on spec (no early stop)
LIBMF_COUNTS = (5, 10, 20, 40)
SURPRISE_COUNTS = (5, 20)
QUICK_COUNTS = {"cmfrec": (1, 2, 3, 5, 8, 12), "libmf": (5, 10, 20), "surprise": (5, 20)}

PROBLEMS = {
    "wp": dict(title="wp: 10,000 x 2,000, 2M ratings (1.8M train), true rank 20, noise 0.5",
               gen=dict(n_users=10_000, n_items=2_000), levels=(0.60, 0.55, 0.54)),
    "spec": dict(title="spec: 50,000 x 10,000, 2M ratings (1.8M train), true rank 20, "
                       "noise 0.5", gen={}, rank=20, levels=(1.0, 0.9)),
}
QUICK = {
    "wp": dict(title="wp (quick): 2,000 x 500, 100k ratings, true rank 10, noise 0.5",
               gen=dict(n_users=2_000, n_items=500, n_obs=100_000, rank=10),
               levels=(0.60, 0.55, 0.54)),
    "spec": dict(title="spec (quick): 10,000 x 2,000, 100k ratings, true rank 10, noise 0.5",
                 gen=dict(n_users=10_000, n_items=2_000, n_obs=100_000, rank=10), rank=10,
                 levels=(1.0, 0.9)),
}
# (label, alpha, reg_scaling) of the spec settings
SPEC_SETTINGS = (("unscaled", 0.05, "none"), ("unscaled", 10.0, "none"),
                 ("per-rating", 0.05, "count"))
WP_ALPHA = 0.05


# ----------------------------------------------------------------------------- helpers
def fmt(x, spec=".3f", none="-"):
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else format(x, spec)


def quiet_import(name):
    """Import a module whose import prints to stdout (libmf does); None if it fails."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return __import__(name)
    except Exception:
        return None


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
    for dist in ("numpy", "scipy", "scikit-learn", "numba", "dask", "distributed", "zarr",
                 "threadpoolctl", "cmfrec", "libmf", "scikit-surprise", "dmp"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except Exception as exc:  # reported, not fatal
            versions[dist] = f"unavailable ({type(exc).__name__})"
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
    pools = [f"{p.get('internal_api')}:{Path(p.get('filepath', '?')).name}"
             f"={p.get('num_threads')}" for p in threadpool_info()]
    try:
        import dask
        import distributed  # noqa: F401  (loads distributed's config defaults)

        worker_env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    except Exception:
        worker_env = {}
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu,
            "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
            "mem_gib": mem_gb, "loadavg": os.getloadavg(), "platform": platform.platform(),
            "versions": versions, "thread_pools": pools,
            "dask_worker_env": {k: v for k, v in worker_env.items() if "THREADS" in k}}


def sq_err(P, Q, data, chunk=50_000):
    """Sum of squared errors of ``P[u] . Q[i]`` against ``r``, float64 (chunked: rank 200 x
    1.8M would be 2.9 GB)."""
    u, i, r = data
    P = np.asarray(P, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    se = 0.0
    for s in range(0, len(r), chunk):
        e = r[s:s + chunk] - np.einsum("ij,ij->i", P[u[s:s + chunk]], Q[i[s:s + chunk]])
        se += float(e @ e)
    return se


def rmse(P, Q, data):
    return math.sqrt(sq_err(P, Q, data) / len(data[2]))


def objective_fn(data, alpha, scaling):
    """-> objective(P, Q, train squared error): ``sse + alpha (|P|^2 + |Q|^2)`` (unscaled) or
    ``sse + alpha (sum_u n_u |p_u|^2 + sum_i n_i |q_i|^2)`` (per-rating), float64; dmp's
    objective with ``center=False``."""
    n_users, n_items = data["shape"]
    cu = np.bincount(data["train"][0], minlength=n_users).astype(np.float64)
    ci = np.bincount(data["train"][1], minlength=n_items).astype(np.float64)

    def sqnorms(F):
        F = np.asarray(F, dtype=np.float64)
        return np.einsum("ij,ij->i", F, F)

    def objective(P, Q, sse):
        p2, q2 = sqnorms(P), sqnorms(Q)
        reg = cu @ p2 + ci @ q2 if scaling == "count" else p2.sum() + q2.sum()
        return sse + alpha * float(reg)

    return objective


def pad_rows(F, n):
    """libmf sizes its factors by the largest index seen in training; pad to ``n`` rows."""
    F = np.asarray(F)
    if len(F) >= n:
        return F[:n]
    return np.vstack([F, np.zeros((n - len(F), F.shape[1]), F.dtype)])


def load1():
    return float(os.getloadavg()[0])


# ----------------------------------------------------------------------------- references
def cmfrec_fit(data, k, alpha, scale_lam, use_cg, nthreads):
    """-> fit(n_iter) -> (seconds, user factors, item factors)."""
    import cmfrec

    X = data["coo"]

    def fit(n_iter):
        m = cmfrec.CMF(method="als", k=k, lambda_=alpha, scale_lam=scale_lam, use_cg=use_cg,
                       finalize_chol=False, center=False, user_bias=False, item_bias=False,
                       niter=n_iter, nthreads=nthreads, verbose=False,
                       precompute_for_predictions=False, random_state=SEED)
        with threadpool_limits(nthreads):
            t0 = time.perf_counter()
            m.fit(X)
            t = time.perf_counter() - t0
        return t, m.A_, m.B_

    return fit


def libmf_fit(data, k, alpha, nthreads):
    if quiet_import("libmf.mf") is None:
        raise ImportError("libmf is not importable")
    mf = sys.modules["libmf.mf"]
    n_users, n_items = data["shape"]
    X = np.column_stack(data["train"]).astype(np.float32)

    def fit(n_iter):
        m = mf.MF(fun=0, k=k, nr_threads=nthreads, nr_iters=n_iter, lambda_p1=0.0,
                  lambda_q1=0.0, lambda_p2=alpha, lambda_q2=alpha, eta=0.1, quiet=True)
        with threadpool_limits(nthreads):
            t0 = time.perf_counter()
            m.fit(X)
            t = time.perf_counter() - t0
        return t, pad_rows(m.p_factors(), n_users), pad_rows(m.q_factors(), n_items)

    return fit


def surprise_trainset(data):
    """A surprise Trainset built from the arrays directly (inner id = our id)."""
    from surprise import Trainset

    u, i, r = data["train"]
    n_users, n_items = data["shape"]
    order = np.argsort(u, kind="stable")
    us, is_, rs = u[order], i[order].tolist(), r[order].tolist()
    starts = np.searchsorted(us, np.arange(n_users + 1))
    ur = defaultdict(list)
    for uid in range(n_users):
        a, b = int(starts[uid]), int(starts[uid + 1])
        if b > a:
            ur[uid] = list(zip(is_[a:b], rs[a:b]))
    # SVD uses ur, n_users, n_items (factor sizes) only; ir is left empty
    return Trainset(ur, defaultdict(list), n_users, n_items, len(r),
                    (float(r.min()), float(r.max())), {x: x for x in range(n_users)},
                    {x: x for x in range(n_items)})


def surprise_fit(trainset, k, alpha):
    from surprise import SVD

    def fit(n_epochs):
        algo = SVD(n_factors=k, n_epochs=n_epochs, biased=False, lr_all=0.005, reg_all=alpha,
                   random_state=SEED)
        with threadpool_limits(1):
            t0 = time.perf_counter()
            algo.fit(trainset)
            t = time.perf_counter() - t0
        return t, algo.pu, algo.qi

    return fit


def sweep(fit, counts, data, *, fit_cap, budget, predicted_rate=None, early_stop=True,
          objective=None):
    """Fit at increasing iteration counts (each from scratch) until converged / capped.

    ``predicted_rate``: seconds per iteration expected for the first fit (from the previous
    rank), or None to run the first fit unconditionally.  ``early_stop``: apply the
    "converged" and "test RMSE rising" rules (see the module docstring).  ``objective``:
    ``objective(P, Q, train sse)`` recorded per fit (cmfrec), or None.
    """
    points, spent, rate, status = [], 0.0, predicted_rate, "all counts run"
    load = load1()
    for n in counts:
        if rate is not None:
            pred = rate * n
            if pred > fit_cap:
                status = (f"{'skipped' if not points else 'stopped'}: {n} iterations "
                          f"predicted {pred:.0f} s > fit cap {fit_cap:.0f} s")
                break
            if spent + pred > budget:
                status = (f"stopped: {n} iterations predicted {pred:.0f} s would exceed the "
                          f"{budget:.0f} s sweep budget ({spent:.0f} s spent)")
                break
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t, P, Q = fit(n)
        except Exception as exc:
            status = f"failed at {n} iterations: {type(exc).__name__}: {exc}"
            break
        spent += t
        sse = sq_err(P, Q, data["train"])
        te, tr = rmse(P, Q, data["test"]), math.sqrt(sse / len(data["train"][2]))
        points.append({"iters": n, "fit_s": t, "test_rmse": te, "train_rmse": tr})
        if objective is not None:
            points[-1]["objective"] = objective(P, Q, sse)
        rate = t / n
        if not (math.isfinite(te) and math.isfinite(tr)):
            status = f"diverged at {n} iterations (non-finite RMSE)"
            break
        if early_stop and len(points) >= 2:
            a = points[-2]["test_rmse"]
            # agreement counts only off the plateau of the zero predictor (an ALS start near
            # 0 can sit there for several iterations before it escapes)
            if abs(te - a) <= CONV_TOL * a and te < PLATEAU * data["rmse0"]:
                status = "converged"
                break
            # overfitting: test RMSE up twice in a row while train RMSE went down both times
            if len(points) >= 3 and points[-3]["test_rmse"] < a < te and \
                    points[-3]["train_rmse"] > points[-2]["train_rmse"] > tr:
                status = "test RMSE rising"
                break
    return {"points": points, "status": status, "spent_s": spent, "rate": rate, "load": load}


def ref_time_to(points, level, what="test_rmse"):
    """Smallest fit time among the fits whose ``what`` (test RMSE or objective) <= level
    (None: none)."""
    ts = [p["fit_s"] for p in points if p.get(what, math.inf) <= level]
    return min(ts) if ts else None


# ----------------------------------------------------------------------------- dmp
def run_dmp(data, *, k, alpha, reg_scaling, method, max_iter, budget, backend="local",
            n_workers=1):
    """One dmp fit; per-round loop times from history_, fit()-call times from a callback."""
    stamps, why = [], []
    t0 = [time.perf_counter()]

    def callback(round_, metrics):
        stamps.append(time.perf_counter() - t0[0])
        if stamps[-1] > budget:
            why.append(f"stopped at the {budget:.0f} s budget")
        return bool(why)

    est = MatrixFactorization(n_components=k, alpha=alpha, method=method, max_iter=max_iter,
                              center=False, reg_scaling=reg_scaling, tol=None,
                              backend=backend, n_workers=n_workers, random_state=SEED,
                              callback=callback)
    load = load1()
    try:
        with warnings.catch_warnings(), threadpool_limits(1):
            warnings.simplefilter("ignore")
            t0[0] = time.perf_counter()
            est.fit(data["coo"], X_val=data["test_coo"])
            fit_s = time.perf_counter() - t0[0]
    except Exception as exc:
        return {"status": f"failed: {type(exc).__name__}: {exc}", "load": load}
    h = est.history_
    t = np.asarray(h["time"], dtype=float)
    v = np.asarray(h["valid_rmse"], dtype=float)
    obj = np.asarray(h["objective"], dtype=float)
    it = np.asarray(h["iteration"], dtype=int)
    st = np.asarray(stamps, dtype=float) if len(stamps) == len(t) else None
    setup = float(st[0] - t[0]) if st is not None else None
    curve = []
    for j in range(1, int(it.max(initial=0)) + 1):
        idx = np.flatnonzero(it == j)
        if len(idx):
            e = int(idx[-1])
            curve.append({"iters": j, "time": float(t[e]), "test_rmse": float(v[e]),
                          "train_rmse": float(h["train_rmse"][e]), "objective": float(obj[e]),
                          "complete": bool(e == len(it) - 1 or it[e + 1] > j)})
    final_test = -est.score(data["test_coo"])
    push = np.asarray(h["push_s"], dtype=float).reshape(len(t), -1)
    status = why[0] if why else "ok"
    if not abs(final_test - float(v[-1])) <= 1e-6 * final_test:  # NaN counts as a mismatch
        status += (f"; INCONSISTENT: last history_ valid_rmse {float(v[-1]):.4g} != score() "
                   f"{final_test:.4g}")
    return {
        "status": status, "load": load, "fit_s": fit_s, "setup_s": setup,
        "wall_s": float(est.wall_time_), "n_iter": int(est.n_iter_), "rounds": len(t),
        "time": t, "valid_rmse": v, "obj": obj, "iteration": it,
        "phase": np.asarray(h["phase"]),
        "curve": curve, "test_rmse": float(final_test),
        "best_test_rmse": (float(np.nanmin(v[it >= 1])) if np.isfinite(v[it >= 1]).any()
                           else None),
        "train_rmse": float(h["train_rmse"][-1]), "objective": float(est.objective_),
        "score_check": abs(final_test - float(v[-1])),
        # kernel time: per round, the slowest worker's push (the critical path) / the mean
        "kernel_s": float(push.max(axis=1).sum()), "kernel_mean_s": float(push.mean(axis=1).sum()),
        "round_s": float(np.sum(h["round_s"])), "loop_s": float(t[-1]),
    }


def dmp_first_round(run, level, what="valid_rmse"):
    """Index of the first round with ``what`` (``"valid_rmse"``: test RMSE, ``"obj"``:
    objective) <= level, or None."""
    if "time" not in run:
        return None
    # round 0 ("init", W = 0) predicts 0 for every rating: not a fit, never counted
    hit = np.flatnonzero((run[what] <= level) & (run["iteration"] >= 1))
    return int(hit[0]) if len(hit) else None


def dmp_time_to(run, level, what="valid_rmse"):
    """(loop time, loop time + setup, iteration, phase) at ``dmp_first_round``, or Nones."""
    i = dmp_first_round(run, level, what)
    if i is None:
        return None, None, None, None
    t = float(run["time"][i])
    setup = run["setup_s"]
    return t, (t + setup if setup is not None else None), int(run["iteration"][i]), \
        str(run["phase"][i])


def dmp_time_at_iter(run, n):
    """Loop time at the end of outer iteration n (None if not completed)."""
    for c in run.get("curve", []):
        if c["iters"] == n and c["complete"]:
            return c["time"]
    return None


def dmp_iters(problem, k, method, quick):
    """Outer iterations of a dmp fit (see the module docstring)."""
    if problem == "spec":
        return 10 if quick else 20
    if quick:
        return 15 if k <= 10 else 3
    return {"ccd++": 15, "ccd": 20}[method] if k <= 50 else 20


def warm_up(client=None, n_workers=1):
    """Compile dmp's Numba kernels (in this process or on the cluster's workers)."""
    tr, te, _, _ = make_ratings(n_users=60, n_items=40, n_obs=800, rank=3, seed=1)
    X = sp.coo_matrix((tr[2], (tr[0], tr[1])), shape=(60, 40))
    Xv = sp.coo_matrix((te[2], (te[0], te[1])), shape=(60, 40))
    for method in ("ccd++", "ccd"):
        for scaling in ("none", "count"):
            MatrixFactorization(n_components=3, method=method, max_iter=2, center=False,
                                reg_scaling=scaling, tol=None,
                                backend=client if client is not None else "local",
                                n_workers=n_workers, random_state=0).fit(X, X_val=Xv)
        if client is not None:
            break


# ----------------------------------------------------------------------------- settings
def reference_runs(data, k, alpha, scaling, *, problem, args, prev_rates, trainset_cache):
    """All reference sweeps of one setting: {label: result}."""
    counts = dict(QUICK_COUNTS) if args.quick else {
        "cmfrec": CMFREC_COUNTS if problem == "wp" else SPEC_CMFREC_COUNTS,
        "libmf": LIBMF_COUNTS, "surprise": SURPRISE_COUNTS}
    jobs = []  # (label, solver family, threads, cost exponent in k, factory)
    scale_lam = scaling == "count"
    cg_variants = (False, True) if problem == "wp" else (False,)
    for use_cg in cg_variants:
        for nt in (1, 2):
            name = f"cmfrec ALS-{'cg' if use_cg else 'chol'}"
            jobs.append((name, "cmfrec", nt, 1 if use_cg else 2,
                         lambda nt=nt, cg=use_cg: cmfrec_fit(data, k, alpha, scale_lam, cg, nt)))
    if problem == "wp" or scaling == "count":  # libmf / surprise: per-rating L2 only
        for nt in (1, 2):
            jobs.append(("libmf FPSGD", "libmf", nt, 1,
                         lambda nt=nt: libmf_fit(data, k, alpha, nt)))
        if not args.skip_surprise:
            def make_surprise():
                if "ts" not in trainset_cache:
                    t0 = time.perf_counter()
                    trainset_cache["ts"] = surprise_trainset(data)
                    trainset_cache["build_s"] = time.perf_counter() - t0
                return surprise_fit(trainset_cache["ts"], k, alpha)
            jobs.append(("surprise SVD", "surprise", 1, 1, make_surprise))
    out = {}
    for label, family, nt, expo, factory in jobs:
        key = f"{label} {nt}T"
        form = ("unscaled" if family == "cmfrec" and not scale_lam else "per-rating")
        prev = prev_rates.get((problem, key))
        predicted = prev[1] * (k / prev[0]) ** expo if prev and prev[0] != k else None
        try:
            fit = factory()
        except Exception as exc:
            out[key] = {"solver": label, "threads": nt, "form": form, "points": [],
                        "status": f"unavailable: {type(exc).__name__}: {exc}", "load": load1()}
            print(f"  {key}: {out[key]['status']}", flush=True)
            continue
        res = sweep(fit, counts[family], data, fit_cap=args.fit_cap, budget=args.budget,
                    predicted_rate=predicted, early_stop=problem == "wp",
                    objective=objective_fn(data, alpha, scaling) if family == "cmfrec"
                    else None)
        res.update(solver=label, threads=nt, form=form, family=family,
                   predicted_first_rate=predicted)
        if res["points"]:
            prev_rates[(problem, key)] = (k, res["rate"])
        out[key] = res
        curve = " ".join(f"{p['iters']}:{p['fit_s']:.2f}s/{p['test_rmse']:.4f}"
                         for p in res["points"])
        print(f"  {key} ({form} {alpha:g}): {curve or '-'}  [{res['status']}]", flush=True)
    if "build_s" in trainset_cache:
        out["_surprise_trainset_build_s"] = trainset_cache["build_s"]
    return out


def dmp_runs(data, k, alpha, scaling, *, problem, args):
    methods = ("ccd++", "ccd") if problem == "wp" else ("ccd++",)
    out = {}
    for method in methods:
        key = f"dmp local 1w {method}"
        r = run_dmp(data, k=k, alpha=alpha, reg_scaling=scaling, method=method,
                    max_iter=dmp_iters(problem, k, method, args.quick), budget=args.budget)
        r.update(solver=f"dmp {method}", workers=1, backend="local")
        out[key] = r
        print(f"  {key}: {curve_str(r)}  [{r['status']}]", flush=True)
    return out


def curve_str(r):
    return " ".join(f"{c['iters']}:{c['time']:.2f}s/{c['test_rmse']:.4f}"
                    for c in r.get("curve", [])) or "-"


DASK_METHODS = ("ccd++", "ccd")


@contextlib.contextmanager
def quiet_client(n_workers):
    """A client of a fresh LocalCluster of single-threaded worker processes, created under
    ``QUIET_DASK_CONFIG`` as ``dmp run``'s embedded cluster is."""
    from distributed import Client

    from dmp.engine.backends.dask import quiet_local_cluster

    with quiet_local_cluster(n_workers, dashboard_address=None,
                             silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        yield client


def run_dask(problem, datas, settings, args):
    """dmp ccd++ and ccd on LocalClusters with 1 and 2 workers:
    {(setting index, method, W): run}."""
    out = {}
    for W in (1, 2):
        try:
            t0 = time.perf_counter()
            with quiet_client(W) as client:
                warm_up(client, W)
                print(f"  LocalCluster W={W} started and warmed up in "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
                for idx, (k, alpha, scaling) in enumerate(settings):
                    for method in DASK_METHODS:
                        r = run_dmp(datas, k=k, alpha=alpha, reg_scaling=scaling,
                                    method=method,
                                    max_iter=dmp_iters(problem, k, method, args.quick),
                                    budget=args.budget, backend=client, n_workers=W)
                        r.update(solver=f"dmp {method}", workers=W, backend="dask")
                        out[idx, method, W] = r
                        print(f"  dmp dask {W}w {method} rank {k}: {curve_str(r)}  "
                              f"[{r['status']}]", flush=True)
        except Exception as exc:
            for idx in range(len(settings)):
                for method in DASK_METHODS:
                    out.setdefault((idx, method, W),
                                   {"status": f"failed: {type(exc).__name__}: {exc}",
                                    "solver": f"dmp {method}", "workers": W,
                                    "backend": "dask"})
            print(f"  Dask W={W} failed: {type(exc).__name__}: {exc}", flush=True)
    return out


# ----------------------------------------------------------------------------- reporting
def summarise_setting(setting, levels):
    """Targets, per-solver rows and ratios of one setting (fills setting in place)."""
    refs, dmps = setting["references"], setting["dmp"]
    cmfrecs = {key: r for key, r in refs.items()
               if isinstance(r, dict) and r.get("family") == "cmfrec"}
    cm = [(key, p) for key, r in cmfrecs.items() for p in r["points"]]
    if cm:
        key, best = min(cm, key=lambda kp: kp[1]["test_rmse"])
        capped = [k2 for k2, r in cmfrecs.items()
                  if r["status"] not in ("converged", "test RMSE rising")]
        last = refs[key]["points"][-1]["test_rmse"]
        setting["cmfrec_best"] = {"test_rmse": best["test_rmse"], "solver": key,
                                  "iters": best["iters"], "objective": best.get("objective"),
                                  "not_converged": capped, "last_of_sweep": last,
                                  "overfits": last > best["test_rmse"] * (1 + TARGET_SLACK)}
        setting["target"] = best["test_rmse"] * (1 + TARGET_SLACK)
    else:
        setting["cmfrec_best"], setting["target"] = None, None
    cmo = [(key, j, p) for key, r in cmfrecs.items() for j, p in enumerate(r["points"])
           if p.get("objective") is not None and math.isfinite(p["objective"])]
    if cmo:
        key, j, best = min(cmo, key=lambda kjp: kjp[2]["objective"])
        pts = refs[key]["points"]
        prev = pts[j - 1]["objective"] if j else None
        setting["cmfrec_best_objective"] = {
            "objective": best["objective"], "solver": key, "iters": best["iters"],
            "test_rmse": best["test_rmse"], "sweep_status": refs[key]["status"],
            "converged": refs[key]["status"] == "converged",
            "prev_iters": pts[j - 1]["iters"] if j else None,
            "rel_change_from_prev": (prev - best["objective"]) / prev if prev else None}
        setting["target_objective"] = best["objective"] * (1 + OBJ_SLACK)
    else:
        setting["cmfrec_best_objective"], setting["target_objective"] = None, None
    target, tobj = setting["target"], setting["target_objective"]
    all_levels = ([("target", target)] if target is not None else []) + \
        [(f"{L:g}", L) for L in levels]
    for r in refs.values():
        if isinstance(r, dict) and "points" in r:
            r["time_to"] = {name: ref_time_to(r["points"], L) for name, L in all_levels}
            if r.get("family") == "cmfrec" and tobj is not None:
                r["time_to"]["objective"] = ref_time_to(r["points"], tobj, "objective")
    for r in dmps.values():
        r["time_to"] = {}
        r["time_to_incl_setup"] = {}
        r["reached_at"] = {}
        goals = [(name, L, "valid_rmse") for name, L in all_levels]
        if tobj is not None:
            goals.append(("objective", tobj, "obj"))
        for name, L, what in goals:
            t, ts, it, ph = dmp_time_to(r, L, what)
            r["time_to"][name], r["time_to_incl_setup"][name] = t, ts
            r["reached_at"][name] = None if it is None else f"{it} (round phase {ph})"
        i = dmp_first_round(r, tobj, "obj") if tobj is not None else None
        r["test_rmse_at_objective"] = None if i is None else float(r["valid_rmse"][i])

    def ref_best(threads, goal):
        ts = [r["time_to"].get(goal) for r in cmfrecs.values()
              if r["threads"] == threads and r.get("time_to")]
        ts = [t for t in ts if t is not None]
        return min(ts) if ts else None

    ratios = {}
    c1, c2 = ref_best(1, "target"), ref_best(2, "target")
    o1, o2 = ref_best(1, "objective"), ref_best(2, "objective")
    setting["cmfrec_time_to_target"] = {"1T": c1, "2T": c2}
    setting["cmfrec_time_to_objective"] = {"1T": o1, "2T": o2}
    for key, r in dmps.items():
        two = r.get("workers") == 2
        ref, oref = (c2, o2) if two else (c1, o1)
        t, ts = r["time_to"].get("target"), r["time_to_incl_setup"].get("target")
        u, us = r["time_to"].get("objective"), r["time_to_incl_setup"].get("objective")
        ratios[key] = {"vs": "cmfrec 2T" if two else "cmfrec 1T",
                       "ratio": t / ref if t is not None and ref else None,
                       "ratio_incl_setup": ts / ref if ts is not None and ref else None,
                       "objective_ratio": u / oref if u is not None and oref else None,
                       "objective_ratio_incl_setup": us / oref if us is not None and oref
                       else None}
    setting["ratios_vs_cmfrec"] = ratios

    # no dmp run reaches the target test RMSE: why (see the module docstring)
    ran = {key: r for key, r in dmps.items() if "curve" in r}
    setting["target_missed_reason"] = None
    if target is not None and ran and not any(r["time_to"].get("target") is not None
                                              for r in ran.values()):
        bkey = min(ran, key=lambda x: ran[x]["best_test_rmse"] or math.inf)
        br = ran[bkey]
        vv = np.where(br["iteration"] >= 1, br["valid_rmse"], np.inf)
        bit = int(br["iteration"][int(np.argmin(vv))])
        lowest = (f"the lowest test RMSE of any dmp run is {fmt(br['best_test_rmse'], '.4f')}"
                  f" ({bkey}, iteration {bit})")
        past = {key: r for key, r in ran.items() if r["time_to"].get("objective") is not None}
        bo = setting["cmfrec_best"]
        if past:
            key = "dmp local 1w ccd++" if "dmp local 1w ccd++" in past else next(iter(past))
            r = past[key]
            src = (f"cmfrec's {bo['test_rmse']:.4f} comes from {bo['solver']} after "
                   f"{bo['iters']} iterations (objective {fmt(bo['objective'], '.6g')}"
                   + ("" if bo["solver"] not in bo["not_converged"] else ", not converged")
                   + ")")
            setting["target_missed_reason"] = (
                f"overfitting: {len(past)} of {len(ran)} dmp runs reach cmfrec's best "
                f"objective (they optimise further) but none its test RMSE; {key} reaches "
                f"it in iteration {r['reached_at']['objective']} with test RMSE "
                f"{r['test_rmse_at_objective']:.4f} there and ends at objective "
                f"{r['objective']:.6g}, train RMSE {r['train_rmse']:.4f}, test RMSE "
                f"{r['test_rmse']:.4f}; {lowest}; {src}, an early-stopping value")
        else:
            setting["target_missed_reason"] = (
                f"not reached: {lowest}, and no dmp run reaches cmfrec's best objective either")

    setting["dask_speedup"] = {}
    for method in DASK_METHODS:
        d1 = dmps.get(f"dmp dask 1w {method}")
        d2 = dmps.get(f"dmp dask 2w {method}")
        if not (d1 and d2 and "curve" in d1 and "curve" in d2):
            continue
        done1 = [c["iters"] for c in d1["curve"] if c["complete"]]
        done2 = [c["iters"] for c in d2["curve"] if c["complete"]]
        n = min(max(done1, default=0), max(done2, default=0))
        t1, t2 = (dmp_time_at_iter(d, n) for d in (d1, d2)) if n else (None, None)
        g1, g2 = d1["time_to"].get("target"), d2["time_to"].get("target")
        q1, q2 = d1["time_to"].get("objective"), d2["time_to"].get("objective")
        setting["dask_speedup"][method] = {
            "iters": n, "t1": t1, "t2": t2, "same_iters": t1 / t2 if t1 and t2 else None,
            "target_t1": g1, "target_t2": g2, "to_target": g1 / g2 if g1 and g2 else None,
            "objective_t1": q1, "objective_t2": q2,
            "to_objective": q1 / q2 if q1 and q2 else None,
            "best_test_1": d1.get("best_test_rmse"), "best_test_2": d2.get("best_test_rmse"),
            "fit_s_1": d1.get("fit_s"), "fit_s_2": d2.get("fit_s"),
            "levels": {name: (d1["time_to"][name] / d2["time_to"][name]
                              if d1["time_to"].get(name) and d2["time_to"].get(name)
                              else None) for name, _ in all_levels}}


def verdict(ok):
    return "PASS" if ok else "MISS"


def print_setting(setting, levels, summary, quick, max_rank):
    k, alpha, form = setting["rank"], setting["alpha"], setting["form"]
    obj = ("sum_obs (r - w.h)^2 + {a} (|W|^2 + |H|^2)" if form == "unscaled" else
           "sum_obs (r - w.h)^2 + {a} (sum_u n_u |w_u|^2 + sum_i n_i |h_i|^2)").format(a=alpha)
    name = setting["name"]
    wp = setting["problem"] == "wp"
    # the setting whose comparison is objective-based and whose Dask speedup has a target
    high = wp and (k == SPEEDUP_RANK or (quick and k == max_rank))
    stand_in = f"; quick: rank {k} stands in for {SPEEDUP_RANK}" if quick and high else ""
    print(f"\n--- {name}: rank {k}, alpha {alpha:g} {form} (objective {obj}) ---")
    best = setting["cmfrec_best"]
    target = setting["target"]
    if best:
        note = (f"; cmfrec sweeps not converged within their counts / caps: "
                f"{', '.join(best['not_converged'])}" if best["not_converged"] else "")
        print(f"target test RMSE {target:.5f} = best cmfrec test RMSE {best['test_rmse']:.5f} "
              f"({best['solver']}, {best['iters']} it) x (1 + {TARGET_SLACK:g}){note}")
        if best["overfits"]:
            print(f"NOTE: overfitting setting: the best cmfrec fit ({best['solver']}) reached "
                  f"{best['test_rmse']:.4f} after {best['iters']} iteration(s) and ended its "
                  f"sweep at {best['last_of_sweep']:.4f}; with {k} x (n_users + n_items) "
                  f"parameters at this alpha more optimisation gives a worse test RMSE, so the "
                  f"time to target measures early stopping, not convergence speed")
    else:
        print("no cmfrec fit: no target")
    bo, tobj = setting["cmfrec_best_objective"], setting["target_objective"]
    if bo:
        step = (f"; its previous count ({bo['prev_iters']} it) was "
                f"{100 * bo['rel_change_from_prev']:.3g}% higher"
                if bo["rel_change_from_prev"] is not None else "")
        conv = ("converged (its sweep's test RMSE)" if bo["converged"] else
                f"not converged: its sweep ended with '{bo['sweep_status']}'")
        print(f"target objective {tobj:.7g} = best cmfrec objective {bo['objective']:.7g} "
              f"({bo['solver']}, {bo['iters']} it; test RMSE {bo['test_rmse']:.4f}) x "
              f"(1 + {OBJ_SLACK:g}); {conv}{step}")
    if (setting.get("target_missed_reason") or "").startswith("overfitting"):
        print(f"NOTE: no dmp run reaches the target test RMSE: "
              f"{setting['target_missed_reason']}")
    lv = [f"t<={L:g}" for L in levels]
    head = (f"{'solver':<24}{'par':>4}{'form':>11}{'iters':>6}{'fit s':>8}{'setup s':>8}"
            f"{'test':>8}{'best':>8}{'train':>8}{'t_target':>9}{'+setup':>8}"
            + "".join(f"{x:>8}" for x in lv) + f"{'objective':>13}{'t_obj':>8}"
            + f"{'load':>6}  status")
    print(head)
    print("-" * len(head))
    for key, r in setting["references"].items():
        if not isinstance(r, dict):
            continue
        pts = r.get("points", [])
        last = pts[-1] if pts else {}
        bt = min((p["test_rmse"] for p in pts), default=None)
        tt = r.get("time_to", {})
        print(f"{r['solver']:<24}{str(r['threads']) + 'T':>4}{r['form']:>11}"
              f"{fmt(last.get('iters'), 'd'):>6}{fmt(last.get('fit_s'), '.2f'):>8}{'':>8}"
              f"{fmt(last.get('test_rmse'), '.4f'):>8}{fmt(bt, '.4f'):>8}"
              f"{fmt(last.get('train_rmse'), '.4f'):>8}{fmt(tt.get('target'), '.2f'):>9}"
              f"{'':>8}" + "".join(f"{fmt(tt.get(f'{L:g}'), '.2f'):>8}" for L in levels)
              + f"{fmt(last.get('objective'), '.7g'):>13}{fmt(tt.get('objective'), '.2f'):>8}"
              + f"{fmt(r.get('load'), '.1f'):>6}  {r['status']}")
    for key, r in setting["dmp"].items():
        label = f"dmp {r.get('backend', '?')} {r.get('solver', '').split()[-1]}"
        tt, ts = r.get("time_to", {}), r.get("time_to_incl_setup", {})
        print(f"{label:<24}{str(r.get('workers', '?')) + 'w':>4}{form:>11}"
              f"{fmt(r.get('n_iter'), 'd'):>6}{fmt(r.get('fit_s'), '.2f'):>8}"
              f"{fmt(r.get('setup_s'), '.2f'):>8}{fmt(r.get('test_rmse'), '.4f'):>8}"
              f"{fmt(r.get('best_test_rmse'), '.4f'):>8}{fmt(r.get('train_rmse'), '.4f'):>8}"
              f"{fmt(tt.get('target'), '.2f'):>9}{fmt(ts.get('target'), '.2f'):>8}"
              + "".join(f"{fmt(tt.get(f'{L:g}'), '.2f'):>8}" for L in levels)
              + f"{fmt(r.get('objective'), '.7g'):>13}{fmt(tt.get('objective'), '.2f'):>8}"
              + f"{fmt(r.get('load'), '.1f'):>6}  {r['status']}")
    print("curves (iterations:seconds/test RMSE; references: one fit per count; dmp: loop "
          "clock at the end of each outer iteration):")
    for key, r in setting["references"].items():
        if isinstance(r, dict) and r.get("points"):
            print(f"  {key:<22} " + " ".join(f"{p['iters']}:{p['fit_s']:.2f}/{p['test_rmse']:.4f}"
                                            for p in r["points"]))
    for key, r in setting["dmp"].items():
        if r.get("curve"):
            print(f"  {key:<22} " + " ".join(f"{c['iters']}:{c['time']:.2f}/{c['test_rmse']:.4f}"
                                            for c in r["curve"]))
    if tobj is not None:
        print("objective curves (iterations:objective / target objective - 1, in units of "
              "1e-4; <= 0: reached):")
        for key, r in setting["references"].items():
            if isinstance(r, dict) and r.get("family") == "cmfrec" and r.get("points"):
                print(f"  {key:<22} " + " ".join(
                    f"{p['iters']}:{1e4 * (p['objective'] / tobj - 1):.3g}"
                    for p in r["points"]))
        for key, r in setting["dmp"].items():
            if r.get("curve"):
                print(f"  {key:<22} " + " ".join(
                    f"{c['iters']}:{1e4 * (c['objective'] / tobj - 1):.3g}"
                    for c in r["curve"]))
    if "_surprise_trainset_build_s" in setting["references"]:
        print(f"surprise Trainset build {setting['references']['_surprise_trainset_build_s']:.1f}"
              " s (not in its fit times)")

    # ratio lines
    c1 = setting["cmfrec_time_to_target"]["1T"]
    c2 = setting["cmfrec_time_to_target"]["2T"]
    reason = setting.get("target_missed_reason")
    rmse_line, obj_line = [], []  # summary lines: test-RMSE based, objective-based
    print(f"cmfrec fastest time to target: 1T {fmt(c1, '.2f')} s, 2T {fmt(c2, '.2f')} s")
    for key, rr in setting["ratios_vs_cmfrec"].items():
        r = setting["dmp"][key]
        t = r["time_to"].get("target")
        ref = c2 if r.get("workers") == 2 else c1
        where = r["reached_at"].get("target")
        line = (f"{key} / {rr['vs']}, time to target: {fmt(t, '.2f')} / {fmt(ref, '.2f')} = "
                f"{fmt(rr['ratio'], '.2f')} (incl. setup {fmt(rr['ratio_incl_setup'], '.2f')})"
                f"{'' if where is None else f'; reached in iteration {where}'}")
        if wp and key == "dmp local 1w ccd++":
            ok = rr["ratio"] is not None and rr["ratio"] <= RATIO_TARGET
            why = f"; {reason}" if not ok and reason else ""
            line += f"  (target <= {RATIO_TARGET:g}) {verdict(ok)}"
            if why:
                line += ("; overfitting, see NOTE" if reason.startswith("overfitting")
                         else why)
            rmse_line.append(f"{verdict(ok)}  {name} rank {k}: dmp 1 worker / cmfrec 1 thread, "
                           f"time to target test RMSE {fmt(target, '.4f')}: "
                           f"{fmt(rr['ratio'], '.2f')} (<= {RATIO_TARGET:g})"
                           + (" [overfitting setting, see NOTE]"
                              if best and best["overfits"] else "") + why)
        print(line)
    if tobj is not None:
        o1 = setting["cmfrec_time_to_objective"]["1T"]
        o2 = setting["cmfrec_time_to_objective"]["2T"]
        print(f"cmfrec fastest time to target objective: 1T {fmt(o1, '.2f')} s, "
              f"2T {fmt(o2, '.2f')} s")
        for key, rr in setting["ratios_vs_cmfrec"].items():
            r = setting["dmp"][key]
            t = r["time_to"].get("objective")
            ref = o2 if r.get("workers") == 2 else o1
            where = r["reached_at"].get("objective")
            line = (f"{key} / {rr['vs']}, time to cmfrec's best objective: {fmt(t, '.2f')} / "
                    f"{fmt(ref, '.2f')} = {fmt(rr['objective_ratio'], '.2f')} (incl. setup "
                    f"{fmt(rr['objective_ratio_incl_setup'], '.2f')})"
                    + ("" if where is None else f"; reached in iteration {where}, test RMSE "
                       f"there {r['test_rmse_at_objective']:.4f}"))
            if key == "dmp local 1w ccd++" and wp:
                ok = rr["objective_ratio"] is not None and \
                    rr["objective_ratio"] <= RATIO_TARGET
                conv = "" if bo["converged"] else "; cmfrec's best not converged"
                text = (f"{name} rank {k}: dmp 1 worker / cmfrec 1 thread, OBJECTIVE-BASED, "
                        f"time to cmfrec's best objective {tobj:.7g}{conv}: "
                        f"{fmt(rr['objective_ratio'], '.2f')} (<= {RATIO_TARGET:g}{stand_in})")
                if high:
                    line += f"  (target <= {RATIO_TARGET:g}{stand_in}) {verdict(ok)}"
                obj_line.append(f"{verdict(ok) if high else 'info'}  {text}")
            print(line)
    # at the high rank the objective-based comparison is the one with the target
    summary += obj_line + rmse_line if high else rmse_line + obj_line
    for method, sp_ in setting.get("dask_speedup", {}).items():
        tag = f" (target >= {SPEEDUP_TARGET:g}{stand_in})" if high else ""
        ok1 = sp_["same_iters"] is not None and sp_["same_iters"] >= SPEEDUP_TARGET
        ok2 = sp_["to_target"] is not None and sp_["to_target"] >= SPEEDUP_TARGET
        ok3 = sp_["to_objective"] is not None and sp_["to_objective"] >= SPEEDUP_TARGET
        miss2 = ("" if sp_["to_target"] is not None else
                 f" [target not reached: best test RMSE W=1 {fmt(sp_['best_test_1'], '.4f')}, "
                 f"W=2 {fmt(sp_['best_test_2'], '.4f')}"
                 + ("; overfitting]" if reason and reason.startswith("overfitting")
                    else "]"))
        miss3 = ("" if sp_["to_objective"] is not None or tobj is None else
                 " [not reached by " + " / ".join(
                     f"W={W}" for W, q in ((1, sp_["objective_t1"]), (2, sp_["objective_t2"]))
                     if q is None) + "]")
        print(f"Dask W=1 / W=2 {method}, loop time for {sp_['iters']} iterations: "
              f"{fmt(sp_['t1'], '.2f')} / {fmt(sp_['t2'], '.2f')} = "
              f"{fmt(sp_['same_iters'], '.2f')}{tag}{' ' + verdict(ok1) if high else ''}")
        print(f"Dask W=1 / W=2 {method}, time to target: {fmt(sp_['target_t1'], '.2f')} / "
              f"{fmt(sp_['target_t2'], '.2f')} = {fmt(sp_['to_target'], '.2f')}{tag}"
              f"{' ' + verdict(ok2) if high else ''}{miss2}; whole fit() calls "
              f"{fmt(sp_['fit_s_1'], '.2f')} / {fmt(sp_['fit_s_2'], '.2f')}; to the levels "
              + ", ".join(f"{n}: {fmt(v, '.2f')}" for n, v in sp_["levels"].items()
                          if n != "target"))
        if tobj is not None:
            print(f"Dask W=1 / W=2 {method}, time to cmfrec's best objective: "
                  f"{fmt(sp_['objective_t1'], '.2f')} / {fmt(sp_['objective_t2'], '.2f')} = "
                  f"{fmt(sp_['to_objective'], '.2f')}{tag}{' ' + verdict(ok3) if high else ''}"
                  f"{miss3}")
        for W in (1, 2):
            d = setting["dmp"].get(f"dmp dask {W}w {method}", {})
            if "loop_s" in d:
                out_k = d["loop_s"] - d["kernel_s"]
                print(f"  {method} W={W}: loop {d['loop_s']:.2f} s over {d['rounds']} rounds "
                      f"({1e3 * d['loop_s'] / d['rounds']:.1f} ms/round); kernels (slowest "
                      f"worker per round) {d['kernel_s']:.2f} s, mean worker "
                      f"{d['kernel_mean_s']:.2f} s; outside kernels {out_k:.2f} s "
                      f"({100 * out_k / d['loop_s']:.0f}%, "
                      f"{1e3 * out_k / d['rounds']:.1f} ms/round)")
        if high:
            summary.append(f"{verdict(ok1)}  {name} rank {k}: Dask 1 worker / 2 workers "
                           f"{method}, {sp_['iters']} iterations: "
                           f"{fmt(sp_['same_iters'], '.2f')} (>= {SPEEDUP_TARGET:g})")
            summary.append(f"{verdict(ok2)}  {name} rank {k}: Dask 1 worker / 2 workers "
                           f"{method}, time to target test RMSE: {fmt(sp_['to_target'], '.2f')}"
                           f" (>= {SPEEDUP_TARGET:g}){miss2}")
            if tobj is not None:
                summary.append(f"{verdict(ok3)}  {name} rank {k}: Dask 1 worker / 2 workers "
                               f"{method}, time to cmfrec's best objective (objective-based): "
                               f"{fmt(sp_['to_objective'], '.2f')} (>= {SPEEDUP_TARGET:g})"
                               f"{miss3}")


# ----------------------------------------------------------------------------- speed-up
SPEEDUP_ITERS = {"ccd": 4, "ccd++": 2}


def speedup_runs(args):
    """The 1- vs 2-worker speed-up at the largest wp rank, 1- and 2-worker fits interleaved
    (``--repeat`` pairs, each on a fresh quiet LocalCluster) so that the machine's drift
    hits both alike: {method: {"1": [loop s], "2": [loop s], "ratio": median of pairs}}."""
    spec = QUICK["wp"] if args.quick else PROBLEMS["wp"]
    data, _ = load_problem("wp", spec)
    k = max(args.ranks)
    out = {}
    for method, iters in SPEEDUP_ITERS.items():
        iters = 2 if args.quick else iters
        loops = {1: [], 2: []}
        for rep in range(args.repeat):
            for W in (1, 2):
                with quiet_client(W) as client:
                    warm_up(client, W)
                    r = run_dmp(data, k=k, alpha=WP_ALPHA, reg_scaling="none", method=method,
                                max_iter=iters, budget=math.inf, backend=client, n_workers=W)
                # the loop after round 0 (the init round reads the data: setup, not speed)
                t = np.asarray(r["time"], dtype=float)
                loops[W].append(float(t[-1] - t[0]))
                print(f"  {method} rank {k}, repeat {rep + 1}, {W} worker(s): {iters} "
                      f"iterations in {loops[W][-1]:.2f} s (load {r['load']:.2f})", flush=True)
        ratios = [a / b for a, b in zip(loops[1], loops[2])]
        out[method] = {"rank": k, "iterations": iters, "1": loops[1], "2": loops[2],
                       "pair_ratios": ratios, "ratio": float(np.median(ratios))}
        print(f"{'PASS' if out[method]['ratio'] >= 1.7 else 'MISS'}  wp rank {k}, {method}: "
              f"1 / 2 workers, median of {len(ratios)} interleaved pairs: "
              f"{out[method]['ratio']:.2f} (pairs {', '.join(f'{x:.2f}' for x in ratios)}; "
              f"target >= 1.7)", flush=True)
    return out


# ----------------------------------------------------------------------------- driver
def load_problem(key, spec):
    t0 = time.perf_counter()
    train, test, _, _ = make_ratings(**spec["gen"])
    gen_s = time.perf_counter() - t0
    n_users = spec["gen"].get("n_users", 50_000)
    n_items = spec["gen"].get("n_items", 10_000)
    shape = (n_users, n_items)
    tr = tuple(np.ascontiguousarray(a) for a in train)
    te = tuple(np.ascontiguousarray(a) for a in test)
    data = {"train": tr, "test": te, "shape": shape,
            "coo": sp.coo_matrix((tr[2], (tr[0], tr[1])), shape=shape),
            "test_coo": sp.coo_matrix((te[2], (te[0], te[1])), shape=shape)}
    data["rmse0"] = rmse0 = float(np.sqrt(np.mean(te[2] ** 2)))
    info = {"title": spec["title"], "gen": spec["gen"], "shape": shape, "n_train": len(tr[2]),
            "n_test": len(te[2]), "generate_s": gen_s, "test_rmse_of_zero": rmse0,
            "params_per_rank": n_users + n_items}
    print(f"\n=== {spec['title']} ===\n{shape[0]} x {shape[1]}, {len(tr[2])} train / "
          f"{len(te[2])} test ratings, generated in {gen_s:.1f} s; test RMSE of predicting 0: "
          f"{rmse0:.4f}; noise floor 0.5", flush=True)
    return data, info


def bench_problem(key, spec, args, prev_rates):
    data, info = load_problem(key, spec)
    if key == "wp":
        settings = [(k, WP_ALPHA, "none") for k in args.ranks]
    else:
        settings = [(spec["rank"], a, s) for _, a, s in SPEC_SETTINGS]
    results, cache = [], {}
    for k, alpha, scaling in settings:
        form = "unscaled" if scaling == "none" else "per-rating"
        print(f"\n[{key}] rank {k}, alpha {alpha:g} {form}: references", flush=True)
        refs = reference_runs(data, k, alpha, scaling, problem=key, args=args,
                              prev_rates=prev_rates, trainset_cache=cache)
        print(f"[{key}] rank {k}, alpha {alpha:g} {form}: dmp", flush=True)
        dmps = dmp_runs(data, k, alpha, scaling, problem=key, args=args)
        results.append({"problem": key, "name": key, "rank": k, "alpha": alpha,
                        "reg_scaling": scaling, "form": form, "references": refs,
                        "dmp": dmps})
    if key == "wp" and not args.no_dask:
        print(f"\n[{key}] Dask LocalCluster runs", flush=True)
        dask = run_dask(key, data, settings, args)
        for idx, method, W in sorted(dask, key=lambda x: (x[0], DASK_METHODS.index(x[1]),
                                                           x[2])):
            results[idx]["dmp"][f"dmp dask {W}w {method}"] = dask[idx, method, W]
    summary = []
    for s in results:
        summarise_setting(s, spec["levels"])
        print_setting(s, spec["levels"], summary, args.quick, max(args.ranks))
    for s in results:  # per-round bookkeeping not needed in the JSON
        for r in s["dmp"].values():
            r.pop("iteration", None)
            r.pop("phase", None)
    info["settings"] = results
    return info, summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default="wp,spec",
                    help="comma-separated subset of wp,spec (default both)")
    ap.add_argument("--ranks", default=None,
                    help="comma-separated ranks fitted on wp (default 20,200; --quick 10,30)")
    ap.add_argument("--quick", action="store_true", help="smoke test on small data")
    ap.add_argument("--no-dask", action="store_true", help="skip the LocalCluster runs")
    ap.add_argument("--skip-surprise", action="store_true", help="leave out scikit-surprise")
    ap.add_argument("--fit-cap", type=float, default=None,
                    help="skip a reference fit predicted to exceed this (s; default 60, "
                         "quick 10)")
    ap.add_argument("--budget", type=float, default=None,
                    help="time budget of one reference sweep and of one dmp fit (s; default "
                         "90, quick 20)")
    ap.add_argument("--out", default=None, help="JSON output path")
    ap.add_argument("--speedup", action="store_true",
                    help="only the 1- vs 2-worker speed-up at the largest wp rank (ccd and "
                         "ccd++, interleaved repeats); writes mf-speedup.json")
    ap.add_argument("--repeat", type=int, default=3,
                    help="interleaved 1-/2-worker pairs of --speedup (default 3)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")
    args.ranks = [int(x) for x in (args.ranks or ("10,30" if args.quick else "20,200"))
                  .split(",")]
    args.fit_cap = args.fit_cap or (10.0 if args.quick else 60.0)
    args.budget = args.budget or (20.0 if args.quick else 90.0)
    keys = [x.strip() for x in args.problems.split(",") if x.strip()]
    bad = [x for x in keys if x not in PROBLEMS]
    if bad:
        ap.error(f"unknown problem(s) {bad}; choose from {list(PROBLEMS)}")

    for mod in ("cmfrec", "libmf.mf", "surprise"):  # load their thread pools before limiting
        quiet_import(mod)
    info = machine_info()
    print("MF benchmark:", " ".join(sys.argv))
    print(f"date {info['date']}; cpu {info['cpu']}; {info['cores']} cores "
          f"({info['cores_usable']} usable); {fmt(info['mem_gib'], '.1f')} GiB; "
          f"loadavg {', '.join(f'{x:.2f}' for x in info['loadavg'])}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    print("thread pools (default sizes; fits run under threadpool_limits(threads)): "
          + ", ".join(info["thread_pools"]))
    print(f"Dask worker environment: {info['dask_worker_env']}")
    print(f"fit cap {args.fit_cap:g} s, sweep / dmp fit budget {args.budget:g} s; wp ranks "
          f"{args.ranks}; target = best cmfrec test RMSE x (1 + {TARGET_SLACK:g})", flush=True)

    warm_up()
    if args.speedup:
        res = {"machine": info, "argv": sys.argv[1:], "quick": args.quick,
               "speedup": speedup_runs(args)}
        path = Path(args.out) if args.out else \
            Path(__file__).resolve().parent / "results" / "mf-speedup.json"
        path.write_text(json.dumps(res, indent=1, default=_json_default))
        print(f"written to {path}")
        return
    out = {"machine": info, "argv": sys.argv[1:], "quick": args.quick, "ranks": args.ranks,
           "fit_cap_s": args.fit_cap, "budget_s": args.budget, "target_slack": TARGET_SLACK,
           "conv_tol": CONV_TOL, "seed": SEED, "problems": {}}
    summary, prev_rates = [], {}
    t_all = time.perf_counter()
    for key in keys:
        spec = QUICK[key] if args.quick else PROBLEMS[key]
        try:
            out["problems"][key], s = bench_problem(key, spec, args, prev_rates)
            summary += s
        except Exception as exc:  # keep the other problem's results
            out["problems"][key] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"problem {key} failed: {type(exc).__name__}: {exc}")
    out["total_s"] = time.perf_counter() - t_all
    out["loadavg_end"] = os.getloadavg()
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out["summary"] = summary

    print("\n=== summary ===")
    for line in summary:
        print(line)
    print(f"total {out['total_s']:.0f} s, peak RSS {out['peak_rss_gib']:.1f} GiB, loadavg "
          f"{', '.join(f'{x:.2f}' for x in out['loadavg_end'])}")
    name = "mf-quick.json" if args.quick else "mf.json"
    path = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=_json_default))
    print(f"written to {path}")


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        # per-round arrays are long; the per-iteration curves and times carry the results
        return o.tolist() if o.size <= 10_000 else f"<{o.size} values omitted>"
    if isinstance(o, tuple):
        return list(o)
    return str(o)


if __name__ == "__main__":
    main()
