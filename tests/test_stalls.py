"""Fits that used to hang or end in a raw library error: a worker Dask has paused (its memory
above ``distributed.worker.memory.pause``) is reported within a bounded wait; a scheduler
killed mid-fit is reported at once as `SchedulerLostError` naming its address, the round and
how to resume; ``dmp run`` prints dmp's named errors as one line.  Real clusters: a
multi-process ``LocalCluster``, and ``dask scheduler`` / ``dask worker`` processes."""

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dmp.decomposition import MatrixFactorization
from dmp.exceptions import (DMPError, InsufficientMemoryError, RecoveryError, SchedulerLostError,
                            WorkerLostError, WorkerPausedError)

from test_cli_cluster import BIN, _free_port

pytestmark = [pytest.mark.dask]


def _ratings(seed=0, n_users=2000, n_items=400, nnz=40_000):
    rng = np.random.default_rng(seed)
    flat = rng.choice(n_users * n_items, nnz, replace=False)
    return sp.coo_matrix((rng.standard_normal(nnz), (flat // n_items, flat % n_items)),
                         shape=(n_users, n_items))


def _ballast(fraction, dask_worker=None):
    """Hold memory on this worker until its process uses ``fraction`` of its limit (kept on
    the worker object: a function's globals do not outlive ``client.run``)."""
    import psutil

    limit = dask_worker.memory_manager.memory_limit
    n = int(fraction * limit - psutil.Process().memory_info().rss)
    dask_worker._dmp_test_ballast = np.ones(max(n, 0) // 8)
    return limit


def _drop_ballast(dask_worker=None):
    import gc

    dask_worker.__dict__.pop("_dmp_test_ballast", None)
    gc.collect()


def _address_of(client, name):
    return next(a for a, w in client.scheduler_info()["workers"].items()
                if str(w["name"]) == str(name))


def _wait_status(client, address, status, timeout=30.0):
    from dmp.engine.backends.dask import _identity_workers

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _identity_workers(client).get(address, {}).get("status") == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"worker {address} did not become {status!r} within {timeout} s")


def _pause(client, name):
    """Make worker ``name`` cross Dask's pause threshold (80% of its limit) but not the
    terminate one (95%)."""
    address = _address_of(client, name)
    client.run(_ballast, 0.88, workers=[address])
    _wait_status(client, address, "paused")
    return address


def _unpause(client, address):
    client.run(_drop_ballast, workers=[address])
    _wait_status(client, address, "running")


@pytest.fixture(scope="module")
def small_cluster():
    """Two single-threaded worker processes with 1 GiB each (a few hundred MiB of ballast
    pauses one)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GiB",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        yield client


def _check_paused_message(err, address):
    msg = str(err)
    assert isinstance(err, DMPError) and isinstance(err, RuntimeError)
    assert "worker 1" in msg and address in msg and "paused" in msg
    assert re.search(r"uses \d+ MiB of its 1\.00 GiB memory limit \(\d+%\)", msg), msg
    assert "pause threshold of 80%" in msg and "distributed.worker.memory.pause" in msg
    assert "more memory" in msg and "more workers" in msg
    assert "dmp.worker-pause-timeout" in msg


@pytest.fixture(scope="class")
def paused_worker(small_cluster):
    """Worker 1 of `small_cluster` paused (for the tests of one class), then let go."""
    address = _pause(small_cluster, 1)
    try:
        yield address
    finally:
        _unpause(small_cluster, address)


class TestPausedWorker:
    """A worker paused before the fit (a fit before it left its memory full): the partition
    task placed there never starts, and the worker never leaves.  The fit waited forever."""

    @pytest.mark.timeout(120)
    @pytest.mark.parametrize("name", ["lasso", "lda", "mf-ccd", "mf-ccd++", "ba", "sgd"])
    def test_a_paused_worker_fails_the_fit_within_the_bound(self, small_cluster,
                                                            paused_worker, name):
        import dask

        from test_fault_matrix import FITS, fit_quietly

        client = small_cluster
        with dask.config.set({"dmp.worker-pause-timeout": "2s"}):
            t0 = time.monotonic()
            with pytest.raises(WorkerPausedError) as err:
                fit_quietly(FITS[name], backend=client, n_workers=2)
            took = time.monotonic() - t0
        assert 2 <= took < 40, took
        _check_paused_message(err.value, paused_worker)
        # nothing of the failed fit stays on the workers
        assert sum(client.run(lambda dask_worker: len(dask_worker.state.actors)).values()) == 0


def test_the_cluster_fits_again_once_the_worker_is_let_go(small_cluster):
    MatrixFactorization(n_components=4, max_iter=2, tol=0, random_state=0,
                        backend=small_cluster).fit(_ratings(nnz=5000))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_paused_during_a_fit_fails_its_recovery_within_the_bound(small_cluster):
    """Worker 1 pauses mid-fit (its rounds still run: actor calls are not tasks) and worker 0
    is SIGKILLed: the recovery places partitions on the paused worker again.  It waited
    forever (seen as MF's recovery after a memory-limit restart)."""
    import dask

    client = small_cluster
    R = _ratings(seed=1)
    victim_pid = client.run(os.getpid, workers=[_address_of(client, 0)])
    state = {}

    def pause_and_kill(r, metrics):
        if r == 4 and not state:
            state["address"] = _pause(client, 1)
            os.kill(next(iter(victim_pid.values())), signal.SIGKILL)
            state["t"] = time.monotonic()
        return False

    try:
        with dask.config.set({"dmp.worker-pause-timeout": "3s"}):
            with pytest.raises(WorkerPausedError) as err:
                MatrixFactorization(n_components=4, max_iter=200, tol=0, random_state=0,
                                    callback=pause_and_kill, backend=client).fit(R)
        assert state, "the fit ended before the worker was paused"
        # the replacement of worker 0 starts within the wait, then 3 s of the pause
        assert time.monotonic() - state["t"] < 60
        _check_paused_message(err.value, state["address"])
    finally:
        if state:
            _unpause(client, state["address"])
        client.wait_for_workers(2, timeout=60)


@pytest.mark.timeout(120)
def test_recovery_without_workers_left_is_a_named_error(tmp_path):
    """The cluster shrinks to no worker mid-fit: the recovery gives up with `RecoveryError`
    (a `RuntimeError`, as before, and a `DMPError` that `dmp run` prints as one line)."""
    from distributed import Client, LocalCluster

    from dmp.engine.backends.dask import DaskBackend

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        backend = DaskBackend(client, replacement_timeout=1.0)

        def retire(r, metrics):
            if r == 3:
                cluster.scale(0)
            return False

        with pytest.raises(RecoveryError, match="no Dask workers left") as err:
            MatrixFactorization(n_components=4, max_iter=500, tol=0, random_state=0,
                                callback=retire, backend=backend).fit(_ratings(nnz=5000))
    assert isinstance(err.value, RuntimeError) and isinstance(err.value, DMPError)


def test_named_errors_keep_their_builtin_bases():
    assert issubclass(WorkerLostError, RuntimeError) and issubclass(WorkerLostError, DMPError)
    assert (issubclass(InsufficientMemoryError, MemoryError)
            and issubclass(InsufficientMemoryError, DMPError))
    assert issubclass(SchedulerLostError, ConnectionError)
    from dmp.engine import WorkerLostError as engine_error
    from dmp.engine.backends.base import InsufficientMemoryError as base_error

    assert engine_error is WorkerLostError and base_error is InsufficientMemoryError


class Scheduler:
    """``dask scheduler`` and ``dask worker`` processes on random 127.0.0.1 ports."""

    def __init__(self, tmp: Path, n_workers=2):
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.scheduler = subprocess.Popen(
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
             "--dashboard-address", f"127.0.0.1:{_free_port()}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "scheduler.log", "w"))
        self.workers = [subprocess.Popen(
            [str(BIN / "dask"), "worker", self.address, "--name", f"w{k}", "--nthreads", "1",
             "--no-nanny", "--memory-limit", "2GiB", "--dashboard-address", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / f"w{k}.log", "w"))
            for k in range(n_workers)]

    def kill_scheduler(self) -> float:
        self.scheduler.send_signal(signal.SIGKILL)
        return time.monotonic()

    def close(self) -> None:
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


KILLED_WITH_THE_SCHEDULER = ["lasso", "lda", "mf-ccd", "mf-ccd++", "ba", "sgd"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_killed_scheduler_ends_every_running_fit_at_once(tmp_path):
    """Six fits at once on one cluster (every model: one thread each, one client), each held in its callback once it has a checkpoint (BA, which takes none: once
    a round ran); the scheduler is SIGKILLed and each fit ends within seconds with
    `SchedulerLostError` naming the address, its round and its checkpoint (BA: that it had
    no checkpoint location).  It was a raw ``CommClosedError: ConnectionPool closing.`` once
    the client stopped reconnecting (its ``timeout``, here 30 s).  (``dmp run``'s one line:
    below.)"""
    import threading
    import traceback

    from distributed import Client

    from dmp.engine.checkpoint import CheckpointStore

    from test_fault_matrix import FITS, fit_quietly

    long = {"lasso": dict(tol=0, max_iter=10**6), "lda": dict(max_iter=10**6),
            "mf-ccd": dict(max_iter=10**6), "mf-ccd++": dict(max_iter=10**6), "ba": dict(max_iter=10**4),
            "sgd": dict(max_iter=10**7)}
    cluster = Scheduler(tmp_path)
    killed = threading.Event()
    ready = {name: threading.Event() for name in KILLED_WITH_THE_SCHEDULER}
    reached, errors, ended, tracebacks = {}, {}, {}, {}
    try:
        client = Client(cluster.address, timeout="30s")
        client.wait_for_workers(2, timeout=120)

        def run(name):
            fit = FITS[name]
            store = (None if fit.every is None
                     else CheckpointStore(tmp_path / f"{name}.zarr"))

            def hold(r, metrics):
                if not ready[name].is_set() and (store is None or store.latest() is not None):
                    reached[name] = r
                    ready[name].set()
                    killed.wait(120)
                return False

            kw = {} if store is None else dict(checkpoint=store.path,
                                               checkpoint_every=fit.every)
            try:
                fit_quietly(fit, backend=client, n_workers=2, callback=hold, **kw,
                            **long[name])
            except BaseException as exc:  # noqa: BLE001 - what each fit ended with
                errors[name] = exc
                tracebacks[name] = traceback.format_exc()
            ended[name] = time.monotonic()

        threads = [threading.Thread(target=run, args=(n,), daemon=True)
                   for n in KILLED_WITH_THE_SCHEDULER]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while not all(ev.is_set() for ev in ready.values()):
            assert not errors and time.monotonic() < deadline, \
                f"not every fit reached its checkpoint: {tracebacks}"
            time.sleep(0.05)
        t_kill = cluster.kill_scheduler()
        killed.set()
        for t in threads:
            t.join(60)
        client.close(timeout=5)
    finally:
        killed.set()
        cluster.close()
    for name in KILLED_WITH_THE_SCHEDULER:
        exc = errors.get(name)
        assert isinstance(exc, SchedulerLostError), (name, repr(exc))
        assert ended[name] - t_kill < 10, (name, ended[name] - t_kill)
        assert exc.address == cluster.address and exc.round >= reached[name], (name, exc)
        msg = str(exc)
        assert f"scheduler at {cluster.address} was lost" in msg and f"at round {exc.round}" \
            in msg, msg
        if FITS[name].every is None:
            assert exc.checkpoint is None and "had no checkpoint location" in msg, msg
        else:
            path = str(tmp_path / f"{name}.zarr")
            assert exc.checkpoint == path and exc.checkpoint_round is not None, (name, exc)
            assert exc.checkpoint_round == CheckpointStore(path).latest()
            assert "resume=True" in msg, msg


CLI_PIPELINE = """\
name: stall
dataset: lasso_small
estimator:
  class: Lasso
  params: {alpha_ratio: 0.01, tol: 0, max_iter: 1000000, random_state: 0}
checkpoint_every: 10
"""


def _stderr_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dmp_run_says_in_one_line_how_to_resume_after_the_scheduler_is_lost(tmp_path):
    from dmp.engine.checkpoint import CheckpointStore

    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(CLI_PIPELINE)
    out = tmp_path / "run"
    store = CheckpointStore(tmp_path / ".run-checkpoints" / "Lasso.zarr")
    cluster = Scheduler(tmp_path)
    argv = ["run", str(pipeline), "--output", str(out), "--no-progress",
            "--scheduler", cluster.address]
    try:
        proc = subprocess.Popen([str(BIN / "dmp"), *argv], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if store.latest() is not None:
                    break
            except (ValueError, KeyError, OSError):   # being written right now
                pass
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
        t_kill = cluster.kill_scheduler()
        _, stderr = proc.communicate(timeout=120)
        took = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.close()
    lines = _stderr_lines(stderr)
    assert proc.returncode == 1 and len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith(f"dmp: error: the Dask scheduler at {cluster.address} was lost "
                           f"at round "), line
    assert line.endswith(f"continue with: dmp {' '.join(argv)} --resume"), line
    assert took < 15, took
    assert store.latest() is not None   # the checkpoints it names are still there


@pytest.mark.timeout(300)
def test_dmp_run_prints_a_model_too_big_for_the_workers_as_one_line(tmp_path):
    """`InsufficientMemoryError` (raised before any partition exists) was a traceback."""
    pipeline = tmp_path / "pipeline.yaml"
    # 350 MiB workers: Dask pauses them at 280 MiB, less than dmp's fixed cost per worker
    # (alpha given: alpha_ratio would run tasks before the fit)
    pipeline.write_text(CLI_PIPELINE.replace("alpha_ratio:", "alpha:")
                        + "cluster: {n_workers: 1, memory_limit: 350MiB}\n")
    proc = subprocess.run([str(BIN / "dmp"), "run", str(pipeline), "--output",
                           str(tmp_path / "run"), "--no-progress"],
                          capture_output=True, text=True, timeout=240)
    lines = _stderr_lines(proc.stderr)
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("dmp: error: the model does not fit the workers' memory"), lines
    assert not (tmp_path / "run").exists()


def test_the_pause_wait_is_a_dask_setting():
    import dask

    from dmp.engine.backends.dask import pause_timeout

    assert pause_timeout() == 30.0
    with dask.config.set({"dmp.worker-pause-timeout": "2m"}):
        assert pause_timeout() == 120.0
    with dask.config.set({"dmp.worker-pause-timeout": "soon"}):
        with pytest.raises(ValueError, match="dmp.worker-pause-timeout must be a duration"):
            pause_timeout()
