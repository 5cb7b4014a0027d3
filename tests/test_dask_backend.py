"""The Lasso on a real multi-process LocalCluster: same answer as in-process, data loaded on
the workers, recovery from a killed worker."""

import json
import logging
import os
import pickle
import signal
import threading
import time
import urllib.request

import numpy as np
import pytest
from sklearn.linear_model import Lasso as SkLasso

from dmp.engine.backends.dask import DaskBackend, cluster_workers
from dmp.exceptions import WorkerLostError
from dmp.io import write_sparse
from dmp.linear_model import Lasso
from dmp.linear_model._lasso_program import LassoProgram
from dmp.planning import NullProgram

from conftest import alpha_max, make_problem

pytestmark = [pytest.mark.dask, pytest.mark.timeout(240)]


def _objective(X, y, coef, b, alpha):
    r = y - X @ coef - b
    return 0.5 * float(r @ r) / X.shape[0] + alpha * np.abs(coef).sum()


@pytest.mark.parametrize("schedule", ["priority", "round_robin", "random"])
def test_matches_sklearn(schedule):
    """The problem of the conformance table's Lasso cases (tests/test_conformance.py, where
    the fit on Dask is this in-process fit, round for round) against scikit-learn."""
    X, y = make_problem()
    alpha = 0.05 * alpha_max(X, y)
    kw = dict(alpha=alpha, schedule=schedule, tol=1e-10, random_state=3, n_workers=2)
    local = Lasso(backend="local", **kw).fit(X, y)
    sk = SkLasso(alpha=alpha, tol=1e-12, max_iter=100_000).fit(X, y)
    f_sk = _objective(X, y, sk.coef_, sk.intercept_, alpha)
    f = _objective(X, y, local.coef_, local.intercept_, alpha)
    assert abs(f - f_sk) / f_sk <= 1e-6
    assert np.array_equal(np.flatnonzero(local.coef_), np.flatnonzero(sk.coef_))


def test_auto_backend_uses_active_client(dask_client):
    X, y = make_problem(seed=1)
    est = Lasso(alpha=0.05 * alpha_max(X, y), tol=1e-8, random_state=0).fit(X, y)
    # one partition per Dask worker, with push times from both
    assert est.history_["push_s"].shape[1] == 2


def test_cluster_workers_is_never_empty_on_a_live_cluster(dask_client):
    """``Client.scheduler_info()`` can return a cached identity without workers (its
    periodic refresh races the fetch; it failed CI); ``cluster_workers`` asks directly."""
    import dask
    from distributed import Client

    with dask.config.set({"distributed.client.scheduler-info-interval": "5ms"}), \
            Client(dask_client.scheduler.address, set_as_default=False) as client:
        sizes = {len(cluster_workers(client)) for _ in range(400)}
    assert sizes == {2}


def test_explicit_client_backend(dask_client):
    """``backend=client`` runs on that client's cluster even when another client is current."""
    from distributed import Client

    X, y = make_problem(seed=2)
    kw = dict(alpha=0.05 * alpha_max(X, y), tol=1e-8, random_state=0)
    ref = Lasso(backend="local", n_workers=2, **kw).fit(X, y)
    with Client(dask_client.scheduler.address, set_as_default=False) as other:
        est = Lasso(backend=other, **kw).fit(X, y)
        assert other.direct_to_workers is not True  # restored after the fit
    assert est.history_["push_s"].shape[1] == len(cluster_workers(dask_client)) == 2
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=0, atol=1e-13)


def test_clone_and_cross_validation_share_the_client(dask_client):
    """A ``Client`` given as ``backend`` survives ``sklearn.base.clone`` by reference (it is a
    connection, not a value: every estimator's clone contract, tests/test_conformance.py), so
    model selection runs on the cluster."""
    from sklearn.base import clone
    from sklearn.model_selection import cross_val_score

    X, y = make_problem(seed=4)
    est = Lasso(alpha=0.05 * alpha_max(X, y), backend=dask_client, random_state=0)
    scores = cross_val_score(est, X, y, cv=2)
    local = cross_val_score(clone(est).set_params(backend="local", n_workers=2), X, y, cv=2)
    np.testing.assert_allclose(scores, local, rtol=1e-9)


def test_workers_load_their_shards_from_the_store(dask_client, tmp_path):
    """Only the dataset handle travels: the program shipped to the workers is tiny."""
    X, y = make_problem(n=400, p=3000, density=0.05)
    ds = write_sparse(tmp_path / "d.zarr", X, y, n_shards=4)
    program = LassoProgram(ds, alpha=0.01, fit_intercept=True, schedule="priority",
                           schedule_size=100, eta=1e-3, rho=None, oversample=2.0, tol=1e-4,
                           check_every=3000, refresh_every=10, seed=0)
    shipped = len(pickle.dumps(program))
    assert shipped < 5_000 < X.data.nbytes
    est = Lasso(alpha=0.05 * alpha_max(X, y), tol=1e-8, random_state=0,
                backend="dask").fit(ds)
    ref = Lasso(alpha=0.05 * alpha_max(X, y), tol=1e-8, random_state=0, backend="local",
                n_workers=2).fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=0, atol=1e-13)


def test_unreachable_scheduler_error():
    from dmp.pipeline import _start_cluster

    with pytest.raises(ConnectionError, match="cannot reach the Dask scheduler"):
        _start_cluster({}, "tcp://127.0.0.1:9", None)


@pytest.mark.slow
def test_killed_worker_resumes_from_checkpoint(tmp_path):
    from distributed import Client, LocalCluster

    X, y = make_problem(n=300, p=4000, density=0.02, seed=5)
    alpha = 0.02 * alpha_max(X, y)
    kw = dict(alpha=alpha, tol=1e-9, random_state=0, n_workers=2)
    reference = Lasso(backend="local", **kw).fit(X, y)
    killed = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:

        def kill_once(round, metrics):
            if round == 25 and not killed:
                pids = client.run(os.getpid)
                victim = sorted(pids)[1]
                os.kill(pids[victim], signal.SIGKILL)
                killed.append(round)
            return False

        est = Lasso(backend="dask", checkpoint=str(tmp_path / "ckpt.zarr"),
                    checkpoint_every=10, callback=kill_once, **kw).fit(X, y)
        # the live monitor saw the checkpoints, the loss and the recovery
        base = client.dashboard_link.rsplit("/status", 1)[0]
        with urllib.request.urlopen(base + "/dmp/api/metrics.json", timeout=10) as resp:
            fit, = json.load(resp)["fits"]
    assert (fit["n_worker_losses"], fit["n_recoveries"]) == (1, 1)
    assert fit["n_checkpoints"] >= 2 and fit["status"] == "converged"
    kinds = [e["kind"] for e in fit["events"]]
    assert kinds.index("worker_lost") < kinds.index("recovered") < kinds.index("fit_end")
    assert killed == [25]
    assert len(est.recoveries_) == 1
    assert est.recoveries_[0]["resumed_round"] in (10, 20)
    f_ref = _objective(X, y, reference.coef_, reference.intercept_, alpha)
    f = _objective(X, y, est.coef_, est.intercept_, alpha)
    assert abs(f - f_ref) / f_ref <= 1e-8
    np.testing.assert_allclose(est.coef_, reference.coef_, atol=1e-6)


@pytest.mark.slow
def test_lost_worker_without_replacement_redeals_partitions(tmp_path):
    """A worker that does not come back: its partition is re-dealt to the survivor."""
    from distributed import Client, LocalCluster

    X, y = make_problem(n=300, p=4000, density=0.02, seed=6)
    alpha = 0.02 * alpha_max(X, y)
    kw = dict(alpha=alpha, tol=1e-9, random_state=0, n_workers=2)
    reference = Lasso(backend="local", **kw).fit(X, y)
    retired = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        backend = DaskBackend(client, n_workers=2, replacement_timeout=1.0)

        def retire_once(round, metrics):
            if round == 25 and not retired:
                cluster.scale(1)  # the cluster itself shrinks: no replacement will come
                retired.append(round)
            return False

        est = Lasso(backend=backend, checkpoint=str(tmp_path / "ckpt.zarr"),
                    checkpoint_every=10, callback=retire_once,
                    **{k: v for k, v in kw.items() if k != "n_workers"}).fit(X, y)
        survivors = cluster_workers(client)
        assert len(survivors) == 1
        # both partitions now live on the one surviving worker
        assert len(set(map(str, backend.placement))) == 1
    assert len(est.recoveries_) == 1
    f_ref = _objective(X, y, reference.coef_, reference.intercept_, alpha)
    f = _objective(X, y, est.coef_, est.intercept_, alpha)
    assert abs(f - f_ref) / f_ref <= 1e-8


class _SlowLoad(NullProgram):
    """Each partition takes ``seconds`` to load."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def init_partition(self, spec):
        time.sleep(self.seconds)
        return super().init_partition(spec)


def test_a_partition_load_cancelled_elsewhere_is_taken_for_a_lost_worker(dask_client):
    """A partition's future cancelled while it loads (by the scheduler, or another client)
    ends the wait as a lost worker (which a fit recovers from): the wait polls the
    future's completion, not distributed's ``result(timeout=...)``, whose race raised
    UnboundLocalError (dask/distributed#8514)."""
    backend = DaskBackend(dask_client, n_workers=2)
    program = _SlowLoad(3.0)
    program.start(2)

    def cancel_soon():
        for _ in range(100):
            if getattr(backend, "_futures", None):
                break
            time.sleep(0.05)
        time.sleep(0.5)
        dask_client.cancel(backend._futures)

    t = threading.Thread(target=cancel_soon)
    t.start()
    try:
        with pytest.raises(WorkerLostError, match="cancelled"):
            backend.start(program, program.partition_specs(2))
    finally:
        t.join()
        backend.close()
