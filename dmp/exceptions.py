"""dmp's named errors and warnings.

Every error dmp raises on purpose derives from `DMPError` and from the builtin exception a
caller would catch without knowing dmp (a malformed checkpoint is a `ValueError`, as the
checkpoint mismatches raised before these classes existed were).
"""

from __future__ import annotations


class DMPError(Exception):
    """Base class of dmp's named errors."""


class CheckpointError(DMPError, ValueError):
    """A checkpoint that cannot be used: malformed, corrupt, missing a piece, written by
    another fit, or in use by another fit.  The message names the store, the round and what
    is wrong."""


class CheckpointLockedError(CheckpointError):
    """A checkpoint location another live fit is writing (its lock is held and fresh)."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (a corrupt or incomplete round: resumed from an earlier one),
    or a stale checkpoint lock was taken over."""


class ConfigWarning(UserWarning):
    """Dask's configuration has a key in its ``dmp`` section that is none of dmp's settings
    (``dmp/dmp.yaml``), e.g. a misspelt one: it is ignored."""


class WorkerLostError(DMPError, RuntimeError):
    """A worker holding a partition died (its state is gone; the runner recovers)."""


class InsufficientMemoryError(DMPError, MemoryError):
    """The model's partitions do not fit the workers' memory limits (raised before any
    partition is created, instead of the nanny killing workers mid-fit)."""


class RecoveryError(DMPError, RuntimeError):
    """A fit gave up recovering from worker losses: more losses than ``max_recoveries``, or
    no worker left to recover on."""


class WorkerPausedError(DMPError, RuntimeError):
    """A worker the fit needs stayed paused by Dask (its memory above
    ``distributed.worker.memory.pause``) for longer than the fit waits
    (``dmp.worker-pause-timeout``, 30 s by default): a paused worker runs no new task, so
    the fit's partitions cannot be placed on it.  The message names the worker, its memory
    and its limit."""


class SchedulerLostError(DMPError, ConnectionError):
    """The Dask scheduler went away during a fit.  ``address`` is the scheduler's,
    ``round`` the round the fit had reached, ``checkpoint`` the checkpoint location (None
    without one) and ``checkpoint_round`` its latest complete round (None when there is
    none): a fit with ``resume=True`` on a running cluster continues from there."""

    def __init__(self, message: str, *, address=None, round=None, checkpoint=None,
                 checkpoint_round=None):
        super().__init__(message)
        self.address = address
        self.round = round
        self.checkpoint = checkpoint
        self.checkpoint_round = checkpoint_round
