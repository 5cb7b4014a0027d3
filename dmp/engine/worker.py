"""The resident holder of one model partition (a Dask actor, or an in-process object)."""

from __future__ import annotations

import asyncio
import os
import time

from .checkpoint import read_arrays, write_arrays


class PartitionWorker:
    """Holds one partition's data and variables and runs the worker side of a Program."""

    def __init__(self, program, spec, index: int):
        self.program = program
        self.index = index
        t0 = time.perf_counter()
        self.state = program.init_partition(spec)
        self.init_s = time.perf_counter() - t0

    def info(self) -> dict:
        return {"index": self.index, "pid": os.getpid(), "init_s": self.init_s}

    def step(self, round: int, update, plan) -> dict:
        """Apply the pending pull result (if any), then push for ``round``."""
        if update is not None:
            self.program.apply(self.state, update)
        t0 = time.perf_counter()
        partial = self.program.push(self.state, plan)
        return {"partial": partial, "push_s": time.perf_counter() - t0, "round": round}

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
