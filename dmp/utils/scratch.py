"""dmp's temporary stores: the folders the estimators write in-memory data to for the workers.

Each is ``<tempdir>/dmp-<kind>-<random>`` holding an owner file (host, pid).  A fit removes
its own when it ends; a fit that was killed leaves its folder behind, and the next fit that
makes one (or `clean_stale_temporary_stores`, e.g. from a cron job) removes every such folder
whose owner process on this host is gone.  Nothing else is ever removed: only folders with
dmp's names *and* a readable owner file naming a dead process of this host.
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


def _pid_alive(pid: int) -> bool:
    from ..engine.checkpoint import _pid_alive as alive

    return alive(pid)


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
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    host = socket.gethostname()
    for entry in entries:
        if not _NAME.match(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with open(os.path.join(entry.path, OWNER_FILE)) as f:
                owner = json.load(f)
            pid = owner["pid"]
            if owner.get("host") != host or not isinstance(pid, int) or _pid_alive(pid):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue   # no owner file (yet, or not dmp's): leave it
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed
