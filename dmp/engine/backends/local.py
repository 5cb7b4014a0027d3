"""In-process backend: partitions are plain objects driven in a loop.

Deterministic and cheap; used by the tests, by scikit-learn's estimator checks and to
simulate many workers on one machine.
"""

from __future__ import annotations

import time

from ..program import update_for
from ..worker import PartitionWorker
from .protocol import Backend


class LocalBackend(Backend):
    """Run every partition in this process.

    Parameters
    ----------
    n_workers : int
        Number of simulated workers (= partitions).
    batches : bool, default False
        Run the rounds a program lets batch (`Program.batch_rounds`) as the Dask backend
        does: every partition's pushes of a batch, round by round, then each partition's
        `Program.close_batch` over them, so the driver pulls what a cluster's driver pulls.
        A callback that stops the fit inside a batch then stops it at the batch's end (and
        that of a batch already in flight, with ``staleness``), as on a cluster; a batch is
        sized by its partitions' summed time, which in process run one after another.
        `dmp.plan`'s probes run so; fits default to one round a call.
    """

    kind = "local"
    # capabilities (`Backend`): everything runs here, synchronously
    needs_store = False
    in_driver_process = True
    overlaps_rounds = False
    sends_events = False

    def __init__(self, n_workers: int = 1, *, batches: bool = False):
        if int(n_workers) < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self.n_workers = int(n_workers)
        self.batches = bool(batches)
        self.workers: list[PartitionWorker] = []

    @property
    def runs_batches(self) -> bool:
        return self.batches

    @property
    def n_partitions(self) -> int:
        return self.n_workers

    def start(self, program, specs) -> None:
        self.workers = [PartitionWorker(program, spec, k) for k, spec in enumerate(specs)]
        if program.uses_ring:
            for w in self.workers:
                w.set_peers(self.workers)

    def restart(self, program, specs) -> None:  # nothing can be lost in-process
        self.start(program, specs)

    def expect_round(self, round: int) -> None:
        pass

    def step(self, round, updates, plans):
        return [w.step(round, update_for(updates, k), plans[k])
                for k, w in enumerate(self.workers)]

    def step_batch(self, round, updates, plans_seq):
        """Rounds ``round ..`` in turn on every partition (a round's ring messages are
        delivered before the next round's pushes), then each partition's batch closed."""
        runs = [[] for _ in self.workers]
        for j, plans in enumerate(plans_seq):
            for k, w in enumerate(self.workers):
                runs[k].append(w.batch_round(round + j, update_for(updates, k) if j == 0
                                             else None, plans[k], time.perf_counter()))
        closed = [w.close_batch(run) for w, run in zip(self.workers, runs)]
        return [[closed[k][j] for k in range(len(self.workers))]
                for j in range(len(plans_seq))]

    def gather(self, handle):
        return handle

    def gather_batch(self, handle):
        return handle

    def apply_all(self, updates) -> None:
        for k, w in enumerate(self.workers):
            w.apply(update_for(updates, k))

    def save_all(self, paths) -> list:
        return [w.save(p) for w, p in zip(self.workers, paths)]

    def restore_all(self, paths, manifests=None) -> None:
        for k, (w, p) in enumerate(zip(self.workers, paths)):
            w.restore(p, None if manifests is None else manifests[k])

    def collect_all(self, method: str | None = None) -> list[dict]:
        if method is None:
            return [w.collect() for w in self.workers]
        return [getattr(w.program, method)(w.state) for w in self.workers]

    def call_all(self, method, *args) -> list:
        return [w.call(method, *args) for w in self.workers]

    def log_event(self, msg: dict, wait: bool = False) -> None:
        pass  # no scheduler to tell; history_ and the progress bar still have everything

    def describe(self) -> str:
        return f"local backend, {self.n_workers} simulated worker(s)"

    def close(self) -> None:
        self.workers = []
