"""`plan`: what a fit would do on P workers, predicted from a short probe of the real fit.

The planner runs the estimator's own fit (`dmp.base.DMPEstimator`, the path every model
shares) on the in-process backend at each probed number of partitions, running batches of
rounds as the Dask backend does, for a few seconds each, and reads what the engine records
of every round (``history_``): the seconds each partition pushed (the kernels' cost, on one
core), the driver's share of the round (the rest of its thread's CPU: schedule, pull,
metrics and bookkeeping, less the partitions' ring hand-overs, which a cluster's workers
do), the bytes of every kind of message, and the rounds each call of the Dask backend would
batch (`Program.batch_rounds`);
with ``probe_on`` (`probe`'s ``on``) the probes run on one worker of a cluster instead, so
that the kernels are timed at the workers' own speed, and with ``probe_all_workers`` on every
worker at once, so that they are timed as they run when all workers are busy.
How many rounds the fit takes against P comes from the algorithm itself: the estimator's
round budget at P (its ``max_iter`` in rounds: LDA's P sub-rounds a sweep, ParMAC's
``e P + P`` hops an iteration, MF's rounds an iteration) and, where the stopping rule ends
the fit sooner (the Lasso's duality gap, whose block-Jacobi rounds grow with P), the rounds
the probe took to stop.  Memory per worker is the program's own estimate of a partition
(`Program.partition_nbytes`) plus the worker's fixed cost, checked as the Dask backend
checks it before a fit.

A round on P workers is predicted as::

    compute  = slowest partition's push / min(cores_per_worker, 1)
               (with ``cpu_period``: as bursts of a CPU quota, `throttled_seconds`)
               (the program's lead rounds, `Program.lead_rounds`, as the probe measured
               them, every later round at the mean of the probe's later rounds)
    driver   = driver's share / min(driver_cores, 1)
    comm     = (driver bytes / bandwidth + 2 latency) / rounds per call
               + ring bytes per worker / bandwidth + ring messages x latency
    overhead = (P call_s / min(driver_cores, 1) + worker_call_s / min(cores_per_worker, 1))
               / rounds per call
               + (message_s + (ring messages - 1) x fanout_message_s
                  + ring bytes per worker x ring_byte_s) / min(cores_per_worker, 1)

(the last term for rounds with ring messages: the first message of a round costs a hop, the
others of the same round, sent and received concurrently, what each adds to it, and every
byte the worker's time to send it and receive as many).

and the round loop as rounds x (compute + driver + comm + overhead).  The kernels run on one
thread, so more than one core per worker does not make them faster.  ``call_s``,
``worker_call_s`` and ``message_s`` are the engine's own costs of an actor call and a ring
message (`EngineCosts`; `measure_engine` measures them on a cluster).  Beyond the largest
probed P the per-iteration quantities are extrapolated from the probes (and the row says
so).  Not modelled: rounds whose cost drifts over the fit after the lead rounds (LDA's
lead rounds include its first sweep, the dearest, but the later sweeps keep getting cheaper
as the topics concentrate: at K = 100-1000 the fifth costs about 0.75x the second), rounds
overlapping with ``staleness`` (on the Dask backend they were measured not to), the
scheduler, and a network shared by more than the driver's link.
"""

from __future__ import annotations

import copy
import math
import re
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
from sklearn.base import clone

from . import config
from .engine.backends.dask import collect_transient_bytes, worker_base_bytes
from .engine.backends.local import LocalBackend
from .engine.program import Message, Program, Sends
from .engine.runner import run

__all__ = ["plan", "plan_memory", "Network", "parse_network", "EngineCosts", "Probe", "predict",
           "probe", "probe_program", "probe_estimator", "measure_engine", "NullProgram",
           "table_text", "plot_plan", "throttled_seconds"]


# --------------------------------------------------------------------------- the network

_BANDWIDTH_UNITS = {  # bits per second
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "b": 8, "kb": 8e3, "mb": 8e6, "gb": 8e9, "tb": 8e12,
    "kib": 8 * 2**10, "mib": 8 * 2**20, "gib": 8 * 2**30,
}
_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"(\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?)"


@dataclass(frozen=True)
class Network:
    """A network link: ``bandwidth`` in bytes per second, one-way ``latency`` in seconds."""

    bandwidth: float
    latency: float

    def __str__(self):
        return f"{self.bandwidth * 8 / 1e9:g}Gbit/s, {self.latency * 1e6:g}us"


def parse_network(text) -> Network:
    """``"10Gbit,50us"`` -> `Network` (a `Network` is returned as it is).

    The bandwidth takes ``bit``, ``Kbit``, ``Mbit``, ``Gbit``, ``Tbit`` (bits per second)
    or ``B``, ``KB``, ``MB``, ``GB``, ``MiB``, ``GiB`` (bytes per second), with an optional
    ``/s``; the latency ``s``, ``ms``, ``us`` or ``ns``.
    """
    if isinstance(text, Network):
        return text
    form = "a bandwidth and a latency such as '10Gbit,50us' or '1GB/s,0.1ms'"
    if not isinstance(text, str) or text.count(",") != 1:
        raise ValueError(f"network must be {form}, got {text!r}")
    bw_text, lat_text = (part.strip().lower().replace(" ", "") for part in text.split(","))
    m = re.fullmatch(_NUMBER + r"([a-z]+)(?:/s|ps)?", bw_text)
    if m is None or m.group(2) not in _BANDWIDTH_UNITS:
        raise ValueError(f"network {text!r}: cannot read the bandwidth {bw_text!r} (units: "
                         f"bit, Kbit, Mbit, Gbit, Tbit, B, KB, MB, GB, MiB, GiB per second); "
                         f"network must be {form}")
    bandwidth = float(m.group(1)) * _BANDWIDTH_UNITS[m.group(2)] / 8
    latency = _seconds(lat_text)
    if latency is None:
        raise ValueError(f"network {text!r}: cannot read the latency {lat_text!r} (units: s, "
                         f"ms, us, ns); network must be {form}")
    if not bandwidth > 0 or not math.isfinite(bandwidth):
        raise ValueError(f"network {text!r}: the bandwidth must be > 0")
    return Network(bandwidth=bandwidth, latency=latency)


def _seconds(text: str) -> float | None:
    """``"50us"`` -> 5e-05 (units s, ms, us, µs, ns); None if it is not such a duration."""
    m = re.fullmatch(_NUMBER + r"(s|ms|us|µs|ns)", text.strip().lower().replace(" ", ""))
    return None if m is None else float(m.group(1)) * _LATENCY_UNITS[m.group(2)]


@dataclass(frozen=True)
class EngineCosts:
    """The engine's fixed costs on a cluster, in seconds of one core.

    Attributes
    ----------
    call_s : float
        Driver time per actor call of a round (one per partition: sending the plan,
        receiving the partial).
    worker_call_s : float
        Worker time per call (its event loop, the call's bookkeeping), which the workers
        pay in parallel.
    message_s : float
        Worker time per ring hop: one message sent and received (both ends), as a chain of
        rounds with one message each pays it.
    fanout_message_s : float
        Worker time each further message of the same round adds (all-to-all rounds such
        as CCD++'s, whose P - 1 messages a partition sends and receives concurrently).
    round_s : float
        Driver time per call independent of P (the runner's bookkeeping of a call).
    ring_byte_s : float
        Worker time per byte of the ring messages a partition sends in a round (serialising
        and handing them over, and receiving as many from the others): on the emulated
        0.2-core workers a 4 MiB hop costs 3.6 ms of wall time more than an 8-byte one,
        about 1.5 GB/s of one core.  The network's own bandwidth is charged on top (`comm`).

    The defaults were measured with `NullProgram` on emulated clusters of 1-8 workers of
    0.18 core each (`dmp.testing.EmulatedCluster`) and turned into seconds of one core
    (BENCHMARKS.md, "Scaling on an emulated cluster"); `measure_engine` measures a cluster.
    A further message of an all-to-all round measured about as much as a hop there (0.2-core
    workers: handling a message is CPU work at both ends, which concurrency does not hide).
    """

    call_s: float = 0.7e-3
    worker_call_s: float = 1.3e-3
    message_s: float = 1.3e-3
    round_s: float = 0.0
    fanout_message_s: float = 1.3e-3
    ring_byte_s: float = 0.7e-9


# --------------------------------------------------------------------------- probes

@dataclass
class Probe:
    """What one probe measured at ``n_partitions`` (on one core; means over the probed
    rounds after the first)."""

    n_partitions: int
    #: rounds of the whole fit: those the probe took when it ran to the stopping rule,
    #: else the fit's round budget (``max_rounds``)
    rounds: int
    rounds_source: str
    #: the fit's round budget at this P (its max_iter in rounds)
    max_rounds: int
    #: seconds of the slowest partition's push per round
    compute_s: float
    #: CPU seconds of the driver per round (its thread's, less the partitions' pushes,
    #: applies and ring hand-overs)
    driver_s: float
    #: bytes per round through the driver (plans, partials and pull results, all partitions)
    driver_bytes: float
    #: ring bytes and messages per worker per round (worker to worker)
    ring_bytes: float = 0.0
    ring_messages: float = 0.0
    #: the longest run of rounds one call may batch, on average (Program.batch_rounds)
    batch_rounds: float = 1.0
    #: bytes of the largest partition (Program.partition_nbytes; None: unknown)
    partition_bytes: int | None = None
    probed_rounds: int = 0
    probe_s: float = 0.0
    #: where it ran: "in process", or the address of the Dask worker that ran it
    where: str = "in process"
    #: the fit's first rounds that do other work than the rest (`Program.lead_rounds`, as
    #: many as the probe saw before a later round): how many, and the seconds of their
    #: slowest partitions' pushes together (``compute_s`` is the mean of the rounds after)
    lead_rounds: int = 0
    lead_compute_s: float = 0.0
    #: the compute of every probed round in order, the lead rounds first (seconds of one
    #: core): what a worker with a CPU quota makes of each (`throttled_seconds`)
    round_compute_s: tuple[float, ...] = ()


def _probe_from_history(rec: "_Recorder", P: int, *, max_rounds: int,
                        batch_lengths: list[int], partition_bytes, probe_s: float) -> Probe:
    """A `Probe` from what the recorder saw of a run, round by round: the program's lead
    rounds (`Program.lead_rounds`; at least the first, which compiles and warms caches)
    apart from the later ones, as long as there are later ones."""
    history = rec.records
    if not history:
        raise RuntimeError(f"the probe at {P} partition(s) ran no round")
    n = len(history)
    first = min(max(rec.lead, 1), n - 1)
    # a cluster's workers apply and receive in parallel
    compute = [max(rec.round_pushes.get(j) or [0.0]) + rec.round_applies.get(j, 0.0) / P
               for j in range(n)]
    lead_compute, compute = compute[:first], compute[first:]
    dbytes, rbytes = [], []
    for j in range(first, n):
        r = history[j]
        dbytes.append(r["bytes_schedule"] + r["bytes_push"] + r["bytes_pull"])
        rbytes.append(r.get("bytes_ring", 0) / P)
    # the driver: this thread's CPU between the first and the last recorded round less the
    # partitions' work done in between (a batch runs several rounds' pushes before their
    # records, so the work is summed over the span, not matched to a record) and less their
    # ring messages' hand-over, which in process runs here and on a cluster on each worker
    # (priced as the engine's message costs, `EngineCosts`)
    start, last = max(first, 1), len(history) - 1
    if last >= start:
        span = range(start, last + 1)
        work = sum(sum(rec.pushes[j]) + rec.applies[j] for j in span)
        work += max(sum(rec.handovers[j] - rec.receives[j] for j in span), 0.0)
        driver = max(rec.cpu[last] - rec.cpu[start - 1] - work, 0.0) / (last - start + 1)
    else:
        driver = 0.0
    # ring messages each partition receives a round (delivered before the round's end in
    # process, and counted there; a message to itself is no message)
    messages = float(np.mean(rec.received[first:])) / P if rec.received else 0.0
    completed = not rec.stopped
    return Probe(
        n_partitions=P, rounds=len(history) if completed else max_rounds,
        rounds_source="probe" if completed else "max_iter", max_rounds=max_rounds,
        compute_s=float(np.mean(compute)), driver_s=float(driver),
        driver_bytes=float(np.mean(dbytes)), ring_bytes=float(np.mean(rbytes)),
        ring_messages=messages,
        batch_rounds=float(np.mean(batch_lengths)) if batch_lengths else 1.0,
        partition_bytes=partition_bytes, probed_rounds=n, probe_s=probe_s,
        lead_rounds=first, lead_compute_s=float(sum(lead_compute)),
        round_compute_s=tuple(float(c) for c in lead_compute + compute))


#: a probe of a program whose rounds to its stopping rule depend on P
#: (`Program.probe_to_stopping_rule`) runs on to that rule for up to this many times its
#: seconds
COUNT_FACTOR = 20


class _Recorder:
    """The probe's callback: stops the fit after ``seconds`` (``COUNT_FACTOR`` times that
    for a `Program.probe_to_stopping_rule` one; never before 3 rounds, nor
    before two rounds after the program's lead rounds, `Program.lead_rounds`, or in a
    ``warm_up`` before `Program.warm_up_rounds`) and
    records, after each round, the round's record, the CPU seconds of this thread and of
    the pushes, applies, ring receives and the partitions' ring hand-overs (their
    ``backend``'s count, `_ProbeBackend`) since the last record, and how many rounds a call
    could batch from the next one on; and, by round, each push's CPU seconds and the
    applies' and receives'.

    CPU seconds, not wall seconds: on a busy machine a probe waits for a core, which says
    nothing of the work.  In process, the partitions call the probe's program object in
    this thread one after the other (`watch`), so each push's CPU time is its own.  A batch
    of rounds runs several rounds' pushes before the first of their records, so a push is
    counted in its round by the partition's own count of pushes (every partition pushes
    once a round), and an apply in the round whose push follows it.
    """

    def __init__(self, seconds: float, min_rounds: int = 3, warm_up: bool = False):
        self.seconds, self.min_rounds = seconds, min_rounds
        self.limit = seconds
        #: a warm-up runs only until every kernel ran once (`Program.warm_up_rounds`)
        self.warm_up = warm_up
        self.program = None
        #: the program's lead rounds at the probed P (`watch`)
        self.lead = 1
        self.t0 = None
        self.batch = []
        self.stopped = False
        self.records = []
        #: per round: this thread's CPU seconds at its end, its pushes' CPU seconds (one
        #: per partition), the CPU seconds of its applies and ring receives (all partitions)
        self.cpu = []
        self.pushes = []
        self.applies = []
        #: per round: ring messages delivered (all partitions)
        self.received = []
        #: per round: CPU seconds of the ring receives (all partitions; also in `applies`)
        #: and of the partitions' ring hand-overs, those receives included (`_ProbeBackend`)
        self.receives, self.handovers = [], []
        self.backend = None
        self._handover_s = 0.0
        self._pushes, self._applied, self._received, self._receive_s = [], 0.0, 0, 0.0
        #: by round: each partition's push CPU seconds, and the applies' and receives'
        self.round_pushes: dict[int, list[float]] = {}
        self.round_applies: dict[int, float] = {}
        self._pushed: dict[int, int] = {}   # id(partition state) -> pushes so far

    def _work(self, round: int, seconds: float) -> None:
        self._applied += seconds
        self.round_applies[round] = self.round_applies.get(round, 0.0) + seconds

    def watch(self, program, n_partitions: int) -> None:
        """Time ``program``'s pushes, applies and receives on ``n_partitions``, and count
        the ring messages (this probe's program object only)."""
        self.program = program
        self.lead = max(int(program.lead_rounds(n_partitions)), 1)
        self.min_rounds = max(self.min_rounds,
                              int(program.warm_up_rounds(n_partitions)) if self.warm_up
                              else self.lead + 2)
        if program.probe_to_stopping_rule and not self.warm_up:
            self.limit = self.seconds * COUNT_FACTOR
        push, apply = program.push, program.apply

        def timed_push(state, plan):
            k = self._pushed.get(id(state), 0)
            self._pushed[id(state)] = k + 1
            t0 = time.thread_time()
            try:
                return push(state, plan)
            finally:
                dt = time.thread_time() - t0
                self._pushes.append(dt)
                self.round_pushes.setdefault(k, []).append(dt)

        def timed_apply(state, update):
            t0 = time.thread_time()
            try:
                return apply(state, update)
            finally:
                self._work(self._pushed.get(id(state), 0), time.thread_time() - t0)

        program.push, program.apply = timed_push, timed_apply
        if program.uses_ring:
            receive = program.receive

            def counted_receive(state, round, src, payload):
                self._received += 1
                t0 = time.thread_time()
                try:
                    return receive(state, round, src, payload)
                finally:
                    dt = time.thread_time() - t0
                    self._receive_s += dt
                    self._work(round, dt)

            program.receive = counted_receive

    def __call__(self, round, rec):
        self.cpu.append(time.thread_time())
        self.pushes.append(self._pushes)
        self.applies.append(self._applied)
        self.received.append(self._received)
        self.receives.append(self._receive_s)
        total = getattr(self.backend, "handover_s", 0.0)
        self.handovers.append(total - self._handover_s)
        self._handover_s = total
        self._pushes, self._applied, self._received, self._receive_s = [], 0.0, 0, 0.0
        self.records.append(rec)
        if self.t0 is None:
            self.t0 = time.perf_counter()
        p = self.program
        if p is not None:
            nxt = round + 1
            declared = p.ring_inbox(round) is not None if p.uses_ring else True
            self.batch.append(int(p.batch_rounds(nxt)) if declared else 1)
        if round + 1 >= self.min_rounds and time.perf_counter() - self.t0 > self.limit:
            self.stopped = True
            return True
        return False


def _call_lengths(batch: list[int], max_rounds: int) -> list[int]:
    """The lengths of the calls a batching backend would make over the recorded rounds
    (each call as long as the program lets the round that starts it batch)."""
    out, r = [], 0
    while r < len(batch):
        m = max(1, min(batch[r], max_rounds))
        out.append(m)
        r += m
    return out


def _max_partition_bytes(program, P):
    try:
        sizes = [program.partition_nbytes(s) for s in program.partition_specs(P)]
    except Exception:  # noqa: BLE001 - a program that cannot tell: unknown
        return None
    if not sizes or any(s is None for s in sizes):
        return None
    return int(max(sizes))


def probe_program(program: Program, n_partitions: int, *, max_iter: int,
                  seconds: float = 5.0, staleness: int = 0) -> Probe:
    """Probe ``program`` on the in-process backend at ``n_partitions`` for about
    ``seconds`` (or to its stopping rule, whichever comes first), with ``staleness``
    rounds in flight as `dmp.engine.run` keeps them."""
    rec = _Recorder(seconds)
    rec.watch(program, n_partitions)
    t0 = time.perf_counter()
    with _one_blas_thread():
        run(program, _probe_backend(n_partitions, rec), max_iter=max_iter, callback=rec,
            staleness=staleness)
    return _probe_from_history(
        rec, n_partitions, max_rounds=max_iter,
        batch_lengths=_call_lengths(rec.batch, config.count("dmp.batch.max-rounds")),
        partition_bytes=_max_partition_bytes(program, n_partitions),
        probe_s=time.perf_counter() - t0)


class _ProbeBackend(LocalBackend):
    """The in-process backend of a probe: it runs the rounds a program lets batch as the Dask
    backend does, so that the driver pulls what it would on a cluster (a batch's inner
    rounds closed by `Program.close_batch`: MF CCD++'s are scored on a partition), and
    counts the CPU seconds of the partitions' ring hand-overs (``handover_s``, the receives
    they run included), which in process run in the driver's thread."""

    def __init__(self, n_workers: int):
        super().__init__(n_workers, batches=True)
        self.handover_s = 0.0

    def start(self, program, specs) -> None:
        super().start(program, specs)
        for w in self.workers:
            w._send_all = self._timed(w._send_all)

    def _timed(self, send_all):
        def timed_send_all(round, messages):
            t0 = time.thread_time()
            try:
                return send_all(round, messages)
            finally:
                self.handover_s += time.thread_time() - t0
        return timed_send_all


def _probe_backend(P: int, recorder: "_Recorder | None" = None) -> _ProbeBackend:
    """A probe's backend, its hand-overs counted by ``recorder``."""
    backend = _ProbeBackend(P)
    if recorder is not None:
        recorder.backend = backend
    return backend


def _one_blas_thread():
    """BLAS on one thread while a probe runs, as on a Dask worker of one thread (whose
    environment limits it so); a pool of BLAS threads would also count their spinning in
    the probe's CPU time."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


class _Dry(Exception):
    """Raised by the planner's spy on a fit it only wants to set up."""


def _spied(estimator, P, recorder=None, dry=False):
    """A clone of ``estimator`` on the in-process backend at ``P``, running batches of rounds
    as a cluster does (`_probe_backend`), whose run options are recorded (and, ``dry``, whose
    fit stops there, before any partition exists)."""
    est = clone(estimator)
    est.set_params(backend=_probe_backend(P, recorder), show_progress=False, callback=recorder)
    seen = SimpleNamespace(max_iter=None, program=None)
    hook = est._run_options

    def run_options(fit):
        opts = hook(fit)
        seen.max_iter, seen.program = int(opts["max_iter"]), fit.program
        if recorder is not None:
            recorder.watch(fit.program, P)
        if dry:
            raise _Dry
        return opts

    est._run_options = run_options   # on this clone only: the fit path is the estimator's
    return est, seen


def _setup_at(estimator, X, y, P):
    """``(round budget, largest partition's bytes, lead rounds)`` of ``estimator``'s fit
    at ``P``, from its set-up alone (None when the data cannot be split over P
    partitions)."""
    est, seen = _spied(estimator, P, dry=True)
    try:
        est.fit(X, y) if y is not None else est.fit(X)
    except _Dry:
        return (seen.max_iter, _max_partition_bytes(seen.program, P),
                max(int(seen.program.lead_rounds(P)), 1))
    except ValueError:
        return None
    return None  # pragma: no cover - the spy always stops the fit


def probe_estimator(estimator, X, y=None, *, n_partitions: int, seconds: float = 5.0,
                    warm_up: bool = False) -> Probe:
    """Probe ``estimator``'s own fit on ``X`` on the in-process backend at ``n_partitions``
    for about ``seconds`` (or to its stopping rule); ``warm_up``: only until every kernel of
    its rounds ran once (`Program.warm_up_rounds`), to compile them and warm the caches."""
    rec = _Recorder(seconds, warm_up=warm_up)
    est, seen = _spied(estimator, n_partitions, recorder=rec)
    t0 = time.perf_counter()
    try:
        with _one_blas_thread():
            est.fit(X, y) if y is not None else est.fit(X)
    except Exception:
        # a model that cannot set its attributes from a fit stopped this early (the binary
        # autoencoder before its first complete iteration) still recorded its rounds
        if not rec.stopped:
            raise
    return _probe_from_history(
        rec, n_partitions, max_rounds=seen.max_iter,
        batch_lengths=_call_lengths(rec.batch, config.count("dmp.batch.max-rounds")),
        partition_bytes=_max_partition_bytes(seen.program, n_partitions),
        probe_s=time.perf_counter() - t0)


def _probe_each(estimator, X, y, workers: list[int], seconds: float,
                where: str = "in process") -> dict:
    """A warm-up probe, then one probe per P in ``workers`` (ascending), up to the first
    P the data cannot be split over (an error if that is the first)."""
    # a first short fit compiles the kernels (Numba) and warms the caches; not measured.
    # At the largest P that splits the data: the shortest rounds (every probe leaves its
    # first round, where a kernel only one P uses would compile, out anyway)
    for P in workers[::-1]:
        try:
            probe_estimator(estimator, X, y, n_partitions=P, seconds=min(1.0, seconds),
                            warm_up=True)
            break
        except ValueError:
            if P == workers[0]:
                raise
    probes = {}
    for P in workers:
        try:
            pr = probe_estimator(estimator, X, y, n_partitions=P, seconds=seconds)
        except ValueError:
            # too few shards or rows for P partitions: larger P are predicted from the
            # probes that ran
            if not probes:
                raise
            break
        pr.where = where
        probes[P] = pr
    return probes


def _probe_on_worker(estimator, X, y, workers: list[int], seconds: float) -> dict:
    from distributed import get_worker

    from .utils.heap import reuse_heap

    reuse_heap()                # as a fit's partition does: its temporaries then cost the same
    return _probe_each(estimator, X, y, workers, seconds, where=get_worker().address)


def probe(estimator, X, y=None, *, workers=(1, 2, 4, 8), seconds: float = 5.0,
          on=None, all_workers: bool = False) -> dict:
    """Probe ``estimator``'s fit at each number of partitions in ``workers``.

    Parameters
    ----------
    estimator, X, y
        As for `plan`.
    workers : list of int
        The numbers of partitions to probe (a P the data cannot be split over ends the list).
    seconds : float
        About how long each probe runs (wall seconds; at least 3 rounds, and two rounds
        past the model's lead rounds, `Program.lead_rounds`: LDA's counting rotation and
        first sweep).
    on : distributed.Client, optional
        Run the probes on one of this cluster's workers instead of in this process: they
        then measure the kernels at the workers' own speed (their cores, caches, memory
        allocator and any CPU limit).  The data travels as for a fit (a store is opened
        there; in-memory data is sent) and that worker holds every partition at once.
    all_workers : bool
        With ``on``: run the same probes on every worker of the cluster at once and keep,
        for each P, the slowest worker's (a round waits for its slowest partition).  The
        kernels are then timed as they run when every worker is busy: workers that share a
        machine's caches and memory bus (several per node, or CPU-limited ones on few
        cores) spend more CPU seconds on the same work than one worker alone.  Each worker
        holds the whole problem for its probe.

    Returns
    -------
    dict
        ``{P: Probe}``, in the order of ``workers``; ``Probe.where`` says where each ran.
    """
    Ps = _check_workers(workers)
    _check_positive("seconds", seconds)
    if on is None:
        if all_workers:
            raise ValueError("all_workers needs on, the cluster whose workers probe")
        return _probe_each(estimator, X, y, Ps, float(seconds))
    from .engine.backends.base import _is_client

    if not _is_client(on):
        raise TypeError(f"on must be a distributed.Client, got {type(on).__name__}")
    addresses = sorted(on.scheduler_info(n_workers=-1)["workers"])
    if not addresses:
        raise RuntimeError(f"the cluster of {on} has no worker to run the probes on")
    estimator = _shippable(estimator)
    if not all_workers:
        return on.submit(_probe_on_worker, estimator, X, y, Ps, float(seconds),
                         workers=addresses[:1], allow_other_workers=False, pure=False).result()
    # the data goes out once and is copied worker to worker
    data = on.scatter([X, y], broadcast=True, hash=False)
    futures = [on.submit(_probe_on_worker, estimator, *data, Ps, float(seconds),
                         workers=[a], allow_other_workers=False, pure=False)
               for a in addresses]
    return _slowest(on.gather(futures))


def _shippable(estimator):
    """A clone of ``estimator`` without what ties it to this process (a client as its
    backend, a callback), which the probes replace anyway: what goes to a worker."""
    shallow = copy.copy(estimator)
    shallow.backend, shallow.callback = "local", None
    return clone(shallow)


def _slowest(per_worker: list[dict]) -> dict:
    """For each P, the probe of the worker whose pushes took longest, its ``where`` naming
    it among how many ran at once."""
    out = {}
    for P in per_worker[0]:
        got = [probes[P] for probes in per_worker if P in probes]
        pr = max(got, key=lambda p: p.compute_s)
        pr.where = f"the slowest of {len(got)} workers probing at once ({pr.where})"
        out[P] = pr
    return out


# --------------------------------------------------------------------------- the prediction

def _speed(cores: float) -> float:
    return min(float(cores), 1.0)


def throttled_seconds(cpu_s, cores: float, period: float | None = None):
    """Expected wall seconds of ``cpu_s`` seconds of one thread's work on ``cores`` cores.

    A fraction of a core is a CPU quota (Linux CFS bandwidth control: Kubernetes' and
    Docker's CPU limits, `dmp.testing.EmulatedCluster`): the process runs at full speed
    for ``cores x period`` seconds of each ``period`` and then waits for the next.  Work
    that starts after an idle wait (a worker's push after it waited for the round) with
    its quota unspent and shorter than the quota is not slowed at all; longer work takes
    about ``cpu_s / cores`` less what its first, unthrottled burst saved.  The mean over a
    start anywhere in the period.  ``period=None``: a core slowed uniformly to ``cores``
    (``cpu_s / cores``).  One core or more: ``cpu_s`` (the kernels run on one thread).
    """
    c = np.asarray(cpu_s, dtype=float)
    q = float(cores)
    if q >= 1.0:
        return c
    if period is None:
        return c / q
    T = float(period)
    burst = q * T
    phase = (np.arange(64) + 0.5) / 64 * T          # where in its period the work starts
    first = np.minimum(burst, T - phase)            # the quota that period still allows
    left = c[..., None] - first
    full = np.floor(np.maximum(left - 1e-12, 0.0) / burst)
    wall = np.where(left <= 0.0, c[..., None], (T - phase) + full * T + (left - full * burst))
    return wall.mean(axis=-1)


def predict(probe: Probe, P: int, *, network: Network, engine: EngineCosts = EngineCosts(),
            cores_per_worker: float = 1.0, driver_cores: float = 1.0,
            cpu_period: float | None = None,
            batch_target_s: float | None = None, batch_max_rounds: int | None = None) -> dict:
    """One row of the plan: the round loop on ``P`` workers from a probe at the same P.

    The seconds of the row are totals over the round loop (``rounds`` rounds); ``round_s``
    is one round's.  See the module docstring for the formula; ``cpu_period`` as for
    `plan`.
    """
    if batch_target_s is None:
        batch_target_s = config.seconds("dmp.batch.target-duration")
    if batch_max_rounds is None:
        batch_max_rounds = config.count("dmp.batch.max-rounds")
    sw, sd = _speed(cores_per_worker), _speed(driver_cores)
    lead = probe.lead_rounds
    # a push starts after its worker waited for the round: with a CPU quota, at full
    # speed until the quota is spent (`throttled_seconds`), so each round apart
    samples = probe.round_compute_s
    if len(samples) > lead:
        lead_compute = float(np.sum(throttled_seconds(samples[:lead], sw, cpu_period)))
        compute = float(np.mean(throttled_seconds(samples[lead:], sw, cpu_period)))
    else:
        lead_compute = float(throttled_seconds(probe.lead_compute_s / max(lead, 1), sw,
                                               cpu_period)) * lead
        compute = float(throttled_seconds(probe.compute_s, sw, cpu_period))
    driver = probe.driver_s / sd
    ring_comm = probe.ring_bytes / network.bandwidth + probe.ring_messages * network.latency
    m = probe.ring_messages
    ring_over = (min(m, 1.0) * engine.message_s
                 + max(m - 1.0, 0.0) * engine.fanout_message_s
                 + probe.ring_bytes * engine.ring_byte_s) / sw
    per_round_work = compute + ring_comm + ring_over
    # the runner sizes a batch to about batch_target_s of work, within the program's bound
    per_call = max(1.0, min(probe.batch_rounds, batch_max_rounds,
                            batch_target_s / max(per_round_work, 1e-12)))
    comm = (probe.driver_bytes / network.bandwidth + 2 * network.latency) / per_call + ring_comm
    overhead = ((P * engine.call_s + engine.round_s) / sd + engine.worker_call_s / sw) / per_call \
        + ring_over
    R = probe.rounds
    # the lead rounds at their own cost (a share of it when the fit is shorter), the
    # others at the mean of the later rounds
    if lead and R < lead:
        total_compute = lead_compute * R / lead
    else:
        total_compute = lead_compute + (R - lead) * compute
    loop_s = total_compute + R * (driver + comm + overhead)
    return {"workers": P, "loop_s": loop_s, "rounds": R, "round_s": loop_s / max(R, 1),
            "compute_s": total_compute, "driver_s": R * driver, "comm_s": R * comm,
            "overhead_s": R * overhead, "rounds_per_call": per_call,
            "bytes_per_worker_round": probe.driver_bytes / P + probe.ring_bytes,
            "network_bytes": R * (probe.driver_bytes + P * probe.ring_bytes),
            "rounds_source": probe.rounds_source}


def _fit_line(xs, ys):
    """Least-squares ``a + b x`` (a constant for one point)."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    if len(xs) < 2 or np.ptp(xs) == 0:
        return float(ys.mean()), 0.0
    b, a = np.polyfit(xs, ys, 1)
    return float(a), float(b)


def _extrapolate(probes: list[Probe], P: int, max_rounds: int | None,
                 partition_bytes: int | None, lead_rounds: int | None = None) -> Probe:
    """A `Probe` at ``P`` beyond the probed ones: per-iteration work, driver time and
    bytes carried over from the probes (the round budget's ratio turns them into per-round
    figures), the ring bytes per worker as a power of P between the two largest probes."""
    probes = sorted(probes, key=lambda p: p.n_partitions)
    last = probes[-1]
    if max_rounds is None:   # the data cannot be split so far: the budget's trend in P
        a, b = _fit_line([p.n_partitions for p in probes], [p.max_rounds for p in probes])
        max_rounds = max(1, int(round(a + b * P)))
    ratio = last.max_rounds / max_rounds      # per round at P = per round at last x ratio
    # work per iteration is shared by P partitions
    compute = last.compute_s * ratio * last.n_partitions / P
    a, b = _fit_line([p.n_partitions for p in probes],
                     [p.driver_s * p.max_rounds for p in probes])
    driver = max(a + b * P, 0.0) / max_rounds
    a, b = _fit_line([p.n_partitions for p in probes],
                     [p.driver_bytes * p.max_rounds for p in probes])
    driver_bytes = max(a + b * P, 0.0) / max_rounds
    ring_bytes, messages = last.ring_bytes * ratio, last.ring_messages
    if len(probes) >= 2 and probes[-2].ring_bytes > 0 and last.ring_bytes > 0:
        p0 = probes[-2]
        e = math.log((last.ring_bytes * last.max_rounds) / (p0.ring_bytes * p0.max_rounds)) \
            / math.log(last.n_partitions / p0.n_partitions)
        e = min(max(e, -1.0), 1.0)
        ring_bytes = last.ring_bytes * last.max_rounds * (P / last.n_partitions) ** e / max_rounds
    rounds = max(1, int(round(last.rounds * max_rounds / last.max_rounds)))
    # the lead rounds' work is the partitions' share too, however many rounds it takes
    lead = last.lead_rounds if lead_rounds is None else lead_rounds
    lead_compute = last.lead_compute_s * last.n_partitions / P
    if partition_bytes is None and last.partition_bytes is not None:
        partition_bytes = int(last.partition_bytes * last.n_partitions / P)
    later_scale = ratio * last.n_partitions / P
    samples = tuple(c * last.n_partitions / P for c in last.round_compute_s[:last.lead_rounds]) \
        + tuple(c * later_scale for c in last.round_compute_s[last.lead_rounds:])
    return Probe(n_partitions=P, rounds=rounds,
                 rounds_source=f"extrapolated from P={last.n_partitions}",
                 max_rounds=max_rounds, compute_s=compute, driver_s=driver,
                 driver_bytes=driver_bytes, ring_bytes=ring_bytes, ring_messages=messages,
                 batch_rounds=last.batch_rounds * max_rounds / last.max_rounds
                 if last.batch_rounds > 1 else 1.0,
                 partition_bytes=partition_bytes, lead_rounds=lead,
                 lead_compute_s=lead_compute,
                 round_compute_s=samples if lead == last.lead_rounds else ())


def _memory_row(partition_bytes, memory_limit) -> dict:
    """Memory per worker and whether it fits, as the Dask backend checks it before a fit."""
    if partition_bytes is None:
        return {"memory_per_worker": None, "fits": None}
    need = int(partition_bytes) + collect_transient_bytes() + worker_base_bytes()
    if memory_limit is None:
        return {"memory_per_worker": need, "fits": None}
    import dask

    frac = dask.config.get("distributed.worker.memory.pause", 0.8) or 0.95
    return {"memory_per_worker": need, "fits": need <= memory_limit * frac}


def plan_memory(estimator, X, y=None, *, workers=(1, 2, 4, 8, 16, 32, 64),
                memory_per_worker="4GiB", as_frame: bool | None = None):
    """Memory per worker of ``estimator.fit(X, y)`` on each number of ``workers``, from the
    fit's set-up alone: no partition is loaded and no round runs, so it answers for a model
    too large for this process (`plan` runs the fit in process to time it).

    The figure is the one the Dask backend checks before a fit (`InsufficientMemoryError`):
    the largest partition's estimate (`Program.partition_nbytes`), the piece of it in
    flight when the fit's result is collected, and the worker's fixed cost
    (``dmp.memory.worker-base``).

    Parameters
    ----------
    estimator : DMPEstimator
        An unfitted dmp estimator (cloned; not fitted).
    X, y : data
        What ``fit`` takes.
    workers : list of int
        The numbers of workers (one partition each).
    memory_per_worker : int or str or None
        Each worker's memory limit (``fits`` compares with the part Dask lets a worker use,
        ``distributed.worker.memory.pause``; None: not checked).
    as_frame : bool, optional
        Return a pandas DataFrame (default: when pandas can be imported).

    Returns
    -------
    table : list of dict or pandas.DataFrame
        One row per P: ``workers``, ``partition_bytes`` (the largest partition's estimate),
        ``memory_per_worker`` (None when the program cannot tell, or the data cannot be
        split over P), ``fits`` and ``workers_needed`` (the fewest workers that fit, when
        this P does not).
    """
    Ps = _check_workers(workers)
    limit = _nbytes(memory_per_worker)
    rows = []
    for P in Ps:
        setup = _setup_at(estimator, X, y, P)
        pbytes = None if setup is None else setup[1]
        rows.append({"workers": P, "partition_bytes": pbytes, **_memory_row(pbytes, limit)})
    _workers_needed(rows, estimator, X, y, limit)
    columns = ["workers", "partition_bytes", "memory_per_worker", "fits", "workers_needed"]
    rows = [{c: r.get(c) for c in columns} for r in rows]
    if as_frame is None or as_frame:
        try:
            import pandas as pd
        except ImportError:
            if as_frame:
                raise
            return rows
        return pd.DataFrame(rows, columns=columns)
    return rows


def _nbytes(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        from dask.utils import parse_bytes

        return int(parse_bytes(value))
    return int(value)


def _check_workers(workers) -> list[int]:
    try:
        ws = [int(w) for w in workers]
    except (TypeError, ValueError):
        raise ValueError(f"workers must be a list of whole numbers >= 1, got {workers!r}") \
            from None
    if not ws or any(w < 1 for w in ws) or any(int(w) != w for w in workers):
        raise ValueError(f"workers must be a list of whole numbers >= 1, got {workers!r}")
    return sorted(set(ws))


def _check_positive(name: str, value, what: str = "a number") -> None:
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be {what} > 0, got {value!r}")


def plan(estimator, X, y=None, *, workers=(1, 2, 4, 8, 16, 32, 64), network="10Gbit,50us",
         cores_per_worker: float = 1.0, driver_cores: float = 1.0, memory_per_worker="4GiB",
         cpu_period: float | None = None, engine: EngineCosts | None = None,
         probe_max: int = 8, probe_seconds: float = 5.0, probe_on=None,
         probe_all_workers: bool = False, as_frame: bool | None = None):
    """Predict what ``estimator.fit(X, y)`` would do on each number of ``workers``.

    Parameters
    ----------
    estimator : DMPEstimator
        An unfitted dmp estimator with the parameters of the fit to plan (it is cloned; its
        ``backend`` and ``callback`` are replaced in the probes).
    X, y : data
        What ``fit`` takes (in-memory data or a dmp store).
    workers : list of int
        The numbers of workers to predict for (one partition each).
    network : str or Network
        Bandwidth and latency of each worker's link, e.g. ``"10Gbit,50us"``.
    cores_per_worker, driver_cores : float
        Cores of each worker and of the driver (the kernels use one; less slows them).
    cpu_period : float, optional
        With less than one core per worker: price each push as bursts of a CPU quota of
        this period in seconds (Kubernetes and Docker: 0.1; `dmp.testing.EmulatedCluster`:
        0.01), at full speed for ``cores_per_worker x cpu_period`` of each period
        (`throttled_seconds`), instead of on a core slowed uniformly (the default).  That
        holds where a worker sits idle for whole periods between its pushes and has its
        machine's cores to itself while it runs; on emulated 0.2-core workers it did for
        the Lasso and SGD on 2-4 workers, not on 1 (the worker's own handling of a round,
        about 2.4 ms of CPU, spends a 2 ms quota before the push) nor on 8 sharing two
        cores (BENCHMARKS.md, "Pushes on a CPU quota").
    memory_per_worker : int or str or None
        Each worker's memory limit (``fits`` compares with it; None: not checked).
    engine : EngineCosts, optional
        The engine's costs per call and message (default: `EngineCosts()`).
    probe_max : int
        Probe every requested P up to this one (and at least the smallest); predict larger
        ones from the probes.
    probe_seconds : float
        About how long each probe runs (a probe that reaches the stopping rule sooner gives
        the exact rounds; every probe runs at least 3 rounds and two rounds past the model's
        lead rounds, `Program.lead_rounds`: for LDA, one sweep of the whole corpus and more).
        A model whose rounds to its stopping rule grow with P (the Lasso,
        `Program.probe_to_stopping_rule`) is probed on to that rule, for up to
        ``COUNT_FACTOR`` (20) times as long.
    probe_on : distributed.Client, optional
        Run the probes on one of this cluster's workers (`probe`): the kernels are then
        timed where they will run, which matters when the workers' machines differ from
        this one or their CPU is limited (a 0.2-core CPU cgroup makes LDA's sampler spend
        about 1.4x the CPU seconds per token at 10M tokens; BENCHMARKS.md).
    probe_all_workers : bool
        With ``probe_on``: probe on every worker of that cluster at once and plan with the
        slowest (`probe`'s ``all_workers``): the kernels timed as they run when all workers
        are busy, for workers that share machines.  Best with as many workers as the fit
        will have.
    as_frame : bool, optional
        Return a pandas DataFrame (default: when pandas can be imported), else a list of
        dicts.

    Returns
    -------
    table : list of dict or pandas.DataFrame
        One row per P: ``workers``, ``loop_s`` (predicted round-loop seconds), ``rounds``,
        ``round_s``, ``compute_s``, ``driver_s``, ``comm_s``, ``overhead_s`` (their split of
        ``loop_s``), ``speedup`` (against the smallest P), ``bytes_per_worker_round``,
        ``network_bytes``, ``memory_per_worker``, ``fits``, ``workers_needed`` (the fewest
        workers that fit, when this P does not) and ``source`` (probe or extrapolation).

    See Also
    --------
    plan_memory : the memory column alone, without running the fit (the probes hold every
        partition in this process: not for a model larger than it).
    """
    Ps = _check_workers(workers)
    net = parse_network(network)
    engine = EngineCosts() if engine is None else engine
    for name, v in (("cores_per_worker", cores_per_worker), ("driver_cores", driver_cores)):
        _check_positive(name, v, "a number of cores")
    _check_positive("probe_seconds", probe_seconds)
    if cpu_period is not None:
        _check_positive("cpu_period", cpu_period, "seconds")
    limit = _nbytes(memory_per_worker)
    probed = [P for P in Ps if P <= max(probe_max, Ps[0])]
    if probe_all_workers and probe_on is None:
        raise ValueError("probe_all_workers needs probe_on, the cluster whose workers probe")
    probes = probe(estimator, X, y, workers=probed, seconds=probe_seconds, on=probe_on,
                   all_workers=probe_all_workers)
    rows = []
    for P in Ps:
        if P in probes:
            pr = probes[P]
            source = f"probe at P={P}" + ("" if probe_on is None else f" on {pr.where}")
        else:
            setup = _setup_at(estimator, X, y, P)
            max_rounds, pbytes, lead = setup if setup is not None else (None, None, None)
            pr = _extrapolate(list(probes.values()), P, max_rounds, pbytes, lead)
            source = pr.rounds_source
        row = predict(pr, P, network=net, engine=engine, cores_per_worker=cores_per_worker,
                      driver_cores=driver_cores, cpu_period=cpu_period)
        row.update(_memory_row(pr.partition_bytes, limit))
        row["source"] = source + ("" if pr.rounds_source != "max_iter"
                                  else ", rounds: the fit's budget")
        rows.append(row)
    base = rows[0]["loop_s"] * rows[0]["workers"]
    for row in rows:
        row["speedup"] = rows[0]["loop_s"] / row["loop_s"]
        row["efficiency"] = base / (row["loop_s"] * row["workers"])
    _workers_needed(rows, estimator, X, y, limit)
    columns = ["workers", "loop_s", "speedup", "efficiency", "rounds", "round_s", "compute_s",
               "driver_s", "comm_s", "overhead_s", "rounds_per_call",
               "bytes_per_worker_round", "network_bytes", "memory_per_worker", "fits",
               "workers_needed", "source"]
    rows = [{c: r.get(c) for c in columns} for r in rows]
    if as_frame is None or as_frame:
        try:
            import pandas as pd
        except ImportError:
            if as_frame:
                raise
            return rows
        return pd.DataFrame(rows, columns=columns)
    return rows


def _workers_needed(rows, estimator, X, y, limit) -> None:
    """Fill ``workers_needed`` of the rows that do not fit: the fewest workers whose
    partitions fit, from the model's sizes at the rows' P (and their trend beyond)."""
    fitting = [r["workers"] for r in rows if r["fits"]]
    for r in rows:
        r["workers_needed"] = None
        if r["fits"] is False:
            larger = [w for w in fitting if w > r["workers"]]
            if larger:
                r["workers_needed"] = min(larger)
            else:   # per-worker model bytes ~ total / P
                import dask

                frac = dask.config.get("distributed.worker.memory.pause", 0.8) or 0.95
                usable = limit * frac - worker_base_bytes() - collect_transient_bytes()
                total = (r["memory_per_worker"] - worker_base_bytes()
                         - collect_transient_bytes()) * r["workers"]
                r["workers_needed"] = (math.ceil(total / usable) if usable > 0 else None)


# --------------------------------------------------------------------------- output

def table_text(rows) -> str:
    """The plan as a plain-text table."""
    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")

    def mib(n):
        return "?" if n is None or (isinstance(n, float) and math.isnan(n)) else \
            f"{n / 2**20:,.0f}"

    head = (f"{'P':>5} {'loop s':>9} {'speedup':>7} {'eff':>5} {'rounds':>7} {'compute':>8} "
            f"{'driver':>8} {'comm':>8} {'overhd':>8} {'KiB/wkr/rnd':>11} {'MiB/wkr':>8} "
            f"{'fits':>5}  source")
    lines = [head]
    for r in rows:
        fits = {True: "yes", False: "NO", None: "?"}.get(r["fits"], "?")
        if r["fits"] is False and r.get("workers_needed"):
            fits = f"NO (>= {r['workers_needed']})"
        lines.append(
            f"{r['workers']:>5} {r['loop_s']:>9.3g} {r['speedup']:>7.2f} {r['efficiency']:>5.2f} "
            f"{r['rounds']:>7} {r['compute_s']:>8.3g} {r['driver_s']:>8.3g} {r['comm_s']:>8.3g} "
            f"{r['overhead_s']:>8.3g} {r['bytes_per_worker_round'] / 1024:>11,.1f} "
            f"{mib(r['memory_per_worker']):>8} {fits:>5}  {r['source']}")
    return "\n".join(lines)


def plot_plan(rows, path, *, measured=None, title="dmp plan"):
    """A PNG of the predicted speed-up against P (and ``measured``: ``{P: speed-up}``),
    with the ideal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    Ps = [r["workers"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(Ps, [p / Ps[0] for p in Ps], "k--", label="ideal")
    ax.plot(Ps, [r["speedup"] for r in rows], "o-", label="predicted")
    if measured:
        ax.plot(sorted(measured), [measured[p] for p in sorted(measured)], "s", label="measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("workers P")
    ax.set_ylabel("round-loop speed-up")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- engine costs

@dataclass(frozen=True)
class NullPlan(Message):
    """`NullProgram`'s plan: typed, as every dmp program's (its pickling is part of the
    engine's cost of a call)."""

    round: int


@dataclass(frozen=True)
class NullPartial(Message):
    """`NullProgram`'s partial result."""

    values: np.ndarray


class NullProgram(Program):
    """A program of known costs: each plan is a `NullPlan` (16 bytes counted), each push
    spins ``push_s`` seconds of its thread's CPU and returns a `NullPartial` of
    ``partial_bytes`` bytes (8 more counted for its type); each pull spins ``pull_s``; with
    ``ring_bytes`` each push also sends that many bytes to the next partition (``fanout``:
    to every other partition).  The first ``lead_rounds`` rounds (`Program.lead_rounds`)
    spin ``lead_push_s`` instead when it is given; with ``stop_after`` the fit converges
    after that many rounds (and ``probe_to_stopping_rule`` sets
    `Program.probe_to_stopping_rule`).  `measure_engine` runs it with no work to time the
    engine itself."""

    name = "null"
    gather_partitions = False

    def __init__(self, push_s=0.0, pull_s=0.0, partial_bytes=8, ring_bytes=0,
                 partition_bytes=1000, batched=False, fanout=False, lead_rounds=1,
                 lead_push_s=None, stop_after=None, probe_to_stopping_rule=False):
        super().__init__()
        self.stop_after = None if stop_after is None else int(stop_after)
        self.probe_to_stopping_rule = bool(probe_to_stopping_rule)
        self.n_lead = int(lead_rounds)
        self.lead_push_s = None if lead_push_s is None else float(lead_push_s)
        self.batched, self.fanout = bool(batched), bool(fanout)
        self.push_s, self.pull_s = float(push_s), float(pull_s)
        self.partial_bytes, self.ring_bytes = int(partial_bytes), int(ring_bytes)
        self.partition_bytes = int(partition_bytes)
        self.uses_ring = self.ring_bytes > 0

    def partition_specs(self, n_partitions):
        return [{"k": k, "P": n_partitions} for k in range(n_partitions)]

    def partition_nbytes(self, spec):
        return self.partition_bytes

    def lead_rounds(self, n_partitions):
        return self.n_lead

    def start(self, n_partitions):
        self.driver = {"P": n_partitions, "pulled": 0}

    def schedule(self, round):
        return [NullPlan(round)] * self.driver["P"]

    def init_partition(self, spec):
        return {"k": spec["k"], "P": spec["P"], "inbox": {}}

    def push(self, state, plan):
        lead = self.lead_push_s is not None and plan.round < self.n_lead
        _spin(self.lead_push_s if lead else self.push_s)
        partial = NullPartial(np.zeros(max(self.partial_bytes // 8, 0)))
        k, P = state["k"], state["P"]
        if self.uses_ring and P > 1:
            to = [q for q in range(P) if q != k] if self.fanout else [(k + 1) % P]
            return Sends(partial, {q: np.zeros(self.ring_bytes // 8) for q in to})
        return partial

    def ring_inbox(self, round):
        # with ``batched``, each partition waits for the message of the one before it: a
        # batch of rounds is a chain of ring hops, timed without the driver
        if not self.batched:
            return None
        P = self.driver["P"]
        return [(P - 1 if self.fanout else 1) if P > 1 else 0] * P

    def batch_rounds(self, round):
        return 1024 if self.batched else 1

    def receive(self, state, round, src, payload):
        state["inbox"] = {round: payload}   # only the last: it is never read

    def pull(self, round, partials):
        _spin(self.pull_s)
        self.driver["pulled"] += 1
        return None

    def converged(self):
        return self.stop_after is not None and self.driver["pulled"] >= self.stop_after


def _spin(seconds: float) -> None:
    if seconds <= 0:
        return
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass


def measure_engine(backend, *, rounds: int = 40, partial_bytes: int = 8,
                   ring_bytes: int = 0, batched: bool = False, fanout: bool = False) -> dict:
    """Seconds per round of `NullProgram` (no work) on ``backend`` (a dmp backend or a
    ``distributed.Client``): the engine's own cost of a round there, with partials of
    ``partial_bytes`` and, with ``ring_bytes``, one ring message per partition.

    Returns ``{"round_s": median seconds per round, "n_partitions": P}``.  Rounds with
    tiny and with large partials, and with and without ring messages, give the per-call,
    per-byte and per-message costs (`EngineCosts`, `Network`) of a cluster; ``batched``
    ring rounds run in batches (one call per partition for many rounds, each a ring hop),
    whose time per round is a message's cost there; ``fanout`` ring rounds send every
    partition's message to all the others (P - 1 a round each, as CCD++ does).
    """
    from .engine.backends.base import resolve_backend

    be = resolve_backend(backend, None)
    try:
        result = run(NullProgram(partial_bytes=partial_bytes, ring_bytes=ring_bytes,
                                 batched=batched, fanout=fanout), be, max_iter=rounds)
    finally:
        be.close()
    t = np.diff([r["time"] for r in result.history])[min(5, rounds // 4):]
    return {"round_s": float(np.median(t)), "n_partitions": be.n_partitions}
