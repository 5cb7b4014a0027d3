"""Fit events for the live monitor: what the runner tells the Dask scheduler.

Every fit gets an id and sends, in order, under the event topic ``"dmp"``:

``fit_start``   estimator, parameters, program, workers, primary metric and its direction
``round``       one per round: the same record the fit keeps in ``history_``
``checkpoint``  ``worker_lost``  ``recovered``
``fit_end``     status (``converged``, ``max_iter``, ``stopped``, ``error``), rounds, wall time

The scheduler-side `dmp.monitor.DMPMonitor` aggregates them for the dashboard page, the JSON
route and the Prometheus series.  Events cost the fit no round trip (see
`DaskBackend.log_event`); ``dask.config.set({"dmp.monitor": False})`` turns them off.
"""

from __future__ import annotations

import logging
import math
import time
import uuid

import numpy as np

from .. import config

logger = logging.getLogger("dmp")

TOPIC = "dmp"


def monitor_enabled() -> bool:
    """Whether fits send events and register the monitor (config key ``dmp.monitor``)."""
    return config.flag("dmp.monitor")


DIRECTIONS = ("min", "max")


def primary_of(program) -> tuple[str, str]:
    """``(name, direction)`` of the metric a program declares as its primary one.

    Every program declares ``primary_metric`` (a key of its `metrics`, default
    ``"objective"``) and ``primary_direction``: ``"min"`` when a lower value is better (an
    objective, the quantity ``dmp_objective`` carries), ``"max"`` when a higher one is (e.g.
    LDA's log-likelihood per token).  The console, ``metrics.json``, the JSON route, the
    dashboard page and Prometheus all report the primary metric under this name.
    """
    name = str(getattr(program, "primary_metric", None) or "objective")
    direction = str(getattr(program, "primary_direction", None) or "min")
    if direction not in DIRECTIONS:
        raise ValueError(f"{type(program).__name__}.primary_direction must be 'min' or "
                         f"'max', got {direction!r}")
    return name, direction


def jsonable(value, _depth: int = 0):
    """``value`` as msgpack/JSON-friendly Python data (numpy scalars and arrays become
    numbers and lists; anything else that is not plain data becomes its short repr)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return float(value)
    if isinstance(value, np.generic):
        return value.item()
    if _depth > 10:
        return _short_repr(value)
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 1024 else _short_repr(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, _depth + 1) for v in value]
    return _short_repr(value)


def _short_repr(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def finite_or_none(value):
    """JSON has no NaN or infinity: map them to None (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value


class FitEvents:
    """Send one fit's events through ``backend.log_event`` (a no-op on the local backend).

    Parameters
    ----------
    backend : Backend
        Events go through its ``log_event`` when it ``sends_events`` (`Backend`).
    program : Program
        Its ``name`` and its primary metric (`primary_of`) are reported.
    desc : str
        Estimator name (the fit id is ``"<desc>-<8 hex digits>"``).
    params : dict, optional
        The estimator's hyperparameters (shown next to the fit on the dashboard).
    """

    def __init__(self, backend, program, *, desc: str, params: dict | None = None,
                 max_iter: int | None = None):
        self.backend = backend
        self.program = program
        self.desc = desc
        self.params = params or {}
        self.max_iter = max_iter
        self.fit_id = f"{desc}-{uuid.uuid4().hex[:8]}"
        # (the setting is read only where the backend could send the events at all)
        self.enabled = bool(backend.sends_events) and monitor_enabled()

    def _send(self, kind: str, wait: bool = False, **fields) -> None:
        if self.enabled:
            self.backend.log_event(jsonable({"kind": kind, "fit": self.fit_id, **fields}),
                                   wait=wait)

    def _send_round(self, rec: dict) -> None:
        if self.enabled:
            # a program's own "kind" (e.g. Lasso's cd/gap/refresh round) travels as round_kind
            fields = {("round_kind" if k in ("kind", "fit") else k): v for k, v in rec.items()}
            self.backend.log_event(jsonable({**fields, "kind": "round", "fit": self.fit_id}))

    def start(self) -> None:
        if not self.enabled:
            return
        self.backend.register_monitor()
        n = self.backend.n_partitions
        primary, direction = primary_of(self.program)
        self._send("fit_start", estimator=self.desc, params=self.params,
                   program=getattr(self.program, "name", type(self.program).__name__),
                   primary_metric=primary, primary_direction=direction,
                   n_partitions=n,
                   workers=self._workers() or [f"partition-{k}" for k in range(n)],
                   max_iter=self.max_iter, started=time.time())

    def _workers(self) -> list[str]:
        """The worker (name) of each partition, as placed now."""
        return [str(w) for w in self.backend.placement or []]

    def round(self, rec: dict) -> None:
        self._send_round(rec)

    def checkpoint(self, round: int) -> None:
        self._send("checkpoint", round=round)

    def worker_lost(self, round: int, error: str) -> None:
        self._send("worker_lost", round=round, error=error)

    def recovered(self, resumed_round: int) -> None:
        self._send("recovered", resumed_round=resumed_round, workers=self._workers())

    def end(self, status: str, n_rounds: int, wall_s: float) -> None:
        # waits, so that every event of the fit has reached the scheduler when fit() returns
        self._send("fit_end", wait=True, status=status, n_rounds=n_rounds, wall_s=wall_s)
