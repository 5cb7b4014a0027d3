"""dmp's temporary stores: the folders the estimators write in-memory data to for the workers.

Each is ``<tempdir>/dmp-<kind>-<random>`` holding an owner file (host, pid).  A fit removes
its own when it ends; a fit that was killed leaves its folder behind, and the next fit that
makes one (or `clean_stale_temporary_stores`, e.g. from a cron job) removes every such folder
whose owner process on this host is gone.  Nothing else is ever removed: only folders with
dmp's names *and* a readable owner file naming a dead process of this host.

Partial outputs (``<path>.tmp-<hex>`` beside a dataset being converted, a factors store or a
``dmp run`` output folder) carry the same owner file while they are written: the next write
of the same path removes those of dead processes (`clean_stale_partials`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile

#: the estimators' temporary-store kinds (the ``<kind>`` of ``dmp-<kind>-...``)
KINDS = ("lasso", "lda", "mf", "sparsified", "ba")
OWNER_FILE = ".dmp-owner.json"
_NAME = re.compile(r"^dmp-(%s)-[A-Za-z0-9_]+$" % "|".join(KINDS))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive (a zombie is not; a process that this
    one may not signal is taken to be)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    try:  # a killed child not yet reaped by its parent still answers the signal
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return True


def temporary_store_dir(kind: str) -> str:
    """A new temporary folder for an estimator's store of in-memory data (its owner file
    names this process); stale ones left by killed fits are removed first."""
    if kind not in KINDS:
        raise ValueError(f"unknown temporary store kind {kind!r}")
    clean_stale_temporary_stores()
    tmp = tempfile.mkdtemp(prefix=f"dmp-{kind}-")
    with open(os.path.join(tmp, OWNER_FILE), "w") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid()}, f)
    return tmp


def clean_stale_temporary_stores(root=None) -> list[str]:
    """Remove the temporary stores of dmp fits whose process is gone.

    Parameters
    ----------
    root : str, optional
        Folder to look in (default: `tempfile.gettempdir()`).

    Returns
    -------
    list of str
        The folders removed.
    """
    return _remove_orphans(root or tempfile.gettempdir(), _NAME)


# --------------------------------------------------------------------------- partial outputs
#: what dmp's partial outputs are named: ``<path>.tmp-<hex>`` beside ``<path>`` (a dataset
#: being converted, a factors store, a ``dmp run`` output folder), renamed onto ``<path>``
#: when complete
_PARTIAL_TAIL = r"\.tmp-[0-9a-f]{8,32}"


def partial_path(path) -> str:
    """A new name ``<path>.tmp-<hex>`` for a partial output of ``path``."""
    import uuid

    return f"{os.fspath(path)}.tmp-{uuid.uuid4().hex}"


def mark_partial(folder) -> None:
    """Write the owner file (host, pid) into ``folder``, a partial output being written: a
    later write of the same path removes it if this process dies first
    (`clean_stale_partials`).  `unmark_partial` before the folder is renamed into place."""
    with open(os.path.join(os.fspath(folder), OWNER_FILE), "w") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid()}, f)


def unmark_partial(folder) -> None:
    """Remove the owner file `mark_partial` wrote (the output is complete)."""
    try:
        os.remove(os.path.join(os.fspath(folder), OWNER_FILE))
    except FileNotFoundError:
        pass


def clean_stale_partials(path) -> list[str]:
    """Remove the partial outputs of ``path`` (``<path>.tmp-<hex>`` folders) left by dmp
    processes of this host that are gone; nothing else (no owner file, a live owner,
    another host or another name: left alone).

    Returns
    -------
    list of str
        The folders removed.
    """
    parent, base = os.path.split(os.path.abspath(os.fspath(path)))
    return _remove_orphans(parent, re.compile("^" + re.escape(base) + _PARTIAL_TAIL + "$"))


def _remove_orphans(parent: str, pattern: re.Pattern) -> list[str]:
    """Remove the folders of ``parent`` whose names match ``pattern`` and whose owner file
    names a process of this host that is gone; a folder without a readable owner file (not
    yet written, or not dmp's) is left alone."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    host = socket.gethostname()
    for entry in entries:
        if not pattern.match(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with open(os.path.join(entry.path, OWNER_FILE)) as f:
                owner = json.load(f)
            pid = owner["pid"]
            if owner.get("host") != host or not isinstance(pid, int) or pid_alive(pid):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed
