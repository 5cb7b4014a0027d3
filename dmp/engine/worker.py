"""The resident holder of one model partition (a Dask actor, or an in-process object)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import numpy as np

from .checkpoint import read_arrays, write_arrays
from .comm import payload_nbytes
from .program import Sends


#: arrays of a ring message larger than this travel in pieces of about this size, each copied
#: into place on arrival: a whole array sent in one message costs the receiver several
#: transient copies (receive buffers, frame merge, a writable copy), which a model-parallel
#: partition sized near its worker's memory limit cannot afford
RING_PIECE_BYTES = 16 * 2**20
#: pieces sent before waiting for the first to land (bounds the receiver's transient buffers)
RING_PIECES_IN_FLIGHT = 4
#: seconds a partition waits for a ring message the driver says is on its way (every sender
#: had already handed it to the network when the driver said so; a lost sender is noticed by
#: the driver well before this)
RING_WAIT_S = 60.0


@dataclass(frozen=True)
class _Piecewise:
    """Stands in a ring message for an array sent ahead in pieces."""
    key: tuple


def _identity(x):
    return x


class _Lent:
    """An array lent to one actor call: pickles as the array itself, and `release` drops it.

    distributed keeps an actor call's arguments in reference cycles until the garbage
    collector runs; a ring transfer of a large array would otherwise keep every block a
    partition ever sent alive (measured: eight 200 MiB blocks held on a worker after seven
    rounds)."""

    def __init__(self, array):
        self.array = array

    def __reduce__(self):
        return _identity, (self.array,)

    def release(self) -> None:
        self.array = None


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

    def take(slot, v):
        if isinstance(v, np.ndarray) and v.ndim >= 1 and v.nbytes > RING_PIECE_BYTES:
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
                # to itself: the plain method (the actor's deliver is a coroutine)
                PartitionWorker.deliver(self, round, self.index, payload)
            else:
                self._send(int(dest), round, payload)
                nbytes += payload_nbytes(payload)
                sent_to.append(int(dest))
        return nbytes, sent_to

    def info(self) -> dict:
        return {"index": self.index, "pid": os.getpid(), "init_s": self.init_s}

    def step(self, round: int, update, plan) -> dict:
        """Apply the pending pull result (if any), then push for ``round``."""
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

    def save(self, path: str) -> None:
        write_arrays(path, self.program.partition_arrays(self.state))

    def restore(self, path: str) -> None:
        self.program.restore_partition(self.state, read_arrays(path))

    def collect(self) -> dict:
        return self.program.partition_arrays(self.state)

    def call(self, method: str, *args):
        """Run ``program.<method>(state, *args)`` on the worker (for tests and tools)."""
        return getattr(self.program, method)(self.state, *args)


class ActorPartitionWorker(PartitionWorker):
    """Dask actor flavour: ``step`` is async so rounds kept in flight run in round order.

    Un-awaited actor calls can reach the worker out of order, so every call carries its
    round number and waits for its predecessor; the computation itself runs in a thread
    (the kernels release the GIL) so the worker's event loop stays responsive.

    Ring messages: the last call of a message is not waited for -- the round's barrier and
    the driver's pull overlap its transfer -- and the driver passes each partition the
    number of messages to wait for before it touches its state again (`await_inbox`): the
    program's declared count (`Program.ring_inbox`) when the next round is issued while this
    one still runs, else what the round's results say was sent to it.
    """

    def __init__(self, program, spec, index: int):
        super().__init__(program, spec, index)
        self._next_round = None
        self._cond = None
        self._incoming: dict = {}
        self._unacked: list = []          # deliver calls not yet confirmed by their peer
        self._arrived: dict = {}          # ring messages received, by round
        self._arrival = None              # asyncio.Condition, notified on each arrival

    def expect_round(self, round: int) -> None:
        self._next_round = round

    def _order_cond(self):
        """The condition rounds (and applies sent while rounds run) wait on, in order."""
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def _arrival_cond(self):
        if self._arrival is None:
            self._arrival = asyncio.Condition()
        return self._arrival

    async def deliver(self, round: int, src: int, payload) -> None:  # type: ignore[override]
        # on the event loop, so it lands while this worker's own push runs in its thread
        PartitionWorker.deliver(self, round, src, _assemble(payload, self._incoming))
        cond = self._arrival_cond()
        async with cond:
            self._arrived[round] = self._arrived.get(round, 0) + 1
            cond.notify_all()

    async def await_inbox(self, inbox) -> None:
        """Wait until ``inbox = (round, n)``: the ``n`` ring messages sent to this
        partition in ``round`` have been received (None: nothing to wait for).  Also
        raises the failure of any earlier message of this partition's own."""
        unacked, self._unacked = self._unacked, []
        for fut in unacked:
            if fut.done():
                await fut
            else:
                self._unacked.append(fut)
        if inbox is None:
            return
        round, n = inbox
        cond = self._arrival_cond()
        try:
            async with cond:
                await asyncio.wait_for(
                    cond.wait_for(lambda: self._arrived.get(round, 0) >= n), RING_WAIT_S)
        except (asyncio.TimeoutError, TimeoutError):
            raise RuntimeError(f"partition {self.index}: {n} ring message(s) of round {round} "
                               f"were sent to it, {self._arrived.get(round, 0)} arrived "
                               f"within {RING_WAIT_S:.0f} s") from None
        for r in [r for r in self._arrived if r <= round]:
            del self._arrived[r]

    async def receive_piece(self, key, start: int, piece, shape, dtype) -> None:
        """Rows ``start:`` of an array of a ring message that follows (see `_Piecewise`)."""
        buf = self._incoming.get(key)
        if buf is None:
            # untouched pages cost nothing: the array grows in memory as its pieces land
            buf = self._incoming[key] = np.empty(shape, dtype=dtype)
        buf[start:start + len(piece)] = piece

    @staticmethod
    def _landed(lent: _Lent, fut) -> None:
        fut.result()
        lent.release()

    def _send(self, dest: int, round: int, payload) -> None:
        # from the push's thread: the actor calls go worker to worker; large arrays land
        # piece by piece before the push returns, the message's last call is checked later
        # (`await_inbox`), its arrival awaited by the peer
        peer = self.peers[dest]
        payload, arrays = _split_large(payload, (self.index, round))
        for key, arr in arrays:
            arr = np.ascontiguousarray(arr)
            rows = max(1, RING_PIECE_BYTES // max(arr[0].nbytes, 1))
            inflight = []
            for start in range(0, arr.shape[0], rows):
                lent = _Lent(arr[start:start + rows])
                inflight.append((lent, peer.receive_piece(key, start, lent, arr.shape,
                                                          arr.dtype.str)))
                if len(inflight) >= RING_PIECES_IN_FLIGHT:
                    self._landed(*inflight.pop(0))
            for lent, fut in inflight:
                self._landed(lent, fut)
        self._unacked.append(peer.deliver(round, self.index, payload))

    async def apply(self, update, after=None) -> None:  # type: ignore[override]
        """`PartitionWorker.apply`, once the step of round ``after`` (when given: a round
        still in flight when the driver sent this) ran here."""
        if after is not None:
            cond = self._order_cond()
            async with cond:
                await cond.wait_for(
                    lambda: self._next_round is None or self._next_round > after)
        await asyncio.to_thread(PartitionWorker.apply, self, update)

    async def step(self, round: int, update, plan,  # type: ignore[override]
                   inbox=None) -> dict:
        """`PartitionWorker.step` once round ``round - 1`` ran here and ``inbox`` (see
        `await_inbox`) arrived."""
        cond = self._order_cond()
        async with cond:
            await cond.wait_for(
                lambda: self._next_round is None or self._next_round == round)
        try:
            await self.await_inbox(inbox)
            return await asyncio.to_thread(PartitionWorker.step, self, round, update, plan)
        finally:
            async with self._cond:
                self._next_round = round + 1
                self._cond.notify_all()
