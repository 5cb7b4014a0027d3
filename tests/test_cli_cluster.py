"""What Kubernetes does, with plain processes: ``dask scheduler --preload dmp.monitor.preload``
and three ``dask worker --name ...`` processes started from the command line, ``dmp run
--scheduler``; then a worker killed mid-fit and replaced by a new process with the same name."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import zarr

BIN = Path(sys.executable).parent
PIPELINE = """\
name: lasso_cli_cluster
dataset: lasso_small
estimator:
  class: Lasso
  params: {alpha_ratio: 0.05, tol: 1.0e-6, max_iter: 3000, random_state: 0,
           schedule: priority}
checkpoint_every: 10
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CommandLineCluster:
    def __init__(self, n_workers: int, tmp: Path):
        self.port, self.http = _free_port(), _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.tmp = tmp
        self.scheduler = subprocess.Popen(
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
             "--dashboard-address", f"127.0.0.1:{self.http}", "--preload", "dmp.monitor.preload"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "scheduler.log", "w"))
        self.workers = {}
        for k in range(n_workers):
            self.start_worker(f"w{k}")

    def start_worker(self, name: str) -> None:
        self.workers[name] = subprocess.Popen(
            [str(BIN / "dask"), "worker", self.address, "--name", name, "--nthreads", "1",
             "--no-nanny", "--memory-limit", "3GiB", "--dashboard-address", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=open(self.tmp / f"{name}.log", "a"))

    def close(self) -> None:
        # workers first: a worker whose scheduler is already gone spends its shutdown
        # waiting to tell it so
        for group in (list(self.workers.values()), [self.scheduler]):
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in group:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def _dmp_run(pipeline, out, *extra):
    proc = subprocess.run([str(BIN / "dmp"), "run", str(pipeline), "--output", str(out),
                           "--no-progress", *extra], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    coef = zarr.open_group(str(out / "coef.zarr"), mode="r")["coef"][:]
    return metrics, coef, proc.stdout


def _reference(n_workers, alpha):
    """The uninterrupted fit of PIPELINE, in-process: the local backend computes what the
    Dask backend does for the same partitions (tests/test_dask_backend.py), and `dmp run`
    on an embedded cluster runs the Dask backend (tests/test_cli.py)."""
    from dmp.io import build_dataset
    from dmp.linear_model import Lasso

    est = Lasso(alpha=alpha, tol=1e-6, max_iter=3000, random_state=0, schedule="priority",
                backend="local", n_workers=n_workers).fit(build_dataset("lasso_small"))
    return {"rounds": est.n_iter_, "objective": est.objective_}, est.coef_


@pytest.mark.slow
@pytest.mark.dask
@pytest.mark.timeout(600)
def test_command_line_cluster_matches_in_process_and_survives_a_replaced_worker(tmp_path):
    from distributed import Client

    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(PIPELINE)

    cluster = CommandLineCluster(3, tmp_path)
    try:
        with Client(cluster.address, timeout="60s") as client:
            client.wait_for_workers(3, timeout=120)
            # the preloaded monitor: the page is in the dashboard's menu
            with urllib.request.urlopen(f"http://127.0.0.1:{cluster.http}/status",
                                        timeout=30) as resp:
                assert "individual-dmp-training" in resp.read().decode()

            metrics, coef, printed = _dmp_run(pipeline, tmp_path / "cli",
                                              "--scheduler", cluster.address)
            got = metrics["runs"]["Lasso"]
            ref, ref_coef = _reference(3, metrics["params"]["alpha"])
            assert metrics["n_workers"] == 3 and got["rounds"] == ref["rounds"]
            assert abs(got["objective"] - ref["objective"]) <= 1e-12 * ref["objective"]
            np.testing.assert_allclose(coef, ref_coef, rtol=0, atol=1e-12)

            # kill w1 mid-fit (after the first checkpoint) and start a replacement named w1
            killed = threading.Event()

            def on_event(event):
                msgs = event[1].get("events", [event[1]]) if isinstance(event[1], dict) else []
                for msg in msgs:
                    if (msg.get("kind") == "round" and msg.get("round", 0) >= 15
                            and not killed.is_set()):
                        killed.set()
                        cluster.workers["w1"].send_signal(signal.SIGKILL)
                        cluster.workers["w1"].wait(timeout=30)
                        cluster.start_worker("w1")

            client.subscribe_topic("dmp", on_event)
            metrics, coef, printed = _dmp_run(pipeline, tmp_path / "killed",
                                              "--scheduler", cluster.address)
            assert killed.is_set(), "the fit ended before the worker could be killed"
            got = metrics["runs"]["Lasso"]
            assert got["recoveries"] and len(got["recoveries"]) == 1
            assert abs(got["objective"] - ref["objective"]) <= 1e-8 * ref["objective"]
            np.testing.assert_allclose(coef, ref_coef, atol=1e-6)
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{cluster.http}/dmp/api/metrics.json", timeout=30) as r:
                fits = json.load(r)["fits"]
            assert [f["n_worker_losses"] for f in fits] == [0, 1]
            assert fits[-1]["status"] == "converged"
    finally:
        cluster.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killed_driver_resumes_with_dmp_run_resume(tmp_path):
    """The process running `dmp run` (driver and embedded cluster) is SIGKILLed after its
    first complete checkpoint; `dmp run --resume` continues from it to the uninterrupted
    result."""
    import os

    from dmp.engine.checkpoint import CheckpointStore

    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(PIPELINE)
    out = tmp_path / "run"
    store = CheckpointStore(tmp_path / ".run-checkpoints" / "Lasso.zarr")
    proc = subprocess.Popen([str(BIN / "dmp"), "run", str(pipeline), "--output", str(out),
                             "--no-progress", "--workers", "2"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if store.latest() is not None and store.latest() >= 20:
                    break
            except (ValueError, KeyError, OSError):   # being written right now
                pass
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)     # the driver and its embedded cluster
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = store.latest()
    assert killed_at is not None and not out.exists()

    metrics, coef, printed = _dmp_run(pipeline, out, "--workers", "2", "--resume")
    got = metrics["runs"]["Lasso"]
    ref, ref_coef = _reference(2, metrics["params"]["alpha"])
    # (the Lasso may stop a round apart: its gap check is where a resumed run re-enters)
    assert killed_at < got["rounds"] and abs(got["rounds"] - ref["rounds"]) <= 2
    assert abs(got["objective"] - ref["objective"]) <= 1e-8 * ref["objective"]
    np.testing.assert_allclose(coef, ref_coef, atol=1e-6)
    assert not store.exists()      # checkpoints removed once the run is complete
