"""``dmp.decomposition.MatrixFactorization``: STRADS model-parallel CCD / ALS / CCD++."""

from __future__ import annotations

import math
import numbers
import os
import shutil

import numpy as np
import scipy.sparse as sp
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ..base import DMPEstimator, InMemoryData
from ..io import InMemoryRatingsDataset, write_ratings
from ..io.sparse import _group_has_attrs
from ..kernels import mf as kernels
from ..utils.estimator import seed_from
from ..utils.scratch import clean_stale_partials, mark_partial, unmark_partial
from ._mf_program import MFProgram, auto_block_size


def _is_ratings_dataset(X) -> bool:
    return hasattr(X, "load_rows") and hasattr(X, "load_cols") and hasattr(X, "balanced_bounds")


def _check_validation(users, items, ratings, shape) -> None:
    """``X_val``'s own errors, with positions in ``X_val`` (not in the ratings it is then
    stored with)."""
    ratings = np.asarray(ratings, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(ratings))
    if len(bad):
        raise ValueError(f"X_val ratings must be finite; X_val rating {bad[0]} is "
                         f"{ratings[bad[0]]}")
    if shape is None:
        return
    for name, ids, n in (("user", users, shape[0]), ("item", items, shape[1])):
        ids = np.asarray(ids)
        bad = np.flatnonzero((ids < 0) | (ids >= n))
        if len(bad):
            raise ValueError(f"X_val {name} ids must be in [0, {n}) (the shape of X); X_val "
                             f"{name} {bad[0]} is {ids[bad[0]]}")


def _check_factors_store(path) -> None:
    """``factors_store`` may be written: nothing is there, or the factors of an earlier fit
    (replaced) -- never a file or a folder of something else."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.lexists(path) or (os.path.isdir(path) and not os.listdir(path)):
        return
    if not _group_has_attrs(path, None, "user_starts", "item_starts"):
        raise FileExistsError(f"factors_store {path!r} exists and is not a factors store of "
                              f"an earlier fit; refusing to replace it (choose another path)")


def _as_triplets(R, what: str):
    """(users, items, ratings, shape or None) from a sparse matrix or a triplet tuple."""
    if sp.issparse(R):
        C = sp.coo_matrix(R)
        return C.row, C.col, C.data, C.shape
    if isinstance(R, tuple) and len(R) == 3:
        u, i, r = (np.asarray(a) for a in R)
        return u, i, r, None
    if isinstance(R, np.ndarray) or hasattr(R, "__array__"):
        raise TypeError(f"{what}: dense arrays are ambiguous for ratings (which entries are "
                        f"observed?); pass a scipy.sparse matrix whose stored entries are "
                        f"the ratings, a (users, items, ratings) tuple, or a dmp ratings store")
    raise TypeError(f"{what}: expected a scipy.sparse matrix, a (users, items, ratings) tuple "
                    f"or a dmp ratings store, got {type(R).__name__}")


class MatrixFactorization(DMPEstimator):
    """Explicit-feedback matrix factorisation by STRADS model-parallel coordinate descent
    (CCD, CCD++) or block ALS.

    Minimises ``sum_(i,j) observed (r_ij - mu - w_i . h_j)^2 + alpha (sum_i c_i |w_i|^2 +
    sum_j c_j |h_j|^2)`` over user factors W (n_users x k) and item factors H (n_items x k),
    with ``c = 1`` (``reg_scaling="none"``: the STRADS / CCD++ objective, ``alpha`` not
    multiplied by rating counts, as ``cmfrec.CMF(scale_lam=False)``) or ``c`` = the number of
    ratings of the user or item (``reg_scaling="count"``), and ``mu`` the mean training
    rating (``center=True``) or 0.

    Users and items are partitioned over the workers (contiguous ranges balanced by rating
    count); each worker holds the ratings of its users and of its items, and updates only its
    own factors.  Coordinates are scheduled round-robin in blocks; each round moves only the
    coordinate block in flight (CCD: a block of coordinates; CCD++: the items' partial sums of
    one feature), worker to worker, so no worker ever holds another worker's factors whole.

    Parameters
    ----------
    n_components : int, default=10
        Rank k.
    alpha : float, default=0.05
        Regularisation strength (>= 0).
    method : {"ccd++", "ccd", "als"}, default="ccd++"
        ``"ccd++"``: rank-one feature updates (Yu et al. 2012), one factor column in flight
        per round.  ``"ccd"``: exact cyclic coordinate descent over all coordinates of every
        user, then of every item (STRADS' released ``cdmf``), ``block_size`` coordinates per
        round.  ``"als"``: the same rounds, but each user's (then item's) least-squares
        problem over the round's coordinates is solved jointly by ``cg_steps`` conjugate-
        gradient steps from its current value: alternating least squares with CG (as
        cmfrec's and implicit's) when the block holds all k coordinates.  Its vectorised
        row updates make it the fastest method at high rank (about k >= 50); CCD++ is at
        low rank.
    max_iter : int, default=20
        Outer iterations (one pass over every factor of W and H).
    n_inner : int, default=1
        CCD++ inner passes per feature (T).
    cg_steps : int, default=3
        ALS: conjugate-gradient steps per row and block (``cg_steps >= block_size`` solves
        each row's least-squares problem exactly, up to rounding).
    dtype : {"float64", "float32"} or numpy float type, default="float64"
        Precision of the factors, the residuals and the blocks sent between workers (ALS and
        CCD).  float32 halves memory and traffic and makes ALS about twice as fast (its
        vectorised row updates do twice the work per instruction), at float32 accuracy of
        the factors and the objective (sums are still accumulated in float64); the
        fitted factors are float32 then.
    block_size : int or "auto", default="auto"
        CCD and ALS: coordinates per round.  ``"auto"``: all k when a block of
        ``(n_users + n_items) * block_size * 8`` bytes fits 64 MiB (the Dask setting
        ``dmp.matrix-factorization.auto-block-bytes``), else the largest that does.
    center : bool, default=True
        Subtract the mean training rating (``mean_``) and model the deviations.
    reg_scaling : {"none", "count"}, default="none"
        See the objective above.
    tol : float or None, default=1e-4
        Stop when an iteration lowers the objective by less than ``tol`` relative.
    backend : {"auto", "local", "dask"}, a ``distributed.Client`` or a backend instance
        ``"auto"``: the active Dask client if there is one, else in-process.
    n_workers : int, optional
        Partitions (default: the backend's worker count).
    random_state : int, RandomState or None
        Seed of the initial H (entries U(0, 1), keyed by item, so independent of the
        partitioning; W starts at 0, as in STRADS; ALS starts from ``0.1 (U(0, 1) - 1/2)``,
        centred, which its CG steps need).
    checkpoint : str, optional
        Zarr checkpoint location (written every ``checkpoint_every`` iterations).
    checkpoint_every : int, default=5
    resume : bool, default=False
        Continue from the latest complete checkpoint.
    show_progress : bool, default=False
        Progress bar with the objective and validation RMSE.
    callback : callable, optional
        ``callback(round, metrics) -> bool``; True stops the fit.
    factors_store : str, optional
        Zarr location for the factors.  Each worker writes its own rows there at the end
        (nothing passes through the client), and ``user_factors_`` / ``item_factors_`` are
        dask arrays reading them: for models larger than the client's memory.  Written
        under a temporary name and renamed when complete; an existing store is replaced.

    Attributes
    ----------
    user_factors_ : ndarray (or dask array with ``factors_store``) of shape (n_users, n_components)
    item_factors_ : ndarray (or dask array with ``factors_store``) of shape (n_items, n_components)
    mean_ : float
        The subtracted mean rating (0 without centring).
    n_iter_ : int
        Outer iterations run.
    objective_ : float
        Final objective.
    history_ : dict of arrays
        Per round: ``iteration``, ``phase`` ("init", "W", "H"), ``objective``,
        ``train_rmse``, ``valid_rmse`` (NaN without validation data), ``time``, ``round_s``,
        ``push_s`` (rounds x workers), ``bytes_schedule``, ``bytes_push``, ``bytes_pull``,
        ``bytes_ring`` (between workers), ``batch`` (the first round of the call the round ran
        in: CCD++ rounds run in batches on Dask, whose rounds' ``time`` is when they ended on
        the workers) and ``worker_losses`` (losses recovered from before the round ran).
    block_size_ : int
        Coordinates per round (1 for CCD++).
    """

    #: the kinds of dmp store it fits (`dmp.io.sparse.STORE_KINDS`)
    _store_kinds = ("ratings",)
    _scratch_kind = "mf"

    _parameter_constraints: dict = {
        **DMPEstimator._parameter_constraints,
        **DMPEstimator._checkpoint_constraints,
        "n_components": [Interval(numbers.Integral, 1, None, closed="left")],
        "alpha": [Interval(numbers.Real, 0, None, closed="left")],
        "method": [StrOptions({"ccd++", "ccd", "als"})],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "n_inner": [Interval(numbers.Integral, 1, None, closed="left")],
        "cg_steps": [Interval(numbers.Integral, 1, None, closed="left")],
        "dtype": [StrOptions({"float32", "float64"}), type, np.dtype],
        "block_size": [Interval(numbers.Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "center": ["boolean"],
        "reg_scaling": [StrOptions({"none", "count"})],
        "tol": [Interval(numbers.Real, 0, None, closed="left"), None],
        "factors_store": [str, os.PathLike, None],
    }

    def __init__(self, n_components=10, *, alpha=0.05, method="ccd++", max_iter=20, n_inner=1,
                 cg_steps=3, block_size="auto", dtype="float64", center=True,
                 reg_scaling="none", tol=1e-4, backend="auto", n_workers=None,
                 random_state=None, checkpoint=None, checkpoint_every=5, resume=False,
                 show_progress=False, callback=None, factors_store=None):
        self.n_components = n_components
        self.alpha = alpha
        self.method = method
        self.max_iter = max_iter
        self.n_inner = n_inner
        self.cg_steps = cg_steps
        self.dtype = dtype
        self.block_size = block_size
        self.center = center
        self.reg_scaling = reg_scaling
        self.tol = tol
        self.backend = backend
        self.n_workers = n_workers
        self.random_state = random_state
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.show_progress = show_progress
        self.callback = callback
        self.factors_store = factors_store

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y=None, *, X_val=None):
        """Factorise the observed ratings.

        Parameters
        ----------
        X : scipy.sparse matrix, (users, items, ratings) tuple or dmp ratings store
            Observed ratings of shape (n_users, n_items): every *stored* entry of a sparse
            matrix is a rating (explicit zeros included).  Duplicate (user, item) pairs are
            an error.  A store (`dmp.io.open_dataset`) is read by the workers, and its
            ``valid`` split, if any, gives ``valid_rmse``.
        y : None
            Ignored.
        X_val : same kinds as X, optional
            Validation ratings (same shape) for ``history_["valid_rmse"]``.

        Returns
        -------
        self
        """
        return self._fit(X, X_val=X_val)

    _is_dataset = staticmethod(_is_ratings_dataset)

    def _check_fit(self, fit):
        self._dtype()
        if self.factors_store is not None:
            _check_factors_store(self.factors_store)   # before the work, not after

    def _prepare_store(self, fit):
        if fit.X_val is not None:
            raise ValueError("X_val must be None when X is a dmp ratings store (its "
                             "'valid' split is used)")
        return fit.X

    def _prepare_in_memory(self, fit):
        u, i, r, shape = _as_triplets(fit.X, "X")
        valid = None
        if fit.X_val is not None:
            vu, vi, vr, vshape = _as_triplets(fit.X_val, "X_val")
            if shape is None and vshape is None:
                shape = (int(max(u.max(initial=-1), vu.max(initial=-1))) + 1,
                         int(max(i.max(initial=-1), vi.max(initial=-1))) + 1)
            shape = shape or vshape
            if vshape is not None and tuple(vshape) != tuple(shape):
                raise ValueError(f"X_val has shape {vshape}, X has shape {shape}")
            _check_validation(vu, vi, vr, shape)
            valid = (vu, vi, vr)

        def write(tmp):
            uu, ii, rr, codes = u, i, r, np.zeros(len(r), np.int8)
            if valid is not None:   # stored as the 'valid' split
                uu, ii, rr = (np.concatenate([a, b]) for a, b in zip((u, i, r), valid))
                codes = np.concatenate([codes, np.ones(len(valid[2]), np.int8)])
            return write_ratings(f"{tmp}/ratings.zarr", uu, ii, rr, shape=shape, split=codes)

        return InMemoryData(
            local=lambda: InMemoryRatingsDataset((u, i, r), valid=valid, shape=shape),
            write=write,
            content=((u, i, r), valid, None if shape is None else tuple(shape)))

    def _make_program(self, fit):
        n_users, n_items = fit.dataset.shape
        if fit.dataset.nnz < 1:
            raise ValueError("X holds no ratings")
        k = int(self.n_components)
        if self.method in ("ccd", "als"):
            bs = (auto_block_size(k, n_users, n_items) if self.block_size == "auto"
                  else min(int(self.block_size), k))
        else:
            bs = 1
        return MFProgram(fit.dataset, n_components=k, alpha=self.alpha, method=self.method,
                         n_inner=self.n_inner, cg_steps=self.cg_steps, block_size=bs,
                         center=self.center, dtype=self._dtype(),
                         reg_scaling=self.reg_scaling, tol=self.tol,
                         seed=seed_from(self.random_state))

    def _fingerprint(self, fit):
        out = {"method": self.method, "n_components": int(self.n_components),
               "alpha": float(self.alpha), "block_size": fit.program.block_size}
        if self.method == "als":
            out["cg_steps"] = int(self.cg_steps)
        if self._dtype() != np.float64:
            out["dtype"] = str(self._dtype())
        return out

    def _dtype(self) -> np.dtype:
        dtype = np.dtype(self.dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype}")
        if dtype != np.float64 and self.method == "ccd++":
            raise ValueError(f"dtype={dtype} needs method 'als' or 'ccd' (CCD++ computes in "
                             f"float64)")
        return dtype

    def _run_options(self, fit):
        program, per_iter = fit.program, fit.program.rounds_per_iter

        def collect(backend):
            # part of the fit: a worker lost meanwhile is recovered like one lost in a
            # round, and the factors come over in pieces (no copy of a whole block)
            if self.factors_store is not None:
                return self._save_factors(backend, program)
            return self._gather_factors(backend, program, *fit.dataset.shape,
                                        int(self.n_components))

        # CCD++'s partitions solve each item update themselves (the driver only keeps the
        # score): on Dask a batch of rounds runs while the one before is scored, with the
        # same factors
        staleness = int(self.method == "ccd++" and fit.backend.overlaps_rounds)
        return {"max_iter": 1 + self.max_iter * per_iter, "staleness": staleness,
                "checkpoint_every": self.checkpoint_every * per_iter, "collect": collect}

    def _set_fitted(self, fit, result):
        self.user_factors_, self.item_factors_ = result.collected
        self.mean_ = float(fit.program.driver["mean"])
        self.n_users_, self.n_items_ = (int(s) for s in fit.dataset.shape)
        self.n_iter_ = int(math.ceil(max(result.n_rounds - 1, 0)
                                     / fit.program.rounds_per_iter))
        self.objective_ = float(fit.program.driver["objective"])
        self.block_size_ = fit.program.block_size
        if not np.isfinite(self.objective_):
            raise FloatingPointError("MatrixFactorization diverged (non-finite objective)")

    def _convergence_warning(self, fit, result):
        if not result.converged and self.tol is not None and self.n_iter_ >= self.max_iter:
            return (f"MatrixFactorization stopped after max_iter={self.max_iter} iterations "
                    f"before the objective stopped improving by tol; increase max_iter")

    @staticmethod
    def _gather_factors(backend, program, n_users, n_items, k):
        """W and H assembled on the driver from the partitions' rows, piece by piece."""
        W = np.zeros((n_users, k), program.dtype)
        H = np.zeros((n_items, k), program.dtype)
        specs = program.partition_specs(backend.n_partitions)
        target = {"W": (W, [sp["rows"][0] for sp in specs]),
                  "H": (H, [sp["cols"][0] for sp in specs])}

        def sink(part, name, row, piece):
            F, starts = target[name]
            s = starts[part] + row
            F[s:s + len(piece)] = piece

        backend.collect_stream(sink, method="factor_arrays")
        return W, H

    def _save_factors(self, backend, program):
        """Workers write their factor rows into a temporary store, renamed when complete;
        return the factors as dask arrays over it."""
        import uuid

        import dask.array as da
        import zarr

        path = os.path.abspath(os.fspath(self.factors_store))
        clean_stale_partials(path)   # left by fits that were killed while writing it
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            zarr.open_group(tmp, mode="w", zarr_format=3)
            mark_partial(tmp)
            parts = sorted(backend.call_all("save_factors", tmp))
            g = zarr.open_group(tmp, mode="a", zarr_format=3)
            g.attrs.update({"mean": float(program.driver["mean"]), "n_partitions": len(parts),
                            "user_starts": [p[1] for p in parts],
                            "item_starts": [p[3] for p in parts], "complete": True})
            unmark_partial(tmp)
            if os.path.exists(path):
                _check_factors_store(path)
                shutil.rmtree(path)
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        W = da.concatenate([da.from_zarr(path, component=f"W/{p[0]:05d}") for p in parts])
        H = da.concatenate([da.from_zarr(path, component=f"H/{p[0]:05d}") for p in parts])
        return W, H

    # ------------------------------------------------------------------ prediction
    def _check_ids(self, ids, n, what):
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional, got shape {ids.shape}")
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            if not np.all(np.isfinite(ids)) or np.any(ids != np.round(ids)):
                raise ValueError(f"{what} must be integer indices")
        ids = ids.astype(np.int64)
        bad = (ids < 0) | (ids >= n)
        if bad.any():
            raise ValueError(f"{what} out of range [0, {n}): {ids[bad][:5].tolist()}")
        return ids

    def predict(self, user_ids, item_ids):
        """Predicted ratings ``mean_ + w_u . h_i`` for pairs ``(user_ids[t], item_ids[t])``.

        Users or items without training ratings get ``mean_`` (their factors are 0 when
        ``alpha > 0``)."""
        check_is_fitted(self)
        u = self._check_ids(user_ids, self.n_users_, "user_ids")
        i = self._check_ids(item_ids, self.n_items_, "item_ids")
        if len(u) != len(i):
            raise ValueError(f"user_ids and item_ids differ in length ({len(u)} != {len(i)})")
        W, H = self.user_factors_, self.item_factors_
        if isinstance(W, np.ndarray):
            return kernels.predict_pairs(W, H, u, i, self.mean_)
        # dask arrays over a factors store: read the needed rows here, batch by batch, with
        # the threaded scheduler (not on the cluster: a batch may hold most of the model)
        import dask

        out = np.empty(len(u))
        batch = max(1, (256 << 20) // (16 * W.shape[1]))
        for s in range(0, len(u), batch):
            uu, ui = np.unique(u[s:s + batch], return_inverse=True)
            ii, ij = np.unique(i[s:s + batch], return_inverse=True)
            Wb, Hb = dask.compute(W[uu], H[ii], scheduler="threads")
            out[s:s + batch] = kernels.predict_pairs(np.asarray(Wb), np.asarray(Hb), ui, ij,
                                                     self.mean_)
        return out

    def score(self, X, y=None):
        """Negative root-mean-square error on the ratings in ``X`` (higher is better).

        ``X``: a sparse matrix, a (users, items, ratings) tuple, or a ratings store (its
        ``test`` split, else ``valid``)."""
        check_is_fitted(self)
        if _is_ratings_dataset(X):
            split = "test" if "test" in X.splits else ("valid" if "valid" in X.splits
                                                       else "train")
            u, i, r = X.to_coo(split)
        else:
            u, i, r, shape = _as_triplets(X, "X")
            model = (self.user_factors_.shape[0], self.item_factors_.shape[0])
            # a matrix built without shape= is as large as its largest ids: smaller is fine
            if shape is not None and (shape[0] > model[0] or shape[1] > model[1]):
                raise ValueError(f"X has shape {tuple(shape)}, the model was fitted on "
                                 f"{model[0]} users x {model[1]} items")
        r = np.asarray(r, dtype=np.float64)
        if r.size == 0:
            raise ValueError("X holds no ratings to score")
        if not np.all(np.isfinite(r)):
            raise ValueError("X contains NaN or infinite ratings")
        pred = self.predict(u, i)
        return -float(np.sqrt(np.mean((r - pred) ** 2)))

    def objective(self, X):
        """The training objective of the fitted factors on ratings ``X`` (checks the fit)."""
        check_is_fitted(self)
        if _is_ratings_dataset(X):
            u, i, r = X.to_coo("train")
        else:
            u, i, r, _ = _as_triplets(X, "X")
        e = np.asarray(r, float) - self.predict(u, i)
        W, H = self.user_factors_, self.item_factors_
        if self.reg_scaling == "count":
            cu = np.bincount(np.asarray(u), minlength=len(W))
            ci = np.bincount(np.asarray(i), minlength=len(H))
            reg = cu @ (W * W).sum(1) + ci @ (H * H).sum(1)
        else:
            reg = (W * W).sum() + (H * H).sum()
        return float(e @ e + self.alpha * reg)

    def plot(self, ax=None):
        """Objective and RMSE against time (needs matplotlib)."""
        check_is_fitted(self)
        import matplotlib.pyplot as plt

        h = self.history_
        if ax is None:
            _, ax = plt.subplots(1, 2, figsize=(10, 4))
        t = np.asarray(h["time"], float)
        # a raw objective that moves by a few percent draws a flat line on a log axis
        ax[0].plot(t, np.asarray(h["objective"], float))
        ax[0].set_xlabel("time in the round loop (s)")
        ax[0].set_ylabel("objective")
        for key in ("train_rmse", "valid_rmse"):
            v = np.asarray(h[key], float)
            if np.isfinite(v).any():
                ax[1].plot(t, v, label=key.replace("_", " "))
        ax[1].set_xlabel("time in the round loop (s)")
        ax[1].set_ylabel("RMSE")
        ax[1].legend()
        return ax
