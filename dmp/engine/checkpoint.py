"""Zarr checkpoints: one group per checkpointed round, completion flag written last.

Layout::

    ckpt.zarr/                 attrs: {dmp_checkpoint: 2, latest: "round_00000120", fingerprint}
      lock/                    attrs: {dmp_lock: {host, pid, token, started, heartbeat}}
      history/h00000120        attrs: {prev: "h00000110", first, records: "[...]" (JSON)}
      round_00000120/          attrs: {complete: true, round: 120, state: {...json scalars},
                                       manifest: {driver: {...}, partitions: [...]},
                                       history: "h00000120", history_len}
        driver/<name>          driver arrays
        partitions/p0000/<name>  written by the worker that owns partition 0

A checkpoint is complete only once its ``complete`` attribute is set, after every partition
and the driver wrote their arrays; ``latest`` moves after that.  A crash mid-write therefore
leaves the previous complete checkpoint as the latest.

Every array is recorded in its round's ``manifest`` with its shape, dtype and a checksum
(BLAKE2b of its bytes) computed by the process that wrote it; on resume each is checked
before it is used -- its declared size against the manifest and against what the fit holds
before anything is read, its bytes against the checksum after -- and a round that fails
(corrupt, a piece missing) raises `dmp.exceptions.CheckpointError`: the runner then falls
back to the previous complete round, with a `dmp.exceptions.CheckpointWarning`.

The fit's per-round history is appended, not rewritten: each checkpoint adds one
``history/`` segment holding the rounds since the one before and naming it (``prev``), so a
checkpoint's cost does not grow with the rounds.

A fit writing a location holds its ``lock`` (owner host and pid, a heartbeat refreshed every
``dmp.checkpoint.lock-heartbeat``, a Dask setting); a second fit is refused with
`dmp.exceptions.CheckpointLockedError` unless the lock is stale (its process gone, on this
host, or its heartbeat older than ``dmp.checkpoint.lock-stale``), when it is taken over with
a warning.

The location is a local path or an fsspec URL (``s3://bucket/fit.zarr``, ``gs://...``): the
completion flag, not a rename, is what makes a checkpoint complete, so object stores work the
same as a disk.  Credentials and endpoints come from ``storage_options`` or, as on Kubernetes,
from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...), which the workers that
write their partitions share.  On an object store the lock is written and read back (no
exclusive create): two fits starting within the same instant may both take it, and the
loser stops at its next heartbeat or checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
import warnings

import numpy as np

from .. import config
from ..exceptions import CheckpointError, CheckpointLockedError, CheckpointWarning
from ..utils.paths import is_remote
from ..utils.scratch import pid_alive

logger = logging.getLogger("dmp")

#: 2: checksummed arrays (round ``manifest``), appended history segments, lock
FORMAT = 2
#: the arrays of a partition (or of the driver) may declare at most this many times the bytes
#: the fit's own fresh state holds, plus `SIZE_SLACK`, before anything is read
SIZE_FACTOR = 4
SIZE_SLACK = 16 * 2**20


def _round_name(round: int) -> str:
    return f"round_{round:08d}"


def _history_name(round: int) -> str:
    return f"h{round:08d}"


def _open(path, mode, storage_options=None):
    import zarr   # here: a fit without checkpoints never imports zarr

    path = os.fspath(path) if not isinstance(path, str) else path
    if is_remote(path) and storage_options:
        return zarr.open_group(path, mode=mode, zarr_format=3, storage_options=storage_options)
    return zarr.open_group(path, mode=mode, zarr_format=3)


def array_digest(value) -> str:
    """Checksum of an array: BLAKE2b (128 bits) of its dtype, shape and bytes."""
    a = np.ascontiguousarray(value)
    h = _digest_start(a.dtype, a.shape)
    h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()


def _digest_start(dtype, shape):
    """`array_digest`'s hash before the bytes (fed piece by piece by `write_arrays`)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{np.dtype(dtype).str}{tuple(shape)}".encode())
    return h


def _feed(h, part) -> None:
    import scipy.sparse as sp

    if part is None:
        h.update(b"N;")
    elif sp.issparse(part):
        h.update(f"sparse:{part.format}{part.shape};".encode())
        fields = (("data", "indices", "indptr") if hasattr(part, "indptr")
                  else ("row", "col", "data") if hasattr(part, "row") else None)
        if fields is None:
            part = part.tocoo()
            fields = ("row", "col", "data")
        for f in fields:
            _feed(h, getattr(part, f))
    elif isinstance(part, (tuple, list)):
        h.update(f"seq{len(part)}(".encode())
        for p in part:
            _feed(h, p)
        h.update(b");")
    else:
        a = np.ascontiguousarray(part)
        if a.dtype == object:
            raise TypeError("content_digest takes numeric arrays, not object arrays")
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.reshape(-1).view(np.uint8))


def content_digest(*parts) -> str:
    """A fingerprint of in-memory data by content: BLAKE2b of the arrays' dtypes, shapes and
    bytes (scipy sparse matrices by their format and component arrays, tuples in order).

    The estimators fingerprint in-memory ``X`` (and ``y``) with it, so that ``resume=True``
    continues a fit of the same data even though each fit writes it to a new temporary store
    for the workers, and refuses a fit of other data."""
    h = hashlib.blake2b(digest_size=20)
    for p in parts:
        _feed(h, p)
    return "blake2b:" + h.hexdigest()


def write_arrays(path, arrays: dict, storage_options=None) -> dict:
    """Write a flat dict of numpy arrays as a Zarr group (used by workers and the driver).

    Returns
    -------
    dict
        ``{name: {"shape", "dtype", "digest"}}`` of what was written (`array_digest`), for
        the round's manifest.
    """
    g = _open(path, "w", storage_options)
    piece = config.nbytes("dmp.memory.collect-piece-bytes")
    manifest = {}
    for name, value in arrays.items():
        value = np.asarray(value)
        # in chunks of rows of about a piece, written and checksummed one at a time: one
        # chunk of the whole array is encoded as another copy of it, which a partition
        # sized near its worker's memory limit cannot afford (the memory check counts a
        # piece in flight: `collect_transient_bytes`)
        row = max(1, value.dtype.itemsize * int(np.prod(value.shape[1:], dtype=np.int64)))
        step = max(1, piece // row) if value.ndim else 1
        if value.size == 0:
            chunks = (1,) * max(value.ndim, 1)
        elif value.ndim == 0:
            chunks = ()
        else:
            chunks = (min(step, value.shape[0]), *value.shape[1:])
        a = g.create_array(name, shape=value.shape, dtype=value.dtype, chunks=chunks)
        h = _digest_start(value.dtype, value.shape)
        if value.ndim == 0:
            a[...] = value
            h = None
        elif value.size:
            for s in range(0, value.shape[0], step):
                part = np.ascontiguousarray(value[s:s + step])
                a[s:s + len(part)] = part
                h.update(part.reshape(-1).view(np.uint8))
        manifest[name] = {"shape": list(value.shape), "dtype": value.dtype.str,
                          "digest": array_digest(value) if h is None else h.hexdigest()}
    return manifest


def expected_nbytes(arrays) -> int | None:
    """Bytes of a dict of arrays (a fit's fresh state: the bound a checkpoint must keep)."""
    try:
        return int(sum(np.asarray(v).nbytes for v in arrays.values()
                       if isinstance(v, np.ndarray)))
    except Exception:  # a program whose state is not ready to be listed: no bound
        return None


def read_arrays(path, storage_options=None, *, manifest: dict | None = None,
                expected: int | None = None) -> dict:
    """Read every array of a group written by :func:`write_arrays`.

    Parameters
    ----------
    manifest : dict, optional
        What `write_arrays` returned when the group was written: every array it lists must
        be there with that shape and dtype (checked before anything is read) and those bytes
        (checked after).
    expected : int, optional
        Bytes the reader's own state holds: arrays declaring more than ``SIZE_FACTOR`` times
        that plus ``SIZE_SLACK`` are refused before anything is allocated.

    Raises
    ------
    dmp.exceptions.CheckpointError
        The group or an array is missing, unreadable, larger than expected, or differs from
        the manifest; the message names the group and the array.
    """
    try:
        g = _open(path, "r", storage_options)
        stored = dict(g.arrays())
    except Exception as exc:
        raise CheckpointError(f"checkpoint group {path!r} is missing or unreadable "
                              f"({type(exc).__name__}: {exc})") from exc
    names = list(stored) if manifest is None else list(manifest)
    try:
        if manifest is not None:
            missing = [n for n in manifest if n not in stored]
            if missing:
                raise CheckpointError(f"checkpoint group {path!r} lacks the array(s) "
                                      f"{missing} its round's manifest lists")
            for name, meta in manifest.items():
                arr = stored[name]
                if (list(arr.shape) != [int(s) for s in meta["shape"]]
                        or np.dtype(arr.dtype).str != meta["dtype"]):
                    raise CheckpointError(
                        f"array {name!r} of checkpoint group {path!r} declares shape "
                        f"{tuple(arr.shape)} and dtype {np.dtype(arr.dtype).str}; its round's "
                        f"manifest records {tuple(meta['shape'])} {meta['dtype']} (changed "
                        f"after it was written)")
        claimed = sum(int(np.prod(stored[n].shape, dtype=np.float64))
                      * np.dtype(stored[n].dtype).itemsize for n in names)
    except CheckpointError:
        raise
    except Exception as exc:  # malformed manifest entries or array metadata
        raise CheckpointError(f"checkpoint group {path!r} has malformed metadata "
                              f"({type(exc).__name__}: {exc})") from exc
    if expected is not None and claimed > SIZE_FACTOR * expected + SIZE_SLACK:
        raise CheckpointError(f"checkpoint group {path!r} declares {claimed:,} bytes of "
                              f"arrays; this fit's state holds {expected:,}: refused before "
                              f"reading (corrupt metadata, or a checkpoint of another fit)")
    out = {}
    for name in names:
        try:
            value = np.asarray(stored[name][...])
        except Exception as exc:
            raise CheckpointError(f"array {name!r} of checkpoint group {path!r} cannot be "
                                  f"read ({type(exc).__name__}: {exc})") from exc
        if manifest is not None and array_digest(value) != manifest[name]["digest"]:
            raise CheckpointError(f"array {name!r} of checkpoint group {path!r} does not "
                                  f"match the checksum written with it (its data changed "
                                  f"after the checkpoint was written)")
        out[name] = value
    return out


def _lock_stale_s() -> float:
    old = os.environ.get("DMP_CHECKPOINT_LOCK_STALE_S")
    if old is not None:   # the variable before the setting
        warnings.warn("the environment variable DMP_CHECKPOINT_LOCK_STALE_S is deprecated: "
                      "use DASK_DMP__CHECKPOINT__LOCK_STALE (Dask setting "
                      "dmp.checkpoint.lock-stale)", FutureWarning, stacklevel=2)
        try:
            return float(old)
        except ValueError:
            pass
    return config.seconds("dmp.checkpoint.lock-stale")


def _is_store_root_entry(name: str) -> bool:
    """Whether ``name`` may sit in a checkpoint folder another fit is creating right now:
    the lock, the root metadata, or Zarr's temporary ``zarr.<hex>.partial`` of it."""
    return name in ("lock", "zarr.json") or (name.startswith("zarr.") and name.endswith(".partial"))


class CheckpointLock:
    """The lock of a checkpoint location, held by the fit writing it.

    A Zarr group ``lock`` of the store whose attributes name the owner (host, pid, a token)
    and a heartbeat a thread refreshes every ``dmp.checkpoint.lock-heartbeat``.  Created with
    an exclusive create on a local disk.  Use through `CheckpointStore.lock`.
    """

    def __init__(self, store: "CheckpointStore"):
        self.store = store
        self.path = store._join("lock", "zarr.json")
        self.token = uuid.uuid4().hex
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
                      "started": time.time()}
        self.lost = None
        self._stop = threading.Event()
        self._thread = None
        self._created_root = False

    # -- file access (local or fsspec)
    def _payload(self) -> bytes:
        attrs = {"dmp_lock": {**self.owner, "heartbeat": time.time()}}
        return json.dumps({"zarr_format": 3, "node_type": "group",
                           "attributes": attrs}).encode()

    def _read(self):
        """The owner recorded in the lock file; None if there is none, {} if unreadable."""
        try:
            if self.store.remote:
                raw = self.store.fs.cat_file(self.path)
            else:
                with open(self.path, "rb") as f:
                    raw = f.read()
        except FileNotFoundError:
            return None
        try:
            owner = json.loads(raw)["attributes"]["dmp_lock"]
            return owner if isinstance(owner, dict) else {}
        except (ValueError, KeyError, TypeError):
            return {}

    def _write(self, exclusive: bool) -> bool:
        data = self._payload()
        if self.store.remote:
            if exclusive and self.store.fs.exists(self.path):
                return False
            self.store.fs.pipe_file(self.path, data)
            return True
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.{self.token}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        if not exclusive:
            os.replace(tmp, self.path)
            return True
        try:  # a hard link appears whole or not at all, and never replaces a lock
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return True

    def _remove(self) -> None:
        self.store._remove(self.store._join("lock"))

    # -- protocol
    def stale_reason(self, owner: dict) -> str | None:
        """Why the lock of ``owner`` is stale, or None while its fit may be alive."""
        if not owner:
            return "the lock file is unreadable (its writer was killed while writing it)"
        age = time.time() - float(owner.get("heartbeat", 0) or 0)
        if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int) \
                and owner["pid"] != os.getpid() and not pid_alive(owner["pid"]):
            return f"its process {owner['pid']} on this host is gone"
        if age > _lock_stale_s():
            return f"its last heartbeat is {age:.0f} s old"
        return None

    def acquire(self) -> "CheckpointLock":
        store = self.store
        root_existed = store.exists()
        if not root_existed and not store.remote and os.path.isdir(store.path) \
                and any(not _is_store_root_entry(n) for n in os.listdir(store.path)):
            raise CheckpointError(f"{store.path!r} is a folder that is not a dmp checkpoint "
                                  f"store; choose another checkpoint location")
        for attempt in range(3):
            try:   # another fit may be creating the same new store at this moment
                root = store._root("a")
                if "dmp_checkpoint" not in root.attrs:
                    root.attrs["dmp_checkpoint"] = FORMAT
                break
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.05)
        self._created_root = not root_existed
        for _ in range(3):
            if self._write(exclusive=True):
                break
            owner = self._read()
            if owner is None:      # released meanwhile
                continue
            reason = self.stale_reason(owner)
            if reason is None:
                age = time.time() - float(owner.get("heartbeat", 0) or 0)
                raise CheckpointLockedError(
                    f"checkpoint location {store.path!r} is being written by another fit "
                    f"(pid {owner.get('pid')} on host {owner.get('host')!r}, last heartbeat "
                    f"{age:.0f} s ago); two fits must not write one location: wait for it "
                    f"to end or choose another location.  A lock left by a fit that died is "
                    f"taken over once its process is gone (same host) or its heartbeat is "
                    f"older than {_lock_stale_s():g} s (dmp.checkpoint.lock-stale)")
            msg = (f"taking over the lock of checkpoint location {store.path!r} from pid "
                   f"{owner.get('pid')} on host {owner.get('host')!r}: {reason}")
            warnings.warn(msg, CheckpointWarning, stacklevel=4)
            logger.warning(msg)
            self._write(exclusive=False)
            break
        else:
            raise CheckpointLockedError(f"could not take the lock of checkpoint location "
                                        f"{store.path!r} (it kept changing hands)")
        held = self._read() or {}
        if held.get("token") != self.token:
            raise CheckpointLockedError(
                f"checkpoint location {store.path!r} was locked by another fit at the same "
                f"time (pid {held.get('pid')} on host {held.get('host')!r})")
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name=f"dmp-checkpoint-lock-{self.token[:8]}")
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(config.seconds("dmp.checkpoint.lock-heartbeat")):
            try:
                self.verify()
                self._write(exclusive=False)
            except CheckpointLockedError:
                return
            except Exception as exc:  # a transient storage error: try again next beat
                logger.warning("could not refresh the checkpoint lock of %s: %s",
                               self.store.path, exc)

    def verify(self) -> None:
        """Raise `CheckpointLockedError` if another fit took the lock over."""
        if self.lost is None:
            held = self._read()
            if held is None or held.get("token") != self.token:
                self.lost = held or {}
        if self.lost is not None:
            raise CheckpointLockedError(
                f"the lock of checkpoint location {self.store.path!r} was taken over by "
                f"another fit (pid {self.lost.get('pid')} on host "
                f"{self.lost.get('host')!r}); this fit stops writing checkpoints there")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            held = self._read()
            if held is not None and held.get("token") == self.token:
                self._remove()
                if self._created_root and self.store.latest_name() is None \
                        and not self.store.round_names():
                    # nothing was checkpointed: leave no store behind
                    self.store._remove(self.store.path)
        except Exception as exc:  # never mask the fit's own outcome
            logger.warning("could not release the checkpoint lock of %s: %s",
                           self.store.path, exc)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


class CheckpointStore:
    """A directory (or object-store prefix) of Zarr checkpoints for one fit.

    Parameters
    ----------
    path : str or os.PathLike
        Local path or fsspec URL of the checkpoint group (created if missing).
    keep : int
        Number of complete checkpoints kept; older ones are deleted.
    storage_options : dict, optional
        fsspec options for a URL (default: the environment's configuration).
    """

    def __init__(self, path, keep: int = 2, storage_options=None):
        path = os.fspath(path)
        self.remote = is_remote(path)
        self.path = path.rstrip("/") if self.remote else os.path.abspath(os.path.expanduser(path))
        self.keep = keep
        self.storage_options = dict(storage_options or {})
        self._fs = None
        # the history segment the next checkpoint appends to: (name or None, rounds in it)
        self._history_head = (None, 0)

    @property
    def fs(self):
        if self._fs is None:
            import fsspec.core

            self._fs, _ = fsspec.core.url_to_fs(self.path, **self.storage_options)
        return self._fs

    def _join(self, *parts) -> str:
        return "/".join([self.path, *parts]) if self.remote else os.path.join(self.path, *parts)

    def exists(self) -> bool:
        """Whether anything was ever written at this location."""
        marker = self._join("zarr.json")
        return self.fs.exists(marker) if self.remote else os.path.exists(marker)

    def _remove(self, path: str) -> None:
        try:
            if self.remote or os.path.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def is_checkpoint_store(self) -> bool:
        """Whether this location holds a dmp checkpoint store (its root says so)."""
        if not self.exists():
            return False
        try:
            return "dmp_checkpoint" in self._root().attrs
        except Exception:
            return False

    def lock(self) -> CheckpointLock:
        """The lock of this location, to hold while a fit writes it (a context manager).

        Raises
        ------
        dmp.exceptions.CheckpointLockedError
            On entering, when another live fit holds it.
        """
        return CheckpointLock(self)

    def clear(self) -> None:
        """Delete every checkpoint at this location.

        Raises
        ------
        FileExistsError
            When something other than a dmp checkpoint store is there: it is left alone.
        dmp.exceptions.CheckpointLockedError
            When a live fit holds the location's lock.
        """
        present = (self.fs.exists(self.path) if self.remote
                   else os.path.lexists(self.path))
        if not present:
            return
        if not self.is_checkpoint_store():
            raise FileExistsError(f"{self.path!r} is not a dmp checkpoint store; refusing to "
                                  f"delete it (choose another checkpoint location)")
        lock = CheckpointLock(self)
        owner = lock._read()
        if owner is not None and lock.stale_reason(owner) is None:
            raise CheckpointLockedError(f"checkpoint store {self.path!r} is being written by "
                                        f"a fit (pid {owner.get('pid')} on host "
                                        f"{owner.get('host')!r}); not deleting it")
        self._remove(self.path)

    # -- reading
    def _root(self, mode="r"):
        return _open(self.path, mode, self.storage_options)

    def _root_checked(self):
        try:
            return self._root()
        except Exception as exc:  # corrupt metadata
            raise CheckpointError(f"checkpoint store {self.path!r} is corrupt: its root "
                                  f"metadata cannot be read ({type(exc).__name__}: "
                                  f"{exc})") from exc

    def round_names(self) -> list[str]:
        """Names of the round groups present (complete or not), oldest first."""
        if not self.exists():
            return []
        with warnings.catch_warnings():
            # a round whose zarr.json is gone is a folder Zarr warns about: reported by the
            # resume (`complete_rounds`) instead
            warnings.simplefilter("ignore")
            return sorted(n for n in self._root_checked().group_keys()
                          if n.startswith("round_"))

    def latest_name(self) -> str | None:
        """The round the store's ``latest`` attribute names (None if none)."""
        if not self.exists():
            return None
        return self._root_checked().attrs.get("latest")

    def complete_rounds(self) -> list[int]:
        """Rounds of the complete checkpoints, newest first (their contents unchecked)."""
        if not self.exists():
            return []
        root = self._root_checked()
        out = []
        for n in self.round_names():
            try:
                attrs = root[n].attrs
                if attrs.get("complete", False):
                    out.append(int(attrs["round"]))
            except Exception:  # malformed round metadata: not a complete checkpoint
                continue
        return sorted(out, reverse=True)

    def latest(self) -> int | None:
        """Round of the latest complete checkpoint, or None."""
        rounds = self.complete_rounds()
        return rounds[0] if rounds else None

    def fingerprint(self) -> dict | None:
        if not self.exists():
            return None
        return self._root_checked().attrs.get("fingerprint")

    def partition_path(self, round: int, index: int) -> str:
        return self._join(_round_name(round), "partitions", f"p{index:04d}")

    def _where(self, round: int) -> str:
        return f"checkpoint store {self.path!r}, round {round}"

    def round_attrs(self, round: int) -> dict:
        """The attributes of a complete round, checked for what a resume needs.

        Raises
        ------
        dmp.exceptions.CheckpointError
            Its metadata is missing or malformed, or it lacks its manifest (format 2).
        """
        root = self._root_checked()
        try:
            attrs = dict(root[_round_name(round)].attrs)
        except Exception as exc:
            raise CheckpointError(f"{self._where(round)}: the round's metadata "
                                  f"({_round_name(round)}/zarr.json) is missing or unreadable "
                                  f"({type(exc).__name__}: {exc})") from exc
        if not attrs.get("complete", False):
            raise CheckpointError(f"{self._where(round)}: the checkpoint is incomplete")
        missing = [k for k in ("state",) if k not in attrs]
        if int(root.attrs.get("dmp_checkpoint", 1)) >= 2:
            missing += [k for k in ("manifest",) if k not in attrs]
        if missing:
            raise CheckpointError(f"{self._where(round)}: the round's metadata lacks "
                                  f"{missing}")
        manifest = attrs.get("manifest")
        if manifest is not None and not (isinstance(manifest, dict)
                                         and isinstance(manifest.get("driver"), dict)
                                         and isinstance(manifest.get("partitions"),
                                                        (list, type(None)))):
            raise CheckpointError(f"{self._where(round)}: the round's manifest is malformed")
        return attrs

    def partition_manifests(self, round: int, n_partitions: int) -> list | None:
        """Each partition's manifest (None for a format-1 checkpoint, which has none)."""
        manifest = self.round_attrs(round).get("manifest")
        if manifest is None:
            return None
        parts = manifest["partitions"]
        if parts is None:   # written by a backend that reports no manifests
            return None
        if len(parts) != n_partitions or not all(isinstance(p, dict) for p in parts):
            raise CheckpointError(f"{self._where(round)}: the manifest lists {len(parts)} "
                                  f"partition(s), this fit has {n_partitions}")
        return parts

    def load_driver(self, round: int, expected: int | None = None) -> dict:
        """The driver state of a complete round (checked against its manifest).

        Raises
        ------
        dmp.exceptions.CheckpointError
            A piece is missing, malformed or corrupt.
        """
        attrs = self.round_attrs(round)
        try:
            state = dict(json.loads(attrs["state"]))
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{self._where(round)}: the driver's scalar state is "
                                  f"malformed ({exc})") from exc
        manifest = attrs.get("manifest")
        try:
            state.update(read_arrays(self._join(_round_name(round), "driver"),
                                     self.storage_options,
                                     manifest=None if manifest is None else manifest["driver"],
                                     expected=expected))
        except CheckpointError as exc:
            raise CheckpointError(f"{self._where(round)}: driver state: {exc}") from exc
        state.pop("__history", None)
        return state

    def load_history(self, round: int) -> list:
        """The fit's per-round records up to a complete round (its history segments)."""
        attrs = self.round_attrs(round)
        if "history" not in attrs:   # format 1: the whole history in the driver state
            try:
                return list(json.loads(json.loads(attrs["state"]).get("__history", "[]")))
            except (TypeError, ValueError) as exc:
                raise CheckpointError(f"{self._where(round)}: malformed history") from exc
        root = self._root_checked()
        name, n = attrs["history"], int(attrs["history_len"])
        segments = []
        while name is not None:
            try:
                seg = dict(root["history"][name].attrs)
                records, prev, first = (json.loads(seg["records"]), seg.get("prev"),
                                        int(seg["first"]))
                if not isinstance(records, list):
                    raise TypeError("records are not a list")
            except Exception as exc:
                raise CheckpointError(f"{self._where(round)}: history segment {name!r} is "
                                      f"missing or malformed ({type(exc).__name__}: "
                                      f"{exc})") from exc
            segments.append((first, records))
            if prev is not None and not (isinstance(prev, str) and prev < name):
                raise CheckpointError(f"{self._where(round)}: history segment {name!r} "
                                      f"names {prev!r} before it")
            name = prev
        history = []
        for first, records in reversed(segments):
            if first != len(history):
                raise CheckpointError(f"{self._where(round)}: the history segments do not "
                                      f"follow each other (one starts at record {first}, "
                                      f"{len(history)} read)")
            history.extend(records)
        if len(history) != n:
            raise CheckpointError(f"{self._where(round)}: the history holds {len(history)} "
                                  f"rounds, the checkpoint records {n}")
        self._history_head = (attrs["history"], n)
        return history

    def reset_history(self) -> None:
        """The next checkpoint starts a new history (the fit started over)."""
        self._history_head = (None, 0)

    # -- writing
    def begin(self, round: int, fingerprint: dict) -> None:
        """Create the group of a new checkpoint (incomplete until :meth:`commit`)."""
        root = self._root("a")
        if "fingerprint" not in root.attrs:
            root.attrs.update({"dmp_checkpoint": FORMAT, "fingerprint": fingerprint})
        name = _round_name(round)
        if name in root:
            self._remove(self._join(name))
            root = self._root("a")
        g = root.create_group(name)
        g.attrs.update({"complete": False, "round": int(round)})

    def commit(self, round: int, driver_state: dict, partitions: list | None = None,
               history: list | None = None) -> None:
        """Write the driver state and the history since the last checkpoint, mark the
        checkpoint complete, move ``latest``, prune.

        Parameters
        ----------
        partitions : list of dict, optional
            What each partition's `write_arrays` returned (the round's manifest).
        history : list of dict, optional
            The fit's per-round records so far: those after the previous checkpoint are
            appended as one segment.
        """
        arrays = {k: v for k, v in driver_state.items() if isinstance(v, np.ndarray)}
        scalars = {k: v for k, v in driver_state.items() if not isinstance(v, np.ndarray)}
        name = _round_name(round)
        driver = write_arrays(self._join(name, "driver"), arrays, self.storage_options)
        root = self._root("a")
        extra = {}
        if history is not None:
            prev, n_saved = self._history_head
            if n_saved > len(history):   # the fit started over: a new chain
                prev, n_saved = None, 0
            seg = _history_name(round)
            hist = root.require_group("history")
            # one compact JSON string: Zarr indents attributes, a list of dicts line by line
            hist.create_group(seg, overwrite=True,
                              attributes={"prev": prev, "first": n_saved,
                                          "records": json.dumps(history[n_saved:])})
            extra = {"history": seg, "history_len": len(history)}
        manifest = {"driver": driver,
                    "partitions": None if partitions is None else list(partitions)}
        g = root[name]
        g.attrs.update({"state": json.dumps(scalars), "manifest": manifest, **extra,
                        "complete": True})
        if history is not None:
            self._history_head = (extra["history"], extra["history_len"])
        root.attrs["latest"] = name
        self._prune(root)

    def _prune(self, root) -> None:
        names = self.round_names()
        complete = [n for n in names if root[n].attrs.get("complete", False)]
        for n in complete[:-self.keep]:
            self._remove(self._join(n))


def tag_content(ds, digest: str):
    """Mark a dataset built from in-memory data with its `content_digest`; returns it."""
    ds.dmp_content_digest = digest
    return ds


def dataset_fingerprint(ds) -> str:
    """The ``dataset`` entry of a fit's checkpoint fingerprint: the content digest of data
    given in memory (`tag_content`; the temporary store it is written to changes from fit to
    fit), else the store's path."""
    digest = getattr(ds, "dmp_content_digest", None)
    return digest if digest is not None else str(getattr(ds, "path", None))
