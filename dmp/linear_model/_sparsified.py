"""scikit-learn style estimators for independently sparsified distributed gradient methods."""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import type_of_target
from sklearn.utils.validation import check_is_fitted, validate_data

from ..base import DMPEstimator, InMemoryData
from ..io import InMemorySparseRowDataset, write_sparse_rows
from ..utils.estimator import seed_from
from ._dense import dense_to_compressed
from ._sparsified_program import SparsifiedProgram


def _is_row_dataset(X) -> bool:
    return hasattr(X, "load_row_shards") and hasattr(X, "row_partition")


class _SparsifiedBase(DMPEstimator):
    """Shared machinery; see :class:`SparsifiedSGDRegressor` for the parameters."""

    #: the kinds of dmp store it fits (`dmp.io.sparse.STORE_KINDS`)
    _store_kinds = ("sparse-rows",)
    _scratch_kind = "sparsified"

    #: the driver needs the stored targets (a classifier's classes); a regressor's store was
    #: validated when written, so its targets stay on the workers
    _needs_stored_targets = False

    _parameter_constraints: dict = {
        **DMPEstimator._parameter_constraints,
        **DMPEstimator._checkpoint_constraints,
        "penalty": [StrOptions({"l2", "l1", "elasticnet"}), None],
        "alpha": [Interval(numbers.Real, 0, None, closed="left")],
        "l1_ratio": [Interval(numbers.Real, 0, 1, closed="both")],
        "fit_intercept": ["boolean"],
        "method": [StrOptions({"isgd", "isega", "isaga", "iasgd"})],
        "n_blocks": [Interval(numbers.Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "blocks_per_worker": [Interval(numbers.Integral, 1, None, closed="left"),
                              StrOptions({"auto", "all"})],
        "batch_size": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "step_size": [Interval(numbers.Real, 0, None, closed="neither"),
                      StrOptions({"auto"})],
        "momentum": [Interval(numbers.Real, 0, 1, closed="left"), StrOptions({"auto"})],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "tol": [Interval(numbers.Real, 0, None, closed="left"), None],
        "n_iter_no_change": [Interval(numbers.Integral, 1, None, closed="left")],
        "verbose": ["verbose"],
    }

    def __init__(self, loss, *, penalty="l2", alpha=1e-4, l1_ratio=0.15, fit_intercept=True,
                 method="isega", n_blocks="auto", blocks_per_worker="auto", batch_size=None,
                 step_size="auto", momentum="auto", max_iter=1000, tol=1e-6,
                 n_iter_no_change=10, backend="auto", n_workers=None, random_state=None,
                 checkpoint=None, checkpoint_every=100, resume=False, show_progress=False,
                 callback=None, verbose=0):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.method = method
        self.n_blocks = n_blocks
        self.blocks_per_worker = blocks_per_worker
        self.batch_size = batch_size
        self.step_size = step_size
        self.momentum = momentum
        self.max_iter = max_iter
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
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

    # ------------------------------------------------------------------ data
    _is_dataset = staticmethod(_is_row_dataset)

    def _prepare_store(self, fit):
        X = super()._prepare_store(fit)
        if self._needs_stored_targets:
            self._check_labels(X.load_y(), fit)
        self._stored_labels = True
        return X

    def _prepare_in_memory(self, fit):
        X, y = self._validate_xy(fit, accept_sparse="csr", reset=fit.reset,
                                 y_numeric=not isinstance(self, ClassifierMixin))
        y = self._check_labels(y, fit)
        self._stored_labels = False
        X, P = sp.csr_matrix(dense_to_compressed(X, "csr")), fit.n_partitions
        self._check_split(X.shape[0], "sample", P)
        return InMemoryData(
            local=lambda: InMemorySparseRowDataset(X, y, n_shards=P),
            write=lambda tmp: write_sparse_rows(f"{tmp}/data.zarr", X, y, n_shards=P),
            content=(X, y))

    def _check_labels(self, y, fit):
        y = np.asarray(y, dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise ValueError("y contains NaN or infinite values")
        return y

    # ------------------------------------------------------------------ fitting
    def _resolve_blocks(self, n_coords: int, P: int):
        if self.n_blocks == "auto":
            m = min(n_coords, 512)
        else:
            m = int(self.n_blocks)
            if m > n_coords:
                raise ValueError(f"n_blocks={m} is larger than the number of coordinates "
                                 f"({n_coords} = features{' + intercept' if self.fit_intercept else ''})")
        if self.blocks_per_worker == "auto":
            tau = max(1, int(round(m / P)))
        elif self.blocks_per_worker == "all":
            tau = m
        else:
            tau = int(self.blocks_per_worker)
            if tau > m:
                raise ValueError(f"blocks_per_worker={tau} is larger than n_blocks={m}")
        return m, tau

    def _penalty_terms(self):
        if self.penalty is None:
            return 0.0, 0.0
        if self.penalty == "l2":
            return float(self.alpha), 0.0
        if self.penalty == "l1":
            return float(self.alpha), 1.0
        return float(self.alpha), float(self.l1_ratio)

    def _labels_for_program(self):
        return None

    def _make_program(self, fit):
        n, d = fit.dataset.shape
        m, tau = self._resolve_blocks(d + int(self.fit_intercept), fit.n_partitions)
        alpha, l1_ratio = self._penalty_terms()
        stochastic = self.method == "isaga" or self.batch_size is not None
        b = self.batch_size or 1
        return SparsifiedProgram(
            fit.dataset, loss=self.loss, labels=self._labels_for_program(), method=self.method,
            alpha=alpha, l1_ratio=l1_ratio, fit_intercept=self.fit_intercept, n_blocks=m,
            tau=tau, batch_size=self.batch_size, step_size=self.step_size,
            momentum=self.momentum, tol=self.tol, n_iter_no_change=self.n_iter_no_change,
            eval_every=max(1, math.ceil(n / fit.n_partitions / b)) if stochastic else 1,
            seed=seed_from(self.random_state), x0=fit.x0)

    def _fingerprint(self, fit):
        pr = fit.program
        return {"method": self.method, "loss": self.loss, "alpha": pr.alpha,
                "l1_ratio": pr.l1_ratio, "n_blocks": pr.n_blocks, "tau": pr.tau}

    def _run_options(self, fit):
        # one epoch (partial_fit): one iteration with exact local gradients
        iters = fit.program.eval_every if fit.one_epoch else self.max_iter
        return {"max_iter": iters + 1}

    def _set_fitted(self, fit, result):
        pr, dr = fit.program, fit.program.driver
        x, d = dr["x"], pr.n_features
        self._set_coef(x[:d], float(x[d]) if self.fit_intercept else 0.0)
        self.n_iter_ = max(result.n_rounds - 1, 0)
        self.n_blocks_, self.blocks_per_worker_, self.block_bounds_ = pr.n_blocks, pr.tau, pr.bounds
        self.step_size_ = float(dr["step"])
        self.momentum_ = dr["beta"]
        self.lipschitz_ = float(dr["L"])
        self.objective_ = float(dr["objective"])
        if dr.get("diverged"):
            raise FloatingPointError(
                f"{type(self).__name__} diverged (objective {dr['objective']}) with "
                f"step_size={self.step_size_:.3g}; use a smaller step_size")

    def _convergence_warning(self, fit, result):
        if (not fit.one_epoch and not result.converged and not result.stopped
                and self.tol is not None):
            return (f"{type(self).__name__} stopped after max_iter={self.max_iter} "
                    f"iterations before its stopping test met tol; "
                    f"increase max_iter")

    def fit(self, X, y=None):
        """Fit the model from zero.

        Parameters
        ----------
        X : array-like, sparse matrix, dask array or ``dmp.io.SparseRowDataset``
            Samples of shape (n_samples, n_features), split by rows over the workers; or an
            opened row dataset (then ``y`` comes from the store and must be None).
        y : array-like of shape (n_samples,)

        Returns
        -------
        self
        """
        return self._fit(X, y, one_epoch=False, x0=None, classes=None)

    def _partial(self, X, y, classes=None):
        """One epoch from the current coefficients (from zero on the first call, whose
        ``classes`` a classifier declares)."""
        first = not hasattr(self, "coef_")
        x0 = None if first else np.append(np.ravel(self.coef_),
                                          np.ravel(self.intercept_)[:int(self.fit_intercept)])
        return self._fit(X, y, validate=first, reset=first, one_epoch=True, x0=x0,
                         classes=classes)

    def _decision(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        coef = np.ravel(self.coef_)
        return np.asarray(X @ coef).ravel() + float(np.ravel(self.intercept_)[0])

    def plot(self, ax=None):
        """Objective against iterations and against uploaded blocks (needs matplotlib)."""
        check_is_fitted(self)
        import matplotlib.pyplot as plt

        h = self.history_
        if ax is None:
            _, ax = plt.subplots(1, 2, figsize=(10, 4))
        f = np.asarray(h["objective"], dtype=float)
        ok = np.isfinite(f)
        it = np.arange(len(f))
        blocks = np.cumsum(h["blocks_uploaded"])
        ax[0].plot(it[ok], f[ok])
        ax[0].set_xlabel("iteration")
        ax[1].plot(blocks[ok], f[ok])
        ax[1].set_xlabel("blocks uploaded (sum over the partitions)")
        for a in ax:
            a.set_ylabel("objective")
        return ax


class SparsifiedSGDRegressor(RegressorMixin, _SparsifiedBase):
    """Linear regression by distributed gradient methods with independent sparsification.

    Minimises ``(1 / 2N) sum_j (y_j - a_j.w - b)^2 + R(w)`` with
    ``R(w) = alpha (l1_ratio |w|_1 + (1 - l1_ratio) / 2 |w|^2)`` (``penalty`` as in
    :class:`sklearn.linear_model.SGDRegressor`).  The samples are split by rows over
    ``n_workers`` workers.  Each iteration every worker computes its local estimate, keeps
    ``blocks_per_worker`` (tau) of the ``n_blocks`` (m) coordinate blocks, sampled
    independently of the other workers, and uploads only those, scaled by m / tau on the
    driver so the aggregate stays unbiased (docs/algorithms.md, "Independent sparsification").

    Parameters
    ----------
    penalty : {"l2", "l1", "elasticnet"} or None, default="l2"
    alpha : float, default=1e-4
        Regularisation strength.
    l1_ratio : float, default=0.15
        Elastic-net mixing (used with ``penalty="elasticnet"``).
    fit_intercept : bool, default=True
        Fit an unpenalised intercept (an extra coordinate in the last block).
    method : {"isega", "isgd", "isaga", "iasgd"}, default="isega"
        ``isgd``: sparsified (stochastic) gradients; converges linearly when every
        ``grad f_i(x*) = 0`` (identical shards, interpolation), otherwise only to a noise
        floor that grows with ``(m/tau - 1) sum_i |grad f_i(x*)|^2`` (heterogeneous
        shards); ``isega``: SEGA-type shifts on every worker, converges to the exact optimum; ``isaga``: SAGA with block-refreshed memory
        (``batch_size`` rows per worker per iteration); ``iasgd``: the isgd estimator with
        momentum (for over-parameterised / interpolation problems).
    n_blocks : int or "auto", default="auto"
        Number of contiguous coordinate blocks m (``"auto"``: min(coordinates, 512)).
    blocks_per_worker : int, "auto" or "all", default="auto"
        Blocks each worker uploads per iteration, tau (``"auto"``: round(m / n_workers);
        ``"all"``: the dense method).
    batch_size : int or None, default=None
        Rows per worker per iteration for stochastic gradients; None = exact local
        gradients (``isaga`` then uses 1).
    step_size : float or "auto", default="auto"
        ``"auto"``: from the smoothness constants the workers report
        (docs/algorithms.md, "Step rule as implemented"),
        ``1 / (L + (m/tau - 1) max_i w_i L_i)`` with method-specific factors; ``isega``
        with exact local gradients uses the weighted mean ``sum_i w_i^2 L_i`` in place of
        the max (its variance is spread over the workers' trailing shifts).
    momentum : float in [0, 1) or "auto", default="auto"
        ``iasgd`` only; ``"auto"``: from the condition number when the penalty is strongly
        convex, else the convex schedule k / (k + 3).
    max_iter : int, default=1000
        Iterations (rounds).
    tol : float or None, default=1e-6
        ``isega`` with exact local gradients: stop when ``n_iter_no_change |G|^2 / (2L) <=
        tol * max(1, |best objective|)``, with ``G`` the gradient mapping (the gradient
        without an L1 term) at the iterate and L the smoothness bound, i.e. when
        ``n_iter_no_change`` dense steps of 1/L would gain less than tol; the test does not
        depend on tau, so neither does the final suboptimality.  With ``tau = m`` it is
        exact and checked every iteration; with ``tau < m`` every ``ceil(m / 4 tau)``
        iterations each worker adds an 8-value CountSketch of its local gradient to its
        upload, and the fit tests the mean of the last checks of about one epoch of
        blocks (at most 4; docs/algorithms.md, "Stopping").  The other methods: stop when the best objective decreased by less
        than ``tol * max(1, |best|)`` over the last ``n_iter_no_change * c`` evaluations
        (every iteration with exact gradients, every epoch otherwise), where ``c =
        max(ceil(A / L), ceil(m / (8 tau)))`` for ``isgd`` with exact gradients (A / L: how
        much the auto step shrinks against the dense one) and ``ceil(m / tau)`` otherwise.
        None runs ``max_iter`` iterations.
    n_iter_no_change : int, default=10
    backend : {"auto", "local", "dask"}, distributed.Client or backend, default="auto"
    n_workers : int, optional
        Number of workers n (default: every Dask worker, or 1 in-process; the local backend
        simulates any number).
    random_state : int, RandomState or None
        Seed of the block and row sampling.
    checkpoint, checkpoint_every, resume, show_progress, callback, verbose
        As in :class:`dmp.linear_model.Lasso`.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : ndarray of shape (1,)
    n_iter_ : int
        Iterations run.
    n_blocks_, blocks_per_worker_ : int
        m and tau.
    block_bounds_ : ndarray of shape (m + 1,)
    step_size_, momentum_, lipschitz_ : float
        Step, momentum (iasgd) and the smoothness bound L used.
    objective_ : float
        Objective at the last evaluated iterate.
    history_ : dict of arrays, one entry per round
        ``objective`` (at the point the workers used in that round; round 0 reports the
        starting point), ``blocks_uploaded`` (all workers), ``upload_bytes`` (rounds x
        workers), ``bytes_push`` / ``bytes_pull`` (push and broadcast), ``time``,
        ``push_s``, ``worker_losses`` (losses recovered from before the round ran).
    """

    def __init__(self, *, loss="squared_error", penalty="l2", alpha=1e-4, l1_ratio=0.15,
                 fit_intercept=True, method="isega", n_blocks="auto",
                 blocks_per_worker="auto", batch_size=None, step_size="auto",
                 momentum="auto", max_iter=1000, tol=1e-6, n_iter_no_change=10,
                 backend="auto", n_workers=None, random_state=None, checkpoint=None,
                 checkpoint_every=100, resume=False, show_progress=False, callback=None,
                 verbose=0):
        super().__init__(loss, penalty=penalty, alpha=alpha, l1_ratio=l1_ratio,
                         fit_intercept=fit_intercept, method=method, n_blocks=n_blocks,
                         blocks_per_worker=blocks_per_worker, batch_size=batch_size,
                         step_size=step_size, momentum=momentum, max_iter=max_iter, tol=tol,
                         n_iter_no_change=n_iter_no_change, backend=backend,
                         n_workers=n_workers, random_state=random_state,
                         checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                         resume=resume, show_progress=show_progress, callback=callback,
                         verbose=verbose)

    _parameter_constraints = {**_SparsifiedBase._parameter_constraints,
                              "loss": [StrOptions({"squared_error"})]}

    def _set_coef(self, w, b):
        self.coef_ = np.asarray(w, dtype=np.float64).copy()
        self.intercept_ = np.array([b])

    def partial_fit(self, X, y):
        """One more epoch on (X, y), starting from the current coefficients.

        An epoch is one iteration with exact local gradients and ``n / (n_workers *
        batch_size)`` iterations with stochastic ones.  Shifts and SAGA memories describe
        one batch, so they restart with every call.
        """
        return self._partial(X, y)

    def predict(self, X):
        """Predicted targets."""
        return self._decision(X)


class SparsifiedSGDClassifier(ClassifierMixin, _SparsifiedBase):
    """Binary logistic regression by distributed gradient methods with independent
    sparsification.

    Minimises ``(1/N) sum_j log(1 + exp(-t_j (a_j.w + b))) + R(w)`` with ``t_j = +1`` for
    ``classes_[1]`` and -1 for ``classes_[0]``.  Parameters, attributes and the method as in
    :class:`SparsifiedSGDRegressor`; ``loss="log_loss"`` is the only loss.  Binary only:
    more than two classes is an error.

    Attributes
    ----------
    classes_ : ndarray of shape (2,)
    coef_ : ndarray of shape (1, n_features)
    intercept_ : ndarray of shape (1,)
    """

    _needs_stored_targets = True

    def __init__(self, *, loss="log_loss", penalty="l2", alpha=1e-4, l1_ratio=0.15,
                 fit_intercept=True, method="isega", n_blocks="auto",
                 blocks_per_worker="auto", batch_size=None, step_size="auto",
                 momentum="auto", max_iter=1000, tol=1e-6, n_iter_no_change=10,
                 backend="auto", n_workers=None, random_state=None, checkpoint=None,
                 checkpoint_every=100, resume=False, show_progress=False, callback=None,
                 verbose=0):
        super().__init__(loss, penalty=penalty, alpha=alpha, l1_ratio=l1_ratio,
                         fit_intercept=fit_intercept, method=method, n_blocks=n_blocks,
                         blocks_per_worker=blocks_per_worker, batch_size=batch_size,
                         step_size=step_size, momentum=momentum, max_iter=max_iter, tol=tol,
                         n_iter_no_change=n_iter_no_change, backend=backend,
                         n_workers=n_workers, random_state=random_state,
                         checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                         resume=resume, show_progress=show_progress, callback=callback,
                         verbose=verbose)

    _parameter_constraints = {**_SparsifiedBase._parameter_constraints,
                              "loss": [StrOptions({"log_loss"})]}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags

    def _check_labels(self, y, fit):
        y = np.asarray(y)
        kind = type_of_target(y, input_name="y", raise_unknown=True)
        classes = np.unique(y)
        # partial_fit's first call brings the classes (whatever this batch holds)
        declared, reset = fit.classes, fit.reset
        if reset and declared is None:
            if kind != "binary" or len(classes) != 2:
                raise ValueError(f"Only binary classification is supported. The type of the "
                                 f"target is {kind}: y has {len(classes)} class(es) "
                                 f"{classes.tolist()[:10]}, {type(self).__name__} needs "
                                 f"exactly 2")
            known = classes
        else:
            known = declared if reset else self.classes_
            unknown = np.setdiff1d(classes, known)
            if len(unknown):
                raise ValueError(f"y contains labels {unknown.tolist()[:10]} not in "
                                 f"classes_ {known.tolist()}")
        self.classes_ = known
        # the stored labels travel to the workers, which map them to -1 / +1
        return (y == self.classes_[1]).astype(np.float64)

    def _labels_for_program(self):
        # in-memory targets arrive as 0/1; a store holds the original labels
        if self._stored_labels:
            return (float(self.classes_[0]), float(self.classes_[1]))
        return (0.0, 1.0)

    def _set_coef(self, w, b):
        self.coef_ = np.asarray(w, dtype=np.float64).reshape(1, -1).copy()
        self.intercept_ = np.array([b])

    def partial_fit(self, X, y, classes=None):
        """One more epoch on (X, y) (see :meth:`SparsifiedSGDRegressor.partial_fit`);
        ``classes`` is required on the first call."""
        if not hasattr(self, "coef_"):
            self._validate_params()   # before the classes are checked
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
            classes = np.unique(classes)
            if len(classes) != 2:
                raise ValueError(f"{type(self).__name__} is a binary classifier: got "
                                 f"{len(classes)} classes")
            return self._partial(X, y, classes)
        if classes is not None and not np.array_equal(np.unique(classes), self.classes_):
            raise ValueError(f"classes={list(classes)} differs from classes_ "
                             f"{self.classes_.tolist()} of the earlier calls")
        return self._partial(X, y)

    def decision_function(self, X):
        """Signed score of ``classes_[1]``."""
        return self._decision(X)

    def predict_proba(self, X):
        """Probabilities of ``classes_[0]`` and ``classes_[1]``."""
        z = self._decision(X)
        p = np.empty_like(z)
        pos = z >= 0
        p[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
        e = np.exp(z[~pos])
        p[~pos] = e / (1.0 + e)
        return np.column_stack([1.0 - p, p])

    def predict_log_proba(self, X):
        return np.log(self.predict_proba(X))

    def predict(self, X):
        """Predicted class labels."""
        check_is_fitted(self)
        return self.classes_[(self._decision(X) > 0).astype(int)]
