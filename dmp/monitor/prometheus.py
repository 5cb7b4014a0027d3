"""``dmp_*`` series on the scheduler's Prometheus ``/metrics`` route.

The scheduler serves ``prometheus_client``'s global registry there, so one collector per
process, registered once, reports every live `DMPMonitor` of the process at scrape time.
"""

from __future__ import annotations

import math
import weakref

_monitors: "weakref.WeakSet" = weakref.WeakSet()
_collector = None


def available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("prometheus_client") is not None
    except (ImportError, ValueError):   # a module blocked with sys.modules[name] = None
        return False


def track(monitor) -> bool:
    """Report ``monitor``'s fits on ``/metrics`` (False when prometheus_client is missing)."""
    global _collector
    if not available():
        return False
    if _collector is None:
        from prometheus_client import REGISTRY

        collector = DMPCollector()
        REGISTRY.register(collector)
        _collector = collector
    _monitors.add(monitor)
    return True


def untrack(monitor) -> None:
    _monitors.discard(monitor)


def _num(v) -> float:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


class DMPCollector:
    """Builds the ``dmp_*`` metric families from the tracked monitors' state."""

    def describe(self):
        return []   # no metrics at registration time: nothing to clash with

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        fit_l = ["fit", "estimator"]
        info = GaugeMetricFamily("dmp_fit_running", "1 while the fit runs, 0 once it ended",
                                 labels=fit_l + ["status"])
        objective = GaugeMetricFamily(
            "dmp_objective", "The minimised primary metric after the latest round (only for "
            "fits whose primary metric is minimised; see dmp_primary_metric)", labels=fit_l)
        primary = GaugeMetricFamily(
            "dmp_primary_metric", "The fit's primary metric after the latest round; direction "
            "min: lower is better, max: higher is better", labels=fit_l + ["metric", "direction"])
        metric = GaugeMetricFamily("dmp_metric", "Every scalar metric of the latest round",
                                   labels=fit_l + ["metric"])
        rounds = CounterMetricFamily("dmp_rounds", "Rounds completed", labels=fit_l)
        elapsed = GaugeMetricFamily("dmp_elapsed_seconds", "Fit time at the latest round",
                                    labels=fit_l)
        push = CounterMetricFamily("dmp_push_seconds", "Push (kernel) time per worker",
                                   labels=fit_l + ["worker"])
        idle = CounterMetricFamily("dmp_idle_seconds",
                                   "Round time minus push time per worker (barrier wait, "
                                   "communication)", labels=fit_l + ["worker"])
        nbytes = CounterMetricFamily("dmp_bytes", "Bytes moved per primitive",
                                     labels=fit_l + ["primitive"])
        losses = CounterMetricFamily("dmp_worker_losses", "Worker losses", labels=fit_l)
        recov = CounterMetricFamily("dmp_recoveries", "Recoveries from worker loss",
                                    labels=fit_l)
        ckpt = CounterMetricFamily("dmp_checkpoints", "Checkpoints written", labels=fit_l)
        batches = CounterMetricFamily("dmp_batches", "Calls to the workers (a batch runs one "
                                      "or more rounds)", labels=fit_l)
        for mon in list(_monitors):
            state = mon.state
            if state is None:
                continue
            for fit in list(state.fits.values()):
                lab = [fit.fit_id, fit.estimator]
                info.add_metric(lab + [fit.status], 1.0 if fit.status == "running" else 0.0)
                last = fit.last_metrics()
                name, direction = fit.primary_metric, fit.primary_direction
                value = _num(last.get(name))
                primary.add_metric(lab + [name, direction], value)
                if direction == "min":   # never a quantity that is maximised
                    objective.add_metric(lab, value)
                for name, v in sorted(last.items()):
                    metric.add_metric(lab + [name], _num(v))
                rounds.add_metric(lab, float(fit.n_rounds))
                elapsed.add_metric(lab, _num(fit.rounds[-1].get("time") if fit.rounds else 0))
                names = fit.worker_names()
                for k, v in enumerate(fit.push_total):
                    push.add_metric(lab + [names[k]], v)
                for k, v in enumerate(fit.idle_total):
                    idle.add_metric(lab + [names[k]], v)
                for prim, v in sorted(fit.bytes_total.items()):
                    nbytes.add_metric(lab + [prim], float(v))
                losses.add_metric(lab, float(fit.n_worker_losses))
                recov.add_metric(lab, float(fit.n_recoveries))
                ckpt.add_metric(lab, float(fit.n_checkpoints))
                batches.add_metric(lab, float(fit.n_batches))
        yield from (info, objective, primary, metric, rounds, elapsed, push, idle, nbytes,
                    losses, recov, ckpt, batches)
