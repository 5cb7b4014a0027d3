"""The resident holder of one model partition (a Dask actor, or an in-process object)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .. import config
from ..exceptions import CheckpointError
from ..utils.heap import reuse_heap
from .checkpoint import expected_nbytes, read_arrays, write_arrays
from . import ring
from .comm import payload_nbytes
from .program import Sends

logger = logging.getLogger(__name__)


# arrays of a ring message larger than ``dmp.ring.piece-bytes`` travel in pieces of about
# that size, each copied into place on arrival: a whole array sent in one message costs the
# receiver several transient copies (receive buffers, frame merge, a writable copy), which a
# model-parallel partition sized near its worker's memory limit cannot afford.  A partition
# waits ``dmp.ring.timeout`` for a ring message the driver says is on its way (every sender
# had already handed it to the network when the driver said so; a lost sender is noticed by
# the driver well before this)

#: the worker's comm handler that ring messages travel through (see `ActorPartitionWorker`)
RING_HANDLER = "dmp_ring"


@dataclass(frozen=True)
class _Piecewise:
    """Stands in a ring message for an array sent ahead in pieces."""
    key: tuple


class _Guarded:
    """An actor call's argument pickled on its own: on the worker it becomes the value, or
    `_LoadFailed` when it cannot be unpickled there, which the called method raises as its
    error (`unguard`).  Unguarded, such an argument fails inside distributed's handling of
    the call, whose future then never resolves: the fit hangs."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        import cloudpickle

        buffers: list = []   # numpy data travels out of band, as with distributed's own pickling
        blob = cloudpickle.dumps(self.value, protocol=5, buffer_callback=buffers.append)
        return _load_guarded, (blob, buffers)


@dataclass(frozen=True)
class _LoadFailed:
    error: str


def _load_guarded(blob, buffers):
    import pickle

    try:
        # a read-only frame would give read-only arrays, which a program may write to
        buffers = [bytearray(b) if memoryview(b).readonly else b for b in buffers]
        return pickle.loads(blob, buffers=buffers)
    except Exception as exc:  # noqa: BLE001 - raised by the call (`unguard`)
        return _LoadFailed(f"{type(exc).__name__}: {exc}")


def guard(value):
    """Wrap an actor call's argument (None passes as it is); see `_Guarded`."""
    return None if value is None else _Guarded(value)


def unguard(value):
    """The argument `guard` wrapped, or the error of unpickling it on this worker."""
    if isinstance(value, _Guarded):   # an in-process worker: the call was never pickled
        return value.value
    if isinstance(value, _LoadFailed):
        raise RuntimeError(f"a call's argument could not be unpickled on this worker "
                           f"({value.error}); plans and updates must be objects the "
                           f"workers can import")
    return value


def _map_top(payload, fn):
    """``fn(slot, value)`` applied to each top-level value of a tuple, list or dict (slot
    ``(i,)`` or ``(key,)``), or to the payload itself (slot ``()``); same container back."""
    if isinstance(payload, (tuple, list)):
        return type(payload)(fn((i,), v) for i, v in enumerate(payload))
    if isinstance(payload, dict):
        return {k: fn((k,), v) for k, v in payload.items()}
    return fn((), payload)


def _split_large(payload, key):
    """``(payload with large arrays replaced by _Piecewise, [(key, array), ...])``; looks at
    the payload itself and at the top level of a tuple, list or dict."""
    pieces = []
    piece_bytes = config.nbytes("dmp.ring.piece-bytes")

    def take(slot, v):
        if isinstance(v, np.ndarray) and v.ndim >= 1 and v.nbytes > piece_bytes:
            pieces.append((key + slot, v))
            return _Piecewise(key + slot)
        return v

    return _map_top(payload, take), pieces


def _assemble(payload, arrays: dict):
    """Put the arrays received in pieces back in their places in a ring message."""
    return _map_top(payload, lambda _, v: arrays.pop(v.key) if isinstance(v, _Piecewise)
                    else v)


class PartitionWorker:
    """Holds one partition's data and variables and runs the worker side of a Program."""

    def __init__(self, program, spec, index: int):
        self.program = program
        self.index = index
        t0 = time.perf_counter()
        self.state = program.init_partition(spec)
        self.init_s = time.perf_counter() - t0
        self.peers: list | None = None

    def set_peers(self, peers: list) -> None:
        """The other partitions (objects in-process, actor handles on Dask), by index."""
        self.peers = list(peers)

    def deliver(self, round: int, src: int, payload) -> None:
        """A ring message from partition ``src``'s push of ``round``."""
        self.program.receive(self.state, round, src, payload)

    def _send(self, dest: int, round: int, payload) -> None:
        self.peers[dest].deliver(round, self.index, payload)

    def _deliver_own(self, round: int, payload) -> None:
        """A ring message of this partition's to itself."""
        PartitionWorker.deliver(self, round, self.index, payload)

    def _send_all(self, round: int, messages: dict) -> tuple[int, list]:
        """Hand the messages over; returns their bytes and the partitions they went to
        (other than this one)."""
        if messages and self.peers is None:
            raise RuntimeError("a push sent ring messages but the partitions are not "
                               "connected (set Program.uses_ring = True)")
        nbytes = 0
        sent_to = []
        for dest, payload in messages.items():
            if dest == self.index:
                self._deliver_own(round, payload)
            else:
                self._send(int(dest), round, payload)
                nbytes += payload_nbytes(payload)
                sent_to.append(int(dest))
        return nbytes, sent_to

    def info(self) -> dict:
        return {"index": self.index, "pid": os.getpid(), "init_s": self.init_s}

    def step(self, round: int, update, plan) -> dict:
        """Apply the pending pull result (if any), then push for ``round``: a batch of one
        round (`Program.close_batch`)."""
        return self.close_batch([self.push_round(round, update, plan)])[0]

    def close_batch(self, results: list[dict]) -> list[dict]:
        """A batch's results, their partials as `Program.close_batch` hands them back."""
        partials = self.program.close_batch(self.state, results[0]["round"],
                                            [res["partial"] for res in results])
        for res, partial in zip(results, partials, strict=True):
            res["partial"] = partial
        return results

    def batch_round(self, round: int, update, plan, t0: float) -> dict:
        """`push_round` as a batch reports each of its rounds: with the round's time since
        ``t0`` (``step_s``) and when it ended on the wall clock (``t_end``, comparable with
        the driver's: the driver learns of a batch's rounds only once the whole batch ran)."""
        res = self.push_round(round, update, plan)
        res["step_s"] = time.perf_counter() - t0
        res["t_end"] = time.time()
        return res

    def push_round(self, round: int, update, plan) -> dict:
        """`step` without `Program.close_batch`: one round of a batch."""
        if update is not None:
            self.program.apply(self.state, update)
        t0 = time.perf_counter()
        partial = self.program.push(self.state, plan)
        push_s = time.perf_counter() - t0
        ring = 0
        ring_s = 0.0
        sent_to: list = []
        if isinstance(partial, Sends):
            t1 = time.perf_counter()
            ring, sent_to = self._send_all(round, partial.messages)
            ring_s = time.perf_counter() - t1
            partial = partial.partial
        return {"partial": partial, "push_s": push_s, "round": round, "bytes_ring": ring,
                "ring_s": ring_s, "sent_to": sent_to}

    def apply(self, update) -> None:
        if update is not None:
            self.program.apply(self.state, update)

    def save(self, path: str) -> dict:
        """Write the partition's arrays; return their manifest (shapes, checksums)."""
        return write_arrays(path, self.program.checkpoint_arrays(self.state))

    def restore(self, path: str, manifest: dict | None = None) -> None:
        """Restore from a checkpoint, its arrays checked against ``manifest`` and their
        declared sizes against this partition's own state before anything is read
        (`dmp.engine.checkpoint.read_arrays`)."""
        try:
            expected = expected_nbytes(self.program.checkpoint_arrays(self.state))
        except Exception:  # a state that cannot list its arrays before a restore: no bound
            expected = None
        arrays = read_arrays(path, manifest=manifest, expected=expected)
        try:
            self.program.restore_partition(self.state, arrays)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"checkpoint group {path!r} does not fit this partition: "
                                  f"{exc}") from exc

    def collect(self) -> dict:
        return self.program.partition_arrays(self.state)

    def collect_layout(self, method: str | None = None) -> dict:
        """Start a streamed collection (`collect_piece`): hold the arrays of
        ``program.partition_arrays(state)`` (or ``program.<method>(state)``, e.g. views of
        the factors) and return their ``{name: (shape, dtype)}``."""
        arrays = (self.program.partition_arrays(self.state) if method is None
                  else getattr(self.program, method)(self.state))
        self._collecting = {k: np.asarray(v) for k, v in arrays.items()}
        return {k: (tuple(v.shape), v.dtype.str) for k, v in self._collecting.items()}

    def collect_piece(self, name: str, start: int, stop: int):
        """Rows ``start:stop`` of a held array, as one contiguous copy: a whole array
        would be copied (and its copy serialised) at once, which a partition sized near its
        worker's memory limit cannot afford."""
        a = self._collecting[name]
        return np.ascontiguousarray(a if a.ndim == 0 else a[start:stop])

    def collect_end(self) -> None:
        self._collecting = None

    def call(self, method: str, *args):
        """Run ``program.<method>(state, *args)`` on the worker (for tests and tools)."""
        return getattr(self.program, method)(self.state, *args)


async def _ring_handler(comm, worker):
    """A worker's end of ring connections of the ``dask`` transport: one-way messages from a
    partition on another (or the same) worker, taken in the order sent and handed to the
    partition they name."""
    from distributed.comm import CommClosedError
    from distributed.core import Status

    while True:
        try:
            msg = await comm.read()
        except (CommClosedError, OSError):
            return Status.dont_reply
        partition = worker.state.actors.get(msg["to"])
        if partition is None:   # released since (its fit ended or is being recovered)
            continue
        try:
            if msg["kind"] == "piece":
                partition.receive_piece(msg["key"], msg["start"], msg["piece"], msg["shape"],
                                        msg["dtype"])
            else:
                await partition.deliver(msg["round"], msg["src"], msg["payload"])
        except Exception as exc:   # noqa: BLE001 - reported by the receiving partition
            partition.ring_failed_now(exc)


class ActorPartitionWorker(PartitionWorker):
    """Dask actor flavour: ``step`` is async so rounds kept in flight run in round order.

    Un-awaited actor calls can reach the worker out of order, so every call carries its
    round number and waits for its predecessor; the computation itself runs in a thread
    (the kernels release the GIL) so the worker's event loop stays responsive.

    Ring messages travel worker to worker as one-way messages on one connection per pair of
    partitions, not as actor calls: a call costs both workers its reply, and on a machine
    whose cores the workers share that CPU time is on the critical path (BENCHMARKS.md,
    "Ring messages without replies").  The connection is a plain socket written by the push
    thread (`dmp.engine.ring`, the ``socket`` transport of ``dmp.ring.transport``) or a Dask
    comm to the worker's `RING_HANDLER` (``dask``).  A message is
    not waited for -- the round's barrier and the driver's pull overlap its transfer -- and
    the driver passes each partition the number of messages to wait for before it touches
    its state again (`await_inbox`): the program's declared count (`Program.ring_inbox`)
    when the next round is issued while this one still runs, else what the round's results
    say was sent to it.  A failure to take a message in is raised by the receiving
    partition's next call, a failure to send one by the sender's.
    """

    def __init__(self, program, spec, index: int):
        from distributed import get_worker

        reuse_heap()                      # before the partition's first temporaries
        super().__init__(program, spec, index)
        # this partition's own thread for its pushes, applies and inbox waits: a batch blocks
        # its thread while it waits for the other partitions' messages, so partitions sharing
        # the event loop's few default threads could each wait for one that never started
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"dmp-partition-{index}")
        weakref.finalize(self, self._thread.shutdown, False)
        worker = self._worker = get_worker()
        # the handler outlives this partition: it must not hold it (nor its state)
        worker.handlers.setdefault(RING_HANDLER, lambda comm: _ring_handler(comm, worker))
        worker.handlers.setdefault(ring.ENDPOINT_HANDLER,
                                   lambda: ring.server_for(worker).endpoint)
        self._next_round = None
        self._cond = None
        self._incoming: dict = {}
        self._unacked: list = []          # messages handed to the event loop, not yet sent
        self._arrived: dict = {}          # ring messages received, by round
        # notified on each arrival; its lock also keeps one message's receive at a time
        self._arrival = threading.Condition()
        self._awaited = None              # (round, n) a thread waits for, if one does
        self._ring_error = None           # the first failure to take a message in or send one
        self._transport = "dask"
        self._comms: dict = {}            # peer index -> open ring connection (dask)
        self._comm_locks: dict = {}
        self._sockets: dict = {}          # peer index -> open ring socket (socket)
        self._encoded: tuple = (None, None, None)   # the last payload sent, encoded

    def expect_round(self, round: int) -> None:
        self._next_round = round

    def _order_cond(self):
        """The condition rounds (and applies sent while rounds run) wait on, in order."""
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def set_peers(self, peers: list,  # type: ignore[override]
                        transport: str = "dask") -> None:
        """The other partitions, and how to send them ring messages: ``"socket"`` (where
        the workers talk plain TCP; else as ``"dask"``) or ``"dask"``."""
        await self.close_ring()
        PartitionWorker.set_peers(self, peers)
        self._transport = ("socket" if transport == "socket"
                           and self._worker.address.startswith("tcp://") else "dask")

    async def close_ring(self) -> None:
        """Close this partition's ring connections (the receiving ends then stop)."""
        sockets, self._sockets = self._sockets, {}
        for sock in sockets.values():
            if sock is not None:
                sock.close()
        comms, self._comms = self._comms, {}
        for comm in comms.values():
            try:
                await comm.close()
            except Exception:  # noqa: BLE001 - a peer already gone
                pass

    async def deliver(self, round: int, src: int, payload) -> None:  # type: ignore[override]
        # on the event loop, so it lands while this worker's own push runs in its thread
        self.deliver_now(round, src, _assemble(payload, self._incoming))

    def deliver_now(self, round: int, src: int, payload) -> None:
        """A ring message from partition ``src``'s push of ``round`` (from any thread)."""
        with self._arrival:
            PartitionWorker.deliver(self, round, src, payload)
            n = self._arrived[round] = self._arrived.get(round, 0) + 1
            # the waiting thread is woken once, by the message it waits for last
            if self._awaited is None or self._awaited == (round, n):
                self._arrival.notify_all()

    def _deliver_own(self, round: int, payload) -> None:
        with self._arrival:   # not counted: an inbox counts the messages of the others
            PartitionWorker.deliver(self, round, self.index, payload)

    def _send_all(self, round: int, messages: dict) -> tuple[int, list]:
        try:
            return PartitionWorker._send_all(self, round, messages)
        finally:
            self._encoded = (None, None, None)   # not kept alive until the next round

    def ring_failed_now(self, exc: BaseException) -> None:
        """A ring message could not be taken in or sent: the next call raises ``exc``."""
        with self._arrival:
            if self._ring_error is None:
                self._ring_error = exc
            self._arrival.notify_all()

    async def await_inbox(self, inbox) -> None:
        """Wait until ``inbox = (round, n)``: the ``n`` ring messages sent to this
        partition in ``round`` have been received (None: nothing to wait for).  Also
        raises the failure of any earlier message of this partition's own, sent or
        received."""
        await self._in_thread(self._wait_inbox, inbox)

    async def _in_thread(self, fn, *args):
        """``fn(*args)`` on this partition's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _wait_inbox(self, inbox) -> None:
        """`await_inbox`, in a thread other than the event loop's."""
        unsent, self._unacked = self._unacked, []
        for fut in unsent:
            if fut.done():
                fut.result()
            else:
                self._unacked.append(fut)
        if self._ring_error is not None:
            raise self._ring_error
        if inbox is None:
            return
        round, n = inbox
        wait_s = config.seconds("dmp.ring.timeout")
        with self._arrival:
            self._awaited = (round, n)
            try:
                arrived = self._arrival.wait_for(lambda: self._arrived.get(round, 0) >= n
                                                 or self._ring_error is not None, wait_s)
            finally:
                self._awaited = None
            if not arrived:
                raise RuntimeError(f"partition {self.index}: {n} ring message(s) of round "
                                   f"{round} were sent to it, {self._arrived.get(round, 0)} "
                                   f"arrived within {wait_s:.0f} s (dmp.ring.timeout)")
            if self._ring_error is not None:
                raise self._ring_error
            for r in [r for r in self._arrived if r <= round]:
                del self._arrived[r]

    def receive_piece(self, key, start: int, piece, shape, dtype) -> None:
        """Rows ``start:`` of an array of a ring message that follows (see `_Piecewise`)."""
        buf = self._incoming.get(key)
        if buf is None:
            # untouched pages cost nothing: the array grows in memory as its pieces land
            buf = self._incoming[key] = np.empty(shape, dtype=dtype)
        buf[start:start + len(piece)] = piece

    async def _write(self, dest: int, msg: dict) -> None:
        """Send ``msg`` to partition ``dest`` on this partition's connection to it (opened
        on first use); messages to one partition leave in the order they were posted."""
        from distributed.comm import connect

        lock = self._comm_locks.get(dest)
        if lock is None:
            lock = self._comm_locks[dest] = asyncio.Lock()
        async with lock:
            peer = self.peers[dest]
            comm = self._comms.get(dest)
            if comm is None or comm.closed():
                comm = await connect(peer._address, **self._worker.connection_args)
                await comm.write({"op": RING_HANDLER, "reply": False})
                self._comms[dest] = comm
            msg["to"] = peer.key
            await comm.write(msg)

    def _post(self, dest: int, msg: dict):
        """Hand ``msg`` to the event loop (from the push's thread); a concurrent future."""
        return asyncio.run_coroutine_threadsafe(self._write(dest, msg),
                                                self._worker.loop.asyncio_loop)

    def _socket_to(self, dest: int):
        """This partition's socket to partition ``dest`` (connected on first use); None
        where that cannot be done, after a warning: messages to it then go through Dask."""
        if dest in self._sockets:
            return self._sockets[dest]
        import dask
        from dask.utils import parse_timedelta

        timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")
        sock = None
        try:
            endpoint = asyncio.run_coroutine_threadsafe(
                self._worker.rpc(self.peers[dest]._address).dmp_ring_endpoint(),
                self._worker.loop.asyncio_loop).result(timeout)
            sock = ring.connect(tuple(endpoint[:2]) + (bytes(endpoint[2]),), timeout)
        except Exception as exc:  # noqa: BLE001 - unreachable port, or a peer without one
            logger.warning("dmp ring: no socket to partition %d at %s (%s: %s); its messages "
                           "go through Dask's comm", dest, self.peers[dest]._address,
                           type(exc).__name__, exc)
        self._sockets[dest] = sock
        return sock

    def _send(self, dest: int, round: int, payload) -> None:
        if self._transport == "socket":
            sock = self._socket_to(dest)
            if sock is not None:
                if self._ring_error is None:   # else raised by this partition's next call
                    try:
                        # one payload sent to several partitions is pickled once
                        if self._encoded[0] is not payload or self._encoded[1] != round:
                            self._encoded = (payload, round,
                                             ring.encode(round, self.index, payload))
                        ring.send_message(sock, self.peers[dest].key, round, self.index,
                                          payload, self._encoded[2])
                    except Exception as exc:  # noqa: BLE001 - raised by its next call
                        self.ring_failed_now(exc)
                return
        self._send_dask(dest, round, payload)

    def _send_dask(self, dest: int, round: int, payload) -> None:
        # from the push's thread: large arrays leave piece by piece before the push returns
        # (at most dmp.ring.pieces-in-flight handed to the network at once), the message itself
        # is checked later (`await_inbox`), its arrival awaited by the peer
        from distributed.protocol import to_serialize

        payload, arrays = _split_large(payload, (self.index, round))
        piece_bytes = config.nbytes("dmp.ring.piece-bytes")
        in_flight = config.count("dmp.ring.pieces-in-flight")
        for key, arr in arrays:
            arr = np.ascontiguousarray(arr)
            rows = max(1, piece_bytes // max(arr[0].nbytes, 1))
            inflight = []
            for start in range(0, arr.shape[0], rows):
                inflight.append(self._post(dest, {
                    "kind": "piece", "key": key, "start": start, "shape": arr.shape,
                    "dtype": arr.dtype.str, "piece": to_serialize(arr[start:start + rows])}))
                if len(inflight) >= in_flight:
                    inflight.pop(0).result()
            for fut in inflight:
                fut.result()
        self._unacked.append(self._post(dest, {"kind": "message", "round": round,
                                               "src": self.index,
                                               "payload": to_serialize(payload)}))

    async def apply(self, update, after=None) -> None:  # type: ignore[override]
        """`PartitionWorker.apply`, once the step of round ``after`` (when given: a round
        still in flight when the driver sent this) ran here."""
        if after is not None:
            cond = self._order_cond()
            async with cond:
                await cond.wait_for(
                    lambda: self._next_round is None or self._next_round > after)
        await self._in_thread(PartitionWorker.apply, self, unguard(update))

    def _run_batch(self, round: int, update, plans, inbox, inboxes,
                   t_first: float) -> list[dict]:
        """(In the push thread) `PartitionWorker.step` for rounds ``round``,
        ``round + 1``, ..., closed as one batch (`Program.close_batch`); the first waits for
        ``inbox`` (see `await_inbox`), each round after it for the ``inboxes[j - 1]`` ring
        messages of the round before (the first one's wait began at ``t_first``)."""
        out = []
        for j, plan in enumerate(plans):
            t0 = time.perf_counter() if j else t_first
            self._wait_inbox((round + j - 1, inboxes[j - 1]) if j else inbox)
            # the round's time here: waiting for the messages, the push, handing its own over
            out.append(self.batch_round(round + j, update if j == 0 else None, plan, t0))
        return self.close_batch(out)

    async def step_batch(self, round: int, update, plans, inbox=None,
                         inboxes=()) -> list[dict]:
        """Rounds ``round .. round + len(plans) - 1`` in one call (`Program.batch_rounds`):
        `step` for the first, then each next round as soon as the ring messages of the one
        before (``inboxes``: their number per round) arrived here."""
        cond = self._order_cond()
        async with cond:
            await cond.wait_for(
                lambda: self._next_round is None or self._next_round == round)
        try:
            t_first = time.perf_counter()
            # the list guarded whole (a batch) or each plan (`step`)
            update, plans = unguard(update), [unguard(p) for p in unguard(plans)]
            return await self._in_thread(self._run_batch, round, update, plans, inbox,
                                         list(inboxes), t_first)
        finally:
            async with self._cond:
                self._next_round = round + len(inboxes) + 1
                self._cond.notify_all()

    async def step(self, round: int, update, plan,  # type: ignore[override]
                   inbox=None) -> dict:
        """`PartitionWorker.step` once round ``round - 1`` ran here and ``inbox`` (see
        `await_inbox`) arrived: a batch of one round."""
        return (await self.step_batch(round, update, [plan], inbox))[0]
