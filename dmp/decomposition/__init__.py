"""Matrix and tensor decompositions trained with model parallelism."""

_EXPORTS = {
    "LatentDirichletAllocation": "._lda",
    "MatrixFactorization": "._mf",
}

__all__ = ["LatentDirichletAllocation", "MatrixFactorization"]


def __getattr__(name):
    # the estimators (and scikit-learn under them) load when first asked for: a Dask worker
    # unpickling a program of this package imports only the program's module
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
