"""Linear models trained with model parallelism."""

from ._lasso import Lasso

__all__ = ["Lasso"]
