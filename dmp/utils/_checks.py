"""What the estimator checks (`dmp.utils.estimator_checks`) and the program checks
(`dmp.engine.testing`) share: comparing two results, and losing a worker on purpose."""

from __future__ import annotations

import numbers
import os
import signal
import time

import numpy as np


def assert_same(got: dict, want: dict, *, rtol=0.0, atol=0.0,
                what: str = "the result") -> None:
    """Assert that two results (dicts of arrays, numbers or other values) are the same.

    Numbers and numeric arrays must agree within ``rtol`` and ``atol`` (both 0: equal, NaN
    equal to NaN), each a number or a dict ``{entry: tolerance}`` (0 for an entry not in
    it), as ``numpy.isclose`` takes them: ``|got - want| <= atol + rtol * |want|``; other
    values must compare equal.

    Raises
    ------
    AssertionError
        Naming ``what``, the first entry that differs and by how much.
    """
    if set(got) != set(want):
        raise AssertionError(f"{what}: the entries differ: {sorted(set(got) ^ set(want))} are "
                             f"in only one of them")
    for name in want:
        _assert_value(got[name], want[name], rtol=tolerance(rtol, name),
                      atol=tolerance(atol, name), what=f"{what}: {name}")


def tolerance(tol, name) -> float:
    """The tolerance of entry ``name``: ``tol`` itself, or ``tol[name]`` (0 if absent)."""
    return float(tol.get(name, 0.0)) if isinstance(tol, dict) else float(tol)


def _is_numeric(a: np.ndarray) -> bool:
    return a.dtype.kind in "biufc"


def _assert_value(got, want, *, rtol, atol, what) -> None:
    if isinstance(want, dict) and isinstance(got, dict):
        assert_same(got, want, rtol=rtol, atol=atol, what=what)
        return
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)) and not (
            all(isinstance(v, numbers.Number) for v in want)):
        if len(got) != len(want):
            raise AssertionError(f"{what}: {len(got)} items, expected {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_value(g, w, rtol=rtol, atol=atol, what=f"{what}[{i}]")
        return
    if want is None or isinstance(want, (str, bytes)):
        if got != want:
            raise AssertionError(f"{what} is {got!r}, expected {want!r}")
        return
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        raise AssertionError(f"{what} has shape {g.shape}, expected {w.shape}")
    if not (_is_numeric(g) and _is_numeric(w)):
        if not np.array_equal(g, w):
            bad = np.flatnonzero(np.ravel(g != w))
            raise AssertionError(f"{what} differs at {bad.size} of {w.size} entries (first at "
                                 f"flat index {bad[0]}: {np.ravel(g)[bad[0]]}, expected "
                                 f"{np.ravel(w)[bad[0]]})")
        return
    close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    if not np.all(close):
        bad = np.flatnonzero(~np.ravel(close))
        diff = np.abs(np.ravel(g).astype(complex) - np.ravel(w).astype(complex))
        diff = np.where(np.isnan(diff), np.inf, diff)
        i = bad[int(np.argmax(diff[bad]))]
        bound = "exactly" if rtol == 0 and atol == 0 else f"within rtol={rtol:g}, atol={atol:g}"
        raise AssertionError(
            f"{what} differs at {bad.size} of {w.size} entries, not {bound}: the largest "
            f"difference is {diff[i].real:.3g} at flat index {i} ({np.ravel(g)[i]!s}, "
            f"expected {np.ravel(w)[i]!s})")


# ----------------------------------------------------------------------------- a lost worker


async def _die() -> None:  # pragma: no cover - runs in the worker it kills
    # a coroutine: `Client.run(..., wait=False)` takes nothing else
    os.kill(os.getpid(), signal.SIGKILL)


def _addresses(dask_scheduler=None) -> list:
    return sorted(dask_scheduler.workers)


def worker_addresses(client) -> list:
    """The addresses of the workers the scheduler knows now (asked of the scheduler itself:
    ``Client.scheduler_info`` may answer from a cache)."""
    return client.run_on_scheduler(_addresses)


def worker_names(client) -> dict:
    """``{address: name}`` of the workers the scheduler knows now."""
    def names(dask_scheduler=None):
        return {a: ws.name for a, ws in dask_scheduler.workers.items()}

    return client.run_on_scheduler(names)


def kill_worker(client, address) -> None:
    """SIGKILL the worker process at ``address`` (it runs the kill itself: the cluster need
    not be on this machine) and return once the scheduler has noticed it is gone."""
    client.run(_die, workers=[address], wait=False)
    wait_until(lambda: address not in worker_addresses(client), 60.0,
               f"the worker at {address} was sent SIGKILL but the scheduler still lists it")


def wait_for_workers(client, n: int, timeout: float = 60.0) -> None:
    """Return once the scheduler has ``n`` workers (a killed one restarted by its nanny)."""
    wait_until(lambda: len(worker_addresses(client)) >= n, timeout,
               f"the cluster did not get back to {n} workers (a killed worker's nanny should "
               f"restart it)", error=RuntimeError)


def wait_until(predicate, timeout: float, message: str, error=AssertionError) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise error(f"{message} within {timeout:g} s")
        time.sleep(0.05)


def victim(client) -> str:
    """The worker to kill: the one whose name sorts last (a partition lives on every worker
    of a cluster with at least as many partitions as workers)."""
    names = worker_names(client)
    return max(names, key=lambda a: str(names[a]))


def kill_when(client, due):
    """``(callback, fired)``: a fit callback that sends SIGKILL to one worker (`victim`) at the
    first round where ``due(round, metrics)`` holds, and at the next round waits until the
    scheduler no longer lists it, so the loss happens within the fit.  ``fired`` gets
    ``(round, address)`` once the kill is sent."""
    fired: list = []
    gone: list = []

    def kill(round, metrics):
        if not fired:
            if due(round, metrics):
                fired.append((round, victim(client)))
                client.run(_die, workers=[fired[0][1]], wait=False)
        elif not gone:
            wait_until(lambda: fired[0][1] not in worker_addresses(client), 60.0,
                       f"the worker at {fired[0][1]} was sent SIGKILL but the scheduler "
                       f"still lists it")
            gone.append(round)
        return False

    return kill, fired
