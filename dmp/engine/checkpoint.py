"""Zarr checkpoints: one group per checkpointed round, completion flag written last.

Layout::

    ckpt.zarr/                 attrs: {dmp_checkpoint: 1, latest: "round_00000120", fingerprint}
      round_00000120/          attrs: {complete: true, round: 120, state: {...json scalars}}
        driver/<name>          driver arrays
        partitions/p0000/<name>  written by the worker that owns partition 0

A checkpoint is complete only once its ``complete`` attribute is set, after every partition
and the driver wrote their arrays; ``latest`` moves after that.  A crash mid-write therefore
leaves the previous complete checkpoint as ``latest``.

The location is a local path or an fsspec URL (``s3://bucket/fit.zarr``, ``gs://...``): the
completion flag, not a rename, is what makes a checkpoint complete, so object stores work the
same as a disk.  Credentials and endpoints come from ``storage_options`` or, as on Kubernetes,
from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...), which the workers that
write their partitions share.
"""

from __future__ import annotations

import json
import os

import numpy as np
import zarr

FORMAT = 1


def _round_name(round: int) -> str:
    return f"round_{round:08d}"


def is_remote(path) -> bool:
    """True for fsspec URLs other than local files (``s3://``, ``gs://``, ``memory://``...)."""
    text = os.fspath(path) if not isinstance(path, str) else path
    return "://" in text and not text.startswith("file://")


def _open(path, mode, storage_options=None):
    path = os.fspath(path) if not isinstance(path, str) else path
    if is_remote(path) and storage_options:
        return zarr.open_group(path, mode=mode, zarr_format=3, storage_options=storage_options)
    return zarr.open_group(path, mode=mode, zarr_format=3)


def write_arrays(path, arrays: dict, storage_options=None) -> None:
    """Write a flat dict of numpy arrays as a Zarr group (used by workers and the driver)."""
    g = _open(path, "w", storage_options)
    for name, value in arrays.items():
        value = np.ascontiguousarray(value)
        a = g.create_array(name, shape=value.shape, dtype=value.dtype,
                           chunks=value.shape if value.size else (1,) * max(value.ndim, 1))
        if value.size:
            a[...] = value


def read_arrays(path, storage_options=None) -> dict:
    """Read every array of a group written by :func:`write_arrays`."""
    g = _open(path, "r", storage_options)
    return {name: np.asarray(arr[...]) for name, arr in g.arrays()}


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

    def clear(self) -> None:
        """Delete every checkpoint at this location.

        Raises
        ------
        FileExistsError
            When something other than a dmp checkpoint store is there: it is left alone.
        """
        present = (self.fs.exists(self.path) if self.remote
                   else os.path.lexists(self.path))
        if not present:
            return
        if not self.is_checkpoint_store():
            raise FileExistsError(f"{self.path!r} is not a dmp checkpoint store; refusing to "
                                  f"delete it (choose another checkpoint location)")
        self._remove(self.path)

    # -- reading
    def _root(self, mode="r"):
        return _open(self.path, mode, self.storage_options)

    def latest(self) -> int | None:
        """Round of the latest complete checkpoint, or None."""
        if not self.exists():
            return None
        try:
            root = self._root()
        except Exception as exc:  # corrupt metadata
            raise ValueError(f"checkpoint store {self.path!r} is corrupt: {exc}") from exc
        name = root.attrs.get("latest")
        if name is None:
            return None
        g = root[name]
        if not g.attrs.get("complete", False):
            return None
        return int(g.attrs["round"])

    def fingerprint(self) -> dict | None:
        if not self.exists():
            return None
        return self._root().attrs.get("fingerprint")

    def partition_path(self, round: int, index: int) -> str:
        return self._join(_round_name(round), "partitions", f"p{index:04d}")

    def load_driver(self, round: int) -> dict:
        g = self._root()[_round_name(round)]
        state = dict(json.loads(g.attrs["state"]))
        state.update(read_arrays(self._join(_round_name(round), "driver"),
                                 self.storage_options))
        return state

    # -- writing
    def begin(self, round: int, fingerprint: dict) -> None:
        """Create the group of a new checkpoint (incomplete until :meth:`commit`)."""
        root = self._root("a")
        if "dmp_checkpoint" not in root.attrs:
            root.attrs.update({"dmp_checkpoint": FORMAT, "fingerprint": fingerprint})
        name = _round_name(round)
        if name in root:
            self._remove(self._join(name))
            root = self._root("a")
        g = root.create_group(name)
        g.attrs.update({"complete": False, "round": int(round)})

    def commit(self, round: int, driver_state: dict) -> None:
        """Write the driver state, mark the checkpoint complete, move ``latest``, prune."""
        arrays = {k: v for k, v in driver_state.items() if isinstance(v, np.ndarray)}
        scalars = {k: v for k, v in driver_state.items() if not isinstance(v, np.ndarray)}
        name = _round_name(round)
        write_arrays(self._join(name, "driver"), arrays, self.storage_options)
        root = self._root("a")
        g = root[name]
        g.attrs.update({"state": json.dumps(scalars), "complete": True})
        root.attrs["latest"] = name
        self._prune(root)

    def _prune(self, root) -> None:
        names = sorted(n for n in root.group_keys() if n.startswith("round_"))
        complete = [n for n in names if root[n].attrs.get("complete", False)]
        for n in complete[:-self.keep]:
            self._remove(self._join(n))
