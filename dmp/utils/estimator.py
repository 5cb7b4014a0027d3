"""What every dmp estimator shares with scikit-learn's machinery, below the estimators'
base class (`dmp.base.DMPEstimator`): its clone and its seeds."""

from __future__ import annotations

import copy
import numbers

import numpy as np
from sklearn.base import clone


def seed_from(random_state) -> int:
    """An integer seed from a scikit-learn ``random_state`` (None draws a fresh one)."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(random_state, numbers.Integral):
        return int(random_state)
    return int(random_state.randint(0, 2**31 - 1))


class SharedBackendMixin:
    """``sklearn.base.clone`` keeps a ``backend`` object (a ``distributed.Client`` or a
    backend instance) by reference.

    scikit-learn deep-copies every parameter that is not an estimator; a client is a live
    connection that cannot be copied, and a clone (in ``cross_val_score``, a grid search)
    should run on the same cluster anyway.  Every other parameter is cloned as scikit-learn
    does.  `dmp.base.DMPEstimator`, the base of every dmp estimator, derives from it.
    """

    def __sklearn_clone__(self):
        params = self.get_params(deep=False)
        new_params = {name: value if name == "backend" and not isinstance(value, str)
                      else clone(value, safe=False) for name, value in params.items()}
        new = type(self)(**new_params)
        for name, value in new.get_params(deep=False).items():
            if value is not new_params[name]:
                raise RuntimeError(f"Cannot clone {self!r}: the constructor does not store "
                                   f"parameter {name} unchanged")
        for attr in ("_metadata_request", "_sklearn_output_config"):
            if hasattr(self, attr):
                setattr(new, attr, copy.deepcopy(getattr(self, attr)))
        return new
