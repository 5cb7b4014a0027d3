"""dmp: dynamic model parallelism on Dask (STRADS, ParMAC, independent sparsification)."""

import atexit as _atexit
import gc as _gc

from . import config  # noqa: F401  - dmp's settings join Dask's configuration (dmp.yaml)
from .utils.cluster import set_monitor_registrar as _set_monitor_registrar

__version__ = "0.1.0"


def _register_monitor(client) -> bool:
    # the package wires the live monitor into every fit on a cluster: the engine, below the
    # monitor, asks through dmp.utils.cluster; dmp.monitor is imported only then
    from .monitor import ensure_monitor

    return ensure_monitor(client)


_set_monitor_registrar(_register_monitor)

# Interpreter shutdown's last collection walks the whole heap of numba, scipy and distributed
# objects; a process that imported dmp (drivers and Dask workers alike) skips it and exits at
# once.  Nothing of dmp's relies on a cyclic object being finalised at exit.
_atexit.register(_gc.freeze)


def __getattr__(name):
    # `dmp.plan` (dmp.planning) imports the estimators' base and the engine: only when used
    if name == "plan":
        from .planning import plan

        return plan
    raise AttributeError(f"module 'dmp' has no attribute {name!r}")
