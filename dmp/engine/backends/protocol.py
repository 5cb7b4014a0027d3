"""The backend interface (`Backend`) and its check (`check_backend`).

It imports no backend, so that every backend module can import it: `LocalBackend` and
`DaskBackend` derive from `Backend`; the runner and `resolve_backend` check what they are
given with `check_backend`.
"""

from __future__ import annotations

import abc


class Backend(abc.ABC):
    """What the runner (`dmp.engine.run`) asks of an execution backend.

    A backend holds the partitions of one fit -- in this process (`LocalBackend`) or on a
    cluster (`DaskBackend`) -- and runs the rounds' pushes and applies on them.  Subclass it
    and implement every abstract member; an object that does not subclass it is accepted
    when it has every member (`check_backend`).

    Capabilities are properties (or class attributes) the runner and the estimators read
    instead of probing for methods:

    ``needs_store``
        The partitions load their data in other processes, so an in-memory dataset must be
        written to a store they can open first.
    ``in_driver_process``
        The pushes run in the driver's own process (then the driver's BLAS keeps its
        threads; otherwise it runs on one, see `dmp.engine.run`).
    ``runs_batches``
        The backend runs several rounds in one call to each partition (`step_batch` and
        `gather_batch`, see `Program.batch_rounds`).
    ``overlaps_rounds``
        `step` returns before the pushes finish, so rounds kept in flight (``staleness``)
        run while the driver works on the ones before.
    ``sends_events``
        `log_event` reaches a live monitor (the scheduler's event log); the runner then
        sends the fit's events (`dmp.engine.events`).
    """

    #: a short name for the kind of backend ("local", "dask")
    kind: str = "backend"
    #: the worker of each partition, as placed now (empty when the partitions have none)
    placement: tuple | list = ()

    # ------------------------------------------------------------------ capabilities
    @property
    @abc.abstractmethod
    def needs_store(self) -> bool:
        """Whether the partitions need their data in a store they can open."""

    @property
    @abc.abstractmethod
    def in_driver_process(self) -> bool:
        """Whether the pushes run in the driver's process."""

    @property
    @abc.abstractmethod
    def runs_batches(self) -> bool:
        """Whether `step_batch` / `gather_batch` run several rounds in one call."""

    @property
    @abc.abstractmethod
    def overlaps_rounds(self) -> bool:
        """Whether `step` returns before the pushes finish."""

    @property
    @abc.abstractmethod
    def sends_events(self) -> bool:
        """Whether `log_event` reaches a live monitor."""

    # ------------------------------------------------------------------ partitions
    @property
    @abc.abstractmethod
    def n_partitions(self) -> int:
        """Number of partitions (one per worker)."""

    @abc.abstractmethod
    def start(self, program, specs) -> None:
        """Create one partition per spec (`Program.partition_specs`)."""

    @abc.abstractmethod
    def restart(self, program, specs) -> None:
        """Re-create the partitions after a worker loss."""

    @abc.abstractmethod
    def expect_round(self, round: int) -> None:
        """The next `step` runs ``round`` (after a start, restore or checkpoint)."""

    @abc.abstractmethod
    def step(self, round, updates, plans):
        """Apply ``updates`` (a pull result or None) and push ``plans[k]`` on every partition
        ``k``; return a handle for `gather`."""

    def step_batch(self, round, updates, plans_seq):
        """Rounds ``round .. round + len(plans_seq) - 1`` in one call per partition; only
        called when `runs_batches` is true."""
        raise NotImplementedError(f"{type(self).__name__} does not run batches of rounds")

    @abc.abstractmethod
    def gather(self, handle) -> list:
        """The results of a `step`, one per partition (``{"partial": ..., "push_s": ...}``)."""

    def gather_batch(self, handle) -> list[list]:
        """The results of a `step_batch`: one list (per partition) per round."""
        raise NotImplementedError(f"{type(self).__name__} does not run batches of rounds")

    @abc.abstractmethod
    def apply_all(self, updates) -> None:
        """Apply a pull result on every partition."""

    @abc.abstractmethod
    def save_all(self, paths) -> list:
        """Write each partition's arrays to ``paths[k]``; return their manifests."""

    @abc.abstractmethod
    def restore_all(self, paths, manifests=None) -> None:
        """Restore each partition's arrays from ``paths[k]``."""

    @abc.abstractmethod
    def collect_all(self, method: str | None = None) -> list[dict]:
        """Every partition's arrays (`Program.partition_arrays`, or ``method``)."""

    def collect_stream(self, sink, method: str | None = None, start=None,
                       piece_bytes: int | None = None) -> None:
        """As `collect_all`, handed to ``sink(partition, name, row, piece)`` array by array
        (`DaskBackend.collect_stream` sends pieces of at most ``piece_bytes``; this default
        hands each array whole).  ``start``, when given, first receives every partition's
        ``{name: (shape, dtype.str)}``."""
        import numpy as np

        arrays = [{k: np.asarray(v) for k, v in a.items()} for a in self.collect_all(method)]
        if start is not None:
            start([{k: (v.shape, v.dtype.str) for k, v in a.items()} for a in arrays])
        for k, a in enumerate(arrays):
            for name, v in a.items():
                sink(k, name, 0, v)

    @abc.abstractmethod
    def call_all(self, method, *args) -> list:
        """``program.<method>(state, *args)`` on every partition; their results."""

    # ------------------------------------------------------------------ the rest
    def log_event(self, msg: dict, wait: bool = False) -> None:
        """Send one fit event (`dmp.engine.events`); nothing when `sends_events` is false."""

    def register_monitor(self) -> bool:
        """Make sure the live monitor listens (called once a fit that sends events starts);
        whether it does."""
        return False

    @abc.abstractmethod
    def describe(self) -> str:
        """One line naming the backend and its workers."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the partitions."""


#: the capabilities every backend declares (see `Backend`)
CAPABILITIES = ("needs_store", "in_driver_process", "runs_batches", "overlaps_rounds",
                "sends_events")


def _required_members() -> tuple[str, ...]:
    """The members an object must have to be used as a backend."""
    abstract = sorted(Backend.__abstractmethods__)
    return (*CAPABILITIES, *(n for n in abstract if n not in CAPABILITIES), "log_event",
            "collect_stream")


#: `Backend` subclasses found complete by `check_backend`
_COMPLETE: set = set()


def check_backend(backend):
    """Return ``backend`` when it has the interface of `Backend`, else raise TypeError
    naming what it lacks.

    A `Backend` subclass that leaves a member abstract cannot be instantiated at all; an
    object that does not subclass `Backend` is checked member by member.  A backend that
    declares ``runs_batches`` must also have `Backend.step_batch` and `Backend.gather_batch`.
    """
    # the class first: reading a property (DaskBackend.in_driver_process asks the scheduler)
    # only to see that it is there would cost a call.  A `Backend` subclass has every member
    # on its class (it could not be instantiated otherwise): its class is checked once
    cls = type(backend)
    missing = [] if cls in _COMPLETE else [
        n for n in _required_members()
        if getattr(cls, n, None) is None and not hasattr(backend, n)]
    if not missing and isinstance(backend, Backend):
        _COMPLETE.add(cls)
    if missing:
        caps = [n for n in missing if n in CAPABILITIES]
        methods = [n for n in missing if n not in CAPABILITIES]
        what = []
        if caps:
            what.append(f"the capabilit{'y' if len(caps) == 1 else 'ies'} "
                        f"{', '.join(map(repr, caps))}")
        if methods:
            what.append(f"the member{'' if len(methods) == 1 else 's'} "
                        f"{', '.join(map(repr, methods))}")
        raise TypeError(f"{type(backend).__name__} is not a dmp backend: it does not declare "
                        f"{' or '.join(what)} (subclass dmp.engine.backends.Backend)")
    if backend.runs_batches:
        lacking = [n for n in ("step_batch", "gather_batch") if not _implements(backend, n)]
        if lacking:
            raise TypeError(f"{type(backend).__name__} declares runs_batches but does not "
                            f"implement {' or '.join(map(repr, lacking))}")
    return backend


def _implements(backend, name: str) -> bool:
    """Whether ``backend`` has its own ``name`` (not `Backend`'s placeholder)."""
    impl = getattr(type(backend), name, None)
    if impl is None:
        return hasattr(backend, name)
    return impl is not getattr(Backend, name, None)
