"""The STRADS engine: programs, the round runner, backends and checkpoints."""

from .backends import Backend, LocalBackend, WorkerLostError, resolve_backend
from .checkpoint import CheckpointStore
from .program import Broadcast, Program, Sends
from .runner import RunResult, run

__all__ = ["Program", "Broadcast", "Sends", "run", "RunResult", "Backend", "LocalBackend",
           "WorkerLostError", "resolve_backend", "CheckpointStore"]
