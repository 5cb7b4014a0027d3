import logging
import os

import numpy as np
import pytest
import scipy.sparse as sp


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Datasets built by recipes go to a per-session cache, not the user's."""
    old = os.environ.get("DMP_CACHE_DIR")
    os.environ["DMP_CACHE_DIR"] = str(tmp_path_factory.mktemp("dmp-cache"))
    yield
    if old is None:
        os.environ.pop("DMP_CACHE_DIR", None)
    else:
        os.environ["DMP_CACHE_DIR"] = old


@pytest.fixture(scope="session", autouse=True)
def _keep_killed_workers_nannies():
    """Tests kill worker processes, sometimes the same name twice within seconds (one test
    after another).  A LocalCluster closes a worker's nanny for good when no worker of that
    name is registered ``distributed.deploy.lost-worker-timeout`` (15 s) after a loss; a
    second loss at that moment made it drop a nanny that was restarting its worker, and the
    later tests ran one worker short (seen in CI).  The check reads the setting when the
    loss happens, so it is set for the whole session."""
    import dask

    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        yield


@pytest.fixture(scope="session", autouse=True)
def _workers_forked_warm(_isolated_cache):
    """The tests' LocalCluster workers, and the nannies' replacements of killed ones, are
    forked from a server process that has imported Dask and dmp and loaded dmp's compiled
    kernels (tests/_worker_preload.py), instead of spawned as fresh interpreters that import
    them all again (seconds of CPU per worker process; distributed's own test suite forks
    its workers so).  The server starts here, after `_isolated_cache`, with this process's
    import path (as spawned workers get it: they unpickle classes of the test modules) and
    the hash seed the nannies give spawned workers; a variable set in ``os.environ`` later
    reaches a worker only through the nanny's ``env``.  Spawned workers are still tested:
    `dmp run` and the command-line clusters in subprocesses, and the emulated clusters
    (tests/test_emulated_cluster.py)."""
    import multiprocessing.forkserver
    import sys

    import dask
    from distributed.utils import get_mp_context

    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        get_mp_context().set_forkserver_preload(["distributed", "_worker_preload"])
        env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)),
               "PYTHONHASHSEED": "6640"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        yield


class ForeignFiles:
    """A folder holding a user's file and a lone file beside it: things dmp must refuse to
    delete or replace."""

    def __init__(self, root):
        self.folder = root / "notes"
        self.folder.mkdir()
        (self.folder / "a.txt").write_text("mine")
        self.file = root / "file.txt"
        self.file.write_text("mine too")
        self.paths = (self.folder, self.file)

    def untouched(self) -> bool:
        return ((self.folder / "a.txt").read_text() == "mine"
                and self.file.read_text() == "mine too")


@pytest.fixture
def foreign(tmp_path):
    return ForeignFiles(tmp_path)


def make_problem(n=150, p=600, density=0.05, seed=0, dense=False):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, random_state=seed, format="csc")
    beta = np.zeros(p)
    beta[rng.choice(p, 15, replace=False)] = rng.standard_normal(15)
    y = X @ beta + 0.01 * rng.standard_normal(n) + 0.5
    return (X.toarray() if dense else X), y


def make_ratings(n_users, n_items, nnz, *, rank=4, seed=0):
    """Low-rank ratings plus noise (COO): rank-``rank`` Gaussian factors, ``nnz`` distinct
    positions."""
    rng = np.random.default_rng(seed)
    flat = rng.choice(n_users * n_items, nnz, replace=False)
    U, V = rng.standard_normal((n_users, rank)), rng.standard_normal((n_items, rank))
    u, i = flat // n_items, flat % n_items
    r = np.einsum("ij,ij->i", U[u], V[i]) + 0.3 * rng.standard_normal(nnz)
    return sp.coo_matrix((r, (u, i)), shape=(n_users, n_items))


def make_corpus(n_docs, n_words, *, n_topics=4, doc_len=40, seed=4):
    """Documents (CSR counts) drawn from ``n_topics`` sparse Dirichlet topics."""
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(n_words, 0.05), n_topics)
    theta = rng.dirichlet(np.full(n_topics, 0.2), n_docs)
    rows = [np.bincount(rng.choice(n_words, doc_len, p=theta[d] @ phi), minlength=n_words)
            for d in range(n_docs)]
    return sp.csr_matrix(np.array(rows, dtype=np.float64))


def alpha_max(X, y, fit_intercept=True):
    yt = y - y.mean() if fit_intercept else y
    return float(np.abs(X.T @ yt).max()) / X.shape[0]


def _local_client(n_workers, log_level):
    """A client of a LocalCluster of single-threaded worker processes."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=log_level) as cluster, \
            Client(cluster) as client:
        yield client


@pytest.fixture(scope="module")
def cluster3():
    """Three single-threaded worker processes (worker-loss tests kill one of them)."""
    yield from _local_client(3, logging.CRITICAL)


@pytest.fixture(scope="session")
def _session_cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def dask_client(_session_cluster):
    """A client, the default one for the module's tests, of two single-threaded worker
    processes that every module asking for them shares (a cluster's start and its workers'
    first imports cost seconds on two cores); no client is left as the default after the
    module, as tests of what happens without one need."""
    from distributed import Client

    with Client(_session_cluster) as client:
        client.wait_for_workers(2, timeout=60)
        yield client


@pytest.fixture(autouse=True)
def _two_workers_back(request):
    """A test sharing `dask_client` finds both workers there: one that an earlier test killed
    has been replaced by its nanny before the next test starts."""
    if "dask_client" in request.fixturenames:
        request.getfixturevalue("dask_client").wait_for_workers(2, timeout=60)
    yield


@pytest.fixture
def dask_settings():
    """``dask_settings({"dmp.batch.max-bytes": 2**20})`` sets Dask settings (dmp's among them)
    for the rest of one test, with `dask.config.set`; undone after it."""
    import contextlib

    import dask

    with contextlib.ExitStack() as stack:
        yield lambda settings: stack.enter_context(dask.config.set(settings))
