"""Zarr checkpoints: incomplete checkpoints, guards.  (That an interrupted fit resumes to the
uninterrupted result is a contract of every estimator: tests/test_conformance.py.)"""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from dmp.engine.checkpoint import CheckpointStore
from dmp.linear_model import Lasso

from conftest import alpha_max, make_problem


def test_existing_checkpoint_needs_resume(tmp_path):
    X, y = make_problem(seed=3)
    ckpt = str(tmp_path / "c.zarr")
    kw = dict(alpha=0.05 * alpha_max(X, y), random_state=0, backend="local", checkpoint=ckpt,
              checkpoint_every=2, schedule="round_robin", schedule_size=50, tol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        Lasso(max_iter=10, **kw).fit(X, y)
        with pytest.raises(FileExistsError, match="already holds a checkpoint"):
            Lasso(max_iter=10, **kw).fit(X, y)
        # a different fit must not silently continue someone else's checkpoint
        with pytest.raises(ValueError, match="different fit"):
            Lasso(max_iter=10, resume=True, **{**kw, "alpha": kw["alpha"] * 2}).fit(X, y)
        # nor follow another chain of rounds with other staleness
        with pytest.raises(ValueError, match=r"different fit \(differs in: staleness\)"):
            Lasso(max_iter=10, resume=True, staleness=1, **kw).fit(X, y)


def test_incomplete_checkpoint_is_never_latest(tmp_path):
    X, y = make_problem(seed=4)
    ckpt = str(tmp_path / "c.zarr")
    kw = dict(alpha=0.05 * alpha_max(X, y), random_state=0, backend="local", checkpoint=ckpt,
              checkpoint_every=4, schedule="round_robin", schedule_size=50, tol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        Lasso(max_iter=10, **kw).fit(X, y)
    store = CheckpointStore(ckpt)
    assert store.latest() == 8
    # a crash in the middle of writing round 12: group created, partitions half written
    store.begin(12, store.fingerprint())
    assert store.latest() == 8
    resumed = Lasso(max_iter=100000, resume=True, **{**kw, "checkpoint_every": 1000}).fit(X, y)
    ref = Lasso(max_iter=100000, **{**kw, "checkpoint": None}).fit(X, y)
    assert abs(resumed.objective_ - ref.objective_) <= 1e-9 * ref.objective_


def test_resume_without_checkpoint_location_is_an_error():
    X, y = make_problem(seed=5)
    with pytest.raises(ValueError, match="needs a checkpoint location"):
        Lasso(resume=True, backend="local").fit(X, y)


class _LosesOneWorkerOnce:
    """An in-process backend whose gather of round ``at`` reports a worker loss once."""

    def __init__(self, n_workers, at):
        from dmp.engine.backends.local import LocalBackend

        self._inner, self.at, self.lost = LocalBackend(n_workers), at, False

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self, round, updates, plans):
        return round, self._inner.step(round, updates, plans)

    def gather(self, handle):
        from dmp.engine.backends.base import WorkerLostError

        round, results = handle
        if round == self.at and not self.lost:
            self.lost = True
            raise WorkerLostError("simulated loss")
        return results


def test_a_stop_survives_a_worker_loss_while_rounds_are_in_flight(tmp_path):
    """The callback stops the fit at round 25; round 26 is already in flight (staleness 1)
    when a worker is lost, so the fit rolls back to the checkpoint of round 20 and replays.
    A callback that says stop only once must still end the replay at round 25."""
    X, y = make_problem(n=200, p=1500, density=0.03, seed=2)
    said = []

    def stop_once_at_25(round, metrics):
        if round == 25 and not said:
            said.append(round)
            return True
        return False

    backend = _LosesOneWorkerOnce(2, at=26)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = Lasso(alpha=0.02 * alpha_max(X, y), tol=1e-12, random_state=0, backend=backend,
                    schedule="round_robin", schedule_size=100, staleness=1,
                    checkpoint=str(tmp_path / "c.zarr"), checkpoint_every=10,
                    callback=stop_once_at_25).fit(X, y)
    assert backend.lost and len(est.recoveries_) == 1
    assert est.recoveries_[0]["resumed_round"] == 20
    assert said == [25] and est.n_iter_ == 27   # round 26 was in flight when it stopped


def test_clearing_a_location_that_is_not_a_checkpoint_store_is_refused(tmp_path, foreign):
    """``clear`` deletes a checkpoint store, never a folder or file of something else."""
    for path in foreign.paths:
        with pytest.raises(FileExistsError, match="not a dmp checkpoint store"):
            CheckpointStore(path).clear()
    assert foreign.untouched()
    store = CheckpointStore(tmp_path / "fit.zarr")
    store.clear()                      # nothing there: nothing to do
    store.begin(3, {"fit": 1})
    store.commit(3, {"x": np.zeros(2)})
    assert store.is_checkpoint_store() and store.latest() == 3
    store.clear()
    assert not (tmp_path / "fit.zarr").exists()


def test_a_fit_the_callback_stopped_does_not_warn_of_max_iter():
    """Stopping on request is not a failure to converge; running out of rounds is."""
    from dmp.linear_model import SparsifiedSGDRegressor

    X, y = make_problem(n=200, p=1500, density=0.03, seed=2)
    kw = dict(alpha=1e-3, tol=1e-12, random_state=0, backend="local")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = Lasso(callback=lambda r, m: r >= 2, **kw).fit(X, y)
        sgd = SparsifiedSGDRegressor(backend="local", random_state=0,
                                     callback=lambda r, m: r >= 3).fit(X, y)
    assert est.n_iter_ == 3 and sgd.n_iter_ == 3
    with pytest.warns(ConvergenceWarning, match="did not converge in 3 rounds"):
        Lasso(max_iter=3, **kw).fit(X, y)
