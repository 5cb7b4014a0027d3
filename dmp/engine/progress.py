"""A fit's progress: tqdm's bar on a terminal or in a notebook, plain lines elsewhere.

A bar redrawn with carriage returns is one ever-growing line in a log file (a ``dmp run``
under CI, a Kubernetes job's log); there a line is written every `LINE_INTERVAL_S` seconds
and one at the end instead.
"""

from __future__ import annotations

import sys
import time

#: seconds between two progress lines when the output is not a terminal
LINE_INTERVAL_S = 10.0


def progress_bar(show_progress: bool, total: int, desc: str):
    """An object with tqdm's ``update``, ``set_postfix`` and ``close`` (None when progress
    is not shown): tqdm on a terminal or in a notebook, `LineProgress` otherwise."""
    if not show_progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return LineProgress(total, desc)
    # tqdm.auto picks its notebook widget under a Jupyter kernel (whose stderr is no tty)
    notebook = sys.modules.get("tqdm.notebook")
    in_notebook = notebook is not None and issubclass(tqdm, notebook.tqdm)
    if in_notebook or _isatty(sys.stderr):
        return tqdm(total=total, desc=desc, leave=True, dynamic_ncols=True)
    return LineProgress(total, desc)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):   # no method, or a closed stream
        return False


class LineProgress:
    """Progress as whole lines on standard error: ``desc: n/total rounds, s seconds,
    postfix`` every ``interval`` seconds (`LINE_INTERVAL_S` by default) and when closed."""

    def __init__(self, total: int, desc: str, interval: float | None = None):
        self.total = total
        self.desc = desc
        self.interval = LINE_INTERVAL_S if interval is None else interval
        self.n = 0
        self.postfix: dict = {}
        self.t0 = self.t_line = time.monotonic()
        self.written = -1   # the count of the last line written
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.t_line >= self.interval:
            self._write(now)

    def set_postfix(self, postfix: dict, refresh: bool = True) -> None:
        self.postfix = dict(postfix)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.written != self.n:
                self._write(time.monotonic())

    def _write(self, now: float) -> None:
        self.t_line = now
        self.written = self.n
        fields = "".join(f", {k}={v}" for k, v in self.postfix.items())
        line = f"{self.desc}: {self.n}/{self.total} rounds, {now - self.t0:.1f} s{fields}\n"
        stream = sys.stderr
        if stream is not None:
            stream.write(line)
            stream.flush()
