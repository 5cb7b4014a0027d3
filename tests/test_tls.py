"""A TLS-secured cluster: every model on ``LocalCluster(security=True)`` (ring messages
included) gives the in-process result, the monitor opens no port of its own, and ``dmp run
--scheduler tls://...`` / ``dmp monitor tls://...`` take their certificates from Dask's
configuration (environment variables, a config YAML) or from ``--tls-*`` options."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import alpha_max, make_problem
from mf_reference import low_rank_ratings
from test_lda import lda_corpus
from test_sparsified import breast_cancer

pytestmark = [pytest.mark.dask, pytest.mark.timeout(240)]

BIN = Path(sys.executable).parent


def _listening(pid: int) -> set:
    """The ``(host, port)`` pairs process ``pid`` listens on (TCP)."""
    import psutil

    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def _cluster_listening(client) -> dict:
    """``{pid: listening (host, port) pairs}`` of the driver (scheduler and nannies) and of
    every worker process."""
    pids = {os.getpid(), *client.run(os.getpid).values()}
    return {pid: _listening(pid) for pid in pids}


@pytest.fixture(scope="module")
def tls():
    """A client of a 2-worker TLS LocalCluster (distributed's temporary self-signed
    credentials), with what every process listened on before any fit.  The client is not
    the default one (``set_as_default=False``, as ``dmp monitor`` makes them): the models
    are given it as ``backend=client`` and must use it, not look for a default client (the
    actor proxies did, and every call failed with ``AttributeError: ... '_io_loop'``)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, security=True,
                      host="127.0.0.1", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
        before = _cluster_listening(client)
        yield client, cluster, before


def test_the_cluster_is_tls_throughout(tls):
    client, cluster, _ = tls
    assert cluster.scheduler_address.startswith("tls://")
    workers = client.scheduler_info()["workers"]
    assert len(workers) == 2 and all(a.startswith("tls://") for a in workers)


def test_lasso(tls):
    from dmp.linear_model import Lasso

    client = tls[0]
    X, y = make_problem(n=80, p=300)
    kw = dict(alpha=0.05 * alpha_max(X, y), tol=1e-10, random_state=3, n_workers=2)
    local = Lasso(backend="local", **kw).fit(X, y)
    remote = Lasso(backend=client, **kw).fit(X, y)
    assert remote.history_["push_s"].shape[1] == 2
    np.testing.assert_allclose(remote.coef_, local.coef_, rtol=0, atol=1e-13)
    assert remote.n_iter_ == local.n_iter_


def test_lda_blocks_travel_worker_to_worker(tls):
    from dmp.decomposition import LatentDirichletAllocation

    client = tls[0]
    X, _, _ = lda_corpus(n_docs=60, n_words=80, n_topics=3, doc_len=30, seed=7)
    kw = dict(max_iter=4, random_state=4, n_workers=2)
    local = LatentDirichletAllocation(3, backend="local", **kw).fit(X)
    remote = LatentDirichletAllocation(3, backend=client, **kw).fit(X)
    np.testing.assert_array_equal(remote.topic_word_counts_, local.topic_word_counts_)
    np.testing.assert_array_equal(remote.history_["ll_per_token"], local.history_["ll_per_token"])
    assert remote.history_["bytes_ring"].sum() > 0
    np.testing.assert_array_equal(remote.history_["bytes_ring"], local.history_["bytes_ring"])


@pytest.mark.parametrize("method", ["ccd++", "ccd"])
def test_matrix_factorization(tls, method):
    from dmp.decomposition import MatrixFactorization

    client = tls[0]
    tr, te = low_rank_ratings(n=60, m=40, k=3, density=0.3, seed=8)
    kw = dict(alpha=0.1, method=method, block_size=2, max_iter=3, tol=None, n_workers=2,
              random_state=3)
    local = MatrixFactorization(3, backend="local", **kw).fit(tr, X_val=te)
    remote = MatrixFactorization(3, backend=client, **kw).fit(tr, X_val=te)
    np.testing.assert_array_equal(remote.user_factors_, local.user_factors_)
    np.testing.assert_array_equal(remote.item_factors_, local.item_factors_)
    np.testing.assert_array_equal(remote.history_["objective"], local.history_["objective"])


def test_binary_autoencoder_ring(tls):
    from sklearn.datasets import load_digits

    from dmp.hashing import BinaryAutoencoder

    client = tls[0]
    X = load_digits().data[:500]
    kw = dict(max_iter=2, random_state=0, n_workers=2, validation_size=50)
    local = BinaryAutoencoder(8, backend="local", **kw).fit(X)
    remote = BinaryAutoencoder(8, backend=client, **kw).fit(X)
    np.testing.assert_array_equal(remote.coef_, local.coef_)
    np.testing.assert_array_equal(remote.decoder_coef_, local.decoder_coef_)
    # the ParMAC W step: the submodels went round the ring, worker to worker, over TLS
    assert remote.history_["bytes_ring"][0] > 0
    np.testing.assert_array_equal(remote.history_["bytes_ring"], local.history_["bytes_ring"])


@pytest.mark.parametrize("method,extra", [("isega", {}), ("isaga", {"batch_size": 16})])
def test_sparsified_sgd(tls, method, extra):
    from dmp.linear_model import SparsifiedSGDClassifier, SparsifiedSGDRegressor

    client = tls[0]
    X, y = breast_cancer()
    X, y = X[::2], y[::2]
    kw = dict(alpha=1e-2, method=method, n_workers=2, max_iter=20, tol=None, random_state=3,
              **extra)
    local = SparsifiedSGDClassifier(backend="local", **kw).fit(X, y)
    remote = SparsifiedSGDClassifier(backend=client, **kw).fit(X, y)
    np.testing.assert_allclose(remote.coef_, local.coef_, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(remote.history_["upload_bytes"],
                                  local.history_["upload_bytes"])
    reg_local = SparsifiedSGDRegressor(backend="local", **kw).fit(X, X[:, 0] + y)
    reg = SparsifiedSGDRegressor(backend=client, **kw).fit(X, X[:, 0] + y)
    np.testing.assert_allclose(reg.coef_, reg_local.coef_, rtol=0, atol=1e-13)


def test_large_ring_messages_in_pieces(tls):
    """Ring messages larger than a piece travel in pieces between the workers."""
    from dmp.engine.backends.dask import DaskBackend
    from test_ring_transfer import _fit_and_check

    backend = DaskBackend(tls[0])
    try:
        _fit_and_check(backend, 2, rounds=3)
    finally:
        backend.close()


def test_monitor_served_on_the_dashboard_only(tls):
    """The dmp monitor adds routes to the scheduler's dashboard and opens no port: after fits
    every process listens where it did before the first one."""
    from dmp.linear_model import Lasso

    client, cluster, before = tls
    X, y = make_problem(n=60, p=200, seed=4)
    Lasso(alpha=0.05 * alpha_max(X, y), tol=1e-6, random_state=0, backend=client).fit(X, y)
    assert _cluster_listening(client) == before
    dashboard = cluster.scheduler.http_server.port
    scheduler_port = int(cluster.scheduler_address.rsplit(":", 1)[1])
    assert {("127.0.0.1", dashboard), ("127.0.0.1", scheduler_port)} \
        <= before[os.getpid()]
    base = f"http://127.0.0.1:{dashboard}"
    with urllib.request.urlopen(f"{base}/dmp/api/metrics.json", timeout=30) as r:
        fits = json.load(r)["fits"]
    assert fits and fits[-1]["estimator"] == "Lasso"
    with urllib.request.urlopen(f"{base}/dmp", timeout=30) as r:
        assert r.status == 200
    # the TLS comm port is no HTTP server: nothing of dmp's is served there
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{scheduler_port}/dmp/api/metrics.json",
                               timeout=5)
