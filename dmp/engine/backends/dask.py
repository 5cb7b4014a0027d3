"""Dask backend: one resident actor per partition, pinned to a worker by *name*.

Partitions load their shards on the worker from the dataset URL (the client ships only the
program configuration, plans and small vectors).  Actor calls are direct worker RPCs rather
than tasks, which keeps short rounds cheap (BENCHMARKS.md, "Dask round costs").
"""

from __future__ import annotations

import errno
import math
import threading
import time
from collections import deque

import numpy as np

from ... import config
from ..program import update_for
from ..worker import ActorPartitionWorker, guard
from ...exceptions import (InsufficientMemoryError, RecoveryError, SchedulerLostError,
                           WorkerLostError, WorkerPausedError)
# the cluster connection's home is dmp.utils.cluster; imported from here before it moved
from ...utils.cluster import (QUIET_DASK_CONFIG, TLS_SETTINGS, connect,  # noqa: F401
                              quiet_local_cluster)
from ...utils.cluster import register_monitor as _register_monitor
from ...utils.text import plural
from .protocol import Backend


def collect_transient_bytes() -> int:
    """What bringing a partition's arrays to the driver at the end of a fit adds to a
    worker's memory (`DaskBackend.collect_stream`): twice a piece (the piece and its
    serialised frame) of ``dmp.memory.collect-piece-bytes``, which the memory check counts.
    A checkpoint's write adds no more (`dmp.engine.checkpoint.write_arrays` writes a piece
    and its encoded chunk at a time)."""
    return 2 * config.nbytes("dmp.memory.collect-piece-bytes")


_LOST_MARKERS = ("lost", "closed", "connection", "timed out", "no valid worker", "not found")


#: client states after its connection to the scheduler broke (distributed's Client.status)
_SCHEDULER_GONE = ("connecting", "closing", "closed")


def _scheduler_address(client) -> str:
    try:
        return str(client.scheduler.address)
    except Exception:  # noqa: BLE001 - a closed client may have no scheduler rpc left
        return "(unknown address)"


def scheduler_lost(client, address=None) -> SchedulerLostError | None:
    """A `SchedulerLostError` when ``client`` lost its scheduler, else None.  The client
    notices at once when the scheduler's connection closes (it then cancels every future and
    tries to reconnect for its ``timeout``); asking the scheduler instead would wait for that
    reconnection, or for ``distributed.comm.timeouts.connect``, before failing."""
    if getattr(client, "status", "running") not in _SCHEDULER_GONE:
        return None
    address = address or _scheduler_address(client)
    return SchedulerLostError(f"the Dask scheduler at {address} was lost (its connection "
                              f"closed; client status {client.status!r})", address=address)


def _identity_workers(client) -> dict:
    """The scheduler's ``{address: worker info}``, asked directly: ``Client.scheduler_info()``
    returns a cached identity that the client's periodic refresh (which omits workers) can
    overwrite between the fetch and the read, so it is sometimes empty on a loaded machine.
    Raises `SchedulerLostError` when the scheduler is gone."""
    lost = scheduler_lost(client)
    if lost is not None:
        raise lost
    try:
        return client.sync(client.scheduler.identity, n_workers=-1)["workers"]
    except Exception as exc:
        lost = scheduler_lost(client)
        if lost is not None:
            raise lost from exc
        raise


def cluster_workers(client) -> dict:
    """``{address: name}`` of the workers the scheduler knows now."""
    return {addr: w.get("name", addr) for addr, w in _identity_workers(client).items()}


#: Dask setting: how long the fit waits for a paused worker (memory above
#: ``distributed.worker.memory.pause``) it needs before it raises `WorkerPausedError`
PAUSE_TIMEOUT_KEY = "dmp.worker-pause-timeout"


def pause_timeout() -> float:
    """Seconds a fit waits for a paused worker (Dask setting ``dmp.worker-pause-timeout``,
    e.g. ``dask.config.set({"dmp.worker-pause-timeout": "2m"})`` or the environment
    variable ``DASK_DMP__WORKER_PAUSE_TIMEOUT=2m``; 30 s by default)."""
    return config.seconds(PAUSE_TIMEOUT_KEY)


def _pause_fraction(client, address):
    """The pause threshold (a fraction of the memory limit) of the worker at ``address``,
    or None when it cannot be asked."""
    def frac(dask_worker):
        return dask_worker.memory_manager.memory_pause_fraction

    try:
        return client.run(frac, workers=[address]).get(address)
    except Exception:  # noqa: BLE001 - only for the message
        return None


def _executing(client, address, key) -> bool:
    """Whether the worker at ``address`` is running task ``key`` now (a worker pauses new
    tasks only: one that paused while it loads a partition finishes loading it)."""
    def state(dask_worker, key=key):
        ts = dask_worker.state.tasks.get(key)
        return None if ts is None else ts.state

    try:
        return client.run(state, workers=[address]).get(address) == "executing"
    except Exception:  # noqa: BLE001 - unknown: count the pause
        return False


def paused_worker_error(client, address, info, waited) -> WorkerPausedError:
    """The `WorkerPausedError` for the worker at ``address`` (its scheduler identity
    ``info``), paused for ``waited`` seconds."""
    name = info.get("name", address)
    memory = int((info.get("metrics") or {}).get("memory") or 0)
    limit = int(info.get("memory_limit") or 0)
    frac = _pause_fraction(client, address)
    used = (f"its process uses {_bytes_text(memory)} of its {_bytes_text(limit)} memory "
            f"limit ({memory / limit:.0%})" if limit
            else f"its process uses {_bytes_text(memory)}")
    threshold = (f"Dask's pause threshold of {frac:.0%} (distributed.worker.memory.pause)"
                 if frac else "Dask's pause threshold (distributed.worker.memory.pause)")
    return WorkerPausedError(
        f"Dask worker {name!r} ({address}) has been paused for {waited:.0f} s: {used}, above "
        f"{threshold}, and a paused worker runs no new task, so the fit's partitions cannot "
        f"be placed on it. Give each worker more memory (a larger memory_limit), use more "
        f"workers so each holds less, or free that worker's memory (client.restart()); the "
        f"fit waits for a paused worker for {PAUSE_TIMEOUT_KEY} ({pause_timeout():g} s)")


def worker_base_bytes() -> int:
    """Resident memory of a worker before it holds a partition (``dmp.memory.worker-base``):
    Python, numpy/scipy, Dask, Numba and the kernels, plus a fit's fixed cost (BENCHMARKS.md,
    "Memory per worker")."""
    return config.nbytes("dmp.memory.worker-base")


def _bytes_text(n: float) -> str:
    """``n`` bytes as a message says it: GiB from 1 GiB up (two decimals), else whole MiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_partition_memory(program, specs, placement, limits) -> None:
    """Raise `InsufficientMemoryError` when the partitions placed on a worker need more than
    the part of its memory limit Dask lets it use (see `Program.partition_nbytes`)."""
    import math

    import dask

    estimates = [program.partition_nbytes(spec) for spec in specs]
    if not estimates or any(e is None for e in estimates):
        return
    frac = dask.config.get("distributed.worker.memory.pause", 0.8) or 0.95
    transient, base = collect_transient_bytes(), worker_base_bytes()
    need: dict = {}
    for name, est in zip(placement, estimates):
        # and, at the end of the fit, the piece of it being collected (`collect_stream`)
        need[name] = need.get(name, 0) + int(est) + transient
    short = [(name, n, limits[name]) for name, n in need.items()
             if limits.get(name) and n > limits[name] * frac - base]
    if not short:
        return
    total = sum(estimates) + transient * len(estimates)
    name, n, limit = max(short, key=lambda t: t[1] - t[2])
    usable = limit * frac - base
    workers_needed = math.ceil(total / usable) if usable > 0 else None
    per_worker = (max(need.values()) + base) / frac
    advice = (f"use at least {plural(workers_needed, 'worker')} with this memory limit, or "
              if workers_needed else "")
    parts = ("The partition needs" if len(estimates) == 1
             else f"The {len(estimates)} partitions need")
    raise InsufficientMemoryError(
        f"the model does not fit the workers' memory: the partition(s) placed on worker "
        f"{name!r} need about {_bytes_text(n)}, but its memory limit is {_bytes_text(limit)} (Dask pauses "
        f"a worker at {frac:.0%} of it, and about {_bytes_text(base)} go to Python, "
        f"Dask and Numba). {parts} about {_bytes_text(total)} in all: "
        f"{advice}workers with a memory limit of at least {_bytes_text(per_worker)} each.")


#: what distributed's own errors of reaching a worker say (plain ``OSError``, no errno:
#: "Timed out trying to connect to tcp://... after 30 s", "Unable to contact Actor's worker")
_COMM_MARKERS = ("connect", "contact", "closed", "timed out", "stream", "lost")
#: errnos of a network path to a worker that broke (its host died or became unreachable)
_NETWORK_ERRNOS = frozenset(getattr(errno, n) for n in (
    "ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "EPIPE", "ETIMEDOUT", "EHOSTUNREACH",
    "EHOSTDOWN", "ENETUNREACH", "ENETDOWN", "ENETRESET") if hasattr(errno, n))


def _is_worker_loss(exc: BaseException) -> bool:
    """Whether ``exc`` (raised by a call to a partition) means its worker is gone.

    Only what reaching a worker raises counts: distributed's ``CommClosedError``, a broken
    or refused connection, a timeout, a killed or missing worker.  An ``OSError`` the
    worker's own code raised -- a full disk (``ENOSPC``) or a permission error while it
    writes a checkpoint -- carries an errno and is that error, not a lost worker: taking it
    for one made a fit retry the same failing write until it "gave up after 5 worker
    losses"."""
    from distributed.comm.core import CommClosedError

    if isinstance(exc, (CommClosedError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return exc.errno in _NETWORK_ERRNOS
        return any(m in str(exc).lower() for m in _COMM_MARKERS)
    if isinstance(exc, TypeError) and "addresses should be" in str(exc):
        # a restriction to a worker *name* that just left the cluster (non-string names,
        # e.g. LocalCluster's 0, 1, 2, are then taken for malformed addresses)
        return True
    name = type(exc).__name__
    if name in ("KilledWorker", "NoValidWorkerError", "FutureCancelledError", "CancelledError"):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _LOST_MARKERS)


class DaskBackend(Backend):
    """Run every partition as an actor on a ``distributed`` cluster.

    Parameters
    ----------
    client : distributed.Client
        The client of the cluster.
    n_workers : int, optional
        Number of partitions; defaults to the number of workers.
    replacement_timeout : float
        Seconds to wait for a lost worker to come back (a Nanny restarts it) before its
        partitions are re-dealt to the surviving workers.
    call_timeout : float or None
        Longest wait for one round's result before the worker is declared lost.
    direct : bool
        Call the actors directly (client to worker) rather than through the scheduler; the
        client must be able to reach the workers (true on a LocalCluster and inside the
        cluster's network, e.g. a Kubernetes DaskJob).
    """

    kind = "dask"
    # capabilities (`Backend`): the partitions are actors on the cluster's workers, which
    # open the dataset themselves and run batches of rounds while the driver works
    needs_store = True
    runs_batches = True
    overlaps_rounds = True
    sends_events = True

    def __init__(self, client, n_workers=None, replacement_timeout=20.0, call_timeout=None,
                 direct=True):
        self.client = client
        self._scheduler_addr = _scheduler_address(client)
        self.direct = direct
        self._saved_direct = client.direct_to_workers
        self.replacement_timeout = replacement_timeout
        self.call_timeout = call_timeout
        names = self._worker_names()
        if not names:
            raise RuntimeError(f"the Dask cluster at {client.scheduler.address} has no workers")
        self.n_workers = int(n_workers) if n_workers else len(names)
        if self.n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self._initial_names = names
        self.actors = []
        self.placement: list = []
        self._event_lock = None
        self._events: deque = deque()
        self._flusher_started = False
        self._closed = False
        self._futures = []
        self._targets: list = []   # addresses of the partitions' workers
        #: (round, messages per partition) of ring messages possibly still in flight
        self._inbox = None
        #: the round of the last step issued while it is not gathered yet, and the last one
        self._open_round = None
        self._last_step = None
        self._program = None

    def workers_in_this_process(self) -> bool:
        """Whether the cluster's workers run in the driver's own process (a ``LocalCluster``
        with ``processes=False``: ``inproc://`` addresses)."""
        try:
            return any(str(a).startswith("inproc://") for a in cluster_workers(self.client))
        except Exception:
            return False

    @property
    def in_driver_process(self) -> bool:
        """The workers run in this process (`workers_in_this_process`)."""
        return self.workers_in_this_process()

    @property
    def n_partitions(self) -> int:
        return self.n_workers

    def _worker_names(self) -> list:
        return sorted(cluster_workers(self.client).values(), key=str)

    def _create(self, program, specs, names, exclude=frozenset()) -> None:
        self._inbox = None
        self._open_round = self._last_step = None
        self._program = program
        self.placement = [names[k % len(names)] for k in range(len(specs))]
        workers = {a: w for a, w in _identity_workers(self.client).items() if a not in exclude}
        address = {w.get("name", a): a for a, w in workers.items()}
        limits = {w.get("name", a): int(w.get("memory_limit") or 0) for a, w in workers.items()}
        check_partition_memory(program, specs, self.placement, limits)
        missing = [n for n in self.placement if n not in address]
        if missing:
            raise WorkerLostError(f"worker(s) {missing} left before the partitions were placed")
        # restricted to the *address*: a name restriction is resolved once at submission, so
        # either way a worker that dies now leaves its task waiting forever for an address
        # that never returns; the loop below notices and reports a worker loss instead
        targets = [address[n] for n in self.placement]
        self._targets = targets
        futs = [self.client.submit(ActorPartitionWorker, program, spec, k, actor=True,
                                   workers=[targets[k]], allow_other_workers=False,
                                   pure=False)
                for k, spec in enumerate(specs)]
        self._futures = futs  # keep the actor futures alive (released by _release_actors)
        try:
            self.actors = [self._await_partition(f, targets, targets[k])
                           for k, f in enumerate(futs)]
            if program.uses_ring:
                transport = config.choice("dmp.ring.transport", ("socket", "dask"))
                self._results(self._issue([(a, "set_peers", (self.actors, transport))
                                           for a in self.actors]))
        except Exception as exc:
            for f in futs:
                try:
                    f.cancel()
                except Exception:  # noqa: BLE001 - a client without its scheduler
                    pass
            if isinstance(exc, (WorkerLostError, WorkerPausedError, SchedulerLostError)):
                raise
            self._raise_if_scheduler_lost(exc)
            if _is_worker_loss(exc):
                raise WorkerLostError(f"a worker was lost while loading partitions: {exc}") from exc
            raise

    def _raise_if_scheduler_lost(self, exc=None) -> None:
        lost = scheduler_lost(self.client, self._scheduler_addr)
        if lost is not None:
            raise lost from exc

    def _await_partition(self, fut, targets, target=None):
        """``fut.result()``, but a worker loss among ``targets`` while waiting raises
        `WorkerLostError` instead of waiting forever, and ``target`` (the worker ``fut``
        runs on) staying paused by Dask for `pause_timeout` raises `WorkerPausedError`: a
        paused worker starts no task, and it may never unpause (its memory held by what
        it ran before), while it does not leave the cluster either."""
        limit = pause_timeout()
        paused_since = None
        # polled through a done-callback, not ``fut.result(timeout=...)``: distributed's
        # synchronous wait with a timeout can lose the outcome in a race and raise
        # UnboundLocalError (dask/distributed#8514; seen loading 8 partitions on 0.1-core
        # emulated workers); ``result()`` is called once the future is done
        done = threading.Event()
        fut.add_done_callback(lambda _: done.set())
        while True:
            if done.wait(config.seconds("dmp.worker-check.interval")) or fut.done():
                # the actor proxy binds to the current client as it is unpickled: without
                # this, to the default client (another cluster's, or none when this client
                # was made with set_as_default=False: every call then failed)
                with self.client.as_current():
                    return fut.result()
            workers = _identity_workers(self.client)
            gone = set(targets) - set(workers)
            if gone:
                raise WorkerLostError(f"worker(s) {sorted(gone)} left while loading "
                                      f"partitions")
            info = workers.get(target) or {}
            if info.get("status") == "paused" and not _executing(self.client, target, fut.key):
                now = time.monotonic()
                paused_since = now if paused_since is None else paused_since
                if now - paused_since >= limit:
                    raise paused_worker_error(self.client, target, info, now - paused_since)
            else:
                paused_since = None

    def start(self, program, specs) -> None:
        if self.direct:
            # actor calls go straight to the worker instead of through the scheduler (less
            # latency per round: BENCHMARKS.md, "Dask round costs"); restored in close()
            self.client.direct_to_workers = True
        self._create(program, specs, self._worker_names())

    def _release_actors(self) -> None:
        """Let the scheduler drop the partitions now.  Actor proxies sit in reference cycles
        inside distributed (closures of their method wrappers), so without an explicit
        release a partition can outlive the fit until the garbage collector runs, keeping
        its memory and its worker out of downscaling."""
        for fut in [*self._futures, *(getattr(a, "_future", None) for a in self.actors)]:
            try:
                if fut is not None:
                    fut.release()
            except Exception:
                pass
        self.actors, self._futures = [], []

    def _unreachable(self, addresses, timeout: float = 2.0) -> set:
        """Those of ``addresses`` where no worker answers now (the scheduler may still list
        a worker that just died for a moment)."""
        import asyncio

        async def probe(addr):
            try:
                await asyncio.wait_for(self.client.rpc(addr).identity(), timeout)
            except Exception:
                return addr
            return None

        async def probe_all():
            return await asyncio.gather(*(probe(a) for a in addresses))

        try:
            return {a for a in self.client.sync(probe_all) if a is not None}
        except Exception:
            return set()

    def restart(self, program, specs) -> None:
        """Re-create every partition after a worker loss: wait (up to `replacement_timeout`)
        until a live worker carries each name the partitions were on, else re-deal them
        over the live workers."""
        self._release_actors()
        self._raise_if_scheduler_lost()
        dead = self._unreachable(sorted(set(self._targets)))
        deadline = time.monotonic() + self.replacement_timeout
        want = set(map(str, self.placement)) or set(map(str, self._initial_names))

        def live_names():
            return sorted((n for a, n in cluster_workers(self.client).items()
                           if a not in dead), key=str)

        names = live_names()
        while time.monotonic() < deadline and not want <= set(map(str, names)):
            time.sleep(0.25)
            names = live_names()
        if not names:
            raise RecoveryError("no Dask workers left to recover the fit on")
        self._create(program, specs, names, exclude=dead)

    def expect_round(self, round: int) -> None:
        self._open_round = self._last_step = None
        self._results(self._issue([(a, "expect_round", (round,)) for a in self.actors]))

    def _issue(self, calls) -> list:
        """Start actor calls ``[(actor, method, args), ...]``; a dead actor raises already
        here (its proxy knows the worker is gone)."""
        futs = []
        for actor, method, args in calls:
            try:
                futs.append(getattr(actor, method)(*args))
            except Exception as exc:
                self._raise_if_scheduler_lost(exc)
                if _is_worker_loss(exc):
                    raise WorkerLostError(str(exc) or type(exc).__name__) from exc
                raise
        return futs

    def _results(self, futs) -> list:
        """Every call's result.  The first failure is raised as soon as it happens (a
        partition blocked on a dead peer -- a ring transfer -- must not hide the loss), and a
        partition's worker leaving the cluster is a loss even while its call has not failed:
        distributed's actor proxy answers a broken connection by waiting for the actor's task,
        which, pinned to an address that is gone, never finishes."""
        import asyncio

        async def one(f):
            return await f

        async def gather():
            tasks = [asyncio.ensure_future(one(f)) for f in futs]
            try:
                pending = set(tasks)
                while pending:
                    done, pending = await asyncio.wait(
                        pending, timeout=config.seconds("dmp.worker-check.interval"),
                        return_when=asyncio.FIRST_EXCEPTION)
                    for t in done:
                        if t.exception() is not None:
                            raise t.exception()
                    if pending and self._targets:
                        self._raise_if_scheduler_lost()
                        try:
                            info = await asyncio.wait_for(
                                self.client.scheduler.identity(n_workers=-1),
                                config.seconds("dmp.worker-check.timeout"))
                        except asyncio.TimeoutError:
                            self._raise_if_scheduler_lost()
                            continue   # a slow scheduler: check again next time
                        gone = set(self._targets) - set(info["workers"])
                        if gone:
                            raise WorkerLostError(f"worker(s) {sorted(gone)} left the cluster "
                                                  f"during the round")
                return [t.result() for t in tasks]
            finally:
                for t in tasks:
                    if not t.done():
                        t.cancel()

        try:
            return list(self.client.sync(gather, callback_timeout=self.call_timeout))
        except (WorkerLostError, SchedulerLostError):
            raise
        except Exception as exc:
            self._raise_if_scheduler_lost(exc)
            if _is_worker_loss(exc):
                raise WorkerLostError(str(exc) or type(exc).__name__) from exc
            raise

    def _inbox_for(self, k: int):
        return None if self._inbox is None else (self._inbox[0], self._inbox[1][k])

    def _settle_inbox(self) -> None:
        """Before a call other than a step touches the partitions: every ring message of
        the last gathered round has arrived."""
        if self._inbox is not None:
            self._results(self._issue([(a, "await_inbox", (self._inbox_for(k),))
                                       for k, a in enumerate(self.actors)]))
            self._inbox = None

    def _declared_inbox(self, round: int):
        """Ring messages per partition the program declares for ``round`` (or None)."""
        return self._program.ring_inbox(round) if self._program.uses_ring else None

    def _open_inbox(self, round: int) -> None:
        """Before issuing ``round``: when the round before is still running, its messages
        are the ones the program declares (the runner overlaps ring rounds only when it
        declares them)."""
        if self._inbox is None and self._open_round is not None:
            if self._open_round != round - 1:
                raise RuntimeError(f"step {round} issued after step {self._open_round}")
            counts = self._declared_inbox(round - 1)
            if counts is not None:
                self._inbox = (round - 1, list(counts))

    def step(self, round, updates, plans):
        self._open_inbox(round)
        calls = [(a, "step", (round, guard(update_for(updates, k)), guard(plans[k]),
                              self._inbox_for(k)))
                 for k, a in enumerate(self.actors)]
        self._inbox = None
        self._open_round = self._last_step = round
        return self._issue(calls)

    def step_batch(self, round, updates, plans_seq):
        """Rounds ``round .. round + len(plans_seq) - 1`` in one call per partition (see
        `Program.batch_rounds`); gather with `gather_batch`."""
        last = round + len(plans_seq) - 1
        within = [self._declared_inbox(r) for r in range(round, last)]
        if any(c is None for c in within):
            raise RuntimeError(f"rounds {round}..{last} run as one batch but the program does "
                               f"not declare their ring messages (Program.ring_inbox)")
        self._open_inbox(round)
        calls = [(a, "step_batch", (round, guard(update_for(updates, k)),
                                    guard([p[k] for p in plans_seq]), self._inbox_for(k),
                                    [c[k] for c in within]))
                 for k, a in enumerate(self.actors)]
        self._inbox = None
        self._open_round = self._last_step = last
        return self._issue(calls)

    def gather_batch(self, handle) -> list[list]:
        """The results of a `step_batch`: one list (per partition) per round."""
        per_partition = self._results(handle)
        rounds = [list(rs) for rs in zip(*per_partition)]
        for results in rounds[:-1]:
            self._check_declared(results)
        self._close_round(rounds[-1])
        return rounds

    def _sent_counts(self, results) -> list[int]:
        counts = [0] * len(self.actors)
        for res in results:
            for dest in res.get("sent_to", ()):
                counts[dest] += 1
        return counts

    def _check_declared(self, results) -> None:
        round = results[0]["round"]
        declared = self._declared_inbox(round)
        counts = self._sent_counts(results)
        if declared is not None and list(declared) != counts:
            raise RuntimeError(f"round {round}: the program declared ring messages "
                               f"{list(declared)} per partition, the pushes sent {counts}")

    def gather(self, handle):
        results = self._results(handle)
        self._close_round(results)
        return results

    def _close_round(self, results) -> None:
        """Bookkeeping of the ring messages of a gathered round (the last of a batch)."""
        counts = self._sent_counts(results)
        round = results[0]["round"]
        if round == self._open_round:
            # no later step waits for these messages yet: the next call does
            self._open_round = None
            if any(counts):
                self._inbox = (round, counts)
        else:
            self._check_declared(results)

    def apply_all(self, updates) -> None:
        self._settle_inbox()
        # with rounds still in flight, after the last of them (actor calls may overtake)
        self._results(self._issue([(a, "apply", (guard(update_for(updates, k)),
                                                 self._last_step))
                                   for k, a in enumerate(self.actors)]))

    def save_all(self, paths) -> list:
        self._settle_inbox()
        return self._results(self._issue([(a, "save", (p,))
                                          for a, p in zip(self.actors, paths)]))

    def restore_all(self, paths, manifests=None) -> None:
        self._settle_inbox()
        manifests = manifests or [None] * len(paths)
        self._results(self._issue([(a, "restore", (p, m))
                                   for a, p, m in zip(self.actors, paths, manifests)]))

    def collect_all(self, method: str | None = None) -> list[dict]:
        """Every partition's arrays (``program.partition_arrays``, or ``program.<method>``),
        streamed (`collect_stream`)."""
        out: list[dict] = []

        def start(layouts):
            out[:] = [{k: np.empty(shape, dtype) for k, (shape, dtype) in lay.items()}
                      for lay in layouts]

        def sink(k, name, row, piece):
            a = out[k][name]
            if a.ndim == 0:
                a[...] = piece
            else:
                a[row:row + len(piece)] = piece

        self.collect_stream(sink, method=method, start=start)
        return out

    def collect_stream(self, sink, method: str | None = None, start=None,
                       piece_bytes: int | None = None) -> None:
        """Bring the partitions' arrays to the driver in pieces of about ``piece_bytes``
        (``dmp.memory.collect-piece-bytes``): ``start(layouts)`` receives every partition's
        ``{name: (shape, dtype)}``, then ``sink(k, name, first_row, piece)`` each piece (one
        piece per partition in flight: a worker copies at most one piece at a time, so a
        partition sized near its worker's memory limit is collected without a peak).  A
        worker lost meanwhile raises `WorkerLostError`, as in a round."""
        piece_bytes = piece_bytes or config.nbytes("dmp.memory.collect-piece-bytes")
        self._settle_inbox()
        layouts = self._results(self._issue([(a, "collect_layout", (method,))
                                             for a in self.actors]))
        if start is not None:
            start(layouts)
        queues = []
        for lay in layouts:
            q = deque()
            for name, (shape, dtype) in lay.items():
                if len(shape) == 0:
                    q.append((name, 0, 1))
                    continue
                row = max(1, int(np.dtype(dtype).itemsize * math.prod(shape[1:])))
                step = max(1, piece_bytes // row)
                for s in range(0, shape[0], step):
                    q.append((name, s, min(s + step, shape[0])))
            queues.append(q)
        while any(queues):
            wave = [(k, q.popleft()) for k, q in enumerate(queues) if q]
            pieces = self._results(self._issue([(self.actors[k], "collect_piece", p)
                                                for k, p in wave]))
            for (k, (name, s, _)), piece in zip(wave, pieces):
                sink(k, name, s, piece)
        self._results(self._issue([(a, "collect_end", ()) for a in self.actors]))

    def call_all(self, method, *args) -> list:
        self._settle_inbox()
        return self._results(self._issue([(a, "call", (method, *args)) for a in self.actors]))

    def worker_pids(self) -> list[int]:
        infos = self._results(self._issue([(a, "info", ()) for a in self.actors]))
        return [i["pid"] for i in infos]

    def log_event(self, msg: dict, wait: bool = False) -> None:
        """Queue ``msg`` for the scheduler's event log (topic "dmp").

        The round loop only appends to a queue: a task on the client's event loop sends what
        accumulated, in order, as one message every ``dmp.monitor-flush-interval`` (a scheduler
        round trip per round slows short rounds: BENCHMARKS.md, "Live monitor overhead").
        ``wait=True`` sends the queue now and returns once the scheduler has it.
        """
        self._events.append(msg)
        if wait:
            self.log_event_flush()
            return
        try:
            if not self._flusher_started:
                self._flusher_started = True
                self.client.loop.add_callback(self._flush_loop)
        except Exception:  # telemetry must never break a fit
            pass

    async def _flush_events(self) -> None:
        import asyncio

        if self._event_lock is None:
            self._event_lock = asyncio.Lock()
        async with self._event_lock:
            if not self._events:
                return
            batch = []
            while self._events:
                batch.append(self._events.popleft())
            msg = batch[0] if len(batch) == 1 else {"kind": "batch", "events": batch}
            try:
                await self.client.scheduler.log_event(topic="dmp", msg=msg)
            except Exception:
                pass

    def log_event_flush(self) -> None:
        """Send the queued events now (waits for the scheduler; none when it is gone)."""
        if scheduler_lost(self.client) is not None:
            self._events.clear()
            return
        try:
            self.client.sync(self._flush_events, callback_timeout=10)
        except Exception:
            pass

    async def _flush_loop(self) -> None:
        import asyncio

        while not self._closed:
            await asyncio.sleep(config.seconds("dmp.monitor-flush-interval"))
            await self._flush_events()

    def register_monitor(self) -> bool:
        """Register dmp's monitor plugin on the scheduler (idempotent); see `dmp.monitor`."""
        return _register_monitor(self.client)

    def describe(self) -> str:
        return (f"Dask backend, {self.n_workers} partition(s) on workers "
                f"{', '.join(map(str, self.placement))} ({self.client.scheduler.address})")

    def close(self) -> None:
        if self._events:
            self.log_event_flush()
        self._closed = True
        if self._program is not None and self._program.uses_ring and self.actors:
            try:   # their ring connections, which would otherwise stay open until collected
                self._results(self._issue([(a, "close_ring", ()) for a in self.actors]))
            except Exception:  # noqa: BLE001 - a partition already lost has none to close
                pass
        self._release_actors()
        self.client.direct_to_workers = self._saved_direct
