"""Matrix and tensor decompositions trained with model parallelism."""

from ._mf import MatrixFactorization

__all__ = ["MatrixFactorization"]
