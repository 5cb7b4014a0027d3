"""Independently sparsified distributed gradient methods as a push / pull Program.

Problem (docs/algorithms.md, "Problem and sparsifier"): ``min_x sum_i w_i f_i(x) + R(x)``
where worker ``i`` owns ``l_i`` rows, ``f_i`` is the mean loss over them, ``w_i = l_i / N`` and
``R(x) = alpha (l1_ratio |x|_1 + (1 - l1_ratio) / 2 |x|^2)`` (the intercept is not
penalised).  The coordinates are split into ``m`` contiguous blocks.

Every round each worker computes its local estimate on resident rows, draws ``tau`` of the
``m`` blocks *independently* (tau-nice, seeded by (seed, worker, round)) and uploads only those
blocks (values plus int32 block ids; no ids when ``tau = m``).  The driver scales them by
``m / tau`` (unbiased), forms the estimator of the method, takes a proximal step and
broadcasts the new point (only the changed blocks when that is smaller).

* ``isgd``  : g = sum_i w_i (m/tau) grad_i[S_i]; exact local gradients (``batch_size=None``)
  or minibatch stochastic ones.
* ``isega`` : shifts h_i on the workers, h = sum_i w_i h_i on the driver;
  g = h + sum_i w_i (m/tau) (grad_i - h_i)[S_i]; h_i[S_i] <- grad_i[S_i].
* ``isaga`` : SAGA memory per row and block (one scalar per row and block for a linear
  model); g = a + sum_i w_i (m/tau) delta_i, a += sum_i w_i (b / l_i) delta_i.
* ``iasgd`` : the isgd estimator evaluated at an extrapolated point y (momentum):
  x+ = prox(y - step g(y)), y+ = x+ + beta (x+ - x).

Round 0 is an initialisation round: every worker reports its row count and smoothness
constants and the loss at the starting point; the driver derives the step size from them.

Stopping: ISEGA with exact local gradients tests the gradient mapping at its iterate (exact
for tau = m; for tau < m from a CountSketch of the local gradients that the workers add to
their upload four times per epoch of blocks), the other methods the objective's progress over
a window of evaluations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..engine.program import Broadcast, DriverState, Message, Program, unexpected
from ..kernels import sparsify as kernels

METHODS = ("isgd", "isega", "isaga", "iasgd")
_LOSS_IDS = {"squared_error": kernels.SQUARED, "log_loss": kernels.LOGISTIC}
# curvature bound of the loss in the margin: squared 1, logistic 1/4
_LOSS_CURVATURE = {"squared_error": 1.0, "log_loss": 0.25}
#: an objective this many times the one the fit started from: the iterates diverge
DIVERGENCE_FACTOR = 1e4
#: rows of the CountSketch of the local gradients that ISEGA's stopping check uploads
SKETCH_SIZE = 8
#: sketched checks (one every ceil(m / 4 tau) rounds) averaged by ISEGA's stopping test, at
#: most one epoch of blocks' worth: the gradient norm at the iterate fluctuates with the
#: sparsification noise, and so does one sketch
CHECKS_AVERAGED = 4


def block_bounds(n_coords: int, n_blocks: int) -> np.ndarray:
    """Boundaries of ``n_blocks`` contiguous blocks of nearly equal size."""
    return np.linspace(0, n_coords, n_blocks + 1).round().astype(np.int64)


#: a partition at least this dense forms its Gram matrix from dense row blocks (BLAS): the
#: sparse product costs ~10 ns per pair of a row's values, 50x the dense one on dense rows
_DENSE_GRAM_DENSITY = 0.05
#: values per dense block (8 MB)
_DENSE_BLOCK_VALUES = 1 << 20


def _full_rows(A):
    """The values of a CSR matrix that stores every entry of every row in column order (dense
    input, `dmp.linear_model._dense.dense_to_compressed`) as an n x d array (a view), else
    None."""
    if A.format != "csr":
        return None
    n, d = A.shape
    if A.nnz != n * d or not A.has_canonical_format:
        return None
    # canonical (sorted, no duplicates) with d entries in every row: columns 0 .. d-1
    return A.data.reshape(n, d)


def _rows(s) -> np.ndarray:
    """A partition's rows as an array (a view of its CSR values; ``s["full"]``)."""
    return s["data"].reshape(s["l"], s["A"].shape[1])


def _dense_gram(A, outer: bool) -> np.ndarray:
    """``A^T A`` (``outer=False``) or ``A A^T`` of a sparse ``A`` from dense blocks of rows
    (of columns for ``A A^T``) of at most `_DENSE_BLOCK_VALUES` values."""
    if outer:
        A = A.T
    A = A.tocsr()
    n, d = A.shape
    out = np.zeros((d, d))
    step = max(1, _DENSE_BLOCK_VALUES // max(d, 1))
    # rows stored whole are their own dense blocks (views; densifying a copy of each block
    # cost most of a small dense fit's setup, in fresh pages)
    full = _full_rows(A)
    for start in range(0, n, step):
        B = A[start:start + step].toarray() if full is None else full[start:start + step]
        out += B.T @ B
    return out


def max_eigenvalue_gram(A, fit_intercept: bool) -> float:
    """Largest eigenvalue of ``[A 1]^T [A 1]`` (without the ones column if no intercept)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import LinearOperator, eigsh

    n, d = A.shape
    D = d + int(fit_intercept)
    if n == 0:
        return 0.0
    if min(n, D) <= 600:
        # the small Gram matrix, from products that never densify A whole: a partition of
        # few rows and many features (or few features and many rows) would not fit the
        # worker densified; a dense one is densified block by block
        blocks = sp.issparse(A) and A.nnz >= _DENSE_GRAM_DENSITY * n * d
        if n < D:   # [A 1][A 1]^T = A A^T + 1 1^T
            small = _dense_gram(A, outer=True) if blocks else A @ A.T
            small = small.toarray() if sp.issparse(small) else np.asarray(small)
            if fit_intercept:
                small = small + 1.0
        else:       # [A 1]^T [A 1] = [[A^T A, A^T 1], [1^T A, n]]
            AtA = _dense_gram(A, outer=False) if blocks else A.T @ A
            AtA = AtA.toarray() if sp.issparse(AtA) else np.asarray(AtA)
            if fit_intercept:
                full = _full_rows(A) if sp.issparse(A) and d > 1 else None
                # (the rows summed in order, as scipy's sum does, without its product)
                col = (np.asarray(A.sum(axis=0)).ravel() if full is None
                       else full.sum(axis=0))
                small = np.empty((D, D))
                small[:d, :d], small[:d, d], small[d, :d], small[d, d] = AtA, col, col, n
            else:
                small = AtA
        return float(np.linalg.eigvalsh(small)[-1])

    def matvec(v):
        v = np.ravel(v)
        z = A @ v[:d] + (v[d] if fit_intercept else 0.0)
        out = np.empty(D)
        out[:d] = A.T @ z
        if fit_intercept:
            out[d] = z.sum()
        return out

    op = LinearOperator((D, D), matvec=matvec, dtype=np.float64)
    val = eigsh(op, k=1, which="LA", tol=1e-4, return_eigenvectors=False,
                v0=np.ones(D))
    return float(val[0]) * (1 + 1e-3)  # eigsh converges from below


@dataclass(frozen=True)
class InitPlan(Message):
    """Round 0: the shard's size, smoothness constants and loss at the start."""

    round: int


@dataclass(frozen=True)
class StepPlan(Message):
    """One iteration: upload the sampled blocks of the gradient (estimate)."""

    round: int
    #: also return the loss at the current point
    eval: bool
    #: also return a CountSketch of the local gradient (ISEGA's stopping check)
    sketch: bool = False


_PLANS = (InitPlan, StepPlan)


@dataclass
class SparsifiedDriver(DriverState):
    """The driver's state of `SparsifiedProgram`."""

    n_parts: int
    #: the iterate, the point the gradients are taken at (momentum) and the shifts' memory
    x: np.ndarray
    point: np.ndarray
    memory: np.ndarray
    #: iterations done
    k: int = 0
    step: float | None = None
    beta: float | None = None
    #: each worker's share of the data and its number of points (round 0)
    weights: list | None = None
    l: list | None = None
    #: smoothness constants (round 0)
    L: float | None = None
    L_w: float | None = None
    A: float | None = None
    objective: float | None = math.nan
    #: the objective at the point of the last iteration's gradients
    objective_at: float | None = None
    #: the objective at zero (divergence is judged against it); None for a warm start
    start: float | None = None
    best: float = math.inf
    bests: list = field(default_factory=list)
    converged: bool = False
    diverged: bool = False
    blocks_up: int = 0
    #: bytes each worker uploaded in the last round
    upload: list = field(default_factory=list)
    #: the workers' statistics of round 0
    stats: list | None = None
    #: ISEGA's stopping check: the estimate of the squared gradient-mapping norm of this
    #: round (None without a check) and those of the last checks
    grad_sq: float | None = None
    checks: list = field(default_factory=list)


class SparsifiedProgram(Program):
    """Driver and worker logic of the independently sparsified methods.

    Parameters
    ----------
    dataset : row dataset (``dmp.io.SparseRowDataset`` or the in-memory equivalent)
    loss : {"squared_error", "log_loss"}
    labels : tuple (negative, positive) or None
        For ``log_loss``: stored targets equal to ``positive`` become +1, the others -1.
    method, alpha, l1_ratio, fit_intercept, n_blocks, tau, batch_size, step_size,
    momentum, tol, n_iter_no_change, eval_every, seed : see the estimators.
    x0 : array or None
        Starting point (warm start), length ``n_features + fit_intercept``.
    """

    name = "sparsified"
    primary_metric = "objective"
    primary_direction = "min"
    gather_partitions = False  # the model lives on the driver

    def __init__(self, dataset, *, loss, labels, method, alpha, l1_ratio, fit_intercept,
                 n_blocks, tau, batch_size, step_size, momentum, tol, n_iter_no_change,
                 eval_every, seed, x0=None):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        self.dataset = dataset
        self.loss = loss
        self.loss_id = _LOSS_IDS[loss]
        self.labels = labels
        self.method = method
        self.alpha = float(alpha)
        self.l1_ratio = float(l1_ratio)
        self.fit_intercept = bool(fit_intercept)
        self.n_features = int(dataset.shape[1])
        self.n_coords = self.n_features + int(self.fit_intercept)
        self.n_blocks = int(n_blocks)
        self.bounds = block_bounds(self.n_coords, self.n_blocks)
        self.tau = int(tau)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.step_size = step_size
        self.momentum = momentum
        self.tol = tol
        self.n_iter_no_change = int(n_iter_no_change)
        self.eval_every = int(eval_every)
        self.seed = int(seed)
        self.x0 = None if x0 is None else np.asarray(x0, dtype=np.float64)
        self.stochastic = method == "isaga" or batch_size is not None
        # The L2 part of R goes into every f_i (its gradient is sparsified with the data
        # gradient) rather than into the prox: then identical f_i have grad f_i(x*) = 0 and
        # ISGD converges without a floor, and with no L1 the broadcast is sparse.  ISAGA's
        # memory covers the data term only, so there it stays in the prox.
        self.l2 = self.alpha * (1.0 - self.l1_ratio)
        self.l2_in_f = method != "isaga"
        # ISEGA with exact local gradients converges to the optimum, so it stops on the
        # gradient mapping at its iterate (tau-independent); the others on the objective
        self.gradient_stop = method == "isega" and not self.stochastic
        r = self.n_blocks / self.tau
        self.check_every = max(1, math.ceil(r / 4 - 1e-9))

    # ================================================================== worker side
    def init_partition(self, spec):
        A, y = self.dataset.load_row_shards(spec["shards"])
        A = A.tocsr()
        if not A.has_sorted_indices:
            A.sort_indices()
        y = np.asarray(y, dtype=np.float64)
        if self.labels is not None:
            y = np.where(y == self.labels[1], 1.0, -1.0)
        # views of A's arrays where the dtypes already match (no second copy of the shard)
        s = {"k": int(spec["index"]), "indptr": A.indptr.astype(np.int64, copy=False),
             "indices": A.indices.astype(np.int32, copy=False),
             "data": A.data.astype(np.float64, copy=False),
             "y": y, "l": A.shape[0], "x": np.zeros(self.n_coords),
             "grad": np.zeros(self.n_coords), "A": A,
             # every row stored whole (dense input): the gradient kernels read them as an
             # array (`_rows`), with the same result
             "full": _full_rows(A) is not None}
        if self.x0 is not None:
            s["x"][:] = self.x0
        if self.method == "isega":
            s["shift"] = np.zeros(self.n_coords)
        if self.method == "isaga":
            s["table"] = np.zeros((s["l"], self.n_blocks))
            s["col_block"] = (np.searchsorted(self.bounds, np.arange(self.n_coords),
                                              side="right") - 1).astype(np.int64)
        return s

    def _local_stats(self, s):
        c = _LOSS_CURVATURE[self.loss]
        l = s["l"]
        L = c * max_eigenvalue_gram(s["A"], self.fit_intercept) / max(l, 1)
        sq = kernels.row_sq_norms(s["indptr"], s["data"], self.fit_intercept)
        extra = self.l2 if self.l2_in_f else 0.0
        return {"l": l, "L": L + extra, "L_point": c * float(sq.max(initial=0.0)) + extra}

    def _sample_blocks(self, k, round):
        if self.tau == self.n_blocks:
            return None
        return kernels.tau_nice(self.seed, 2 * k, round, self.n_blocks, self.tau)

    def push(self, s, plan):
        match plan:
            case InitPlan():
                out = self._local_stats(s)
                out["loss"] = (
                    kernels.loss_value_dense(_rows(s), s["y"], s["x"], self.loss_id,
                                             self.fit_intercept) if s["full"]
                    else kernels.loss_value(s["indptr"], s["indices"], s["data"], s["y"],
                                            s["x"], self.loss_id, self.fit_intercept))
                return out
            case StepPlan():
                return self._step(s, plan)
        raise unexpected(self, "a plan", plan, _PLANS)

    def _step(self, s, plan: StepPlan) -> dict:
        """The sampled blocks of the worker's gradient (estimate) at its current point."""
        x = s["x"]
        args = (s["indptr"], s["indices"], s["data"], s["y"])
        S = self._sample_blocks(s["k"], plan.round)
        ids = np.arange(self.n_blocks, dtype=np.int32) if S is None else S
        l, grad, loss = s["l"], s["grad"], None
        if self.method == "isaga" or self.batch_size is not None:
            b = min(self.batch_size or 1, l)
            rows = kernels.tau_nice(self.seed, 2 * s["k"] + 1, plan.round, l, b)
            if self.method == "isaga":
                vals = kernels.saga_delta(*args, x, rows, self.loss_id, self.fit_intercept,
                                          s["table"], s["col_block"], self.bounds, ids) / b
            else:
                kernels.batch_gradient(*args, x, rows, self.loss_id, self.fit_intercept, grad)
                grad /= b
                self._add_l2(grad, x)
                vals = kernels.gather_blocks(grad, self.bounds, ids, 1.0)
            if plan.eval:
                loss = kernels.loss_value(*args, x, self.loss_id, self.fit_intercept)
        else:
            if s["full"]:
                loss = kernels.loss_gradient_dense(_rows(s), s["y"], x, self.loss_id,
                                                   self.fit_intercept, grad)
            else:
                loss = kernels.loss_gradient(*args, x, self.loss_id, self.fit_intercept, grad)
            grad /= l
            self._add_l2(grad, x)
            if self.method == "isega":
                vals = kernels.shift_delta(grad, s["shift"], self.bounds, ids)
            else:
                vals = kernels.gather_blocks(grad, self.bounds, ids, 1.0)
        out = {"blocks": S, "values": vals, "loss": loss}
        if plan.sketch:
            out["sketch"] = self._sketch(self._on_support(grad, x), plan.round)
        return out

    def _sketch(self, v, round):
        out = np.empty(SKETCH_SIZE)
        kernels.count_sketch(v, self.seed, round, SKETCH_SIZE, out)
        return out

    def _on_support(self, v, x):
        """``v`` on the coordinates where the gradient mapping is ``grad + l1 sign(x)``:
        all of them without an L1 term, else the nonzero and the unpenalised ones."""
        if not self.alpha * self.l1_ratio:
            return v
        out = np.where(x != 0, v, 0.0)
        out[self.n_features:] = v[self.n_features:]
        return out

    def _add_l2(self, grad, x):
        if self.l2 and self.l2_in_f:
            d = self.n_features
            grad[:d] += self.l2 * x[:d]

    def apply(self, s, update):
        if "x" in update:
            s["x"][:] = update["x"]
        else:
            kernels.assign_blocks(s["x"], self.bounds, update["blocks"], update["values"])

    def partition_arrays(self, s):
        out = {"x": s["x"].copy()}
        if self.method == "isega":
            out["shift"] = s["shift"].copy()
        if self.method == "isaga":
            out["table"] = s["table"].copy()
        return out

    def checkpoint_arrays(self, s):
        # the state itself (no round runs during a checkpoint): copies would double the
        # partition while it is written
        extra = {"isega": ("shift",), "isaga": ("table",)}.get(self.method, ())
        return {name: s[name] for name in ("x", *extra)}

    def restore_partition(self, s, arrays):
        for name in self.partition_arrays(s):
            a = np.asarray(arrays[name], dtype=np.float64)
            target = s["table"] if name == "table" else s[name]
            if a.shape != target.shape:
                raise ValueError(f"checkpoint array {name!r} has shape {a.shape}, "
                                 f"expected {target.shape}")
            target[...] = a

    # ================================================================== driver side
    def partition_specs(self, n_partitions):
        groups = self.dataset.row_partition(n_partitions)
        return [{"shards": g, "index": k} for k, g in enumerate(groups)]

    def partition_nbytes(self, spec):
        ds = self.dataset
        shard_nnz = getattr(ds, "shard_nnz", None)
        bounds = getattr(ds, "row_bounds", None)
        if shard_nnz is None or bounds is None:
            return None
        shards = list(spec["shards"])
        nnz = int(np.asarray(shard_nnz())[shards].sum())
        rows = int(sum(bounds[k + 1] - bounds[k] for k in shards))
        vectors = {"isega": 3, "isaga": 2}.get(self.method, 2)
        table = rows * self.n_blocks * 8 if self.method == "isaga" else 0
        # CSR shard and targets, the model-length vectors, ISAGA's gradient table
        return nnz * 12 + rows * 16 + self.n_coords * 8 * vectors + table

    def start(self, n_partitions):
        D = self.n_coords
        x = np.zeros(D) if self.x0 is None else self.x0.copy()
        self.driver = SparsifiedDriver(n_parts=n_partitions, x=x, point=x.copy(),
                                       memory=np.zeros(D))

    def schedule(self, round):
        if round == 0:
            return [InitPlan(0)] * self.driver.n_parts
        ev = (not self.stochastic) or (round % self.eval_every == 0)
        sketch = (self.gradient_stop and self.tol is not None and self.tau < self.n_blocks
                  and round % self.check_every == 0)
        return [StepPlan(round, ev, sketch)] * self.driver.n_parts

    def penalty(self, x) -> float:
        w = x[:self.n_features]
        return self.alpha * (self.l1_ratio * float(np.abs(w).sum())
                             + 0.5 * (1.0 - self.l1_ratio) * float(w @ w))

    def _objective(self, partials, point):
        d = self.driver
        if any(p["loss"] is None for p in partials):
            return None
        with np.errstate(over="ignore", invalid="ignore"):  # a diverging run reports inf
            return float(sum(w * p["loss"] / max(l, 1)
                             for w, p, l in zip(d.weights, partials, d.l))) \
                + self.penalty(point)

    def _init_from_stats(self, stats):
        d = self.driver
        l = np.array([st["l"] for st in stats], dtype=np.float64)
        N = l.sum()
        w = l / N
        d.l, d.weights = l.tolist(), w.tolist()
        L_i = np.array([st["L"] for st in stats])
        Lp_i = np.array([st["L_point"] for st in stats])
        L = float(w @ L_i)  # an upper bound of the smoothness of sum_i w_i f_i
        r = self.n_blocks / self.tau
        if self.stochastic:
            b = np.minimum(self.batch_size or 1, l)
            # expected smoothness of a b-minibatch without replacement (Gower et al. 2019)
            frac = np.where(l > 1, (l - b) / np.maximum(b * (l - 1), 1), 0.0)
            L_i = L_i + (Lp_i - L_i) * frac
            L = float(w @ L_i)
        L_w = float(np.max(w * L_i))
        A = L + (r - 1.0) * L_w
        if self.method == "isega" and not self.stochastic:
            # ISEGA's variance, (r-1) sum_i w_i^2 |grad f_i(x) - h_i|^2, is spread over all
            # workers as the shifts trail the iterates: the weighted mean of w_i L_i, not
            # the largest one, sets the step.  On shards sorted by a feature a few L_i are
            # several times the mean, and the largest would cost many more iterations than
            # dense's (BENCHMARKS.md "ISEGA on heterogeneous shards")
            A = L + (r - 1.0) * float(w @ (w * L_i))
        d.L, d.L_w, d.A = L, L_w, A
        if self.step_size == "auto":
            # 1/A is safe for exact local gradients (the variance of the estimator is at
            # most (r-1) max_i w_i L_i times the Bregman distance); shifts only lower it
            factor = {"isgd": 2.0 if self.stochastic else 1.0, "iasgd": 1.0,
                      "isega": 1.0, "isaga": 3.0}[self.method]
            d.step = 1.0 / (factor * A) if A > 0 else 1.0
        else:
            d.step = float(self.step_size)
        mu = self.l2
        if self.method == "iasgd":
            if self.momentum != "auto":
                d.beta = float(self.momentum)
            elif mu > 0 and L > 0:
                rho = A / L
                kappa = rho * rho * L / mu
                d.beta = (math.sqrt(kappa) - 1.0) / (math.sqrt(kappa) + 1.0)
            else:
                d.beta = None  # convex schedule k / (k + 3)

    def pull(self, round, partials):
        d = self.driver
        if round == 0:
            self._init_from_stats(partials)
            d.stats = [{k: float(v) for k, v in p.items() if v is not None}
                          for p in partials]
            d.objective = self._objective(partials, d.point)
            d.best = d.objective
            # the objective at zero, the scale divergence is judged against (a warm start,
            # e.g. partial_fit, may begin near the optimum: only non-finite values count then)
            d.start = d.objective if self.x0 is None else None
            d.upload = [0] * len(partials)
            return None
        g = self.estimate(partials)
        self._advance_memory(partials)
        D = self.n_coords
        evaluated = d.point
        d.objective_at = self._objective(partials, evaluated)
        d.grad_sq = self._gradient_mapping_sq(round, partials, g, evaluated) \
            if self.gradient_stop and self.tol is not None else None
        step = d.step
        new_x = np.empty(D)
        kernels.prox_elastic_net(evaluated - step * g, step, self.alpha * self.l1_ratio,
                                 0.0 if self.l2_in_f else self.l2, self.n_features, new_x)
        if self.method == "iasgd":
            k = d.k
            beta = d.beta if d.beta is not None else k / (k + 3.0)
            new_point = new_x + beta * (new_x - d.x)
        else:
            new_point = new_x
        d.x = new_x
        d.k += 1
        d.blocks_up = sum(len(self._blocks_of(p)) for p in partials)
        d.upload = [_upload_bytes(p) for p in partials]
        update = self._encode_point(d.point, new_point)
        d.point = new_point
        self._track(d.objective_at)
        return update

    def _blocks_of(self, partial):
        if partial["blocks"] is None:
            return np.arange(self.n_blocks, dtype=np.int32)
        return partial["blocks"]

    def estimate(self, partials) -> np.ndarray:
        """The method's unbiased estimate of the full gradient from one round's uploads
        (does not change the driver state)."""
        d = self.driver
        r = self.n_blocks / self.tau
        # shifted methods start from the memory (average shift / SAGA table) of last round
        g = d.memory.copy() if self.method in ("isega", "isaga") else np.zeros(self.n_coords)
        for wi, p in zip(d.weights, partials):
            kernels.scatter_add_blocks(g, self.bounds, self._blocks_of(p), p["values"], wi * r)
        return g

    def _advance_memory(self, partials) -> None:
        d = self.driver
        for wi, li, p in zip(d.weights, d.l, partials):
            if self.method == "isega":
                scale = wi
            elif self.method == "isaga":
                scale = wi * min(self.batch_size or 1, li) / li
            else:
                return
            kernels.scatter_add_blocks(d.memory, self.bounds, self._blocks_of(p), p["values"],
                                 scale)

    def _encode_point(self, old, new):
        """Broadcast only the blocks that changed when that is smaller than the point."""
        moved = old != new
        if moved.all():   # every block changed (most rounds with an L2 term)
            return Broadcast({"x": new.copy()})
        changed = np.maximum.reduceat(moved.astype(np.int8), self.bounds[:-1]) > 0
        ids = np.flatnonzero(changed).astype(np.int32)
        sizes = np.diff(self.bounds)[ids]
        if 8 * int(sizes.sum()) + 4 * len(ids) < 8 * self.n_coords:
            return Broadcast({"blocks": ids, "values": kernels.gather_blocks(new, self.bounds, ids,
                                                                             1.0)})
        return Broadcast({"x": new.copy()})

    def _gradient_mapping_sq(self, round, partials, g, x):
        """``|G(x)|^2`` for the gradient mapping ``G(x) = L (x - prox_{R_1 / L}(x - grad/L))``
        at the point the workers used (R_1: the L1 part; L: the smoothness bound), or None
        in rounds without a check.

        Dense (tau = m): exact, from the gradient itself.  Sparsified: the uploaded blocks
        only estimate the gradient, with a variance that trails the shifts, so every
        ``ceil(m / 4 tau)`` rounds each worker adds a CountSketch of its full local gradient
        (``SKETCH_SIZE`` values, one key for all workers): the sketches sum to the sketch of
        the full gradient, whose squared norm estimates ``|grad F(x)|^2`` without bias and
        with a relative spread of ``sqrt(2 / SKETCH_SIZE)``.  With an L1 term the sketch
        covers the nonzero and unpenalised coordinates (where ``G = grad + l1 sign(x)``); on
        the zero ones ``G`` is the soft-thresholded shift memory ``h``, at most an epoch
        of blocks old.
        """
        d = self.driver
        L = d.L if d.L and d.L > 0 else 1.0
        l1 = self.alpha * self.l1_ratio
        if self.tau == self.n_blocks:
            p = np.empty(self.n_coords)
            kernels.prox_elastic_net(x - g / L, 1.0 / L, l1, 0.0, self.n_features, p)
            G = L * (x - p)
            return float(G @ G)
        sketches = [p.get("sketch") for p in partials]
        if any(s is None for s in sketches):
            return None
        total = sum(w * s for w, s in zip(d.weights, sketches))
        if not l1:
            return float(total @ total)
        sign = np.zeros(self.n_coords)
        sign[:self.n_features] = l1 * np.sign(x[:self.n_features])
        total = total + self._sketch(sign, round)
        zero = np.flatnonzero(x[:self.n_features] == 0)
        h = np.abs(d.memory[zero]) - l1
        return float(total @ total) + float(h[h > 0] @ h[h > 0])

    def _track(self, f):
        d = self.driver
        if f is None:
            return
        d.objective = f
        # the objective (a loss plus a penalty, never negative) far above where the fit
        # started: the iterates diverge, though still finite -- not "no improvement"
        start = d.start
        if not math.isfinite(f) or (start is not None and f > DIVERGENCE_FACTOR * start > 0):
            d.diverged = True
            d.converged = True
            return
        d.best = min(d.best, f)
        d.bests.append(d.best)
        if self.tol is None:
            return
        if self.gradient_stop:
            # n_iter_no_change dense steps of 1/L would lower F by about
            # n_iter_no_change |G|^2 / (2L): stop when that is below tol (relative), the same
            # test whatever tau (BENCHMARKS.md "ISEGA on heterogeneous shards")
            if d.grad_sq is not None:
                # the dense check is exact: it stands alone; sparsified ones are averaged
                # over about one epoch of blocks
                keep = 1 if self.tau == self.n_blocks else max(1, min(
                    CHECKS_AVERAGED, round(self.n_blocks / self.tau / self.check_every)))
                d.checks = (d.checks + [d.grad_sq])[-keep:]
                scale = self.tol * max(1.0, abs(d.best))
                if (len(d.checks) == keep and self.n_iter_no_change * float(np.mean(d.checks))
                        / (2.0 * d.L) <= scale):
                    d.converged = True
            return
        # Progress is judged over a window of evaluations that stands for the same progress
        # whatever tau: stop when the best objective improved by less than tol (relative).
        # With exact local gradients an ISGD iteration advances like A / L of a dense one
        # (the step shrinks by L / A), so the window is n_iter_no_change * ceil(A / L)
        # iterations.  Stochastic estimators and momentum keep the epoch window
        # n_iter_no_change * ceil(m / tau).
        window = self.n_iter_no_change * self._window_factor()
        bests = d.bests
        if len(bests) > window:
            del bests[:len(bests) - window - 1]
            scale = self.tol * max(1.0, abs(bests[-1]))
            # a noisy phase (the shifts still far from the local gradients) can hold the
            # best objective for a window while the current one hovers above it: not a stop
            if bests[0] - bests[-1] < scale and f - bests[-1] < scale:
                d.converged = True

    def _window_factor(self) -> int:
        d = self.driver
        if self.method in ("isgd", "isega") and not self.stochastic:
            A, L = d.A, d.L
            if A and L and A > 0 and L > 0:
                # every shift block is refreshed about once per m / tau iterations, which
                # bounds the progress per iteration when m / tau exceeds A / L (many workers)
                r = self.n_blocks / self.tau
                return max(1, math.ceil(A / L - 1e-9), math.ceil(r / 8 - 1e-9))
        return math.ceil(self.n_blocks / self.tau)

    def metrics(self):
        d = self.driver
        f = d.objective if d.k == 0 else d.objective_at
        return {"objective": math.nan if f is None else f,
                "blocks_uploaded": d.blocks_up, "upload_bytes": list(d.upload)}

    def progress_postfix(self):
        return {"objective": f"{self.driver.objective:.8g}"}

    def converged(self):
        return self.driver.converged

    def driver_state(self):
        d = self.driver
        if d.weights is None:
            raise RuntimeError("SparsifiedProgram's driver state is complete once round 0 is "
                               "pulled")
        return {"x": d.x, "point": d.point, "memory": d.memory, "k": d.k,
                "step": d.step, "beta": d.beta, "weights": d.weights, "l": d.l,
                "L": d.L, "L_w": d.L_w, "A": d.A,
                "objective": d.objective, "best": d.best, "start": d.start,
                "checks": np.asarray(d.checks, dtype=np.float64),
                "bests": np.asarray(d.bests, dtype=np.float64), "stats": d.stats}

    def load_driver_state(self, state):
        d = self.driver
        for name in ("x", "point", "memory"):
            setattr(d, name, np.asarray(state[name], dtype=np.float64).copy())
        d.k = int(state["k"])
        d.bests = [float(v) for v in np.asarray(state["bests"], dtype=np.float64)]
        for name in ("step", "beta", "weights", "l", "L", "L_w", "A", "objective", "best",
                     "stats"):
            setattr(d, name, state[name])
        d.start = state.get("start")   # None in checkpoints from before the check
        d.checks = [float(v) for v in np.asarray(state.get("checks", []), dtype=np.float64)]
        d.upload = [0] * d.n_parts
        d.objective_at = d.objective

    def finish(self, partition_arrays):
        pass


def _upload_bytes(partial) -> int:
    """Bytes of one worker's upload: block values, block ids and the loss scalar."""
    n = partial["values"].nbytes
    if partial["blocks"] is not None:
        n += partial["blocks"].nbytes
    if partial.get("sketch") is not None:
        n += partial["sketch"].nbytes
    return n + (8 if partial["loss"] is not None else 0)
