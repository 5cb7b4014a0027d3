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
