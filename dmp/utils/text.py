"""Wording of user-facing messages."""

from __future__ import annotations

import numbers


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
