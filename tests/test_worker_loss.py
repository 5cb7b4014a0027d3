"""Worker losses beyond one, on a 3-worker LocalCluster: two in a row, one whose worker never
comes back.  (A loss while the partitions load, and one during the recovery, for every
model: test_fault_matrix.py.)  (That every estimator recovers from a
worker SIGKILLed during a fit to the undisturbed result is a contract of every estimator:
tests/test_conformance.py; the Lasso's other worker-loss tests are in test_dask_backend.py
and test_cli_cluster.py.)"""

import logging
import os
import signal
import time
import warnings

import numpy as np
import pytest

from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
from conftest import make_corpus, make_ratings

pytestmark = [pytest.mark.dask, pytest.mark.slow]


def _ratings(seed=0, n_users=3000, n_items=600, nnz=90_000):
    return make_ratings(n_users, n_items, nnz, rank=5, seed=seed)


def _cases():
    R = _ratings()
    return {
        "mf-ccd++": (lambda **kw: MatrixFactorization(n_components=8, max_iter=12, tol=0,
                                                      random_state=0, **kw), (R,),
                     lambda e: np.asarray(e.user_factors_), 2),
        "mf-ccd": (lambda **kw: MatrixFactorization(n_components=8, max_iter=6, tol=0,
                                                    method="ccd", block_size=2,
                                                    random_state=0, **kw), (R,),
                   lambda e: np.asarray(e.item_factors_), 1),
        # killed during a sub-round: while sampling or while a word block is in transit
        "lda": (lambda **kw: LatentDirichletAllocation(6, max_iter=15, random_state=0, **kw),
                (_corpus(),), lambda e: e.topic_word_counts_, 2),
    }


def _corpus(n_docs=400, n_words=500, n_topics=6, doc_len=60):
    return make_corpus(n_docs, n_words, n_topics=n_topics, doc_len=doc_len, seed=4)


def _final_metric(est) -> float:
    return est.objective_ if hasattr(est, "objective_") else est.log_likelihood_


CASES = _cases()


def _kill_one(client, victims=("1",)):
    pids = client.run(os.getpid)
    names = {addr: w["name"] for addr, w in client.scheduler_info()["workers"].items()}
    for addr, pid in pids.items():
        if str(names.get(addr)) in victims:
            os.kill(pid, signal.SIGKILL)
            return True
    return False


def _wait_for_workers(client, n=3, timeout=60):
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info()["workers"]) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    names = sorted(str(w["name"]) for w in client.scheduler_info()["workers"].values())
    assert len(names) >= n, f"only workers {names} of {n} came back within {timeout} s"


@pytest.mark.timeout(180)
def test_two_losses_in_a_row(cluster3, tmp_path):
    make, args, result, _ = CASES["mf-ccd++"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = make(backend="local", n_workers=3).fit(*args)
    kills = []

    def kill_twice(round, metrics):
        if len(kills) < 2 and round in (20, 45) and round not in kills:
            kills.append(round)
            _kill_one(cluster3, victims=("0",) if len(kills) == 1 else ("2",))
        return False

    _wait_for_workers(cluster3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = make(backend=cluster3, n_workers=3, checkpoint=str(tmp_path / "ck.zarr"),
                   checkpoint_every=2, callback=kill_twice).fit(*args)
    _wait_for_workers(cluster3)
    assert kills == [20, 45] and len(est.recoveries_) == 2
    np.testing.assert_allclose(result(est), result(reference), rtol=1e-7, atol=1e-9)


# the ring programs (blocks sent worker to worker, so two partitions then share a worker's
# actors); a driver-reduced program's re-deal is the Lasso's test in test_dask_backend.py
@pytest.mark.parametrize("name", ["mf-ccd", "lda"])
@pytest.mark.timeout(180)
def test_lost_worker_never_replaced_partitions_redealt(tmp_path, name):
    """A worker SIGKILLed whose nanny does not restart it never comes back: after
    ``replacement_timeout`` its partition is re-dealt to the two survivors and the fit ends
    with the undisturbed result.  (The Lasso's version: test_dask_backend.py.)"""
    from distributed import Client, LocalCluster
    from distributed.core import Status

    from dmp.engine.backends.dask import DaskBackend, cluster_workers

    make, args, result, every = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = make(backend="local", n_workers=3, checkpoint_every=every).fit(*args)
    at_round = len(reference.history_["round"]) // 3
    fired = []
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        backend = DaskBackend(client, n_workers=3, replacement_timeout=2.0)

        def kill_for_good(round, metrics):
            if round == at_round and not fired:
                fired.append(round)
                names = cluster_workers(client)
                victim = next(a for a, n in names.items() if str(n) == "2")
                pid = client.run(os.getpid, workers=[victim])[victim]
                # LocalCluster's nannies live in this process: mark worker 2's as closing
                # (it then closes instead of restarting the worker), then kill the worker
                cluster.workers[2].status = Status.closing_gracefully
                os.kill(pid, signal.SIGKILL)
            return False

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = make(backend=backend, checkpoint=str(tmp_path / "ck.zarr"),
                       checkpoint_every=every, callback=kill_for_good).fit(*args)
        assert sorted(map(str, cluster_workers(client).values())) == ["0", "1"]
        assert sorted(set(map(str, backend.placement))) == ["0", "1"]
    assert fired == [at_round] and len(est.recoveries_) == 1, est.recoveries_
    np.testing.assert_allclose(result(est), result(reference), rtol=1e-7, atol=1e-9)
    assert abs(_final_metric(est) - _final_metric(reference)) <= \
        1e-9 * abs(_final_metric(reference))
