"""STRADS Lasso as a schedule / push / pull Program on column-block partitions.

Layout (docs/algorithms.md, "Lasso partitioning: column blocks"): each partition owns a
contiguous block of columns (its CSC shards and coefficients) and a replica of the residual
``r = y~ - X~ w``.

* schedule (driver): priority-sample candidates over all variables (probability proportional
  to (last change)^2 + eta * mean), order them by priority (for the filter) and deal them
  to their owners; or round robin / uniform random.  Every ``check_every`` coordinate
  updates, or as soon as the working set is solved (a worker's sweeps stopped early; with one
  sweep per round, the round's largest step small against its coefficients), a *gap round*
  computes the duality gap and refreshes every variable's priority with the step it would
  take now; every ``refresh_every`` gap rounds a *refresh round* recomputes the residual from
  scratch (drift control, and after a restore).
* push (worker): the STRADS dependency filter over its candidates (|corr| < rho among the
  kept set), then sequential coordinate descent over the kept set against the residual
  replica; returns the residual change ``X_S delta_S`` (sparse when it pays) and the deltas.
* pull (driver): sums the residual changes.  Updates from different partitions are applied
  together (block Jacobi): the full step ``t = 1`` when it lowers the objective (it keeps the
  exact zeros of coordinate descent), otherwise the exact minimiser ``t`` in [0, 1] of the
  objective along their sum (convex, piecewise quadratic: a bisection on its slope), so the
  objective never increases.  With one partition ``t = 1``: exactly sequential coordinate
  descent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..engine.program import Broadcast, DriverState, Message, Program, unexpected
from ..kernels import lasso as kernels


def _encode(vec: np.ndarray):
    """Residual changes are sparse without an intercept: send (indices, values) when it pays."""
    if 3 * np.count_nonzero(vec) < len(vec):
        nz = np.flatnonzero(vec)
        return ("sparse", nz.astype(np.int32), vec[nz])
    return ("dense", vec)


def _decode_add(msg, out: np.ndarray, scale: float = 1.0) -> None:
    if msg[0] == "sparse":
        out[msg[1]] += scale * msg[2]
    else:
        out += scale * msg[1]


# a working set is solved to this fraction of the current relative duality gap
_INNER_GAP_FRACTION = 0.1
# quantiles (min, quartiles, max) of the scheduled variables' priorities, per round
_PRIORITY_QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)
_NO_QUANTILES = [float("nan")] * 5
# up to this many variables at zero priority, the floor's draw keys each of them
_KEYED_DEAD_DRAW = 4096
# at most about this many scheduled priorities enter the per-round quantiles
_QUANTILE_SAMPLE = 4096
_NO_DRAWS = np.empty(0)


def _quantiles(values: np.ndarray) -> list:
    """`_PRIORITY_QUANTILES` of ``values`` (numpy's default, linear interpolation) from one
    sort: ``np.quantile``'s generality costs more than the sort of a round's few values."""
    a = np.sort(values).tolist()
    last = len(a) - 1
    out = []
    # numpy's arithmetic on five scalars (the same float64 operations, in Python)
    for q in _PRIORITY_QUANTILES:
        pos = q * last
        lo = math.floor(pos)
        hi = min(lo + 1, last)
        out.append(a[lo] + (a[hi] - a[lo]) * (pos - lo))
    return out


def _l1_change(w_old, delta, t):
    return float(np.abs(w_old + t * delta).sum() - np.abs(w_old).sum())


def priority_sample(prio, floor, k, rng):
    """Draw ``k`` distinct variables with probability proportional to ``prio + floor``,
    successively without replacement (STRADS' priority sampling).

    Uses exponential keys ``E_j / w_j`` (the ``k`` smallest keys are such a sample).  When all
    variables with positive priority fit in ``k`` they are all taken (inclusion probability
    capped at one) and the remainder is drawn from the floor: those variables share one
    weight, so the smallest of their keys are generated directly as exponential order
    statistics (Renyi's representation) and the chosen ones are a uniform random subset:
    by a uniform key each when they are few (`_KEYED_DEAD_DRAW`), else by rejection.  Cost
    O(#positive + k) plus one vectorised scan, not O(p) random draws, on large problems.
    """
    p = len(prio)
    k = min(k, p)
    live = np.flatnonzero(prio)
    n_dead = p - len(live)
    if len(live) < k:
        # every moving variable fits: take them all (their inclusion probability is capped
        # at one), the rest of the round is a uniform draw from the floor
        chosen_live, c = live, k - len(live)
    else:
        e_live = rng.standard_exponential(len(live))
        m = min(k, n_dead)
        e_dead = rng.standard_exponential(m) if m else _NO_DRAWS
        ids = np.empty(len(live) + m, dtype=np.int64)
        c = kernels.priority_keys_top(prio, live, floor, n_dead, e_live, e_dead, k,
                                      np.empty(len(ids)), ids)
        chosen_live = ids[:k - c]
    if c == 0:
        return chosen_live
    if n_dead <= _KEYED_DEAD_DRAW:
        # few enough to give each a uniform key: the c smallest are a uniform subset (one
        # pass, against the rejection loop's several numpy calls)
        dead = np.empty(n_dead, dtype=np.int64)
        kernels.uniform_settled(prio, rng.random(n_dead) if c < n_dead else _NO_DRAWS, c,
                                dead)
        dead = dead[:c]
    elif n_dead == p:
        dead = rng.choice(p, size=c, replace=False)
    else:
        is_live = np.zeros(p, dtype=bool)
        is_live[live] = True
        picked = np.empty(0, dtype=np.int64)
        while len(picked) < c:  # rejection: most variables are dead, so this ends fast
            draw = rng.integers(0, p, size=2 * (c - len(picked)) + 8)
            draw = draw[~is_live[draw]]
            picked = np.unique(np.concatenate([picked, draw]))
            if len(picked) > c:
                picked = rng.choice(picked, size=c, replace=False)
        dead = picked
    return np.concatenate([chosen_live, dead.astype(np.int64)])


def _exact_step(r, D, w_old, delta, nalpha, iters=50):
    """Minimise ``1/2 ||r + t D||^2 + nalpha ||w_old + t delta||_1`` over ``t`` in [0, 1].

    The function is convex and piecewise quadratic; bisection on the sign of its derivative
    (a subgradient at the kinks) finds the minimiser to ~1e-15.  Workers that solved their own
    blocks against the same residual overshoot together when the blocks are coupled (p >> n:
    every block spans the rows), and this exact step removes the overshoot.
    """
    dd = float(D @ D)
    rd = float(r @ D)
    nz = delta != 0.0
    w_old, delta = w_old[nz], delta[nz]

    def slope(t):
        v = w_old + t * delta
        sgn = np.sign(v)
        # at a kink (v == 0) take the one-sided slope in the direction of increasing t
        sgn = np.where(sgn == 0.0, np.sign(delta), sgn)
        return t * dd + rd + nalpha * float(delta @ sgn)

    if slope(1.0) <= 0.0:
        return 1.0
    if slope(0.0) >= 0.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if slope(mid) > 0.0:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi)


# ====================================================================== messages
# plans (driver -> partitions)
@dataclass(frozen=True)
class CDPlan(Message):
    """Coordinate descent over the partition's share of the round's candidates."""

    round: int
    #: the candidates, local column indices in priority order
    idx: np.ndarray
    #: at most this many are updated
    keep: int
    #: run the dependency filter over the candidates (else the first ``keep`` are kept)
    filter: bool
    sweeps: int
    inner_tol: float
    #: also return the gap round's correlations after the sweeps (one partition: its
    #: residual is the driver's, so the gap round that follows a solved working set is
    #: computed in the same push and the round saved)
    gap: bool = False
    #: return the gap round's correlations before the sweeps (several partitions: a
    #: replica's residual is exact only before its own sweeps); the push keeps what it
    #: changed, and the driver undoes the sweeps (`CDUpdate.undo`) when that gap shows
    #: convergence, so the round is the gap round it replaced, one round fewer otherwise
    gap_first: bool = False


@dataclass(frozen=True)
class GapPlan(Message):
    """Correlations for the duality gap, and every variable's priority."""

    round: int


@dataclass(frozen=True)
class RefreshPlan(Message):
    """The partition's share ``X w`` of the residual, recomputed from scratch."""

    round: int


# partial results (partitions -> driver)
@dataclass(frozen=True)
class CDPartial(Message):
    #: the residual change ``X_S delta_S`` (`_encode`)
    dr: tuple
    kept: np.ndarray
    delta: np.ndarray
    w_old: np.ndarray
    n_cand: int
    #: the repeated sweeps stopped early (the working set is solved)
    solved: bool
    #: the gap round's result after the sweeps (`CDPlan.gap`)
    gap: "GapPartial | None" = None
    #: the gap round's result before the sweeps (`CDPlan.gap_first`)
    gap_before: "GapPartial | None" = None


@dataclass(frozen=True)
class GapPartial(Message):
    dual_norm: float
    prio: np.ndarray
    l1: float


@dataclass(frozen=True)
class RefreshPartial(Message):
    #: the partition's ``X w`` (`_encode`)
    xw: tuple
    l1: float


# updates (driver -> partitions, in a Broadcast)
@dataclass(frozen=True)
class CDUpdate(Message):
    """The summed residual change of round ``round`` and its step ``t``."""

    round: int
    D: tuple
    t: float
    #: take the round's sweeps back exactly (its gap-first check showed convergence)
    undo: bool = False


@dataclass(frozen=True)
class RefreshUpdate(Message):
    """The residual recomputed on the driver."""

    r: np.ndarray


_PLANS = (CDPlan, GapPlan, RefreshPlan)
_PARTIALS = (CDPartial, GapPartial, RefreshPartial)
_UPDATES = (CDUpdate, RefreshUpdate)


@dataclass
class LassoDriver(DriverState):
    """The driver's state of `LassoProgram` (`LassoProgram.start`)."""

    n: int
    p: int
    #: number of partitions
    P: int
    #: first column of each partition, then ``p``
    starts: np.ndarray
    #: the (centred) target, its squared norm and the target's mean
    ytil: np.ndarray
    ynorm2: float
    ymean: float
    #: the residual ``ytil - X~ w`` and ``||w||_1``
    r: np.ndarray
    l1: float
    #: each variable's priority (its last squared change)
    prio: np.ndarray
    rng: np.random.Generator
    #: the next variable of the round-robin schedule
    rr: int
    #: the next round is a gap round / a refresh round
    need_gap: bool
    need_refresh: bool
    #: coordinate updates since the last gap round, gap rounds so far, updates so far
    since_check: int
    n_checks: int
    updates: int
    gap: float
    objective: float
    converged: bool
    #: metrics of the last pulled round (`LassoProgram.metrics`)
    last: dict
    #: the largest coefficient seen so far
    max_abs_w: float
    #: priority quantiles of the scheduled rounds not pulled yet, by round
    priority_q: dict
    #: the priority floor (`LassoProgram._rebuild_sampler`)
    floor: float = 1.0
    #: the fit's result (`LassoProgram.finish`)
    coef: np.ndarray | None = field(default=None, repr=False)
    intercept: float | None = None


class LassoProgram(Program):
    """Driver and worker logic of STRADS Lasso (see the module docstring).

    Parameters are those of :class:`dmp.linear_model.Lasso`, already validated; ``dataset``
    is a ``dmp.io.SparseDataset`` (opened by URL on every worker) or an in-memory dataset
    (local backend only).  The driver's state is a `LassoDriver` (``self.driver``).
    """

    name = "lasso"
    primary_metric = "objective"
    primary_direction = "min"
    # block Jacobi: more partitions, more rounds to the duality gap's tolerance
    probe_to_stopping_rule = True

    def __init__(self, dataset, *, alpha, fit_intercept, schedule, schedule_size, eta, rho,
                 oversample, tol, check_every, refresh_every, seed, inner_sweeps=1,
                 filter_work=32):
        super().__init__()
        self.dataset = dataset
        self.alpha = float(alpha)
        self.fit_intercept = bool(fit_intercept)
        self.schedule_kind = schedule
        self.schedule_size = int(schedule_size)
        self.eta = float(eta)
        self.rho = None if rho is None else float(rho)
        self.oversample = float(oversample)
        self.tol = float(tol)
        self.check_every = int(check_every)
        self.refresh_every = int(refresh_every)
        self.seed = seed
        self.filter_work = filter_work
        self.inner_sweeps = int(inner_sweeps)

    # ================================================================== worker side
    def init_partition(self, spec):
        ds = self.dataset
        X = ds.load_shards(spec["shards"])
        c0, c1 = spec["cols"]
        n = X.shape[0]
        y = ds.load_y()
        col_sums, col_sq = ds.load_col_stats(slice(c0, c1))
        col_sums = np.ascontiguousarray(col_sums, dtype=np.float64)
        col_sq = np.ascontiguousarray(col_sq, dtype=np.float64)
        if self.fit_intercept:
            means = col_sums / n
            sq = np.maximum(col_sq - n * means * means, 0.0)
            # a numerically constant column has no centred energy
            sq[sq <= 1e-12 * np.maximum(col_sq, 1e-300)] = 0.0
            r = y - y.mean()
        else:
            means = np.zeros_like(col_sums)
            sq = col_sq
            r = y.astype(np.float64, copy=True)
        full = X.nnz == n * (c1 - c0)
        return {
            "indptr": np.ascontiguousarray(X.indptr, dtype=np.int64),
            "indices": np.ascontiguousarray(X.indices, dtype=np.int32),
            "data": np.ascontiguousarray(X.data, dtype=np.float64),
            "n": n, "c0": c0, "means": means, "col_sums": col_sums, "sq": sq,
            "w": np.zeros(c1 - c0), "r": np.ascontiguousarray(r, dtype=np.float64),
            "pending": {},
            "row_head": np.full(n, -1, dtype=np.int64),
            "links": (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64)),
            # every entry stored (dense input): each column is already n contiguous values
            "full": full,
            # ... and its rows in order: column j is data[j n:(j + 1) n]
            "dense": full and X.has_canonical_format,
        }

    def _filter(self, s, idx, keep):
        indptr = s["indptr"]
        need = int((indptr[idx + 1] - indptr[idx]).sum())
        nxt, col, val = s["links"]
        if len(nxt) < need:
            cap = max(need, 2 * len(nxt))
            s["links"] = nxt, col, val = (np.empty(cap, np.int64), np.empty(cap, np.int64),
                                          np.empty(cap, np.float64))
        kept = np.empty(min(keep, len(idx)), dtype=np.int64)
        budget = self.filter_work * max(need, 1) + 10 * s["n"]
        m = kernels.dependency_filter(indptr, s["indices"], s["data"], s["means"], s["sq"], idx,
                                      len(kept), self.rho, float(s["n"]), budget, s["row_head"],
                                      nxt, col, val, kept)
        return kept[:m]

    def push(self, s, plan):
        match plan:
            case CDPlan():
                return self._push_cd(s, plan)
            case GapPlan():
                return self._push_gap(s)
            case RefreshPlan():
                xw = np.zeros(s["n"])
                kernels.block_matvec(s["indptr"], s["indices"], s["data"], s["means"], s["w"], xw)
                return RefreshPartial(xw=_encode(xw), l1=float(np.abs(s["w"]).sum()))
        raise unexpected(self, "a plan", plan, _PLANS)

    def _push_gap(self, s) -> GapPartial:
        corr = np.empty(len(s["w"]))
        if s["dense"]:
            kernels.dense_correlations(s["data"], s["n"], s["r"], corr)
        else:
            kernels.correlations(s["indptr"], s["indices"], s["data"], s["r"], corr)
        prio = np.empty_like(corr)
        dual_norm = kernels.gap_priorities(corr, s["sq"], s["w"], self.alpha * s["n"], prio)
        return GapPartial(dual_norm=dual_norm, prio=prio, l1=float(np.abs(s["w"]).sum()))

    def _push_cd(self, s, plan: CDPlan) -> CDPartial:
        gap_before = self._push_gap(s) if plan.gap_first else None
        idx = plan.idx
        if plan.filter and self.rho is not None and len(idx) > 1:
            kept = self._filter(s, idx, plan.keep)
        else:
            kept = idx[:plan.keep]
        # sweep in column order: same set, far fewer cache misses than priority order
        kept = np.sort(kept)
        w_old = s["w"][kept]
        r_before = s["r"].copy()
        delta = np.empty(len(kept))
        sweeps = plan.sweeps
        alpha_n = self.alpha * s["n"]
        if sweeps == 1:
            kernels.cd_sweep(s["indptr"], s["indices"], s["data"], s["sq"], s["means"],
                       s["col_sums"], s["w"], s["r"], kept, alpha_n, delta, s["dense"])
            solved = False
        elif s["full"]:
            # columns stored whole are contiguous already: the sweeps read them in place
            # (the same operations on the same values as on a copy)
            done = kernels.cd_sweeps(s["indptr"], s["indices"], s["data"], s["sq"], s["means"],
                                     s["col_sums"], s["w"], s["r"], kept, alpha_n, sweeps,
                                     plan.inner_tol, delta, s["dense"])
            solved = done < sweeps
        else:
            # repeated sweeps over a contiguous copy of the working set: one random
            # gather, then sequential memory access on every sweep
            ip, ind, dat = kernels.gather_columns(s["indptr"], s["indices"], s["data"], kept)
            w_ws = s["w"][kept]
            done = kernels.cd_sweeps(ip, ind, dat, s["sq"][kept], s["means"][kept],
                               s["col_sums"][kept], w_ws, s["r"],
                               np.arange(len(kept), dtype=np.int64), alpha_n,
                               sweeps, plan.inner_tol, delta)
            s["w"][kept] = w_ws
            solved = done < sweeps
        dr = s["r"] - r_before
        # what an undo restores (`CDUpdate.undo`), bit for bit
        undo = (r_before, w_old) if plan.gap_first else None
        s["pending"][plan.round] = (dr, kept, delta, undo)
        return CDPartial(dr=_encode(dr), kept=kept, delta=delta, w_old=w_old,
                         n_cand=len(plan.idx), solved=solved,
                         gap=self._push_gap(s) if plan.gap and solved else None,
                         gap_before=gap_before)

    def apply(self, s, update):
        match update:
            case CDUpdate():
                dr_own, kept, delta, undo = s["pending"].pop(update.round)
                if update.undo:
                    s["r"][:] = undo[0]
                    s["w"][kept] = undo[1]
                    return
                r = s["r"]
                r -= dr_own
                _decode_add(update.D, r)
                t = update.t
                if t != 1.0:
                    s["w"][kept] += (t - 1.0) * delta
            case RefreshUpdate():
                s["r"][:] = update.r
                s["pending"].clear()
            case _:
                raise unexpected(self, "an update", update, _UPDATES)

    def partition_arrays(self, s):
        out = {"w": s["w"].copy()}
        if self.fit_intercept:
            # the partition's share of ``col_sums . coef`` for the intercept: the driver
            # need not read every column's sum from the store (`finish`)
            out["col_dot"] = np.array(float(s["col_sums"] @ s["w"]))
        return out

    def checkpoint_arrays(self, s):
        # the partition's own residual too: rebuilt from the coefficients instead, it
        # differs in rounding and costs a round, and the resumed fit leaves the
        # uninterrupted one's path (no round is in flight at a checkpoint: no pending)
        return {"w": s["w"], "r": s["r"]}

    def restore_partition(self, s, arrays):
        w = np.asarray(arrays["w"], dtype=np.float64)
        if w.shape != s["w"].shape:
            raise ValueError(f"checkpoint partition has {w.shape[0]} coefficients, "
                             f"expected {s['w'].shape[0]}")
        s["w"][:] = w
        if "r" in arrays:   # (a checkpoint of dmp before it has none: the driver refreshes)
            r = np.asarray(arrays["r"], dtype=np.float64)
            if r.shape != s["r"].shape:
                raise ValueError(f"checkpoint partition has a residual of {r.shape[0]} "
                                 f"samples, expected {s['r'].shape[0]}")
            s["r"][:] = r
        s["pending"].clear()

    # ================================================================== driver side
    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_specs", None)   # the driver's copy (`partition_specs`)
        return state

    def partition_specs(self, n_partitions):
        # asked for by the runner and again by `start`: the split is made once per fit
        cached = self.__dict__.get("_specs")
        if cached is None or cached[0] != n_partitions:
            groups = self.dataset.column_partition(n_partitions)
            bounds = self.dataset.col_bounds
            cached = self._specs = (n_partitions, [
                {"shards": g, "cols": (int(bounds[g[0]]), int(bounds[g[-1] + 1]))}
                for g in groups])
        return list(cached[1])

    def partition_nbytes(self, spec):
        shard_nnz = getattr(self.dataset, "shard_nnz", None)
        if shard_nnz is None:
            return None
        nnz = int(np.asarray(shard_nnz())[list(spec["shards"])].sum())
        c0, c1 = spec["cols"]
        n = self.dataset.shape[0]
        # CSC shard (8 + 4 bytes per value), 5 column vectors, residual and row links
        return nnz * 12 + (c1 - c0 + 1) * 8 * 5 + n * 8 * 3

    def start(self, n_partitions):
        ds = self.dataset
        n, p = ds.shape
        y = np.asarray(ds.load_y(), dtype=np.float64)
        specs = self.partition_specs(n_partitions)
        ytil = y - y.mean() if self.fit_intercept else y.copy()
        self.driver = LassoDriver(
            n=n, p=p, P=n_partitions,
            starts=np.array([s["cols"][0] for s in specs] + [p], dtype=np.int64),
            ytil=ytil, ynorm2=float(ytil @ ytil), ymean=float(y.mean()),
            r=ytil.copy(), l1=0.0,
            prio=np.zeros(p), rng=np.random.default_rng(self.seed), rr=0,
            need_gap=True, need_refresh=False, since_check=0, n_checks=0,
            gap=np.inf, objective=0.5 * float(ytil @ ytil) / n, converged=False,
            updates=0, last={}, max_abs_w=0.0, priority_q={},
        )
        self._rebuild_sampler()

    def needs_barrier(self, round):
        d = self.driver
        return d.need_gap or d.need_refresh

    def _inner_tol(self):
        """How far a working set is solved: as far as the global gap warrants (celer's rule
        of thumb; tight inner tolerances while the working set still changes waste sweeps)."""
        d = self.driver
        gap_rel = d.gap / max(0.5 * d.ynorm2 / d.n, 1e-300)
        return float(max(self.tol, min(1e-2, _INNER_GAP_FRACTION * gap_rel)))

    def _candidates(self):
        d = self.driver
        p, L = d.p, min(self.schedule_size, d.p)
        kind = self.schedule_kind
        if kind == "round_robin":
            idx = (d.rr + np.arange(L)) % p
            d.rr = int((d.rr + L) % p)
            return idx, None
        if kind == "random":
            return d.rng.choice(p, size=L, replace=False), None
        prio = d.prio
        # Size the round by the variables that are still moving (positive priority) plus a
        # tenth of that for exploration through the floor: a large fixed L would spend most
        # of the round on variables that are settled at zero.
        n_live = int(np.count_nonzero(prio))
        L = max(1, min(L, n_live + max(32, n_live // 10)))
        # oversampling only matters when the dependency filter may reject candidates
        over = self.oversample if self.rho is not None else 1.0
        n_draws = min(p, max(1, int(round(over * L))))
        cand = priority_sample(prio, d.floor, n_draws, d.rng)
        if self.rho is not None:
            # the dependency filter keeps candidates greedily in priority order; without
            # it every candidate is kept and the push sweeps them in column order anyway
            cand = cand[np.argsort(-prio[cand], kind="stable")]
        return cand, L

    def schedule(self, round):
        d = self.driver
        P = d.P
        if d.need_refresh:
            return [RefreshPlan(round)] * P
        # several partitions: the gap round after the first goes with the coordinate
        # descent of the round after it (`CDPlan.gap_first`)
        gap_first = d.need_gap and P > 1 and d.n_checks > 0
        if d.need_gap and not gap_first:
            return [GapPlan(round)] * P
        cand, L = self._candidates()
        if self.schedule_kind == "priority" and len(cand):
            # what the monitor shows as the priority distribution of the scheduled set
            # (of an evenly strided subsample, which keeps the set's make-up: the exact
            # quantiles of a large round cost milliseconds of driver time per round)
            stride = max(1, len(cand) // _QUANTILE_SAMPLE)
            d.priority_q[round] = _quantiles(d.prio[cand[::stride]])
        inner_tol = self._inner_tol()
        # one partition solving its working set: the gap round that follows comes back with
        # this round (`CDPlan.gap`)
        fuse_gap = P == 1 and self.inner_sweeps > 1
        owner = np.searchsorted(d.starts, cand, side="right") - 1 if P > 1 else None
        plans = []
        for k in range(P):
            local = (cand[owner == k] if P > 1 else cand) - d.starts[k]
            keep = len(local) if L is None else math.ceil(L * len(local) / max(len(cand), 1))
            plans.append(CDPlan(round=round, idx=local.astype(np.int64, copy=False), keep=keep,
                                filter=self.schedule_kind == "priority",
                                sweeps=self.inner_sweeps, inner_tol=inner_tol,
                                gap=fuse_gap, gap_first=gap_first))
        return plans

    def _objective(self, r, l1):
        return 0.5 * float(r @ r) / self.driver.n + self.alpha * l1

    def pull(self, round, partials):
        match partials[0]:
            case CDPartial():
                d = self.driver
                if partials[0].gap_before is not None:
                    self._pull_gap([pt.gap_before for pt in partials])
                    if d.converged:
                        # the state before the sweeps is the answer: take them back
                        d.priority_q.pop(round, None)
                        return Broadcast(CDUpdate(round=round, D=("dense", None), t=0.0,
                                                  undo=True))
                update = self._pull_cd(round, partials)
                # the gap round this round asked for came back with it (`CDPlan.gap`); not
                # when a refresh comes first, which the gap round then follows as usual
                if partials[0].gap is not None and d.need_gap and not d.need_refresh:
                    last = d.last
                    self._pull_gap([pt.gap for pt in partials])
                    d.last = last
                return update
            case GapPartial():
                self._pull_gap(partials)
                return None
            case RefreshPartial():
                return self._pull_refresh(partials)
        raise unexpected(self, "a partial result", partials[0], _PARTIALS)

    def _pull_cd(self, round, partials: list[CDPartial]) -> Broadcast:
        d = self.driver
        n = d.n
        D = np.zeros(n)
        for part in partials:
            _decode_add(part.dr, D)
        r = d.r
        nalpha = n * self.alpha
        w_old = [pt.w_old for pt in partials]
        deltas = [pt.delta for pt in partials]
        t = 1.0
        n_active = sum(len(pt.kept) > 0 for pt in partials)
        if n_active > 1:
            # the full step keeps the exact zeros coordinate descent produced; take it
            # whenever it lowers the objective, else the exact minimiser along the sum
            r1 = r + D
            g0 = 0.5 * float(r @ r) + nalpha * d.l1
            g1 = 0.5 * float(r1 @ r1) + nalpha * (
                d.l1 + sum(_l1_change(a, b, 1.0) for a, b in zip(w_old, deltas)))
            if g1 > g0:
                t = _exact_step(r, D, np.concatenate(w_old), np.concatenate(deltas), nalpha)
        if t != 1.0:   # (the full step, the usual one, scales nothing)
            D *= t
            deltas = [t * b for b in deltas]
        # |w| of each partition's set after the step: its l1 change and its largest entry
        moved = [np.abs(a + b) for a, b in zip(w_old, deltas)]
        d.l1 += sum([float(m.sum() - np.abs(a).sum()) for m, a in zip(moved, w_old)])
        r += D
        n_kept = 0
        for k, (pt, b) in enumerate(zip(partials, deltas)):
            kept = pt.kept
            n_kept += len(kept)
            d.prio[kept + d.starts[k] if k else kept] = b * b
        d.since_check += n_kept
        d.updates += n_kept
        d.objective = self._objective(r, d.l1)
        d.last = {"kind": "cd", "n_candidates": int(sum(pt.n_cand for pt in partials)),
                  "n_kept": n_kept, "step": t,
                  "priority_q": d.priority_q.pop(round, _NO_QUANTILES)}
        moving = max((float(np.abs(b).max(initial=0.0)) for b in deltas), default=0.0)
        round_w_max = max((float(m.max(initial=0.0)) for m in moved), default=0.0)
        d.max_abs_w = max(d.max_abs_w, round_w_max)
        if self.inner_sweeps == 1:
            # one sweep per round: the rounds together are the working-set solve, solved
            # by the working-set solver's own rule (largest step at most inner_tol times
            # the largest coefficient of the set)
            solved = moving <= self._inner_tol() * round_w_max
        else:
            solved = all(pt.solved or len(pt.kept) == 0 for pt in partials)
        # check the gap (global optimality, and every priority refreshed) after an
        # epoch's worth of updates, once the working set is solved, or as soon as the
        # round's largest step is small against the coefficients (scikit-learn's trigger)
        settled = self.schedule_kind == "priority" and (
            solved or moving <= self.tol * max(d.max_abs_w, 1e-300))
        if d.since_check >= self.check_every or settled:
            d.need_gap = True
            if (d.n_checks + 1) % self.refresh_every == 0:
                d.need_refresh = True
        return Broadcast(CDUpdate(round=round, D=_encode(D), t=t))

    def _pull_gap(self, partials: list[GapPartial]) -> None:
        d = self.driver
        d.l1 = sum(pt.l1 for pt in partials)
        d.prio = np.concatenate([pt.prio for pt in partials])
        self._rebuild_sampler()
        dual_norm = max(pt.dual_norm for pt in partials)
        d.gap = self._gap(d.r, d.l1, dual_norm)
        d.objective = self._objective(d.r, d.l1)
        d.need_gap = False
        d.since_check = 0
        d.n_checks += 1
        d.converged = d.gap <= self.tol * d.ynorm2 / d.n
        d.last = {"kind": "gap", "n_candidates": 0, "n_kept": 0, "step": 0.0,
                  "priority_q": _NO_QUANTILES}

    def _pull_refresh(self, partials: list[RefreshPartial]) -> Broadcast:
        d = self.driver
        xw = np.zeros(d.n)
        for part in partials:
            _decode_add(part.xw, xw)
        d.r = d.ytil - xw
        d.l1 = sum(pt.l1 for pt in partials)
        d.objective = self._objective(d.r, d.l1)
        d.need_refresh = False
        d.last = {"kind": "refresh", "n_candidates": 0, "n_kept": 0, "step": 0.0,
                  "priority_q": _NO_QUANTILES}
        return Broadcast(RefreshUpdate(r=d.r.copy()))

    def _rebuild_sampler(self):
        """The priority floor, ``eta`` times the mean priority (refreshed at gap rounds)."""
        d = self.driver
        # (numpy's mean is this sum and division, behind several microseconds of checks)
        mean = float(d.prio.sum()) / len(d.prio) if len(d.prio) else 0.0
        d.floor = self.eta * mean if mean > 0 else 1.0

    def _gap(self, r, l1, dual_norm):
        """scikit-learn's duality gap (same dual point), in units of the 1/(2n) objective."""
        d = self.driver
        n = d.n
        alpha_n = self.alpha * n
        R2 = float(r @ r)
        if dual_norm > alpha_n:
            const = alpha_n / dual_norm
            gap = 0.5 * (R2 + R2 * const * const)
        else:
            const = 1.0
            gap = R2
        gap += alpha_n * l1 - const * float(r @ d.ytil)
        return max(gap, 0.0) / n

    def metrics(self):
        d = self.driver
        out = {"objective": d.objective, "dual_gap": d.gap, "updates": d.updates}
        out.update(d.last)
        return out

    def progress_postfix(self):
        d = self.driver
        return {"objective": f"{d.objective:.6g}", "gap": f"{d.gap:.2e}"}

    def converged(self):
        return self.driver.converged

    def driver_state(self):
        # everything the schedule reads: a resumed fit then runs the uninterrupted fit's
        # rounds (the floor is the one of the last gap round, not one from today's prio;
        # a gap or refresh round may be due)
        d = self.driver
        return {"prio": d.prio, "rng": d.rng.bit_generator.state, "rr": d.rr,
                "n_checks": d.n_checks, "since_check": d.since_check,
                "updates": d.updates, "gap": None if not np.isfinite(d.gap) else d.gap,
                "r": d.r, "l1": d.l1, "objective": d.objective, "floor": d.floor,
                "max_abs_w": d.max_abs_w, "need_gap": d.need_gap,
                "need_refresh": d.need_refresh}

    def load_driver_state(self, state):
        d = self.driver
        d.prio = np.asarray(state["prio"], dtype=np.float64)
        self._rebuild_sampler()
        rng_state = state["rng"]
        d.rng.bit_generator.state = rng_state
        d.rr = int(state["rr"])
        d.n_checks = int(state["n_checks"])
        d.since_check = int(state["since_check"])
        d.updates = int(state["updates"])
        d.gap = np.inf if state["gap"] is None else float(state["gap"])
        if "r" not in state:
            # a checkpoint of dmp before the residuals were saved: the restored
            # coefficients come without their residual, rebuilt first
            d.need_refresh = True
            d.need_gap = False
            return
        r = np.asarray(state["r"], dtype=np.float64)
        if r.shape != d.r.shape:
            raise ValueError(f"checkpoint residual has {r.shape[0]} samples, expected "
                             f"{d.r.shape[0]}")
        d.r = r.copy()
        d.l1 = float(state["l1"])
        d.objective = float(state["objective"])
        d.floor = float(state["floor"])
        d.max_abs_w = float(state["max_abs_w"])
        d.need_gap = bool(state["need_gap"])
        d.need_refresh = bool(state["need_refresh"])

    def finish(self, partition_arrays):
        d = self.driver
        d.coef = coef = np.concatenate([a["w"] for a in partition_arrays])
        if self.fit_intercept:
            d.intercept = d.ymean - sum(float(a["col_dot"]) for a in partition_arrays) / d.n
        else:
            d.intercept = 0.0
