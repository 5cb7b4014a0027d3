"""What the writers accept: ``X`` and ``y`` checked, and ``X`` as canonical float64 CSC or CSR
blocks, from numpy and scipy.sparse arrays in memory or a dask array a block at a time."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ._store import DatasetError

_DENSE_BLOCK_ELEMS = 1 << 24  # dask -> sparse conversion: at most 16M dense values at once


def _is_dask(x) -> bool:
    return type(x).__module__.startswith("dask.") and hasattr(x, "compute")


def _canonical(block, fmt: str = "csc", *, copy: bool = True):
    """Convert a 2-D numpy/scipy block to a canonical float64 CSC or CSR matrix.

    Canonical: sorted indices, no duplicates, no stored zeros.  With ``copy=False`` a sparse
    input that is already canonical float64 in ``fmt`` is returned without copying its
    arrays; anything else is converted into a new matrix (the input is never modified).
    """
    cls = sp.csc_matrix if fmt == "csc" else sp.csr_matrix
    if sp.issparse(block):
        if np.iscomplexobj(block):
            raise DatasetError(f"X must be real, got dtype {block.dtype}")
        try:
            M = cls(block, dtype=np.float64, copy=copy)
        except (TypeError, ValueError) as e:
            raise DatasetError(f"X must be numeric, got dtype {block.dtype} ({e})") from None
        if (not copy and _shares_arrays(M, block)
                and (not M.has_canonical_format or (M.nnz and not np.all(M.data)))):
            M = M.copy()  # about to be changed in place: never touch the caller's arrays
    else:
        arr = np.asarray(block)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)
                                       or arr.dtype == bool):
            raise DatasetError(f"X must be numeric, got dtype {arr.dtype}")
        if np.iscomplexobj(arr):
            raise DatasetError(f"X must be real, got dtype {arr.dtype}")
        M = cls(arr.astype(np.float64, copy=False))
    M.sum_duplicates()
    M.eliminate_zeros()
    M.sort_indices()
    return M


def _shares_arrays(M, block) -> bool:
    """Whether sparse ``M`` shares any of its arrays with sparse ``block``."""
    for a in ("data", "indices", "indptr"):
        u, v = getattr(M, a, None), getattr(block, a, None)
        if isinstance(u, np.ndarray) and isinstance(v, np.ndarray) and np.shares_memory(u, v):
            return True
    return False


def _check_finite_X(M, where: str = "") -> None:
    if not np.all(np.isfinite(M.data)):
        raise DatasetError(f"X contains NaN or infinite values{where}")


class _InMemorySource:
    """A numpy/scipy ``X`` as one canonical CSC (``fmt="csc"``) or CSR matrix.

    ``slice_nnz()`` counts the nonzeros of each column (CSC) or row (CSR); ``block(a, b)``
    returns columns (CSC) or rows (CSR) ``a:b``.
    """

    def __init__(self, X, fmt: str = "csc", *, copy: bool = True):
        self.fmt = fmt
        self.M = _canonical(X, fmt, copy=copy)
        self.shape = self.M.shape
        _check_finite_X(self.M)

    def slice_nnz(self) -> np.ndarray:
        return np.diff(self.M.indptr).astype(np.int64)

    def block(self, a: int, b: int):
        return self.M[:, a:b] if self.fmt == "csc" else self.M[a:b]


class _DaskSource:
    """A dask ``X``, computed a dense block at a time (columns for CSC, rows for CSR)."""

    def __init__(self, X, fmt: str = "csc"):
        self.X = X
        self.fmt = fmt
        self.shape = tuple(int(s) for s in X.shape)
        other = self.shape[0] if fmt == "csc" else self.shape[1]
        self._width = max(1, _DENSE_BLOCK_ELEMS // max(1, other))

    def slice_nnz(self) -> np.ndarray:
        import dask.array as da

        axis = 0 if self.fmt == "csc" else 1
        return np.asarray(da.count_nonzero(self.X, axis=axis).compute(), dtype=np.int64)

    def block(self, a0: int, a1: int):
        parts = []
        for a in range(a0, a1, self._width):
            b = min(a1, a + self._width)
            if self.fmt == "csc":
                M = _canonical(self.X[:, a:b].compute(), "csc")
                _check_finite_X(M, f" (columns {a}:{b})")
            else:
                M = _canonical(self.X[a:b].compute(), "csr")
                _check_finite_X(M, f" (rows {a}:{b})")
            parts.append(M)
        if len(parts) == 1:
            return parts[0]
        if self.fmt == "csc":
            return sp.hstack(parts, format="csc")
        return sp.vstack(parts, format="csr")


def _prepare_input(X, y, fmt: str = "csc", *, copy: bool = True):
    """Validate ``X`` and ``y`` for a writer; return ``(source, y)``.

    ``source`` is an `_InMemorySource` or `_DaskSource` holding ``X`` as ``fmt``
    ("csc": sharded by columns, "csr": by rows); ``y`` is float64, finite, of length n.
    """
    if _is_dask(X):
        if X.ndim != 2:
            raise DatasetError(f"X must be 2-D, got {X.ndim}-D with shape {X.shape}")
    elif not sp.issparse(X):
        X = np.asarray(X)
        if X.ndim != 2:
            raise DatasetError(f"X must be 2-D, got {X.ndim}-D with shape {X.shape}")
    elif len(X.shape) != 2:
        raise DatasetError(f"X must be 2-D, got shape {X.shape}")
    n, p = (int(s) for s in X.shape)
    if n < 1 or p < 1:
        raise DatasetError(f"X must be non-empty, got shape {(n, p)}")
    imax = int(np.iinfo(np.int32).max)
    if fmt == "csc" and n > imax:
        raise DatasetError(f"X has {n} rows; row indices are stored as int32 "
                           f"(at most {imax} rows)")
    if fmt == "csr" and p > imax:
        raise DatasetError(f"X has {p} columns; column indices are stored as int32 "
                           f"(at most {imax} columns)")
    try:
        y = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise DatasetError(f"y must be numeric: {e}") from None
    if y.ndim != 1:
        raise DatasetError(f"y must be 1-D, got shape {y.shape}")
    if len(y) != n:
        raise DatasetError(f"len(y) = {len(y)} does not match X.shape[0] = {n}")
    if not np.all(np.isfinite(y)):
        raise DatasetError("y contains NaN or infinite values")
    src = _DaskSource(X, fmt) if _is_dask(X) else _InMemorySource(X, fmt, copy=copy)
    return src, y
