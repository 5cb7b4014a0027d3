"""Live monitoring of dmp fits on a Dask cluster.

* `DMPMonitor` -- the scheduler plugin: a ``/dmp`` page in the Dask dashboard,
  ``/dmp/api/metrics.json`` and ``dmp_*`` Prometheus series.  Every fit on a Dask cluster
  registers it (`ensure_monitor`); ``dask scheduler --preload dmp.monitor.preload`` also lists
  the page in the dashboard's menu.
* `follow` -- print a running cluster's fits as they progress (``dmp monitor ADDRESS``).
* `plot_history` -- the same figures from a fitted estimator's ``history_`` (matplotlib).
"""

from ..plotting import plot_training as plot_history
from .follow import follow
from .plugin import JSON_PATH, PAGE_PATH, PLUGIN_NAME, DMPMonitor, ensure_monitor
from .state import MonitorState

__all__ = ["DMPMonitor", "MonitorState", "ensure_monitor", "follow", "plot_history",
           "PLUGIN_NAME", "PAGE_PATH", "JSON_PATH"]
