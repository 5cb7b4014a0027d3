"""Small helpers the dmp estimators share (their base class is `dmp.base.DMPEstimator`)."""

from __future__ import annotations

import numbers

import numpy as np


def seed_from(random_state) -> int:
    """An integer seed from a scikit-learn ``random_state`` (None draws a fresh one)."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(random_state, numbers.Integral):
        return int(random_state)
    return int(random_state.randint(0, 2**31 - 1))


def __getattr__(name):
    # ``SharedBackendMixin`` (the clone that keeps a backend object) is now part of
    # `dmp.base.DMPEstimator`; imported on use, as this module sits below the estimators
    if name == "SharedBackendMixin":
        from ..base import DMPEstimator

        return DMPEstimator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
