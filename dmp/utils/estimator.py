"""What every dmp estimator shares with scikit-learn's machinery."""

from __future__ import annotations

import copy

from sklearn.base import clone


class SharedBackendMixin:
    """``sklearn.base.clone`` keeps a ``backend`` object (a ``distributed.Client`` or a
    backend instance) by reference.

    scikit-learn deep-copies every parameter that is not an estimator; a client is a live
    connection that cannot be copied, and a clone (in ``cross_val_score``, a grid search)
    should run on the same cluster anyway.  Every other parameter is cloned as scikit-learn
    does.
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
