"""A model whose partitions do not fit the workers' memory limits fails before any partition
is created, saying how many workers or how much memory it needs; the per-partition estimates
behind the check are close to what the partitions really hold."""

import logging

import numpy as np
import pytest
import scipy.sparse as sp

from conftest import make_problem
from dmp.decomposition import MatrixFactorization
from dmp.engine.backends.base import InsufficientMemoryError
from dmp.engine.backends.dask import check_partition_memory, collect_transient_bytes
from dmp.engine.backends.local import LocalBackend
from dmp.engine.comm import payload_nbytes
from dmp.io import write_sparse
from dmp.linear_model import Lasso, SparsifiedSGDRegressor


class SpyBackend(LocalBackend):
    """Keeps the program, the specs and the partitions' initial state."""

    def start(self, program, specs):
        super().start(program, specs)
        self.seen = (program, specs, [w.state for w in self.workers])


def _ratings(n_users=3000, n_items=800, nnz=60_000, seed=0):
    rng = np.random.default_rng(seed)
    flat = rng.choice(n_users * n_items, nnz, replace=False)
    return sp.coo_matrix((rng.uniform(1, 5, nnz), (flat // n_items, flat % n_items)),
                         shape=(n_users, n_items))


def _fits(tmp_path):
    X, y = make_problem(n=400, p=3000, density=0.05, seed=1)
    lasso_ds = write_sparse(tmp_path / "lasso.zarr", X, y, n_shards=6)
    from dmp.io import write_sparse_rows

    rows_ds = write_sparse_rows(tmp_path / "rows.zarr", X, y, n_shards=6)
    R = _ratings()
    return [
        ("lasso", lambda b: Lasso(alpha=0.01, max_iter=3, tol=0, backend=b), (lasso_ds,)),
        ("mf-ccd++", lambda b: MatrixFactorization(n_components=12, max_iter=1, tol=0,
                                                    backend=b), (R,)),
        ("mf-ccd", lambda b: MatrixFactorization(n_components=12, max_iter=1, method="ccd",
                                                  block_size=4, tol=0, backend=b), (R,)),
        ("isega", lambda b: SparsifiedSGDRegressor(max_iter=3, tol=None, backend=b),
         (rows_ds,)),
        ("isaga", lambda b: SparsifiedSGDRegressor(method="isaga", max_iter=3, tol=None,
                                                   backend=b), (rows_ds,)),
    ]


def test_partition_estimates_match_what_partitions_hold(tmp_path):
    import warnings

    for name, make, args in _fits(tmp_path):
        backend = SpyBackend(3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make(backend).fit(*args)
        program, specs, states = backend.seen
        for spec, state in zip(specs, states):
            est, actual = program.partition_nbytes(spec), payload_nbytes(state)
            assert est is not None, name
            assert 0.8 * actual <= est <= 1.5 * actual + 4096, (name, est, actual)


def test_check_names_workers_and_memory_needed():
    class Prog:
        def partition_nbytes(self, spec):
            return spec

    mib = 2**20
    specs = [300 * mib] * 4
    # fits: 2 partitions of 300 MiB on workers of 1 GiB (usable 0.8 GiB - 300 MiB = 519 MiB)
    check_partition_memory(Prog(), specs[:2], ["a", "b"], {"a": 2**30, "b": 2**30})
    check_partition_memory(Prog(), specs, ["a", "b"] * 2, {"a": 0, "b": 0})   # no limits
    with pytest.raises(InsufficientMemoryError) as err:
        check_partition_memory(Prog(), specs, ["a", "b", "a", "b"], {"a": 2**30, "b": 2**30})
    msg = str(err.value)
    # 2 x 300 MiB, plus the piece of each being collected at the end of the fit (2 x 8 MiB)
    assert collect_transient_bytes() == 8 * mib
    assert "worker 'a' need about 616 MiB" in msg and "memory limit is 1.00 GiB" in msg
    assert "use at least 3 workers" in msg and "at least 1.12 GiB each" in msg

    class Unknown:
        def partition_nbytes(self, spec):
            return None

    check_partition_memory(Unknown(), specs, ["a"] * 4, {"a": 1})   # unknown: no check


def _sparse(n, p, nnz, format, seed=0):
    """A random sparse matrix with about ``nnz`` stored values (`scipy.sparse.random` draws
    its positions among all n * p cells: minutes for the wide shapes here)."""
    rng = np.random.default_rng(seed)
    M = sp.coo_matrix((rng.uniform(0.1, 1.0, nnz),
                       (rng.integers(0, n, nnz), rng.integers(0, p, nnz))), shape=(n, p))
    return M.asformat(format)


def _too_big(name):
    """A model of kind ``name`` whose partitions need more than 400 MiB workers allow (each
    with tiny data: the model's own arrays are what is large)."""
    from dmp.decomposition import LatentDirichletAllocation
    from dmp.hashing import BinaryAutoencoder

    rng = np.random.default_rng(0)
    if name in ("mf-ccd++", "mf-ccd"):   # factors: 40,000 users x 300 components
        return (MatrixFactorization(n_components=300, max_iter=1, method=name[3:]),
                (_ratings(n_users=40_000, n_items=2_000, nnz=50_000),))
    if name == "lasso":                  # residual and row links of 1.2M samples
        n = 1_200_000
        X = _sparse(n, 10, 1200, "csc")
        return Lasso(alpha=0.01, max_iter=1), (X, rng.standard_normal(n))
    if name == "sparsified":             # model-length vectors of 2M coordinates
        A = _sparse(200, 2_000_000, 4000, "csr")
        return SparsifiedSGDRegressor(max_iter=1), (A, rng.standard_normal(200))
    if name == "lda":                    # word-topic blocks: 10,000 words x 2,000 topics
        C = _sparse(100, 10_000, 2000, "csr")
        C.data = np.ceil(C.data * 5)
        return LatentDirichletAllocation(2000, max_iter=1), (C,)
    if name == "ba":                     # the W step's blocks of 65,536 points
        return BinaryAutoencoder(8, max_iter=1), (rng.standard_normal((2000, 64)),)
    raise ValueError(name)


@pytest.fixture(scope="module")
def small_workers():
    """Two worker processes with a memory limit of 400 MiB each."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      memory_limit="400MiB", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        yield client


@pytest.mark.dask
@pytest.mark.parametrize("name", ["mf-ccd++", "mf-ccd", "lasso", "sparsified", "lda", "ba"])
def test_model_too_big_for_the_workers_fails_early(small_workers, name):
    client = small_workers
    est, args = _too_big(name)
    est.set_params(backend=client, n_workers=2)
    with pytest.raises(InsufficientMemoryError, match=r"use at least \d+ workers"):
        est.fit(*args)
    # nothing was created on the workers, and they are all still there
    assert client.run(lambda dask_worker: len(dask_worker.state.actors)) == \
        {w: 0 for w in client.scheduler_info()["workers"]}
    assert len(client.scheduler_info()["workers"]) == 2


def _hog(dask_worker, nbytes):
    """Hold ``nbytes`` of touched memory on the worker (until its process ends)."""
    dask_worker._dmp_test_hog = np.ones(nbytes // 8)
    return dask_worker._dmp_test_hog.nbytes


LIMIT = 500 * 2**20


@pytest.fixture(scope="module")
def limited_cluster():
    """Two worker processes with a memory limit of 500 MiB each, under nannies (which restart
    a worker Dask terminates)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit=LIMIT,
                      host="127.0.0.1", dashboard_address="127.0.0.1:0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        yield client


@pytest.mark.dask
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["lasso", "lda", "mf-ccd", "mf-ccd++", "ba", "sgd"])
def test_worker_pushed_over_its_memory_limit_mid_fit_is_recovered(limited_cluster, tmp_path,
                                                                  name):
    """A worker whose memory passes Dask's terminate threshold (95% of its limit) during a
    fit -- here something else on it allocates past its limit -- is restarted by its nanny;
    the fit takes it as a worker loss, recovers (from its checkpoint, or BA from the driver's
    copy) and ends with the undisturbed result in bounded time, never waiting on it."""
    import os
    import threading
    import time
    import warnings

    from test_fault_matrix import FITS, assert_same_result, checkpoint_kw, fit_quietly

    client = limited_cluster
    client.wait_for_workers(2, timeout=60)
    fit = FITS[name]
    reference = fit_quietly(fit, backend="local", n_workers=2)
    n_rounds = len(reference.round_history_["round"] if name == "ba"
                   else reference.history_["round"])
    at_round = max(1, n_rounds // 3)
    victim = next(a for a, w in client.scheduler_info()["workers"].items()
                  if str(w["name"]) == "1")
    pid = client.run(os.getpid, workers=[victim])[victim]
    fired = []

    def hog(round, metrics):
        if round >= at_round and not fired:
            fired.append(round)

            def allocate():
                try:
                    client.run(_hog, nbytes=LIMIT, workers=[victim])
                except Exception:   # noqa: BLE001 - the worker dies mid-call
                    pass
            threading.Thread(target=allocate, daemon=True).start()
            # the loss happens within the fit: the next round finds the worker gone
            deadline = time.monotonic() + 60
            while victim in client.scheduler_info()["workers"]:
                assert time.monotonic() < deadline, "the worker over its limit stayed"
                time.sleep(0.05)
        return False

    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = fit_quietly(fit, backend=client, n_workers=2, callback=hog,
                          **checkpoint_kw(fit, tmp_path))
    wall = time.monotonic() - t0
    client.wait_for_workers(2, timeout=60)
    assert fired == [fired[0]]
    assert pid not in set(client.run(os.getpid).values()), \
        "the worker over its memory limit was not restarted"
    assert len(est.recoveries_) >= 1, est.recoveries_
    assert wall < 120, f"the recovered fit took {wall:.0f} s"
    assert_same_result(fit, est, reference)


@pytest.mark.parametrize("shape", [(20, 200_000), (20_000, 40)])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_the_smoothness_constant_never_densifies_a_partition(shape, fit_intercept):
    """The largest eigenvalue of a partition's Gram matrix (sparsified SGD's step size,
    computed on the worker) comes from the small Gram matrix built by sparse products: a
    partition of few rows and many features used to be densified whole (20 x 200,000: 32 MB
    for 4,000 stored values), which pushed workers the memory check had accepted past their
    limit."""
    import tracemalloc

    from dmp.linear_model._sparsified_program import max_eigenvalue_gram

    A = sp.random(*shape, density=0.01, random_state=1,
                  format="csr")
    M = A.toarray()
    if fit_intercept:
        M = np.hstack([M, np.ones((shape[0], 1))])
    expected = np.linalg.svd(M, compute_uv=False)[0] ** 2
    tracemalloc.start()
    try:
        got = max_eigenvalue_gram(A, fit_intercept)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == pytest.approx(expected, rel=1e-10)
    assert peak < M.nbytes / 4, f"peak {peak} bytes for a {M.nbytes}-byte dense matrix"


@pytest.mark.dask
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_wide_model_the_check_accepts_fits_within_the_workers_memory(small_workers):
    """Sparsified SGD on 2 x 100 rows of 300,000 features: the memory check accepts it on
    400 MiB workers, and the fit runs there with no worker restarted (before the fix both
    workers passed their limit in round 0 and the fit ended 'no Dask workers left')."""
    import os

    client = small_workers
    rng = np.random.default_rng(0)
    A = _sparse(200, 300_000, 600, "csr")
    y = rng.standard_normal(200)
    pids = client.run(os.getpid)
    est = SparsifiedSGDRegressor(max_iter=3, tol=None, random_state=0, backend=client,
                                 n_workers=2).fit(A, y)
    ref = SparsifiedSGDRegressor(max_iter=3, tol=None, random_state=0, backend="local",
                                 n_workers=2).fit(A, y)
    assert client.run(os.getpid) == pids and est.recoveries_ == []
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-12, atol=1e-15)
