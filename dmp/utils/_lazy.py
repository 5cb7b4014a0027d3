"""Package exports loaded on first use (PEP 562 module ``__getattr__``)."""

from __future__ import annotations

from importlib import import_module


def lazy_exports(namespace: dict, exports: dict[str, str]):
    """``(__getattr__, __dir__)`` for a package whose ``namespace`` (its ``globals()``)
    loads each name of ``exports`` (name -> relative module) from its module when first
    asked for, and keeps it: a Dask worker unpickling a program of the package imports only
    the program's module, not the estimators and scikit-learn under them."""
    package = namespace["__name__"]

    def __getattr__(name):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
