#!/usr/bin/env python
"""High-rank matrix factorisation whose factors do not fit in one worker's memory limit.

Run from the repository root with the project's environment active::

    python benchmarks/mf_high_rank.py                    # rank 1000, ~2 GB of factors
    python benchmarks/mf_high_rank.py --quick            # rank 200, small, a minute

What it does:

1. Writes a ratings store (``make_ratings``: ``--users`` x ``--items``, ``--ratings``
   observations, true rank 20, noise 0.5) to a temporary folder.
2. Starts a ``LocalCluster`` with ``--workers`` worker processes, each with
   ``memory_limit = --memory-limit``, chosen so that W (users x rank) and H (items x rank) in
   float64 together exceed one worker's limit but fit across the workers.
3. Fits ``MatrixFactorization(method=--method, n_components=--rank)`` for ``--iters``
   iterations with ``factors_store=...``: every worker keeps only its own users' and items'
   factor rows, each round moves the items' partial sums of one factor column (CCD++) or one
   coordinate block (CCD) between the workers, and at the end every worker writes its rows to
   Zarr itself.
4. Prints: the model size against the memory limit, the per-worker peak memory sampled from
   the workers during the fit (``psutil`` RSS through ``client.run``), the most any worker
   received in one round (from the driver and from the other workers), worker losses (must be none), objective and RMSE per iteration, and the
   time per iteration.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import threading
import time

import numpy as np


def _rss():
    import psutil

    return psutil.Process().memory_info().rss


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--ratings", type=int, default=2_000_000)
    ap.add_argument("--rank", type=int, default=1000)
    ap.add_argument("--method", default="ccd++", choices=["ccd", "ccd++"])
    ap.add_argument("--block-size", default="auto")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--alpha", type=float, default=5.0,
                    help="unscaled L2 penalty (9 ratings per user at rank 1000 overfit)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory-limit", default="1.6GiB")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.users, args.items, args.ratings, args.rank = 20_000, 2_000, 200_000, 200
        args.memory_limit = "1GiB"

    from dask.utils import format_bytes, parse_bytes
    from distributed import Client, LocalCluster

    from dmp.decomposition import MatrixFactorization
    from dmp.io import write_ratings
    from dmp.io.synthetic import make_ratings

    limit = parse_bytes(args.memory_limit)
    model = 8 * args.rank * (args.users + args.items)
    print(f"model: W {args.users} x {args.rank} + H {args.items} x {args.rank} float64 = "
          f"{format_bytes(model)}; worker memory limit {format_bytes(limit)} x {args.workers}"
          f" workers -> exceeds one worker: {model > limit}, fits across workers: "
          f"{model < limit * args.workers}")
    tmp = tempfile.mkdtemp(prefix="dmp-mf-high-rank-")
    (u, i, r), (tu, ti, tr), _, _ = make_ratings(args.users, args.items, args.ratings,
                                                 rank=20, noise=0.5, seed=3)
    codes = np.r_[np.zeros(len(r), np.int8), np.full(len(tr), 2, np.int8)]
    ds = write_ratings(os.path.join(tmp, "ratings.zarr"), np.r_[u, tu], np.r_[i, ti],
                       np.r_[r, tr], shape=(args.users, args.items), split=codes)
    print(f"dataset: {ds}")
    block = args.block_size if args.block_size == "auto" else int(args.block_size)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      memory_limit=limit, dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        peaks: dict = {}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    for addr, v in client.run(_rss).items():
                        peaks[addr] = max(peaks.get(addr, 0), v)
                except Exception:
                    pass
                stop.wait(0.5)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        t0 = time.perf_counter()
        mf = MatrixFactorization(args.rank, alpha=args.alpha, method=args.method,
                                 block_size=block,
                                 max_iter=args.iters, tol=None, center=False,
                                 backend=client, random_state=0,
                                 factors_store=os.path.join(tmp, "factors.zarr"))
        mf.fit(ds)
        wall = time.perf_counter() - t0
        stop.set()
        th.join()
        h = mf.history_
        it = np.asarray(h["iteration"])
        ends = np.r_[it[1:] != it[:-1], True]
        print(f"fit: {mf.n_iter_} iterations in {wall:.1f} s ({len(it) - 1} rounds, block "
              f"size {mf.block_size_}), worker losses: {len(mf.recoveries_)}")
        for t, f, tr_, (tt) in zip(it[ends], h["objective"][ends], h["train_rmse"][ends],
                                   h["time"][ends]):
            print(f"  iteration {t}: objective {f:.6g}  train RMSE {tr_:.4f}  t={tt:.1f}s")
        test = -mf.score(ds)
        # what a worker receives in a round: its share of the driver's update and of the
        # messages between the workers (both symmetric over the workers here)
        per_round = (np.asarray(h["bytes_pull"][1:]) + np.asarray(h["bytes_ring"][1:])) \
            / args.workers
        print(f"test RMSE {test:.4f}")
        print(f"most received per worker in one round: {format_bytes(per_round.max())} "
              f"(whole factors: {format_bytes(model)})")
        for addr, v in sorted(peaks.items()):
            print(f"  worker {addr}: peak RSS {format_bytes(v)} "
                  f"({100 * v / limit:.0f}% of its limit)")
        print(f"factors written by the workers to {mf.factors_store}: "
              f"{mf.user_factors_.shape} + {mf.item_factors_.shape}")
        out = {"users": args.users, "items": args.items, "ratings": args.ratings,
               "rank": args.rank, "method": args.method, "block_size": mf.block_size_,
               "workers": args.workers, "memory_limit": limit, "model_bytes": model,
               "peak_rss": peaks, "wall_s": wall, "iterations": mf.n_iter_,
               "test_rmse": test, "worker_losses": len(mf.recoveries_),
               "max_received_per_worker": float(per_round.max()),
               "objective": [float(x) for x in h["objective"][ends]]}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
