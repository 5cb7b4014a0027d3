"""Dense feature datasets (points x features, float32) stored as Zarr v3 groups, in row
shards -- the input of the hashing estimators (`dmp.hashing`).

Layout of a dataset at ``<path>``::

    <path>/              zarr v3 group, attrs: dmp_format, kind="dense-rows", shape,
                         n_shards, row_bounds, dtype="float32", complete, created_by
      shards/s0000       float32[r1-r0, p]  points row_bounds[0]:row_bounds[1]
      shards/s0001       ...
      queries            float32[q, p]  optional: held-out query points (attr n_queries)

A shard is one array, so a worker reads exactly the rows it owns, and a new shard can
join a dataset (`append_dense_shard`) without rewriting the others.

Converters read the usual feature-file formats one block of rows at a time: ``.fvecs``
/ ``.bvecs`` / ``.ivecs`` (the SIFT/GIST benchmark format: per vector an int32 dimension,
then the values), ``.npy`` (memory-mapped) and CSV (one point per line).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..utils.text import plural, shown
from ._input import _is_dask
from ._store import (FORMAT_VERSION, DatasetError, _atomic_write, _check_dest, _normalize_path,
                     _open_group, attr_int, attr_ints, check_read, open_dataset,
                     partition_shards, store_kind)

__all__ = ["DenseDataset", "InMemoryDenseDataset", "write_dense", "append_dense_shard",
           "read_vecs", "read_features", "convert_features", "split_queries"]

KIND = "dense-rows"
_REQUIRED_ATTRS = ("shape", "n_shards", "row_bounds", "dtype", "complete")
#: rows per shard written by default: about 64 MiB of float32 per shard
TARGET_SHARD_BYTES = 64 << 20


def _check_dense(X, what: str = "X", n_features: int | None = None):
    """A 2-D float32 view/copy of ``X`` with finite values; errors name the problem."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{what} must be 2-D (points x features), got shape {X.shape}")
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{what} is empty (shape {X.shape})")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"{what} must be numeric, got dtype {X.dtype}")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"{what} has {X.shape[1]} features, expected {n_features}")
    X = np.asarray(X, dtype=np.float32)
    if not np.all(np.isfinite(X)):
        bad = np.flatnonzero(~np.isfinite(X).all(axis=1))
        raise ValueError(f"{what} contains NaN or infinite values (or values too large for "
                         f"float32) in {len(bad)} row(s), e.g. rows {bad[:5].tolist()}")
    return X


def _even_bounds(n: int, n_shards: int) -> np.ndarray:
    return np.linspace(0, n, n_shards + 1).round().astype(np.int64)


def _default_shards(n: int, p: int) -> int:
    return int(min(n, max(1, -(-(n * p * 4) // TARGET_SHARD_BYTES))))


def _check_shards(n_shards, n: int) -> int:
    if isinstance(n_shards, bool) or not isinstance(n_shards, (int, np.integer)):
        raise DatasetError(f"n_shards must be an integer, got {shown(n_shards)}")
    if not 1 <= int(n_shards) <= n:
        raise DatasetError(f"n_shards must be in [1, {n}] (the number of points), "
                           f"got {n_shards}")
    return int(n_shards)


def _shard_name(k) -> str:
    return "queries" if k is None else f"shards/s{k:04d}"


def _write_shard(g, k, block: np.ndarray, overwrite: bool = False) -> None:
    """Write shard ``k`` (or the queries, ``k=None``) as one float32 array."""
    from zarr.codecs import BloscCodec

    rows = max(1, min(block.shape[0], max(1, (8 << 20) // (4 * block.shape[1]))))
    z = g.create_array(_shard_name(k), shape=block.shape, dtype="float32",
                       chunks=(rows, block.shape[1]), overwrite=overwrite,
                       compressors=BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"))
    z[:] = block


def write_dense(path, X, *, n_shards=None, queries=None, overwrite=False,
                storage_options=None) -> "DenseDataset":
    """Write points x features as a dense row-sharded dataset (float32).

    Parameters
    ----------
    path : str or os.PathLike
        Destination (local path or fsspec URL).
    X : array-like of shape (n, p)
        Numpy array (a memory map is read one block at a time) or dask array.
    n_shards : int, optional
        Number of row shards (equal point counts), in ``[1, n]``; default about 64 MiB
        per shard.
    queries : array-like of shape (q, p), optional
        Held-out query points stored beside the shards (`DenseDataset.load_queries`).
    overwrite : bool, default False
        Replace an existing dataset (only once the new one is complete; anything there that
        is not a dmp dataset is refused, never replaced).

    Raises
    ------
    ValueError
        ``X`` is not 2-D, empty, not numeric, or holds NaN/inf (rows named).
    FileExistsError
        ``path`` exists and ``overwrite`` is False.
    """
    path = _normalize_path(path)
    _check_dest(path, storage_options, overwrite)
    if not _is_dask(X) and not isinstance(X, np.ndarray):
        X = np.asarray(X)
    if len(X.shape) != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"X must be a non-empty 2-D array (points x features), got shape "
                         f"{tuple(X.shape)}")
    n, p = (int(s) for s in X.shape)
    n_shards = _default_shards(n, p) if n_shards is None else _check_shards(n_shards, n)
    bounds = _even_bounds(n, n_shards)
    if queries is not None:
        queries = _check_dense(queries, "queries", p)
    attrs: dict[str, Any] = {"dmp_format": FORMAT_VERSION, "kind": KIND, "shape": [n, p],
                             "n_shards": n_shards, "row_bounds": bounds.tolist(),
                             "dtype": "float32", "complete": False, "created_by": "dmp",
                             "n_queries": 0 if queries is None else len(queries)}

    def fill(g):
        g.attrs.update(attrs)
        if queries is not None:
            _write_shard(g, None, queries)
        for k in range(n_shards):
            r0, r1 = int(bounds[k]), int(bounds[k + 1])
            block = X[r0:r1]
            if _is_dask(block):
                block = block.compute()
            _write_shard(g, k, _check_dense(block, f"X rows {r0}:{r1}"))
        g.attrs.update({"complete": True})  # last

    _atomic_write(path, storage_options, overwrite, fill)
    return DenseDataset.open(path, storage_options=storage_options)


def append_dense_shard(dataset: "DenseDataset", X) -> "DenseDataset":
    """Add the points ``X`` to a stored dense dataset as one new shard (streaming: data
    arriving after the first fit).  The shard array is written first and the attributes
    updated last, so a reader sees either the old or the new dataset; a shard whose write
    failed is removed (and one left by an earlier failure is replaced).

    Returns the reopened dataset.
    """
    X = _check_dense(X, "X", dataset.n_features)
    g = _open_group(dataset.path, dataset.storage_options, mode="r+")
    k = dataset.n_shards
    try:
        _write_shard(g, k, X, overwrite=True)
    except BaseException:
        try:
            del g[_shard_name(k)]
        except Exception:
            pass
        raise
    bounds = list(dataset.row_bounds.tolist()) + [dataset.n_samples + X.shape[0]]
    g.attrs.update({"shape": [bounds[-1], dataset.n_features], "n_shards": k + 1,
                    "row_bounds": bounds})
    return DenseDataset.open(dataset.path, storage_options=dataset.storage_options)


class _DenseBase:
    """Row partitioning and reading by global row index, shared by the stored and the
    in-memory datasets (subclasses provide ``load_shard``)."""

    def shard_rows(self) -> np.ndarray:
        return np.diff(self.row_bounds)

    def shard_nnz(self) -> np.ndarray:
        """Stored values per shard (rows x features), for memory checks and balancing."""
        return self.shard_rows() * self.n_features

    def row_partition(self, n_parts: int) -> list[list[int]]:
        """Split the shards into ``n_parts`` contiguous groups of about equal point counts."""
        return partition_shards(self.shard_rows(), n_parts)

    def load_row_shards(self, ks) -> np.ndarray:
        """The points of shards ``ks``, stacked in the order given (float32)."""
        ks = [int(k) for k in ks]
        if len(set(ks)) != len(ks) or not ks:
            raise ValueError(f"shard indices must be distinct and non-empty, got {ks}")
        parts = [self.load_shard(k) for k in ks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def load_points(self, rows) -> np.ndarray:
        """The points at global row indices ``rows`` (any order), reading only their
        shards."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.n_samples):
            raise IndexError(f"row indices out of range [0, {self.n_samples})")
        out = np.empty((len(rows), self.n_features), dtype=np.float32)
        shard = np.searchsorted(self.row_bounds, rows, side="right") - 1
        for k in np.unique(shard):
            sel = np.flatnonzero(shard == k)
            out[sel] = self.load_shard(int(k))[rows[sel] - self.row_bounds[k]]
        return out


@store_kind("a dense store (`dmp data convert features`, `dmp.io.write_dense`)")
class DenseDataset(_DenseBase):
    """Handle on a stored dense dataset (metadata only; picklable; workers open it by path).

    Attributes
    ----------
    path, storage_options, shape, n_samples, n_features, n_shards, row_bounds
    """

    KIND = KIND
    REQUIRED_ATTRS = _REQUIRED_ATTRS

    def __init__(self, path: str, attrs: dict, *, storage_options=None):
        self.path = path
        self.storage_options = storage_options
        try:
            shape = attr_ints(attrs["shape"], "shape", low=1)
            if shape.shape != (2,):
                raise DatasetError(f"attribute 'shape' must be [n_samples, n_features], got "
                                   f"{attrs['shape']!r}")
            self.n_shards = attr_int(attrs["n_shards"], "n_shards", low=1)
            bounds = attr_ints(attrs["row_bounds"], "row_bounds")
            if attrs["dtype"] != "float32":
                raise DatasetError(f"attribute 'dtype' must be 'float32', got "
                                   f"{attrs['dtype']!r}")
        except (DatasetError, KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{path!r}: malformed attributes ({e})") from None
        n, p = int(shape[0]), int(shape[1])
        if (n * p >= 2**62 or bounds.shape != (self.n_shards + 1,) or bounds[0] != 0
                or bounds[-1] != n or np.any(np.diff(bounds) < 1)):
            raise DatasetError(f"{path!r}: inconsistent attributes: shape={[n, p]}, "
                               f"n_shards={self.n_shards}, row_bounds={bounds.tolist()}")
        self.shape = (n, p)
        self.n_samples, self.n_features = n, p
        self.row_bounds = bounds
        self.nnz = n * p
        try:
            self.n_queries = attr_int(attrs.get("n_queries", 0), "n_queries")
        except (DatasetError, TypeError, ValueError) as e:
            raise DatasetError(f"{path!r}: malformed attributes ({e})") from None

    @classmethod
    def open(cls, path, *, storage_options=None) -> "DenseDataset":
        ds = open_dataset(path, storage_options=storage_options)
        if not isinstance(ds, cls):
            raise DatasetError(f"{path!r} is a {type(ds).__name__}, not a dense dataset")
        return ds

    def __repr__(self) -> str:
        return f"DenseDataset({self.path!r}, shape={self.shape}, n_shards={self.n_shards})"

    def load_shard(self, k: int) -> np.ndarray:
        """Shard ``k``'s points, checked (shape, dtype, finite values)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) \
                or not 0 <= k < self.n_shards:
            raise IndexError(f"shard {shown(k)} out of range: dataset has "
                             f"{plural(self.n_shards, 'shard')}")
        rows = int(self.row_bounds[k + 1] - self.row_bounds[k])
        what = f"{self.path}: shard {k}"
        try:
            g = _open_group(self.path, self.storage_options)
        except FileNotFoundError:
            raise FileNotFoundError(f"no dmp dataset at {self.path!r} (it was removed after "
                                    f"opening)") from None
        try:
            z = g[_shard_name(k)]
        except KeyError:
            raise DatasetError(f"{what}: array '{_shard_name(k)}' is missing") from None
        except Exception as e:
            raise DatasetError(f"{what}: corrupt metadata ({type(e).__name__}: {e})") from None
        if getattr(z, "shape", None) != (rows, self.n_features) or z.dtype != np.float32:
            raise DatasetError(f"{what}: expected float32 of shape {(rows, self.n_features)}, "
                               f"found {getattr(z, 'dtype', '?')} {getattr(z, 'shape', '?')}")
        check_read(z, rows * self.n_features, what)
        try:
            X = np.asarray(z[:])
        except Exception as e:
            raise DatasetError(f"{what}: cannot read ({type(e).__name__}: {e})") from None
        if not np.all(np.isfinite(X)):
            raise DatasetError(f"{what}: contains NaN or infinite values")
        return X

    def load_queries(self):
        """The held-out query points stored with the dataset (float32), or None."""
        if not self.n_queries:
            return None
        want = (self.n_queries, self.n_features)
        g = _open_group(self.path, self.storage_options)
        try:
            z = g["queries"]
            ok = getattr(z, "shape", None) == want and z.dtype == np.float32
        except Exception as e:
            raise DatasetError(f"{self.path}: cannot open 'queries' ({type(e).__name__}: "
                               f"{e})") from None
        if not ok:
            raise DatasetError(f"{self.path}: 'queries' must be float32 of shape {want}")
        check_read(z, want[0] * want[1], f"{self.path}: queries")
        try:
            Q = np.asarray(z[:])
        except Exception as e:
            raise DatasetError(f"{self.path}: cannot read 'queries' ({type(e).__name__}: "
                               f"{e})") from None
        if not np.all(np.isfinite(Q)):
            raise DatasetError(f"{self.path}: 'queries' contains NaN or infinite values")
        return Q

    def validate(self) -> "DenseDataset":
        """Read every shard and the held-out queries; raise `DatasetError` on the first
        that is missing, of another dtype or shape, or not finite."""
        for k in range(self.n_shards):
            self.load_shard(k)
        self.load_queries()
        return self


class InMemoryDenseDataset(_DenseBase):
    """Points held in memory, split into ``n_shards`` equal row shards (same interface as
    `DenseDataset`; for the in-process backend)."""

    path = None

    def __init__(self, X, n_shards: int = 1, *, row_bounds=None):
        X = _check_dense(X)
        self._X = X
        self.shape = X.shape
        self.n_samples, self.n_features = X.shape
        self.nnz = X.size
        if row_bounds is None:
            self.n_shards = _check_shards(n_shards, X.shape[0])
            self.row_bounds = _even_bounds(X.shape[0], self.n_shards)
        else:
            bounds = np.asarray(row_bounds, dtype=np.int64)
            if (bounds.ndim != 1 or len(bounds) < 2 or bounds[0] != 0
                    or bounds[-1] != X.shape[0] or np.any(np.diff(bounds) < 1)):
                raise ValueError(f"row_bounds must rise from 0 to {X.shape[0]} in steps "
                                 f">= 1, got {bounds.tolist()}")
            self.row_bounds, self.n_shards = bounds, len(bounds) - 1

    def load_shard(self, k: int) -> np.ndarray:
        """Shard ``k``'s points (a view)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) \
                or not 0 <= k < self.n_shards:
            raise IndexError(f"shard {shown(k)} out of range: dataset has "
                             f"{plural(self.n_shards, 'shard')}")
        return self._X[self.row_bounds[k]:self.row_bounds[k + 1]]


# --------------------------------------------------------------------------- converters


def read_vecs(path, *, mmap: bool = True) -> np.ndarray:
    """A ``.fvecs`` (float32), ``.bvecs`` (uint8) or ``.ivecs`` (int32) file as an
    (n, d) array, memory-mapped (no copy).  Every record is an int32 dimension ``d``
    followed by ``d`` values; all records must have the same ``d``."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    dtypes = {".fvecs": np.float32, ".bvecs": np.uint8, ".ivecs": np.int32}
    if ext not in dtypes:
        raise ValueError(f"{path!r}: unknown vecs format {ext!r} (.fvecs, .bvecs, .ivecs)")
    dtype = np.dtype(dtypes[ext])
    size = os.path.getsize(path)
    if size < 4:
        raise ValueError(f"{path!r}: empty or truncated file ({plural(size, 'byte')})")
    d = int(np.fromfile(path, dtype="<i4", count=1)[0])
    if d < 1 or d > 1 << 24:
        raise ValueError(f"{path!r}: first record has dimension {d}; not a {ext} file")
    rec = 4 + d * dtype.itemsize
    if size % rec:
        raise ValueError(f"{path!r}: size {size} is not a multiple of the record size {rec} "
                         f"(dimension {d}): truncated or not a {ext} file")
    n = size // rec
    raw = np.memmap(path, dtype=np.uint8, mode="r", shape=(n, rec)) if mmap else \
        np.fromfile(path, dtype=np.uint8).reshape(n, rec)
    dims = raw[:, :4].copy().view("<i4").ravel()
    if np.any(dims != d):
        bad = int(np.flatnonzero(dims != d)[0])
        raise ValueError(f"{path!r}: record {bad} has dimension {int(dims[bad])}, the first "
                         f"has {d}")
    return raw[:, 4:].view(dtype.newbyteorder("<"))


def read_features(path, *, format: str = "auto") -> np.ndarray:
    """A feature file as an (n, d) array: ``fvecs``/``bvecs``/``ivecs``, ``npy``
    (memory-mapped) or ``csv`` (comma- or whitespace-separated, one point per line, lines
    starting with ``#`` skipped)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no feature file at {path!r}")
    if format == "auto":
        ext = os.path.splitext(path)[1].lower().lstrip(".")
        format = {"txt": "csv", "tsv": "csv"}.get(ext, ext)
    if format in ("fvecs", "bvecs", "ivecs"):
        if not path.lower().endswith("." + format):
            raise ValueError(f"{path!r}: format {format!r} needs the .{format} extension")
        return read_vecs(path)
    if format == "npy":
        try:
            X = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise ValueError(f"{path!r}: not a numeric .npy file ({e})") from None
    elif format == "csv":
        with open(path) as f:
            first = next((ln for ln in f if ln.strip() and not ln.startswith("#")), "")
        delim = "," if "," in first else None
        try:
            X = np.loadtxt(path, delimiter=delim, dtype=np.float64, ndmin=2, comments="#")
        except ValueError as e:
            raise ValueError(f"{path!r}: cannot parse as CSV of numbers ({e})") from None
    else:
        raise ValueError(f"unknown feature format {format!r}; use fvecs, bvecs, ivecs, npy "
                         f"or csv")
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{path!r}: expected a non-empty 2-D array, got shape {X.shape}")
    return X


def split_queries(X, n_queries: int, seed: int = 0):
    """``(base, queries)``: ``n_queries`` points drawn at random (seeded) as held-out
    queries, the others, in their order, as the base."""
    n = X.shape[0]
    if isinstance(n_queries, bool) or not isinstance(n_queries, (int, np.integer)) \
            or not 0 <= n_queries < n:
        raise ValueError(f"n_queries must be an integer in [0, {n - 1}], got {shown(n_queries)}")
    if n_queries == 0:
        return X, None
    pick = np.zeros(n, dtype=bool)
    pick[np.random.default_rng([seed, 9]).choice(n, int(n_queries), replace=False)] = True
    return X[~pick], X[pick]


def convert_features(source, dest, *, format: str = "auto", n_shards=None,
                     max_points=None, n_queries: int = 0, queries_source=None, seed: int = 0,
                     overwrite=False, storage_options=None) -> "DenseDataset":
    """Convert a feature file (see `read_features`; ``source="digits"`` takes
    scikit-learn's bundled handwritten digits) to a dense Zarr dataset.

    ``max_points`` keeps the first points only (e.g. a SIFT learn subset).  Held-out
    queries come from ``queries_source`` (a file, e.g. SIFT's ``*_query.fvecs``) or are
    ``n_queries`` points drawn from the source (`split_queries`).
    """
    if str(source) == "digits":
        from sklearn.datasets import load_digits

        X = load_digits().data
    else:
        X = read_features(source, format=format)
    if max_points is not None:
        X = X[:int(max_points)]
    if queries_source is not None:
        if n_queries:
            raise ValueError("give n_queries or queries_source, not both")
        Q = read_features(queries_source)
    else:
        X, Q = split_queries(np.asarray(X), n_queries, seed)
    return write_dense(dest, X, n_shards=n_shards, queries=Q, overwrite=overwrite,
                       storage_options=storage_options)
