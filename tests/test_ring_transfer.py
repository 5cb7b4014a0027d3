"""Ring messages (`Sends`) between partitions: payloads of every shape arrive intact, in
process and worker to worker on Dask, on plain sockets and through Dask's comm (where large
arrays travel in pieces)."""

import pickle
import time

import numpy as np
import pytest

from dmp.engine import run
from dmp.engine.backends.local import LocalBackend
from dmp.engine.program import Broadcast, Program, Sends
from dmp.config import nbytes
from dmp.engine.worker import _assemble, _Piecewise, _split_large

#: the size of a ring message's pieces (the workers' default: none of them changes it)
RING_PIECE_BYTES = nbytes("dmp.ring.piece-bytes")


def _big(p, r):
    # 2.5 pieces of float64, distinct per sender and round
    n = int(2.5 * RING_PIECE_BYTES) // 8
    return np.arange(n, dtype=np.float64) * (p + 1) + r


class PassLeft(Program):
    """Each round every partition sends a large array, a small one and a tag (as a tuple, a
    dict and a bare array in turn) to its left neighbour, which checks the previous round's
    message."""

    name = "pass-left"
    uses_ring = True

    def partition_specs(self, n_partitions):
        return [{"p": p, "P": n_partitions} for p in range(n_partitions)]

    def schedule(self, round):
        return [{"round": round}] * self.driver["P"]

    def start(self, n_partitions):
        self.driver = {"P": n_partitions, "verdicts": []}

    def pull(self, round, partials):
        self.driver["verdicts"].append([(q["ok"], q["checked"]) for q in partials])
        return Broadcast(None)

    def init_partition(self, spec):
        return {"p": spec["p"], "P": spec["P"], "inbox": {}, "checked": 0}

    def receive(self, state, round, src, payload):
        state["inbox"][round] = (src, payload)

    def push(self, s, plan):
        r, p, P = plan["round"], s["p"], s["P"]
        ok = True
        if r > 0:
            src, msg = s["inbox"].pop(r - 1)
            want = _big(src, r - 1)
            ok = src == (p + 1) % P
            if (r - 1) % 3 == 0:
                ok &= msg[0] == "tag" and np.array_equal(msg[1], want)
                ok &= np.array_equal(msg[2], np.arange(5) + src)
            elif (r - 1) % 3 == 1:
                ok &= np.array_equal(msg["big"], want) and msg["small"] == [src]
            else:
                ok &= np.array_equal(msg, want) and msg.flags.writeable
            s["checked"] += 1
        msgs = [("tag", _big(p, r), np.arange(5) + p), {"big": _big(p, r), "small": [p]},
                _big(p, r)]
        return Sends({"ok": bool(ok), "checked": s["checked"]}, {(p - 1) % P: msgs[r % 3]})


def _fit_and_check(backend, P, rounds=4):
    prog = PassLeft()
    history = run(prog, backend, max_iter=rounds).history
    assert len(history) == rounds
    # every partition checked every message it got (on its worker), and all were intact
    assert prog.driver["verdicts"] == [[(True, r)] * P for r in range(rounds)]
    # bytes_ring counts each partition's message every round
    for h in history:
        assert h["bytes_ring"] >= P * _big(0, 0).nbytes


def test_split_and_assemble_round_trip():
    a = np.ones(int(1.5 * RING_PIECE_BYTES) // 8)
    small = np.ones(10)
    for payload in [a, (1, a, small), [a, a], {"x": a, "y": small, "z": "s"}, small, "text"]:
        n_big = sum(v is a for v in (payload.values() if isinstance(payload, dict) else
                                     payload if isinstance(payload, (tuple, list)) else
                                     [payload]))
        out, pieces = _split_large(payload, (0, 7))
        assert len(pieces) == n_big and all(v is a for _, v in pieces)
        # what travels in the message itself is small
        assert len(pickle.dumps(out)) < 4096 or payload is small
        back = _assemble(out, dict(pieces))
        if isinstance(payload, np.ndarray):
            assert back is payload
        elif isinstance(payload, dict):
            assert back.keys() == payload.keys()
            assert all(back[k] is payload[k] for k in payload)
        elif isinstance(payload, (tuple, list)):
            assert type(back) is type(payload)
            assert all(x is y for x, y in zip(back, payload))
        else:
            assert back == payload
    out, pieces = _split_large((1, a), (3, 4))
    assert out == (1, _Piecewise((3, 4, 1))) and pieces[0][0] == (3, 4, 1)


@pytest.fixture(params=["socket", "dask"])
def ring_transport(request, dask_settings):
    """Each of ``dmp.ring.transport``'s ways, in turn."""
    dask_settings({"dmp.ring.transport": request.param})
    return request.param


def test_messages_arrive_in_process():
    _fit_and_check(LocalBackend(3), 3)


@pytest.mark.dask
def test_large_messages_arrive_worker_to_worker(dask_client, ring_transport):
    from dmp.engine.backends.dask import DaskBackend

    backend = DaskBackend(dask_client)
    try:
        _fit_and_check(backend, 2)
    finally:
        backend.close()


class SlowArrival(PassLeft):
    """Small messages whose receiver takes ``DELAY`` seconds to take them in (on the worker's
    event loop), and partitions that report how many they took in."""

    DELAY = 0.4

    def init_partition(self, spec):
        return {**super().init_partition(spec), "received": 0}

    def receive(self, state, round, src, payload):
        import time

        time.sleep(self.DELAY)
        state["received"] += 1
        state["inbox"][round] = (src, payload)

    def push(self, s, plan):
        r, p, P = plan["round"], s["p"], s["P"]
        ok = True
        if r > 0:
            src, msg = s["inbox"].pop(r - 1, (None, None))
            ok = src == (p + 1) % P and np.array_equal(msg, np.arange(4) + 10 * src + r - 1)
            s["checked"] += 1
        return Sends({"ok": bool(ok), "checked": s["checked"]},
                     {(p - 1) % P: np.arange(4) + 10 * p + r})

    def partition_arrays(self, state):
        return {"received": np.array([state["received"]])}


@pytest.mark.dask
@pytest.mark.parametrize("staleness", [0, 1])
def test_a_push_sees_the_previous_rounds_message_however_late_it_lands(dask_client,
                                                                        staleness,
                                                                        ring_transport):
    """A sender does not wait for the receiver to confirm a message (the receiver's next
    round waits for it instead: the hand-over is quick), and an undeclared ring program's rounds
    run bulk synchronously even with staleness: every push sees its message and the partitions
    collected at the end hold the last round's messages too."""
    from dmp.engine.backends.dask import DaskBackend

    rounds = 4
    backend = DaskBackend(dask_client)
    try:
        prog = SlowArrival()
        res = run(prog, backend, max_iter=rounds, staleness=staleness)
    finally:
        backend.close()
    assert prog.driver["verdicts"] == [[(True, r)] * 2 for r in range(rounds)]
    assert [int(a["received"][0]) for a in res.partition_arrays] == [rounds, rounds]
    ring_s = np.array([h["ring_s"] for h in res.history])
    assert ring_s.max() < SlowArrival.DELAY / 2


class DeclaredSlowArrival(SlowArrival):
    """`SlowArrival` that declares its messages (one per partition per round), so its rounds
    may overlap, and whose pushes report the round of the last pull they had applied."""

    def ring_inbox(self, round):
        return [1] * self.driver["P"]

    def pull(self, round, partials):
        super().pull(round, partials)
        self.driver.setdefault("saw", []).append([q["saw"] for q in partials])
        return Broadcast(round)

    def init_partition(self, spec):
        return {**super().init_partition(spec), "saw": None}

    def apply(self, s, update):
        s["saw"] = update

    def push(self, s, plan):
        out = super().push(s, plan)
        out.partial["saw"] = s["saw"]
        return out


@pytest.mark.dask
def test_declared_ring_rounds_overlap_and_still_wait_for_late_messages(dask_client):
    """With `Program.ring_inbox` declared and staleness 1, round r's push starts before
    round r - 1 was pulled (it sees the pull of r - 2), yet after the message of r - 1 landed
    (each takes 0.4 s to land)."""
    from dmp.engine.backends.dask import DaskBackend

    rounds = 5
    backend = DaskBackend(dask_client)
    try:
        prog = DeclaredSlowArrival()
        res = run(prog, backend, max_iter=rounds, staleness=1)
    finally:
        backend.close()
    assert prog.driver["verdicts"] == [[(True, r)] * 2 for r in range(rounds)]
    assert [int(a["received"][0]) for a in res.partition_arrays] == [rounds, rounds]
    assert prog.driver["saw"] == [[None] * 2] * 2 + [[r - 2] * 2 for r in range(2, rounds)]


@pytest.mark.dask
def test_a_wrongly_declared_ring_inbox_is_reported(dask_client):
    from dmp.engine.backends.dask import DaskBackend

    class Undercounted(DeclaredSlowArrival):
        DELAY = 0.0

        def ring_inbox(self, round):
            return [0] * self.driver["P"]

    backend = DaskBackend(dask_client)
    try:
        with pytest.raises(RuntimeError, match=r"declared ring messages \[0, 0\] .* sent "
                                               r"\[1, 1\]"):
            run(Undercounted(), backend, max_iter=4, staleness=1)
    finally:
        backend.close()


def test_undeclared_ring_rounds_run_bulk_synchronously_in_process():
    """Without `ring_inbox` a ring program's rounds never overlap, whatever the staleness:
    each push sees the pull of the round before."""

    class Undeclared(DeclaredSlowArrival):
        DELAY = 0.0

        def ring_inbox(self, round):
            return None

    prog = Undeclared()
    run(prog, LocalBackend(2), max_iter=4, staleness=2)
    assert prog.driver["saw"] == [[None] * 2] + [[r - 1] * 2 for r in range(1, 4)]


class RefusesARound(SlowArrival):
    DELAY = 0.0

    def receive(self, state, round, src, payload):
        if round == 2:
            raise ValueError(f"partition {state['p']} refuses the message of round 2")
        super().receive(state, round, src, payload)


@pytest.mark.dask
@pytest.mark.parametrize("staleness", [0, 1])
def test_a_message_the_receiver_cannot_take_in_fails_the_fit(dask_client, staleness,
                                                              ring_transport):
    """Ring messages are one-way: the receiver's failure is raised by its next call."""
    from dmp.engine.backends.dask import DaskBackend

    backend = DaskBackend(dask_client)
    try:
        with pytest.raises(ValueError, match="refuses the message of round 2"):
            run(RefusesARound(), backend, max_iter=6, staleness=staleness)
    finally:
        backend.close()


def _open_ring_connections(dask_worker):
    from dmp.engine import ring
    from dmp.engine.worker import RING_HANDLER

    return {"dask": sum(op == RING_HANDLER for op in dask_worker._comms.values()),
            "socket": ring.open_connections(dask_worker)}


@pytest.mark.dask
def test_closing_the_backend_closes_the_ring_connections(dask_client, ring_transport):
    import time

    from dmp.engine.backends.dask import DaskBackend

    def open_connections(wait_for_none=False):
        # the shared cluster's earlier fits close their connections asynchronously
        deadline = time.monotonic() + 10
        while True:
            counts = dask_client.run(_open_ring_connections).values()
            n = {kind: sum(c[kind] for c in counts) for kind in ("dask", "socket")}
            if not (wait_for_none and any(n.values())) or time.monotonic() > deadline:
                return n
            time.sleep(0.1)

    assert open_connections(wait_for_none=True) == {"dask": 0, "socket": 0}
    backend = DaskBackend(dask_client)
    try:
        _fit_and_check(backend, 2)
        other = "dask" if ring_transport == "socket" else "socket"
        assert open_connections() == {ring_transport: 2, other: 0}
    finally:
        backend.close()
    assert open_connections(wait_for_none=True) == {"dask": 0, "socket": 0}


def _point_the_ring_port_elsewhere(dask_worker):
    """This worker's ring endpoint now names a port nothing listens on (its own listener's,
    closed); returns what it named before."""
    from dmp.engine import ring

    server = ring.server_for(dask_worker)
    before = server.endpoint
    probe = __import__("socket").create_server((before[0], 0))
    dead_port = probe.getsockname()[1]
    probe.close()
    server.endpoint = (before[0], dead_port, before[2])
    return before


def _restore_ring_port(dask_worker, endpoint):
    from dmp.engine import ring

    ring.server_for(dask_worker).endpoint = tuple(endpoint)


@pytest.mark.dask
def test_a_peer_whose_ring_port_cannot_be_reached_gets_its_messages_through_dask(
        dask_client, dask_settings):
    from dmp.engine.backends.dask import DaskBackend

    dask_settings({"dmp.ring.transport": "socket"})
    before = dask_client.run(_point_the_ring_port_elsewhere)
    backend = DaskBackend(dask_client)
    try:
        _fit_and_check(backend, 2)
        # each partition's one peer could not be reached: both messages went through Dask
        counts = dask_client.run(_open_ring_connections).values()
        assert {k: sum(c[k] for c in counts) for k in ("dask", "socket")} == \
            {"dask": 2, "socket": 0}
    finally:
        backend.close()
        for address, endpoint in before.items():
            dask_client.run(_restore_ring_port, endpoint=endpoint, workers=[address])


class AllToAll(Program):
    """Every round each partition sends ``(round, index)`` to every other one; each push
    checks that it holds exactly the messages of the round before, from all the others.  The
    pulls return nothing, so rounds may run in batches (`Program.batch_rounds`)."""

    name = "all-to-all"
    uses_ring = True

    def partition_specs(self, n_partitions):
        return [{"p": p, "P": n_partitions} for p in range(n_partitions)]

    def start(self, n_partitions):
        self.driver = {"P": n_partitions, "verdicts": []}

    def schedule(self, round):
        return [{"round": round}] * self.driver["P"]

    def ring_inbox(self, round):
        return [self.driver["P"] - 1] * self.driver["P"]

    def batch_rounds(self, round):
        return 1000

    def init_partition(self, spec):
        return {"p": spec["p"], "P": spec["P"], "inbox": {}, "total": 0}

    def receive(self, state, round, src, payload):
        state["inbox"].setdefault(round, {})[src] = payload

    def push(self, s, plan):
        r, p, P = plan["round"], s["p"], s["P"]
        ok = True
        if r > 0:
            got = s["inbox"].pop(r - 1)
            ok = got == {q: (r - 1, q) for q in range(P) if q != p}
        ok &= all(k >= r for k in s["inbox"])  # nothing older left behind
        s["total"] += r
        return Sends({"ok": ok}, {q: (r, p) for q in range(P) if q != p})

    def pull(self, round, partials):
        self.driver["verdicts"].append(all(q["ok"] for q in partials))
        return None

    def partition_arrays(self, s):
        return {"total": np.array([s["total"]])}


def _fails_on_dask(dask_client, program, match, **run_kw):
    """Run ``program`` on a fresh Dask backend and check it fails with ``match``."""
    from dmp.engine.backends.dask import DaskBackend

    backend = DaskBackend(dask_client)
    try:
        with pytest.raises(RuntimeError, match=match):
            run(program, backend, **run_kw)
    finally:
        backend.close()


def _counting_backend(dask_client):
    from dmp.engine.backends.dask import DaskBackend

    class Counting(DaskBackend):
        """Records (first round, rounds) of every call it issues."""

        def step(self, round, updates, plans):
            self.calls.append((round, 1))
            return super().step(round, updates, plans)

        def step_batch(self, round, updates, plans_seq):
            self.calls.append((round, len(plans_seq)))
            return super().step_batch(round, updates, plans_seq)

    backend = Counting(dask_client)
    backend.calls = []
    return backend


@pytest.mark.dask
@pytest.mark.parametrize("staleness", [0, 1])
def test_batched_rounds_see_every_message_of_the_round_before(dask_client, staleness,
                                                               ring_transport):
    """Rounds run in batches (one call per partition for many rounds) that grow from one
    round, never cross a round that starts drained (every ``checkpoint_every``-th), and each
    push inside a batch waits for the other partitions' messages of the round before."""
    rounds, every = 120, 50
    backend = _counting_backend(dask_client)
    try:
        prog = AllToAll()
        res = run(prog, backend, max_iter=rounds, staleness=staleness, checkpoint_every=every)
    finally:
        backend.close()
    assert prog.driver["verdicts"] == [True] * rounds
    assert [int(a["total"][0]) for a in res.partition_arrays] == [sum(range(rounds))] * 2
    calls = backend.calls
    assert [r for r, m in calls for r in range(r, r + m)] == list(range(rounds))
    assert calls[0] == (0, 1) and max(m for _, m in calls) > 4
    assert not [(r, m) for r, m in calls if any((r + j) % every == 0 for j in range(1, m))]
    assert len(res.history) == rounds
    assert [(rec["round"], rec["batch"]) for rec in res.history] == [
        (r, r0) for r0, m in calls for r in range(r0, r0 + m)]
    assert all(rec["round_s"] >= max(rec["push_s"]) for rec in res.history)


@pytest.mark.dask
@pytest.mark.timeout(120)
def test_more_partitions_on_a_worker_than_it_has_default_threads(dask_client, dask_settings):
    """Every partition pushes on its own thread: a batch blocks its thread while it waits for
    the others' messages, so partitions sharing the event loop's default threads (cpu + 4 of
    them) waited for ones that had not started, until ``dmp.ring.timeout``."""
    import os

    from dmp.engine.backends.dask import DaskBackend

    default_threads = min(32, (os.cpu_count() or 1) + 4)
    n_workers = len(dask_client.scheduler_info()["workers"])
    P = n_workers * (default_threads + 2)
    dask_settings({"dmp.ring.transport": "socket"})
    backend = DaskBackend(dask_client, n_workers=P)
    try:
        prog = AllToAll()
        rounds = 8
        res = run(prog, backend, max_iter=rounds)
    finally:
        backend.close()
    assert prog.driver["verdicts"] == [True] * rounds
    assert [int(a["total"][0]) for a in res.partition_arrays] == [sum(range(rounds))] * P


def _slow(seconds):
    """An `AllToAll` whose every push sleeps ``seconds`` first."""
    class Slow(AllToAll):
        def push(self, s, plan):
            time.sleep(seconds)
            return super().push(s, plan)

    return Slow()


@pytest.mark.dask
def test_batched_rounds_are_timed_when_they_ended_on_the_workers(dask_client):
    """The driver scores a batch's rounds only after the whole batch ran; their history time
    is when each ended on the workers (in order, never later than the driver saw them)."""
    backend = _counting_backend(dask_client)
    try:
        res = run(_slow(0.004), backend, max_iter=60, checkpoint_every=1000)
    finally:
        backend.close()
    assert max(m for _, m in backend.calls) > 4
    times = [rec["time"] for rec in res.history]
    assert times == sorted(times) and times[-1] <= res.wall_s
    for prev, rec in zip(res.history, res.history[1:]):
        if rec["batch"] == prev["batch"]:   # a round after another of the same call
            assert rec["time"] - prev["time"] >= 0.003


@pytest.mark.dask
def test_batches_keep_their_size_with_a_batch_in_flight(dask_client, dask_settings):
    """A batch is sized by how long the one before ran on the workers, not by issue to
    gather: with the next batch in flight (staleness 1) that also counts the wait behind the
    batch before, and the sizes swung between large batches and batches of one round."""
    dask_settings({"dmp.batch.target-duration": "120ms"})

    backend = _counting_backend(dask_client)
    try:
        run(_slow(0.003), backend, max_iter=900, staleness=1, checkpoint_every=10_000)
    finally:
        backend.close()
    settled = [m for _, m in backend.calls][6:-1]   # after the growth, without the rest
    assert np.median(settled) >= 10, backend.calls
    assert sorted(settled)[1] >= np.median(settled) / 3, backend.calls


def test_rounds_run_one_by_one_in_process():
    prog = AllToAll()
    res = run(prog, LocalBackend(3), max_iter=20, staleness=1)
    assert prog.driver["verdicts"] == [True] * 20
    assert [int(a["total"][0]) for a in res.partition_arrays] == [sum(range(20))] * 3


@pytest.mark.dask
def test_a_pull_update_inside_a_batch_is_refused(dask_client):
    class Updates(AllToAll):
        def pull(self, round, partials):
            super().pull(round, partials)
            return Broadcast(round)

    _fails_on_dask(dask_client, Updates(), r"Updates.pull returned an update for round \d+, "
                   r"which ran in a batch", max_iter=200)


def _refuse_to_load():
    raise ImportError("no module named 'driver_only'")


class _DriverOnly:
    """Pickles on the driver; cannot be rebuilt on a worker (as an object of a module only
    the driver has)."""

    def __reduce__(self):
        return _refuse_to_load, ()


@pytest.mark.dask
@pytest.mark.parametrize("where", ["plan", "update", "plan in a batch"])
@pytest.mark.timeout(60)
def test_an_argument_a_worker_cannot_unpickle_fails_the_fit(dask_client, where):
    """Instead of hanging (distributed's actor call never resolves then), the call fails
    with an error naming the cause."""

    class CarriesDriverOnly(AllToAll):
        def schedule(self, round):
            plans = super().schedule(round)
            return ([dict(p, x=_DriverOnly()) for p in plans]
                    if where.startswith("plan") and round == 3 else plans)

        def pull(self, round, partials):
            super().pull(round, partials)
            return Broadcast(_DriverOnly()) if where == "update" and round == 2 else None

        def batch_rounds(self, round):
            # rounds 1-4 run as one batch (the cap grows 1, 4, ...)
            return super().batch_rounds(round) if where == "plan in a batch" else 1

    _fails_on_dask(dask_client, CarriesDriverOnly(), r"could not be unpickled on this worker "
                   r"\(ImportError: no module named 'driver_only'", max_iter=6)


def test_guarded_arguments_round_trip_with_writable_arrays():
    from distributed.protocol import deserialize, serialize

    from dmp.engine.worker import guard, unguard

    value = {"u": np.arange(100_000.0), "plan": [1, "a"]}
    assert unguard(guard(value)) is value            # in process: never pickled
    assert guard(None) is None and unguard(None) is None
    header, frames = serialize(guard(value), serializers=("pickle",))
    got = unguard(deserialize(header, [bytes(f) for f in frames]))   # read-only frames
    np.testing.assert_array_equal(got["u"], value["u"])
    assert got["plan"] == [1, "a"] and got["u"].flags.writeable
    bad = deserialize(*serialize(guard(_DriverOnly()), serializers=("pickle",)))
    with pytest.raises(RuntimeError, match="could not be unpickled"):
        unguard(bad)


@pytest.mark.dask
def test_batches_bring_back_a_bounded_number_of_bytes(dask_client, dask_settings):
    """A batch's replies hold every round's partials: their bytes bound its length."""
    class Heavy(AllToAll):
        def push(self, s, plan):
            out = super().push(s, plan)
            return Sends({**out.partial, "load": np.zeros(128 * 1024 // 8)}, out.messages)

    dask_settings({"dmp.batch.max-bytes": "1MiB"})
    backend = _counting_backend(dask_client)
    try:
        prog = Heavy()
        res = run(prog, backend, max_iter=60)
    finally:
        backend.close()
    assert prog.driver["verdicts"] == [True] * 60
    # two partitions x 128 KiB (and a little more) a round: at most 3 rounds fit 1 MiB
    assert max(m for _, m in backend.calls) == 3
    assert res.history[-1]["bytes_push"] >= 2 * 128 * 1024


@pytest.mark.dask
def test_the_longest_batch_is_a_setting(dask_client, dask_settings):
    """``dmp.batch.max-rounds`` caps the rounds of one call; the result is the same."""
    lengths = {}
    for cap in (None, 3):
        if cap is not None:
            dask_settings({"dmp.batch.max-rounds": cap})
        backend = _counting_backend(dask_client)
        try:
            prog = AllToAll()
            run(prog, backend, max_iter=60)
        finally:
            backend.close()
        assert prog.driver["verdicts"] == [True] * 60
        lengths[cap] = max(m for _, m in backend.calls)
    assert lengths[None] > 3 and lengths[3] == 3, lengths
