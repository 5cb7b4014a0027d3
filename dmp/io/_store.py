"""What every dmp store shares: the format version, `DatasetError`, paths, shard bounds,
atomic writes, the checks a store's metadata and arrays pass when read, the base of the
sharded datasets, and the kinds of store that `open_dataset` opens.

Each format (`dmp.io.sparse`, `dmp.io.rows`, `dmp.io.dense`, `dmp.io.ratings`) builds on this
module and registers its dataset class here (`store_kind`); no format imports another.
"""

from __future__ import annotations

import math
import os
import shutil
import uuid

import numpy as np

from .. import config
from ..exceptions import DMPError
from ..utils.paths import is_remote as _is_remote
from ..utils.text import plural, shown

FORMAT_VERSION = 1
MAX_CHUNK = 4 * 1024 * 1024


class DatasetError(DMPError, ValueError):
    """A dataset (or the data passed to build one) is invalid or corrupted.

    A `dmp.exceptions.DMPError` and a `ValueError` (what a caller catches without knowing
    dmp's named errors).  A store's metadata is checked when it is opened and again where each
    shard loads (on the worker), before anything it declares is allocated."""


class _ShardIndexError(DatasetError, IndexError):
    """Shard index out of range (both a `DatasetError` and an `IndexError`)."""


# --------------------------------------------------------------------------- paths


def _normalize_path(path) -> str:
    """Return ``path`` as a string: ``~`` expanded, ``file://`` stripped for local paths."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    if path.startswith("file://"):
        path = path[len("file://"):]
    if _is_remote(path):
        return path.rstrip("/")
    return os.path.expanduser(path).rstrip(os.sep) or os.sep


def _fs(path: str, storage_options):
    import fsspec.core

    fs, fpath = fsspec.core.url_to_fs(path, **(storage_options or {}))
    return fs, fpath


def _exists(path: str, storage_options) -> bool:
    if _is_remote(path):
        fs, fpath = _fs(path, storage_options)
        return fs.exists(fpath)
    return os.path.exists(path)


def _open_group(path: str, storage_options, mode: str = "r"):
    # dmp never consolidates its stores' metadata: a consolidated copy in the root zarr.json
    # (stale, or hostile) is ignored, every array is read with its own metadata
    import zarr   # here: an in-memory fit never imports zarr (BENCHMARKS.md, "Small problems")

    kw = {"use_consolidated": False} if mode == "r" else {}
    if _is_remote(path) and storage_options:
        return zarr.open_group(path, mode=mode, storage_options=storage_options, zarr_format=3,
                               **kw)
    return zarr.open_group(path, mode=mode, zarr_format=3, **kw)


# --------------------------------------------------------------------------- shards


def _balanced_bounds(weights: np.ndarray, n_parts: int) -> np.ndarray:
    """Split ``len(weights)`` items into ``n_parts`` contiguous non-empty ranges.

    Returns bounds ``[0, b1, ..., len(weights)]`` whose ranges have roughly equal total
    weight.  Requires ``1 <= n_parts <= len(weights)``.
    """
    weights = np.asarray(weights, dtype=np.float64)
    m = len(weights)
    if not 1 <= n_parts <= m:
        raise ValueError(f"cannot split {plural(m, 'item')} into {n_parts} non-empty parts")
    if n_parts == 1:
        return np.array([0, m], dtype=np.int64)
    cum = np.concatenate([[0.0], np.cumsum(weights)])
    total = cum[-1]
    if total <= 0:
        cum = np.arange(m + 1, dtype=np.float64)
        total = float(m)
    targets = total * np.arange(1, n_parts) / n_parts
    idx = np.searchsorted(cum, targets, side="left")
    idx = np.clip(idx, 1, m)
    prev = idx - 1
    closer_prev = np.abs(cum[prev] - targets) <= np.abs(cum[idx] - targets)
    b = np.where(closer_prev & (prev >= 1), prev, idx).astype(np.int64)
    bounds = np.concatenate([[0], b, [m]]).astype(np.int64)
    for k in range(1, n_parts):  # forward: strictly increasing
        bounds[k] = max(bounds[k], bounds[k - 1] + 1)
    for k in range(n_parts - 1, 0, -1):  # backward: leave room for the later parts
        bounds[k] = min(bounds[k], bounds[k + 1] - 1)
    return bounds


def partition_shards(shard_nnz, n_parts) -> list[list[int]]:
    """Split shards into ``n_parts`` contiguous groups of roughly equal nnz."""
    n_shards = len(shard_nnz)
    if isinstance(n_parts, bool) or not isinstance(n_parts, (int, np.integer)) or n_parts < 1:
        raise ValueError(f"n_parts must be a positive integer, got {shown(n_parts)}")
    if n_parts > n_shards:
        raise ValueError(f"cannot split into {n_parts} parts: the dataset has only "
                         f"{plural(n_shards, 'shard')}; rewrite it with n_shards >= {n_parts}")
    b = _balanced_bounds(shard_nnz, int(n_parts))
    return [list(range(int(b[i]), int(b[i + 1]))) for i in range(n_parts)]


def _check_n_shards(n_shards, m: int, what: str = "columns") -> int:
    if isinstance(n_shards, bool) or not isinstance(n_shards, (int, np.integer)):
        raise DatasetError(f"n_shards must be an integer, got {shown(n_shards)}")
    n_shards = int(n_shards)
    if not 1 <= n_shards <= m:
        raise DatasetError(f"n_shards must be in [1, {m}] (the number of {what}), "
                           f"got {n_shards}")
    return n_shards


def _default_n_shards(total_nnz: int, m: int) -> int:
    """About ``dmp.store.shard-values`` stored values per shard, at most ``m`` shards."""
    return min(m, max(1, -(-int(total_nnz) // config.count("dmp.store.shard-values"))))


# --------------------------------------------------------------------------- kinds of store

#: what each kind of store is, and the command that writes one (each format adds its own
#: with `store_kind`)
STORE_KINDS: dict[str, str] = {}
#: the dataset class that opens each kind of store
_STORE_CLASSES: dict[str, type] = {}


def store_kind(description: str):
    """Class decorator of a format's dataset class: `open_dataset` opens the stores whose
    ``kind`` attribute is the class's ``KIND`` as that class, and `require_store_kind` calls
    them ``description`` (what they are, and the command that writes one)."""
    def register(cls):
        STORE_KINDS[cls.KIND] = description
        _STORE_CLASSES[cls.KIND] = cls
        return cls

    return register


def require_store_kind(X, kinds: tuple, estimator: str) -> None:
    """Refuse a dmp store of a kind ``estimator`` cannot fit (anything else passes)."""
    kind = getattr(type(X), "KIND", None)
    if not kind or kind in kinds:
        return
    raise DatasetError(f"{estimator} needs {' or '.join(STORE_KINDS[k] for k in kinds)}; "
                       f"{getattr(X, 'path', 'the dataset')!r} is {STORE_KINDS.get(kind, kind)}")


def open_dataset(path, *, storage_options=None):
    """Open a dataset written by `dmp.io.write_sparse`, `dmp.io.write_sparse_rows`,
    `dmp.io.write_dense` or `dmp.io.write_ratings`, reading metadata only.

    Parameters
    ----------
    path : str or os.PathLike
        Local path or fsspec URL.
    storage_options : dict, optional
        fsspec options for remote URLs.

    Returns
    -------
    dmp.io.SparseDataset, dmp.io.SparseRowDataset, dmp.io.DenseDataset or dmp.io.RatingsDataset
        According to the dataset's ``kind`` attribute ("sparse-columns", "sparse-rows",
        "dense-rows" or "ratings"; `STORE_KINDS`).

    Raises
    ------
    FileNotFoundError
        Nothing exists at ``path``.
    DatasetError
        ``path`` is not a complete dmp sparse dataset, or has an unknown ``kind``.
    """
    path = _normalize_path(path)
    if not _exists(path, storage_options):
        raise FileNotFoundError(f"no dmp dataset at {path!r}: path does not exist")
    try:
        g = _open_group(path, storage_options)
    except Exception as e:
        raise DatasetError(f"{path!r} is not a dmp dataset: not a zarr v3 group "
                           f"({type(e).__name__}: {e})") from None
    attrs = dict(g.attrs)
    fmt = attrs.get("dmp_format")
    if fmt is None:
        raise DatasetError(f"{path!r} is not a dmp dataset: attribute 'dmp_format' is "
                           f"missing{_what_else(attrs)}")
    if fmt != FORMAT_VERSION:
        raise DatasetError(f"{path!r}: unsupported dmp_format {fmt!r} "
                           f"(this version reads {FORMAT_VERSION})")
    kind = attrs.get("kind")
    if not isinstance(kind, str) or kind not in _STORE_CLASSES:
        raise DatasetError(f"{path!r}: unknown dataset kind {kind!r}; this version reads "
                           f"{', '.join(repr(k) for k in sorted(_STORE_CLASSES))}")
    cls = _STORE_CLASSES[kind]
    missing = [a for a in cls.REQUIRED_ATTRS if a not in attrs]
    if missing:
        raise DatasetError(f"{path!r}: attributes missing: {', '.join(missing)}")
    if attrs["complete"] is not True:
        raise DatasetError(f"{path!r}: dataset is incomplete (an interrupted write?); "
                           "rewrite it")
    return cls(path, attrs, storage_options=storage_options)


def _what_else(attrs: dict) -> str:
    """What a Zarr group without ``dmp_format`` is, when dmp wrote it: ``""`` or a clause."""
    if "user_starts" in attrs and "item_starts" in attrs:
        return ("; it holds the factors of a MatrixFactorization fit (factors_store=), "
                "arrays W/<k> and H/<k>: read them with zarr or dask.array.from_zarr")
    if "estimator" in attrs:
        return ("; it is a model written by `dmp run` (coef.zarr, hash.zarr, factors.zarr): "
                "read its arrays with zarr")
    return ""


# --------------------------------------------------------------------------- writing


def _write_array(group, name: str, values: np.ndarray, dtype: str) -> None:
    """Create the 1-D array ``name`` in ``group`` and fill it with ``values``."""
    from zarr.codecs import BloscCodec, ZstdCodec

    values = np.ascontiguousarray(values, dtype=dtype)
    n = int(values.shape[0])
    if np.dtype(dtype).kind == "f":
        comp = BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")
    else:
        comp = ZstdCodec(level=3)
    z = group.create_array(name, shape=(n,), dtype=dtype, chunks=(max(1, min(n, MAX_CHUNK)),),
                           compressors=comp)
    if n:
        z[:] = values


def _group_has_attrs(path, storage_options, *names) -> bool:
    """Whether ``path`` holds a Zarr group with all the attributes ``names`` (how dmp tells
    its own stores from anything else before replacing or deleting them)."""
    try:
        attrs = _open_group(os.fspath(path), storage_options, mode="r").attrs
        return all(name in attrs for name in names)
    except Exception:
        return False


def _is_dmp_dataset(path: str, storage_options) -> bool:
    """Whether ``path`` holds a dmp dataset (a Zarr group whose attributes say so)."""
    return _group_has_attrs(path, storage_options, "dmp_format")


def _check_dest(path: str, storage_options, overwrite: bool) -> None:
    """A dataset may be written at ``path``: nothing is there, or (with ``overwrite``) a
    dmp dataset is -- never a file or folder of something else."""
    if not _exists(path, storage_options):
        return
    if not overwrite:
        raise FileExistsError(f"{path!r} already exists; pass overwrite=True (on the command "
                              f"line --overwrite) to replace it")
    if not _is_dmp_dataset(path, storage_options):
        raise FileExistsError(f"{path!r} exists and is not a dmp dataset; refusing to replace "
                              f"it (overwrite replaces only a dataset)")


def _atomic_write(path: str, storage_options, overwrite: bool, fill) -> None:
    """Create a zarr group, let ``fill(group)`` write it, and move it onto ``path``.

    Local paths are written to ``<path>.tmp-<uuid>`` and renamed when ``fill`` returns, so
    ``path`` never holds a partial dataset (an existing one is replaced only then).  Remote
    URLs are written in place.  On any error the partial output is removed; one left by a
    killed process is removed by the next write of ``path`` (`clean_stale_partials`).
    """
    from ..utils.scratch import clean_stale_partials, mark_partial, unmark_partial

    remote = _is_remote(path)
    if not remote:
        clean_stale_partials(path)   # left by conversions of this path that were killed
    target = path if remote else f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        g = _open_group(target, storage_options, mode="w")
        if not remote:
            mark_partial(target)
        fill(g)
        if not remote:
            unmark_partial(target)
            _replace_dir(target, path, overwrite)
    except BaseException as exc:
        _cleanup(target, storage_options)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # Zarr's write errors name no file: name the dataset being written
            raise OSError(exc.errno, exc.strerror or str(exc), path) from exc
        raise


def _replace_dir(tmp: str, path: str, overwrite: bool) -> None:
    """Move the finished ``tmp`` onto ``path``; remove the old ``path`` afterwards."""
    if not os.path.exists(path):
        os.replace(tmp, path)
        return
    _check_dest(path, None, overwrite)
    old = f"{path}.tmp-{uuid.uuid4().hex}-old"
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)
        raise
    if os.path.isdir(old):
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.remove(old)


def _cleanup(target: str, storage_options) -> None:
    try:
        if _is_remote(target):
            fs, fpath = _fs(target, storage_options)
            if fs.exists(fpath):
                fs.rm(fpath, recursive=True)
        elif os.path.exists(target):
            shutil.rmtree(target, ignore_errors=True)
    except Exception:  # best effort; never hide the original error
        pass


# --------------------------------------------------------------------------- reading


def check_compressed(indptr, indices, data, m, what, major, detail="",
                     bad_indptr="'indptr' is not non-decreasing"):
    """Validate compressed (CSR or CSC) arrays in one pass (`csc_check`) and raise
    `DatasetError` naming the problem; ``what`` says where, ``major`` is "row" or "column"."""
    from ..kernels.sparse import csc_check

    code = csc_check(indptr, indices, data, m)
    if code == 1:
        raise DatasetError(f"{what}: {bad_indptr}")
    if code == 2:
        raise DatasetError(f"{what}: 'indices' has values outside [0, {m})")
    if code == 3:
        raise DatasetError(f"{what}: 'indices' are not strictly increasing within a "
                           f"{major}{detail}")
    if code == 4:
        raise DatasetError(f"{what}: 'data' contains NaN or infinite values")


def attr_int(value, name: str, *, low: int = 0) -> int:
    """An integer attribute read from a store: a JSON integer (not a bool, not a float that
    happens to be integral) of at least ``low``, else `DatasetError`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise DatasetError(f"attribute {name!r} must be an integer >= {low}, got {shown(value)}")
    return int(value)


def attr_ints(value, name: str, *, low: int = 0) -> np.ndarray:
    """A list-of-integers attribute (see `attr_int`) as int64."""
    if not isinstance(value, (list, tuple)):
        raise DatasetError(f"attribute {name!r} must be a list of integers, got {shown(value)}")
    out = [attr_int(v, name, low=low) for v in value]
    if any(v >= 2**63 for v in out):
        raise DatasetError(f"attribute {name!r} holds values beyond int64: {value!r}")
    return np.asarray(out, dtype=np.int64).reshape(len(out))


#: arrays smaller than this are read without asking how much memory is free
_MEMORY_CHECK_BYTES = 64 * 2**20


def check_allocation(nbytes: int, what: str) -> None:
    """Raise `DatasetError` before allocating ``nbytes`` for data a store *declares*, when that
    is more than this machine's available memory (a corrupt or hostile size, not data)."""
    if nbytes < _MEMORY_CHECK_BYTES:
        return
    import psutil

    avail = psutil.virtual_memory().available
    if nbytes > avail:
        raise DatasetError(f"{what} declares {nbytes / 2**30:,.1f} GiB, more than the "
                           f"{avail / 2**30:,.1f} GiB of memory available here; the store's "
                           f"metadata is corrupt, or the data needs a bigger machine")


def check_read(z, n_elems: int, what: str) -> None:
    """Raise `DatasetError` before reading ``n_elems`` values of the Zarr array ``z`` when its
    metadata declares an impossible chunk shape, or more memory than is available.

    Zarr decodes whole chunks, so a read costs the selection plus a chunk: a chunk larger
    than both the array and `_MEMORY_CHECK_BYTES` is never written by dmp (its chunks never
    exceed the array) and is refused as corrupt metadata before anything is allocated."""
    itemsize = int(getattr(z.dtype, "itemsize", 0) or 16)   # variable-width strings: 16
    try:
        chunk = [int(c) for c in z.chunks]
    except Exception as e:   # a chunk grid zarr cannot describe
        raise DatasetError(f"{what}: unreadable chunk shape ({type(e).__name__}: {e})") \
            from None
    chunk_elems = math.prod(max(c, 1) for c in chunk)
    array_elems = math.prod(max(int(d), 0) for d in z.shape)
    if chunk_elems * itemsize > _MEMORY_CHECK_BYTES and chunk_elems > array_elems:
        raise DatasetError(f"{what}: chunk shape {tuple(chunk)} is larger than the array "
                           f"(shape {tuple(z.shape)}); the store's metadata is corrupt")
    check_allocation((n_elems + (chunk_elems if n_elems else 0)) * itemsize, what)


_INDEX32_MAX = int(np.iinfo(np.int32).max)


def sklearn_indices(M):
    """Give compressed ``M`` (CSR/CSC) one index dtype, in place, and return it.

    int32 ``indices`` and ``indptr`` wherever its stored values and shape fit, int64 for
    both beyond: scikit-learn's compiled estimators (Lasso, SGDClassifier, TruncatedSVD,
    ...) accept no other combination, so every shard dmp hands out can go to them as it is.
    """
    big = M.indptr[-1] > _INDEX32_MAX or max(M.shape, default=0) > _INDEX32_MAX
    dtype = np.int64 if big else np.int32
    M.indices = M.indices.astype(dtype, copy=False)
    M.indptr = M.indptr.astype(dtype, copy=False)
    return M


class _StoredDataset:
    """What column- and row-sharded stored datasets share: attributes, ``y``, reading and
    checking one shard's compressed arrays.

    Subclasses set `KIND`, `BOUNDS` (the attribute naming the shard boundaries, which also
    becomes an instance attribute), `AXIS` (the sharded axis of X: 0 rows, 1 columns).
    """

    KIND = ""
    BOUNDS = ""
    AXIS = 1
    REQUIRED_ATTRS: tuple = ()

    def __init__(self, path: str, attrs: dict, *, storage_options=None):
        self.path = path
        self.storage_options = storage_options
        try:
            shape = attr_ints(attrs["shape"], "shape", low=1)
            if shape.shape != (2,):
                raise DatasetError(f"attribute 'shape' must be [n_samples, n_features], "
                                   f"got {attrs['shape']!r}")
            n, p = int(shape[0]), int(shape[1])
            self.shape = (n, p)
            self.n_samples, self.n_features = n, p
            self.nnz = attr_int(attrs["nnz"], "nnz")
            self.n_shards = attr_int(attrs["n_shards"], "n_shards", low=1)
            bounds = attr_ints(attrs[self.BOUNDS], self.BOUNDS)
            self.dtype = np.dtype(attrs["dtype"])
            if self.dtype != np.float64:
                raise DatasetError(f"attribute 'dtype' must be float64, got {attrs['dtype']!r}")
            sn = attrs.get("shard_nnz")
            self._shard_nnz = None if sn is None else attr_ints(sn, "shard_nnz")
            vocab = attrs.get("vocabulary", False)
            if not isinstance(vocab, bool):
                raise DatasetError(f"attribute 'vocabulary' must be true or false, "
                                   f"got {shown(vocab)}")
            self._attrs_vocabulary = vocab
            names = attrs.get("names", False)
            if not isinstance(names, bool):
                raise DatasetError(f"attribute 'names' must be true or false, got {shown(names)}")
            self._attrs_names = names
            sums = attrs.get("column_sums", False)
            if not isinstance(sums, bool):
                raise DatasetError(f"attribute 'column_sums' must be true or false, "
                                   f"got {shown(sums)}")
            self._attrs_column_sums = sums
        except (DatasetError, KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{path!r}: malformed attributes ({e})") from None
        extent = self.shape[self.AXIS]
        if (n * p >= 2**62 or self.nnz > n * p or bounds.shape != (self.n_shards + 1,)
                or bounds[0] != 0 or bounds[-1] != extent or np.any(np.diff(bounds) < 1)):
            raise DatasetError(f"{path!r}: inconsistent attributes: shape={self.shape}, "
                               f"nnz={self.nnz}, n_shards={self.n_shards}, "
                               f"{self.BOUNDS}={bounds.tolist()}")
        if self._shard_nnz is not None and (self._shard_nnz.shape != (self.n_shards,)
                                            or int(self._shard_nnz.sum()) != self.nnz):
            raise DatasetError(f"{path!r}: attribute 'shard_nnz' does not match "
                               f"n_shards={self.n_shards} and nnz={self.nnz}")
        setattr(self, self.BOUNDS, bounds)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.path!r}, shape={self.shape}, nnz={self.nnz}, "
                f"n_shards={self.n_shards})")

    @property
    def _bounds(self) -> np.ndarray:
        return getattr(self, self.BOUNDS)

    # -- helpers
    def _group(self):
        try:
            return _open_group(self.path, self.storage_options)
        except FileNotFoundError:
            raise FileNotFoundError(f"no dmp dataset at {self.path!r} "
                                    "(it was removed after opening)") from None

    def _read(self, g, name: str, what: str, dtype: str, length: int | None = None,
              sel: slice = slice(None)):
        """Read ``g[name][sel]`` after checking that the array exists and has the expected
        dtype, 1-D shape and (when given) length; every failure is a `DatasetError`."""
        short = name.rsplit("/", 1)[-1]
        try:
            z = g[name]
        except KeyError:
            raise DatasetError(f"{what}: array {short!r} is missing "
                               f"({self.path}/{name})") from None
        except Exception as e:   # zarr rejects its metadata: TypeError, ValueError, ...
            raise DatasetError(f"{what}: array {short!r} has corrupt metadata "
                               f"({type(e).__name__}: {e})") from None
        import zarr

        if not isinstance(z, zarr.Array):
            raise DatasetError(f"{what}: {short!r} is a group, expected an array")
        if z.ndim != 1:
            raise DatasetError(f"{what}: {short!r} must be 1-D, has shape {z.shape}")
        if z.dtype != np.dtype(dtype):
            raise DatasetError(f"{what}: {short!r} has dtype {z.dtype}, expected {dtype}")
        if length is not None and z.shape[0] != length:
            raise DatasetError(f"{what}: {short!r} has length {z.shape[0]}, expected {length}")
        n_sel = len(range(*sel.indices(z.shape[0])))
        check_read(z, n_sel, f"{what}: {short!r}")
        try:
            return np.asarray(z[sel]) if n_sel else np.zeros(0, dtype=dtype)
        except Exception as e:
            raise DatasetError(f"{what}: cannot read {short!r} ({type(e).__name__}: {e})") \
                from None

    def _read_y(self, g, sel: slice = slice(None)) -> np.ndarray:
        y = self._read(g, "y", "dataset", "float64", self.n_samples, sel)
        if not np.all(np.isfinite(y)):
            raise DatasetError("dataset: 'y' contains NaN or infinite values")
        return y

    def _check_k(self, k) -> int:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"shard index must be an integer, got {shown(k)}")
        if not 0 <= k < self.n_shards:
            raise _ShardIndexError(f"shard {k} out of range: dataset has "
                                   f"{plural(self.n_shards, 'shard')}")
        return int(k)

    def _load_arrays(self, g, k: int):
        """Read and check shard ``k``'s compressed arrays (CSC of its columns, or CSR of its
        rows); return ``(indptr, indices, data, width)``, width = the shard's columns/rows."""
        k = self._check_k(k)
        b0, b1 = int(self._bounds[k]), int(self._bounds[k + 1])
        major, minor = ("column", "row") if self.AXIS == 1 else ("row", "column")
        what = f"shard {k}"
        base = f"shards/s{k:04d}"
        m = self.shape[1 - self.AXIS]  # range of the stored indices
        indptr = self._read(g, f"{base}/indptr", what, "int64", b1 - b0 + 1)
        if indptr[0] != 0:
            raise DatasetError(f"{what}: 'indptr' starts at {indptr[0]}, expected 0")
        nnz = int(indptr[-1])
        # checked before 'indices' and 'data' are read: their declared lengths must agree
        if self._shard_nnz is not None and nnz != self._shard_nnz[k]:
            raise DatasetError(f"{what}: 'indptr' gives {nnz} nonzeros, attribute "
                               f"'shard_nnz' says {int(self._shard_nnz[k])}")
        if not 0 <= nnz <= min(self.nnz, (b1 - b0) * m):
            raise DatasetError(f"{what}: 'indptr' ends at {nnz}, outside [0, "
                               f"{min(self.nnz, (b1 - b0) * m)}]")
        indices = self._read(g, f"{base}/indices", what, "int32", nnz)
        data = self._read(g, f"{base}/data", what, "float64", nnz)
        if nnz and not np.all(data):
            # the writers drop explicit zeros, and Zarr reads a missing chunk file as its
            # fill value: a zero here is lost data, not a value
            first = int(np.flatnonzero(data == 0)[0])
            raise DatasetError(f"{what}: 'data' holds zeros (first at position {first}), "
                               f"which a dmp store never stores: a chunk file of "
                               f"'{base}/data' is missing or was zeroed")
        check_compressed(indptr, indices, data, m, what, major,
                         f" (unsorted or duplicate {minor} indices)",
                         "'indptr' is not non-decreasing")
        return indptr, indices, data, b1 - b0

    # -- public
    def load_y(self) -> np.ndarray:
        """Return the targets, float64 of shape (n_samples,)."""
        return self._read_y(self._group())

    def shard_nnz(self) -> np.ndarray:
        """Return the number of stored values per shard (int64, from metadata)."""
        if self._shard_nnz is None:  # fallback for datasets without the attribute
            g = self._group()
            counts = []
            for k in range(self.n_shards):
                w = int(self._bounds[k + 1] - self._bounds[k])
                last = int(self._read(g, f"shards/s{k:04d}/indptr", f"shard {k}", "int64",
                                      w + 1, slice(w, w + 1))[0])
                if not 0 <= last <= self.nnz:
                    raise DatasetError(f"shard {k}: 'indptr' ends at {last}, outside "
                                       f"[0, {self.nnz}] (attribute 'nnz')")
                counts.append(last)
            self._shard_nnz = np.array(counts, dtype=np.int64)
        return self._shard_nnz.copy()
