"""The resident holder of one model partition (a Dask actor, or an in-process object)."""

from __future__ import annotations

import asyncio
import os
import time

from .checkpoint import read_arrays, write_arrays
from .comm import payload_nbytes
from .program import Sends


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

    def _send_all(self, round: int, messages: dict) -> int:
        if messages and self.peers is None:
            raise RuntimeError("a push sent ring messages but the partitions are not "
                               "connected (set Program.uses_ring = True)")
        nbytes = 0
        for dest, payload in messages.items():
            if dest == self.index:
                # to itself: the plain method (the actor's deliver is a coroutine)
                PartitionWorker.deliver(self, round, self.index, payload)
            else:
                self._send(int(dest), round, payload)
                nbytes += payload_nbytes(payload)
        return nbytes

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
        if isinstance(partial, Sends):
            ring = self._send_all(round, partial.messages)
            partial = partial.partial
        return {"partial": partial, "push_s": push_s, "round": round, "bytes_ring": ring}

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
    """

    def __init__(self, program, spec, index: int):
        super().__init__(program, spec, index)
        self._next_round = None
        self._cond = None

    def expect_round(self, round: int) -> None:
        self._next_round = round

    async def deliver(self, round: int, src: int, payload) -> None:  # type: ignore[override]
        # on the event loop, so it lands while this worker's own push runs in its thread
        PartitionWorker.deliver(self, round, src, payload)

    def _send(self, dest: int, round: int, payload) -> None:
        # from the push's thread: the actor call goes worker to worker, and the push (hence
        # the round's barrier) completes only once the peer has the message
        self.peers[dest].deliver(round, self.index, payload).result()

    async def step(self, round: int, update, plan) -> dict:  # type: ignore[override]
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            await self._cond.wait_for(
                lambda: self._next_round is None or self._next_round == round)
        try:
            return await asyncio.to_thread(PartitionWorker.step, self, round, update, plan)
        finally:
            async with self._cond:
                self._next_round = round + 1
                self._cond.notify_all()
