"""STRADS matrix factorisation as schedule / push / pull programs (CCD, block ALS and
CCD++).

Both partition the model the same way: worker p owns a contiguous range of users (rows of W)
and a contiguous range of items (rows of H), each balanced by rating count.  No worker and
not the driver ever holds a whole factor matrix: a round moves one coordinate block (CCD) or
one factor column (CCD++).  Every round's objective
``sum (r - mu - w.h)^2 + alpha (sum_i c_i |w_i|^2 + sum_j c_j |h_j|^2)`` is exact.

* **CCD** (`CCDProgram`, STRADS' released ``cdmf`` scheme): worker p also holds the ratings
  of its users (CSR, "row copy") and of its items (CSC, "column copy"), each with its own
  residuals.  The round-robin schedule walks over blocks of the K coordinates: in a W round
  every worker runs exact CCD on coordinates ``k0..k1`` of its users against the block
  ``H[:, k0:k1]`` it received and sends the changes of its W block, with its part of the
  block the next round needs, straight to the other workers (`Sends`, worker to worker: the
  driver only sums the losses); ``apply`` joins the parts and brings the column copy's
  residuals up to date.  H rounds are symmetric.  Rows of W are independent given H, so this
  is exactly serial CCD in the same order.
* **Block ALS** (`CCDProgram` with ``cg_steps``, ``method="als"``): the same rounds and
  messages, but each row's least-squares problem over the block's coordinates is solved as
  a whole by a few conjugate-gradient steps from its current value (`kernels.cg_block_update`),
  instead of coordinate by coordinate.  With one block of all K coordinates this is ALS
  with CG (as cmfrec and implicit solve it), two rounds an iteration.
* **CCD++** (`CCDPPProgram`, the paper-level push/pull; docs/algorithms.md, "CCD++"): only the row
  copy is kept.  One round per feature t (and inner pass): every worker updates ``w_t`` of its
  users against ``h_t`` and computes the items' partial sums ``(sum_i e^_ij w_i, sum_i w_i^2)``
  and ``sum e^^2``.  It sends the partial sums to every other worker (`Sends`, all to all),
  and each worker adds them, in partition order, and solves the item update
  ``h_t = num / (lambda + den)`` itself at the start of its next push; the driver's pull solves
  the same update from the same sums only to score the round (the exact loss), and sends
  nothing back.  So a round needs no call from the driver: on Dask the rounds of an iteration
  run in batches (`Program.batch_rounds`), one call per worker for many rounds, which matters
  because a round carries only milliseconds of work.  The rank-one bookkeeping of CCD++
  (remove the finished feature's term, add the next one's) is fused into the next round's pass
  over the ratings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import config
from ..engine.program import Broadcast, DriverState, Message, Program, Sends, unexpected
from ..kernels import mf as kernels
from ..utils.text import plural


def auto_block_size(n_components: int, n_users: int, n_items: int) -> int:
    """Largest coordinate block whose broadcast (n_users + n_items) x B float64 fits
    ``dmp.matrix-factorization.auto-block-bytes`` (in flight per round, all parts), at most
    ``n_components``."""
    per = 8 * (n_users + n_items)
    budget = config.nbytes("dmp.matrix-factorization.auto-block-bytes")
    return int(max(1, min(n_components, budget // per)))


# ====================================================================== messages
# CCD: plans and updates
@dataclass(frozen=True)
class CCDInitPlan(Message):
    """Round 0: the partition's rating counts and sums."""

    round: int
    iteration: int
    #: (side, k0, k1): the coordinate block the next round needs ("W" or "H")
    next: tuple


@dataclass(frozen=True)
class CCDBlockPlan(Message):
    """Exact CCD on coordinates ``k0..k1`` of one factor (`CCDWPlan`, `CCDHPlan`)."""

    round: int
    iteration: int
    block: int
    k0: int
    k1: int
    #: the last round of the iteration
    end: bool
    next: tuple


@dataclass(frozen=True)
class CCDWPlan(CCDBlockPlan):
    """A block of the users' factors W."""


@dataclass(frozen=True)
class CCDHPlan(CCDBlockPlan):
    """A block of the items' factors H."""


@dataclass(frozen=True)
class CCDInitUpdate(Message):
    round: int
    #: the ratings' mean (0 without centring)
    mean: float


@dataclass(frozen=True)
class CCDWUpdate(Message):
    """W changed on coordinates ``k = (k0, k1)``: bring the column copies up to date."""

    round: int
    k: tuple


@dataclass(frozen=True)
class CCDHUpdate(Message):
    """H changed on coordinates ``k = (k0, k1)``: bring the row copies up to date."""

    round: int
    k: tuple


_CCD_PLANS = (CCDInitPlan, CCDWPlan, CCDHPlan)
_CCD_UPDATES = (CCDInitUpdate, CCDWUpdate, CCDHUpdate)


# CCD++: plans (its pulls send nothing)
@dataclass(frozen=True)
class PPInitPlan(Message):
    """Round 0: counts and sums, and the items' starting values of feature 0."""

    round: int
    iteration: int
    t: int


@dataclass(frozen=True)
class PPFeaturePlan(Message):
    """Pass ``inner_pass`` of the rank-one update of feature ``t``."""

    round: int
    iteration: int
    t: int
    inner_pass: int
    #: the feature's last pass: the next round works on feature ``next_t``
    feature_end: bool
    next_t: int
    #: the last round of the iteration
    end: bool


_PP_PLANS = (PPInitPlan, PPFeaturePlan)


@dataclass
class MFDriver(DriverState):
    """The driver's state of the MF programs (`CCDProgram`, `CCDPPProgram`)."""

    n_partitions: int
    #: the ratings' mean, the objective now and at the end of the last iteration
    mean: float = 0.0
    objective: float = np.nan
    prev_objective: float = np.nan
    iteration: int = 0
    converged: bool = False
    #: training and validation ratings
    nnz: int = 0
    nnz_valid: int = 0
    #: metrics of the last pulled round
    metrics: dict = field(default_factory=dict)
    #: CCD++: the items' regularisation weights and term, once round 0 is pulled
    lam_cols: np.ndarray | None = field(default=None, repr=False)
    regH: float | None = None


def MFProgram(dataset, *, method="ccd++", cg_steps=3, **kwargs):
    """The program for ``method`` ("ccd", "als" or "ccd++")."""
    if method == "ccd":
        return CCDProgram(dataset, **kwargs)
    if method == "als":
        return CCDProgram(dataset, cg_steps=cg_steps, **kwargs)
    if method == "ccd++":
        kwargs.pop("block_size", None)
        return CCDPPProgram(dataset, **kwargs)
    raise ValueError(f"unknown method {method!r}; use 'ccd', 'als' or 'ccd++'")


def _sum_squares(x: np.ndarray) -> float:
    """``x @ x``, accumulated in float64 whatever ``x``'s precision."""
    return float(x @ x) if x.dtype == np.float64 else kernels.sum_squares(x)


#: block ALS starts from H = ALS_INIT_SCALE * (U(0, 1) - 1/2)
ALS_INIT_SCALE = 0.1


class _MFBase(Program):
    """What both methods share: partitions, the init round, metrics, stopping, state."""

    name = "mf"
    primary_metric = "objective"
    primary_direction = "min"
    method = ""
    gather_partitions = False
    #: per-partition arrays saved in checkpoints
    _STATE: tuple = ()
    #: None: STRADS' H ~ U(0, 1); else H = init_scale * (U(0, 1) - 1/2)
    init_scale: float | None = None
    #: driver entries saved in checkpoints
    _DRIVER = ("mean", "objective", "prev_objective", "iteration", "converged", "nnz",
               "nnz_valid")

    def __init__(self, dataset, *, n_components, alpha, n_inner=1, center=True,
                 reg_scaling="none", tol=1e-4, seed=0, dtype=np.float64):
        super().__init__()
        self.dataset = dataset
        #: the factors' and residuals' precision (float32: CCDProgram only)
        self.dtype = np.dtype(dtype)
        self.K = int(n_components)
        self.alpha = float(alpha)
        self.n_inner = int(n_inner)
        self.center = bool(center)
        self.reg_scaling = reg_scaling
        self.tol = tol
        self.seed = int(seed)
        self.has_valid = "valid" in tuple(getattr(dataset, "splits", ("train",)))

    # ------------------------------------------------------------------ driver side
    def partition_specs(self, n_partitions: int) -> list:
        ds = self.dataset
        n_users, n_items = ds.shape
        if n_partitions > min(n_users, n_items):
            raise ValueError(f"{n_partitions} workers cannot share {plural(n_users, 'user')} "
                             f"and {plural(n_items, 'item')} (each worker owns at least one "
                             f"of each)")
        rb = ds.balanced_bounds(n_partitions, 0)
        cb = ds.balanced_bounds(n_partitions, 1)
        return [{"k": k, "n_parts": n_partitions, "rows": (int(rb[k]), int(rb[k + 1])),
                 "cols": (int(cb[k]), int(cb[k + 1]))} for k in range(n_partitions)]

    def start(self, n_partitions: int) -> None:
        self.driver = MFDriver(n_partitions=n_partitions)
        # the partitions exist: their sizes' pointers (`_nnz`) are not needed for the fit
        self.__dict__.pop("_indptrs", None)

    def _mean(self, parts) -> float:
        """The mean of every partition's ratings (0 without centring), from the init round's
        counts and sums; the driver and (CCD++) every partition compute it alike."""
        nnz = int(sum(p["count"] for p in parts))
        total = float(sum(p["sum"] for p in parts))
        return total / nnz if (self.center and nnz) else 0.0

    def _init_pull(self, partials) -> tuple[float, float]:
        """Counts and the mean (``driver.mean``) from the init round; returns the starting
        (loss, vloss)."""
        dr = self.driver
        dr.nnz = int(sum(p["count"] for p in partials))
        dr.nnz_valid = int(sum(p["count_valid"] for p in partials))
        total = float(sum(p["sum"] for p in partials))
        mean = self._mean(partials)
        dr.mean = mean
        sq = float(sum(p["sumsq"] for p in partials))
        vs = float(sum(p["sum_valid"] for p in partials))
        vsq = float(sum(p["sumsq_valid"] for p in partials))
        return (sq - 2.0 * mean * total + dr.nnz * mean * mean,
                vsq - 2.0 * mean * vs + dr.nnz_valid * mean * mean)

    def _record(self, info, loss, vloss, reg) -> None:
        dr = self.driver
        objective = loss + reg
        dr.objective = objective
        dr.iteration = info["iteration"]
        dr.metrics = {
            "iteration": info["iteration"], "phase": info["phase"], "objective": objective,
            "train_rmse": math.sqrt(max(loss, 0.0) / dr.nnz) if dr.nnz else np.nan,
            "valid_rmse": (math.sqrt(max(vloss, 0.0) / dr.nnz_valid)
                           if dr.nnz_valid else np.nan)}
        if info.get("end"):
            prev = dr.prev_objective
            if self.tol is not None and np.isfinite(prev) and prev > 0:
                dr.converged = (prev - objective) <= self.tol * prev
            dr.prev_objective = objective

    def metrics(self) -> dict:
        return dict(self.driver.metrics)

    def progress_postfix(self) -> dict:
        m = self.driver.metrics
        out = {"it": m.get("iteration"), "objective": f"{m.get('objective', np.nan):.5g}"}
        if np.isfinite(m.get("valid_rmse", np.nan)):
            out["valid_rmse"] = f"{m['valid_rmse']:.4f}"
        return out

    def converged(self) -> bool:
        return bool(self.driver.converged)

    def driver_state(self) -> dict:
        dr = self.driver
        unset = [k for k in self._DRIVER if getattr(dr, k) is None]
        if unset:
            raise RuntimeError(f"{type(self).__name__}'s driver state is complete once round "
                               f"0 is pulled ({', '.join(unset)} not set yet)")
        return {k: getattr(dr, k) for k in self._DRIVER}

    def load_driver_state(self, state: dict) -> None:
        dr = self.driver
        for k, v in state.items():
            setattr(dr, k, v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v)
        dr.converged = bool(dr.converged)
        dr.nnz, dr.nnz_valid = int(dr.nnz), int(dr.nnz_valid)

    # ------------------------------------------------------------------ worker side
    def _load(self, what, a, b, split):
        if split == "valid" and not self.has_valid:
            return (np.zeros(b - a + 1, np.int64), np.zeros(0, np.int32), np.zeros(0))
        indptr, indices, data = (self.dataset.load_rows(a, b, split) if what == "rows"
                                 else self.dataset.load_cols(a, b, split))
        return (np.ascontiguousarray(indptr, dtype=np.int64),
                np.ascontiguousarray(indices, dtype=np.int32),
                np.ascontiguousarray(data, dtype=np.float64))

    def _lam(self, indptr, n):
        if self.reg_scaling == "count":
            return self.alpha * np.diff(indptr).astype(np.float64)
        return np.full(n, self.alpha)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_indptrs", None)   # the driver's copies (`_nnz`)
        return state

    def _nnz(self, axis: int, a: int, b: int) -> int:
        """Ratings (train and validation) of users (axis 0) or items (axis 1) a..b-1."""
        # each pointer read from the store once per program, not once per partition: the
        # memory check before a fit asks for every partition's size
        ptrs = self.__dict__.setdefault("_indptrs", {})
        total = 0
        for split in (("train", "valid") if self.has_valid else ("train",)):
            ip = ptrs.get((axis, split))
            if ip is None:
                ip = ptrs[axis, split] = (self.dataset.row_indptr(split) if axis == 0
                                          else self.dataset.col_indptr(split))
            total += int(ip[b] - ip[a])
        return total

    def partition_nbytes(self, spec):
        if not hasattr(self.dataset, "row_indptr"):
            return None
        (r0, r1), (c0, c1) = spec["rows"], spec["cols"]
        # by-user CSR copy: indptr, int32 index, rating and residual (20 bytes a rating);
        # the worker's rows of W and columns of H
        return (self._nnz(0, r0, r1) * (12 + self.dtype.itemsize) + (r1 - r0) * 16
                + (r1 - r0 + c1 - c0) * self.K * self.dtype.itemsize)

    def _init_common(self, spec):
        (r0, r1), (c0, c1) = spec["rows"], spec["cols"]
        st = {"k": spec["k"], "P": spec["n_parts"], "r0": r0, "c0": c0}
        st["rows"] = self._load("rows", r0, r1, "train")
        st["vrows"] = self._load("rows", r0, r1, "valid")
        st["er"] = st["rows"][2].astype(self.dtype)
        st["evr"] = st["vrows"][2].astype(self.dtype)
        st["lam_rows"] = self._lam(st["rows"][0], r1 - r0).astype(self.dtype, copy=False)
        # STRADS initialisation: W = 0, H ~ U(0, 1), keyed by item id (partition-free)
        st["W"] = np.zeros((r1 - r0, self.K), self.dtype)
        H = kernels.uniform_init(self.seed, 1, c0, c1 - c0, self.K)
        if self.init_scale is not None:
            H = (H - 0.5) * self.init_scale
        st["H"] = H.astype(self.dtype, copy=False)
        st["regW"] = 0.0
        return st

    def _init_stats(self, st, out) -> None:
        d, vd = st["rows"][2], st["vrows"][2]
        out.update(count=len(d), sum=float(d.sum()), sumsq=float(d @ d), count_valid=len(vd),
                   sum_valid=float(vd.sum()), sumsq_valid=float(vd @ vd))

    def partition_arrays(self, st) -> dict:
        out = {k: st[k] for k in self._STATE}
        out["reg"] = np.array([st["regW"], st.get("regH", 0.0)])
        return out

    def restore_partition(self, st, arrays: dict) -> None:
        missing = [k for k in (*self._STATE, "reg") if k not in arrays]
        if missing:
            raise ValueError(f"the checkpoint of partition {st['k']} lacks {missing} (written "
                             f"by another version of dmp?); resume=False starts over")
        for k in self._STATE:
            st[k] = np.asarray(arrays[k])
        st.get("inbox", {}).clear()  # parts of rounds after the checkpoint are stale
        st["regW"], st["regH"] = (float(v) for v in arrays["reg"])

    def _WH(self, st):
        """This partition's rows of W and of H (users x K, items x K; may be views)."""
        return st["W"], st["H"]

    def factor_arrays(self, st) -> dict:
        """This partition's ``{"W": rows of W, "H": rows of H}`` (views; collected piece by
        piece at the end of a fit)."""
        W, H = self._WH(st)
        return {"W": W, "H": H}

    def factors(self, st):
        """(first user, W rows, first item, H rows) of this partition."""
        W, H = self._WH(st)
        return st["r0"], np.ascontiguousarray(W), st["c0"], np.ascontiguousarray(H)

    def save_factors(self, st, path):
        """Write this partition's W and H rows to ``path`` (a Zarr group) as arrays
        ``W/<k>`` and ``H/<k>``, on the worker; return their positions."""
        import zarr

        g = zarr.open_group(path, mode="a", zarr_format=3)
        W, H = self._WH(st)
        for name, F in (("W", W), ("H", H)):
            rows = max(1, min(len(F), (16 << 20) // (8 * F.shape[1])))
            a = g.create_array(f"{name}/{st['k']:05d}", shape=F.shape, dtype="float64",
                               chunks=(rows, F.shape[1]), overwrite=True)
            for s in range(0, len(F), rows):  # chunk by chunk: no copy of the whole block
                a[s:s + rows] = F[s:s + rows]
        return st["k"], st["r0"], len(W), st["c0"], len(H)


class CCDProgram(_MFBase):
    """Exact cyclic coordinate descent, ``block_size`` coordinates per round (see module);
    with ``cg_steps``, block ALS: each row's block solved by that many CG steps instead."""

    method = "ccd"
    _STATE = ("W", "H", "er", "ec", "evr", "evc", "O")
    # the blocks go worker to worker, never through the driver (32-64 MB a round at rank 200)
    uses_ring = True

    def __init__(self, dataset, *, block_size=None, cg_steps=None, **kwargs):
        super().__init__(dataset, **kwargs)
        self.cg_steps = None if cg_steps is None else int(cg_steps)
        if self.cg_steps is not None:
            self.method = "als"
            # CG from a centred, small H: U(0, 1)'s common mean makes the first solves
            # ill-conditioned (one large eigenvalue), and ALS then needs 1-2 more iterations
            # to the same test RMSE (BENCHMARKS.md, "Block ALS")
            self.init_scale = ALS_INIT_SCALE
        self.block_size = int(block_size or self.K)
        # ALS on one block of all K coordinates recomputes each residual from its rating
        # while it reads the other side's row anyway: `apply` then leaves the training
        # residuals of the other side's update alone (a pass over every rating saved)
        self._fresh = self.cg_steps is not None and self.block_size == self.K
        if self._fresh:   # the mean is then part of each partition's state
            self._STATE = CCDProgram._STATE + ("mean",)
        kb = list(range(0, self.K, self.block_size)) + [self.K]
        self.block_bounds = np.asarray(kb, dtype=np.int64)
        self.rounds_per_iter = 2 * (len(kb) - 1)

    def round_info(self, round: int) -> dict:
        """What round ``round`` does (a pure function of the round number)."""
        if round == 0:
            info = {"phase": "init", "iteration": 0}
        else:
            it, pos = divmod(round - 1, self.rounds_per_iter)
            nb = len(self.block_bounds) - 1
            half, b = divmod(pos, nb)
            info = {"phase": "W" if half == 0 else "H", "iteration": it + 1, "block": b,
                    "k0": int(self.block_bounds[b]), "k1": int(self.block_bounds[b + 1]),
                    "end": pos == self.rounds_per_iter - 1}
        return info

    def schedule(self, round: int) -> list:
        info = self.round_info(round)
        nxt = self.round_info(round + 1)
        # a W round needs H's block and vice versa: each worker pushes its own part of it
        after = ("H" if nxt["phase"] == "W" else "W", nxt["k0"], nxt["k1"])
        if info["phase"] == "init":
            plan = CCDInitPlan(round=round, iteration=info["iteration"], next=after)
        else:
            plan = (CCDWPlan if info["phase"] == "W" else CCDHPlan)(
                round=round, iteration=info["iteration"], block=info["block"], k0=info["k0"],
                k1=info["k1"], end=info["end"], next=after)
        return [plan] * self.driver.n_partitions

    def pull(self, round: int, partials: list):
        info = self.round_info(round)
        if info["phase"] == "init":
            loss, vloss = self._init_pull(partials)
            update = CCDInitUpdate(round=round, mean=self.driver.mean)
        else:
            update = (CCDWUpdate if info["phase"] == "W" else CCDHUpdate)(
                round=round, k=(info["k0"], info["k1"]))
            loss = float(sum(p["loss"] for p in partials))
            vloss = float(sum(p["loss_valid"] for p in partials))
        self._record(info, loss, vloss, float(sum(p["reg"] for p in partials)))
        return Broadcast(update)

    def partition_nbytes(self, spec):
        base = super().partition_nbytes(spec)
        if base is None:
            return None
        c0, c1 = spec["cols"]
        n_users, n_items = self.dataset.shape
        # the by-item copy, and the other side's coordinate block in flight (twice)
        return (base + self._nnz(1, c0, c1) * 20 + (c1 - c0) * 16
                + 2 * max(n_users, n_items) * self.block_size * 8)

    def init_partition(self, spec):
        st = self._init_common(spec)
        c0, c1 = spec["cols"]
        st["cols"] = self._load("cols", c0, c1, "train")
        st["vcols"] = self._load("cols", c0, c1, "valid")
        st["ec"] = st["cols"][2].astype(self.dtype)
        st["evc"] = st["vcols"][2].astype(self.dtype)
        st["lam_cols"] = self._lam(st["cols"][0], c1 - c0).astype(self.dtype, copy=False)
        st["regH"] = float(st["lam_cols"].astype(np.float64)
                           @ np.einsum("ij,ij->i", st["H"], st["H"], dtype=np.float64))
        st["O"] = np.zeros((0, 0), self.dtype)  # the other side's block for the next push
        st["inbox"] = {}           # round -> {partition: its parts of that round}
        return st

    def receive(self, st, round, src, payload) -> None:
        st["inbox"].setdefault(round, {})[src] = payload

    @staticmethod
    def _joined(got: dict, key: str) -> np.ndarray:
        """The partitions' parts ``got[q][key]`` as one block: users and items are contiguous
        ranges in partition order (one part is used as is: push made it a fresh array)."""
        parts = [got[q][key] for q in range(len(got))]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def push(self, st, plan):
        if not isinstance(plan, _CCD_PLANS):
            raise unexpected(self, "a plan", plan, _CCD_PLANS)
        side, a, b = plan.next
        out, parts = {}, {}
        match plan:
            case CCDInitPlan():
                self._init_stats(st, out)
            case CCDWPlan():
                self._update_block(st, plan, ("rows", "vrows", "er", "evr", "W", "lam_rows",
                                              "regW"), out, parts)
            case CCDHPlan():
                self._update_block(st, plan, ("cols", "vcols", "ec", "evc", "H", "lam_cols",
                                              "regH"), out, parts)
        out["reg"] = st["regW"] + st["regH"]
        # this partition's part of the block the next round needs, after this round's update
        parts["next"] = np.array((st["W"] if side == "W" else st["H"])[:, a:b])
        st["inbox"].setdefault(plan.round, {})[st["k"]] = parts
        return Sends(out, {q: parts for q in range(st["P"]) if q != st["k"]})

    def _update_block(self, st, plan: CCDBlockPlan, names, out, parts) -> None:
        """Exact CCD (or block ALS) on the plan's coordinates of one side (W: ``names`` of
        the row copy, H: of the column copy)."""
        data, vdata, res, vres, F, lam, rk = names
        k0, k1 = plan.k0, plan.k1
        indptr, indices, _ = st[data]
        O = st["O"]
        delta = np.empty((indptr.shape[0] - 1, k1 - k0), self.dtype)
        if self.cg_steps is None:
            kernels.ccd_block_update(indptr, indices, st[res], st[F], k0, O, st[lam], delta)
        else:
            # the mean only matters (and is only kept in checkpoints) when residuals are
            # recomputed from the ratings
            mean = st["mean"][0] if self._fresh else 0.0
            kernels.cg_block_update(indptr, indices, st[res], st[F], k0, O, st[lam], delta,
                                    self.cg_steps, st[data][2], mean, self._fresh)
        vp, vi, _ = st[vdata]
        kernels.subtract_lowrank(vp, vi, st[vres], delta, 0, O)
        new = st[F][:, k0:k1]
        st[rk] += float(st[lam].astype(np.float64)
                        @ np.einsum("ij,ij->i", delta, 2.0 * new - delta, dtype=np.float64))
        parts["delta"] = delta
        out["loss"] = _sum_squares(st[res])
        out["loss_valid"] = _sum_squares(st[vres])

    def apply(self, st, update) -> None:
        if not isinstance(update, _CCD_UPDATES):
            raise unexpected(self, "an update", update, _CCD_UPDATES)
        got = st["inbox"].pop(update.round)
        if len(got) != st["P"]:
            raise RuntimeError(f"partition {st['k']}: round {update.round} has the blocks "
                               f"of {sorted(got)}, expected all {st['P']} partitions")
        st["O"] = self._joined(got, "next")
        match update:
            case CCDInitUpdate(mean=mu):
                st["mean"] = np.array([mu])
                if mu != 0.0:
                    for res in ("er", "ec", "evr", "evc"):
                        st[res] -= mu
                return
            case CCDWUpdate():  # users changed: bring the column copies up to date
                pairs, F = (("cols", "ec"), ("vcols", "evc")), st["H"]
            case CCDHUpdate():
                pairs, F = (("rows", "er"), ("vrows", "evr")), st["W"]
        k0, _ = update.k
        delta = self._joined(got, "delta")
        if self._fresh:
            pairs = pairs[1:]
        for data, res in pairs:
            indptr, indices, _ = st[data]
            kernels.subtract_lowrank(indptr, indices, st[res], F, k0, delta)


class CCDPPProgram(_MFBase):
    """CCD++ with the items' partial sums exchanged worker to worker (see module)."""

    method = "ccd++"
    # factors stored by feature (K x users, K x items) so that a feature is contiguous
    _STATE = ("Wt", "Ht", "er", "evr", "pend", "h_out", "hfull", "lam_cols")
    _DRIVER = _MFBase._DRIVER + ("regH", "lam_cols")
    # every partition sends its partial sums to every other one: each solves the item update
    # itself, so the driver's pull only keeps the score and rounds run in batches
    uses_ring = True

    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, **kwargs)
        if self.dtype != np.float64:
            raise ValueError(f"method 'ccd++' computes in float64 (dtype {self.dtype} is "
                             f"for methods 'als' and 'ccd')")
        self.block_size = 1
        self.rounds_per_iter = self.K * self.n_inner

    def round_info(self, round: int) -> dict:
        """What round ``round`` does (a pure function of the round number)."""
        if round == 0:
            return {"phase": "init", "iteration": 0, "t": 0}
        it, pos = divmod(round - 1, self.rounds_per_iter)
        t, s = divmod(pos, self.n_inner)
        return {"phase": "WH", "iteration": it + 1, "t": t, "pass": s,
                "feature_end": s == self.n_inner - 1, "next_t": (t + 1) % self.K,
                "end": pos == self.rounds_per_iter - 1}

    def schedule(self, round: int) -> list:
        info = self.round_info(round)
        if info["phase"] == "init":
            plan = PPInitPlan(round=round, iteration=info["iteration"], t=info["t"])
        else:
            plan = PPFeaturePlan(round=round, iteration=info["iteration"], t=info["t"],
                                 inner_pass=info["pass"], feature_end=info["feature_end"],
                                 next_t=info["next_t"], end=info["end"])
        return [plan] * self.driver.n_partitions

    def ring_inbox(self, round):
        P = self.driver.n_partitions
        return [P - 1] * P

    def batch_rounds(self, round: int) -> int:
        # up to the end of the iteration: convergence is judged there (`needs_barrier`)
        if round == 0:
            return 1
        return self.rounds_per_iter - (round - 1) % self.rounds_per_iter

    def needs_barrier(self, round: int) -> bool:
        # an iteration starts once the one before was scored, so that a converged fit stops
        # exactly at its end whatever the staleness
        return round > 1 and (round - 1) % self.rounds_per_iter == 0

    # the driver and every partition solve the same item update from the same partial
    # sums, added in partition order, so they agree to the last bit
    def _lam_cols(self, parts) -> np.ndarray:
        counts = self._summed(parts, "item_counts")
        return (self.alpha * counts if self.reg_scaling == "count"
                else np.full(len(counts), self.alpha))

    @staticmethod
    def _summed(parts, key) -> np.ndarray:
        """``parts[q][key]`` added in partition order (``np.sum(..., axis=0)``'s additions,
        without stacking the arrays first; one partition's array itself, not a copy)."""
        out = parts[0][key]
        if len(parts) > 1:
            out = out.copy()
            for p in parts[1:]:
                out += p[key]
        return out

    @classmethod
    def _solve(cls, parts, lam_cols):
        """(num, den, h): the summed partial sums and the item update they give."""
        num, den = cls._summed(parts, "num"), cls._summed(parts, "den")
        d = lam_cols + den
        return num, den, np.divide(num, d, out=np.zeros_like(num), where=d > 0)

    def _gather_items(self, partials, key) -> np.ndarray:
        return np.concatenate([p[key] for p in partials])

    def pull(self, round: int, partials: list):
        dr = self.driver
        info = self.round_info(round)
        if info["phase"] == "init":
            loss, vloss = self._init_pull(partials)
            dr.lam_cols = self._lam_cols(partials)
            dr.regH = float(dr.lam_cols @ self._gather_items(partials, "h_sqnorm"))
            self._record(info, loss, vloss, dr.regH)
            return None
        regW = float(sum(p["regW"] for p in partials))
        if "scored" in partials[0]:   # scored by partition 0 (`close_batch`)
            loss, vloss, d_regH = partials[0]["scored"]
        else:
            num, den, h = self._solve(partials, dr.lam_cols)
            loss, vloss, d_regH = self._score(partials, num, den, h,
                                              self._gather_items(partials, "h_t"),
                                              dr.lam_cols, self.has_valid)
        dr.regH += d_regH
        self._record(info, loss, vloss if dr.nnz_valid else 0.0, regW + dr.regH)
        return None

    @classmethod
    def _score(cls, parts, num, den, h, h_old, lam_cols, valid) -> tuple[float, float, float]:
        """(loss, validation loss, change of the items' regularisation term) of a feature
        pass, from the partitions' partial sums and the item update they give: the driver
        and partition 0 (`close_batch`) compute it alike, to the last bit."""
        # sum (e^ - w h)^2 = sum e^2 - 2 h.num + h^2.den
        hh = h * h
        loss = float(sum(p["sq"] for p in parts)) - 2.0 * float(h @ num) + float(hh @ den)
        vloss = 0.0
        if valid:
            vn, vd = cls._summed(parts, "vnum"), cls._summed(parts, "vden")
            vloss = (float(sum(p["vsq"] for p in parts)) - 2.0 * float(h @ vn)
                     + float(hh @ vd))
        return loss, vloss, float(lam_cols @ (hh - h_old * h_old))

    def close_batch(self, st, round: int, partials: list) -> list:
        """Inside a batch, a feature pass is scored by partition 0 when it takes that
        round's partial sums in (the next round's push; the others send it their
        validation sums too), so the driver receives every partition's item vectors for the
        batch's last round only."""
        scored = {}
        for part in partials:
            scored.update(part.pop("scored", {}))   # partition 0's, of the round before each
        for j, part in enumerate(partials[:-1]):
            r = round + j
            if self.round_info(r)["phase"] != "WH":
                continue
            for key in ("num", "den", "h_t", "vnum", "vden"):
                part.pop(key, None)
            if st["k"] == 0:
                if r not in scored:
                    raise RuntimeError(f"partition 0 did not score round {r} of its batch")
                part["scored"] = scored[r]
        return partials

    def partition_nbytes(self, spec):
        base = super().partition_nbytes(spec)
        # item-length vectors: the current feature, partial sums (train, validation), and
        # every partition's partial sums of the round in flight
        P = spec["n_parts"]
        return None if base is None else base + self.dataset.shape[1] * 8 * (7 + 4 * P)

    def init_partition(self, spec):
        st = self._init_common(spec)
        st["Wt"] = np.zeros((self.K, len(st.pop("W"))))
        st["Ht"] = np.ascontiguousarray(st.pop("H").T)
        n_items = self.dataset.shape[1]
        st["pend"] = np.array([-2], dtype=np.int64)  # feature whose term is still to remove
        st["h_out"] = np.zeros(0)                   # that feature's final item values
        st["hfull"] = np.zeros(n_items)             # the current feature's item values
        st["lam_cols"] = np.zeros(n_items)
        st["inbox"] = {}                            # round -> {partition: its partial sums}
        st["scored"] = {}                           # round -> its score (partition 0)
        return st

    def receive(self, st, round, src, payload) -> None:
        st["inbox"].setdefault(round, {})[src] = payload

    def _absorb(self, st, before=None) -> None:
        """Apply every round (earlier than ``before``) whose partial sums all arrived: the
        item update of its feature, as the driver's pull solves it."""
        P = st["P"]
        for r in sorted(st["inbox"]):
            if (before is not None and r >= before) or len(st["inbox"][r]) < P:
                break
            got = st["inbox"].pop(r)
            parts = [got[q] for q in range(P)]
            info = self.round_info(r)
            if info["phase"] == "init":
                mu = self._mean(parts)
                if mu != 0.0:
                    st["er"] -= mu
                    st["evr"] -= mu
                st["lam_cols"] = self._lam_cols(parts)
                # open feature 0 (its term is added back by the first round's pass)
                st["pend"][0] = -1
                h = self._gather_items(parts, "h_t")
                st["h_out"] = np.zeros_like(h)
                st["hfull"] = h
                continue
            t = info["t"]
            num, den, h = self._solve(parts, st["lam_cols"])
            if st["k"] == 0:
                st["scored"][r] = self._score(parts, num, den, h, st["hfull"], st["lam_cols"],
                                              self.has_valid)
            c0 = st["c0"]
            st["Ht"][t] = h[c0:c0 + st["Ht"].shape[1]]
            if info["feature_end"]:
                # feature t is done: its term leaves the residuals, the next one's enters
                # (both in the next round's pass)
                st["pend"][0] = t
                st["h_out"] = h
                st["hfull"] = (h if info["next_t"] == t
                               else self._gather_items(parts, "h_next"))
            else:
                st["hfull"] = h

    def push(self, st, plan):
        if not isinstance(plan, _PP_PLANS):
            raise unexpected(self, "a plan", plan, _PP_PLANS)
        t, rnd = plan.t, plan.round
        self._absorb(st, before=rnd)
        out = {"h_t": st["Ht"][t].copy()}  # own items' current values of feature t
        if st["scored"]:   # the round before, for `close_batch`
            out["scored"], st["scored"] = st["scored"], {}
        match plan:
            case PPInitPlan():
                self._init_stats(st, out)
                out["item_counts"] = np.bincount(st["rows"][1],
                                                 minlength=self.dataset.shape[1])
                out["h_sqnorm"] = np.einsum("ij,ij->j", st["Ht"], st["Ht"])
                msg = {k: out[k] for k in ("count", "sum", "item_counts", "h_t")}
                return self._share(st, rnd, out, msg)
            case PPFeaturePlan():
                return self._feature_pass(st, plan, t, rnd, out)

    def _feature_pass(self, st, plan: PPFeaturePlan, t: int, rnd: int, out: dict):
        """The rank-one pass of feature ``t`` over this partition's users."""
        n_items = self.dataset.shape[1]
        indptr, indices, _ = st["rows"]
        f = np.empty(indptr.shape[0] - 1)
        old = st["Wt"][t].copy()
        t_out = int(st["pend"][0])  # -2: nothing to swap, -1: open feature 0 only
        swap = t_out != -2
        if t_out >= 0:
            f_out, h_out = st["Wt"][t_out], st["h_out"]
        elif t_out == -1:
            f_out, h_out = np.zeros_like(old), st["h_out"]
        else:
            f_out, h_out = old, st["hfull"]  # unused
        num, den = np.zeros(n_items), np.zeros(n_items)
        sq = kernels.rank1_row_pass(indptr, indices, st["er"], swap, f_out, h_out, old,
                                    st["hfull"], st["lam_rows"], f, num, den)
        vp, vi, _ = st["vrows"]
        msg0 = None
        if self.has_valid:
            vn, vd = np.zeros(n_items), np.zeros(n_items)
            vs = kernels.rank1_column_sums(vp, vi, st["evr"], swap, f_out, h_out, old, st["hfull"],
                                           f, vn, vd)
            out.update(vnum=vn, vden=vd, vsq=vs)
            msg0 = {"vnum": vn, "vden": vd, "vsq": vs}   # for partition 0, which scores
        st["pend"][0] = -2
        st["Wt"][t] = f
        st["regW"] += float(st["lam_rows"] @ (f * f - old * old))
        out.update(num=num, den=den, sq=sq, regW=st["regW"])
        msg = {"num": num, "den": den, "sq": sq}
        if plan.feature_end and plan.next_t != t:
            msg["h_next"] = st["Ht"][plan.next_t].copy()
        return self._share(st, rnd, out, msg, None if msg0 is None else {**msg, **msg0})

    @staticmethod
    def _share(st, rnd, out, msg, msg0=None):
        """Send ``msg`` to every other partition (``msg0`` instead, if given, to partition
        0) and keep this partition's own."""
        msg0 = msg if msg0 is None else msg0
        st["inbox"].setdefault(rnd, {})[st["k"]] = msg0 if st["k"] == 0 else msg
        return Sends(out, {q: msg0 if q == 0 else msg for q in range(st["P"]) if q != st["k"]})

    def _WH(self, st):
        self._absorb(st)
        return st["Wt"].T, st["Ht"].T

    def partition_arrays(self, st) -> dict:
        self._absorb(st)
        return super().partition_arrays(st)
