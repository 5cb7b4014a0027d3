"""Byte accounting for the messages of every primitive."""

from __future__ import annotations

import numpy as np

from .program import Broadcast


def payload_nbytes(obj) -> int:
    """Bytes of array data in a message (numpy arrays, nested in dicts/lists/tuples).

    Scalars and small metadata count 8 bytes each; this matches what Dask serialises for the
    array buffers, which dominate every dmp message.
    """
    if obj is None:
        return 0
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(payload_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_nbytes(v) for v in obj)
    if isinstance(obj, Broadcast):
        return payload_nbytes(obj.value)
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    return 8
