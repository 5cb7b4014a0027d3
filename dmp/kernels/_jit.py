"""`njit`: Numba's decorator for dmp's kernels, whose cached machine code loads without
Numba's compiler set-up.

Numba loads a kernel from its on-disk cache only after refreshing its whole compiler context
(every typing and lowering registry, cffi support, the extension entry points): 0.13-0.21 s of
CPU once per process (BENCHMARKS.md), most of a small first fit, which needs none of it.  What the loaded
code needs at run time is Numba's runtime (NRT) and the symbols it links against: those of
Numba's helper library are registered when Numba is imported, the hash secret when
``numba.cpython.hashing`` is.  A kernel that is compiled (no cache yet, a new signature) still
goes through Numba's compiler, which refreshes the context itself first.  Nor does a kernel's
first call scan the installed packages for Numba extensions (10 ms; dmp's kernels take numpy
arrays and scalars only).

Kernels allocate nothing (no ``np.empty``/``np.zeros``/``np.full``, no array assigned to a
slice): the cached code of such a step refers to Numba's array implementation, which loading
the first such kernel imports (50-95 ms of a process's first fit; BENCHMARKS.md,
"The first fit's array module").  A kernel that needs arrays is called through a thin Python
function of the public name that makes them and calls a ``_``-prefixed kernel (as
``uniform_init`` calls ``_uniform_fill``); `tests/test_small_fits.py` checks that no
estimator's fit imports the module.
"""

from __future__ import annotations

import numba

try:   # Numba's own cache class; a Numba without it keeps its default loading
    from numba.core.caching import FunctionCache as _FunctionCache
except ImportError:   # pragma: no cover
    _FunctionCache = None

__all__ = ["njit", "loads_without_refresh"]


if _FunctionCache is not None and hasattr(_FunctionCache, "_load_overload"):

    class _RuntimeOnlyCache(_FunctionCache):
        """Numba's function cache, with the runtime set up instead of the compiler's
        registries before a load."""

        def load_overload(self, sig, target_context):
            from numba.core.runtime import rtsys
            import numba.cpython.hashing  # noqa: F401  (registers the hash secret's symbols)

            rtsys.initialize(target_context)
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
else:   # pragma: no cover
    _RuntimeOnlyCache = None


def njit(**options):
    """``numba.njit(**options)``; with ``cache=True``, the kernel loads from the on-disk cache
    without refreshing Numba's compiler context (module docstring)."""
    def decorate(func):
        dispatcher = numba.njit(**options)(func)
        cache = getattr(dispatcher, "_cache", None)
        if _RuntimeOnlyCache is not None and type(cache) is _FunctionCache:
            cache.__class__ = _RuntimeOnlyCache
        # a kernel's first call would load the Numba extensions installed in the
        # environment (a scan of every package's entry points): dmp's kernels take numpy
        # arrays and scalars only, which need none; other Numba code still loads them
        dispatcher._compilation_chain_init_hook = _no_extensions
        return dispatcher
    return decorate


def _no_extensions() -> None:
    """A dmp kernel's compilation chain hook: nothing to register (`njit`)."""


def loads_without_refresh(dispatcher) -> bool:
    """Whether ``dispatcher`` (a kernel made by `njit`) loads its cached code this way."""
    return _RuntimeOnlyCache is not None and isinstance(getattr(dispatcher, "_cache", None),
                                                         _RuntimeOnlyCache)
