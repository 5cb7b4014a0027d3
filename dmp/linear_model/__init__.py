"""Linear models trained with model parallelism."""

from ._lasso import Lasso
from ._sparsified import SparsifiedSGDClassifier, SparsifiedSGDRegressor

__all__ = ["Lasso", "SparsifiedSGDClassifier", "SparsifiedSGDRegressor"]
