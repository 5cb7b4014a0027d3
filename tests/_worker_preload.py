"""Imported once, by the server process that the tests' Dask worker processes are forked from
(``_workers_forked_warm`` in tests/conftest.py): what every spawned worker would otherwise
import and load for itself, a few seconds of CPU per worker and per replacement of a killed
one."""

import distributed  # noqa: F401

import dmp.decomposition  # noqa: F401
import dmp.hashing  # noqa: F401
import dmp.linear_model  # noqa: F401
from dmp.engine.backends import dask as _dask_backend  # noqa: F401
from dmp.kernels import _warmup

_warmup.main()   # the compiled kernels, loaded from Numba's on-disk cache
