"""A TLS-secured cluster: every model on ``LocalCluster(security=True)`` (ring messages
included) gives the in-process result, the monitor opens no port of its own, and ``dmp run
--scheduler tls://...`` / ``dmp monitor tls://...`` take their certificates from Dask's
configuration (environment variables, a config YAML) or from ``--tls-*`` options."""

import json
import logging
import os
import signal
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


def test_connect_takes_security_and_refuses_a_tls_address_without(tls):
    from dmp.engine.backends.dask import cluster_workers, connect

    _, cluster, _ = tls
    with pytest.raises(ValueError, match="uses TLS but no client certificate is set"):
        connect(cluster.scheduler_address, set_as_default=False)
    with connect(cluster.scheduler_address, security=cluster.security,
                 set_as_default=False) as client:
        assert len(cluster_workers(client)) == 2

def test_lasso(tls):
    from dmp.linear_model import Lasso

    client = tls[0]
    X, y = make_problem(n=80, p=300)
    kw = dict(alpha=0.05 * alpha_max(X, y), tol=1e-8, random_state=3, n_workers=2)
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
    assert remote.iteration_history_["bytes_ring"][0] > 0
    np.testing.assert_array_equal(remote.iteration_history_["bytes_ring"],
                                  local.iteration_history_["bytes_ring"])


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


def test_the_embedded_cluster_of_dmp_run_listens_on_loopback_only():
    """``dmp run``'s own cluster (and so its dashboard, ``/dmp`` and ``/metrics``) is not
    reachable from other machines: it bound its dashboard to every interface."""
    from dmp.pipeline import _start_cluster

    ours = _listening(os.getpid())
    client, cluster = _start_cluster({}, None, 1)
    try:
        listening = _cluster_listening(client)
        listening[os.getpid()] -= ours      # the module's TLS cluster lives here too
        dashboard = cluster.scheduler.http_server.port
        assert ("127.0.0.1", dashboard) in listening[os.getpid()]
        assert {host for pairs in listening.values() for host, _ in pairs} == {"127.0.0.1"}
    finally:
        client.close()
        cluster.close()


# --- the command line against a TLS scheduler started from the command line -------------

RECIPE = """\
name: tls_lasso_tiny
generator: make_sparse_lasso
params: {n: 200, p: 1000, density: 0.02, seed: 0}
n_shards: 4
"""
PIPELINE = """\
name: tls_lasso
dataset: tiny.yaml
estimator:
  class: Lasso
  params: {alpha_ratio: 0.1, tol: 1.0e-6, max_iter: 500, random_state: 0}
"""


def _write_credentials(folder: Path, name: str) -> dict:
    """A self-signed certificate and its key as PEM files (the certificate is its own CA)."""
    from distributed.security import Security

    sec = Security.temporary()
    files = {"ca": folder / f"{name}-ca.pem", "cert": folder / f"{name}-cert.pem",
             "key": folder / f"{name}-key.pem"}
    files["ca"].write_text(sec.tls_ca_file)
    files["cert"].write_text(sec.tls_client_cert)
    files["key"].write_text(sec.tls_client_key)
    return {k: str(v) for k, v in files.items()}


def _tls_flags(creds) -> list:
    return ["--tls-ca-file", creds["ca"], "--tls-cert", creds["cert"], "--tls-key", creds["key"]]


def _tls_env(creds) -> dict:
    return {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": creds["ca"],
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": creds["cert"],
            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": creds["key"]}


@pytest.fixture(scope="module")
def tls_cli(tmp_path_factory):
    """``dask scheduler --protocol tls`` and two ``dask worker`` processes with certificate
    files, all on 127.0.0.1 with ports the system picks; a tiny Lasso pipeline beside."""
    tmp = tmp_path_factory.mktemp("tls-cli")
    creds = _write_credentials(tmp, "cluster")
    (tmp / "tiny.yaml").write_text(RECIPE)
    (tmp / "pipeline.yaml").write_text(PIPELINE)
    info = tmp / "scheduler.json"
    procs = [subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--protocol", "tls", "--host", "127.0.0.1",
         "--port", "0", "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(info),
         "--preload", "dmp.monitor.preload", *_tls_flags(creds)],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "scheduler.log", "w"))]
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        for name in ("w0", "w1"):
            procs.append(subprocess.Popen(
                [str(BIN / "dask"), "worker", "--scheduler-file", str(info), "--name", name,
                 "--nthreads", "1", "--no-nanny", "--memory-limit", "2GiB",
                 "--dashboard-address", "127.0.0.1:0", *_tls_flags(creds)],
                stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "w")))
        meta = json.loads(info.read_text())
        from distributed import Client
        from distributed.security import Security

        sec = Security(tls_ca_file=creds["ca"], tls_client_cert=creds["cert"],
                       tls_client_key=creds["key"], require_encryption=True)
        with Client(meta["address"], security=sec, timeout="30s",
                    set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            workers = client.scheduler_info()["workers"]
        yield {"address": meta["address"], "http": meta["services"]["dashboard"],
               "creds": creds, "tmp": tmp, "workers": sorted(workers)}
    finally:
        # workers first: a worker whose scheduler is gone spends its shutdown looking for it
        for group in (procs[1:], procs[:1]):
            for p in group:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in group:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def _reference_lasso(folder: Path, alpha: float):
    from dmp.io import build_dataset
    from dmp.linear_model import Lasso

    return Lasso(alpha=alpha, tol=1e-6, max_iter=500, random_state=0, backend="local",
                 n_workers=2).fit(build_dataset(str(folder / "tiny.yaml")))


def _dmp(args, env=None):
    return subprocess.run([str(BIN / "dmp"), *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **(env or {})})


def test_dmp_run_with_dask_tls_environment_variables(tls_cli):
    import zarr

    assert tls_cli["address"].startswith("tls://")
    assert all(a.startswith("tls://") for a in tls_cli["workers"]), tls_cli["workers"]
    tmp, out = tls_cli["tmp"], tls_cli["tmp"] / "env-run"
    proc = _dmp(["run", str(tmp / "pipeline.yaml"), "--scheduler", tls_cli["address"],
                 "--output", str(out), "--no-progress"], env=_tls_env(tls_cli["creds"]))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    got = metrics["runs"]["Lasso"]
    ref = _reference_lasso(tmp, metrics["params"]["alpha"])
    assert metrics["n_workers"] == 2 and got["rounds"] == ref.n_iter_
    coef = zarr.open_group(str(out / "coef.zarr"), mode="r")["coef"][:]
    np.testing.assert_allclose(coef, ref.coef_, rtol=0, atol=1e-12)
    # the monitor saw it, on the dashboard's (plain HTTP) port
    with urllib.request.urlopen(f"http://127.0.0.1:{tls_cli['http']}/dmp/api/metrics.json",
                                timeout=30) as r:
        assert any(f["estimator"] == "Lasso" for f in json.load(r)["fits"])


def test_dmp_monitor_with_a_dask_config_yaml(tls_cli, tmp_path):
    creds = tls_cli["creds"]
    (tmp_path / "tls.yaml").write_text(
        "distributed:\n  comm:\n    tls:\n"
        f"      ca-file: {creds['ca']}\n"
        f"      client:\n        cert: {creds['cert']}\n        key: {creds['key']}\n")
    proc = _dmp(["monitor", tls_cli["address"], "--timeout", "1"],
                env={"DASK_CONFIG": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"following dmp fits on {tls_cli['address']}" in proc.stdout


def test_dmp_run_and_monitor_with_tls_options(tls_cli, capsys):
    """``--tls-ca-file/--tls-cert/--tls-key`` (in process: ``dmp.cli.main``)."""
    from dmp.cli import main

    tmp, out = tls_cli["tmp"], tls_cli["tmp"] / "options-run"
    flags = _tls_flags(tls_cli["creds"])
    assert main(["run", str(tmp / "pipeline.yaml"), "--scheduler", tls_cli["address"],
                 "--output", str(out), "--no-progress", *flags]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    ref = _reference_lasso(tmp, metrics["params"]["alpha"])
    assert metrics["runs"]["Lasso"]["rounds"] == ref.n_iter_
    assert abs(metrics["runs"]["Lasso"]["objective"] - ref.objective_) \
        <= 1e-12 * ref.objective_
    assert main(["monitor", tls_cli["address"], "--timeout", "1", *flags]) == 0
    printed = capsys.readouterr().out
    assert f"following dmp fits on {tls_cli['address']}" in printed
    # the options are Dask settings for the command only
    import dask

    assert dask.config.get("distributed.comm.tls.client.cert", None) is None


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("dmp: error: "), err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_a_tls_scheduler_without_tls_settings_is_one_line_error(tls_cli, capsys):
    from dmp.cli import main

    pipeline = str(tls_cli["tmp"] / "pipeline.yaml")
    out = tls_cli["tmp"] / "never"
    t0 = time.perf_counter()
    assert main(["run", pipeline, "--scheduler", tls_cli["address"], "--output", str(out),
                 "--no-progress"]) == 2
    err = _one_line_error(capsys)
    assert "uses TLS but no client certificate is set" in err
    for name in ("--tls-ca-file", "DASK_DISTRIBUTED__COMM__TLS__CA_FILE",
                 "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT", "distributed.comm.tls.ca-file"):
        assert name in err
    assert main(["monitor", tls_cli["address"], "--timeout", "1"]) == 2
    assert "uses TLS but no client certificate is set" in _one_line_error(capsys)
    assert time.perf_counter() - t0 < 5 and not out.exists()


def test_tls_settings_that_cannot_work_are_one_line_errors(tls_cli, capsys, tmp_path):
    from dmp.cli import main

    pipeline, address = str(tls_cli["tmp"] / "pipeline.yaml"), tls_cli["address"]
    creds = tls_cli["creds"]
    out = tmp_path / "never"
    base = ["run", pipeline, "--output", str(out), "--no-progress"]
    # a certificate file that is not there
    missing = {**creds, "cert": str(tmp_path / "nope.pem")}
    assert main([*base, "--scheduler", address, *_tls_flags(missing)]) == 2
    err = _one_line_error(capsys)
    assert "nope.pem" in err and "does not exist" in err
    # TLS options for an address that is no TLS one, or for the embedded cluster
    assert main([*base, "--scheduler", address.replace("tls://", "tcp://"),
                 *_tls_flags(creds)]) == 2
    assert "not a TLS one: use tls://host:port" in _one_line_error(capsys)
    assert main([*base, "--workers", "1", "--tls-cert", creds["cert"]]) == 2
    assert "--tls-cert: only for --scheduler tls://" in _one_line_error(capsys)
    # the TLS scheduler's address given as tcp://: the error says which address to use
    assert main(["monitor", address.replace("tls://", "tcp://"), "--timeout", "1"]) == 2
    assert f"its address is {address}" in _one_line_error(capsys)
    # a key that is not the certificate's
    other = _write_credentials(tmp_path, "other")
    assert main([*base, "--scheduler", address, *_tls_flags({**creds, "key": other["key"]})]) \
        == 2
    assert "cannot be loaded" in _one_line_error(capsys)
    # credentials the scheduler does not trust: refused by the TLS handshake
    t0 = time.perf_counter()
    assert main([*base, "--scheduler", address, *_tls_flags(other)]) == 2
    err = _one_line_error(capsys)
    assert f"cannot reach the Dask scheduler at {address!r}" in err
    assert time.perf_counter() - t0 < 30 and not out.exists()


def test_backend_client_is_used_while_another_cluster_s_client_is_the_default(tls, tls_cli):
    """``backend=client`` fits on that client's cluster even when the default client is one
    of another cluster (with other credentials): the actor proxies were bound to the
    default client."""
    from distributed import Client
    from distributed.security import Security

    from dmp.linear_model import Lasso

    client, cluster, _ = tls
    creds = tls_cli["creds"]
    sec = Security(tls_ca_file=creds["ca"], tls_client_cert=creds["cert"],
                   tls_client_key=creds["key"], require_encryption=True)
    X, y = make_problem(n=60, p=200, seed=5)
    kw = dict(alpha=0.05 * alpha_max(X, y), tol=1e-8, random_state=0, n_workers=2)
    local = Lasso(backend="local", **kw).fit(X, y)
    with Client(tls_cli["address"], security=sec, timeout="30s") as default:
        assert Client.current() is default
        remote = Lasso(backend=client, **kw).fit(X, y)
    np.testing.assert_allclose(remote.coef_, local.coef_, rtol=0, atol=1e-13)
