"""Wording of user-facing messages."""

from __future__ import annotations

import numbers

import numpy as np


def plural(n, word: str, many: str | None = None, *, grouped: bool = False) -> str:
    """``n`` and ``word``, singular for exactly one: ``plural(1, "partition")`` is
    "1 partition", ``plural(3, "partition")`` "3 partitions".

    Parameters
    ----------
    n : int
        The count (a numpy integer is shown as a Python int, never ``np.int64(3)``).
    word : str
        The singular.
    many : str, optional
        The plural, when it is not ``word + "s"`` ("entries", "indices").
    grouped : bool, default False
        Thousands separators: "1,234 values".
    """
    if isinstance(n, numbers.Integral):
        n = int(n)
    shown = f"{n:,}" if grouped else f"{n}"
    return f"{shown} {word if n == 1 else (many or word + 's')}"


def _python(x):
    """``x`` with numpy scalars, also inside tuples, lists and dicts, as Python values."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (list, tuple)):
        return type(x)(_python(v) for v in x) if type(x) in (list, tuple) else x
    if isinstance(x, dict):
        return {_python(k): _python(v) for k, v in x.items()}
    return x


def shown(x) -> str:
    """``repr(x)`` as a user reads it: numpy scalars (also in tuples, lists and dicts) shown
    as the Python values they hold, ``3`` and ``(0, 3)``, never ``np.int64(3)`` (numpy 2's
    repr)."""
    return repr(_python(x))
