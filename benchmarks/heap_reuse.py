#!/usr/bin/env python
"""The worker setting ``dmp.worker-heap-reuse`` off and at several sizes, side by side.

Run from the repository root, with the project's environment::

    python benchmarks/heap_reuse.py                          # small problems, 3 repeats
    python benchmarks/heap_reuse.py --values off 16MiB 64MiB --models parmac,lasso

A Dask nanny starts its worker with ``MALLOC_TRIM_THRESHOLD_=65536``, which turns glibc's
adaptive mmap threshold off: every temporary of >= 128 KiB is then fresh pages that fault in
one by one (`dmp.utils.heap`).  Each value gets its own ``LocalCluster`` of one spawned
worker under a nanny (as ``dask worker`` starts one), unconfined, created with the setting
in its configuration; every model of `benchmarks/scaling.py` (``--size``, one partition) is
fitted on each cluster in turn, the clusters' order reversed every repeat.  Per fit: the
round loop, the worker process's CPU seconds and minor page faults over the fit
(``getrusage`` on the worker) and its peak memory (the scheduler's samples).  Medians over
the repeats; the CPU ratio is against ``off``.  The workers keep running between models, so
a peak includes what the earlier fits left in the worker's heap.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scaling  # noqa: E402


def worker_usage():
    """CPU seconds and minor page faults of this (worker) process so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(scaling.SIZES), default="small")
    ap.add_argument("--models", default="parmac,mf_ccd,mf_ccdpp,mf_als,sgd,lasso,lda100")
    ap.add_argument("--values", nargs="+", default=["off", "16MiB", "64MiB"],
                    help="values of dmp.worker-heap-reuse, the first the baseline")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    import dask
    from distributed import Client, LocalCluster

    models = [m for m in args.models.split(",") if m]
    tmp = Path(tempfile.mkdtemp(prefix="dmp-heap-"))
    clusters = {}
    try:
        problems = {m: scaling.build(m, tmp, args.size, n_shards=1) for m in models}
        with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
            for value in args.values:
                with dask.config.set({"dmp.worker-heap-reuse": value}):
                    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None,
                                           silence_logs=logging.ERROR)
                clusters[value] = (cluster, Client(cluster))
        runs: dict = {}
        for rep in range(args.repeats):
            order = args.values if rep % 2 == 0 else args.values[::-1]
            for m in models:
                est, ds = problems[m]
                for value in order:
                    client = clusters[value][1]
                    (c0, f0), = client.run(worker_usage).values()
                    r = scaling.fit_on(est, ds, client, 1)
                    (c1, f1), = client.run(worker_usage).values()
                    r.update(cpu_s=c1 - c0, faults=f1 - f0)
                    runs.setdefault((m, value), []).append(r)
                    print(f"{m:9s} {value:>6s} rep {rep}: loop {r['loop_s']:.2f} s, worker CPU "
                          f"{r['cpu_s']:.2f} s, {r['faults']} faults, peak "
                          f"{r['peak_memory_per_worker'] / 2**20:.0f} MiB", flush=True)

        def med(m, value, key):
            return float(np.median([r[key] for r in runs[(m, value)]]))

        base = args.values[0]
        print("\n| model | " + " | ".join(
            f"{v}: loop s / worker CPU s (x {base}) / faults / peak MiB" for v in args.values)
            + " |")
        print("|---|" + "---|" * len(args.values))
        for m in models:
            cells = [f"{med(m, v, 'loop_s'):.2f} / {med(m, v, 'cpu_s'):.2f} "
                     f"({med(m, v, 'cpu_s') / med(m, base, 'cpu_s'):.2f}) / "
                     f"{med(m, v, 'faults'):,.0f} / "
                     f"{med(m, v, 'peak_memory_per_worker') / 2**20:.0f}" for v in args.values]
            print(f"| {m} | " + " | ".join(cells) + " |")
    finally:
        for cluster, client in clusters.values():
            client.close()
            cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
