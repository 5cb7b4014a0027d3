"""The scheduler plugin: collects dmp fit events and serves them, and keeps workers that hold
model partitions out of downscaling.

Registered by every dmp fit on a Dask cluster (`ensure_monitor`, idempotent) or preloaded on
the scheduler (`dmp.monitor.preload`, which also puts the page in the dashboard's menu).  On
the scheduler's HTTP server it adds:

* ``/dmp`` -- the live Bokeh page (needs bokeh; without it, a short text page saying so),
* ``/dmp/api/metrics.json`` -- every fit's description, rounds and totals
  (query arguments ``fit=<id>`` and ``since=<sequence number>``),
* ``dmp_*`` series on the scheduler's Prometheus ``/metrics`` (needs prometheus_client).
"""

from __future__ import annotations

import json
import logging
import warnings

from distributed.diagnostics.plugin import SchedulerPlugin

from ..engine.events import TOPIC, finite_or_none, plain
from .state import PLUGIN_NAME, MonitorState

logger = logging.getLogger("dmp.monitor")

PAGE_PATH = "/dmp"
JSON_PATH = "/dmp/api/metrics.json"
_INSTALLED_ATTR = "_dmp_monitor_features"


class DMPMonitor(SchedulerPlugin):
    """Scheduler plugin behind the dmp dashboard page, JSON route and Prometheus series.

    Parameters
    ----------
    max_fits : int
        Fits kept (finished ones are forgotten first).
    max_rounds : int
        Rounds kept per fit; totals (push seconds, bytes, rounds) still count every round.
        Together they bound the scheduler memory the monitor uses.
    """

    name = PLUGIN_NAME
    idempotent = True   # a second registration keeps the running instance

    def __init__(self, max_fits: int = 16, max_rounds: int = 5_000):
        if int(max_fits) < 1 or int(max_rounds) < 1:
            raise ValueError(f"max_fits and max_rounds must be >= 1, got {max_fits}, "
                             f"{max_rounds}")
        self.max_fits = int(max_fits)
        self.max_rounds = int(max_rounds)
        self.state: MonitorState | None = None
        self.scheduler = None
        self.features: dict = {}

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        previous = scheduler.plugins.get(PLUGIN_NAME)
        if isinstance(previous, DMPMonitor) and previous is not self and previous.state:
            self.state = previous.state   # a replacing registration keeps what was collected
        if self.state is None:
            self.state = MonitorState(self.max_fits, self.max_rounds)
        self.features = install(scheduler)
        from . import prometheus

        prometheus.track(self)

    async def close(self) -> None:
        from . import prometheus

        prometheus.untrack(self)

    def valid_workers_downscaling(self, scheduler, workers):
        """Keep workers that hold a dmp partition out of downscaling (adaptive scaling, the
        Kubernetes operator's DaskAutoscaler, ``retire_workers(n=...)``): a partition is an
        actor, which cannot move, so retiring its worker would force a recovery."""
        return [ws for ws in workers if not ws.actors]

    def log_event(self, topic, msg) -> None:
        if topic != TOPIC and not (isinstance(topic, (list, tuple)) and TOPIC in topic):
            return
        if self.state is None:
            self.state = MonitorState(self.max_fits, self.max_rounds)
        try:
            self.state.handle(msg)
        except Exception:  # a malformed event must never disturb the scheduler
            logger.exception("dmp monitor: could not handle event %r", msg)

    def to_json(self, fit: str | None = None, since: int = 0) -> str:
        data = (self.state or MonitorState(self.max_fits, self.max_rounds)).snapshot(fit, since)
        return json.dumps(finite_or_none(plain(data)), allow_nan=False)


def current_monitor(scheduler) -> DMPMonitor | None:
    plugin = scheduler.plugins.get(PLUGIN_NAME)
    return plugin if isinstance(plugin, DMPMonitor) else None


def install(scheduler) -> dict:
    """Add the routes and the page to ``scheduler``'s HTTP server, once per scheduler.

    Returns which features work: ``{"json": bool, "page": bool, "prometheus": bool}`` plus
    ``"page_error"`` when the page could not be served.
    """
    done = getattr(scheduler, _INSTALLED_ATTR, None)
    if done is not None:
        return done
    features = {"json": False, "page": False, "prometheus": False}
    setattr(scheduler, _INSTALLED_ATTR, features)
    app = getattr(scheduler, "http_application", None)
    if app is None:
        features["page_error"] = "the scheduler has no HTTP server"
        return features
    from distributed.http.utils import RequestHandler

    class MetricsHandler(RequestHandler):
        def get(self):
            plugin = current_monitor(self.server)
            try:
                since = int(self.get_argument("since", "0"))
            except ValueError:
                self.set_status(400)
                self.write({"error": "'since' must be an integer"})
                return
            self.set_header("Content-Type", "application/json")
            if plugin is None:
                self.write(json.dumps({"fits": [], "error": "dmp monitor not registered"}))
                return
            self.write(plugin.to_json(self.get_argument("fit", None), since))

    app.add_handlers(r".*", [(JSON_PATH, MetricsHandler, {"dask_server": scheduler})])
    features["json"] = True

    try:
        from distributed.dashboard.scheduler import applications
    except Exception as exc:  # bokeh missing or too old: dask has no dashboard either
        features["page_error"] = f"bokeh is not available on the scheduler ({exc})"

        class NoPageHandler(RequestHandler):
            def get(self):
                self.set_header("Content-Type", "text/plain; charset=utf-8")
                self.write(f"The dmp dashboard page needs bokeh on the scheduler: "
                           f"{features['page_error']}.\nThe data is at {JSON_PATH}.\n")

        app.add_handlers(r".*", [(PAGE_PATH, NoPageHandler, {"dask_server": scheduler})])
    else:
        if PAGE_PATH in applications:   # preloaded: the dashboard's own app serves it
            features["page"] = True
        else:
            try:
                _add_bokeh_page(scheduler, app)
                features["page"] = True
            except Exception as exc:
                features["page_error"] = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"dmp monitor: the dashboard page could not be added "
                              f"({features['page_error']}); {JSON_PATH} still works",
                              RuntimeWarning, stacklevel=2)
    from . import prometheus

    features["prometheus"] = prometheus.available()
    return features


def _add_bokeh_page(scheduler, app) -> None:
    from distributed.dashboard.core import BokehApplication
    from distributed.dashboard.scheduler import template_variables
    from tornado.ioloop import IOLoop

    from .page import dmp_doc

    # (a scheduler started with --dashboard-prefix does not keep the prefix: the page and
    # the JSON route are served at the root)
    bokeh_app = BokehApplication({PAGE_PATH: dmp_doc}, scheduler, prefix="",
                                 template_variables=template_variables(scheduler))
    app.add_application(bokeh_app)
    bokeh_app.initialize(IOLoop.current())
    bokeh_app.start()


def ensure_monitor(client) -> bool:
    """Register `DMPMonitor` on ``client``'s scheduler unless it is there already.

    Never raises: a scheduler that cannot load dmp (not installed there) gets a warning and
    the fit goes on without the dashboard page.
    """
    key = (getattr(client, "id", None), getattr(client.scheduler, "address", None))
    try:
        client.register_plugin(DMPMonitor(), name=PLUGIN_NAME)
    except Exception as exc:
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"the dmp monitor could not be registered on the scheduler "
                          f"{key[1]} ({type(exc).__name__}: {exc}); is dmp installed there? "
                          f"The fit runs without the dmp dashboard page.", RuntimeWarning,
                          stacklevel=3)
        return False
    return True


_warned: set = set()
