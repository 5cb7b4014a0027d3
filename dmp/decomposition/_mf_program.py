"""STRADS matrix factorisation as a schedule / push / pull program (CCD and CCD++).

Model partitioning (as in STRADS' ``cdmf`` code): worker p owns a contiguous range of users
(rows of W) and a contiguous range of items (columns of H, stored as rows of ``H`` here),
both balanced by rating count.  It holds the ratings of its users (CSR, "row copy") and of
its items (CSC, "column copy"), each with its own residual array.  The round-robin schedule
walks over blocks of the K factor coordinates:

* **CCD** (``method="ccd"``), one round per (half, coordinate block): in a W round every
  worker runs exact CCD on coordinates ``k0..k1`` of its own users against the broadcast
  block ``H[k0:k1, :]`` and pushes the changes of its W block; pull concatenates them and
  broadcasts them with the factor block the next round needs; ``apply`` brings the column
  copy's residuals up to date.  H rounds are symmetric.  Rows of W are independent given H,
  so this is exactly serial CCD in the same order, and a worker never holds more of the
  other factor than one block (``block_size`` x (n_users + n_items) values).
* **CCD++** (``method="ccd++"``): one round per (feature, inner pass, half); the broadcast
  is one factor column (n_users or n_items values), so the rank is bounded by the partitions'
  memory, not by one worker's.

Every round's objective ``sum (r - w.h)^2 + alpha (|W|^2 + |H|^2)`` is exact: in W rounds the
row copies are current, in H rounds the column copies.
"""

from __future__ import annotations

import math

import numpy as np

from ..engine.program import Broadcast, Program
from ..kernels import mf as K

#: broadcast budget (bytes) per round for ``block_size="auto"``
AUTO_BLOCK_BYTES = 64 * 2**20


def auto_block_size(n_components: int, n_users: int, n_items: int) -> int:
    """Largest coordinate block whose broadcast (n_users + n_items) x B float64 fits
    `AUTO_BLOCK_BYTES`, at most ``n_components``."""
    per = 8 * (n_users + n_items)
    return int(max(1, min(n_components, AUTO_BLOCK_BYTES // per)))


class MFProgram(Program):
    """Block-parallel CCD / CCD++ for ``min sum_(i,j) (r_ij - mu - w_i.h_j)^2
    + alpha (sum_i c_i |w_i|^2 + sum_j c_j |h_j|^2)`` (``c = 1``, or the rating counts with
    ``reg_scaling="count"``; ``mu`` the training mean when centring, else 0)."""

    name = "mf"
    gather_partitions = False

    def __init__(self, dataset, *, n_components, alpha, method="ccd++", n_inner=1,
                 block_size=None, center=True, reg_scaling="none", tol=1e-4, seed=0):
        super().__init__()
        self.dataset = dataset
        self.K = int(n_components)
        self.alpha = float(alpha)
        self.method = method
        self.n_inner = int(n_inner)
        self.block_size = int(block_size or self.K)
        self.center = bool(center)
        self.reg_scaling = reg_scaling
        self.tol = tol
        self.seed = int(seed)
        self.has_valid = "valid" in tuple(getattr(dataset, "splits", ("train",)))
        if method == "ccd":
            kb = list(range(0, self.K, self.block_size)) + [self.K]
            self.block_bounds = np.asarray(kb, dtype=np.int64)
            self.rounds_per_iter = 2 * (len(kb) - 1)
        elif method == "ccd++":
            self.block_bounds = np.arange(self.K + 1, dtype=np.int64)
            self.rounds_per_iter = 2 * self.K * self.n_inner
        else:
            raise ValueError(f"unknown method {method!r}; use 'ccd' or 'ccd++'")

    # ------------------------------------------------------------------ schedule
    def round_info(self, round: int) -> dict:
        """What round ``round`` does (a pure function of the round number)."""
        if round == 0:
            return {"phase": "init", "iteration": 0}
        idx = round - 1
        it, pos = divmod(idx, self.rounds_per_iter)
        if self.method == "ccd":
            nb = len(self.block_bounds) - 1
            half, b = divmod(pos, nb)
            phase = "W" if half == 0 else "H"
            return {"phase": phase, "iteration": it + 1, "block": b,
                    "k0": int(self.block_bounds[b]), "k1": int(self.block_bounds[b + 1]),
                    "end": pos == self.rounds_per_iter - 1}
        t, rest = divmod(pos, 2 * self.n_inner)
        s, half = divmod(rest, 2)
        return {"phase": "W" if half == 0 else "H", "iteration": it + 1, "t": t, "pass": s,
                "feature_end": half == 1 and s == self.n_inner - 1,
                "end": pos == self.rounds_per_iter - 1}

    def _next_block(self, round: int):
        """(side, k0, k1): the own-factor block each worker pushes for round + 1."""
        nxt = self.round_info(round + 1)
        side = "H" if nxt["phase"] == "W" else "W"  # a W round needs H's block and v.v.
        if self.method == "ccd":
            return side, nxt["k0"], nxt["k1"]
        return side, nxt["t"], nxt["t"] + 1

    def partition_specs(self, n_partitions: int) -> list:
        ds = self.dataset
        n_users, n_items = ds.shape
        if n_partitions > min(n_users, n_items):
            raise ValueError(f"{n_partitions} workers cannot share {n_users} users and "
                             f"{n_items} items (each worker owns at least one of each)")
        rb = ds.balanced_bounds(n_partitions, 0)
        cb = ds.balanced_bounds(n_partitions, 1)
        return [{"k": k, "rows": (int(rb[k]), int(rb[k + 1])),
                 "cols": (int(cb[k]), int(cb[k + 1]))} for k in range(n_partitions)]

    def start(self, n_partitions: int) -> None:
        self.driver.update({"n_partitions": n_partitions, "mean": 0.0, "objective": np.nan,
                            "prev_objective": np.nan, "iteration": 0, "converged": False,
                            "nnz": 0, "nnz_valid": 0, "metrics": {}})

    def schedule(self, round: int) -> list:
        plan = self.round_info(round)
        plan["next"] = self._next_block(round)
        return [plan] * self.driver["n_partitions"]

    def pull(self, round: int, partials: list):
        dr = self.driver
        info = self.round_info(round)
        update = {"kind": info["phase"]}
        if self.method == "ccd":
            update["next"] = np.concatenate([p["next"] for p in partials], axis=0)  # (n, B')
        elif "next_w" in partials[0]:
            update["w_next"] = np.concatenate([p["next_w"] for p in partials])
            update["h_next"] = np.concatenate([p["next_h"] for p in partials])
        if info["phase"] == "init":
            dr["nnz"] = int(sum(p["count"] for p in partials))
            dr["nnz_valid"] = int(sum(p["count_valid"] for p in partials))
            total = float(sum(p["sum"] for p in partials))
            mean = total / dr["nnz"] if (self.center and dr["nnz"]) else 0.0
            dr["mean"] = mean
            update["mean"] = mean
            sq = float(sum(p["sumsq"] for p in partials))
            loss = sq - 2.0 * mean * total + dr["nnz"] * mean * mean
            vs = float(sum(p["sum_valid"] for p in partials))
            vsq = float(sum(p["sumsq_valid"] for p in partials))
            vloss = vsq - 2.0 * mean * vs + dr["nnz_valid"] * mean * mean
        else:
            if self.method == "ccd":
                update["delta"] = np.concatenate([p["delta"] for p in partials], axis=0)
                update["k"] = (info["k0"], info["k1"])
            else:
                update["f"] = np.concatenate([p["f"] for p in partials])
                update["t"] = info["t"]
                update["feature_end"] = info["feature_end"]
            loss = float(sum(p["loss"] for p in partials))
            vloss = float(sum(p["loss_valid"] for p in partials))
        reg = float(sum(p["reg"] for p in partials))
        objective = loss + reg
        dr["objective"] = objective
        dr["iteration"] = info["iteration"]
        dr["metrics"] = {
            "iteration": info["iteration"], "phase": info["phase"], "objective": objective,
            "train_rmse": math.sqrt(max(loss, 0.0) / dr["nnz"]) if dr["nnz"] else np.nan,
            "valid_rmse": (math.sqrt(max(vloss, 0.0) / dr["nnz_valid"])
                           if dr["nnz_valid"] else np.nan)}
        if info.get("end"):
            prev = dr["prev_objective"]
            if self.tol is not None and np.isfinite(prev) and prev > 0:
                dr["converged"] = (prev - objective) <= self.tol * prev
            dr["prev_objective"] = objective
        return Broadcast(update)

    def metrics(self) -> dict:
        return dict(self.driver["metrics"])

    def progress_postfix(self) -> dict:
        m = self.driver["metrics"]
        out = {"it": m.get("iteration"), "obj": f"{m.get('objective', np.nan):.5g}"}
        if np.isfinite(m.get("valid_rmse", np.nan)):
            out["valid_rmse"] = f"{m['valid_rmse']:.4f}"
        return out

    def converged(self) -> bool:
        return bool(self.driver["converged"])

    def driver_state(self) -> dict:
        dr = self.driver
        return {k: dr[k] for k in ("mean", "objective", "prev_objective", "iteration",
                                   "converged", "nnz", "nnz_valid")}

    def load_driver_state(self, state: dict) -> None:
        for k, v in state.items():
            self.driver[k] = v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v
        self.driver["converged"] = bool(self.driver["converged"])
        for k in ("nnz", "nnz_valid"):
            self.driver[k] = int(self.driver[k])

    # ------------------------------------------------------------------ worker side
    def _load(self, what, a, b, split):
        indptr, indices, data = (self.dataset.load_rows(a, b, split) if what == "rows"
                                 else self.dataset.load_cols(a, b, split))
        return (np.ascontiguousarray(indptr, dtype=np.int64),
                np.ascontiguousarray(indices, dtype=np.int32),
                np.ascontiguousarray(data, dtype=np.float64))

    def _empty(self, n):
        return (np.zeros(n + 1, np.int64), np.zeros(0, np.int32), np.zeros(0))

    def init_partition(self, spec):
        (r0, r1), (c0, c1) = spec["rows"], spec["cols"]
        nr, nc = r1 - r0, c1 - c0
        st = {"k": spec["k"], "r0": r0, "c0": c0}
        st["rows"] = self._load("rows", r0, r1, "train")
        st["cols"] = self._load("cols", c0, c1, "train")
        st["vrows"] = self._load("rows", r0, r1, "valid") if self.has_valid else self._empty(nr)
        st["vcols"] = self._load("cols", c0, c1, "valid") if self.has_valid else self._empty(nc)
        for key, res in (("rows", "er"), ("cols", "ec"), ("vrows", "evr"), ("vcols", "evc")):
            st[res] = st[key][2].copy()
        if self.reg_scaling == "count":
            st["lam_rows"] = self.alpha * np.diff(st["rows"][0]).astype(np.float64)
            st["lam_cols"] = self.alpha * np.diff(st["cols"][0]).astype(np.float64)
        else:
            st["lam_rows"] = np.full(nr, self.alpha)
            st["lam_cols"] = np.full(nc, self.alpha)
        # STRADS initialisation: W = 0, H ~ U(0, 1), keyed by item id (partition-free)
        st["W"] = np.zeros((nr, self.K))
        st["H"] = K.uniform_init(self.seed, 1, c0, nc, self.K)
        st["regW"] = 0.0
        st["regH"] = float(np.dot(st["lam_cols"], np.einsum("ij,ij->i", st["H"], st["H"])))
        st["O"] = np.zeros((0, 0))  # CCD: the other side's block for the next push
        st["wfull"] = np.zeros(0)   # CCD++: the current feature's column of W (all users)
        st["hfull"] = np.zeros(0)   # CCD++: ... and its row of H (all items)
        st["pend"] = np.array([-2, -2], dtype=np.int64)  # CCD++ swaps due on rows / cols
        st["h_out"] = st["w_out"] = st["w_in"] = np.zeros(0)
        return st

    def _own_block(self, st, side, a, b):
        F = st["W"] if side == "W" else st["H"]
        return np.ascontiguousarray(F[:, a:b])

    def push(self, st, plan):
        phase = plan["phase"]
        out = {}
        if self.method == "ccd":
            out["next"] = self._own_block(st, *plan["next"])
        elif phase == "init" or plan.get("feature_end"):
            _, t, _ = plan["next"]
            out["next_w"] = st["W"][:, t].copy()
            out["next_h"] = st["H"][:, t].copy()
        if phase == "init":
            d, vd = st["rows"][2], st["vrows"][2]
            out.update(count=len(d), sum=float(d.sum()), sumsq=float(d @ d),
                       count_valid=len(vd), sum_valid=float(vd.sum()),
                       sumsq_valid=float(vd @ vd))
        elif self.method == "ccd":
            self._ccd_push(st, plan, out)
        else:
            self._ccdpp_push(st, plan, out)
        out["reg"] = st["regW"] + st["regH"]
        return out

    def _ccd_push(self, st, plan, out):
        k0, k1 = plan["k0"], plan["k1"]
        if plan["phase"] == "W":
            data, vdata, res, vres, F, lam, rk = "rows", "vrows", "er", "evr", "W", "lam_rows", "regW"
        else:
            data, vdata, res, vres, F, lam, rk = "cols", "vcols", "ec", "evc", "H", "lam_cols", "regH"
        indptr, indices, _ = st[data]
        O = st["O"]
        delta = np.empty((indptr.shape[0] - 1, k1 - k0))
        K.ccd_block_update(indptr, indices, st[res], st[F], k0, O, st[lam], delta)
        vp, vi, _ = st[vdata]
        K.subtract_lowrank(vp, vi, st[vres], delta, 0, O)
        new = st[F][:, k0:k1]
        st[rk] += float(st[lam] @ np.einsum("ij,ij->i", delta, 2.0 * new - delta))
        out["delta"] = delta
        out["loss"] = float(st[res] @ st[res])
        out["loss_valid"] = float(st[vres] @ st[vres])

    def _ccdpp_push(self, st, plan, out):
        t = plan["t"]
        if plan["phase"] == "W":
            side = ("rows", "vrows", "er", "evr", "W", "lam_rows", "regW", 0)
            o = st["hfull"]
        else:
            side = ("cols", "vcols", "ec", "evc", "H", "lam_cols", "regH", 1)
            o = st["wfull"]
        data, vdata, res, vres, F, lam, rk, s = side
        indptr, indices, _ = st[data]
        vp, vi, _ = st[vdata]
        n_local = indptr.shape[0] - 1
        f = np.empty(n_local)
        old = st[F][:, t].copy()
        t_out = int(st["pend"][s])
        if t_out == -2:  # nothing to swap: a later inner pass of this feature
            loss = K.rank1_update(indptr, indices, st[res], st[lam], o, f)
            loss_valid = K.rank1_loss(vp, vi, st[vres], f, o)
        else:
            # the pending swap (close feature t_out, open t) fused into this pass
            f_out = np.zeros(n_local) if t_out == -1 else st[F][:, t_out].copy()
            o_out, o_in = (st["h_out"], o) if s == 0 else (st["w_out"], st["w_in"])
            loss = K.swap_rank1_update(indptr, indices, st[res], f_out, o_out, old, o_in, o,
                                       st[lam], f)
            loss_valid = K.swap_rank1_loss(vp, vi, st[vres], f_out, o_out, old, o_in, f, o)
            st["pend"][s] = -2
        st[F][:, t] = f
        st[rk] += float(st[lam] @ (f * f - old * old))
        out["f"] = f
        out["loss"] = loss
        out["loss_valid"] = loss_valid

    def apply(self, st, update) -> None:
        kind = update["kind"]
        if kind == "init":
            mu = update["mean"]
            if mu != 0.0:
                for res in ("er", "ec", "evr", "evc"):
                    st[res] -= mu
            if self.method == "ccd":
                st["O"] = update["next"]
            else:  # open feature 0 (its term is added back by the next pushes)
                self._open(st, -1, update, np.zeros(len(update["h_next"])),
                           np.zeros(len(update["w_next"])))
            return
        if self.method == "ccd":
            k0, _ = update["k"]
            delta = update["delta"]
            if kind == "W":  # users changed: bring the column copies up to date
                for data, res in (("cols", "ec"), ("vcols", "evc")):
                    indptr, indices, _ = st[data]
                    K.subtract_lowrank(indptr, indices, st[res], st["H"], k0, delta)
            else:
                for data, res in (("rows", "er"), ("vrows", "evr")):
                    indptr, indices, _ = st[data]
                    K.subtract_lowrank(indptr, indices, st[res], st["W"], k0, delta)
            st["O"] = update["next"]
            return
        if kind == "W":
            st["wfull"] = update["f"]
        elif update["feature_end"]:
            # feature t is done: its new term leaves the residuals, the next one's enters,
            # both fused into the next push on each side
            self._open(st, update["t"], update, update["f"], st["wfull"])
        else:
            st["hfull"] = update["f"]

    def _open(self, st, t_out, update, h_out, w_out):
        """Record the pending residual swap (close ``t_out``, -1: nothing; open the next
        feature, whose full columns are in ``update``)."""
        st["pend"] = np.array([t_out, t_out], dtype=np.int64)
        st["h_out"], st["w_out"] = h_out, w_out
        st["w_in"] = update["w_next"]
        st["wfull"], st["hfull"] = update["w_next"], update["h_next"]

    # ------------------------------------------------------------------ state
    _STATE = ("W", "H", "er", "ec", "evr", "evc", "O", "wfull", "hfull", "pend", "h_out",
              "w_out", "w_in")

    def partition_arrays(self, st) -> dict:
        out = {k: st[k] for k in self._STATE}
        out["reg"] = np.array([st["regW"], st["regH"]])
        return out

    def restore_partition(self, st, arrays: dict) -> None:
        for k in self._STATE:
            st[k] = np.asarray(arrays[k])
        st["regW"], st["regH"] = (float(v) for v in arrays["reg"])

    def factors(self, st):
        """(first user, W rows, first item, H rows) of this partition."""
        return st["r0"], st["W"], st["c0"], st["H"]

    def save_factors(self, st, path):
        """Write this partition's W and H rows to ``path`` (a Zarr group) as arrays
        ``W/<k>`` and ``H/<k>``, on the worker; return their positions."""
        import zarr

        g = zarr.open_group(path, mode="a", zarr_format=3)
        for name, F in (("W", st["W"]), ("H", st["H"])):
            rows = max(1, min(len(F), (16 << 20) // (8 * F.shape[1])))
            a = g.create_array(f"{name}/{st['k']:05d}", shape=F.shape, dtype="float64",
                               chunks=(rows, F.shape[1]), overwrite=True)
            a[:] = F
        return st["k"], st["r0"], len(st["W"]), st["c0"], len(st["H"])
