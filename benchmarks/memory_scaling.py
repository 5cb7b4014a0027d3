"""Per-worker memory against the number of workers, for each pipeline's model.

    python benchmarks/memory_scaling.py                 # about 10 minutes on 2 cores
    python benchmarks/memory_scaling.py --only mf_rank200 --workers 1 2

For every workload and P in ``--workers`` (default 1 2 3), a fresh `distributed.LocalCluster`
with P worker processes (1 thread, no memory limit) runs the fit.  The script reads each
worker's resident memory (psutil, after ``gc.collect()``) once dmp and its kernels are loaded,
then samples every 0.2 s during the fit both the resident memory and the array bytes held by
the worker's dmp partitions (model part + data shard: `dmp.engine.comm.payload_nbytes` of the
actors' state).  The
partition bytes shrink as 1/P; the resident memory adds a fixed cost per worker (Zarr, the
actor, buffers, about 55-60 MiB here) that does not.

Workloads: the models of the pipelines in ``pipelines/`` at their largest (``lasso.yaml``:
10,000 x 100,000 sparse Lasso; ``sparsified_logreg.yaml``; ``mf.yaml``: MovieLens-100K, needs
its download once), and a synthetic matrix factorisation at rank 200 (20,000 users x 5,000
items, 1M ratings, factors 38 MiB) whose factors dominate the worker's memory.

Writes ``benchmarks/results/memory_scaling.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _rss_mib() -> float:
    import gc

    import psutil

    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def _partition_mib(dask_worker) -> float:
    """Array bytes held by the dmp partitions (actors) on this worker: model part + shard."""
    from dmp.engine.comm import payload_nbytes

    return sum(payload_nbytes(getattr(actor, "state", None))
               for actor in list(dask_worker.state.actors.values())) / 2**20


def _warm() -> bool:
    import dmp.decomposition  # noqa: F401
    import dmp.kernels._warmup  # noqa: F401
    import dmp.linear_model  # noqa: F401

    return True


def pipeline_workload(name):
    def run(client, tmp):
        import dataclasses

        from dmp.pipeline import load_pipeline, run_pipeline
        from dmp.pipeline_schema import Compare

        spec = load_pipeline(str(REPO / "pipelines" / f"{name}.yaml"))
        if spec.compare:     # one fit: the first value compared
            spec = dataclasses.replace(spec, compare=Compare(spec.compare.key,
                                                             spec.compare.values[:1]))
        run_pipeline(spec, scheduler=client.scheduler.address, output=str(tmp / name),
                     show_progress=False, log=lambda *a: None)
    return run


def mf_rank200(client, tmp):
    import scipy.sparse as sp

    from dmp.decomposition import MatrixFactorization
    from dmp.io.synthetic import make_ratings

    (u, i, r), *_ = make_ratings(20_000, 5_000, n_obs=1_000_000, rank=20, noise=0.5,
                                 test_frac=0.0, seed=0)
    R = sp.coo_matrix((r, (u, i)), shape=(20_000, 5_000))
    MatrixFactorization(n_components=200, max_iter=1, method="ccd++", tol=0,
                        random_state=0).fit(R)


WORKLOADS = {"lasso": pipeline_workload("lasso"),
             "sparsified_logreg": pipeline_workload("sparsified_logreg"),
             "mf": pipeline_workload("mf"),
             "mf_rank200": mf_rank200}


def measure(name, fn, n_workers, interval=0.2):
    import threading
    import warnings

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                      memory_limit=0, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        client.run(_warm)
        before = client.run(_rss_mib)
        peak = dict(before)
        part = dict.fromkeys(before, 0.0)
        done = threading.Event()

        def sample():
            while not done.is_set():
                try:
                    for w, v in client.run(_rss_mib).items():
                        peak[w] = max(peak.get(w, 0.0), v)
                    for w, v in client.run(_partition_mib).items():
                        part[w] = max(part.get(w, 0.0), v)
                except Exception:
                    pass
                done.wait(interval)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn(client, Path(tmp))
        finally:
            done.set()
            sampler.join()
        wall = time.perf_counter() - t0
    ws = sorted(before)
    inc = [peak[w] - before[w] for w in ws]
    return {"workers": n_workers, "wall_s": wall, "baseline_mib": [before[w] for w in ws],
            "peak_mib": [peak[w] for w in ws], "increase_mib": inc,
            "partition_mib": [part[w] for w in ws], "max_partition_mib": max(part.values()),
            "max_increase_mib": max(inc), "median_increase_mib": statistics.median(inc)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--only", nargs="+", choices=sorted(WORKLOADS))
    args = ap.parse_args()
    out = {"machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                       "loadavg": os.getloadavg(), "date": datetime.date.today().isoformat()},
           "results": {}}
    for name, fn in WORKLOADS.items():
        if args.only and name not in args.only:
            continue
        rows = []
        for p in args.workers:
            try:
                res = measure(name, fn, p)
            except Exception as exc:  # e.g. MovieLens not downloadable offline
                print(f"{name:18s} P={p}: failed: {type(exc).__name__}: {exc}")
                break
            rows.append(res)
            print(f"{name:18s} P={p}  partition per worker "
                  f"{', '.join(f'{x:7.1f}' for x in res['partition_mib'])} MiB; RSS increase "
                  f"{', '.join(f'{x:7.1f}' for x in res['increase_mib'])} MiB  "
                  f"(peak RSS {max(res['peak_mib']):7.1f} MiB)  {res['wall_s']:6.1f} s",
                  flush=True)
        if rows:
            for key in ("max_partition_mib", "max_increase_mib"):
                base = rows[0][key]
                for row in rows:
                    row[f"{key}_ratio_to_1"] = row[key] / base if base else np.nan
            out["results"][name] = rows
    path = REPO / "benchmarks" / "results" / "memory_scaling.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
