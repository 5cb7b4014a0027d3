#!/usr/bin/env python
"""Cost of one schedule/push/pull round trip on a 2-worker LocalCluster, by message size.

Used for the Lasso layout decision (BENCHMARKS.md): a row-sharded STRADS round carries
nnz(X[:, U]) / P of work -- microseconds for |U| = 32 sparse columns -- so its time is this
round trip; a column-block round carries a whole sweep.

Then the engine's own cost of a round with no work (`dmp.engine.run`, 2 workers under the quiet
Dask settings, every partition sending a small message to the other each round): rounds called
one by one (staleness 1) against rounds run in batches (`Program.batch_rounds`).

    python benchmarks/actor_roundtrip.py
"""

import asyncio
import logging
import time

import numpy as np
from distributed import Client, LocalCluster

from dmp.engine import run
from dmp.engine.backends.dask import DaskBackend, cluster_workers, quiet_local_cluster
from dmp.engine.program import Program, Sends


class Echo:
    def noop(self, x=None):
        return 1

    async def threaded(self, x=None):
        return await asyncio.to_thread(lambda: None if x is None else x[:1])

    def payload(self, x=None):
        return x


class EmptyRounds(Program):
    """Rounds with no work: each partition sends its round number to the others."""

    name = "empty-rounds"
    uses_ring = True

    def __init__(self, batched: bool):
        super().__init__()
        self.batched = batched

    def partition_specs(self, n_partitions):
        return [{"p": p, "P": n_partitions} for p in range(n_partitions)]

    def start(self, n_partitions):
        self.driver = {"P": n_partitions}

    def schedule(self, round):
        return [round] * self.driver["P"]

    def ring_inbox(self, round):
        return [self.driver["P"] - 1] * self.driver["P"]

    def batch_rounds(self, round):
        return 1024 if self.batched else 1

    def init_partition(self, spec):
        return {**spec, "inbox": {}}

    def receive(self, state, round, src, payload):
        state["inbox"].setdefault(round, {})[src] = payload

    def push(self, s, round):
        s["inbox"].pop(round - 1, None)
        return Sends(0, {q: round for q in range(s["P"]) if q != s["p"]})

    def pull(self, round, partials):
        return None


def engine_rounds():
    from distributed import Client

    print(f"\n{'engine round with no work, 2 workers':60s} {'ms/round':>10s} {'on workers':>10s}")
    with quiet_local_cluster(2, dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        for rep in range(2):
            for batched, n in ((False, 500), (True, 2000)):
                backend = DaskBackend(client)
                try:
                    t = time.perf_counter()
                    res = run(EmptyRounds(batched), backend, max_iter=n, staleness=1)
                    per = (time.perf_counter() - t) / n
                finally:
                    backend.close()
                on_workers = np.median([r["round_s"] for r in res.history[10:]]) if batched \
                    else float("nan")
                name = (f"batched ({len({r['batch'] for r in res.history})} calls)" if batched
                        else "one call per round, staleness 1")
                print(f"{name:60s} {1e3 * per:10.2f} {1e3 * on_workers:10.2f}")


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
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
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
    engine_rounds()


if __name__ == "__main__":
    main()
