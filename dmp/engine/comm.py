"""Byte accounting for the messages of every primitive."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from .program import Broadcast, Message


def payload_nbytes(obj) -> int:
    """Bytes of array data in a message (numpy arrays, nested in dicts/lists/tuples and
    `Message` dataclasses).

    Scalars and small metadata count 8 bytes each, and so does a `Message`'s type; this
    matches what Dask serialises for the array buffers, which dominate every dmp message.
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
    if isinstance(obj, Message):
        return 8 + sum(payload_nbytes(getattr(obj, f.name)) for f in fields(obj))
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    return 8
