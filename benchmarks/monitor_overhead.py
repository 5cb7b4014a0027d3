"""What the live monitor costs a fit: wall time with and without it, and its memory bound.

    python benchmarks/monitor_overhead.py              # about 3 minutes on 2 cores
    python benchmarks/monitor_overhead.py --repeats 3  # quicker

On one `distributed.LocalCluster` (2 worker processes, 1 thread each) every workload is fitted
``--repeats`` times with the monitor on (the default: events every round, the scheduler plugin
aggregating them) and off (``dask.config.set({"dmp.monitor": False})``: no events, no plugin),
in alternating order.  The reference is the same fit without the monitor; the script prints the
median wall times and their ratio (target: <= 1.05), and the median of the per-pair ratios.

Workloads (the ones with the most rounds per second are the worst case for per-round events):

* Lasso, priority schedule, sparse 2,000 x 20,000, alpha = 0.01 alpha_max, tol 1e-8;
* MatrixFactorization CCD++, rank 20, 5,000 x 2,000 ratings (200,000), 8 iterations (161
  rounds of a few ms each);
* SparsifiedSGDRegressor, 2 workers, 20,000 x 200 dense, 300 rounds.

Memory: the rounds of the Lasso and MF fits, as the scheduler holds them, are replayed into a
fresh `MonitorState` under ``tracemalloc``; bytes per round times the plugin's bounds
(``max_rounds`` per fit, ``max_fits``) is the most the monitor can hold.

Writes ``benchmarks/results/monitor_overhead.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import statistics
import time
import tracemalloc
from pathlib import Path

import dask
import numpy as np
import scipy.sparse as sp


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    import distributed

    return {"cpu": cpu, "cores": os.cpu_count(), "loadavg": os.getloadavg(),
            "python": platform.python_version(), "distributed": distributed.__version__,
            "date": datetime.date.today().isoformat()}


def workloads(seed=0):
    from dmp.decomposition import MatrixFactorization
    from dmp.io.synthetic import make_ratings
    from dmp.linear_model import Lasso, SparsifiedSGDRegressor

    rng = np.random.default_rng(seed)
    X = sp.random(2000, 20_000, density=0.01, random_state=seed, format="csc")
    beta = np.zeros(20_000)
    beta[rng.choice(20_000, 100, replace=False)] = rng.standard_normal(100)
    y = X @ beta + 0.01 * rng.standard_normal(2000)
    amax = float(np.abs(X.T @ (y - y.mean())).max()) / X.shape[0]

    u, i, r = make_ratings(5000, 2000, n_obs=200_000, rank=10, noise=0.5, test_frac=0.0,
                           seed=seed)[0]
    R = sp.coo_matrix((r, (u, i)), shape=(5000, 2000))

    Xd = rng.standard_normal((20_000, 200))
    yd = Xd @ rng.standard_normal(200) + 0.1 * rng.standard_normal(20_000)
    return {
        "lasso": (lambda: Lasso(alpha=0.01 * amax, tol=1e-8, random_state=0, n_workers=2),
                  (X, y)),
        "mf_ccd++": (lambda: MatrixFactorization(n_components=20, max_iter=8, tol=0,
                                                 random_state=0, n_workers=2), (R,)),
        "sparsified_sgd": (lambda: SparsifiedSGDRegressor(n_workers=2, max_iter=300, tol=None,
                                                          random_state=0), (Xd, yd)),
    }


def fit_once(make, args, monitor: bool):
    with dask.config.set({"dmp.monitor": monitor}):
        est = make()
        t0 = time.perf_counter()
        est.fit(*args)
        wall = time.perf_counter() - t0
    return wall, len(est.history_["round"])


def memory_per_round(rounds: list[dict]) -> float:
    from dmp.monitor import MonitorState

    import msgpack

    state = MonitorState(max_fits=1, max_rounds=len(rounds) + 1)
    # as the scheduler receives them: every value a fresh object, unpacked from msgpack
    msgs = [msgpack.unpackb(msgpack.packb({**r, "kind": "round", "fit": "x-1"}),
                            use_list=False) for r in rounds]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for m in msgs:
        state.handle(m)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / max(len(rounds), 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=["lasso", "mf_ccd++", "sparsified_sgd"], nargs="*")
    args = ap.parse_args()

    from distributed import Client, LocalCluster

    from dmp.monitor import DMPMonitor

    info = machine()
    print(f"machine: {info}")
    out = {"machine": info, "repeats": args.repeats, "workloads": {}}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster):
        for name, (make, fargs) in workloads().items():
            if args.only and name not in args.only:
                continue
            fit_once(make, fargs, True)        # warm up (Numba, first actor creation)
            on, off, n_rounds = [], [], 0
            for rep in range(args.repeats):
                order = (True, False) if rep % 2 == 0 else (False, True)
                for flag in order:
                    wall, n_rounds = fit_once(make, fargs, flag)
                    (on if flag else off).append(wall)
            med_on, med_off = statistics.median(on), statistics.median(off)
            pair = statistics.median(a / b for a, b in zip(on, off))
            res = {"rounds": n_rounds, "wall_on_s": on, "wall_off_s": off,
                   "median_on_s": med_on, "median_off_s": med_off,
                   "ratio_of_medians": med_on / med_off, "median_pair_ratio": pair,
                   "rounds_per_s": n_rounds / med_off}
            out["workloads"][name] = res
            print(f"{name:16s} rounds {n_rounds:5d} ({n_rounds / med_off:6.0f}/s)  "
                  f"off {med_off:7.3f} s  on {med_on:7.3f} s  ratio {med_on / med_off:.3f}  "
                  f"(median pair ratio {pair:.3f})  "
                  f"{'PASS' if med_on / med_off <= 1.05 else 'MISS'} (target <= 1.05)")
        mon = cluster.scheduler.plugins.get("dmp-monitor")
        per_round = {}
        for fit in (mon.state.fits.values() if mon is not None else []):
            if fit.estimator in ("Lasso", "MatrixFactorization") and fit.rounds:
                per_round.setdefault(fit.estimator, memory_per_round(list(fit.rounds)))
        defaults = DMPMonitor()
        bound = max(per_round.values(), default=0) * defaults.max_rounds * defaults.max_fits
        out["memory"] = {"bytes_per_round": per_round, "max_rounds": defaults.max_rounds,
                         "max_fits": defaults.max_fits, "bound_bytes": bound}
        print(f"memory per kept round: "
              f"{', '.join(f'{k} {v:.0f} B' for k, v in per_round.items())}; bound "
              f"{defaults.max_rounds} rounds x {defaults.max_fits} fits = {bound / 2**20:.0f} MiB")
    out["loadavg_end"] = os.getloadavg()
    path = Path(__file__).parent / "results" / "monitor_overhead.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
