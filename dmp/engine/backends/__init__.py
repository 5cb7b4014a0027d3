"""Execution backends: the same Program runs in-process or on a Dask cluster."""

from .base import WorkerLostError, resolve_backend
from .protocol import Backend, check_backend
from .local import LocalBackend

__all__ = ["Backend", "LocalBackend", "DaskBackend", "WorkerLostError", "check_backend",
           "resolve_backend"]


def __getattr__(name):
    if name == "DaskBackend":
        from .dask import DaskBackend

        return DaskBackend
    raise AttributeError(name)
