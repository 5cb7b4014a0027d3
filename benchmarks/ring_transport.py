#!/usr/bin/env python
"""CPU per ring message, ``dmp.ring.transport: socket`` against ``dask``, worker to worker.

Run from the repository root (``PYTHONPATH`` picks the tree to measure)::

    python benchmarks/ring_transport.py                       # 2 workers, 5,000 items
    python benchmarks/ring_transport.py --workers 4 --items 50000 --rounds 1000
    python benchmarks/ring_transport.py --emulated 0.2        # workers on 0.2 core (root)

Every round each partition sends every other one the message MF CCD++ sends (two float64
vectors of ``--items``: a factor column's partial sums) and waits for theirs before its next
push, which does nothing else; the rounds run in batches, as CCD++'s do.  Per fit the workers'
CPU seconds (``getrusage`` through ``client.run``) are divided by the messages (each message
is counted once: the sender's and the receiver's CPU together).  The transports alternate,
``--repeats`` fits each after one warm-up fit of each; medians and the ratio are printed.
On a plain ``LocalCluster`` the workers share the machine's cores with each other and the
driver; ``--emulated q`` puts each in a CPU cgroup of ``q`` core (`EmulatedCluster`).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import numpy as np

from dmp.engine import run
from dmp.engine.backends.dask import DaskBackend
from dmp.engine.program import Program, Sends


class PartialSums(Program):
    """All to all, one message of two ``items``-long vectors per pair and round."""

    name = "ring-transport-benchmark"
    uses_ring = True

    def __init__(self, items: int):
        self.items = items

    def partition_specs(self, n_partitions):
        return [{"p": p, "P": n_partitions, "items": self.items} for p in range(n_partitions)]

    def start(self, n_partitions):
        self.driver = {"P": n_partitions}

    def schedule(self, round):
        return [round] * self.driver["P"]

    def ring_inbox(self, round):
        return [self.driver["P"] - 1] * self.driver["P"]

    def batch_rounds(self, round):
        return 1024

    def init_partition(self, spec):
        rng = np.random.default_rng(spec["p"])
        return {**spec, "msg": {"num": rng.random(spec["items"]),
                                "den": rng.random(spec["items"])}, "got": 0}

    def receive(self, state, round, src, payload):
        state["got"] += 1

    def push(self, s, round):
        return Sends(None, {q: s["msg"] for q in range(s["P"]) if q != s["p"]})

    def pull(self, round, partials):
        return None

    def partition_arrays(self, s):
        return {"got": np.array([s["got"]])}


def _cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one_fit(client, transport: str, items: int, rounds: int) -> dict:
    import dask

    with dask.config.set({"dmp.ring.transport": transport}):
        backend = DaskBackend(client)
        try:
            before = client.run(_cpu)
            t0 = time.perf_counter()
            run(PartialSums(items), backend, max_iter=rounds)
            wall = time.perf_counter() - t0
            after = client.run(_cpu)
        finally:
            backend.close()
    P = len(before)
    messages = rounds * P * (P - 1)
    cpu = sum(after[a] - before[a] for a in before)
    return {"transport": transport, "wall_s": wall, "worker_cpu_s": cpu,
            "cpu_per_message_us": 1e6 * cpu / messages, "messages": messages}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--items", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--emulated", type=float, default=None, metavar="CPU",
                    help="EmulatedCluster workers of this many cores each (needs root)")
    ap.add_argument("--json", default=None, help="write the fits' records here")
    args = ap.parse_args(argv)

    from contextlib import ExitStack

    with ExitStack() as stack:
        if args.emulated:
            from dmp.testing import EmulatedCluster

            cluster = stack.enter_context(EmulatedCluster(
                n_workers=args.workers, cpu=args.emulated, driver_cpu=0.2,
                scheduler_cpu=0.2))
            client = cluster.client
        else:
            from distributed import Client, LocalCluster

            cluster = stack.enter_context(LocalCluster(
                n_workers=args.workers, threads_per_worker=1, host="127.0.0.1",
                dashboard_address=None))
            client = stack.enter_context(Client(cluster))
        where = (f"{args.workers} workers of {args.emulated} core" if args.emulated
                 else f"{args.workers}-worker LocalCluster")
        print(f"{where}; messages of 2 x {args.items} float64, {args.rounds} rounds a fit")
        for transport in ("dask", "socket"):   # warm-up: connections, imports, caches
            one_fit(client, transport, args.items, min(args.rounds, 200))
        records = []
        for rep in range(args.repeats):
            order = ("dask", "socket") if rep % 2 == 0 else ("socket", "dask")
            for transport in order:
                rec = one_fit(client, transport, args.items, args.rounds)
                records.append(rec)
                print(f"  {transport:6s} CPU per message {rec['cpu_per_message_us']:7.1f} us, "
                      f"fit {rec['wall_s']:.2f} s", flush=True)
    med = {t: statistics.median(r["cpu_per_message_us"] for r in records
                                if r["transport"] == t) for t in ("dask", "socket")}
    wall = {t: statistics.median(r["wall_s"] for r in records if r["transport"] == t)
            for t in ("dask", "socket")}
    print(f"median CPU per message: dask {med['dask']:.1f} us, socket {med['socket']:.1f} us "
          f"(socket / dask {med['socket'] / med['dask']:.2f}); fit {wall['dask']:.2f} / "
          f"{wall['socket']:.2f} s ({wall['socket'] / wall['dask']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "records": records, "median_us": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
