"""Backend protocol helpers and selection."""

from __future__ import annotations

import sys

# named errors of dmp.exceptions (DMPError subclasses), imported from here before they moved
from ...exceptions import InsufficientMemoryError, WorkerLostError  # noqa: F401
from .protocol import Backend, check_backend


def _looks_like_backend(obj) -> bool:
    return isinstance(obj, Backend) or (hasattr(obj, "step") and hasattr(obj, "start"))


def active_client():
    """The current ``distributed.Client``, or None when there is none.

    A client (and a Dask worker) exists only once ``distributed`` is imported: without it
    there is none, and an in-process fit does not pay distributed's import (most of a small
    first fit's time otherwise, BENCHMARKS.md "Small problems and the first fit")."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    try:
        return distributed.get_client()
    except ValueError:
        return None


def _is_client(obj) -> bool:
    distributed = sys.modules.get("distributed")   # no client without it (`active_client`)
    return distributed is not None and isinstance(obj, distributed.Client)


def resolve_backend(backend="auto", n_workers=None):
    """Turn an estimator's ``backend`` argument into a backend instance.

    ``"auto"`` uses the active ``distributed.Client`` if there is one, else the in-process
    :class:`LocalBackend` (it never starts a cluster by itself).  ``"local"`` and ``"dask"``
    force one; a ``distributed.Client`` runs on that client's cluster; a backend instance is
    returned unchanged.
    """
    from .local import LocalBackend

    if not isinstance(backend, str):
        if _looks_like_backend(backend):
            return check_backend(backend)
        if _is_client(backend):
            from .dask import DaskBackend

            return DaskBackend(backend, n_workers=n_workers)
        raise ValueError(f"backend must be 'auto', 'local', 'dask' or a backend instance, "
                         f"got {backend!r}")
    if backend == "local":
        return LocalBackend(n_workers=n_workers or 1)
    if backend in ("dask", "auto"):
        client = active_client()
        if client is None:
            if backend == "dask":
                raise ValueError("backend='dask' needs an active distributed.Client "
                                 "(create one with distributed.Client(address))")
            return LocalBackend(n_workers=n_workers or 1)
        from .dask import DaskBackend

        return DaskBackend(client, n_workers=n_workers)
    raise ValueError(f"backend must be 'auto', 'local', 'dask' or a backend instance, "
                     f"got {backend!r}")
