"""Reading LIBSVM / svmlight text files and converting them to dmp datasets."""

from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from .rows import SparseRowDataset, write_sparse_rows
from .sparse import DatasetError, SparseDataset, write_sparse

__all__ = ["read_svmlight", "convert_svmlight"]


def read_svmlight(path, *, n_features=None, zero_based="auto"):
    """Read an svmlight/LIBSVM file.

    Parameters
    ----------
    path : str or os.PathLike
        File to read (``~`` is expanded; ``.gz``/``.bz2`` are decompressed by sklearn).
    n_features : int, optional
        Number of columns; default: inferred from the largest index.
    zero_based : bool or "auto", default "auto"
        Whether column indices are zero-based (see `sklearn.datasets.load_svmlight_file`).

    Returns
    -------
    X : scipy.sparse.csr_matrix of float64, shape (n, p)
    y : numpy.ndarray of float64, shape (n,)

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    DatasetError
        The file cannot be parsed, holds no samples, or contains NaN/inf.
    """
    from sklearn.datasets import load_svmlight_file

    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"svmlight file {path!r} does not exist")
    try:
        X, y = load_svmlight_file(path, n_features=n_features, zero_based=zero_based,
                                  dtype=np.float64)
    except (ValueError, TypeError, UnicodeDecodeError, OSError, EOFError) as e:
        raise DatasetError(f"cannot parse svmlight file {path!r}: {e}") from None
    X = sp.csr_matrix(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.shape[0] == 0:
        raise DatasetError(f"svmlight file {path!r} contains no samples")
    if not np.all(np.isfinite(X.data)):
        raise DatasetError(f"svmlight file {path!r}: X contains NaN or infinite values")
    if not np.all(np.isfinite(y)):
        raise DatasetError(f"svmlight file {path!r}: labels y contain NaN or infinite values")
    return X, y


LAYOUTS = ("columns", "rows")


def convert_svmlight(src, dest, *, n_shards=None, n_features=None, overwrite=False,
                     layout="columns") -> SparseDataset | SparseRowDataset:
    """Convert an svmlight file to a column-block (default) or row-block sparse dataset.

    Parameters
    ----------
    src : str or os.PathLike
        svmlight/LIBSVM file.
    dest : str or os.PathLike
        Dataset path or URL (see `write_sparse`).
    n_shards : int, optional
        Number of column (or row) shards (default: see `write_sparse`).
    n_features : int, optional
        Number of columns (default: inferred).
    overwrite : bool, default False
        Replace an existing dataset at ``dest``.
    layout : {"columns", "rows"}, default "columns"
        "columns": shards of columns (`write_sparse`, for model-parallel algorithms);
        "rows": shards of samples (`dmp.io.write_sparse_rows`, for data-parallel ones).

    Returns
    -------
    SparseDataset or SparseRowDataset
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, "
                         f"got {layout!r}")
    X, y = read_svmlight(src, n_features=n_features)
    write = write_sparse if layout == "columns" else write_sparse_rows
    return write(dest, X, y, n_shards=n_shards, overwrite=overwrite)
