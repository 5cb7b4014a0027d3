"""``dmp monitor ADDRESS``: follow the dmp fits of a running cluster from another terminal."""

from __future__ import annotations

import queue
import sys
import time

from ..engine.events import TOPIC
from .state import MonitorState, format_value

_QUIET = {"iteration", "phase", "updates", "step", "n_candidates", "n_kept", "kind", "sweep"}


def _metrics_text(state_fit) -> str:
    m = state_fit.last_metrics()
    primary = state_fit.primary_metric
    keys = [primary] + [k for k in m if k != primary and k not in _QUIET]
    text = "  ".join(f"{k} {format_value(m.get(k))}" for k in keys if k in m)
    if state_fit.primary_direction == "max" and primary in m:
        text = text.replace(f"{primary} ", f"{primary} (max) ", 1)
    return text


class _Printer:
    def __init__(self, out, interval: float):
        self.out = out
        self.interval = interval
        self.state = MonitorState(max_fits=1000, max_rounds=1)
        self.last_print: dict[str, float] = {}
        self.seen: set = set()

    def line(self, fit_id: str, text: str) -> None:
        print(f"{fit_id:<32s} {text}", file=self.out, flush=True)

    def handle(self, event) -> None:
        ts, msg = event
        if isinstance(msg, dict) and msg.get("kind") == "batch":
            for m in msg.get("events") or ():
                self.handle((ts, m))
            return
        if not isinstance(msg, dict) or "fit" not in msg:
            return
        key = (ts, msg.get("fit"), msg.get("kind"), msg.get("round"))
        if key in self.seen:
            return
        self.seen.add(key)
        self.state.handle(msg)
        fit_id, kind = msg["fit"], msg.get("kind")
        fit = self.state.fits.get(fit_id)
        if fit is None:
            return
        if kind == "round":
            now = time.monotonic()
            if now - self.last_print.get(fit_id, -1e9) >= self.interval:
                self.last_print[fit_id] = now
                total = fit.info.get("max_iter")
                ck = (f"  checkpoints {fit.n_checkpoints} (last at round "
                      f"{fit.last_checkpoint_round})" if fit.n_checkpoints else "")
                self.line(fit_id, f"round {fit.last_round}"
                          f"{'' if total is None else f'/{total}'}  {_metrics_text(fit)}  "
                          f"t={format_value(msg.get('time'))} s{ck}")
        elif kind == "fit_start":
            params = ", ".join(f"{k}={v}" for k, v in (msg.get("params") or {}).items()
                               if v is not None and k not in ("callback", "show_progress"))
            self.line(fit_id, f"started: {msg.get('estimator')}({params}) on "
                              f"{msg.get('n_partitions')} partition(s)")
        elif kind == "checkpoint":
            # one line for the first; the others are counted on the progress lines and
            # summarised at the end (a long fit writes one every checkpoint_every rounds)
            if fit.n_checkpoints == 1:
                self.line(fit_id, f"first checkpoint at round {msg.get('round')} (later ones "
                                  f"are counted on the progress lines)")
        elif kind == "worker_lost":
            self.line(fit_id, f"WORKER LOST at round {msg.get('round')}: {msg.get('error')}")
        elif kind == "recovered":
            self.line(fit_id, f"recovered; continuing from round {msg.get('resumed_round')}")
        elif kind == "fit_end":
            ck = (f"; {fit.n_checkpoints} checkpoint(s), the last at round "
                  f"{fit.last_checkpoint_round}" if fit.n_checkpoints else "")
            self.line(fit_id, f"finished ({msg.get('status')}) after {msg.get('n_rounds')} "
                              f"rounds in {format_value(msg.get('wall_s'))} s; "
                              f"{_metrics_text(fit)}{ck}")

    def running(self) -> list[str]:
        return [f.fit_id for f in self.state.fits.values() if f.status == "running"]


def follow(address, *, out=None, exit_when_done: bool = False, timeout: float | None = None,
           interval: float = 1.0) -> int:
    """Print the progress of every dmp fit on the cluster at ``address`` as it happens.

    Parameters
    ----------
    address : str or distributed.Client
        Scheduler address (``tcp://host:8786``) or a connected client.
    exit_when_done : bool
        Return once a fit that had not finished when following began was seen and no fit
        is running.
    timeout : float, optional
        Return after this many seconds.
    interval : float
        At most one progress line per fit per ``interval`` seconds (events such as
        checkpoints and worker losses are always printed).

    Returns
    -------
    int
        The number of fits seen.
    """
    from distributed import Client

    from ..utils.cluster import connect, dashboard_base

    out = out or sys.stdout
    if isinstance(address, Client):
        client, own = address, False
    else:
        client, own = connect(address, set_as_default=False), True
    printer = _Printer(out, interval)
    inbox: queue.Queue = queue.Queue()
    try:
        base = dashboard_base(client)
        page = f"live page: {base}/dmp" if base else "the scheduler serves no dashboard"
        print(f"following dmp fits on {client.scheduler.address}; {page}", file=out,
              flush=True)
        client.subscribe_topic(TOPIC, inbox.put)
        for event in client.get_events(TOPIC):
            printer.handle(event)
        finished_before = {f for f in printer.state.fits if f not in printer.running()}
        t0 = time.monotonic()
        while True:
            try:
                printer.handle(inbox.get(timeout=0.2))
            except queue.Empty:
                pass
            if (exit_when_done and set(printer.state.fits) - finished_before
                    and not printer.running()):
                break
            if timeout is not None and time.monotonic() - t0 >= timeout:
                break
    except KeyboardInterrupt:
        pass
    finally:
        try:
            client.unsubscribe_topic(TOPIC)
        except Exception:
            pass
        if own:
            client.close()
    return len(printer.state.fits)
