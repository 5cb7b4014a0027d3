#!/usr/bin/env python
"""Where a fit's time outside its round loop goes, on emulated clusters of P workers.

Run from the repository root, as root (CPU cgroups), with the project's environment::

    python benchmarks/setup_phases.py                          # MF CCD++, P = 1 and 8
    python benchmarks/setup_phases.py --model lasso --workers 1,2,8 --fits 4

One `dmp.testing.EmulatedCluster` per P (``--cpu`` core per worker, the driver and the
scheduler alike), the model's issue-size store of `benchmarks/scaling.py`, ``--fits`` fits in
a row on each cluster (the first pays the fresh workers' imports and kernel loads).  The
driver's steps are timed by wrapping the runner's and the Dask backend's methods in this
process: the estimator before the run, the partitions' creation (of it: the memory check,
each partition's wait), the round loop, the result's
collection, and the waits for calls to the partitions (``calls``: the ring's connection
before the loop and the rounds in it).  One JSON line per fit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scaling  # noqa: E402  (benchmarks/scaling.py: the problems)

from dmp.engine import runner  # noqa: E402
from dmp.engine.backends import dask as dask_backend  # noqa: E402
from dmp.testing import EmulatedCluster  # noqa: E402

#: (object, method, label) of the steps timed
STEPS = ((runner._Run, "execute", "run"), (runner._Run, "_first_round", "create"),
         (runner._Run, "_run_rounds", "loop"), (runner._Run, "_collect_result", "collect"),
         (dask_backend, "check_partition_memory", "memory check"),
         (dask_backend.DaskBackend, "_await_partition", "partition wait"),
         (dask_backend.DaskBackend, "_results", "calls"))


def timed(marks: list) -> None:
    """Wrap every step of `STEPS` so that each call appends ``(label, start, end)``."""
    for obj, name, label in STEPS:
        f = getattr(obj, name)

        def wrapper(*args, _f=f, _label=label, **kwargs):
            t0 = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                marks.append((_label, t0, time.perf_counter()))

        setattr(obj, name, wrapper)


def phases(marks: list, t0: float, t1: float) -> dict:
    """Seconds of each step (summed over its calls), and of the fit before and after the
    run; the partitions' waits one by one."""
    out: dict = {"whole": t1 - t0}
    for label, a, b in marks:
        out[label] = out.get(label, 0.0) + b - a
    run = next((a, b) for label, a, b in marks if label == "run")
    out["before run"], out["after run"] = run[0] - t0, t1 - run[1]
    out["partition waits"] = [b - a for label, a, b in marks if label == "partition wait"]
    return {k: ([round(x, 3) for x in v] if isinstance(v, list) else round(v, 3))
            for k, v in out.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mf_ccdpp", choices=scaling.MODELS)
    ap.add_argument("--workers", default="1,8", help="comma-separated P")
    ap.add_argument("--fits", type=int, default=3, help="fits per cluster")
    ap.add_argument("--cpu", type=float, default=0.2)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    marks: list = []
    timed(marks)
    est, ds = scaling.build(args.model, Path(tempfile.mkdtemp(prefix="dmp-setup-")), "issue", 8)
    for P in (int(p) for p in args.workers.split(",")):
        with EmulatedCluster(n_workers=P, cpu=args.cpu, memory_limit="2GiB",
                             driver_cpu=args.cpu, scheduler_cpu=args.cpu) as cluster:
            for i in range(args.fits):
                marks.clear()
                fit = est.set_params(backend=cluster.client, n_workers=P)
                t0 = time.perf_counter()
                fit.fit(ds)
                t1 = time.perf_counter()
                print(json.dumps({"model": args.model, "P": P, "fit": i,
                                  **phases(marks, t0, t1)}), flush=True)


if __name__ == "__main__":
    main()
