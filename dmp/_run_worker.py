"""Worker preload of `dmp run`'s embedded cluster.

Ctrl-C in a terminal reaches every process of its process group, the embedded cluster's
worker processes included; the driver handles it (it stops the fit, shuts the cluster down
and says how to resume), so the workers ignore it instead of each printing a traceback.
"""

import signal


def dask_setup(worker) -> None:  # noqa: ARG001 (Dask's preload protocol)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
