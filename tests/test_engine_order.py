"""With rounds kept in flight (staleness), every partition sees pushes and pull results in
the order the runner issued them, on Dask as in process."""

import time

import numpy as np
import pytest

from dmp.engine import LocalBackend, run
from dmp.engine.program import Broadcast, Program


class Logged(Program):
    """Each partition logs what reaches it; the push of round 5 is slow and round 6 needs a
    barrier, so the runner drains rounds 4 and 5 while one is still running."""

    name = "logged"

    def partition_specs(self, n_partitions):
        return [{"p": p} for p in range(n_partitions)]

    def start(self, n_partitions):
        self.driver = {"P": n_partitions}

    def schedule(self, round):
        return [{"round": round}] * self.driver["P"]

    def needs_barrier(self, round):
        return round == 6

    def pull(self, round, partials):
        return Broadcast(round)

    def init_partition(self, spec):
        return {"log": []}

    def push(self, s, plan):
        s["log"].append(("push", plan["round"], "start"))
        if plan["round"] == 5:
            time.sleep(0.5)
        s["log"].append(("push", plan["round"], "end"))
        return {}

    def apply(self, s, update):
        s["log"].append(("apply", update))

    def partition_arrays(self, s):
        return {"log": np.array([f"{e[0]}:{e[1]}" + (f":{e[2]}" if len(e) > 2 else "")
                                 for e in s["log"]])}


def _logs(backend):
    res = run(Logged(), backend, max_iter=9, staleness=2, checkpoint_every=1000)
    return [list(a["log"]) for a in res.partition_arrays]


def test_in_process_order_has_applies_between_pushes():
    log = _logs(LocalBackend(2))[0]
    # every push runs whole, pull results arrive in round order
    for r in range(9):
        assert log.index(f"push:{r}:end") == log.index(f"push:{r}:start") + 1
    applies = [int(e.split(":")[1]) for e in log if e.startswith("apply")]
    assert applies == sorted(applies) and applies[-1] == 8


@pytest.mark.dask
def test_dask_partitions_see_the_in_process_order(dask_client):
    from dmp.engine.backends.dask import DaskBackend

    backend = DaskBackend(dask_client)
    try:
        remote = _logs(backend)
    finally:
        backend.close()
    assert remote == _logs(LocalBackend(2))
