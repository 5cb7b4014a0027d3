"""The driver's BLAS runs on one thread while a fit's partitions live in worker processes:
OpenBLAS's idle pool threads spin between calls and took most of a core from the workers of
a LocalCluster (BENCHMARKS.md, issue 2).  In process the library's setting is kept."""

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from dmp.engine import LocalBackend, run
from dmp.engine.program import Program


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


class BlasProbe(Program):
    """Two rounds; the driver notes its BLAS thread counts in every pull."""

    name = "blas-probe"

    def partition_specs(self, n_partitions):
        return [{} for _ in range(n_partitions)]

    def start(self, n_partitions):
        self.driver = {"P": n_partitions, "seen": []}

    def schedule(self, round):
        return [{}] * self.driver["P"]

    def pull(self, round, partials):
        v = np.arange(100_000, dtype=np.float64)
        float(v @ v)  # a driver-sized BLAS call, as a Lasso pull makes
        self.driver["seen"].append(_blas_threads())
        return None

    def init_partition(self, spec):
        return {}

    def push(self, s, plan):
        return {}

    def partition_arrays(self, s):
        return {}


def _seen(backend):
    program = BlasProbe()
    run(program, backend, max_iter=2)
    return program.driver["seen"]


def test_in_process_the_blas_threads_are_left_alone():
    if not _blas_threads():
        pytest.skip("numpy reports no BLAS library")
    with threadpool_limits(limits=2, user_api="blas"):
        assert _seen(LocalBackend(1)) == [[2] * len(_blas_threads())] * 2


@pytest.mark.dask
def test_on_dask_workers_the_driver_blas_runs_on_one_thread(dask_client):
    from dmp.engine.backends.dask import DaskBackend

    if not _blas_threads():
        pytest.skip("numpy reports no BLAS library")
    with threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        backend = DaskBackend(dask_client)
        try:
            seen = _seen(backend)
        finally:
            backend.close()
        assert seen == [[1] * len(before)] * 2
        # and the caller's setting is back afterwards
        assert _blas_threads() == before == [2] * len(before)


@pytest.mark.dask
def test_with_workers_in_this_process_the_blas_threads_are_left_alone():
    """``processes=False``: the workers' pushes run in this process, whose BLAS is theirs."""
    from distributed import Client, LocalCluster

    from dmp.engine.backends.dask import DaskBackend

    if not _blas_threads():
        pytest.skip("numpy reports no BLAS library")
    with threadpool_limits(limits=2, user_api="blas"), \
            LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        backend = DaskBackend(client)
        assert backend.workers_in_this_process()
        try:
            seen = _seen(backend)
        finally:
            backend.close()
        assert seen == [[2] * len(_blas_threads())] * 2


def test_a_backend_out_of_the_driver_process_gets_a_one_thread_driver_blas():
    """The runner reads the backend's ``in_driver_process``, not its kind."""

    class Elsewhere(LocalBackend):
        in_driver_process = False

    if not _blas_threads():
        pytest.skip("numpy reports no BLAS library")
    with threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        assert _seen(Elsewhere(1)) == [[1] * len(before)] * 2
        assert _blas_threads() == before
