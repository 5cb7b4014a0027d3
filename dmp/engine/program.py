"""The STRADS programming model: ``schedule`` / ``push`` / ``pull`` (+ ``apply``).

A :class:`Program` describes one model-parallel algorithm.  The model is split into
*partitions*, one per worker; each partition holds a data shard and the model variables it
owns.  One round of the runner is::

    plans    = program.schedule(round)                 # driver: which variables, per partition
    partials = [program.push(state_k, plans[k]) ...]   # every partition, in parallel (workers)
    update   = program.pull(round, partials)           # driver: reduce, new values, barrier
    program.apply(state_k, update)                     # every partition, before its next push

Driver-side attributes live in ``self.driver`` (a dict, or a `DriverState` dataclass), which
is never pickled: the program object shipped to workers carries only configuration (dataset
URL, hyper-parameters).  Plans, partial results and updates may be `Message` dataclasses,
one class per kind, which ``push``, ``apply`` and ``pull`` dispatch on with ``match``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Message:
    """Base of a program's typed plans, partial results and updates (dataclasses defined at
    module level, so that the workers unpickle them by name).

    Byte accounting (`dmp.engine.comm.payload_nbytes`) counts a message's fields and one
    scalar for its type, as it counts a dict's values and its ``"kind"`` tag.
    """

    __slots__ = ()


def unexpected(program, what: str, message, expected: tuple[type, ...]) -> TypeError:
    """The error of a ``match`` over messages that meets none of the types it handles
    (``what``: "a plan", "an update", ...)."""
    names = ", ".join(t.__name__ for t in expected)
    return TypeError(f"{type(program).__name__} got {what} of type "
                     f"{type(message).__name__}; it handles {names}")


class DriverState:
    """Base of a program's typed driver state (a dataclass with one field per variable).

    ``state["name"]`` reads field ``name`` and ``state.get("name", default)`` reads it, or
    ``default`` while it is None (not set yet), as they read the dict that drivers were
    before.
    """

    __slots__ = ()

    def __getitem__(self, name: str):
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None

    def get(self, name: str, default=None):
        value = getattr(self, name, None)
        return default if value is None else value


@dataclass(frozen=True)
class Broadcast:
    """A pull result sent unchanged to every partition (counted once per partition)."""

    value: Any


@dataclass(frozen=True)
class Sends:
    """What a push returns when it also hands data to other partitions (a ring transfer).

    ``partial`` goes to the driver's pull as usual.  Each ``messages[dest]`` goes straight to
    partition ``dest`` -- worker to worker on Dask, never through the driver -- and is handed
    to :meth:`Program.receive` there before ``dest``'s push of the next round, so that push
    sees it (a ring program's rounds overlap, with staleness, only when it declares its
    messages: :meth:`Program.ring_inbox`; otherwise they run bulk synchronously, and a
    message also lands before the round's apply, save or collect).  With overlapping rounds
    a message may land while ``dest`` runs an apply or the push of an earlier round.  The
    bytes are counted as ``bytes_ring``.
    """

    partial: Any
    messages: dict


def update_for(updates, k: int):
    """The part of a pull result meant for partition ``k`` (None: nothing to apply)."""
    if updates is None:
        return None
    if isinstance(updates, Broadcast):
        return updates.value
    return updates[k]


class Program:
    """Base class of a model-parallel algorithm; subclass and override the methods.

    Driver side: :meth:`partition_specs`, :meth:`start`, :meth:`schedule`, :meth:`pull`,
    :meth:`metrics`, :meth:`converged`, :meth:`driver_state`, :meth:`load_driver_state`,
    :meth:`finish`.  Worker side: :meth:`init_partition`, :meth:`push`, :meth:`apply`,
    :meth:`partition_arrays`, :meth:`checkpoint_arrays`, :meth:`restore_partition`.
    """

    name = "program"
    #: the metric the dashboard and ``dmp monitor`` put first
    primary_metric = "objective"
    #: collect every partition's arrays at the end of the fit (for :meth:`finish`); False
    #: when the model lives on the driver and the partitions hold only auxiliary state
    gather_partitions = True

    def __init__(self):
        self.driver: dict = {}

    def __getstate__(self):
        state = self.__dict__.copy()
        state["driver"] = {}
        return state

    # ------------------------------------------------------------------ driver side
    def partition_specs(self, n_partitions: int) -> list:
        """Small picklable descriptions of each partition (e.g. the shard ids it loads)."""
        raise NotImplementedError

    def start(self, n_partitions: int) -> None:
        """Initialise the driver state (called after the partitions exist)."""

    def schedule(self, round: int) -> list:
        """Return one plan per partition for this round."""
        raise NotImplementedError

    def needs_barrier(self, round: int) -> bool:
        """True when ``round`` must not start before every earlier round was pulled and
        applied (only matters with staleness > 0)."""
        return False

    def pull(self, round: int, partials: list):
        """Reduce the partial results; return a :class:`Broadcast` or a list of updates."""
        raise NotImplementedError

    def metrics(self) -> dict:
        """Scalar metrics of the last pulled round, recorded in ``history_`` and sent to the
        live monitor (`dmp.monitor`): ``objective`` (or the program's ``primary_metric``) is
        plotted against time and round; keys named ``sched_<name>`` go to the dashboard's
        schedule panel."""
        return {}

    def converged(self) -> bool:
        return False

    def progress_postfix(self) -> dict:
        """What the progress bar shows after each round (e.g. the objective); default none."""
        return {}

    def driver_state(self) -> dict:
        """Arrays and JSON scalars that restore the driver on resume."""
        return {}

    def load_driver_state(self, state: dict) -> None:
        raise NotImplementedError

    def after_loss(self) -> bool:
        """Called when the partitions were re-created after a worker loss and there is no
        checkpoint: return True when the program can go on from its driver-side state (its
        next `schedule` then restores the partitions), False to start the fit over."""
        return False

    def finish(self, partition_arrays: list[dict]) -> None:
        """Receive every partition's arrays at the end of the fit."""

    def partition_nbytes(self, spec) -> int | None:
        """About how many bytes partition ``spec`` holds on its worker (model part, data
        shard, buffers), from metadata only; None when unknown.  The Dask backend compares it
        with each worker's memory limit before it creates any partition."""
        return None

    # ------------------------------------------------------------------ worker side
    def init_partition(self, spec):
        """Load the partition's data (on the worker) and return its mutable state."""
        raise NotImplementedError

    def push(self, state, plan):
        """Compute a partial result from resident data and owned variables."""
        raise NotImplementedError

    def apply(self, state, update) -> None:
        """Apply a pull result to the partition state."""

    #: True when pushes return `Sends`: the backend then connects the partitions to each
    #: other before the first round
    uses_ring = False

    def receive(self, state, round: int, src: int, payload) -> None:
        """Take a message sent by partition ``src``'s push of ``round`` (see `Sends`).  It
        can arrive before or while this partition runs its own push of the same round (in
        process, partitions push one after the other; on Dask, concurrently), or, when rounds
        overlap (`ring_inbox`), during an apply or an earlier round's push: store it aside,
        keyed by ``round``, and do not touch what a push or apply is using."""
        raise NotImplementedError(f"{type(self).__name__} sends ring messages but does not "
                                  f"receive them")

    def ring_inbox(self, round: int) -> list[int] | None:
        """How many ring messages each partition receives from the *other* partitions'
        pushes of ``round``, when the schedule fixes it in advance; None when only the
        pushes know.  Declaring it lets a ring program's rounds overlap (``staleness > 0``):
        each push first waits for exactly these messages of the round before.  A ring
        program that returns None runs bulk synchronously."""
        return None

    def batch_rounds(self, round: int) -> int:
        """How many consecutive rounds from ``round`` on may run in one call to each
        partition (default 1).  Only for ring programs whose partitions take everything a
        push needs from the other partitions' messages (`ring_inbox` declared): the pulls of
        a batch's rounds happen after the whole batch ran and must return None.  Batching
        spares a round its calls between the driver and the workers, which dominate rounds
        of a few milliseconds; the runner picks the batch length (at most this many, never
        across a round that starts drained) so that a batch takes about
        ``dmp.batch.target-duration`` and brings back at most ``dmp.batch.max-bytes`` of
        partials (Dask settings); the results do not depend on it."""
        return 1

    def close_batch(self, state, round: int, partials: list) -> list:
        """The partials of a batch's rounds ``round, round + 1, ...`` (`batch_rounds`) as
        this partition hands them back; runs on the partition after the batch's last push (a
        round run on its own is a batch of one).  A push may report something about the
        round before it (what that round's ring messages told the partition): here it can
        move that report into the earlier round's partial and drop what the report makes
        redundant there, so that only the batch's last round carries it in full.  The
        driver's `pull` of each round then sees the moved report.  Default: unchanged."""
        return partials

    def lead_rounds(self, n_partitions: int) -> int:
        """How many rounds at the start of a fit on ``n_partitions`` partitions do other work
        than the rounds after them (default 1: the first round, which often only starts the
        fit).  The planner (`dmp.plan`) prices these rounds as its probe measured them and
        every later one at the mean of the probe's later rounds, so a start far cheaper or
        dearer than the rest (LDA's counting rotation and first sweep, 2P rounds) is not
        taken for the typical round."""
        return 1

    #: the planner's probe (`dmp.plan`) runs this program's fit on to its stopping rule,
    #: up to `dmp.planning.COUNT_FACTOR` times the probe's seconds, when the rounds to it
    #: depend on the number of partitions (the Lasso's block-Jacobi rounds): a probe cut
    #: short by its time would leave the planner only the fit's round budget
    probe_to_stopping_rule = False

    def warm_up_rounds(self, n_partitions: int) -> int:
        """How many rounds a first fit on ``n_partitions`` partitions must run for every
        kernel of its rounds to have run once: the planner's warm-up before its probes
        (default: two rounds past the lead rounds, as far as a probe runs at least)."""
        return self.lead_rounds(n_partitions) + 2

    def partition_arrays(self, state) -> dict:
        """The partition's model variables (checkpointed and gathered at the end)."""
        return {}

    def checkpoint_arrays(self, state) -> dict:
        """What a checkpoint of the partition holds (default: :meth:`partition_arrays`):
        state a resume needs beyond the result, such as the Lasso's residual, which is not
        gathered at the end.  Written while no round runs, so views of the state will do."""
        return self.partition_arrays(state)

    def restore_partition(self, state, arrays: dict) -> None:
        """Set the model variables from a checkpoint."""
