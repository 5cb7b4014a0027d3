"""A short version of `benchmarks/soak.py`: repeated fits of every estimator with random
worker kills on a 3-worker cluster; every result equals the undisturbed one."""

import importlib.util
import logging
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dask, pytest.mark.slow]


def _soak_module():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"
    spec = importlib.util.spec_from_file_location("dmp_soak", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(300)
def test_short_soak(tmp_path):
    from distributed import Client, LocalCluster

    soak = _soak_module()
    lines = []
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      dashboard_address=":0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        stats = soak.run_soak(client, 8, seed=1, kill_prob=1.0, workdir=tmp_path,
                              log=lines.append, min_fits=3)
    report = "\n".join(lines)
    assert stats["failures"] == [], report
    assert stats["divergences"] == [], report
    assert stats["fits"] >= 3 and stats["kills"] >= 2, report
    assert stats["recoveries"] >= stats["kills"] - 1, report   # a late kill may hit no partition


@pytest.mark.timeout(300)
def test_many_small_fits_leave_memory_and_fds_flat():
    """Small fits of every estimator in a row on one 2-worker cluster leave the workers'
    and the scheduler's resident memory and open file descriptors flat after a warm-up:
    partitions, ring connections, actor futures and monitor records are released.  (A
    shorter run than the 200 fits of ``benchmarks/soak.py --leak``, whose figures are in
    RELIABILITY.md: 200 take about 2 minutes on 2 busy cores.  The LocalCluster's scheduler
    runs in this process, so its figures include the driver's.)"""
    from distributed import Client, LocalCluster

    soak = _soak_module()
    lines = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        stats = soak.run_leak_check(client, 48, warmup=18, every=10, log=lines.append)
        # nothing of the fits is left on the cluster: no actor, no data, no task
        held = client.run(lambda dask_worker: (len(dask_worker.state.actors),
                                               len(dask_worker.data)))
        tasks = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    assert set(held.values()) == {(0, 0)} and tasks == 0, (held, tasks)
    report = "\n".join(lines)
    assert set(stats["growth"]) == {"worker 0", "worker 1", "scheduler"}, report
    for process, g in stats["growth"].items():
        assert g["rss_frac"] < 0.10, (process, report)
        assert g["fds"] < 5, (process, report)
