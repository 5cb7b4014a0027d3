"""The round loop: schedule -> push on every partition -> barrier -> pull -> apply.

Also: bounded staleness (rounds kept in flight), stopping rules, per-round metrics, Dask
events, callbacks, a progress bar, Zarr checkpoints and recovery from worker loss.
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
from .checkpoint import CheckpointStore, expected_nbytes
from .comm import payload_nbytes
from .events import FitEvents
from .program import Broadcast

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


def _pull_bytes(updates, n_partitions: int) -> int:
    if updates is None:
        return 0
    if isinstance(updates, Broadcast):
        return payload_nbytes(updates.value) * n_partitions
    return payload_nbytes(updates)


def _progress_bar(show_progress, total, desc):
    if not show_progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, leave=True, dynamic_ncols=True)


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
    When the pushes run in this process (the local
    backend, or Dask workers with ``processes=False``) the library's default is kept.  The
    limit is process-wide while the fit runs: fits run at once from several threads of one
    process may restore each other's setting.  Keyword arguments: see `_run`.

    A checkpoint location is locked while the fit runs (`dmp.engine.checkpoint.CheckpointLock`):
    another fit writing it raises `dmp.exceptions.CheckpointLockedError`.
    """
    config.check()   # a misspelt dmp setting would be ignored without a word
    checkpoint = kwargs.get("checkpoint")
    lock = (CheckpointStore(checkpoint).lock() if checkpoint is not None
            else contextlib.nullcontext())
    with lock as held:
        kwargs["_lock"] = held
        if (getattr(backend, "kind", None) == "local"
                or getattr(backend, "workers_in_this_process", lambda: False)()):
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
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
    store = (_lock.store if _lock is not None
             else CheckpointStore(checkpoint) if checkpoint is not None else None)
    fingerprint = fingerprint or {}
    if resume and store is None:
        raise ValueError("resume=True needs a checkpoint location")
    n_parts = backend.n_partitions
    specs = program.partition_specs(n_parts)
    t_start = time.perf_counter()
    history: list[dict] = []
    recoveries: list[dict] = []

    def restore_or_init(initial: bool):
        """(Re)create the partitions and the driver state; return the first round to run."""
        (backend.start if initial else backend.restart)(program, specs)
        latest = store.latest() if store is not None else None
        if not initial and latest is None and program.after_loss():
            # the program restores itself from its driver-side copies
            return history[-1]["round"] + 1 if history else 0
        if (latest is None and initial and resume and store.latest_name() is not None):
            return restore_checkpoint()   # its latest round is broken, and the only one
        if latest is None or (initial and not resume):
            program.start(n_parts)
            history.clear()
            if store is not None:
                store.reset_history()
            return 0
        saved_fp = store.fingerprint()
        if saved_fp is not None and fingerprint and saved_fp != fingerprint:
            diff = sorted(k for k in set(saved_fp) | set(fingerprint)
                          if saved_fp.get(k) != fingerprint.get(k))
            raise CheckpointError(f"checkpoint {store.path!r} was written by a different fit "
                                  f"(differs in: {', '.join(diff)}); use another location or "
                                  f"resume=False")
        return restore_checkpoint()

    def restore_checkpoint():
        """Restore the newest complete checkpoint that passes its checks; a corrupt one or
        one missing a piece is skipped, with a warning, for the one before."""
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
                    backend.restore_all([store.partition_path(r, k) for k in range(n_parts)],
                                        parts)
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
            history[:] = saved_history
            program.load_driver_state(state)
            logger.info("resumed from checkpoint round %d in %s", r, store.path)
            return r
        raise CheckpointError(f"no usable checkpoint in {store.path!r}: {'; '.join(skipped)}; "
                              f"resume=False (or another location) starts the fit over")

    def recover():
        """Re-create the partitions and restore; a loss during the recovery itself (a second
        worker dying, or the lost worker still registered when the partitions are placed)
        starts it over, recorded as a retry of the same recovery."""
        while True:
            try:
                return restore_or_init(False)
            except WorkerLostError as again:
                retries = recoveries[-1].setdefault("retries", [])
                retries.append(str(again))
                logger.warning("worker lost during the recovery (%s); starting it over", again)
                if len(retries) > max_recoveries:
                    raise RecoveryError(f"gave up after {max_recoveries} failed attempts to "
                                        f"recover from a worker loss ({again})") from again

    if store is not None and not resume and store.latest() is not None:
        raise FileExistsError(f"checkpoint location {store.path!r} already holds a checkpoint; "
                              f"pass resume=True to continue it or choose a new location")

    def scheduler_lost(exc: SchedulerLostError, round: int) -> SchedulerLostError:
        """``exc`` with the round the fit reached and what resumes it."""
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

    def reached() -> int:
        """The next round to complete."""
        return history[-1]["round"] + 1 if history else 0

    events = FitEvents(backend, program, desc=desc, params=params, max_iter=max_iter)
    try:
        try:
            round_ = restore_or_init(True)
        except WorkerLostError as exc:   # lost while the partitions were being created
            recoveries.append({"round": 0, "error": str(exc), "time": 0.0})
            logger.warning("worker lost while starting (%s); recovering", exc)
            round_ = recover()
            recoveries[-1]["resumed_round"] = round_
    except SchedulerLostError as exc:
        raise scheduler_lost(exc, reached()) from exc
    events.start()
    status = "error"
    bar = _progress_bar(show_progress, max_iter, desc)
    if bar is not None and round_:
        bar.update(round_)
    converged = False
    stopped = False
    # the round a callback stopped the fit at: a worker lost while later rounds were still in
    # flight rolls back to a checkpoint, and the replay must stop there again even when the
    # callback (run once more on the replayed rounds) does not say so twice
    stop_round = None
    offset = history[-1]["time"] if history else 0.0
    collected = None
    # (converged, stopped, round) when the rounds were done and the result was being
    # collected: a loss then that rolls nothing back goes straight to collecting again
    finished = None

    batch_cap = 1
    batchable = hasattr(backend, "step_batch")

    def batch_len(r: int) -> int:
        """Rounds to issue at once from ``r`` (`Program.batch_rounds`): at most
        ``batch_cap``, never across a round that starts drained or whose predecessor's
        ring messages are not declared."""
        m = min(int(program.batch_rounds(r)), max_iter - r, batch_cap) if batchable else 1
        for j in range(1, m):
            if (program.needs_barrier(r + j) or (r + j) % checkpoint_every == 0
                    or program.ring_inbox(r + j - 1) is None):
                return j
        return max(m, 1)

    def checkpoint_now(r):
        if _lock is not None:
            _lock.verify()   # another fit took the location over: stop writing it
        try:
            store.begin(r, fingerprint)
            parts = backend.save_all([store.partition_path(r, k) for k in range(n_parts)])
            store.commit(r, dict(program.driver_state()),
                         partitions=parts if isinstance(parts, list) else None,
                         history=history)
        except OSError as exc:
            # a full disk (or another write error, on a worker or here): the half-written
            # round goes, the complete checkpoints before it stay usable
            _discard_round(store, r)
            if exc.filename is None and exc.errno is not None:
                # Zarr's write errors name no file: name the checkpoint
                raise OSError(exc.errno, f"{exc.strerror or exc} (writing the checkpoint of "
                                         f"round {r})", store.path) from exc
            raise
        events.checkpoint(r)

    try:
        while True:
            try:
                backend.expect_round(round_)
                pending = deque()
                update = None
                t_loop0 = time.perf_counter() - offset
                while round_ < max_iter or pending:
                    can_issue = round_ < max_iter and not (converged or stopped)
                    if can_issue and pending and (
                            program.needs_barrier(round_)
                            # rounds that may be checkpointed start from a drained state,
                            # with or without a checkpoint location: the same rounds see
                            # the same updates whether a fit is checkpointed or not
                            or round_ % checkpoint_every == 0
                            # a ring program's push needs the messages of the round before:
                            # its rounds overlap only when it declares how many each
                            # partition waits for (`Program.ring_inbox`); otherwise the
                            # backend learns it from the results of a drained round
                            or (program.uses_ring and program.ring_inbox(round_ - 1) is None)):
                        can_issue = False  # drain the rounds in flight first
                    if can_issue:
                        m = batch_len(round_)
                        plans_seq = [program.schedule(r) for r in range(round_, round_ + m)]
                        t_issue = time.perf_counter()
                        handle = (backend.step(round_, update, plans_seq[0]) if m == 1
                                  else backend.step_batch(round_, update, plans_seq))
                        pending.append((round_, m, handle, t_issue,
                                        [payload_nbytes(p) for p in plans_seq],
                                        _pull_bytes(update, n_parts)))
                        update = None
                        round_ += m
                        if len(pending) <= staleness:
                            continue
                    elif not pending:
                        break
                    r0, m, handle, t_issue, b_scheds, b_bcast = pending.popleft()
                    results_seq = ([backend.gather(handle)] if m == 1
                                   else backend.gather_batch(handle))
                    batch_s = time.perf_counter() - t_issue
                    if m > 1:
                        # how long the batch ran on the workers: issue to gather also counts
                        # the wait behind the batch before it (staleness), which would halve
                        # the batches
                        batch_s = max(sum(col) for col in zip(
                            *[[res["step_s"] for res in results] for results in results_seq]))
                    # the workers' wall clock on this loop's clock (rounds of a batch)
                    wall_to_loop = time.time() - time.perf_counter() + t_loop0
                    # rounds per batch: about target_s of work and at most max_bytes of
                    # partials, growing at most 4x at once
                    push_bytes = [payload_nbytes([res["partial"] for res in results])
                                  for results in results_seq]
                    max_rounds, target_s, max_bytes = _batch_settings()
                    batch_cap = int(max(1, min(max_rounds, 4 * m,
                                               target_s * m / max(batch_s, 1e-9),
                                               max_bytes / max(max(push_bytes), 1))))
                    for j, results in enumerate(results_seq):
                        r = r0 + j
                        partials = [res["partial"] for res in results]
                        new_update = program.pull(r, partials)
                        if m > 1 and new_update is not None:
                            raise RuntimeError(f"{type(program).__name__}.pull returned an "
                                               f"update for round {r}, which ran in a batch "
                                               f"(Program.batch_rounds)")
                        push_s = [res["push_s"] for res in results]
                        now = time.perf_counter() - t_loop0
                        if m == 1:
                            round_s = time.perf_counter() - t_issue
                            idle_s = [max(round_s - p, 0.0) for p in push_s]
                        else:  # timed on the workers: from the round before's end to its own
                            idle_s = [max(res["step_s"] - res["push_s"], 0.0) for res in results]
                            round_s = max(res["step_s"] for res in results)
                            # when the round ended on the workers (their wall clocks, kept
                            # in order and never after now against a skewed clock)
                            ended = max(res["t_end"] for res in results) - wall_to_loop
                            now = min(max(ended, history[-1]["time"] if history else 0.0),
                                      now)
                        rec = {"round": r, "time": now,
                               "round_s": round_s, "push_s": push_s, "idle_s": idle_s,
                               "bytes_schedule": b_scheds[j],
                               "bytes_push": push_bytes[j],
                               "bytes_pull": b_bcast if j == 0 else 0,
                               "bytes_ring": sum(res.get("bytes_ring", 0) for res in results),
                               # seconds each partition spent handing its ring messages over
                               "ring_s": [res.get("ring_s", 0.0) for res in results],
                               # losses recovered from before this round ran (details in
                               # RunResult.recoveries / the estimators' recoveries_)
                               "worker_losses": len(recoveries),
                               # the first round of the call it ran in (`batch_rounds`)
                               "batch": r0}
                        rec.update(program.metrics())
                        history.append(rec)
                        events.round(rec)
                        if bar is not None:
                            bar.update(1)
                            bar.set_postfix(program.progress_postfix()
                                            if hasattr(program, "progress_postfix") else {})
                        if callback is not None and callback(r, rec):
                            stop_round = r if stop_round is None else min(stop_round, r)
                        if stop_round is not None and r >= stop_round:
                            stopped = True
                        if program.converged():
                            converged = True
                        if update is not None:
                            # two pulls before the next push: deliver the older one now
                            backend.apply_all(update)
                        update = new_update
                    if (store is not None and not pending and not (converged or stopped)
                            and round_ % checkpoint_every == 0 and round_ < max_iter):
                        backend.apply_all(update)
                        update = None
                        checkpoint_now(round_)
                        backend.expect_round(round_)
                    if (converged or stopped) and not pending:
                        break
                if update is not None:
                    backend.apply_all(update)
                    update = None
                finished = (converged, stopped, round_)
                arrays = backend.collect_all() if program.gather_partitions else []
                collected = collect(backend) if collect is not None else None
                status = "converged" if converged else "stopped" if stopped else "max_iter"
                break
            except WorkerLostError as exc:
                offset = history[-1]["time"] if history else 0.0
                recoveries.append({"round": round_, "error": str(exc), "time": offset})
                logger.warning("worker lost at round %d (%s); recovering", round_, exc)
                events.worker_lost(round_, str(exc))
                if len(recoveries) > max_recoveries:
                    raise RecoveryError(f"gave up after {max_recoveries} worker losses (the "
                                        f"last: {exc})") from exc
                converged = stopped = False
                round_ = recover()
                if finished is not None:
                    recoveries[-1]["while"] = "collecting the result"
                    if round_ >= finished[2]:
                        converged, stopped = finished[0], finished[1]
                    finished = None
                recoveries[-1]["resumed_round"] = round_
                events.recovered(round_)
                offset = history[-1]["time"] if history else 0.0
    except SchedulerLostError as exc:
        raise scheduler_lost(exc, reached()) from exc
    finally:
        if bar is not None:
            bar.close()
        events.end(status, round_, time.perf_counter() - t_start)
    program.finish(arrays)
    return RunResult(history=history, n_rounds=round_, partition_arrays=arrays,
                     converged=converged, wall_s=time.perf_counter() - t_start,
                     recoveries=recoveries, fit_id=events.fit_id, stopped=bool(stopped),
                     collected=collected)


def history_arrays(history: list[dict]) -> dict:
    """List of per-round dicts -> dict of arrays (push_s becomes rounds x workers)."""
    if not history:
        return {}
    keys = list(history[0].keys())
    for rec in history[1:]:
        for k in rec:
            if k not in keys:
                keys.append(k)
    out = {}
    for k in keys:
        vals = [rec.get(k) for rec in history]
        try:
            out[k] = np.asarray(vals)
        except ValueError:
            out[k] = np.asarray(vals, dtype=object)
    return out
