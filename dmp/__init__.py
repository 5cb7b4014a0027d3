"""dmp: dynamic model parallelism on Dask (STRADS, ParMAC, independent sparsification)."""

from .utils.cluster import set_monitor_registrar as _set_monitor_registrar

__version__ = "0.1.0"


def _register_monitor(client) -> bool:
    # the package wires the live monitor into every fit on a cluster: the engine, below the
    # monitor, asks through dmp.utils.cluster; dmp.monitor is imported only then
    from .monitor import ensure_monitor

    return ensure_monitor(client)


_set_monitor_registrar(_register_monitor)
