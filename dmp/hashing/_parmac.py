"""ParMAC for the binary autoencoder, as a `dmp.engine.Program` (docs/algorithms.md, "The ring").

Points are sharded over the P partitions (the ring); a partition's points ``X_p`` and their
codes ``Z_p`` never leave it.  Only the submodels move:

* **encoder**: ``L`` linear SVM units ``h_l(x) = step(A_l x + a_l)``;
* **decoder**: ``D`` linear units ``f_d(z) = B_d z + b_d`` -- solved exactly from summed
  normal equations (``decoder="exact"``: each partition reports ``[Z 1]^T [Z 1]`` and
  ``[Z 1]^T X``, sums of submodel size) or trained by SGD on the ring like the encoder
  (``decoder="sgd"``).

The travelling units are dealt into P groups.  One MAC iteration (penalty ``mu``):

1. **W step** -- ``e P`` hops: in hop ``h`` partition ``p`` runs one SGD pass over its own
   points (locally shuffled minibatches) on group ``(p + h) mod P`` and hands the group to
   partition ``p - 1`` (worker to worker).  After ``P`` hops every group has seen every point
   once (one epoch).  Then ``P - 1`` communication-only hops pass the final groups round,
   so every partition holds every submodel.  With ``w_step="dcd"`` a hop is one pass of
   dual coordinate descent instead (L2-loss SVMs on centred, whitened points): each point's
   duals stay on its partition, only the weights travel, so the P partitions run one cyclic
   dual coordinate descent over all points, warm-started from the last W step.
2. **check** -- every partition reports ``E_BA`` and ``||Z - h(X)||^2`` of the new model;
   partition 0 also sends its copy of the model (for the driver's validation precision).
   The driver keeps the model with the best validation precision so far (the result).
3. **Z step** -- every partition updates its codes (exact enumeration for short codes,
   alternating bit optimisation otherwise; QR trick).  Stop when ``Z = h(X)``.

Before the first iteration: data statistics (min, range, mean, covariance: summed over
partitions), ITQ rotations (each an ``L x L`` sum), and ``Z = h_ITQ(X)``.  After a worker
loss the partitions are re-created (the lost points are read again by a live worker), the
model restored from the driver's copy, the codes re-derived by a Z step from ``h(X)``, and
the interrupted iteration starts over.  New shards can join between iterations
(``arrivals``): the partition with the fewest points loads them.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..engine.program import Broadcast, DriverState, Message, Program, Sends, unexpected
from ._itq import procrustes
from ._retrieval import hamming_search, pack_codes, retrieval_precision
from ._wstep import (dcd_relabel, dcd_svm, decoder_normal_equations, sgd_linear, sgd_svm,
                     solve_decoder)
from . import _kernels
from ._zstep import z_step, z_step_qr

_ROWS = 65536
#: ``mu0="auto"``: ``mu0 = MU0_AUTO * E_0 / 16``, ``E_0`` the ITQ start's mean reconstruction
#: error (BENCHMARKS.md, "Binary autoencoder against ITQ on real images")
MU0_AUTO = 1.0
#: rows per block of the Z step (its float64 temporaries stay in the caches)
_Z_ROWS = 4096


def unit_groups(n_units: int, n_groups: int) -> list[np.ndarray]:
    """Units ``u`` with ``u mod n_groups == g``, for every group ``g``."""
    return [np.arange(g, n_units, n_groups) for g in range(n_groups)]


def minibatch_order(n: int, batch: int, rng) -> np.ndarray:
    """A pass's visiting order: the full minibatches of ``batch`` consecutive points in
    random order, then the partial one.  The points were shuffled once when the partition
    was loaded, so minibatches are random yet each is read from contiguous memory (a random
    point order made the SGD pass wait on memory for every point)."""
    full = n // batch
    blocks = rng.permutation(full)
    order = (blocks[:, None] * batch + np.arange(batch)).ravel()
    return np.concatenate([order, np.arange(full * batch, n)]).astype(np.int64)


def encode_rows(Xs, A, a) -> np.ndarray:
    """``step(A x + a)`` of every row (uint8 codes), a block of rows at a time."""
    out = np.empty((len(Xs), A.shape[0]), dtype=np.uint8)
    for r in range(0, len(Xs), _ROWS):
        out[r:r + _ROWS] = (Xs[r:r + _ROWS] @ A.T + a) > 0
    return out


def reconstruction_error(Xs, Z, B, b) -> float:
    """``sum_n ||x_n - B z_n - b||^2``, a block of rows at a time."""
    total = 0.0
    for r in range(0, len(Xs), _ROWS):
        res = Xs[r:r + _ROWS] - (Z[r:r + _ROWS] @ B.T + b)
        total += float(np.einsum("ij,ij->", res, res))
    return total


# ====================================================================== plans
@dataclass(frozen=True)
class StatsPlan(Message):
    """Sums, Gram matrix and range of the partition's raw points."""

    round: int


@dataclass(frozen=True)
class ITQPlan(Message):
    """One ITQ rotation step's partial sums."""

    round: int


@dataclass(frozen=True)
class InitPlan(Message):
    """Start the model from the ITQ encoder ``(A, a)``; the decoder's normal equations."""

    round: int
    encoder: tuple


@dataclass(frozen=True)
class RestorePlan(Message):
    """After a worker loss: the model, the Z step's ``mu`` (None: codes ``h(x)``) and the
    scaling settings from the driver's copies."""

    round: int
    model: dict
    mu: float | None
    settings: dict


@dataclass(frozen=True)
class HopPlan(Message):
    """W step: train the held group of submodels, pass it on around the ring."""

    round: int
    hop: int
    iteration: int
    #: (partition, shards) that join the data before this hop
    join: tuple | None = None


@dataclass(frozen=True)
class SpreadPlan(Message):
    """Pass the submodels on until every partition holds the whole model."""

    round: int


@dataclass(frozen=True)
class CheckPlan(Message):
    """Errors, penalty and a digest of the partition's model (the model from partition 0)."""

    round: int


@dataclass(frozen=True)
class ZPlan(Message):
    """Z step with penalty ``mu``; the decoder's normal equations of the new codes."""

    round: int
    mu: float


_PLANS = (StatsPlan, ITQPlan, InitPlan, RestorePlan, HopPlan, SpreadPlan, CheckPlan, ZPlan)


@dataclass
class ParMACDriver(DriverState):
    """The driver's state of `ParMACProgram`."""

    P: int
    #: what the next round does ("stats", "itq", "init", "hop", "spread", "check", "z",
    #: "restore")
    phase: str = "stats"
    #: ITQ steps done, the MAC iteration, the hop in the W step
    itq: int = 0
    iteration: int = 0
    hop: int = 0
    #: the model after the last Z step, and that step's mu
    model: dict | None = field(default=None, repr=False)
    z_mu: float | None = None
    #: one record per MAC iteration, and the one being written
    records: list = field(default_factory=list)
    cur: dict = field(default_factory=dict)
    #: the model with the best validation precision, its precision and iteration
    best_prec: float = math.nan
    best: dict | None = field(default=None, repr=False)
    best_iteration: int | None = None
    init_precision: float | None = None
    #: the model the last check round brought back
    candidate: dict | None = field(default=None, repr=False)
    done: bool = False
    stop_reason: str = ""
    #: points per partition, and in all
    rows: list | None = None
    n: int | None = None
    t_phase: float = 0.0
    E_BA: float = math.nan
    #: (phase, iteration) of the last pulled round
    tag: tuple | None = None
    #: the data's statistics (the stats round) and the ITQ encoder
    lo: np.ndarray | None = field(default=None, repr=False)
    scale: float | None = None
    mean: np.ndarray | None = field(default=None, repr=False)
    W_pca: np.ndarray | None = field(default=None, repr=False)
    R: np.ndarray | None = field(default=None, repr=False)
    cov: np.ndarray | None = field(default=None, repr=False)
    encoder0: tuple | None = field(default=None, repr=False)
    #: what a re-created partition needs besides the model
    settings: dict | None = field(default=None, repr=False)
    #: mean ||x||^2 of the scaled points; the schedule's mu0 (set at the init round)
    sq: float | None = None
    E0: float | None = None
    mu0: float | None = None


class ParMACProgram(Program):
    """Driver and worker logic of ParMAC for the binary autoencoder (module docstring).

    Parameters
    ----------
    dataset : dense row dataset (`dmp.io.DenseDataset` or `dmp.io.InMemoryDenseDataset`)
    n_bits, n_epochs : int
    mu0, mu_factor : float
        The penalty schedule ``mu_i = mu0 * mu_factor ** i``.  ``mu0`` may be a string
        ``"auto:k"``: ``mu0 = k * E_0 / 16``, ``E_0`` the mean reconstruction error of the
        ITQ start (its codes and least-squares decoder), known after the init round.
    max_mac_iter : int
        Length of the schedule.
    batch_size, alpha : int, float
        SGD minibatch size and L2 weight of the units.
    decoder : {"exact", "sgd"}
    z_method : {"auto", "enumerate", "alternate"}
    itq_iter : int
    w_step : {"sgd", "dcd"}
        The encoder's SVMs: ``n_epochs`` passes of minibatch SGD on the hinge loss, or of
        dual coordinate descent on the L2-loss SVM with penalty ``C`` (module docstring).
    C : float
        The DCD SVMs' penalty.
    n_iter_no_change : int or None
        Stop when the validation precision has not improved for this many iterations.
    validation : tuple or None
        ``(queries, database, neighbours)``: raw points and, per query, the indices of its
        true Euclidean neighbours in ``database``; the driver's validation check.
    arrivals : dict, optional
        ``{iteration: [shard, ...]}``: shards held back until that MAC iteration.
    seed : int
    """

    name = "parmac"
    primary_metric = "E_BA"
    primary_direction = "min"
    uses_ring = True
    gather_partitions = False
    # a fit ends at its stopping rule (Z = h(X), or the validation precision), mostly well
    # before its round budget, whose e P + P hops an iteration grow with P
    probe_to_stopping_rule = True

    def __init__(self, dataset, *, n_bits, n_epochs, mu0, mu_factor, max_mac_iter,
                 batch_size, alpha, decoder, z_method, itq_iter, validation, arrivals,
                 seed, init_margin=None, w_step="sgd", C=1.0, n_iter_no_change=None):
        super().__init__()
        if decoder not in ("exact", "sgd"):
            raise ValueError(f"decoder must be 'exact' or 'sgd', got {decoder!r}")
        self.dataset = dataset
        self.n_bits = int(n_bits)
        self.n_features = int(dataset.shape[1])
        self.n_epochs = int(n_epochs)
        if mu0 == "auto":
            mu0 = f"auto:{MU0_AUTO}"
        if isinstance(mu0, str):
            if not mu0.startswith("auto:"):
                raise ValueError(f"mu0 must be a number or 'auto:k', got {mu0!r}")
            self.mu0, self.mu0_rel = None, float(mu0[5:])
        else:
            self.mu0, self.mu0_rel = float(mu0), None
        self.mu_factor = float(mu_factor)
        self.max_mac_iter = int(max_mac_iter)
        self.batch_size = int(batch_size)
        self.alpha = float(alpha)
        self.decoder = decoder
        if w_step not in ("sgd", "dcd"):
            raise ValueError(f"w_step must be 'sgd' or 'dcd', got {w_step!r}")
        self.w_step = w_step
        self.C = float(C)
        self.n_iter_no_change = None if n_iter_no_change is None else int(n_iter_no_change)
        self.z_method = z_method
        self.itq_iter = int(itq_iter)
        self.init_margin = None if init_margin is None else float(init_margin)
        self.arrivals = {int(i): [int(k) for k in ks] for i, ks in (arrivals or {}).items()}
        self.seed = int(seed)
        # the driver keeps the validation set; partitions never need it
        self._validation = validation

    def __getstate__(self):
        state = super().__getstate__()
        state["_validation"] = None
        return state

    # ------------------------------------------------------------------ helpers
    def mu(self, iteration: int) -> float:
        mu0 = self.mu0 if self.mu0 is not None else self.driver.mu0
        return mu0 * self.mu_factor ** iteration

    @property
    def n_travelling(self) -> int:
        """Submodels that travel the ring: the encoder units (+ the decoder's if SGD)."""
        return self.n_bits + (self.n_features if self.decoder == "sgd" else 0)

    def rounds_per_iteration(self, P: int) -> int:
        return self.n_epochs * P + (P - 1) + 2

    def max_rounds(self, P: int, max_recoveries: int = 5) -> int:
        """An upper bound on the rounds of a fit (the driver stops it when it is done);
        recoveries repeat at most one iteration each, plus a restore round."""
        per = self.rounds_per_iteration(P)
        return 2 + self.itq_iter + per * self.max_mac_iter + max_recoveries * (per + 1)

    # ================================================================== worker side
    def _local_shuffle(self, X, p, salt=0):
        """The points in a random order fixed for the partition (see `minibatch_order`)."""
        return X[np.random.default_rng([self.seed, 6, p, salt]).permutation(len(X))]

    def init_partition(self, spec):
        X = self._local_shuffle(self.dataset.load_row_shards(spec["shards"]), spec["index"])
        return {"p": spec["index"], "P": spec["n_parts"], "X": X, "Xs": None, "Z": None,
                "model": None, "inbox": {}, "V": None}

    def _scale(self, s):
        """The partition's points in the model's [0, 1] coordinates (float32, kept)."""
        if s["Xs"] is None:
            s["Xs"] = (s["X"] - s["lo"].astype(np.float32)) * np.float32(1.0 / s["scale"])
            s["X"] = None   # the raw copy is no longer needed
        return s["Xs"]

    def apply(self, s, update):
        if update is None:
            return
        for key in ("lo", "scale", "mean", "W_pca", "R", "eta_enc", "eta_dec", "white"):
            if key in update:
                s[key] = update[key]
        if "decoder" in update and s["model"] is not None:
            B, b = update["decoder"]
            s["model"]["B"][:] = B
            s["model"]["b"][:] = b

    def receive(self, s, round, src, payload):
        s["inbox"][round] = payload

    def _take_inbox(self, s, round):
        """Write the group received last round into the model; return it."""
        msg = s["inbox"].pop(round - 1, None)
        if msg is None:
            return None
        g, unit = msg
        m = s["model"]
        enc, dec = self._groups(s["P"])
        if self.w_step == "dcd":
            self._set_dcd_units(s, enc[g], unit["Aw"], unit["aw"])
        else:
            m["A"][enc[g]] = unit["A"]
            m["a"][enc[g]] = unit["a"]
            m["ta"][enc[g]] = unit["ta"]
        if self.decoder == "sgd":
            m["B"][dec[g]] = unit["B"]
            m["b"][dec[g]] = unit["b"]
            m["tb"][dec[g]] = unit["tb"]
        return g

    def _groups(self, P):
        enc = unit_groups(self.n_bits, P)
        dec = unit_groups(self.n_features, P) if self.decoder == "sgd" else None
        return enc, dec

    def _group_payload(self, s, g):
        m = s["model"]
        enc, dec = self._groups(s["P"])
        if self.w_step == "dcd":    # the hash on scaled points follows from these
            unit = {"Aw": m["Aw"][enc[g]], "aw": m["aw"][enc[g]]}
        else:
            unit = {"A": m["A"][enc[g]], "a": m["a"][enc[g]], "ta": m["ta"][enc[g]]}
        if self.decoder == "sgd":
            unit.update(B=m["B"][dec[g]], b=m["b"][dec[g]], tb=m["tb"][dec[g]])
        return unit

    def _train_group(self, s, g, plan):
        """One SGD pass over this partition's points for group ``g`` (in place)."""
        Xs, Z = s["Xs"], s["Z"]
        if len(Xs) == 0:
            return
        m = s["model"]
        enc, dec = self._groups(s["P"])
        rng = np.random.default_rng([self.seed, 3, plan.iteration, plan.hop, s["p"]])
        order = minibatch_order(len(Xs), self.batch_size, rng)
        idx = enc[g]
        if len(idx) and self.w_step == "dcd":
            self._dcd_group(s, idx, plan)
        elif len(idx):
            W, bias, steps = m["A"][idx], m["a"][idx], m["ta"][idx]
            sgd_svm(W, bias, steps, Xs, np.ascontiguousarray(Z[:, idx]), order,
                    self.batch_size, self.alpha, s["eta_enc"])
            m["A"][idx], m["a"][idx], m["ta"][idx] = W, bias, steps
        if self.decoder == "sgd" and len(dec[g]):
            idx = dec[g]
            W, bias, steps = m["B"][idx], m["b"][idx], m["tb"][idx]
            sgd_linear(W, bias, steps, Z, Xs, idx.astype(np.int64), order, self.batch_size,
                       self.alpha, s["eta_dec"])
            m["B"][idx], m["b"][idx], m["tb"][idx] = W, bias, steps

    def _white(self, s):
        """The partition's points as the DCD SVMs see them: centred and whitened,
        ``u = (x - mean) V`` (float64, kept), with their squared norms."""
        if s.get("Xe") is None:
            Xs = s["Xs"]
            V = s["white"]
            Xe = np.empty((len(Xs), V.shape[1]))
            for r in range(0, len(Xs), _ROWS):
                Xe[r:r + _ROWS] = (Xs[r:r + _ROWS] - s["mean"]) @ V
            s["Xe"], s["xsq"] = Xe, np.einsum("ij,ij->i", Xe, Xe)
        return s["Xe"], s["xsq"]

    def _dcd_group(self, s, idx, plan):
        """One pass of dual coordinate descent over this partition's points for the units
        ``idx``; the duals of the points live here.  On a group's first visit in a W step,
        the duals of labels the Z step changed are reset (and their terms taken out of the
        travelling weights), so that every unit's ``w = sum_n alpha_n y_n u_n`` holds."""
        Xe, xsq = self._white(s)
        m = s["model"]
        W, bias = m["Aw"][idx], m["aw"][idx]
        alpha = np.ascontiguousarray(s["alpha"][:, idx])
        Z = np.ascontiguousarray(s["Z"][:, idx])
        if plan.hop < s["P"]:
            dcd_relabel(W, bias, alpha, Xe, np.ascontiguousarray(s["Zw"][:, idx]), Z, 1.0)
            s["Zw"][:, idx] = Z
        rng = np.random.default_rng([self.seed, 3, plan.iteration, plan.hop, s["p"]])
        dcd_svm(W, bias, alpha, Xe, xsq, Z, rng.permutation(len(Xe)).astype(np.int64),
                self.C, 1.0)
        s["alpha"][:, idx] = alpha
        self._set_dcd_units(s, idx, W, bias)

    @staticmethod
    def _set_dcd_units(s, idx, W, bias):
        """Write DCD units (weights on whitened points) and the hash they give on the
        [0, 1]-scaled points, ``A x + a = w (x - mean) V + b``, into the model."""
        m = s["model"]
        m["Aw"][idx], m["aw"][idx] = W, bias
        A = W @ s["white"].T
        m["A"][idx], m["a"][idx] = A, bias - A @ s["mean"]

    def _reset_duals(self, s):
        """DCD units start from ``w = 0`` with every dual 0 (the start, after a restore)."""
        if self.w_step != "dcd":
            return
        m = s["model"]
        r = s["white"].shape[1]
        m["Aw"], m["aw"] = np.zeros((self.n_bits, r)), np.zeros(self.n_bits)
        s["alpha"] = np.zeros((len(s["Xs"]), self.n_bits))
        s["Zw"] = s["Z"].copy()

    def _z_round(self, s, mu):
        """The Z step over this partition's points, a block of rows at a time (float64
        temporaries of a block only: whole-partition copies made two workers compete for
        memory bandwidth), with the decoder's normal equations and E_Q of the new codes."""
        m = s["model"]
        Xs, Z = s["Xs"], s["Z"]
        A, a, B, b = m["A"], m["a"], m["B"], m["b"]
        Q, R = np.linalg.qr(B)
        R = np.ascontiguousarray(R)
        L, D = self.n_bits, self.n_features
        G = np.zeros((L + 1, L + 1))
        F = np.zeros((L + 1, D))
        e_q, penalty, changed = 0.0, 0, 0
        e = np.empty(_Z_ROWS)
        for r in range(0, len(Xs), _Z_ROWS):
            Xb = Xs[r:r + _Z_ROWS].astype(np.float64)
            n = len(Xb)
            Hb = ((Xb @ A.T + a) > 0).astype(np.uint8)
            Db = Xb - b
            Cb = Db @ Q
            Z0b = Z[r:r + _Z_ROWS]
            Zb = z_step_qr(Cb, R, Hb, mu, method=self.z_method, Z0=Z0b)
            # ||x - B z - b||^2 = ||C - R z||^2 + ||x - b||^2 - ||C||^2
            _kernels.z_objective_qr(Cb, R, Hb, float(mu), Zb, e[:n])
            e_q += float(e[:n].sum() + np.einsum("ij,ij->", Db, Db)
                         - np.einsum("ij,ij->", Cb, Cb))
            penalty += int(np.count_nonzero(Zb != Hb))
            changed += int(np.count_nonzero(Zb != Z0b))
            Z1 = np.empty((n, L + 1))
            Z1[:, :L] = Zb
            Z1[:, L] = 1.0
            G += Z1.T @ Z1
            F += Z1.T @ Xb
            Z[r:r + _Z_ROWS] = Zb
        return {"G": G, "F": F, "E_Q": e_q, "penalty": penalty, "changed": changed}

    def _decoder_sums(self, s):
        G, F = decoder_normal_equations(s["Xs"], s["Z"])
        return {"G": G, "F": F}

    def _join(self, s, shards):
        """Load new shards into this partition; their codes start as ``h(x)``."""
        X = self._local_shuffle(self.dataset.load_row_shards(shards), s["p"], 1 + len(s["Xs"]))
        Xs = (X - s["lo"].astype(np.float32)) * np.float32(1.0 / s["scale"])
        m = s["model"]
        s["Xs"] = np.concatenate([s["Xs"], Xs])
        s["Z"] = np.concatenate([s["Z"], encode_rows(Xs, m["A"], m["a"])])
        if self.w_step == "dcd":
            s["Xe"] = None
            n_new = len(Xs)
            s["alpha"] = np.concatenate([s["alpha"], np.zeros((n_new, self.n_bits))])
            s["Zw"] = np.concatenate([s["Zw"], s["Z"][-n_new:]])

    def push(self, s, plan):
        if not isinstance(plan, _PLANS):
            raise unexpected(self, "a plan", plan, _PLANS)
        round = plan.round
        t0 = time.perf_counter()
        match plan:
            case StatsPlan():
                X = s["X"].astype(np.float64)
                return {"n": len(X), "sum": X.sum(axis=0), "gram": X.T @ X,
                        "min": X.min(axis=0), "max": X.max(axis=0)}
            case RestorePlan():
                self.apply(s, plan.settings)
        Xs = self._scale(s)
        P, p = s["P"], s["p"]
        dest = (p - 1) % P
        match plan:
            case ITQPlan():
                if s["V"] is None:
                    s["V"] = (Xs - s["mean"]) @ s["W_pca"]
                V = s["V"]
                C = V.T @ np.where(V @ s["R"] >= 0, 1.0, -1.0)
                return {"C": C}
            case InitPlan():
                s["V"] = None
                A, a = plan.encoder
                L, D = self.n_bits, self.n_features
                s["model"] = {"A": np.array(A, dtype=np.float64),
                              "a": np.array(a, dtype=np.float64),
                              "ta": np.zeros(L, dtype=np.int64), "B": np.zeros((D, L)),
                              "b": np.zeros(D), "tb": np.zeros(D, dtype=np.int64)}
                s["Z"] = encode_rows(Xs, s["model"]["A"], s["model"]["a"])
                self._reset_duals(s)
                return self._decoder_sums(s)
            case RestorePlan():
                s["model"] = {k: np.array(v) for k, v in plan.model.items()}
                m = s["model"]
                H = encode_rows(Xs, m["A"], m["a"])
                s["Z"] = H if plan.mu is None else z_step(
                    Xs, m["B"], m["b"], H, plan.mu, method=self.z_method)
                # the duals were lost with the partitions: the SVMs are solved from w = 0
                s["Xe"] = None
                self._reset_duals(s)
                return self._decoder_sums(s)
            case HopPlan():
                h = plan.hop
                if h == 0:
                    if plan.join and plan.join[0] == p:
                        self._join(s, plan.join[1])
                    g = p
                else:
                    g = self._take_inbox(s, round)
                    if g is None:
                        raise RuntimeError(f"partition {p}: no submodels arrived for hop {h}")
                want = (p + h) % P
                if g != want:
                    raise RuntimeError(f"partition {p} holds group {g} in hop {h}, expected "
                                       f"{want}")
                self._train_group(s, g, plan)
                return Sends({"n": len(s["Xs"]), "train_s": time.perf_counter() - t0},
                             {dest: (g, self._group_payload(s, g))})
            case SpreadPlan():
                g = self._take_inbox(s, round)
                return Sends({}, {dest: (g, self._group_payload(s, g))})
            case CheckPlan():
                self._take_inbox(s, round)
                m = s["model"]
                H = encode_rows(Xs, m["A"], m["a"])
                out = {"E_BA": reconstruction_error(Xs, H, m["B"], m["b"]),
                       "penalty": int(np.count_nonzero(H != s["Z"])),
                       "digest": _digest(m)}
                if p == 0:
                    out["model"] = {k: m[k].copy() for k in ("A", "a", "B", "b", "ta", "tb",
                                                             "Aw", "aw") if k in m}
                return out
            case ZPlan():
                out = self._z_round(s, plan.mu)
                out["z_s"] = time.perf_counter() - t0
                return out

    # ================================================================== driver side
    def partition_specs(self, n_partitions):
        held = {k for ks in self.arrivals.values() for k in ks}
        shards = [k for k in range(self.dataset.n_shards) if k not in held]
        if len(shards) < n_partitions:
            raise ValueError(f"the data has {len(shards)} shard(s) to start with but "
                             f"{n_partitions} workers were requested")
        rows = np.asarray(self.dataset.shard_rows())[shards]
        from ..io.sparse import partition_shards

        groups = partition_shards(rows, n_partitions)
        return [{"shards": [shards[i] for i in g], "index": k, "n_parts": n_partitions,
                 "rows": int(rows[g].sum())} for k, g in enumerate(groups)]

    def partition_nbytes(self, spec):
        # raw float32 points, their scaled copy, float64 temporaries of a block, codes
        per_row = 8 * self.n_features + 2 * self.n_bits
        if self.w_step == "dcd":     # whitened float64 points, their norms, duals, old codes
            per_row += 8 * self.n_features + 8 + 9 * self.n_bits
        return spec["rows"] * per_row + 16 * _ROWS * max(self.n_features, self.n_bits)

    def start(self, n_partitions):
        self.driver = ParMACDriver(P=n_partitions, t_phase=time.perf_counter())
        self.driver.rows = [sp["rows"] for sp in self.partition_specs(n_partitions)]

    def after_loss(self):
        """Continue after the partitions were re-created: restore the model from the
        driver's copy and start the interrupted iteration over (None: before the model
        existed, start over)."""
        dr = self.driver
        if dr.model is None:
            return False
        dr.phase = "restore"
        return True

    def schedule(self, round):
        dr = self.driver
        P = dr.P
        phase = dr.phase
        it = dr.iteration
        match phase:
            case "restore":
                plan = RestorePlan(round=round, model=dr.model, mu=dr.z_mu,
                                   settings=dr.settings)
            case "stats":
                plan = StatsPlan(round)
            case "itq":
                plan = ITQPlan(round)
            case "check":
                plan = CheckPlan(round)
            case "init":
                plan = InitPlan(round=round, encoder=dr.encoder0)
            case "hop":
                join = None
                if dr.hop == 0 and it in self.arrivals:
                    join = (int(np.argmin(dr.rows)), self.arrivals[it])
                plan = HopPlan(round=round, hop=dr.hop, iteration=it, join=join)
            case "spread":
                plan = SpreadPlan(round)
            case "z":
                plan = ZPlan(round=round, mu=self.mu(it))
            case _:
                raise RuntimeError(f"unknown phase {phase!r}")
        return [plan] * P

    def needs_barrier(self, round):
        return True

    def _stats(self, partials):
        dr = self.driver
        n = sum(q["n"] for q in partials)
        total = np.sum([q["sum"] for q in partials], axis=0)
        gram = np.sum([q["gram"] for q in partials], axis=0)
        lo = np.min([q["min"] for q in partials], axis=0)
        hi = np.max([q["max"] for q in partials], axis=0)
        scale = float(np.max(hi - lo))
        if not scale > 0:
            raise ValueError("every point is the same: the data has no variation to hash")
        # statistics of the scaled points xs = (x - lo) / scale, from the raw sums
        mean_raw = total / n
        cov = (gram / n - np.outer(mean_raw, mean_raw)) / scale ** 2
        mean = (mean_raw - lo) / scale
        evals, evecs = np.linalg.eigh(cov)
        W_pca = np.ascontiguousarray(evecs[:, ::-1][:, :self.n_bits])
        rng = np.random.default_rng([self.seed, 4])
        R, _ = np.linalg.qr(rng.standard_normal((self.n_bits, self.n_bits)))
        sq = float(np.trace(cov) + mean @ mean)     # mean ||x||^2 of the scaled points
        dr.sq = sq
        dr.n, dr.lo, dr.scale, dr.mean, dr.W_pca, dr.R, dr.cov = n, lo, scale, mean, W_pca, R, cov
        # what a re-created partition needs besides the model (after a worker loss)
        dr.settings = {"lo": lo, "scale": scale, "eta_enc": 1.0 / (sq + 1.0),
                          "eta_dec": 1.0 / (self.n_bits / 2 + 1.0)}
        if self.w_step == "dcd":
            # the DCD SVMs see centred, whitened points (directions of variance above a
            # relative 1e-9): on [0, 1]-scaled raw points dual CD with a large C needs
            # hundreds of passes (BENCHMARKS.md, issue 27), on whitened ones a few
            keep = evals[::-1] > 1e-9 * max(float(evals[-1]), 1e-300)
            dr.settings["mean"] = mean
            dr.settings["white"] = np.ascontiguousarray(
                evecs[:, ::-1][:, keep] / np.sqrt(evals[::-1][keep]))
        return {"mean": mean, "W_pca": W_pca, "R": R, **dr.settings}

    def _solve(self, partials, error=False):
        G = np.sum([q["G"] for q in partials], axis=0)
        F = np.sum([q["F"] for q in partials], axis=0)
        B, b = solve_decoder(G, F)
        if not error:
            return B, b
        # mean ||x - B z - b||^2 from the same sums: ||x||^2 - 2 <theta, F> + <theta, G theta>
        theta = np.vstack([B.T, b])
        E = self.driver.sq - (2 * np.sum(theta * F) - np.sum(theta * (G @ theta))) / self.driver.n
        return B, b, max(float(E), 0.0)

    def validation_precision(self, model) -> float:
        """Precision of Hamming ranking on the validation set for ``model``, or nan."""
        if self._validation is None:
            return math.nan
        Q, Db, truth = self._validation
        dr = self.driver
        A, a = model["A"], model["a"]
        cq = pack_codes(encode_rows((Q - dr.lo) / dr.scale, A, a))
        cd = pack_codes(encode_rows((Db - dr.lo) / dr.scale, A, a))
        found, _ = hamming_search(cq, cd, truth.shape[1], self.n_bits)
        return retrieval_precision(found, truth)[0]

    def _start_iteration(self):
        """The next round is the first hop of ``driver.iteration``: a new record."""
        dr = self.driver
        dr.phase, dr.hop = "hop", 0
        dr.cur = {"iteration": dr.iteration, "mu": self.mu(dr.iteration),
                     "w_s": 0.0, "z_s": 0.0, "check_s": 0.0}
        dr.t_phase = time.perf_counter()

    def _close_phase(self, key):
        dr = self.driver
        now = time.perf_counter()
        dr.cur[key] = dr.cur.get(key, 0.0) + now - dr.t_phase
        dr.t_phase = now

    def pull(self, round, partials):
        dr = self.driver
        P = dr.P
        phase = dr.phase
        dr.tag = (phase, dr.iteration)
        if phase == "stats":
            upd = self._stats(partials)
            dr.phase = "itq" if self.itq_iter > 0 else "init"
            if self.itq_iter == 0:
                self._init_encoder()
            return Broadcast(upd)
        if phase == "itq":
            dr.R = procrustes(np.sum([q["C"] for q in partials], axis=0))
            dr.itq += 1
            if dr.itq >= self.itq_iter:
                self._init_encoder()
                dr.phase = "init"
            return Broadcast({"R": dr.R})
        if phase in ("init", "restore"):
            B, b, E0 = self._solve(partials, error=True)
            if phase == "init":
                dr.E0 = E0
                if self.mu0 is None:
                    dr.mu0 = self.mu0_rel * E0 / 16
                A, a = dr.encoder0
                L, D = self.n_bits, self.n_features
                dr.model = {"A": A, "a": a, "B": B, "b": b, "ta": np.zeros(L, np.int64),
                               "tb": np.zeros(D, np.int64)}
                dr.best_prec = dr.init_precision = self.validation_precision(
                    dr.model)
                dr.best, dr.best_iteration = dr.model, -1
            self._start_iteration()
            # the SGD decoder starts from the exact one, then keeps its own state
            if phase == "init" or self.decoder == "exact":
                return Broadcast({"decoder": (B, b)})
            return None
        if phase == "hop":
            dr.hop += 1
            if dr.hop == 1 and self.arrivals.get(dr.iteration):
                j = int(np.argmin(dr.rows))
                dr.rows[j] = partials[j]["n"]
                dr.n = sum(dr.rows)
            dr.cur["train_s"] = dr.cur.get("train_s", 0.0) + max(
                q["train_s"] for q in partials)
            if dr.hop == self.n_epochs * P:
                dr.phase = "spread" if P > 1 else "check"
                dr.hop = 1
                if P == 1:
                    self._close_phase("w_s")
            return None
        if phase == "spread":
            dr.hop += 1
            if dr.hop == P:
                dr.phase = "check"
                self._close_phase("w_s")
            return None
        if phase == "check":
            digests = {q["digest"] for q in partials}
            model = partials[0]["model"]
            prec = self.validation_precision(model)
            cur = dr.cur
            cur.update(E_BA=sum(q["E_BA"] for q in partials) / dr.n,
                       penalty_w=sum(q["penalty"] for q in partials),
                       precision=prec, identical=len(digests) == 1)
            dr.E_BA = cur["E_BA"]
            dr.candidate = model
            # the validation check: keep the model with the best validation precision
            if not prec <= dr.best_prec:
                dr.best_prec, dr.best = prec, model
                dr.best_iteration = dr.iteration
            dr.phase = "z"
            self._close_phase("check_s")
            return None
        if phase == "z":
            it = dr.iteration
            dr.model = dr.candidate
            dr.z_mu = self.mu(it)
            cur = dr.cur
            pen = sum(q["penalty"] for q in partials)
            cur.update(E_Q=sum(q["E_Q"] for q in partials) / dr.n, penalty=pen,
                       changed=sum(q["changed"] for q in partials))
            self._close_phase("z_s")
            dr.records.append(dict(cur))
            B, b = self._solve(partials)
            dr.iteration += 1
            arriving = any(i >= dr.iteration for i in self.arrivals)
            if pen == 0 and not arriving:
                dr.done, dr.stop_reason = True, "Z = h(X)"
            elif dr.iteration >= self.max_mac_iter:
                dr.done, dr.stop_reason = True, "schedule ended"
            elif (self.n_iter_no_change is not None and self._validation is not None
                  and it - dr.best_iteration >= self.n_iter_no_change and not arriving):
                dr.done, dr.stop_reason = True, "validation precision stopped improving"
            self._start_iteration()
            if self.decoder == "exact":
                return Broadcast({"decoder": (B, b)})
            return None
        raise RuntimeError(f"unknown phase {phase!r}")

    def _init_encoder(self):
        dr = self.driver
        proj = dr.W_pca @ dr.R                   # (D, L)
        if self.init_margin is not None:
            # the same hyperplanes, scaled so that each bit's A x + a has standard deviation
            # init_margin: unit-norm ITQ directions on [0, 1]-scaled data put nearly every
            # point inside the SVM's unit margin, and the first W step's SGD then turns the
            # hyperplanes towards the class means instead of keeping the ITQ codes
            sd = np.sqrt(np.maximum(np.einsum("dl,de,el->l", proj, dr.cov, proj), 1e-300))
            proj = proj * (self.init_margin / sd)
        dr.encoder0 = (np.ascontiguousarray(proj.T), -dr.mean @ proj)

    def metrics(self):
        dr = self.driver
        phase, it = dr.tag or ("stats", 0)
        return {"phase": phase, "iteration": it, "E_BA": dr.E_BA,
                "precision": dr.records[-1]["precision"] if dr.records else math.nan}

    def progress_postfix(self):
        return {"iter": self.driver.iteration, "E_BA": f"{self.driver.E_BA:.4g}"}

    def converged(self):
        return self.driver.done


def _digest(model) -> str:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for k in ("A", "a", "B", "b"):
        h.update(np.ascontiguousarray(model[k]).tobytes())
    return h.hexdigest()
