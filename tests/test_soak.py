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
def test_short_soak(cluster3, tmp_path):
    # the module's 3-worker cluster: the soak ends with its three workers back (the nannies
    # replace the killed ones), as the test below needs them
    soak = _soak_module()
    lines = []
    stats = soak.run_soak(cluster3, 8, seed=1, kill_prob=1.0, workdir=tmp_path,
                          log=lines.append, min_fits=3)
    report = "\n".join(lines)
    assert stats["failures"] == [], report
    assert stats["divergences"] == [], report
    assert stats["fits"] >= 3 and stats["kills"] >= 2, report
    assert stats["recoveries"] >= stats["kills"] - 1, report   # a late kill may hit no partition


@pytest.mark.timeout(300)
def test_many_small_fits_leave_memory_and_fds_flat(dask_client):
    """Small fits of every estimator in a row on one 2-worker cluster leave the workers'
    and the scheduler's resident memory and open file descriptors flat after a warm-up:
    partitions, ring connections, actor futures and monitor records are released.  (A
    shorter run than the 200 fits of ``benchmarks/soak.py --leak``, whose figures are in
    RELIABILITY.md: 200 take 2-5 minutes on 2 busy cores.  The LocalCluster's scheduler
    runs in this process, so its figures include the driver's.)  On the session's cluster
    (``dask_client``): the earlier modules' fits are part of the warm-up, and whatever they
    left on it would count against this test."""
    soak = _soak_module()
    lines = []
    client = dask_client
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


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["mf-ccd++", "lda"])
def test_a_worker_killed_during_the_recovery(cluster3, tmp_path, name):
    """A first worker SIGKILLed mid-fit, and a second one SIGKILLed as soon as the fit
    starts its recovery (the moment it logs the loss, while it waits for the first one's
    replacement and re-creates the partitions): the recovery starts over or a second one
    follows, and the fit ends with the undisturbed result."""
    import threading
    import warnings

    import numpy as np

    import os
    import signal

    from test_worker_loss import _kill_one, _wait_for_workers

    soak = _soak_module()
    make, args, every, result, (rtol, atol, otol) = soak._problems(0)[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = make(backend="local", n_workers=3, checkpoint_every=every).fit(*args)
    at_round = len(reference.history_["round"]) // 3
    kills = []

    class SecondKill(logging.Handler):
        def emit(self, record):
            if "recovering" in record.getMessage() and len(kills) == 1:
                kills.append("recovery")
                # by its pid, read before the fit: the cluster is busy with the loss
                threading.Timer(0.1, os.kill, (second, signal.SIGKILL)).start()

    def first_kill(round, metrics):
        if round == at_round and not kills:
            kills.append(round)
            _kill_one(cluster3, ("1",))
        return False

    handler = SecondKill()
    logger = logging.getLogger("dmp")
    _wait_for_workers(cluster3)
    names = {a: str(w["name"]) for a, w in cluster3.scheduler_info()["workers"].items()}
    second = next(pid for a, pid in cluster3.run(os.getpid).items() if names[a] == "2")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = make(backend=cluster3, n_workers=3, checkpoint=str(tmp_path / "ck.zarr"),
                       checkpoint_every=every, callback=first_kill).fit(*args)
    finally:
        logger.removeHandler(handler)
    _wait_for_workers(cluster3)
    assert kills == [at_round, "recovery"], kills
    assert second not in cluster3.run(os.getpid).values(), "the second worker was not killed"
    # killed while the recovery waited for the first one's replacement, the second worker's
    # old partitions were to be re-created anyway: one recovery, or a retry / a second one
    # when the kill lands while the partitions are placed
    assert len(est.recoveries_) >= 1, est.recoveries_
    np.testing.assert_allclose(result(est), result(reference), rtol=rtol, atol=atol)
    assert abs(soak._metric(est) - soak._metric(reference)) <= otol * abs(soak._metric(reference))
