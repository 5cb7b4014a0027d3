"""A model larger than one worker's memory limit trains on several workers, and the
planner's memory per worker (`dmp.planning.plan_memory`) is their measured peak: a small
version of `benchmarks/big_models.py` (BENCHMARKS.md, "Models larger than any worker", whose
8 workers are CPU-confined by `dmp.testing.EmulatedCluster`; memory is Dask's limit on both,
and here the workers run unconfined, as spawned `LocalCluster` workers, to keep it short)."""

import logging
import os
import sys
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.dask, pytest.mark.timeout(240),
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="reads the workers' /proc/<pid>/status")]

MIB = 2**20


def _pid():
    return os.getpid()


def _partitions_alive() -> int:
    import gc

    gc.collect()
    return sum(type(o).__name__ == "ActorPartitionWorker" for o in gc.get_objects())


def _vm_hwm(pid: int, field: str = "VmHWM") -> int:
    """A process's peak resident memory (the kernel's high-water mark; ``field="VmRSS"``: its
    resident memory now), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


@pytest.mark.slow
def test_factors_larger_than_a_worker_on_three_workers(tmp_path):
    import dask
    from distributed import Client, LocalCluster

    from dmp import config
    from dmp.decomposition import MatrixFactorization
    from dmp.io import write_ratings
    from dmp.io.synthetic import make_ratings
    from dmp.planning import plan_memory

    P, limit, rank = 3, 640 * MIB, 200
    users, items = 440_000, 5_600
    model = (users + items) * rank * 8                   # W + H, float64: 680 MiB
    assert model > limit
    (u, i, r), _, _, _ = make_ratings(users, items, 450_000, rank=5, test_frac=0.0, seed=3)
    ds = write_ratings(tmp_path / "ratings.zarr", u, i, r, shape=(users, items))
    est = MatrixFactorization(rank, method="ccd++", max_iter=1, tol=None, random_state=0,
                              factors_store=str(tmp_path / "factors.zarr"))
    # 300 MiB of a worker go to Python, Dask and Numba: its partition gets the rest of the
    # 90% at which it pauses.  Workers spawned, as a user's are: a worker forked from the
    # session's warm server (tests/conftest.py) does not count the pages it shares with it
    with dask.config.set({"distributed.worker.memory.pause": 0.9,
                          "distributed.worker.multiprocessing-method": "spawn"}):
        rows = plan_memory(est, ds, workers=[2, P], memory_per_worker=limit, as_frame=False)
        assert [row["fits"] for row in rows] == [False, True]
        predicted = rows[1]["memory_per_worker"]
        with LocalCluster(n_workers=P, threads_per_worker=1, processes=True,
                          memory_limit=limit, dashboard_address=None,
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            pids = client.run(_pid)
            # what a worker holds before a partition (interpreter, Dask, dmp and its kernels,
            # loaded by a small fit) depends on the process that spawned it: a spawned worker
            # imports its parent's __main__, pytest's here, a user's script there
            # (`dmp.memory.worker-base` is a user's)
            MatrixFactorization(2, max_iter=1, backend=client, n_workers=P).fit(
                (np.arange(P), np.arange(P), np.ones(P)))
            base = {addr: _vm_hwm(pid, "VmRSS") for addr, pid in pids.items()}
            est.set_params(backend=client, n_workers=P).fit(ds)
            peaks = {addr: _vm_hwm(pid) for addr, pid in pids.items()}
            assert client.run(_pid) == pids                # no worker was lost or restarted
            # and once the fit is over its partitions are let go: a worker keeps no share of
            # the model (once, the ring handler held the first partition of every worker)
            deadline = time.monotonic() + 30
            while any(client.run(_partitions_alive).values()) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not any(client.run(_partitions_alive).values())
    assert est.recoveries_ == [] and est.history_["worker_losses"].max() == 0
    assert est.user_factors_.shape == (users, rank) and est.n_iter_ == 1
    assert np.isfinite(est.objective_) and est.objective_ < est.history_["objective"][0]
    # every worker held its share (a third of the factors), never the whole model, and
    # the planner said how much: its figure less its worker base, on this worker's base
    assert max(peaks.values()) < 0.95 * limit
    share = predicted - config.nbytes("dmp.memory.worker-base")
    for addr, peak in peaks.items():
        assert abs((base[addr] + share) / peak - 1) < 0.15, (
            {a: p // MIB for a, p in peaks.items()}, {a: b // MIB for a, b in base.items()})
