#!/usr/bin/env python
"""Cost of one schedule/push/pull round trip on a 2-worker LocalCluster, by message size.

Used for the Lasso layout decision (BENCHMARKS.md): a row-sharded STRADS round carries
nnz(X[:, U]) / P of work -- microseconds for |U| = 32 sparse columns -- so its time is this
round trip; a column-block round carries a whole sweep.

    python benchmarks/actor_roundtrip.py
"""

import asyncio
import logging
import time

import numpy as np
from distributed import Client, LocalCluster

from dmp.engine.backends.dask import cluster_workers


class Echo:
    def noop(self, x=None):
        return 1

    async def threaded(self, x=None):
        return await asyncio.to_thread(lambda: None if x is None else x[:1])

    def payload(self, x=None):
        return x


def median_ms(fn, n=200, warm=20):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts)), 1e3 * float(np.percentile(ts, 90))


def main():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        names = sorted(cluster_workers(client))
        a, b = (client.submit(Echo, actor=True, workers=[w]).result() for w in names)
        rows = []
        for direct in (False, True):
            client.direct_to_workers = direct
            rows.append((f"1 actor, no payload, direct={direct}",
                         median_ms(lambda: a.noop().result())))
            for kb in (1, 80, 800):
                x = np.zeros(kb * 1024 // 8)
                rows.append((f"2 actors, {kb} KB each way, async+thread, direct={direct}",
                             median_ms(lambda: [f.result() for f in
                                                (a.threaded(x), b.threaded(x))])))
                rows.append((f"2 actors, {kb} KB echoed back, direct={direct}",
                             median_ms(lambda: [f.result() for f in
                                                (a.payload(x), b.payload(x))])))
        print(f"{'round trip':60s} {'median ms':>10s} {'p90 ms':>8s}")
        for name, (med, p90) in rows:
            print(f"{name:60s} {med:10.2f} {p90:8.2f}")


if __name__ == "__main__":
    main()
