"""`DMPEstimator`: the one fitting path every dmp estimator runs.

A fit validates the parameters, refuses a store of the wrong kind, resolves the backend,
prepares the data (a dmp store as given; in-memory data validated, then held in memory for
the local backend or written to a temporary store the workers read), builds the model's
`dmp.engine.Program`, runs it (`dmp.engine.run`, with checkpoints where the model has them),
closes the backend and removes the temporary store, and sets the attributes every model
has (``history_``, ``recoveries_``, ``wall_time_``) before the model's own.  A model supplies
the hooks the path calls (see `DMPEstimator`); its ``fit`` is one call of `DMPEstimator._fit`.
"""

from __future__ import annotations

import numbers
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions, make_constraint
from sklearn.utils.validation import validate_data

from .engine import resolve_backend, run
from .engine.checkpoint import content_digest, dataset_fingerprint, tag_content
from .engine.runner import history_arrays
from .io.sparse import require_store_kind
from .utils.estimator import SharedBackendMixin, seed_from
from .utils.scratch import temporary_store_dir
from .utils.text import plural

__all__ = ["DMPEstimator", "InMemoryData", "seed_from"]


class _DaskClient(HasMethods):
    """The constraint "a ``distributed.Client``", checked without importing distributed (a
    client exists only once distributed is imported)."""

    def __init__(self):
        super().__init__(["submit"])

    def is_satisfied_by(self, val):
        distributed = sys.modules.get("distributed")
        return distributed is not None and isinstance(val, distributed.Client)

    def __str__(self):
        return "an instance of 'distributed.Client'"


@dataclass
class InMemoryData:
    """Validated in-memory data, as a model's `DMPEstimator._prepare_in_memory` returns it.

    Attributes
    ----------
    local : callable
        ``local() -> dataset``: the in-memory dataset the local backend reads.
    write : callable
        ``write(folder) -> dataset``: the data written to a store in ``folder`` (a new
        temporary folder, removed when the fit ends) for the workers of other backends.
    content : tuple, optional
        The arrays `dmp.engine.checkpoint.content_digest` fingerprints, so that a resumed
        fit recognises the same data (None: the model keeps no checkpoints).
    """

    local: Callable | None
    write: Callable
    content: tuple | None = None


def computed(a):
    """A dask collection computed here; anything else unchanged."""
    return a.compute() if hasattr(a, "dask") and hasattr(a, "compute") else a


#: parameter values whose passing `_validate_params` remembers (immutable, hashable)
_SCALARS = frozenset({int, float, bool, str, type(None)})


def _plainly_valid(X, y, kwargs) -> bool:
    """Whether `validate_data` would pass ``X`` and ``y`` through unchanged: a float64 numpy
    matrix and a numeric vector of the same length, all finite.  (Its checks cost a small
    fit more than its own arithmetic; any other input goes through them.)"""
    if not (type(X) is np.ndarray and type(y) is np.ndarray and X.dtype == np.float64
            and X.ndim == 2 and y.ndim == 1 and X.shape[0] == y.shape[0] >= 1
            and X.shape[1] >= 1 and y.dtype.kind in "fiu"):
        return False
    if set(kwargs) - {"accept_sparse", "reset", "y_numeric"}:
        return False
    from sklearn import get_config

    if get_config().get("array_api_dispatch"):
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(X.sum()) and (y.dtype.kind != "f" or np.isfinite(y.sum())))


class DMPEstimator(SharedBackendMixin, BaseEstimator):
    """Base class of dmp's estimators: one fitting path, the model's parts as hooks.

    A model's ``fit`` calls ``self._fit(X, y, **options)``; ``options`` (e.g. ``X_val``,
    ``arrivals``) reach every hook as attributes of ``fit``, a namespace of the call that
    also holds ``X``, ``y``, ``reset`` (False: a ``partial_fit`` continuing the model),
    ``checkpointed`` (the fit writes checkpoints: only then are its data fingerprinted),
    ``backend``, ``n_partitions``, ``dataset`` and ``program`` once they exist (a hook may
    add what a later one needs).  The hooks, in the order they run:

    - ``_check_fit(fit)``: checks that need neither the backend nor the data (default none);
    - ``_is_dataset(X)``: whether ``X`` is a dmp store the workers read as it is;
    - ``_prepare_store(fit) -> dataset`` for a store, ``_prepare_in_memory(fit) ->
      InMemoryData`` for in-memory data (validated as scikit-learn does);
    - ``_make_program(fit) -> Program``;
    - ``_fingerprint(fit) -> dict or None``: what a checkpoint must have been written by
      (the base adds the estimator, the shape, the partitions and the data); None without
      checkpoints;
    - ``_run_options(fit) -> dict``: `dmp.engine.run`'s ``max_iter``, ``staleness``, ...;
    - ``_set_fitted(fit, result)``: the model's fitted attributes from ``fit.program`` and
      the `dmp.engine.RunResult` (the one place a model reads its program's state);
    - ``_convergence_warning(fit, result) -> str or None``: the `ConvergenceWarning` to give.

    A clone keeps a ``backend`` object by reference (`dmp.utils.estimator.SharedBackendMixin`).
    Class attributes: ``_store_kinds`` (the kinds of dmp store it fits),
    ``_scratch_kind`` (the name of its temporary stores, `dmp.utils.scratch.KINDS`) and
    ``_rounds_attribute`` (the attribute holding the per-round history).  Models
    with checkpoints add `DMPEstimator._checkpoint_constraints` to their parameters.
    """

    _store_kinds: tuple = ()
    _scratch_kind: str = ""
    _rounds_attribute: str = "history_"

    #: the parameters every dmp estimator has
    _parameter_constraints: dict = {
        "backend": [StrOptions({"auto", "local", "dask"}), _DaskClient(),
                    HasMethods(["start", "step", "close"])],
        "n_workers": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "random_state": ["random_state"],
        "show_progress": ["boolean"],
        "callback": [callable, None],
    }

    #: the parameters of a model that writes checkpoints
    _checkpoint_constraints: dict = {
        "checkpoint": [str, os.PathLike, None],
        "checkpoint_every": [Interval(numbers.Integral, 1, None, closed="left")],
        "resume": ["boolean"],
    }

    @classmethod
    def _get_param_names(cls):
        # the constructor's signature, read once per class: `inspect.signature` on every
        # `get_params` cost as much as a small fit's validation
        names = cls.__dict__.get("_param_names")
        if names is None:
            names = tuple(super()._get_param_names())
            type.__setattr__(cls, "_param_names", names)
        return list(names)

    def _validate_params(self):
        """scikit-learn's parameter validation, with the class's constraints made once: a
        valid set of parameters passes here, an invalid one is reported by scikit-learn's
        own check (its `InvalidParameterError` and message)."""
        constraints = self._parameter_constraints
        made = type(self).__dict__.get("_made_constraints")
        if made is None or made[0] is not constraints:
            made = (constraints, {name: [make_constraint(c) for c in options]
                                  for name, options in constraints.items()
                                  if options != "no_validation"}, set())
            type.__setattr__(type(self), "_made_constraints", made)
        passed = made[2]
        for name, value in self.get_params(deep=False).items():
            # a scalar's verdict is kept: the same value of the same type passes again
            key = (name, type(value), value) if type(value) in _SCALARS else None
            if key is not None and key in passed:
                continue
            options = made[1].get(name)
            if options is not None and not any(c.is_satisfied_by(value) for c in options):
                return super()._validate_params()
            if key is not None and len(passed) < 1024:
                passed.add(key)

    def _expected_failed_checks(self) -> dict:
        """``{check name: reason}`` of the scikit-learn estimator checks this estimator
        cannot pass (`sklearn.utils.estimator_checks.check_estimator`'s
        ``expected_failed_checks``); every dmp estimator passes them all unless it says."""
        return {}

    # ------------------------------------------------------------------ the fitting path
    def _fit(self, X, y=None, *, validate: bool = True, **options):
        """Fit on ``X`` (and ``y``) through the hooks; ``validate=False`` skips the parameter
        validation (a ``partial_fit`` after the first).  Returns self."""
        if validate:
            self._validate_params()
        name = type(self).__name__
        require_store_kind(X, self._store_kinds, name)
        fit = SimpleNamespace(**{"X": X, "y": y, "reset": True, "scratch": None, **options})
        self._check_fit(fit)
        checkpoints = "checkpoint" in self._parameter_constraints
        if checkpoints and self.resume and self.checkpoint is None:
            raise ValueError("resume=True needs a checkpoint location")
        fit.checkpointed = checkpoints and self.checkpoint is not None
        fit.backend = resolve_backend(self.backend, self.n_workers)
        fit.n_partitions = fit.backend.n_partitions
        try:
            fit.dataset = self._dataset(fit)
            fit.program = self._make_program(fit)
            # what a checkpoint must have been written by: only a fit with a checkpoint
            # location needs it (the content digest reads every byte of the data)
            fingerprint = self._fingerprint(fit) if fit.checkpointed else None
            if fingerprint is not None:
                fingerprint = {"estimator": name, **fingerprint,
                               "shape": [int(s) for s in fit.dataset.shape],
                               "n_partitions": fit.n_partitions,
                               "dataset": dataset_fingerprint(fit.dataset)}
            if checkpoints:
                run_options = dict(checkpoint=self.checkpoint, resume=self.resume,
                                   checkpoint_every=self.checkpoint_every)
            else:
                run_options = {}
            run_options.update(self._run_options(fit))
            result = run(fit.program, fit.backend, fingerprint=fingerprint,
                         callback=self.callback, show_progress=self.show_progress, desc=name,
                         params=(self.get_params(deep=False) if fit.backend.sends_events
                                 else None), **run_options)
        finally:
            fit.backend.close()
            if fit.scratch is not None:
                shutil.rmtree(fit.scratch, ignore_errors=True)
        # the model's own attributes first: one it cannot set leaves no sign of a fit
        self._set_fitted(fit, result)
        setattr(self, self._rounds_attribute, history_arrays(result.history))
        self.recoveries_ = result.recoveries
        self.wall_time_ = result.wall_s
        message = self._convergence_warning(fit, result)
        if message:
            warnings.warn(message, ConvergenceWarning, stacklevel=3)
        return self

    def _dataset(self, fit):
        """The dataset the program reads: a store as the model prepares it, or in-memory
        data held here (local backend) or written to a temporary store (``fit.scratch``)."""
        if self._is_dataset(fit.X):
            return self._prepare_store(fit)
        data = self._prepare_in_memory(fit)
        if not fit.backend.needs_store and data.local is not None:
            ds = data.local()
        else:
            fit.scratch = temporary_store_dir(self._scratch_kind)
            ds = data.write(fit.scratch)
        # the checkpoint fingerprint: by content, not by the temporary store's path
        if data.content is None or not fit.checkpointed:
            return ds
        return tag_content(ds, content_digest(*data.content))

    # ------------------------------------------------------------------ hooks
    def _check_fit(self, fit) -> None:
        """Checks of the call that need neither the backend nor the data."""

    def _is_dataset(self, X) -> bool:
        """Whether ``X`` is a dmp store (read by the workers as it is)."""
        raise NotImplementedError

    def _prepare_store(self, fit):
        """The store ``fit.X`` of samples and their targets checked (no separate target,
        not empty, enough shards, the fitted width unless ``fit.reset``); sets
        ``n_features_in_``."""
        ds = fit.X
        if fit.y is not None:
            raise ValueError("y must be None when X is a dmp dataset (the target is read "
                             "from the store)")
        if ds.n_samples < 1 or ds.n_features < 1:
            raise ValueError(f"dataset {getattr(ds, 'path', '')!r} is empty (shape "
                             f"{ds.shape})")
        if not fit.reset and ds.n_features != self.n_features_in_:
            raise ValueError(f"X has {ds.n_features} features, but {type(self).__name__} "
                             f"is expecting {self.n_features_in_} features as input")
        self._check_shards(ds, fit.n_partitions)
        self.n_features_in_ = ds.n_features
        return ds

    @staticmethod
    def _check_shards(ds, n_partitions: int, what: str = "dataset") -> None:
        """A store has at least one shard per partition."""
        if n_partitions > ds.n_shards:
            raise ValueError(f"the {what} has {ds.n_shards} shard(s) but {n_partitions} "
                             f"workers were requested; rewrite it with n_shards >= "
                             f"{n_partitions}")

    @staticmethod
    def _check_split(n: int, what: str, n_partitions: int) -> None:
        """In-memory data of ``n`` rows (``what``: "sample", ...) has one per partition."""
        if n < n_partitions:
            raise ValueError(f"{plural(n, what)} cannot be split over {n_partitions} workers")

    def _prepare_in_memory(self, fit) -> InMemoryData:
        raise NotImplementedError

    def _validate_xy(self, fit, **kwargs):
        """In-memory ``(X, y)`` (dask collections computed) validated by scikit-learn's
        `validate_data` with ``kwargs``; y is required."""
        if fit.y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target "
                             f"y is None (y may only be omitted when X is a dmp dataset)")
        X, y = computed(fit.X), computed(fit.y)
        if _plainly_valid(X, y, kwargs):
            # what `validate_data` would return unchanged, after the checks it would pass;
            # anything else takes scikit-learn's path (and its messages)
            if kwargs.get("reset", True):
                self.n_features_in_ = X.shape[1]
                if hasattr(self, "feature_names_in_"):
                    del self.feature_names_in_
                return X, y
            if getattr(self, "n_features_in_", None) == X.shape[1] and not hasattr(
                    self, "feature_names_in_"):
                return X, y
        return validate_data(self, X, y, multi_output=False, dtype=np.float64, **kwargs)

    def _make_program(self, fit):
        raise NotImplementedError

    def _fingerprint(self, fit) -> dict | None:
        return None

    def _run_options(self, fit) -> dict:
        raise NotImplementedError

    def _set_fitted(self, fit, result) -> None:
        raise NotImplementedError

    def _convergence_warning(self, fit, result) -> str | None:
        return None
