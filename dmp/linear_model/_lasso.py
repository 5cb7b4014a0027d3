"""``dmp.linear_model.Lasso``: STRADS coordinate descent with dynamic priority scheduling."""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.base import RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from .. import config
from ..base import DMPEstimator, InMemoryData
from ..io import write_sparse
from ..io.sparse import InMemorySparseDataset
from ..utils.estimator import seed_from
from ..utils.text import plural
from ._dense import dense_to_compressed
from ._lasso_program import LassoProgram


def _is_dataset(X) -> bool:
    return hasattr(X, "load_shards") and hasattr(X, "col_bounds")


def _auto_inner_sweeps(schedule: str, n_partitions: int, nnz: int) -> int:
    """Sweeps per round for ``inner_sweeps="auto"`` (measured in BENCHMARKS.md: the Lasso's
    table of sweeps per round).

    One partition: a working-set solve (up to 50 sweeps, stopping early).  Several: each
    local sweep runs against a residual that misses the other partitions' changes of the
    same round.  On small partitions a sweep costs less than a round's messaging, and 3
    sweeps per round need fewer rounds; on large ones the later sweeps mostly redo what the
    block-Jacobi combination cancels.
    """
    if schedule != "priority":
        return 1
    if n_partitions == 1:
        return 50
    one_sweep = config.count("dmp.lasso.one-sweep-values-per-partition")
    return 1 if nnz / n_partitions >= one_sweep else 3


class Lasso(RegressorMixin, DMPEstimator):
    """Lasso by STRADS scheduled model-parallel coordinate descent.

    Minimises scikit-learn's objective ``1/(2 n) ||y - X w - b||^2 + alpha ||w||_1``.
    The features are partitioned over workers (column blocks); each round the scheduler picks
    variables, every worker runs coordinate descent over its share against its replica of the
    residual (push), and the residual changes are summed and applied with a barrier (pull).

    Parameters
    ----------
    alpha : float, default=1.0
        L1 penalty (>= 0).
    fit_intercept : bool, default=True
        Fit an intercept (columns and target are centred implicitly; sparse X stays sparse).
    schedule : {"priority", "round_robin", "random"}, default="priority"
        ``"priority"``: STRADS dynamic schedule -- variables sampled with probability
        proportional to (last change)^2 + eta * mean, then the dependency filter keeps only
        candidates with |corr| < rho to every kept one.  ``"round_robin"``: the next
        ``schedule_size`` variables in cyclic order (Lasso-RR).  ``"random"``: uniform without
        replacement.
    schedule_size : int or "auto", default="auto"
        Variables kept per round over all workers.  ``"auto"`` sizes rounds by work: an eighth
        of the features (at least 32), the same on every backend so that results agree.
    eta : float, default=1e-3
        Priority floor, relative to the mean priority, so every variable keeps a chance.
    rho : float or None, default=None
        Dependency-filter threshold on the absolute correlation of (centred) columns (STRADS
        uses 0.1); None disables the filter.  Applied among each worker's candidates, like
        STRADS' scheduler partitions; updates of different workers are reconciled by the
        pull's step rule.  Off by default: each worker sweeps its set sequentially, so the
        filter only shrinks rounds there (measured in BENCHMARKS.md).
    oversample : float, default=2.0
        Priority draws per kept variable (STRADS' L'/L).
    inner_sweeps : int or "auto", default="auto"
        Sequential sweeps each worker makes over its scheduled set per round (stopping early
        once the steps are below ``tol`` relative to the coefficients): a working-set solve
        that gives rounds enough work.  ``"auto"``: for the priority schedule (whose sets are
        the variables still moving) 50 on one partition; on several, 3 when a partition
        holds fewer than 10M stored values (sweeps are cheap against a round's messaging, so
        fewer rounds win) and 1 above (a second sweep against a residual missing the other
        partitions' changes costs more than the rounds it saves); 1 for the other schedules
        (the classic STRADS round).  The 10M is the Dask setting
        ``dmp.lasso.one-sweep-values-per-partition``.
    staleness : int, default=0
        Rounds kept in flight beyond the current one (0 = bulk synchronous).
    max_iter : int, default=10000
        Maximum number of rounds.
    tol : float, default=1e-4
        Stop when the duality gap <= ``tol * ||y~||^2 / n`` (scikit-learn's rule).
    check_every : int or "auto", default="auto"
        Coordinate updates between duality-gap rounds (``"auto"``: the number of features).
    backend : {"auto", "local", "dask"}, distributed.Client or backend instance, default="auto"
        ``"auto"`` uses the active ``distributed.Client`` if there is one, else in-process;
        a ``Client`` runs on that client's cluster.
    n_workers : int, optional
        Number of partitions (default: every Dask worker, or 1 in-process).
    random_state : int, RandomState or None
        Seed of the scheduler.
    checkpoint : str, optional
        Zarr checkpoint location, written every ``checkpoint_every`` rounds.
    checkpoint_every : int, default=50
    resume : bool, default=False
        Continue from the latest complete checkpoint in ``checkpoint``.
    show_progress : bool, default=False
        Show a progress bar with the objective and the gap.
    callback : callable, optional
        ``callback(round, metrics) -> bool``; returning True stops the fit.
    verbose : int, default=0

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : float
    n_iter_ : int
        Rounds run (coordinate-descent, gap and refresh rounds).
    n_updates_ : int
        Coordinate updates applied.
    inner_sweeps_ : int
        Sweeps per round used (``inner_sweeps`` with ``"auto"`` resolved).
    dual_gap_ : float
        Duality gap at the last gap round, in objective units.
    objective_ : float
    history_ : dict of ndarray
        Per round: objective, dual_gap, time, round_s, push_s (per worker), bytes per
        primitive, candidates and kept variables, the pull step,
        ``worker_losses`` (losses recovered from before the round ran).
    recoveries_ : list of dict
        Worker losses survived during the fit.
    """

    #: the kinds of dmp store it fits (`dmp.io.sparse.STORE_KINDS`)
    _store_kinds = ("sparse-columns",)
    _scratch_kind = "lasso"

    _parameter_constraints = {
        **DMPEstimator._parameter_constraints,
        **DMPEstimator._checkpoint_constraints,
        "alpha": [Interval(numbers.Real, 0, None, closed="left")],
        "fit_intercept": ["boolean"],
        "schedule": [StrOptions({"priority", "round_robin", "random"})],
        "schedule_size": [Interval(numbers.Integral, 1, None, closed="left"),
                          StrOptions({"auto"})],
        "eta": [Interval(numbers.Real, 0, None, closed="neither")],
        "rho": [Interval(numbers.Real, 0, None, closed="neither"), None],
        "oversample": [Interval(numbers.Real, 1, None, closed="left")],
        "inner_sweeps": [Interval(numbers.Integral, 1, None, closed="left"),
                         StrOptions({"auto"})],
        "staleness": [Interval(numbers.Integral, 0, None, closed="left")],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "tol": [Interval(numbers.Real, 0, None, closed="left")],
        "check_every": [Interval(numbers.Integral, 1, None, closed="left"),
                        StrOptions({"auto"})],
        "verbose": ["verbose"],
    }

    def __init__(self, alpha=1.0, *, fit_intercept=True, schedule="priority",
                 schedule_size="auto", eta=1e-3, rho=None, oversample=2.0, inner_sweeps="auto",
                 staleness=0,
                 max_iter=10000, tol=1e-4, check_every="auto", backend="auto", n_workers=None,
                 random_state=None, checkpoint=None, checkpoint_every=50, resume=False,
                 show_progress=False, callback=None, verbose=0):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.schedule = schedule
        self.schedule_size = schedule_size
        self.eta = eta
        self.rho = rho
        self.oversample = oversample
        self.inner_sweeps = inner_sweeps
        self.staleness = staleness
        self.max_iter = max_iter
        self.tol = tol
        self.check_every = check_every
        self.backend = backend
        self.n_workers = n_workers
        self.random_state = random_state
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.show_progress = show_progress
        self.callback = callback
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y=None):
        """Fit the model.

        Parameters
        ----------
        X : array-like, sparse matrix, dask array or ``dmp.io.SparseDataset``
            Design matrix of shape (n_samples, n_features), or an opened dmp Zarr dataset
            (then ``y`` is read from the store and must be None).
        y : array-like of shape (n_samples,)

        Returns
        -------
        self
        """
        return self._fit(X, y)

    _is_dataset = staticmethod(_is_dataset)

    def _prepare_in_memory(self, fit):
        X, y = self._validate_xy(fit, accept_sparse="csc", y_numeric=True)
        P, p = fit.n_partitions, X.shape[1]
        if P > p:   # in-memory input is split into one block of features per worker
            raise ValueError(f"{P} workers were requested for {p} feature(s): each worker "
                             f"needs at least one feature")
        return InMemoryData(
            local=lambda: InMemorySparseDataset(dense_to_compressed(X, "csc"), y,
                                                 n_shards=P),
            write=lambda tmp: write_sparse(f"{tmp}/data.zarr", sp.csc_matrix(X), y,
                                           n_shards=min(p, max(P, 1))),
            content=(X, y))

    def _make_program(self, fit):
        ds, p = fit.dataset, fit.dataset.shape[1]
        # sized by work, and the same on every backend so results agree
        size = max(min(p, 32), p // 8) if self.schedule_size == "auto" else self.schedule_size
        if self.inner_sweeps == "auto":
            sweeps = _auto_inner_sweeps(self.schedule, fit.n_partitions,
                                        int(np.sum(ds.shard_nnz())))
        else:
            sweeps = self.inner_sweeps
        return LassoProgram(
            ds, alpha=self.alpha, fit_intercept=self.fit_intercept, schedule=self.schedule,
            schedule_size=size, eta=self.eta, rho=self.rho, oversample=self.oversample,
            tol=self.tol, check_every=p if self.check_every == "auto" else self.check_every,
            refresh_every=10, seed=seed_from(self.random_state), inner_sweeps=sweeps)

    def _fingerprint(self, fit):
        # stale rounds see other updates: another chain of iterates
        return {"alpha": float(self.alpha), "fit_intercept": bool(self.fit_intercept),
                "schedule": self.schedule, "staleness": int(self.staleness)}

    def _run_options(self, fit):
        return {"max_iter": self.max_iter, "staleness": self.staleness}

    def _set_fitted(self, fit, result):
        d = fit.program.driver
        self.coef_ = d.coef
        self.intercept_ = float(d.intercept)
        self.n_iter_ = result.n_rounds
        self.n_updates_ = d.updates
        self.inner_sweeps_ = fit.program.inner_sweeps
        self.dual_gap_ = float(d.gap)
        self.objective_ = float(d.objective)

    def _convergence_warning(self, fit, result):
        if not result.converged and not result.stopped and self.tol > 0:
            return (f"Lasso did not converge in {plural(self.max_iter, 'round')} (duality "
                    f"gap {self.dual_gap_:.3e}); increase max_iter or tol.")

    def predict(self, X):
        """Predict with the fitted linear model."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse=("csr", "csc"), dtype=np.float64, reset=False)
        return np.asarray(X @ self.coef_).ravel() + self.intercept_

    def plot(self, ax=None):
        """Objective and duality gap against time (needs matplotlib)."""
        check_is_fitted(self)
        from ..plotting import plot_convergence

        return plot_convergence({"Lasso": self.history_}, ax=ax)
