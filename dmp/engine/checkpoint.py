"""Zarr checkpoints: one group per checkpointed round, completion flag written last.

Layout::

    ckpt.zarr/                 attrs: {dmp_checkpoint: 1, latest: "round_00000120", fingerprint}
      round_00000120/          attrs: {complete: true, round: 120, state: {...json scalars}}
        driver/<name>          driver arrays
        partitions/p0000/<name>  written by the worker that owns partition 0

A checkpoint is complete only once its ``complete`` attribute is set, after every partition
and the driver wrote their arrays; ``latest`` moves after that.  A crash mid-write therefore
leaves the previous complete checkpoint as ``latest``.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import zarr

FORMAT = 1


def _round_name(round: int) -> str:
    return f"round_{round:08d}"


def write_arrays(path: str, arrays: dict) -> None:
    """Write a flat dict of numpy arrays as a Zarr group (used by workers and the driver)."""
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    for name, value in arrays.items():
        value = np.ascontiguousarray(value)
        a = g.create_array(name, shape=value.shape, dtype=value.dtype,
                           chunks=value.shape if value.size else (1,) * max(value.ndim, 1))
        if value.size:
            a[...] = value


def read_arrays(path: str) -> dict:
    """Read every array of a group written by :func:`write_arrays`."""
    g = zarr.open_group(str(path), mode="r")
    return {name: np.asarray(arr[...]) for name, arr in g.arrays()}


class CheckpointStore:
    """A directory of Zarr checkpoints for one fit.

    Parameters
    ----------
    path : str or os.PathLike
        Location of the checkpoint group (created if missing).
    keep : int
        Number of complete checkpoints kept; older ones are deleted.
    """

    def __init__(self, path, keep: int = 2):
        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        self.keep = keep

    # -- reading
    def _root(self, mode="r"):
        return zarr.open_group(self.path, mode=mode, zarr_format=3)

    def latest(self) -> int | None:
        """Round of the latest complete checkpoint, or None."""
        if not os.path.exists(os.path.join(self.path, "zarr.json")):
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
        if not os.path.exists(os.path.join(self.path, "zarr.json")):
            return None
        return self._root().attrs.get("fingerprint")

    def partition_path(self, round: int, index: int) -> str:
        return os.path.join(self.path, _round_name(round), "partitions", f"p{index:04d}")

    def load_driver(self, round: int) -> dict:
        g = self._root()[_round_name(round)]
        state = dict(json.loads(g.attrs["state"]))
        state.update(read_arrays(os.path.join(self.path, _round_name(round), "driver")))
        return state

    # -- writing
    def begin(self, round: int, fingerprint: dict) -> None:
        """Create the group of a new checkpoint (incomplete until :meth:`commit`)."""
        root = zarr.open_group(self.path, mode="a", zarr_format=3)
        if "dmp_checkpoint" not in root.attrs:
            root.attrs.update({"dmp_checkpoint": FORMAT, "fingerprint": fingerprint})
        name = _round_name(round)
        if name in root:
            shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)
        g = root.create_group(name)
        g.attrs.update({"complete": False, "round": int(round)})

    def commit(self, round: int, driver_state: dict) -> None:
        """Write the driver state, mark the checkpoint complete, move ``latest``, prune."""
        arrays = {k: v for k, v in driver_state.items() if isinstance(v, np.ndarray)}
        scalars = {k: v for k, v in driver_state.items() if not isinstance(v, np.ndarray)}
        name = _round_name(round)
        write_arrays(os.path.join(self.path, name, "driver"), arrays)
        root = self._root("a")
        g = root[name]
        g.attrs.update({"state": json.dumps(scalars), "complete": True})
        root.attrs["latest"] = name
        self._prune(root)

    def _prune(self, root) -> None:
        names = sorted(n for n in root.group_keys() if n.startswith("round_"))
        complete = [n for n in names if root[n].attrs.get("complete", False)]
        for n in complete[:-self.keep]:
            shutil.rmtree(os.path.join(self.path, n), ignore_errors=True)
