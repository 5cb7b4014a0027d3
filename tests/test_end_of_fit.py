"""The end of a fit is part of the fit: a worker SIGKILLed while the result is collected
(after every round ran) is recovered like one lost in a round -- from the last checkpoint,
or from the start without one -- and the fit ends with the undisturbed result; collecting
streams the result in pieces, so a worker sized near its memory limit is not pushed over it;
a worker's own OSError (a full disk) is that error, never a lost worker."""

import errno
import logging
import os
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
from dmp.engine.backends.dask import DaskBackend, _is_worker_loss
from dmp.hashing import BinaryAutoencoder
from dmp.linear_model import Lasso, SparsifiedSGDRegressor

from test_worker_loss import _corpus, _kill_one, _ratings, _wait_for_workers

pytestmark = [pytest.mark.dask]


class KillWhileCollecting(DaskBackend):
    """A real Dask backend that SIGKILLs worker "1" once, in the middle of collecting the
    result: after the first piece arrived (streamed), or as the workers start writing a
    factors store (``call_all``)."""

    fired: list

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fired = []

    def _kill(self):
        if not self.fired:
            self.fired.append(time.monotonic())
            assert _kill_one(self.client)
            time.sleep(0.3)   # the process is gone before the next call reaches it

    def collect_stream(self, sink, method=None, start=None, piece_bytes=None):
        def killing_sink(*args):
            sink(*args)
            self._kill()

        # small pieces: the kill lands with most of the result still on the workers
        super().collect_stream(killing_sink, method=method, start=start, piece_bytes=4096)

    def call_all(self, method, *args):
        if method in ("save_factors", "factors"):   # ("factors": dmp before streaming)
            self._kill()
        return super().call_all(method, *args)

    def collect_all(self, *args, **kwargs):
        if not hasattr(DaskBackend, "collect_stream"):   # dmp before streaming
            self._kill()
        return super().collect_all(*args, **kwargs)


def _lasso_data():
    rng = np.random.default_rng(3)
    X = sp.random(300, 900, density=0.05, random_state=3, format="csc")
    y = X @ (rng.standard_normal(900) * (rng.random(900) < 0.05)) + 0.01 * rng.standard_normal(300)
    return X, y


def _collecting_cases():
    R = _ratings(n_users=900, n_items=300, nnz=20_000)
    return {
        # a restored Lasso rebuilds its residual (not bit for bit the same iterates): it is
        # compared at its optimum, as in test_dask_backend.py
        "lasso": (lambda **kw: Lasso(alpha=0.002, max_iter=3000, tol=1e-9, random_state=0,
                                     **kw), _lasso_data(), lambda e: e.coef_, 10),
        "lda": (lambda **kw: LatentDirichletAllocation(5, max_iter=6, random_state=0, **kw),
                (_corpus(n_docs=150, n_words=200),), lambda e: e.topic_word_counts_, 3),
        "mf-ccd++": (lambda **kw: MatrixFactorization(n_components=6, max_iter=4, tol=0,
                                                      random_state=0, **kw), (R,),
                     lambda e: np.vstack([e.user_factors_, e.item_factors_]), 2),
        "mf-ccd": (lambda **kw: MatrixFactorization(n_components=6, max_iter=3, tol=0,
                                                    method="ccd", block_size=3,
                                                    random_state=0, **kw), (R,),
                   lambda e: np.vstack([e.user_factors_, e.item_factors_]), 1),
    }


CASES = _collecting_cases()


def _fit(make, args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make(**kw).fit(*args)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("checkpointed", [True, False], ids=["checkpoint", "no-checkpoint"])
@pytest.mark.parametrize("name", list(CASES))
def test_worker_killed_while_the_result_is_collected(cluster3, tmp_path, name, checkpointed):
    if not checkpointed and name != "mf-ccd++":
        pytest.skip("without a checkpoint only MF (whose factors were collected outside "
                    "the fit) is run: the others recover the same way")
    make, args, result, every = CASES[name]
    reference = _fit(make, args, backend="local", n_workers=3, checkpoint_every=every)
    _wait_for_workers(cluster3)
    backend = KillWhileCollecting(cluster3, n_workers=3)
    kw = dict(checkpoint=str(tmp_path / "ck.zarr")) if checkpointed else {}
    est = _fit(make, args, backend=backend, checkpoint_every=every, **kw)
    _wait_for_workers(cluster3)
    assert len(backend.fired) == 1
    assert len(est.recoveries_) == 1, est.recoveries_
    assert est.recoveries_[0]["while"] == "collecting the result"
    if name == "lasso":
        np.testing.assert_allclose(result(est), result(reference), atol=1e-6)
        assert abs(est.objective_ - reference.objective_) <= 1e-8 * reference.objective_
        return
    np.testing.assert_allclose(result(est), result(reference), rtol=1e-7, atol=1e-9)
    np.testing.assert_array_equal(est.history_["round"], reference.history_["round"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_worker_killed_while_writing_the_factors_store(cluster3, tmp_path):
    make, args, result, every = CASES["mf-ccd++"]
    reference = _fit(make, args, backend="local", n_workers=3)
    _wait_for_workers(cluster3)
    backend = KillWhileCollecting(cluster3, n_workers=3)
    store = tmp_path / "factors.zarr"
    est = _fit(make, args, backend=backend, checkpoint=str(tmp_path / "ck.zarr"),
               checkpoint_every=every, factors_store=str(store))
    _wait_for_workers(cluster3)
    assert len(backend.fired) == 1 and len(est.recoveries_) == 1, est.recoveries_
    np.testing.assert_allclose(np.asarray(est.user_factors_), reference.user_factors_,
                               rtol=1e-7, atol=1e-9)
    # the interrupted attempt's temporary store is gone; only the complete one is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.zarr", "factors.zarr"]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["sparsified", "ba"])
def test_driver_side_models_lose_a_worker_after_the_last_round(cluster3, name):
    """SGD's and the autoencoder's result lives on the driver (nothing is collected): a
    worker killed as the last round ends changes nothing."""
    rng = np.random.default_rng(1)
    if name == "sparsified":
        A = rng.standard_normal((3000, 30))
        args = (A, A @ rng.standard_normal(30))
        make = lambda **kw: SparsifiedSGDRegressor(max_iter=60, tol=None,  # noqa: E731
                                                   random_state=0, **kw)
        result = lambda e: e.coef_  # noqa: E731
    else:
        args = (rng.standard_normal((600, 12)),)
        make = lambda **kw: BinaryAutoencoder(n_bits=4, max_iter=2, random_state=0,  # noqa: E731
                                              **kw)
        result = lambda e: e.coef_  # noqa: E731
    reference = _fit(make, args, backend="local", n_workers=3)
    last = int(reference.round_history_["round"][-1] if name == "ba"
               else reference.history_["round"][-1])
    fired = []

    def kill_at_the_end(round, metrics):
        if round == last and not fired:
            fired.append(round)
            _kill_one(cluster3)
        return False

    _wait_for_workers(cluster3)
    est = _fit(make, args, backend=cluster3, n_workers=3, callback=kill_at_the_end)
    _wait_for_workers(cluster3)
    assert fired == [last]
    np.testing.assert_allclose(result(est), result(reference), rtol=1e-7, atol=1e-9)


# ----------------------------------------------------------------------------- memory
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("margin", [1.02])
def test_collecting_does_not_push_a_tight_worker_over_its_limit(margin):
    """Workers given just over what the up-front check asks for: every round fits, and
    collecting the factors (a copy of each partition's W and H at once, before) must not
    take them past the 95% at which Dask restarts them."""
    from distributed import Client, LocalCluster

    from dmp.decomposition._mf_program import MFProgram
    from dmp.engine.backends.dask import check_partition_memory, worker_base_bytes
    from dmp.engine.backends.base import InsufficientMemoryError

    import dask

    # factors dominate: 180 000 users x rank 100 = 137 MiB of W per worker
    n_users, n_items, k = 360_000, 200, 100
    rng = np.random.default_rng(0)
    nnz = 30_000
    flat = rng.choice(n_users * n_items, nnz, replace=False)
    R = sp.coo_matrix((rng.uniform(1, 5, nnz), (flat // n_items, flat % n_items)),
                      shape=(n_users, n_items))
    from dmp.io import write_ratings
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ds = write_ratings(f"{tmp}/r.zarr", R.row, R.col, R.data, shape=R.shape)
        program = MFProgram(ds, n_components=k, alpha=0.05, method="ccd++", n_inner=1,
                            block_size=1, center=True, reg_scaling="none", tol=None, seed=0)
        specs = program.partition_specs(2)
        frac = dask.config.get("distributed.worker.memory.pause")
        need = max(program.partition_nbytes(s) for s in specs)
        # the smallest limit the check lets through, found from the check itself
        lo, hi = need, 8 * (need + worker_base_bytes())
        while hi - lo > 2**20:
            mid = (lo + hi) // 2
            try:
                check_partition_memory(program, specs, ["a", "b"], {"a": mid, "b": mid})
                hi = mid
            except InsufficientMemoryError:
                lo = mid
        assert hi >= (need + worker_base_bytes()) / frac
        limit = int(margin * hi)
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          memory_limit=limit, dashboard_address="127.0.0.1:0",
                          silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
            backend = DaskBackend(client, n_workers=2, replacement_timeout=5.0)
            mf = MatrixFactorization(n_components=k, max_iter=1, tol=None, random_state=0,
                                     backend=backend)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mf.fit(ds)
            assert mf.recoveries_ == [], mf.recoveries_
    assert mf.user_factors_.shape == (n_users, k) and np.isfinite(mf.user_factors_).all()


# ----------------------------------------------------------------------------- full disk
def test_a_workers_oserror_is_not_a_lost_worker():
    from distributed.comm.core import CommClosedError

    assert not _is_worker_loss(OSError(errno.ENOSPC, "No space left on device", "/x"))
    assert not _is_worker_loss(PermissionError(errno.EACCES, "Permission denied", "/x"))
    assert not _is_worker_loss(FileNotFoundError(errno.ENOENT, "No such file", "/x"))
    assert _is_worker_loss(CommClosedError("in <TCP ...>: Stream is closed"))
    assert _is_worker_loss(ConnectionResetError(errno.ECONNRESET, "reset"))
    assert _is_worker_loss(OSError("Timed out trying to connect to tcp://1.2.3.4:5 after 30 s"))
    assert _is_worker_loss(OSError(errno.EHOSTUNREACH, "No route to host"))
    assert _is_worker_loss(TimeoutError())
    assert _is_worker_loss(OSError("Unable to contact Actor's worker"))  # distributed.actor


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (root only); unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                              capture_output=True, text=True)
    except OSError as exc:
        pytest.skip(f"cannot mount a tmpfs: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)``: a tmpfs of ``size`` bytes (root only), mounted at one folder (a second
    call remounts it at the new size); unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = []

    def mount(size):
        opts = f"size={int(size)}" + (",remount" if mounted else "")
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)],
                                  capture_output=True, text=True)
        except OSError as exc:
            pytest.skip(f"cannot mount a tmpfs: {exc}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
        mounted.append(size)
        return mnt

    try:
        yield mount
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _used_bytes(path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["lasso", "lda", "mf-ccd", "mf-ccd++", "sgd"])
def test_a_checkpoint_on_a_full_disk_is_no_space_not_lost_workers(dask_client, tmpfs,
                                                                  tmp_path, name):
    """A disk with room for one checkpoint and a half: the first is written, the second
    fails with ENOSPC on the workers writing their partitions.  The fit raises that error
    (MF CCD++ said "gave up after 5 worker losses"), leaves no half-written round, and the
    first checkpoint resumes to the undisturbed result."""
    from dmp.engine.checkpoint import CheckpointStore

    from test_fault_matrix import FITS, assert_same_result, fit_quietly

    fit = FITS[name]
    kw = dict(backend=dask_client, n_workers=2, checkpoint_every=fit.every)
    reference = fit_quietly(fit, backend="local", n_workers=2)
    assert len(reference.history_["round"]) > 2 * fit.every
    disk = tmpfs(64 * 2**20)
    ckpt = disk / "ck.zarr"
    # what one checkpoint takes on this file system (pages, not bytes: tiny files)
    fit_quietly(fit, checkpoint=str(ckpt), callback=lambda round, metrics: (
        CheckpointStore(ckpt).latest() is not None), **kw)
    one = _used_bytes(disk)
    shutil.rmtree(ckpt)
    tmpfs(one + one // 2)
    with pytest.raises(OSError) as err:
        fit_quietly(fit, checkpoint=str(ckpt), **kw)
    assert err.value.errno == errno.ENOSPC, repr(err.value)
    store = CheckpointStore(ckpt)
    first = store.latest()
    assert first is not None
    # no incomplete round is left behind: every round group there is a complete checkpoint
    assert [n for n in store.round_names()] == [f"round_{r:08d}" for r in
                                                sorted(store.complete_rounds())]
    # the earlier checkpoint is usable: moved to a disk with room, it resumes
    moved = tmp_path / "ck.zarr"
    shutil.copytree(ckpt, moved)
    resumed = fit_quietly(fit, checkpoint=str(moved), resume=True, **kw)
    assert resumed.history_["round"][0] == 0
    assert_same_result(fit, resumed, reference)


@pytest.mark.timeout(120)
def test_dmp_on_a_full_disk_says_so_in_one_line(small_disk, tmp_path, capsys):
    from sklearn.datasets import dump_svmlight_file

    from dmp.cli import main

    X = sp.random(2000, 500, density=0.2, random_state=0, format="csr")
    src = tmp_path / "big.svm"
    dump_svmlight_file(X, np.arange(2000) % 7, str(src))
    dest = small_disk / "ds.zarr"
    assert main(["data", "convert", "svmlight", str(src), str(dest)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "no space left on device" in err and str(small_disk) in err, err
    assert "Traceback" not in err
    assert os.listdir(small_disk) == []   # the partial conversion went with the error


# ----------------------------------------------------------------------------- leftovers
def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _leftovers(path, tail_len):
    """Beside ``path``: partial outputs of a dead dmp process, of a live one, one without
    an owner file, and a user's folder of a similar name."""
    import json
    import socket

    from dmp.utils.scratch import OWNER_FILE

    made = {}
    for what, pid in (("dead", _dead_pid()), ("live", os.getpid()), ("no-owner", None)):
        p = f"{path}.tmp-{os.urandom(tail_len // 2).hex()}"
        os.makedirs(f"{p}/W")
        if pid is not None:
            with open(f"{p}/{OWNER_FILE}", "w") as f:
                json.dump({"host": socket.gethostname(), "pid": pid}, f)
        made[what] = p
    made["user"] = f"{path}.tmp-mine"
    os.makedirs(made["user"])
    return made


def test_stale_partial_conversion_removed_by_the_next_one(tmp_path):
    from dmp.io import write_sparse

    dest = tmp_path / "ds.zarr"
    made = _leftovers(dest, 32)
    X = sp.random(50, 40, density=0.2, random_state=0, format="csc")
    write_sparse(dest, X, np.ones(50))
    assert not os.path.exists(made["dead"])
    assert all(os.path.exists(made[k]) for k in ("live", "no-owner", "user"))
    # the finished dataset carries no owner file
    from dmp.utils.scratch import OWNER_FILE

    assert not (dest / OWNER_FILE).exists()


def test_stale_partial_factors_store_removed_by_the_next_fit(tmp_path):
    store = tmp_path / "factors.zarr"
    made = _leftovers(store, 8)
    R = _ratings(n_users=60, n_items=30, nnz=600)
    mf = MatrixFactorization(n_components=3, max_iter=2, backend="local", n_workers=2,
                             factors_store=str(store), random_state=0).fit(R)
    assert not os.path.exists(made["dead"])
    assert all(os.path.exists(made[k]) for k in ("live", "no-owner", "user"))
    from dmp.utils.scratch import OWNER_FILE

    assert not (store / OWNER_FILE).exists() and mf.user_factors_.shape == (60, 3)


def test_stale_partial_run_output_removed_by_the_next_run(tmp_path):
    """``dmp run``'s output folder is written beside the output as ``<out>.tmp-<hex8>``
    with an owner file (dmp/pipeline.py); the same clean-up removes a dead run's."""
    from dmp.utils.scratch import clean_stale_partials, mark_partial, unmark_partial

    out = tmp_path / "results"
    made = _leftovers(out, 8)
    assert clean_stale_partials(out) == [made["dead"]]
    mine = tmp_path / "results.tmp-0123abcd"
    mine.mkdir()
    mark_partial(mine)
    assert clean_stale_partials(out) == []      # this process is alive
    unmark_partial(mine)
    assert os.listdir(mine) == []
