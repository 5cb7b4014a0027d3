"""The contracts of a `Program`, as plain functions that raise ``AssertionError``.

Anyone writing a program (README: "Write your own model-parallel algorithm") can check it
keeps what the engine relies on, as `dmp.utils.estimator_checks` checks dmp's estimators::

    from dmp.engine.testing import check_program

    check_program(lambda: LeastSquaresGD(n_per_shard=500, n_features=5, step=0.5),
                  client=client, max_iter=50)

Each check takes ``program_factory``, a callable returning a new program (every run needs
its own: a run changes the driver state), and runs it with `dmp.engine.run`.  A run's result
is ``result(program, run_result) -> dict`` (`program_result` by default: the rounds run, the
program's metrics round by round, the partitions' arrays and the driver state); runs are
deterministic, so results are compared exactly unless ``rtol`` / ``atol`` say otherwise
(a number, or ``{entry: tolerance}``).  The checks that need a cluster take a ``client`` of
one whose workers run in processes, with at most ``n_partitions`` workers;
`check_program_worker_loss` kills one of them, so the cluster must restart it (the nannies
of a ``LocalCluster`` do).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager

from ..utils._checks import assert_same, kill_when, wait_for_workers, worker_addresses
from .backends import LocalBackend
from .checkpoint import CheckpointStore
from .comm import payload_nbytes
from .program import Broadcast, Program, Sends
from .runner import run

__all__ = ["program_result", "check_program", "check_program_backends",
           "check_program_bytes", "check_program_resume", "check_program_worker_loss",
           "check_program_pickles"]

#: how much the pickled program (what is shipped to every worker) may grow in a run
PICKLE_GROWTH_BYTES = 1024


def program_result(program, result) -> dict:
    """What a run found: its rounds, whether it converged, the program's metrics round by
    round (the keys of `Program.metrics`), the partitions' arrays and the driver state (when
    the program saves one)."""
    keys = sorted(program.metrics()) if result.history else []
    out = {"n_rounds": result.n_rounds, "converged": bool(result.converged),
           "metrics": {k: [rec.get(k) for rec in result.history] for k in keys},
           "partition_arrays": result.partition_arrays}
    if type(program).driver_state is not Program.driver_state:
        out["driver_state"] = dict(program.driver_state())
    return out


def _name(program) -> str:
    return type(program).__name__


@contextmanager
def _backend(client, n_partitions):
    if client is None:
        backend = LocalBackend(n_partitions)
    else:
        from .backends import DaskBackend

        backend = DaskBackend(client, n_workers=n_partitions)
    try:
        yield backend
    finally:
        backend.close()


def _run(program_factory, client, n_partitions, max_iter, **kwargs):
    program = program_factory()
    with _backend(client, n_partitions) as backend:
        return program, run(program, backend, max_iter=max_iter, **kwargs)


def _compare(got, want, *, result, rtol, atol, what):
    result = result or program_result
    assert_same(result(*got), result(*want), rtol=rtol, atol=atol, what=what)


def check_program_backends(program_factory, *, client, n_partitions: int = 2,
                           max_iter: int = 20, result=None, rtol=0.0, atol=0.0):
    """The program run on ``client``'s cluster gives the in-process result and the same byte
    counts, round for round."""
    local = _run(program_factory, None, n_partitions, max_iter)
    remote = _run(program_factory, client, n_partitions, max_iter)
    name = _name(local[0])
    if remote[1].recoveries:
        raise AssertionError(f"{name} on Dask recovered from a worker loss "
                             f"({remote[1].recoveries}) in a run that should have lost none")
    _compare(remote, local, result=result, rtol=rtol, atol=atol,
             what=f"{name} on Dask against in process")
    for key in ("bytes_schedule", "bytes_push", "bytes_pull", "bytes_ring"):
        assert_same({key: [h[key] for h in remote[1].history]},
                    {key: [h[key] for h in local[1].history]},
                    what=f"{name}'s byte counts on Dask against in process")
    return local, remote


def _buffer_bytes(obj) -> int:
    """Bytes of the buffers pickling ``obj`` sends out of band (numpy arrays' data, as Dask
    sends them)."""
    import cloudpickle

    buffers: list = []
    cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return sum(memoryview(b).nbytes for b in buffers)


def _pull_nbytes(update, n_partitions: int) -> int:
    if update is None:
        return 0
    if isinstance(update, Broadcast):
        return payload_nbytes(update.value) * n_partitions
    return payload_nbytes(update)


def _recording(program, log: dict):
    """``program`` made to note every plan, partial, pull result and ring message."""
    cls = type(program)

    def schedule(self, round):
        plans = cls.schedule(self, round)
        log["plans"][round] = plans
        return plans

    def push(self, state, plan):
        out = cls.push(self, state, plan)
        log["pushes"].append(out)
        return out

    def pull(self, round, partials):
        update = cls.pull(self, round, partials)
        log["pulls"][round] = update
        return update

    program.__class__ = type(f"Recording{cls.__name__}", (cls,),
                             {"schedule": schedule, "push": push, "pull": pull,
                              "__module__": cls.__module__})
    return program


def check_program_bytes(program_factory, *, n_partitions: int = 2, max_iter: int = 20):
    """Every round's ``bytes_*`` counts are the bytes of what the program sent in it.

    Run in process, each round's plans (``bytes_schedule``), partials (``bytes_push``), the
    pull result of the round before as it reaches the partitions (``bytes_pull``: a
    `Broadcast` once per partition) and the ring messages to other partitions
    (``bytes_ring``) are counted with `dmp.engine.comm.payload_nbytes`, and every message
    must hold no more array data (the buffers pickling sends out of band) than it counts: an
    array inside an object the count cannot see into travels uncounted.
    """
    log = {"plans": {}, "pushes": [], "pulls": {}}
    program = _recording(program_factory(), log)
    name = type(program).__mro__[1].__name__
    with _backend(None, n_partitions) as backend:
        res = run(program, backend, max_iter=max_iter)
    P = n_partitions
    if len(log["pushes"]) != P * len(res.history):
        raise AssertionError(f"{name}: {len(log['pushes'])} pushes in {len(res.history)} "
                             f"rounds of {P} partitions")
    total = 0
    for rec in res.history:
        r = rec["round"]
        plans = log["plans"][r]
        outs = log["pushes"][r * P:(r + 1) * P]
        partials = [o.partial if isinstance(o, Sends) else o for o in outs]
        ring = [(k, dest, msg) for k, o in enumerate(outs) if isinstance(o, Sends)
                for dest, msg in o.messages.items() if int(dest) != k]
        before = log["pulls"].get(r - 1)
        want = {"bytes_schedule": payload_nbytes(plans), "bytes_push": payload_nbytes(partials),
                "bytes_pull": _pull_nbytes(before, P),
                "bytes_ring": sum(payload_nbytes(m) for _, _, m in ring)}
        for key, n in want.items():
            if rec[key] != n:
                raise AssertionError(f"{name}, round {r}: the history counts {key}="
                                     f"{rec[key]}, but what was sent holds {n} bytes")
        total += sum(want.values())
        messages = ([(f"the plan for partition {k}", p) for k, p in enumerate(plans)]
                    + [(f"partition {k}'s partial", p) for k, p in enumerate(partials)]
                    + [(f"partition {k}'s ring message to {d}", m) for k, d, m in ring]
                    + [("the pull result", before.value if isinstance(before, Broadcast)
                        else before)])
        for what, msg in messages:
            seen, held = payload_nbytes(msg), _buffer_bytes(msg)
            if held > seen:
                raise AssertionError(
                    f"{name}, round {r}: {what} ({type(msg).__name__}) holds {held} bytes of "
                    f"array data but is counted as {seen}: the byte count sees numpy arrays "
                    f"in dicts, lists and tuples, not inside other objects")
    if total == 0:
        raise AssertionError(f"{name}: {len(res.history)} rounds sent no bytes at all")
    return res


def _resumable(program) -> bool:
    return type(program).load_driver_state is not Program.load_driver_state


def check_program_resume(program_factory, *, stop_at: int, checkpoint_every: int,
                         client=None, n_partitions: int = 2, max_iter: int = 20,
                         result=None, rtol=0.0, atol=0.0, directory=None):
    """A run stopped after round ``stop_at`` (a checkpoint every ``checkpoint_every`` rounds)
    and continued with ``resume=True`` gives the uninterrupted run's result, its history
    restored up to the last checkpoint.  In process, or on ``client``'s cluster."""
    ref = _run(program_factory, client, n_partitions, max_iter,
               checkpoint_every=checkpoint_every)
    name = _name(ref[0])
    if not _resumable(ref[0]):
        raise AssertionError(f"{name} cannot resume: it does not implement "
                             f"load_driver_state (and driver_state)")
    if not stop_at < ref[1].n_rounds - 1:
        raise ValueError(f"stop_at={stop_at}: the uninterrupted run has only "
                         f"{ref[1].n_rounds} rounds")
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        ckpt = os.path.join(tmp, "checkpoint.zarr")
        stopped = _run(program_factory, client, n_partitions, max_iter, checkpoint=ckpt,
                       checkpoint_every=checkpoint_every, callback=lambda r, m: r >= stop_at)
        written = CheckpointStore(ckpt).latest()
        if written is None:
            raise ValueError(f"{name} wrote no checkpoint before round {stop_at} "
                             f"(checkpoint_every={checkpoint_every})")
        resumed = _run(program_factory, client, n_partitions, max_iter, checkpoint=ckpt,
                       checkpoint_every=checkpoint_every, resume=True)
    t_stop = [h["time"] for h in stopped[1].history]
    t_res = [h["time"] for h in resumed[1].history]
    if t_res[:written] != t_stop[:written] or (written < len(t_stop)
                                               and t_res[written] == t_stop[written]):
        raise AssertionError(f"{name}: the resumed run did not go on from its checkpoint of "
                             f"round {written} with the history before it restored")
    _compare(resumed, ref, result=result, rtol=rtol, atol=atol,
             what=f"{name} resumed against uninterrupted")
    return resumed


def check_program_worker_loss(program_factory, *, client, at=None, n_partitions: int = 2,
                              max_iter: int = 20, checkpoint_every=None, result=None,
                              rtol=0.0, atol=0.0, directory=None):
    """A run on ``client``'s cluster that loses a worker process (SIGKILL, sent when the
    callback sees round ``at``: by default a third of the rounds) recovers once and gives
    the undisturbed in-process result.

    Without ``checkpoint_every`` the run recovers as the program allows (`Program.after_loss`,
    or starting over); with it, from the last checkpoint.
    """
    ref = _run(program_factory, None, n_partitions, max_iter)
    name = _name(ref[0])
    if at is None:
        at = max(1, ref[1].n_rounds // 3)
    n_cluster = len(worker_addresses(client))
    kill, fired = kill_when(client, lambda r, m: r >= at)

    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        extra = {} if checkpoint_every is None else {
            "checkpoint": os.path.join(tmp, "checkpoint.zarr"),
            "checkpoint_every": checkpoint_every}
        wait_for_workers(client, n_cluster)
        try:
            lost = _run(program_factory, client, n_partitions, max_iter, callback=kill,
                        **extra)
        finally:
            wait_for_workers(client, n_cluster)
    if not fired:
        raise AssertionError(f"{name}: the run ended before round {at}, when the worker was "
                             f"to be killed")
    if len(lost[1].recoveries) != 1:
        raise AssertionError(f"{name}: a worker killed at round {fired[0][0]}, but the run "
                             f"recovered from {len(lost[1].recoveries)} losses: "
                             f"{lost[1].recoveries}")
    _compare(lost, ref, result=result, rtol=rtol, atol=atol,
             what=f"{name} after a worker loss against undisturbed")
    return lost


def check_program_pickles(program_factory, *, n_partitions: int = 2, max_iter: int = 20):
    """The program pickles (it is shipped to every worker) without its driver state, and a
    run does not make it bigger: what the driver keeps belongs in ``self.driver``, what a
    partition keeps in its state, not on the program object."""
    import cloudpickle

    program = program_factory()
    name = _name(program)
    try:
        before = len(cloudpickle.dumps(program))
    except Exception as exc:
        raise AssertionError(f"{name} cannot be pickled, so it cannot be shipped to the "
                             f"workers: {type(exc).__name__}: {exc}") from exc
    with _backend(None, n_partitions) as backend:
        run(program, backend, max_iter=max_iter)
    shipped = cloudpickle.loads(cloudpickle.dumps(program))
    if getattr(shipped, "driver", {}) != {}:
        raise AssertionError(f"{name} ships its driver state to the workers (its pickle "
                             f"keeps `driver`; Program.__getstate__ drops it)")
    after = len(cloudpickle.dumps(program))
    if after > before + PICKLE_GROWTH_BYTES:
        grown = sorted(k for k, v in vars(program).items() if k != "driver"
                       and len(cloudpickle.dumps(v)) > PICKLE_GROWTH_BYTES)
        raise AssertionError(f"{name}'s pickle grew from {before} to {after} bytes in a run "
                             f"(attributes {grown}): state kept on the program object outside "
                             f"`driver` travels to every worker and, in process, is shared by "
                             f"all partitions")
    return program


def check_program(program_factory, *, client=None, n_partitions: int = 2, max_iter: int = 20,
                  stop_at=None, checkpoint_every=None, result=None, rtol=0.0, atol=0.0,
                  worker_loss: bool = True) -> dict:
    """Run every contract that applies to the program.

    Without ``client`` only the in-process checks run.  Resuming is checked for a program
    that implements `Program.load_driver_state`, stopped at ``stop_at`` (default: half its
    rounds) with a checkpoint every ``checkpoint_every`` rounds (default: a quarter);
    ``worker_loss=False`` leaves the worker loss out.

    Returns
    -------
    dict
        ``{check: None}`` for each check run, ``{check: reason}`` for each left out.
    """
    done = {}
    check_program_pickles(program_factory, n_partitions=n_partitions, max_iter=max_iter)
    done["pickles"] = None
    res = check_program_bytes(program_factory, n_partitions=n_partitions, max_iter=max_iter)
    done["bytes"] = None
    cmp = dict(result=result, rtol=rtol, atol=atol)
    if _resumable(program_factory()):
        n = len(res.history)
        every = checkpoint_every or max(1, n // 4)
        stop = stop_at if stop_at is not None else max(every, n // 2)
        for backend in (None, client) if client is not None else (None,):
            check_program_resume(program_factory, stop_at=stop, checkpoint_every=every,
                                 client=backend, n_partitions=n_partitions,
                                 max_iter=max_iter, **cmp)
            done["resume" if backend is None else "resume on Dask"] = None
    else:
        done["resume"] = "the program does not implement load_driver_state"
    if client is None:
        done["backends"] = done["worker loss"] = "no client given"
        return done
    check_program_backends(program_factory, client=client, n_partitions=n_partitions,
                           max_iter=max_iter, **cmp)
    done["backends"] = None
    if worker_loss:
        check_program_worker_loss(program_factory, client=client, n_partitions=n_partitions,
                                  max_iter=max_iter, **cmp)
        done["worker loss"] = None
    else:
        done["worker loss"] = "worker_loss=False"
    return done
