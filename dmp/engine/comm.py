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
    # every round sizes its plans and partials: the way to size an object is looked up by
    # its type once (`_sizer`), not found by a chain of isinstance tests each time
    try:
        return _SIZERS[type(obj)](obj)
    except KeyError:
        return _sizer(type(obj))(obj)


def _array_nbytes(obj) -> int:
    return int(obj.nbytes)


def _mapping_nbytes(obj) -> int:
    return sum([payload_nbytes(v) for v in obj.values()])


def _sequence_nbytes(obj) -> int:
    return sum([payload_nbytes(v) for v in obj])


def _broadcast_nbytes(obj) -> int:
    return payload_nbytes(obj.value)


def _bytes_nbytes(obj) -> int:
    return len(obj)


def _scalar_nbytes(obj) -> int:
    return 8


def _none_nbytes(obj) -> int:
    return 0


def _message_sizer(cls):
    names = None

    def size(obj) -> int:
        nonlocal names
        if names is None:   # (a Message that is not a dataclass raises here, as before)
            names = tuple(f.name for f in fields(obj))
        return 8 + sum([payload_nbytes(getattr(obj, n)) for n in names])

    return size


#: how each type of object met so far is sized (`_sizer`)
_SIZERS: dict = {type(None): _none_nbytes}


def _sizer(cls):
    """How `payload_nbytes` sizes an object of type ``cls`` (the order of the tests is
    the rule: an array subclass is an array, a dict or tuple subclass a container, ...)."""
    if issubclass(cls, np.ndarray):
        fn = _array_nbytes
    elif issubclass(cls, dict):
        fn = _mapping_nbytes
    elif issubclass(cls, (list, tuple)):
        fn = _sequence_nbytes
    elif issubclass(cls, Broadcast):
        fn = _broadcast_nbytes
    elif issubclass(cls, Message):
        fn = _message_sizer(cls)
    elif issubclass(cls, (bytes, bytearray)):
        fn = _bytes_nbytes
    else:
        fn = _scalar_nbytes
    _SIZERS[cls] = fn
    return fn
