"""Scheduler preload: ``dask scheduler --preload dmp.monitor.preload``.

Puts the dmp page in the dashboard itself (listed under "More..." as "Dmp Training", and at
``/dmp``) and registers `DMPMonitor` before the scheduler starts.  Without the preload, the
first dmp fit registers the monitor and the page is reachable at ``/dmp`` (not in the menu).
"""

from __future__ import annotations

try:  # the static pages must be in place before the scheduler builds its dashboard
    from distributed.dashboard.scheduler import applications as _applications
except Exception:  # bokeh missing: no dashboard; the plugin still serves the JSON route
    _applications = None
else:
    from .page import dmp_doc

    _applications.setdefault("/dmp", dmp_doc)
    _applications.setdefault("/individual-dmp-training", dmp_doc)


async def dask_setup(scheduler) -> None:
    from .plugin import PLUGIN_NAME, DMPMonitor

    scheduler.add_plugin(DMPMonitor(), name=PLUGIN_NAME, idempotent=True)
