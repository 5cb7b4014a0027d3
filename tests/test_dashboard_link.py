"""The dashboard address dmp prints: only one that answers."""

import subprocess
import sys

import pytest
from distributed import Client

from dmp.utils.cluster import dashboard_base

pytestmark = pytest.mark.dask


def test_a_cluster_with_a_dashboard_gives_its_address(dask_client):
    base = dashboard_base(dask_client)
    assert base is not None and base.startswith("http://127.0.0.1:")
    assert dask_client.dashboard_link.startswith(base)


def test_a_scheduler_without_a_dashboard_gives_none(tmp_path):
    # it still serves JSON and health routes and lists them as its dashboard service
    sched_file = tmp_path / "scheduler.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", "0", "--no-dashboard", "--dashboard-address", "127.0.0.1:0",
         "--scheduler-file", str(sched_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with Client(scheduler_file=str(sched_file), timeout="30s") as client:
            assert client.dashboard_link.startswith("http://127.0.0.1:")
            assert dashboard_base(client) is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
