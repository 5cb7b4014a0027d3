"""Linear models trained with model parallelism."""

from ..utils._lazy import lazy_exports

_EXPORTS = {
    "Lasso": "._lasso",
    "SparsifiedSGDClassifier": "._sparsified",
    "SparsifiedSGDRegressor": "._sparsified",
}

__all__ = ["Lasso", "SparsifiedSGDClassifier", "SparsifiedSGDRegressor"]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
