"""Reading LIBSVM / svmlight text files and converting them to dmp datasets."""

from __future__ import annotations

import bz2
import gzip
import os
import sys
import warnings

import numpy as np
import scipy.sparse as sp

from ..utils.text import shown
from .rows import SparseRowDataset, write_sparse_rows
from ._store import DatasetError, sklearn_indices
from .sparse import SparseDataset, write_sparse

__all__ = ["read_svmlight", "convert_svmlight"]


def _open_bytes(path: str):
    """The file's bytes, decompressed as scikit-learn does (by the ``.gz``/``.bz2``
    extension)."""
    ext = os.path.splitext(path)[1]
    if ext == ".gz":
        return gzip.open(path, "rb")
    if ext == ".bz2":
        return bz2.open(path, "rb")
    return open(path, "rb")


def _show(token: bytes) -> str:
    return repr(token.decode("utf-8", "replace")[:40])


def _line_problem(tokens: list, zero_based) -> str | None:
    """What is wrong with one line's tokens (``label [qid:n] index:value ...``), or None.

    The grammar of `sklearn.datasets.load_svmlight_file`, which says what it could not
    parse but not where: this is only run once it has failed, to find the line.
    """
    try:
        float(tokens[0])
    except ValueError:
        return f"the label {_show(tokens[0])} is not a number"
    features = tokens[1:]
    if features and features[0].startswith(b"qid:"):
        features = features[1:]   # scikit-learn skips it unread (query_id=False)
    prev = None
    for t in features:
        idx, sep, value = t.partition(b":")
        if not sep:
            return (f"the feature {_show(t)} is not index:value (the line was cut short, or "
                    f"is not svmlight)")
        try:
            i = int(idx)
        except ValueError:
            return f"the feature index in {_show(t)} is not an integer"
        if not value:
            return f"the feature {_show(t)} has no value (the line was cut short?)"
        try:
            float(value)
        except ValueError:
            return f"the value in {_show(t)} is not a number"
        if i < 0 or (i == 0 and zero_based is False):
            return (f"invalid feature index {i} in {_show(t)}" +
                    (" (indices are one-based; pass zero_based=True for a zero-based file)"
                     if i == 0 else ""))
        if prev is not None and i <= prev:
            return (f"feature indices must be strictly increasing within a line: {i} comes "
                    f"after {prev}")
        prev = i
    return None


def _data_lines(path: str):
    """``(line number, tokens)`` of each line that holds a sample (comments after ``#`` and
    blank lines are skipped, as scikit-learn does)."""
    with _open_bytes(path) as f:
        for lineno, raw in enumerate(f, 1):
            tokens = raw.split(b"#", 1)[0].split()
            if tokens:
                yield lineno, tokens


def _line_of_row(path: str, row: int) -> int:
    """The line number of sample ``row`` (0-based)."""
    for r, (lineno, _) in enumerate(_data_lines(path)):
        if r == row:
            return lineno
    raise AssertionError(f"{path}: no sample {row}")  # pragma: no cover


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first caller outside dmp."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("dmp."):
        frame, level = frame.f_back, level + 1
    return level


def _check_final_newline(path: str, n_samples: int) -> None:
    """Warn when the file does not end with a newline: a file cut at a token boundary
    parses, and its last sample silently loses the features after the cut."""
    if os.path.splitext(path)[1] not in (".gz", ".bz2"):
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
    tail, n_lines = b"", 0
    with _open_bytes(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n_lines += chunk.count(b"\n")
            tail = (tail + chunk)[-(1 << 16):]
    if not tail or tail.endswith(b"\n"):
        return
    last = tail.rsplit(b"\n", 1)[-1].split(b"#", 1)[0].split()
    if not last:
        return   # a comment or blank space: no sample can have been cut
    warnings.warn(f"{path}:{n_lines + 1}: the svmlight file does not end with a newline, so "
                  f"its last line may have been cut short (an interrupted download or copy?) "
                  f"and its sample (row {n_samples - 1}) may be missing features; it was "
                  f"read as it stands. End the file with a newline if it is complete",
                  UserWarning, stacklevel=_user_stacklevel())


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
        int32 ``indices`` and ``indptr`` (int64 beyond 2**31 - 1 values), as
        scikit-learn's estimators take them.
    y : numpy.ndarray of float64, shape (n,)

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    DatasetError
        The file cannot be parsed, holds no samples, has more features than
        ``n_features``, or contains NaN/inf; the message gives ``path:line`` of the first
        offending line.

    Warns
    -----
    UserWarning
        The file does not end with a newline: its last line may have been cut short (a
        file truncated between two tokens still parses), so it is read, and the warning
        gives the line.
    """
    from sklearn.datasets import load_svmlight_file

    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"svmlight file {path!r} does not exist")
    if n_features is not None and (isinstance(n_features, bool)
                                   or not isinstance(n_features, (int, np.integer))
                                   or n_features < 1):
        raise ValueError(f"n_features must be a positive integer, got {shown(n_features)}")
    try:
        # n_features is applied below, where the line holding a larger index can be named
        X, y = load_svmlight_file(path, zero_based=zero_based, dtype=np.float64)
    except (OSError, EOFError) as e:
        raise DatasetError(f"cannot read svmlight file {path!r} ({type(e).__name__}: {e})") \
            from None
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        try:
            found = next(((ln, why) for ln, tokens in _data_lines(path)
                          if (why := _line_problem(tokens, zero_based))), None)
        except (OSError, EOFError):
            found = None
        if found is None:   # a rule of scikit-learn's that the line check does not know
            raise DatasetError(f"cannot parse svmlight file {path!r}: {e}") from None
        raise DatasetError(f"{path}:{found[0]}: cannot parse the svmlight line: {found[1]}") \
            from None
    X = sklearn_indices(sp.csr_matrix(X, dtype=np.float64))
    y = np.asarray(y, dtype=np.float64)
    if X.shape[0] == 0:
        raise DatasetError(f"svmlight file {path!r} contains no samples")
    if n_features is not None:
        n_features = int(n_features)
        if X.shape[1] > n_features:
            row = int(np.searchsorted(X.indptr, np.flatnonzero(X.indices >= n_features)[0],
                                      side="right") - 1)
            raise DatasetError(f"{path}:{_line_of_row(path, row)}: a feature index is beyond "
                               f"n_features={n_features} (the file has {X.shape[1]} features)")
        X.resize((X.shape[0], n_features))
    bad = np.flatnonzero(~np.isfinite(X.data))
    if bad.size:
        row = int(np.searchsorted(X.indptr, bad[0], side="right") - 1)
        raise DatasetError(f"{path}:{_line_of_row(path, row)}: X contains NaN or infinite "
                           f"values")
    bad = np.flatnonzero(~np.isfinite(y))
    if bad.size:
        raise DatasetError(f"{path}:{_line_of_row(path, int(bad[0]))}: the label is NaN or "
                           f"infinite (labels y must be finite)")
    _check_final_newline(path, X.shape[0])
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
                         f"got {shown(layout)}")
    X, y = read_svmlight(src, n_features=n_features)
    write = write_sparse if layout == "columns" else write_sparse_rows
    return write(dest, X, y, n_shards=n_shards, overwrite=overwrite)
