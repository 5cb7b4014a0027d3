"""Datasets and checkpoints on an object store (a local S3 server, moto) work as on disk: only
the URL travels, workers read their shards and write their checkpoint partitions themselves
with the credentials of their environment (as Kubernetes pods get them from a Secret)."""

import json
import logging
import os
import socket
import warnings

import numpy as np
import pytest

from conftest import alpha_max, make_problem

moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")
BUCKET = "dmp-test"


@pytest.fixture(scope="module")
def s3():
    """A local S3 endpoint; AWS_* variables are set before any worker process starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(BUCKET)
    try:
        yield fs
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def client(s3):
    from distributed import Client, LocalCluster

    # the moto server's credentials and address, set after the session's first worker
    # started the server that workers are forked from (tests/conftest.py)
    env = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                      "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, env=env,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as c:
        yield c


def test_checkpoint_store_on_s3(s3):
    from dmp.engine.checkpoint import CheckpointStore, read_arrays, write_arrays

    store = CheckpointStore(f"s3://{BUCKET}/unit/ckpt.zarr", keep=1)
    assert not store.exists() and store.latest() is None
    for r in (5, 10):
        store.begin(r, {"estimator": "x"})
        write_arrays(store.partition_path(r, 0), {"w": np.arange(4.0) * r})
        assert store.latest() == (None if r == 5 else 5)   # incomplete until commit
        store.commit(r, {"a": np.ones(3) * r, "step": r})
    assert store.latest() == 10 and store.fingerprint() == {"estimator": "x"}
    assert read_arrays(store.partition_path(10, 0))["w"].tolist() == [0, 10, 20, 30]
    assert store.load_driver(10)["step"] == 10
    assert not s3.exists(f"{BUCKET}/unit/ckpt.zarr/round_00000005")   # pruned (keep=1)
    store.clear()
    assert not store.exists()


@pytest.mark.dask
def test_lasso_from_s3_with_s3_checkpoints_resumes_to_the_same_result(s3, client):
    from dmp.io import open_dataset, write_sparse
    from dmp.linear_model import Lasso

    X, y = make_problem(n=300, p=1200, seed=12)
    url = f"s3://{BUCKET}/lasso.zarr"
    write_sparse(url, X, y, n_shards=4, overwrite=True)
    ds = open_dataset(url)
    kw = dict(alpha=0.05 * alpha_max(X, y), tol=1e-10, random_state=0, n_workers=2)
    reference = Lasso(backend="local", **kw).fit(X, y)
    ckpt = f"s3://{BUCKET}/fits/lasso.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # stopped early on purpose: ConvergenceWarning
        first = Lasso(backend=client, checkpoint=ckpt, checkpoint_every=5, max_iter=12,
                      **kw).fit(ds)
    assert first.n_iter_ == 12
    assert s3.exists(f"{BUCKET}/fits/lasso.zarr/round_00000010/partitions/p0001/zarr.json")
    resumed = Lasso(backend=client, checkpoint=ckpt, checkpoint_every=5, resume=True,
                    **kw).fit(ds)
    assert resumed.history_["round"][0] == 0 and resumed.n_iter_ > 12
    np.testing.assert_allclose(resumed.coef_, reference.coef_, atol=1e-8)
    assert abs(resumed.objective_ - reference.objective_) <= 1e-9 * reference.objective_


@pytest.mark.dask
def test_pipeline_with_dataset_and_checkpoints_on_s3(s3, client, tmp_path):
    from dmp.cli import main
    from dmp.io import write_sparse

    X, y = make_problem(n=200, p=800, seed=13)
    write_sparse(f"s3://{BUCKET}/pipe.zarr", X, y, n_shards=2, overwrite=True)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        "name: s3_pipeline\n"
        f"dataset: s3://{BUCKET}/pipe.zarr\n"
        f"checkpoints: s3://{BUCKET}/pipe-ckpt\n"
        "storage_options: {}\n"
        "estimator: {class: Lasso, params: {alpha_ratio: 0.1, random_state: 0}}\n"
        "checkpoint_every: 5\n")
    out = tmp_path / "out"
    assert main(["run", str(pipeline), "--scheduler", client.scheduler.address,
                 "--output", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dataset"] == f"s3://{BUCKET}/pipe.zarr"
    assert metrics["runs"]["Lasso"]["dual_gap"] >= 0
    assert not s3.exists(f"{BUCKET}/pipe-ckpt")     # removed after the complete run
