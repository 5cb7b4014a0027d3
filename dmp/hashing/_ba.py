"""The binary autoencoder trained by ParMAC: a scikit-learn style estimator."""

from __future__ import annotations

import math
import warnings
import numbers

import numpy as np
from sklearn.base import TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_array, check_is_fitted

from ..base import DMPEstimator, InMemoryData, computed
from ..engine.runner import history_arrays
from ..io.dense import (DenseDataset, InMemoryDenseDataset, _check_dense, append_dense_shard,
                        write_dense)
from ..io.sparse import _is_dask, check_allocation
from ..utils.estimator import seed_from
from ..utils.text import plural, shown
from ._parmac import ParMACProgram
from ._retrieval import euclidean_neighbors, pack_codes

#: the validation database is at most this many points (the ground truth is exact k-NN)
VALIDATION_DB_MAX = 20000


def _write_points(folder, X, extra, n_shards):
    """Write the points ``X`` (``n_shards`` shards) and each array of ``extra`` (one shard
    each) to a store in ``folder`` the workers read; return it."""
    ds = write_dense(f"{folder}/points.zarr", X, n_shards=n_shards)
    for Xa in extra:
        ds = append_dense_shard(ds, Xa)
    return ds


def _check_points(X, estimator: str, n_features: int | None = None,
                  min_samples: int = 0) -> np.ndarray:
    """In-memory points as float32, refused with scikit-learn's words where it has them
    (sparse or complex data, fewer than ``min_samples``, a 1-D array, no samples or
    features, a width other than the fitted one) and `dmp.io.dense`'s otherwise
    (non-finite values, also in float32)."""
    X = check_array(computed(X), accept_sparse=False, dtype="numeric",
                    ensure_all_finite=False, ensure_2d=False, allow_nd=True,
                    ensure_min_samples=min_samples, ensure_min_features=0,
                    estimator=estimator)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (points x features), got shape {X.shape}. Reshape "
                         f"your data with X.reshape(1, -1) if it holds one point")
    if 0 in X.shape:
        what = "feature" if X.shape[1] == 0 else "sample"
        raise ValueError(f"X is empty: found 0 {what}(s) (shape={X.shape}) while a minimum of 1 "
                         f"is required.")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"X has {X.shape[1]} features, but {estimator} is expecting "
                         f"{n_features} features as input")
    return _check_dense(X)


class BinaryAutoencoder(TransformerMixin, DMPEstimator):
    """Binary autoencoder hashing trained by ParMAC (model parallelism on a ring).

    The hash function ``h(x) = step(A x + a)`` maps points to ``n_bits``-bit codes; a linear
    decoder ``f(z) = B z + b`` reconstructs them.  Both are trained by the method of
    auxiliary coordinates: the codes ``Z`` of the training points are free variables,
    coupled to ``h(X)`` by a penalty ``mu`` that grows geometrically; W steps train the
    encoder's SVM units (SGD, travelling round the ring of workers) and the decoder, Z steps
    update the codes of every worker's own points.  Initialised from ITQ.

    Parameters
    ----------
    n_bits : int, default 16
        Code length ``L`` (at most the number of features).
    n_epochs : int, default 2
        Passes over the data per W step (``e``): SGD epochs, or DCD passes with
        ``w_step="dcd"``.
    mu0, mu_factor : float, default 1e-3, 1.5
        Penalty schedule ``mu_i = mu0 * mu_factor ** i`` (on data scaled to [0, 1]).
    max_iter : int, default 30
        MAC iterations at most; the fit stops earlier when ``Z = h(X)``.
    batch_size : int, default 32
    alpha : float, default 1e-4
        L2 weight of the SGD SVM units (and of the SGD decoder).
    w_step : {"sgd", "dcd"}, default "sgd"
        How the W step trains the encoder's linear SVMs (one per bit).  "sgd": ``n_epochs``
        passes of minibatch SGD on the hinge loss, the units warm-started from the last W
        step.  "dcd": ``n_epochs`` passes of dual coordinate descent (LIBLINEAR's solver) on
        the L2-loss SVM with penalty ``C``, on centred and whitened inputs (the hash stays a
        linear threshold function of the raw input); each point's duals live with the point
        on its worker, the weights travel round the ring as with SGD, so P workers run the
        same cyclic dual coordinate descent as one, and the duals are warm-started from the
        last W step (those of code bits the Z step flipped are reset).  Nearly exact SVMs
        after a few passes.
    C : float, default 1.0
        Penalty of the "dcd" SVMs' squared hinge loss, summed over the points.
    decoder : {"exact", "sgd"}, default "exact"
        Solve the decoder from summed normal equations, or train it by SGD on the ring.
    z_method : {"auto", "enumerate", "alternate"}, default "auto"
        Z step: exhaustive search (``n_bits <= 16``) or alternating bit optimisation;
        "auto" enumerates up to 10 bits.
    itq_iter : int, default 50
        ITQ rotations of the initialisation.
    init_margin : float or None, default None
        Scale the ITQ hyperplanes that start the encoder so that each bit's ``A x + a``
        has this standard deviation on the (scaled) training points (the codes do not
        change, only the start of the SVMs' SGD).  With unit-norm ITQ directions (None)
        nearly every point sits inside the SVMs' unit margin and the first W step's SGD,
        far from converged, loses a third of the ITQ codes on image patches; 10 keeps
        nearly all of them.  It did not improve the final precision on any data set tried
        (BENCHMARKS.md, "Binary autoencoder against ITQ on real images"), hence the default
        None.
    n_iter_no_change : int or None, default None
        Early stopping: end the fit when the validation precision has not improved for
        this many MAC iterations (None: run until ``Z = h(X)`` or ``max_iter``).
    validation_size : int, default 200
        Held-out training points used as queries of the validation check (0: none).  Their true neighbours are
        searched in up to 20,000 other training points; the result is the model with the
        best validation precision (the ITQ initialisation included).
    code_format : {"packed", "bool"}, default "packed"
        What `transform` returns: codes packed 8 bits per byte (uint8, for
        `hamming_search`) or a boolean array (points x bits).
    backend, n_workers, random_state, show_progress, callback
        As for the other dmp estimators.

    Attributes
    ----------
    coef_ : ndarray (n_bits, n_features); intercept_ : ndarray (n_bits,)
        The hash function on raw inputs: bit ``l`` is ``coef_[l] @ x + intercept_[l] > 0``.
    decoder_coef_ : ndarray (n_features, n_bits); decoder_intercept_ : ndarray (n_features,)
        ``inverse_transform``: ``x = decoder_coef_ @ z + decoder_intercept_``.
    iteration_history_ : dict of arrays
        Per MAC iteration: ``iteration``, ``mu``, ``E_BA`` (mean ``||x - f(h(x))||^2`` on
        the scaled data, after the W step), ``penalty_w`` (``||Z - h(X)||^2`` after the W
        step: code bits the encoder fails to fit), ``E_Q`` and ``penalty`` (``||Z - h(X)||^2``,
        after the Z step), ``changed`` (code bits the Z step flipped), ``precision``
        (validation), ``w_s``/``z_s`` (seconds), ``bytes_ring`` (submodels handed round),
        ``bytes_driver`` (everything through the driver), ``identical`` (all workers held
        the same submodels after the W step).
    round_history_ : dict of arrays
        Per engine round (what the other estimators call ``history_``).
    history_ : dict of arrays
        Deprecated: ``iteration_history_`` with a `FutureWarning`.  In dmp 0.2 ``history_``
        becomes the per-round history, as in every other dmp estimator.
    n_iter_ : int
    stop_reason_ : str
        "Z = h(X)", "schedule ended" or "validation precision stopped improving".
    best_iteration_ : int
        The iteration whose model was kept (-1: the ITQ initialisation).
    validation_precision_ : float
    recoveries_ : list of dict
    n_features_in_ : int
    """

    #: the kinds of dmp store it fits (`dmp.io.sparse.STORE_KINDS`)
    _store_kinds = ("dense-rows",)
    _rounds_attribute = "round_history_"
    _scratch_kind = "ba"

    _parameter_constraints: dict = {
        **DMPEstimator._parameter_constraints,
        "n_bits": [Interval(numbers.Integral, 1, None, closed="left")],
        "n_epochs": [Interval(numbers.Integral, 1, None, closed="left")],
        "mu0": [Interval(numbers.Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "mu_factor": [Interval(numbers.Real, 1, None, closed="left")],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "batch_size": [Interval(numbers.Integral, 1, None, closed="left")],
        "alpha": [Interval(numbers.Real, 0, None, closed="left")],
        "w_step": [StrOptions({"sgd", "dcd"})],
        "C": [Interval(numbers.Real, 0, None, closed="neither")],
        "decoder": [StrOptions({"exact", "sgd"})],
        "z_method": [StrOptions({"auto", "enumerate", "alternate"})],
        "itq_iter": [Interval(numbers.Integral, 0, None, closed="left")],
        "init_margin": [Interval(numbers.Real, 0, None, closed="neither"), None],
        "n_iter_no_change": [Interval(numbers.Integral, 1, None, closed="left"), None],
        "validation_size": [Interval(numbers.Integral, 0, None, closed="left")],
        "code_format": [StrOptions({"packed", "bool"})],
    }

    def __init__(self, n_bits=16, *, n_epochs=2, mu0=1e-3, mu_factor=1.5, max_iter=30,
                 batch_size=32, alpha=1e-4, w_step="sgd", C=1.0, decoder="exact", z_method="auto", itq_iter=50,
                 init_margin=None, n_iter_no_change=None, validation_size=200, code_format="packed", backend="auto",
                 n_workers=None,
                 random_state=None, show_progress=False, callback=None):
        self.n_bits = n_bits
        self.n_epochs = n_epochs
        self.mu0 = mu0
        self.mu_factor = mu_factor
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.alpha = alpha
        self.w_step = w_step
        self.C = C
        self.decoder = decoder
        self.z_method = z_method
        self.itq_iter = itq_iter
        self.init_margin = init_margin
        self.n_iter_no_change = n_iter_no_change
        self.validation_size = validation_size
        self.code_format = code_format
        self.backend = backend
        self.n_workers = n_workers
        self.random_state = random_state
        self.show_progress = show_progress
        self.callback = callback

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = []   # transform gives codes (uint8 or bool)
        return tags

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y=None, *, arrivals=None):
        """Train the hash function on the points X.

        Parameters
        ----------
        X : ndarray or dask array (points x features), or a `dmp.io.DenseDataset`
            Finite values.  Stored datasets are read by the workers, shard by shard.
        y : None
            Ignored.
        arrivals : dict, optional
            Streaming: ``{iteration: points}`` (arrays; for a stored dataset ``{iteration:
            [shard, ...]}``, shards held back until then), data that joins the ring at the
            start of that MAC iteration.

        Returns
        -------
        self
        """
        return self._fit(X, arrivals=arrivals or {})

    def _is_dataset(self, X):
        return isinstance(X, DenseDataset)

    def _check_bits(self, n_features: int) -> None:
        if n_features < self.n_bits:
            raise ValueError(f"n_bits={self.n_bits} exceeds the {plural(n_features, 'feature')} "
                             f"(n_features={n_features}): the decoder and the ITQ "
                             f"initialisation need n_bits <= n_features")

    def _check_fit(self, fit):
        late = sorted(i for i in fit.arrivals if isinstance(i, numbers.Integral)
                      and not isinstance(i, bool) and i >= self.max_iter)
        if late:
            raise ValueError(f"arrivals at MAC iterations {late} would never join: the fit "
                             f"runs iterations 0 to {self.max_iter - 1} (max_iter="
                             f"{self.max_iter})")
        # before reading a store or a dask array (in-memory points: once they are valid)
        if ((self._is_dataset(fit.X) or _is_dask(fit.X)) and len(fit.X.shape) == 2
                and fit.X.shape[1] >= 1):
            self._check_bits(int(fit.X.shape[1]))
        if self.z_method == "enumerate" and self.n_bits > 16:
            raise ValueError(f"z_method='enumerate' searches 2^n_bits codes per point; use "
                             f"'alternate' for n_bits={self.n_bits} (> 16)")

    def _prepare_store(self, fit):
        fit.held = {int(i): [int(k) for k in ks] for i, ks in fit.arrivals.items()}
        for ks in fit.held.values():
            for k in ks:
                if not 0 <= k < fit.X.n_shards:
                    raise ValueError(f"arrival shard {k} out of range: the dataset has "
                                     f"{plural(fit.X.n_shards, 'shard')}")
        return fit.X

    def _prepare_in_memory(self, fit):
        X, P, fit.held = fit.X, fit.n_partitions, {}
        if _is_dask(X) and fit.backend.needs_store and not fit.arrivals:
            # the workers read a store written block by block: X never lands whole here
            if len(X.shape) != 2 or X.shape[0] < P:
                raise ValueError(f"X must be 2-D with at least {P} points (one per worker), "
                                 f"got shape {X.shape}")
            return InMemoryData(local=None, write=lambda tmp: _write_points(tmp, X, [], P))
        X = _check_points(X, type(self).__name__, min_samples=2)   # a hash needs variation
        self._check_bits(X.shape[1])
        parts = [X]
        for i, Xa in sorted(fit.arrivals.items()):
            if isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 1:
                raise ValueError(f"arrivals keys are MAC iterations >= 1, got {shown(i)}")
            fit.held[int(i)] = [P + len(parts) - 1]
            parts.append(_check_dense(computed(Xa), f"arrivals[{i}]", X.shape[1]))
        self._check_split(X.shape[0], "point", P)
        bounds = list(np.linspace(0, X.shape[0], P + 1).round().astype(np.int64))
        for Xa in parts[1:]:
            bounds.append(bounds[-1] + Xa.shape[0])
        return InMemoryData(
            local=lambda: InMemoryDenseDataset(np.concatenate(parts) if len(parts) > 1 else X,
                                               row_bounds=bounds),
            write=lambda tmp: _write_points(tmp, X, parts[1:], P))

    def _validation_set(self, ds, held, seed):
        """Validation queries, database and true neighbours, read on the driver from the
        initial shards (None when the data is too small or ``validation_size`` is 0)."""
        q = int(self.validation_size)
        held_shards = {k for ks in held.values() for k in ks}
        # the row numbers come from the store's metadata: a hostile size is refused first
        check_allocation(8 * int(ds.n_samples), f"{getattr(ds, 'path', None)!r}: the row "
                         f"numbers of {ds.n_samples:,} points")
        rows = np.concatenate([np.arange(ds.row_bounds[k], ds.row_bounds[k + 1])
                               for k in range(ds.n_shards) if k not in held_shards])
        if q == 0 or len(rows) < 2 * q + 10:
            return None
        rng = np.random.default_rng([seed, 5])
        pick = rng.permutation(rows)[:q + min(VALIDATION_DB_MAX, len(rows) - q)]
        pick_sorted = np.sort(pick)
        pts = ds.load_points(pick_sorted).astype(np.float64)
        pts = pts[np.searchsorted(pick_sorted, pick)]
        Q, Db = pts[:q], pts[q:]
        k = min(len(Db), max(10, int(0.002 * len(Db))))
        return Q, Db, euclidean_neighbors(Q, Db, k)

    def _make_program(self, fit):
        ds = fit.dataset
        seed = seed_from(self.random_state)
        return ParMACProgram(
            ds, n_bits=self.n_bits, n_epochs=self.n_epochs, mu0=self.mu0,
            mu_factor=self.mu_factor, max_mac_iter=self.max_iter, batch_size=self.batch_size,
            alpha=self.alpha, decoder=self.decoder, z_method=self.z_method,
            itq_iter=self.itq_iter, init_margin=self.init_margin, w_step=self.w_step,
            C=self.C, n_iter_no_change=self.n_iter_no_change,
            validation=self._validation_set(ds, fit.held, seed), arrivals=fit.held, seed=seed)

    def _run_options(self, fit):
        return {"max_iter": fit.program.max_rounds(fit.n_partitions)}

    def _set_fitted(self, fit, result):
        dr = fit.program.driver
        model = dr["best"] if dr.get("best") is not None else dr["model"]
        if model is None:
            raise RuntimeError(
                f"{type(self).__name__}: the callback stopped the fit after round "
                f"{len(result.history) - 1}, before the ITQ initialisation had made a model; "
                f"nothing was fitted (stop it only after the rounds whose record's "
                f"'phase' is 'stats' or 'itq')")
        lo, scale = dr["lo"], dr["scale"]
        # fold the [0, 1] scaling into the raw-input hash function and decoder
        self.coef_ = model["A"] / scale
        self.intercept_ = model["a"] - self.coef_ @ lo
        self.decoder_coef_ = model["B"] * scale
        self.decoder_intercept_ = model["b"] * scale + lo
        self.n_features_in_ = int(fit.dataset.n_features)
        self.n_iter_ = int(dr["iteration"])
        self.stop_reason_ = dr["stop_reason"]
        self.best_iteration_ = int(dr.get("best_iteration", dr["iteration"] - 1))
        self.validation_precision_ = float(dr.get("best_prec", math.nan))
        self.iteration_history_ = self._iteration_history(dr["records"], result.history)
        self.n_workers_ = fit.n_partitions
        self.n_samples_fit_ = int(dr["n"])

    @staticmethod
    def _iteration_history(records, rounds) -> dict:
        """One entry per MAC iteration: the driver's records plus the engine's timings and
        bytes of the rounds that belonged to it (a recovered iteration counts once)."""
        out = []
        for rec in records:
            it = rec["iteration"]
            mine = [r for r in rounds if r.get("iteration") == it
                    and r.get("phase") in ("hop", "spread", "check", "z")]
            row = dict(rec)
            row["bytes_ring"] = sum(r["bytes_ring"] for r in mine)
            row["bytes_driver"] = sum(r["bytes_push"] + r["bytes_pull"] + r["bytes_schedule"]
                                      for r in mine)
            row["w_rounds_s"] = sum(r["round_s"] for r in mine
                                    if r["phase"] in ("hop", "spread"))
            out.append(row)
        return history_arrays(out)

    @property
    def history_(self) -> dict:
        """Deprecated alias of `iteration_history_` (per MAC iteration)."""
        history = self.iteration_history_   # AttributeError before fit, as for any `_` attribute
        warnings.warn(
            "BinaryAutoencoder.history_ holds one record per MAC iteration; in dmp 0.2 it "
            "becomes the per-round history, as in the other dmp estimators. Read "
            "iteration_history_ (per MAC iteration) or round_history_ (per round) instead.",
            FutureWarning, stacklevel=2)
        return history

    # ------------------------------------------------------------------ codes
    def _bits(self, X) -> np.ndarray:
        check_is_fitted(self, "coef_")
        X = _check_points(X, type(self).__name__, self.n_features_in_).astype(np.float64)
        return (X @ self.coef_.T + self.intercept_) > 0

    def transform(self, X):
        """Binary codes ``h(x)`` of the points X: packed uint8 (points x ceil(bits/8),
        bit ``l`` of a point in byte ``l // 8``, least significant first) or a boolean
        array (points x bits), as ``code_format`` says."""
        bits = self._bits(X)
        if self.code_format == "bool":
            return bits
        return pack_codes(bits.astype(np.uint8))

    def inverse_transform(self, codes):
        """Reconstructions ``f(z)`` of codes (packed uint8 as `transform` gives, or 0/1
        points x bits)."""
        from ._retrieval import unpack_codes

        check_is_fitted(self, "coef_")
        Z = np.asarray(codes)
        L = self.coef_.shape[0]
        if Z.ndim == 2 and Z.dtype == np.uint8 and Z.shape[1] == -(-L // 8) and L != \
                Z.shape[1]:
            Z = unpack_codes(Z, L)
        if Z.ndim != 2 or Z.shape[1] != L:
            raise ValueError(f"codes must be (points, {L}) bits or packed (points, "
                             f"{-(-L // 8)}) bytes, got shape {Z.shape}")
        return Z.astype(np.float64) @ self.decoder_coef_.T + self.decoder_intercept_

    def plot(self):
        """E_BA, validation precision and W/Z-step seconds per MAC iteration (a matplotlib
        figure)."""
        from ..plotting import plot_parmac

        check_is_fitted(self, "coef_")
        return plot_parmac(self.iteration_history_)
