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
