"""glibc's heap thresholds in a Dask worker's process (Linux only).

A Dask nanny starts its worker with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``) so that freed memory goes back to the system
quickly.  Setting any threshold also turns off glibc's adaptive mmap threshold, which
otherwise learns that a freed 1 MiB block is a temporary and serves the next one from the
heap: in a nanny's worker every temporary array of >= 128 KiB is a fresh ``mmap`` whose
pages fault in one by one on first write, and returns to the system when freed.  A kernel
that makes a few such temporaries a round (numpy expressions in a push) then spends most of
its time in page faults (BENCHMARKS.md, "The heap of a nanny's worker").  `reuse_heap`
sets both thresholds once per process to what glibc's adaptive rule reaches at most.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

from .. import config

#: the setting: the free heap a worker keeps for reuse (``off`` leaves the process's own)
KEY = "dmp.worker-heap-reuse"

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts (``HEAP_MAX_SIZE / 2`` on 64-bit), which is
#: also where its adaptive threshold stops
MMAP_THRESHOLD_MAX = 32 << 20

#: the (trim, mmap) thresholds this process was given, once it was given them
_applied: list = [None]


def heap_reuse_bytes() -> int | None:
    """The setting ``dmp.worker-heap-reuse`` in bytes, or None when it is off."""
    value = config.get(KEY)
    if isinstance(value, str):
        value = value.strip().lower()
        if value in config._FALSE or value in ("none", ""):
            return None
    elif not value:                          # None, False, 0
        return None
    return config.nbytes(KEY)


def _mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
    except (OSError, AttributeError):        # not glibc (musl has no mallopt)
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def reuse_heap() -> tuple[int, int] | None:
    """Give this process glibc thresholds that keep temporaries on the heap: free memory up
    to ``dmp.worker-heap-reuse`` is kept for reuse (``M_TRIM_THRESHOLD``), blocks up to half
    of it, at most 32 MiB, come from the heap (``M_MMAP_THRESHOLD``).  Once per process;
    returns the thresholds set, or None where the setting is off or the C library is not
    glibc."""
    if _applied[0] is not None:
        return _applied[0]
    keep = heap_reuse_bytes()
    if keep is None:
        return None
    mallopt = _mallopt()
    if mallopt is None:
        return None
    keep = min(keep, 2**31 - 1)
    mmap_threshold = min(max(keep // 2, 1), MMAP_THRESHOLD_MAX)
    if not (mallopt(_M_MMAP_THRESHOLD, mmap_threshold) and mallopt(_M_TRIM_THRESHOLD, keep)):
        return None
    _applied[0] = (keep, mmap_threshold)
    return _applied[0]
