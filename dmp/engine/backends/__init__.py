"""Execution backends: the same Program runs in-process or on a Dask cluster."""

from .base import WorkerLostError, resolve_backend
from .local import LocalBackend

__all__ = ["LocalBackend", "DaskBackend", "WorkerLostError", "resolve_backend"]


def __getattr__(name):
    if name == "DaskBackend":
        from .dask import DaskBackend

        return DaskBackend
    raise AttributeError(name)
