"""The round loop: schedule -> push on every partition -> barrier -> pull -> apply.

Also: bounded staleness (rounds kept in flight), stopping rules, per-round metrics, Dask
events, callbacks, progress (`progress`), Zarr checkpoints and recovery from worker loss.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .. import config
from ..exceptions import CheckpointError, CheckpointWarning, RecoveryError, SchedulerLostError
from .backends.base import WorkerLostError
from .backends.protocol import check_backend
from .checkpoint import CheckpointStore, expected_nbytes
from .comm import payload_nbytes
from .events import FitEvents
from .program import Broadcast
from .progress import progress_bar

logger = logging.getLogger("dmp")


def _batch_settings() -> tuple[int, float, int]:
    """``(most rounds, seconds aimed at, most bytes of partials)`` of a batch of rounds
    (`Program.batch_rounds`): Dask settings ``dmp.batch.max-rounds``, ``target-duration``
    (long enough that the calls between the driver and the workers cost little, short
    enough for a live progress bar and monitor: a callback or convergence stops the fit at
    the end of a batch) and ``max-bytes`` (a batch's replies hold every round's partials)."""
    return (config.count("dmp.batch.max-rounds"), config.seconds("dmp.batch.target-duration"),
            config.nbytes("dmp.batch.max-bytes"))


@dataclass
class RunResult:
    """What a finished run hands back to the estimator."""

    history: list
    n_rounds: int
    partition_arrays: list
    converged: bool
    wall_s: float
    recoveries: list = field(default_factory=list)
    fit_id: str = ""
    #: the callback asked the run to stop (not a failure to converge)
    stopped: bool = False
    #: what ``run(collect=...)`` returned
    collected: object = None


def _plans_nbytes(plans) -> int:
    """`payload_nbytes` of a round's plans; a plan given to every partition (``[plan] *
    P``, as most rounds' are) is sized once."""
    if plans and all(p is plans[0] for p in plans):
        return payload_nbytes(plans[0]) * len(plans)
    return payload_nbytes(plans)


def _pull_bytes(updates, n_partitions: int) -> int:
    if updates is None:
        return 0
    if isinstance(updates, Broadcast):
        return payload_nbytes(updates.value) * n_partitions
    return payload_nbytes(updates)


def _fresh_driver_nbytes(program):
    """Bytes of a just-started program's driver arrays (the bound its checkpoint must keep;
    None for a program whose driver state is complete only after its first rounds)."""
    try:
        return expected_nbytes(program.driver_state())
    except Exception:
        return None


def _discard_round(store, round: int) -> None:
    """Remove checkpoint ``round`` when it is not complete (its write failed); best effort,
    never hiding the write's error."""
    from .checkpoint import _history_name, _round_name

    try:
        if round in store.complete_rounds():
            return
        store._remove(store._join(_round_name(round)))
        store._remove(store._join("history", _history_name(round)))
    except Exception:  # noqa: BLE001 - the write's own error is the one to report
        logger.warning("could not remove the incomplete checkpoint of round %d in %s",
                       round, store.path)


def run(program, backend, **kwargs) -> RunResult:
    """Run ``program`` on ``backend`` until it converges or ``max_iter`` rounds pass.

    On a backend whose partitions live in worker processes the driver's BLAS runs on one
    thread: its work is vectors of one round, and OpenBLAS's idle pool threads spin between
    calls, which takes CPU time from the workers (BENCHMARKS.md, Lasso: "Fixed on the way").
    When the pushes run in this process (``backend.in_driver_process``: the local backend, or
    Dask workers with ``processes=False``) the library's default is kept.  The limit is
    process-wide while the fit runs: fits run at once from several threads of one process may
    restore each other's setting.  Keyword arguments: see `_run`.

    A checkpoint location is locked while the fit runs (`dmp.engine.checkpoint.CheckpointLock`):
    another fit writing it raises `dmp.exceptions.CheckpointLockedError`.
    """
    config.check()   # a misspelt dmp setting would be ignored without a word
    check_backend(backend)
    checkpoint = kwargs.get("checkpoint")
    lock = (CheckpointStore(checkpoint).lock() if checkpoint is not None
            else contextlib.nullcontext())
    with lock as held:
        kwargs["_lock"] = held
        if backend.in_driver_process:
            return _run(program, backend, **kwargs)
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="blas"):
            return _run(program, backend, **kwargs)


def _run(program, backend, *, max_iter: int, staleness: int = 0, checkpoint=None,
         checkpoint_every: int = 50, resume: bool = False, fingerprint: dict | None = None,
         callback=None, show_progress: bool = False, desc: str = "dmp",
         max_recoveries: int = 5, params: dict | None = None, collect=None,
         _lock=None) -> RunResult:
    """The body of `run`.

    Parameters
    ----------
    staleness : int
        Number of rounds kept in flight beyond the current one (0 = bulk synchronous).  The
        pull result of round ``t`` reaches the workers with round ``t + staleness + 1`` at
        the latest.  Rounds for which ``program.needs_barrier`` is true, and every
        ``checkpoint_every``-th round, start after all earlier rounds were pulled and applied
        (so there the results arrive sooner, and the sequence of rounds depends on
        ``checkpoint_every`` when ``staleness > 0``).
    checkpoint : str or path, optional
        Zarr checkpoint location; a checkpoint is written every ``checkpoint_every`` rounds.
    resume : bool
        Continue from the latest complete checkpoint in ``checkpoint`` if there is one.
    callback : callable, optional
        ``callback(round, metrics) -> bool``; returning True stops the run.
    desc, params : str, dict
        Estimator name and hyperparameters, for the progress bar and the live monitor
        (`dmp.engine.events`).
    collect : callable, optional
        ``collect(backend) -> object``, run once the rounds are done to bring the result
        off the workers (e.g. MF's factors; `RunResult.collected`).  It is part of the fit,
        as the partitions' arrays of ``program.gather_partitions`` are: a worker lost while
        it runs is recovered like one lost in a round (from the last checkpoint, replaying
        the rounds after it) and it runs again.  It should stream what it brings back
        (`DaskBackend.collect_stream`), which the up-front memory check counts.
    """
    return _Run(program, backend, max_iter=max_iter, staleness=staleness,
                checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume=resume,
                fingerprint=fingerprint, callback=callback, show_progress=show_progress,
                desc=desc, max_recoveries=max_recoveries, params=params, collect=collect,
                lock=_lock).execute()


@dataclass
class _InFlight:
    """Rounds issued in one call (`Backend.step`, or `Backend.step_batch` for several) whose
    results are not gathered yet."""

    first: int
    n_rounds: int
    handle: object
    t_issue: float
    #: bytes of each round's plans
    bytes_schedule: list
    #: bytes of the pull result delivered with the call
    bytes_pull: int


class _Run:
    """One call of `run`: its state and its steps (parameters: see `_run`).

    `execute` starts (or resumes) the fit, then runs the rounds until they are done and the
    result is collected, recovering from every worker loss on the way (`_recover_from_loss`).
    A pass over the rounds (`_run_rounds`) issues rounds while it may (`_may_issue`) and keeps
    up to ``staleness`` calls in flight; each gather pulls, records and reports its rounds
    (`_gather_oldest`) and writes a checkpoint when one is due (`_checkpoint_due`).
    """

    def __init__(self, program, backend, *, max_iter, staleness, checkpoint, checkpoint_every,
                 resume, fingerprint, callback, show_progress, desc, max_recoveries, params,
                 collect, lock):
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        self.program = program
        self.backend = backend
        self.max_iter = max_iter
        self.staleness = staleness
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.callback = callback
        self.show_progress = show_progress
        self.desc = desc
        self.max_recoveries = max_recoveries
        self.params = params
        self.collect = collect
        self.lock = lock
        self.store = (lock.store if lock is not None
                      else CheckpointStore(checkpoint) if checkpoint is not None else None)
        self.fingerprint = fingerprint or {}
        if resume and self.store is None:
            raise ValueError("resume=True needs a checkpoint location")
        self.n_parts = backend.n_partitions
        self.specs = program.partition_specs(self.n_parts)
        self.t_start = time.perf_counter()
        self.history: list[dict] = []
        self.recoveries: list[dict] = []
        self.batchable = bool(backend.runs_batches)
        self.events = None
        self.bar = None
        #: the next round to issue
        self.round = 0
        self.converged = False
        self.stopped = False
        # the round a callback stopped the fit at: a worker lost while later rounds were
        # still in flight rolls back to a checkpoint, and the replay must stop there again
        # even when the callback (run once more on the replayed rounds) does not say so twice
        self.stop_round = None
        #: the fit's time at the last round recorded (the clock goes on from there)
        self.offset = 0.0
        self.collected = None
        self.arrays = None
        # (converged, stopped, round) when the rounds were done and the result was being
        # collected: a loss then that rolls nothing back goes straight to collecting again
        self.finished = None
        self.status = "error"
        #: most rounds the next batch may hold (`_batch_len`)
        self.batch_cap = 1
        # read once per fit, not in every round
        self.batch_settings = _batch_settings() if self.batchable else None
        # state of one pass over the rounds (`_run_rounds`)
        self.pending: deque[_InFlight] = deque()
        self.update = None
        self.t_loop0 = 0.0
        #: the program's driver state exists (`Program.start` ran, or a checkpoint was
        #: restored): only then can a program go on from it after a loss
        self.started = False

    # ================================================================== the whole fit
    def execute(self) -> RunResult:
        self._refuse_unresumed_checkpoint()
        self.events = FitEvents(self.backend, self.program, desc=self.desc,
                                params=self.params, max_iter=self.max_iter)
        try:
            self.round = self._first_round()
        except SchedulerLostError as exc:
            raise self._scheduler_lost(exc, self._reached()) from exc
        self.events.start()
        self.bar = progress_bar(self.show_progress, self.max_iter, self.desc)
        if self.bar is not None and self.round:
            self.bar.update(self.round)
        self.offset = self._last_time()
        try:
            while True:
                try:
                    self._run_rounds()
                    self._collect_result()
                    break
                except WorkerLostError as exc:
                    self._recover_from_loss(exc)
        except SchedulerLostError as exc:
            raise self._scheduler_lost(exc, self._reached()) from exc
        finally:
            if self.bar is not None:
                self.bar.close()
            self.events.end(self.status, self.round, time.perf_counter() - self.t_start)
        self.program.finish(self.arrays)
        return RunResult(history=self.history, n_rounds=self.round,
                         partition_arrays=self.arrays, converged=self.converged,
                         wall_s=time.perf_counter() - self.t_start, recoveries=self.recoveries,
                         fit_id=self.events.fit_id, stopped=bool(self.stopped),
                         collected=self.collected)

    def _refuse_unresumed_checkpoint(self) -> None:
        store = self.store
        if store is not None and not self.resume and store.latest() is not None:
            raise FileExistsError(f"checkpoint location {store.path!r} already holds a "
                                  f"checkpoint; pass resume=True to continue it or choose a "
                                  f"new location")

    def _first_round(self) -> int:
        """Create the partitions and start or resume the fit; the first round to run."""
        try:
            return self._restore_or_init(True)
        except WorkerLostError as exc:   # lost while the partitions were being created
            self.recoveries.append({"round": 0, "error": str(exc), "time": 0.0})
            logger.warning("worker lost while starting (%s); recovering", exc)
            round_ = self._recover()
            self.recoveries[-1]["resumed_round"] = round_
            return round_

    def _collect_result(self) -> None:
        """The rounds are done: bring the result off the workers."""
        self.finished = (self.converged, self.stopped, self.round)
        self.arrays = self.backend.collect_all() if self.program.gather_partitions else []
        self.collected = self.collect(self.backend) if self.collect is not None else None
        self.status = ("converged" if self.converged else "stopped" if self.stopped
                       else "max_iter")

    def _last_time(self) -> float:
        return self.history[-1]["time"] if self.history else 0.0

    def _reached(self) -> int:
        """The next round to complete."""
        return self.history[-1]["round"] + 1 if self.history else 0

    # ================================================================== one pass of rounds
    def _run_rounds(self) -> None:
        """Issue, gather and pull rounds from `round` until the fit stops or ``max_iter``."""
        self.backend.expect_round(self.round)
        self.pending = deque()
        self.update = None
        self.t_loop0 = time.perf_counter() - self.offset
        while self.round < self.max_iter or self.pending:
            if self._may_issue():
                self._issue()
                if len(self.pending) <= self.staleness:
                    continue
            elif not self.pending:
                break
            self._gather_oldest()
            if self._checkpoint_due():
                self._checkpoint_at_round()
            if self._done():
                break
        if self.update is not None:
            self.backend.apply_all(self.update)
            self.update = None

    def _starts_drained(self, r: int) -> bool:
        """Round ``r`` starts after every earlier round was pulled and applied: the program
        asks for a barrier, or ``r`` may be checkpointed -- with or without a checkpoint
        location, so that the same rounds see the same updates whether a fit is
        checkpointed or not."""
        return self.program.needs_barrier(r) or r % self.checkpoint_every == 0

    def _must_drain_before(self, r: int) -> bool:
        """With rounds in flight, ``r`` waits for them (`_starts_drained`), and so does the
        round of a ring program after one whose messages it does not declare: its push
        needs them, and rounds overlap only when the program declares how many each
        partition waits for (`Program.ring_inbox`); otherwise the backend learns it from
        the results of a drained round."""
        return self._starts_drained(r) or (self.program.uses_ring
                                           and self.program.ring_inbox(r - 1) is None)

    def _batch_ends_before(self, r: int) -> bool:
        """A batch of rounds never reaches ``r`` when ``r`` starts drained or the ring
        messages of the round before it are not declared."""
        return self._starts_drained(r) or self.program.ring_inbox(r - 1) is None

    def _may_issue(self) -> bool:
        """Whether the next round may be issued now."""
        if self.round >= self.max_iter or self.converged or self.stopped:
            return False
        return not (self.pending and self._must_drain_before(self.round))

    def _checkpoint_due(self) -> bool:
        """Every round is gathered, the fit goes on and the next round is a checkpoint
        round of a fit with a checkpoint location."""
        return (self.store is not None and not self.pending
                and not (self.converged or self.stopped)
                and self.round % self.checkpoint_every == 0 and self.round < self.max_iter)

    def _done(self) -> bool:
        """The fit converged or was stopped and no round is in flight."""
        return (self.converged or self.stopped) and not self.pending

    def _batch_len(self, r: int) -> int:
        """Rounds to issue at once from ``r`` (`Program.batch_rounds`): at most
        `batch_cap`, never across a round that starts drained or whose predecessor's ring
        messages are not declared (`_batch_ends_before`)."""
        m = (min(int(self.program.batch_rounds(r)), self.max_iter - r, self.batch_cap)
             if self.batchable else 1)
        for j in range(1, m):
            if self._batch_ends_before(r + j):
                return j
        return max(m, 1)

    def _issue(self) -> None:
        """Issue the next round, or batch of rounds, with the pull result not sent yet."""
        r0 = self.round
        m = self._batch_len(r0)
        plans_seq = [self.program.schedule(r) for r in range(r0, r0 + m)]
        t_issue = time.perf_counter()
        handle = (self.backend.step(r0, self.update, plans_seq[0]) if m == 1
                  else self.backend.step_batch(r0, self.update, plans_seq))
        self.pending.append(_InFlight(r0, m, handle, t_issue,
                                      [_plans_nbytes(p) for p in plans_seq],
                                      _pull_bytes(self.update, self.n_parts)))
        self.update = None
        self.round += m

    def _gather_oldest(self) -> None:
        """Gather the oldest call in flight, size the next batch by it, and pull, record
        and report each of its rounds."""
        batch = self.pending.popleft()
        m = batch.n_rounds
        results_seq = ([self.backend.gather(batch.handle)] if m == 1
                       else self.backend.gather_batch(batch.handle))
        batch_s = time.perf_counter() - batch.t_issue
        if m > 1:
            # how long the batch ran on the workers: issue to gather also counts the wait
            # behind the batch before it (staleness), which would halve the batches
            batch_s = max(sum(col) for col in zip(
                *[[res["step_s"] for res in results] for results in results_seq]))
        # the workers' wall clock on this loop's clock (rounds of a batch; a round run
        # alone is timed here)
        wall_to_loop = (time.time() - time.perf_counter() + self.t_loop0 if m > 1
                        else 0.0)
        # rounds per batch: about target_s of work and at most max_bytes of partials,
        # growing at most 4x at once
        push_bytes = [payload_nbytes([res["partial"] for res in results])
                      for results in results_seq]
        if self.batchable:   # a backend that cannot batch has no batch to size
            max_rounds, target_s, max_bytes = self.batch_settings
            self.batch_cap = int(max(1, min(max_rounds, 4 * m,
                                            target_s * m / max(batch_s, 1e-9),
                                            max_bytes / max(max(push_bytes), 1))))
        for j, results in enumerate(results_seq):
            self._pull_round(batch, j, results, push_bytes[j], wall_to_loop)

    def _pull_round(self, batch: _InFlight, j: int, results: list, push_bytes: int,
                    wall_to_loop: float) -> None:
        """Pull round ``batch.first + j``, record it, report it and apply the stopping
        rules; its pull result goes out with the next call (or before it, when another
        pull comes first)."""
        r = batch.first + j
        program = self.program
        new_update = program.pull(r, [res["partial"] for res in results])
        if batch.n_rounds > 1 and new_update is not None:
            raise RuntimeError(f"{type(program).__name__}.pull returned an update for round "
                               f"{r}, which ran in a batch (Program.batch_rounds)")
        rec = self._round_record(batch, j, results, push_bytes, wall_to_loop)
        rec.update(program.metrics())
        self.history.append(rec)
        if self.events.enabled:
            self.events.round(rec)
        if self.bar is not None:
            # the postfix is drawn with the count, at most every `mininterval` (drawn
            # on every round, a fit of many short rounds wrote a line per round)
            self.bar.set_postfix(program.progress_postfix(), refresh=False)
            self.bar.update(1)
        if self.callback is not None and self.callback(r, rec):
            self.stop_round = r if self.stop_round is None else min(self.stop_round, r)
        if self.stop_round is not None and r >= self.stop_round:
            self.stopped = True
        if program.converged():
            self.converged = True
        if self.update is not None:
            # two pulls before the next push: deliver the older one now
            self.backend.apply_all(self.update)
        self.update = new_update

    def _round_record(self, batch: _InFlight, j: int, results: list, push_bytes: int,
                      wall_to_loop: float) -> dict:
        """The history record of round ``batch.first + j`` (before the program's metrics)."""
        push_s = [res["push_s"] for res in results]
        t = time.perf_counter()
        now = t - self.t_loop0
        if batch.n_rounds == 1:
            round_s = t - batch.t_issue
            idle_s = [max(round_s - p, 0.0) for p in push_s]
        else:  # timed on the workers: from the round before's end to its own
            idle_s = [max(res["step_s"] - res["push_s"], 0.0) for res in results]
            round_s = max(res["step_s"] for res in results)
            # when the round ended on the workers (their wall clocks, kept in order and
            # never after now against a skewed clock)
            ended = max(res["t_end"] for res in results) - wall_to_loop
            now = min(max(ended, self._last_time()), now)
        return {"round": batch.first + j, "time": now,
                "round_s": round_s, "push_s": push_s, "idle_s": idle_s,
                "bytes_schedule": batch.bytes_schedule[j],
                "bytes_push": push_bytes,
                "bytes_pull": batch.bytes_pull if j == 0 else 0,
                "bytes_ring": sum(res.get("bytes_ring", 0) for res in results),
                # seconds each partition spent handing its ring messages over
                "ring_s": [res.get("ring_s", 0.0) for res in results],
                # losses recovered from before this round ran (details in
                # RunResult.recoveries / the estimators' recoveries_)
                "worker_losses": len(self.recoveries),
                # the first round of the call it ran in (`batch_rounds`)
                "batch": batch.first}

    def _checkpoint_at_round(self) -> None:
        """Deliver the last pull result, then checkpoint the drained state at `round`."""
        self.backend.apply_all(self.update)
        self.update = None
        self._checkpoint_now(self.round)
        self.backend.expect_round(self.round)

    def _checkpoint_now(self, r: int) -> None:
        store = self.store
        if self.lock is not None:
            self.lock.verify()   # another fit took the location over: stop writing it
        try:
            store.begin(r, self.fingerprint)
            parts = self.backend.save_all([store.partition_path(r, k)
                                           for k in range(self.n_parts)])
            store.commit(r, dict(self.program.driver_state()),
                         partitions=parts if isinstance(parts, list) else None,
                         history=self.history)
        except OSError as exc:
            # a full disk (or another write error, on a worker or here): the half-written
            # round goes, the complete checkpoints before it stay usable
            _discard_round(store, r)
            if exc.filename is None and exc.errno is not None:
                # Zarr's write errors name no file: name the checkpoint
                raise OSError(exc.errno, f"{exc.strerror or exc} (writing the checkpoint of "
                                         f"round {r})", store.path) from exc
            raise
        self.events.checkpoint(r)

    # ================================================================== start and recovery
    def _restore_or_init(self, initial: bool) -> int:
        """(Re)create the partitions and the driver state; return the first round to run."""
        program, store = self.program, self.store
        (self.backend.start if initial else self.backend.restart)(program, self.specs)
        latest = store.latest() if store is not None else None
        if not initial and latest is None and self.started and program.after_loss():
            # the program restores itself from its driver-side copies
            return self._reached()
        if latest is None and initial and self.resume and store.latest_name() is not None:
            return self._restore_checkpoint()   # its latest round is broken, and the only one
        if latest is None or (initial and not self.resume):
            program.start(self.n_parts)
            self.started = True
            self.history.clear()
            if store is not None:
                store.reset_history()
            return 0
        saved_fp = store.fingerprint()
        fingerprint = self.fingerprint
        if saved_fp is not None and fingerprint and saved_fp != fingerprint:
            diff = sorted(k for k in set(saved_fp) | set(fingerprint)
                          if saved_fp.get(k) != fingerprint.get(k))
            raise CheckpointError(f"checkpoint {store.path!r} was written by a different fit "
                                  f"(differs in: {', '.join(diff)}); use another location or "
                                  f"resume=False")
        return self._restore_checkpoint()

    def _restore_checkpoint(self) -> int:
        """Restore the newest complete checkpoint that passes its checks; a corrupt one or
        one missing a piece is skipped, with a warning, for the one before."""
        program, store, n_parts = self.program, self.store, self.n_parts
        rounds = store.complete_rounds()
        skipped = []
        named = store.latest_name()
        if named is not None and named not in {f"round_{r:08d}" for r in rounds}:
            skipped.append(f"checkpoint store {store.path!r}: {named}, its latest round, is "
                           f"not a complete checkpoint (its metadata is missing)")
        for r in rounds:
            try:
                parts = store.partition_manifests(r, n_parts)
                program.start(n_parts)
                state = store.load_driver(r, expected=_fresh_driver_nbytes(program))
                saved_history = store.load_history(r)
                try:
                    self.backend.restore_all([store.partition_path(r, k)
                                              for k in range(n_parts)], parts)
                except CheckpointError as exc:
                    raise CheckpointError(f"checkpoint store {store.path!r}, round {r}: "
                                          f"{exc}") from exc
            except CheckpointError as exc:
                skipped.append(str(exc))
                logger.warning("%s", exc)
                continue
            if skipped:
                warnings.warn(f"resumed from the checkpoint of round {r} in {store.path!r}, "
                              f"skipping what failed: {'; '.join(skipped)}",
                              CheckpointWarning, stacklevel=2)
            self.history[:] = saved_history
            program.load_driver_state(state)
            self.started = True
            logger.info("resumed from checkpoint round %d in %s", r, store.path)
            return r
        raise CheckpointError(f"no usable checkpoint in {store.path!r}: {'; '.join(skipped)}; "
                              f"resume=False (or another location) starts the fit over")

    def _recover(self) -> int:
        """Re-create the partitions and restore; a loss during the recovery itself (a second
        worker dying, or the lost worker still registered when the partitions are placed)
        starts it over, recorded as a retry of the same recovery."""
        while True:
            try:
                return self._restore_or_init(False)
            except WorkerLostError as again:
                retries = self.recoveries[-1].setdefault("retries", [])
                retries.append(str(again))
                logger.warning("worker lost during the recovery (%s); starting it over", again)
                if len(retries) > self.max_recoveries:
                    raise RecoveryError(f"gave up after {self.max_recoveries} failed attempts "
                                        f"to recover from a worker loss ({again})") from again

    def _recover_from_loss(self, exc: WorkerLostError) -> None:
        """A worker was lost during a pass over the rounds or while the result was being
        collected: record it, restore the partitions and go on from where that leaves."""
        self.offset = self._last_time()
        self.recoveries.append({"round": self.round, "error": str(exc), "time": self.offset})
        logger.warning("worker lost at round %d (%s); recovering", self.round, exc)
        self.events.worker_lost(self.round, str(exc))
        if len(self.recoveries) > self.max_recoveries:
            raise RecoveryError(f"gave up after {self.max_recoveries} worker losses (the "
                                f"last: {exc})") from exc
        self.converged = self.stopped = False
        self.round = self._recover()
        if self.finished is not None:
            self.recoveries[-1]["while"] = "collecting the result"
            if self.round >= self.finished[2]:
                self.converged, self.stopped = self.finished[0], self.finished[1]
            self.finished = None
        self.recoveries[-1]["resumed_round"] = self.round
        self.events.recovered(self.round)
        self.offset = self._last_time()

    def _scheduler_lost(self, exc: SchedulerLostError, round: int) -> SchedulerLostError:
        """``exc`` with the round the fit reached and what resumes it."""
        store = self.store
        ckpt_round = None
        if store is not None:
            try:
                ckpt_round = store.latest()
            except Exception:  # noqa: BLE001 - the hint is best-effort
                ckpt_round = None
        if ckpt_round is not None:
            hint = (f"the checkpoint of round {ckpt_round} in {store.path!r} remains: fit "
                    f"again with resume=True (the same checkpoint location) on a running "
                    f"cluster to continue from it")
        elif store is not None:
            hint = (f"no checkpoint was complete yet in {store.path!r}: fit again on a "
                    f"running cluster")
        else:
            hint = ("the fit had no checkpoint location (pass checkpoint=... to make it "
                    "resumable): fit again on a running cluster")
        return SchedulerLostError(f"{exc.args[0] if exc.args else exc} at round {round}; "
                                  f"{hint}", address=exc.address, round=round,
                                  checkpoint=None if store is None else store.path,
                                  checkpoint_round=ckpt_round)


def history_arrays(history: list[dict]) -> dict:
    """List of per-round dicts -> dict of arrays (push_s becomes rounds x workers)."""
    if not history:
        return {}
    # every key in the order first seen (most records have the same keys)
    keys = dict.fromkeys(history[0])
    for rec in history[1:]:
        if rec.keys() != keys.keys():
            keys.update(dict.fromkeys(rec))
    out = {}
    for k in keys:
        vals = [rec.get(k) for rec in history]
        try:
            out[k] = np.asarray(vals)
        except ValueError:
            out[k] = np.asarray(vals, dtype=object)
    return out
