"""Matrix and tensor decompositions trained with model parallelism."""

from ..utils._lazy import lazy_exports

_EXPORTS = {
    "LatentDirichletAllocation": "._lda",
    "MatrixFactorization": "._mf",
}

__all__ = ["LatentDirichletAllocation", "MatrixFactorization"]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
