"""Cells of the fault matrix (RELIABILITY.md) whose mechanism is shared by every model, run
for each model: a corrupt and an incomplete latest checkpoint fall back to the checkpoint
before; a second fit on a checkpoint location being written is refused; a worker SIGKILLed
while the partitions load, or during the recovery from a first loss, is recovered to the
undisturbed result.  ``FITS`` holds one tiny fit of each model (used by the other fault
tests too: test_stalls.py, test_memory_limits.py, test_end_of_fit.py)."""

import logging
import os
import shutil
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import zarr
from sklearn.exceptions import ConvergenceWarning

from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
from dmp.engine.checkpoint import CheckpointStore
from dmp.exceptions import CheckpointLockedError, CheckpointWarning
from dmp.hashing import BinaryAutoencoder
from dmp.linear_model import Lasso, SparsifiedSGDRegressor

from conftest import alpha_max, make_corpus, make_problem, make_ratings
from test_checkpoint_faults import MODELS

MODELS = {**MODELS, "mf-ccd": (
    lambda **kw: MatrixFactorization(n_components=4, max_iter=6, tol=0, method="ccd",
                                     block_size=2, random_state=0, **kw),
    MODELS["mf"][1], MODELS["mf"][2], lambda e: np.asarray(e.item_factors_), 1)}
NAMES = ["sparsified", "mf", "mf-ccd", "lda"]


@dataclass(frozen=True)
class Fit:
    """One tiny fit of a model: ``make(**kw)`` an estimator, ``args`` its data, ``result``
    what is compared, ``every`` its checkpoint interval (None: it takes no checkpoint)."""

    make: Callable
    args: tuple
    result: Callable
    every: int | None
    rtol: float = 1e-7
    atol: float = 1e-9


def _fits():
    X, y = make_problem(n=120, p=400, density=0.05, seed=2)
    R = make_ratings(300, 120, 6000, rank=4, seed=0)
    C = make_corpus(120, 150, n_topics=4, doc_len=40, seed=4)
    rng = np.random.default_rng(3)
    A = rng.standard_normal((600, 20))
    b = A @ rng.standard_normal(20) + 0.1 * rng.standard_normal(600)
    D = rng.standard_normal((400, 10))
    return {
        # a recovered Lasso is compared at its optimum (RELIABILITY.md)
        "lasso": Fit(lambda **kw: Lasso(alpha=0.05 * alpha_max(X, y), random_state=0,
                                        **{"tol": 1e-8, **kw}), (X, y), lambda e: e.coef_, 5,
                     atol=1e-6),
        "lda": Fit(lambda **kw: LatentDirichletAllocation(4, random_state=0,
                                                          **{"max_iter": 8, **kw}),
                   (C,), lambda e: e.topic_word_counts_.astype(float), 2, 0, 0),
        "mf-ccd": Fit(lambda **kw: MatrixFactorization(
            n_components=4, tol=0, method="ccd", block_size=2, random_state=0,
            **{"max_iter": 5, **kw}), (R,), lambda e: np.asarray(e.item_factors_), 1),
        "mf-ccd++": Fit(lambda **kw: MatrixFactorization(
            n_components=4, tol=0, random_state=0, **{"max_iter": 6, **kw}), (R,),
            lambda e: np.asarray(e.user_factors_), 2),
        "ba": Fit(lambda **kw: BinaryAutoencoder(4, validation_size=50, random_state=0,
                                                 **{"max_iter": 3, **kw}),
                  (D,), lambda e: e.coef_, None),
        "sgd": Fit(lambda **kw: SparsifiedSGDRegressor(tol=None, random_state=0,
                                                       **{"max_iter": 60, **kw}),
                   (A, b), lambda e: e.coef_, 10),
    }


FITS = _fits()


def fit_quietly(fit: Fit, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit.make(**kw).fit(*fit.args)


def assert_same_result(fit: Fit, est, reference):
    np.testing.assert_allclose(fit.result(est), fit.result(reference), rtol=fit.rtol,
                               atol=fit.atol)


def checkpoint_kw(fit: Fit, tmp_path) -> dict:
    return {} if fit.every is None else dict(checkpoint=str(tmp_path / "ck.zarr"),
                                             checkpoint_every=fit.every)


def _two_checkpoints(tmp_path, name):
    """The uninterrupted fit, and a checkpoint location holding two complete rounds of the
    same fit stopped halfway."""
    make, args, _, result, every = MODELS[name]
    every = 1 if name == "lda" else every   # its few rounds: two checkpoints before the stop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        full = make(backend="local", n_workers=2, checkpoint_every=every).fit(*args)
        n_rounds = len(full.history_["round"])
        ckpt = str(tmp_path / "ck.zarr")
        stop = max(n_rounds // 2, 2 * every + 1)
        make(backend="local", n_workers=2, checkpoint=ckpt, checkpoint_every=every,
             callback=lambda round, metrics: round >= stop).fit(*args)
    rounds = sorted(n for n in os.listdir(ckpt) if n.startswith("round_"))
    assert len(rounds) >= 2, rounds
    assert CheckpointStore(ckpt).latest() == int(rounds[-1][len("round_"):])
    return make, args, result, every, full, ckpt, rounds


def _resume(make, args, every, ckpt):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = make(backend="local", n_workers=2, checkpoint=ckpt, checkpoint_every=every,
                   resume=True).fit(*args)
    return est, [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]


def _partition_arrays(ckpt, round_name):
    group = zarr.open_group(f"{ckpt}/{round_name}/partitions/p0000", mode="r+")
    return group, sorted(group.array_keys())


@pytest.mark.parametrize("name", NAMES)
def test_a_corrupt_latest_checkpoint_falls_back_to_the_round_before(tmp_path, name):
    make, args, result, every, full, ckpt, rounds = _two_checkpoints(tmp_path, name)
    group, keys = _partition_arrays(ckpt, rounds[-1])
    arr = next(group[k] for k in keys if group[k].size > 0)
    first = arr[(0,) * arr.ndim]
    # NaN in a float array; an integer array (LDA's counts) gets a changed value
    arr[(0,) * arr.ndim] = np.nan if arr.dtype.kind == "f" else first + 1
    resumed, msgs = _resume(make, args, every, ckpt)
    latest, before = (int(r[len("round_"):]) for r in (rounds[-1], rounds[-2]))
    assert len(msgs) == 1 and f"round {before}" in msgs[0] and f"round {latest}" in msgs[0], \
        msgs
    assert "p0000" in msgs[0]
    np.testing.assert_allclose(result(resumed), result(full), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_a_latest_checkpoint_missing_a_piece_falls_back_to_the_round_before(tmp_path, name):
    make, args, result, every, full, ckpt, rounds = _two_checkpoints(tmp_path, name)
    shutil.rmtree(f"{ckpt}/{rounds[-1]}/partitions/p0001")
    resumed, msgs = _resume(make, args, every, ckpt)
    before = int(rounds[-2][len("round_"):])
    assert len(msgs) == 1 and f"resumed from the checkpoint of round {before}" in msgs[0], msgs
    assert "p0001" in msgs[0] and "missing" in msgs[0]
    np.testing.assert_allclose(result(resumed), result(full), rtol=1e-7, atol=1e-9)


# ------------------------------------------------------- two fits on one checkpoint location
@pytest.mark.parametrize("name", ["lasso", "lda", "mf-ccd", "mf-ccd++", "sgd"])
def test_a_second_fit_on_a_location_being_written_is_refused(tmp_path, name):
    """While a fit writes a checkpoint location (held in its callback after its first
    checkpoint), a second fit of the same model there -- to resume it or to start over -- is
    refused with `CheckpointLockedError`; the first fit then finishes, its checkpoints its
    own.  (The Lasso's version with the lock's other cases: test_checkpoint_faults.py.)"""
    fit = FITS[name]
    kw = dict(backend="local", n_workers=2, **checkpoint_kw(fit, tmp_path))
    ckpt = kw["checkpoint"]
    started, release = threading.Event(), threading.Event()

    def hold(round, metrics):
        if CheckpointStore(ckpt).latest() is not None:
            started.set()
            release.wait(60)
        return False

    out, errors = [], []

    def first():
        try:
            out.append(fit_quietly(fit, callback=hold, **kw))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert started.wait(60), errors
        for resume in (True, False):
            with pytest.raises(CheckpointLockedError, match="being written by another fit"):
                fit_quietly(fit, resume=resume, **kw)
    finally:
        release.set()
        t.join(60)
    assert not errors and len(out) == 1
    assert not os.path.exists(f"{ckpt}/lock")
    reference = fit_quietly(fit, backend="local", n_workers=2)
    assert_same_result(fit, out[0], reference)


# ---------------------------------------------------------- worker SIGKILLed, shared cluster
def _address_of(client, name):
    return next(a for a, w in client.scheduler_info()["workers"].items()
                if str(w["name"]) == str(name))


def _wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.05)


def _queued_behind(client, address) -> int:
    """Tasks the scheduler has sent to ``address`` that have not finished."""
    return client.run_on_scheduler(
        lambda dask_scheduler, a=address: len(dask_scheduler.workers[a].processing)
        if a in dask_scheduler.workers else -1)


LOADING = ["lasso", "lda", "mf-ccd", "mf-ccd++", "ba", "sgd"]


@pytest.mark.dask
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", LOADING)
def test_a_worker_killed_while_the_partitions_load_is_recovered(dask_client, name):
    """Worker 1 is busy with another task when the fit starts, so the partition placed there
    waits to load behind it; the worker is SIGKILLed with the partition task queued on it
    (seen on the scheduler, not guessed by a timer).  The fit takes it as a loss in round 0
    and ends with the undisturbed result.  (SGD's version with a timer on three workers:
    test_worker_loss.py.)"""
    client = dask_client
    fit = FITS[name]
    reference = fit_quietly(fit, backend="local", n_workers=2)
    victim = _address_of(client, 1)
    pid = client.run(os.getpid, workers=[victim])[victim]
    blocker = client.submit(time.sleep, 60, workers=[victim], pure=False)
    _wait_until(lambda: _queued_behind(client, victim) >= 1, 30, "the blocker never started")
    fired = []

    def kill_once_queued():
        try:
            _wait_until(lambda: _queued_behind(client, victim) >= 2, 60,
                        "no partition task was queued on worker 1")
            os.kill(pid, signal.SIGKILL)
            fired.append(time.monotonic())
        except AssertionError:  # reported by the assertion on ``fired`` below
            pass

    killer = threading.Thread(target=kill_once_queued, daemon=True)
    killer.start()
    est = fit_quietly(fit, backend=client, n_workers=2)
    killer.join(60)
    del blocker
    assert fired, "worker 1 was not killed while a partition waited to load on it"
    assert len(est.recoveries_) == 1 and est.recoveries_[0]["round"] == 0, est.recoveries_
    assert_same_result(fit, est, reference)


RECOVERY = ["lasso", "mf-ccd", "ba", "sgd"]


@pytest.mark.dask
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", RECOVERY)
def test_a_worker_killed_during_the_recovery_is_recovered(dask_client, tmp_path, name):
    """Worker 1 SIGKILLed mid-fit, then worker 0 SIGKILLed 0.1 s after the fit logs the loss
    (while it waits for the replacement and re-creates the partitions): the recovery starts
    over, or a second one follows, and the fit ends with the undisturbed result.  (LDA's and
    CCD++'s version on three workers: test_soak.py.)"""
    client = dask_client
    fit = FITS[name]
    long = {"ba": 4, "lda": 12, "mf-ccd": 8, "sgd": 120}.get(name)
    extra = {} if long is None else {"max_iter": long}
    reference = fit_quietly(fit, backend="local", n_workers=2, **extra)
    n_rounds = len(reference.round_history_["round"] if name == "ba"
                   else reference.history_["round"])
    at_round = max(2, n_rounds // 3)
    pids = {str(w["name"]): client.run(os.getpid, workers=[a])[a]
            for a, w in client.scheduler_info()["workers"].items()}
    kills = []

    class SecondKill(logging.Handler):
        def emit(self, record):
            if "recovering" in record.getMessage() and len(kills) == 1:
                kills.append("recovery")
                threading.Timer(0.1, os.kill, (pids["0"], signal.SIGKILL)).start()

    def first_kill(round, metrics):
        if round >= at_round and not kills:
            kills.append(round)
            os.kill(pids["1"], signal.SIGKILL)
        return False

    handler = SecondKill()
    logger = logging.getLogger("dmp")
    logger.addHandler(handler)
    try:
        est = fit_quietly(fit, backend=client, n_workers=2, callback=first_kill,
                          **extra, **checkpoint_kw(fit, tmp_path))
    finally:
        logger.removeHandler(handler)
    assert kills == [kills[0], "recovery"], kills
    client.wait_for_workers(2, timeout=60)
    assert not set(pids.values()) & set(client.run(os.getpid).values()), \
        "both workers were to be killed"
    assert len(est.recoveries_) >= 1, est.recoveries_
    assert_same_result(fit, est, reference)
