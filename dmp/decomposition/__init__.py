"""Matrix and tensor decompositions trained with model parallelism."""

from ._lda import LatentDirichletAllocation
from ._mf import MatrixFactorization

__all__ = ["LatentDirichletAllocation", "MatrixFactorization"]
