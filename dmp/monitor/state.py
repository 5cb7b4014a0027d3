"""Aggregate the fits' events (`dmp.engine.events`) into bounded per-fit state.

Pure Python, no Dask: the scheduler plugin feeds it, the dashboard page, the JSON route and the
Prometheus collector read it.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque

# per-round keys that are bookkeeping, not metrics to plot or export: timings, and counters
# the state keeps as totals (``batch``: the first round of the call a round ran in, counted as
# batches; ``worker_losses``: counted from the worker_lost events)
_NOT_METRICS = {"round", "time", "round_s", "push_s", "idle_s", "ring_s", "kind", "fit",
                "batch", "worker_losses"}
# parameters that tell runs apart without being the model's (checkpoint paths differ per run)
_NOT_COMPARED = {"callback", "backend", "show_progress", "checkpoint", "checkpoint_every",
                 "resume"}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class FitState:
    """One fit: its description, its last ``max_rounds`` rounds and running totals."""

    def __init__(self, fit_id: str, max_rounds: int):
        self.fit_id = fit_id
        self.info: dict = {"estimator": fit_id.rsplit("-", 1)[0], "params": {},
                           "workers": [], "primary_metric": "objective",
                           "primary_direction": "min"}
        self.status = "running"
        self.rounds: deque = deque(maxlen=max_rounds)
        self.n_rounds = 0            # rounds seen, including those dropped from ``rounds``
        self.last_round = -1
        self.push_total: list[float] = []
        self.idle_total: list[float] = []
        self.bytes_total: dict[str, float] = {}
        self.events: deque = deque(maxlen=200)   # checkpoints, losses, recoveries, start/end
        self.n_checkpoints = 0
        self.last_checkpoint_round = None
        self.n_worker_losses = 0
        self.n_recoveries = 0
        self.n_batches = 0           # calls to the workers (a batch runs several rounds)
        self.updated = time.time()
        self.end: dict = {}

    # -- event handlers -------------------------------------------------------------------
    def on_round(self, msg: dict) -> None:
        rec = {k: v for k, v in msg.items() if k not in ("kind", "fit")}
        self.rounds.append(rec)
        self.n_rounds += 1
        self.last_round = max(self.last_round, int(rec.get("round", -1)))
        if rec.get("batch", rec.get("round")) == rec.get("round"):
            self.n_batches += 1
        for name, total in (("push_s", self.push_total), ("idle_s", self.idle_total)):
            vals = rec.get(name) or []
            if len(total) < len(vals):
                total.extend([0.0] * (len(vals) - len(total)))
            for k, v in enumerate(vals):
                if _is_number(v):
                    total[k] += v
        for key, v in rec.items():
            if key.startswith("bytes_") and _is_number(v):
                prim = key[len("bytes_"):]
                self.bytes_total[prim] = self.bytes_total.get(prim, 0) + v

    def on_other(self, msg: dict, now: float) -> None:
        kind = msg.get("kind")
        if kind == "fit_start":
            self.info.update({k: v for k, v in msg.items() if k not in ("kind", "fit")})
            self.status = "running"
        elif kind == "checkpoint":
            self.n_checkpoints += 1
            self.last_checkpoint_round = msg.get("round")
        elif kind == "worker_lost":
            self.n_worker_losses += 1
        elif kind == "recovered":
            self.n_recoveries += 1
            if msg.get("workers"):
                self.info["workers"] = msg["workers"]
        elif kind == "fit_end":
            self.status = str(msg.get("status", "finished"))
            self.end = {k: v for k, v in msg.items() if k not in ("kind", "fit")}
        self.events.append({"time": now, **{k: v for k, v in msg.items() if k != "fit"}})

    # -- views ----------------------------------------------------------------------------
    @property
    def estimator(self) -> str:
        return str(self.info.get("estimator", "?"))

    @property
    def primary_metric(self) -> str:
        return str(self.info.get("primary_metric") or "objective")

    @property
    def primary_direction(self) -> str:
        """``"min"`` or ``"max"``: whether a lower or a higher primary metric is better."""
        d = str(self.info.get("primary_direction") or "min")
        return d if d in ("min", "max") else "min"

    def last_metrics(self) -> dict:
        """Numeric metrics of the latest round (scalars only)."""
        if not self.rounds:
            return {}
        last = self.rounds[-1]
        return {k: v for k, v in last.items()
                if k not in _NOT_METRICS and not k.startswith("bytes_") and _is_number(v)}

    def worker_names(self) -> list[str]:
        names = list(self.info.get("workers") or [])
        n = len(self.push_total)
        return [str(names[k]) if k < len(names) else f"partition-{k}" for k in range(n)]

    def summary(self) -> dict:
        metrics = self.last_metrics()
        primary = self.primary_metric
        return {
            "fit": self.fit_id, "estimator": self.estimator, "status": self.status,
            "params": self.info.get("params", {}), "program": self.info.get("program"),
            "primary_metric": primary, "direction": self.primary_direction,
            "value": metrics.get(primary),
            "round": self.last_round, "n_rounds": self.n_rounds,
            "max_iter": self.info.get("max_iter"),
            "elapsed_s": self.rounds[-1].get("time") if self.rounds else 0.0,
            "n_checkpoints": self.n_checkpoints,
            "last_checkpoint_round": self.last_checkpoint_round,
            "n_worker_losses": self.n_worker_losses, "n_recoveries": self.n_recoveries,
            "n_batches": self.n_batches,
        }

    def rounds_since(self, seq: int) -> list[dict]:
        """Rounds with sequence number >= ``seq`` (the n-th round received has number n-1;
        rounds re-run after a recovery get new numbers) that are still kept."""
        first = self.n_rounds - len(self.rounds)
        skip = max(0, int(seq) - first)
        return [r for i, r in enumerate(self.rounds) if i >= skip]

    def snapshot(self, since: int = 0) -> dict:
        out = self.summary()
        out.update({
            "workers": self.worker_names(), "info": dict(self.info),
            "metrics": self.last_metrics(), "end": dict(self.end),
            "totals": {"push_s": list(self.push_total), "idle_s": list(self.idle_total),
                       "bytes": dict(self.bytes_total)},
            "events": list(self.events),
            "first_seq": max(self.n_rounds - len(self.rounds), int(since)),
            "rounds": self.rounds_since(since),
        })
        return out


class MonitorState:
    """Every fit the scheduler has heard of, newest last, at most ``max_fits`` of them
    (finished fits are dropped first) and ``max_rounds`` rounds each."""

    def __init__(self, max_fits: int = 16, max_rounds: int = 5_000):
        if max_fits < 1 or max_rounds < 1:
            raise ValueError("max_fits and max_rounds must be >= 1")
        self.max_fits = int(max_fits)
        self.max_rounds = int(max_rounds)
        self.fits: OrderedDict[str, FitState] = OrderedDict()
        self.n_events = 0

    def _fit(self, fit_id: str) -> FitState:
        fit = self.fits.get(fit_id)
        if fit is None:
            fit = self.fits[fit_id] = FitState(fit_id, self.max_rounds)
            self._trim()
        return fit

    def _trim(self) -> None:
        while len(self.fits) > self.max_fits:
            victim = next((k for k, f in self.fits.items() if f.status != "running"),
                          next(iter(self.fits)))
            del self.fits[victim]

    def handle(self, msg) -> None:
        """Take one event message (anything that is not a dmp fit event is ignored)."""
        if isinstance(msg, dict) and msg.get("kind") == "batch":
            for m in msg.get("events") or ():
                self.handle(m)
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("fit"), str):
            return
        self.n_events += 1
        fit = self._fit(msg["fit"])
        fit.updated = time.time()
        if msg.get("kind") == "round":
            fit.on_round(msg)
        else:
            fit.on_other(msg, fit.updated)

    def snapshot(self, fit: str | None = None, since: int = 0) -> dict:
        """JSON-ready view: ``{"fits": [...]}`` with every fit's kept rounds (or only
        ``fit``'s; only rounds with sequence number ``since`` or later)."""
        fits = [f for f in self.fits.values() if fit is None or f.fit_id == fit]
        return {"generated": time.time(), "n_events": self.n_events,
                "max_rounds": self.max_rounds,
                "fits": [f.snapshot(since) for f in fits]}

    def summaries(self) -> list[dict]:
        return [f.summary() for f in self.fits.values()]


#: the name the scheduler plugin (`dmp.monitor.DMPMonitor`) is registered under
PLUGIN_NAME = "dmp-monitor"


def scheduler_state(scheduler) -> MonitorState | None:
    """The state that ``scheduler``'s dmp monitor plugin collects; None while it has none."""
    state = getattr(scheduler.plugins.get(PLUGIN_NAME), "state", None)
    return state if isinstance(state, MonitorState) else None


def _param_text(v) -> str:
    return format_value(v) if isinstance(v, float) else str(v)


def run_labels(fits) -> dict[str, str]:
    """``{fit id: label}``: fits of the same estimator that differ in a few parameters (the
    runs a pipeline compares) are labelled by them, e.g. ``"schedule=priority"``; a fit with
    nothing to tell it apart gets ``""``."""
    groups: dict[str, list] = {}
    for f in fits:
        groups.setdefault(f.estimator, []).append(f)
    out = {}
    for group in groups.values():
        params = [{k: v for k, v in (f.info.get("params") or {}).items()
                   if k not in _NOT_COMPARED} for f in group]
        keys = sorted({k for p in params for k in p})
        differ = [k for k in keys if len({repr(p.get(k)) for p in params}) > 1]
        for f, p in zip(group, params):
            out[f.fit_id] = ", ".join(f"{k}={_param_text(p.get(k))}" for k in differ[:3])
    return out


def format_value(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)
