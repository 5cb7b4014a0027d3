"""glibc heap thresholds in workers (`dmp.utils.heap`): temporaries from the heap, not fresh
pages, in a process started as a Dask nanny starts its workers."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import make_problem
from dmp.utils import heap

glibc = pytest.mark.skipif(heap._mallopt() is None, reason="needs glibc's mallopt (Linux)")


def faults_per_temporary(n=200, size=1 << 17):
    """Minor page faults per 1 MiB temporary made and freed by numpy in a thread (where
    a partition's kernels run)."""
    import resource
    import threading

    out = []

    def run():
        a = np.ones(size)
        r0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(n):
            b = a * 2.0
            del b
        out.append((resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - r0) / n)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    return out[0]


_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from test_heap import faults_per_temporary
    from dmp.utils import heap
    applied = heap.reuse_heap()
    again = heap.reuse_heap()
    print(json.dumps({{"applied": applied, "again": again, "faults": faults_per_temporary()}}))
""")


def _child(**env):
    """`reuse_heap` then the faults per temporary, in a fresh process started with the
    nanny's ``MALLOC_TRIM_THRESHOLD_`` and ``env``."""
    full = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", **env}
    code = _CHILD.format(tests=os.path.dirname(__file__))
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@glibc
def test_reuse_heap_stops_the_page_faults_of_a_nannys_trim_threshold():
    off = _child(DASK_DMP__WORKER_HEAP_REUSE="off")
    on = _child()
    assert off["applied"] is None
    # the nanny's setting: each 1 MiB temporary is 256 fresh pages
    assert off["faults"] > 200
    assert on["applied"] == [16 << 20, 8 << 20] and on["again"] == on["applied"]
    assert on["faults"] < 5


@glibc
def test_reuse_heap_takes_the_size_from_the_setting():
    small = _child(DASK_DMP__WORKER_HEAP_REUSE="4MiB")
    assert small["applied"] == [4 << 20, 2 << 20]
    assert small["faults"] < 5           # 1 MiB is under the 2 MiB mmap threshold
    tiny = _child(DASK_DMP__WORKER_HEAP_REUSE="512KiB")
    assert tiny["applied"] == [512 << 10, 256 << 10]
    assert tiny["faults"] > 200          # 1 MiB is over it: fresh pages again


@pytest.mark.parametrize("value", ["off", "no", False, None, 0])
def test_heap_reuse_off(dask_settings, value):
    dask_settings({heap.KEY: value})
    assert heap.heap_reuse_bytes() is None


def test_heap_reuse_bad_value_names_the_setting(dask_settings):
    dask_settings({heap.KEY: "lots"})
    with pytest.raises(ValueError, match="worker-heap-reuse"):
        heap.heap_reuse_bytes()


@glibc
def test_a_fit_gives_a_nannys_spawned_worker_the_heap_thresholds():
    """The wiring: a spawned worker (the nanny sets its trim threshold before it starts)
    makes fresh pages for each temporary until a fit's partition starts there."""
    import dask
    from distributed import Client, LocalCluster

    from dmp.linear_model import Lasso

    X, y = make_problem(n=60, p=40)
    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                         host="127.0.0.1", dashboard_address=None,
                         silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        before = client.submit(faults_per_temporary, pure=False).result()
        Lasso(alpha=0.01, backend=client).fit(X, y)
        after = client.submit(faults_per_temporary, pure=False).result()
    assert before > 200, "the nanny no longer sets MALLOC_TRIM_THRESHOLD_"
    assert after < 5
