"""The engine's contracts are written down and enforced: a backend declares its capabilities
(`dmp.engine.backends.Backend`) and the runner reads them instead of probing for methods."""

import numpy as np
import pytest

from dmp.engine import Backend, LocalBackend, resolve_backend, run
from dmp.engine.backends import check_backend
from dmp.engine.program import Broadcast, Program


class Counter(Program):
    """Each round adds one to every partition's count."""

    name = "counter"

    def partition_specs(self, n_partitions):
        return [{"k": k} for k in range(n_partitions)]

    def start(self, n_partitions):
        self.driver = {"P": n_partitions}

    def schedule(self, round):
        return [None] * self.driver["P"]

    def pull(self, round, partials):
        return Broadcast(1)

    def init_partition(self, spec):
        return {"n": np.zeros(1)}

    def push(self, s, plan):
        return float(s["n"][0])

    def apply(self, s, update):
        s["n"] += update

    def partition_arrays(self, s):
        return {"n": s["n"].copy()}


def test_local_backend_declares_its_capabilities():
    b = LocalBackend(2)
    assert isinstance(b, Backend)
    assert (b.needs_store, b.in_driver_process, b.runs_batches, b.overlaps_rounds,
            b.sends_events) == (False, True, False, False, False)
    assert check_backend(b) is b and resolve_backend(b) is b


def test_a_backend_missing_a_capability_cannot_be_made():
    members = {name: value for name, value in vars(LocalBackend).items()
               if name == "__init__" or not name.startswith("_")}
    del members["runs_batches"]
    NoBatches = type(Backend)("NoBatches", (Backend,), members)
    with pytest.raises(TypeError, match="NoBatches.*'runs_batches'"):
        NoBatches(1)


class DuckBackend:
    """A backend written before the interface: the methods, no capabilities."""

    def __init__(self):
        self._inner = LocalBackend(1)

    def __getattr__(self, name):
        if name in ("needs_store", "in_driver_process", "runs_batches", "overlaps_rounds",
                    "sends_events"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def step(self, *args):
        return self._inner.step(*args)

    def start(self, *args):
        return self._inner.start(*args)


def test_an_object_without_the_capabilities_is_refused_naming_them():
    msg = (r"DuckBackend is not a dmp backend: it does not declare the capabilities "
           r"'needs_store', 'in_driver_process', 'runs_batches', 'overlaps_rounds', "
           r"'sends_events' \(subclass dmp.engine.backends.Backend\)")
    with pytest.raises(TypeError, match=msg):
        resolve_backend(DuckBackend())
    with pytest.raises(TypeError, match=msg):
        run(Counter(), DuckBackend(), max_iter=2)
    # what is no backend at all keeps its error
    with pytest.raises(ValueError, match="backend must be 'auto', 'local', 'dask' or a "
                                         "backend instance"):
        resolve_backend(object())


def test_a_backend_declaring_batches_must_run_them():
    class Claims(LocalBackend):
        runs_batches = True
        step_batch, gather_batch = Backend.step_batch, Backend.gather_batch

    with pytest.raises(TypeError, match=r"Claims declares runs_batches but does not "
                                        r"implement 'step_batch' or 'gather_batch'"):
        run(Counter(), Claims(1), max_iter=2)


class Listening(LocalBackend):
    """An in-process backend with a live monitor of its own."""

    sends_events = True

    def __init__(self, n_workers):
        super().__init__(n_workers)
        self.events = []
        self.registered = 0

    def register_monitor(self):
        self.registered += 1
        return True

    def log_event(self, msg, wait=False):
        self.events.append(msg)


def test_events_go_to_a_backend_that_declares_it_sends_them():
    backend = Listening(2)
    res = run(Counter(), backend, max_iter=3)
    assert backend.registered == 1
    kinds = [e["kind"] for e in backend.events]
    assert kinds == ["fit_start", "round", "round", "round", "fit_end"]
    assert backend.events[0]["n_partitions"] == 2
    assert backend.events[0]["workers"] == ["partition-0", "partition-1"]
    assert all(e["fit"] == res.fit_id for e in backend.events)
    assert backend.events[-1]["status"] == "max_iter"
    np.testing.assert_array_equal([a["n"][0] for a in res.partition_arrays], [3.0, 3.0])


def test_no_events_from_a_backend_that_declares_none():
    class Quiet(Listening):
        sends_events = False

    backend = Quiet(1)
    run(Counter(), backend, max_iter=2)
    assert backend.events == [] and backend.registered == 0


@pytest.mark.dask
def test_dask_backend_declares_its_capabilities(dask_client):
    from dmp.engine.backends.dask import DaskBackend

    b = DaskBackend(dask_client)
    try:
        assert isinstance(b, Backend) and check_backend(b) is b
        # the fixture's workers are processes of their own
        assert (b.needs_store, b.in_driver_process, b.runs_batches, b.overlaps_rounds,
                b.sends_events) == (True, False, True, True, True)
    finally:
        b.close()


# ---------------------------------------------------------------------- typed messages
def _lasso(P=2):
    import scipy.sparse as sp

    from dmp.linear_model._lasso_program import LassoProgram
    from dmp.io.sparse import InMemorySparseDataset

    rng = np.random.default_rng(0)
    X = sp.random(30, 12, density=0.3, random_state=0, format="csc")
    y = rng.standard_normal(30)
    prog = LassoProgram(InMemorySparseDataset(X, y, n_shards=P), alpha=0.01,
                        fit_intercept=True, schedule="priority", schedule_size=8, eta=1e-3,
                        rho=0.1, oversample=2.0, tol=0.0, check_every=100, refresh_every=2,
                        seed=0)
    backend = LocalBackend(P)
    backend.start(prog, prog.partition_specs(P))
    prog.start(P)
    return prog, backend


def test_a_message_of_an_unknown_type_is_refused_naming_it():
    prog, backend = _lasso()
    state = backend.workers[0].state
    with pytest.raises(TypeError, match=r"^LassoProgram got a plan of type dict; it handles "
                                        r"CDPlan, GapPlan, RefreshPlan$"):
        prog.push(state, {"kind": "gap", "round": 0})
    with pytest.raises(TypeError, match=r"^LassoProgram got an update of type dict; it "
                                        r"handles CDUpdate, RefreshUpdate$"):
        prog.apply(state, {"kind": "refresh", "r": np.zeros(30)})
    with pytest.raises(TypeError, match=r"^LassoProgram got a partial result of type tuple"):
        prog.pull(0, [(1.0,), (2.0,)])


def test_messages_pickle_and_count_their_bytes_as_the_dicts_did():
    import pickle

    from dmp.engine.comm import payload_nbytes
    from dmp.linear_model._lasso_program import CDPartial, CDPlan, GapPlan

    prog, backend = _lasso()
    rounds = []
    for t in range(6):   # a gap round, then coordinate descent
        plans = prog.schedule(t)
        partials = [w.step(t, None, plans[k])["partial"] for k, w in enumerate(backend.workers)]
        rounds.append((plans, partials))
        backend.apply_all(prog.pull(t, partials))
    assert isinstance(rounds[0][0][0], GapPlan) and isinstance(rounds[1][0][0], CDPlan)
    plan, part = rounds[1][0][0], rounds[1][1][0]
    assert isinstance(part, CDPartial)
    for msg in (plan, part):
        back = pickle.loads(pickle.dumps(msg))
        assert type(back) is type(msg) and pickle.dumps(back) == pickle.dumps(msg)
    # one 8-byte scalar for the type, as for the "kind" tag of the dict messages
    as_dict = {"kind": "cd", "round": plan.round, "idx": plan.idx, "keep": plan.keep,
               "filter": plan.filter, "sweeps": plan.sweeps, "inner_tol": plan.inner_tol,
               "gap": plan.gap, "gap_first": plan.gap_first}
    assert payload_nbytes(plan) == payload_nbytes(as_dict) == 8 * 8 + plan.idx.nbytes


def test_the_lasso_driver_has_named_fields_and_reads_as_before():
    prog, _ = _lasso()
    d = prog.driver
    assert d.P == 2 and d.need_gap and d["need_gap"] is d.need_gap
    np.testing.assert_array_equal(d["starts"], d.starts)
    with pytest.raises(KeyError, match="no_such"):
        d["no_such"]


@pytest.mark.parametrize("program,handles", [
    ("dmp.decomposition._lda_program:LDAProgram", "CountPlan, SamplePlan"),
    ("dmp.decomposition._mf_program:CCDProgram", "CCDInitPlan, CCDWPlan, CCDHPlan"),
    ("dmp.decomposition._mf_program:CCDPPProgram", "PPInitPlan, PPFeaturePlan"),
    ("dmp.linear_model._sparsified_program:SparsifiedProgram", "InitPlan, StepPlan"),
    ("dmp.hashing._parmac:ParMACProgram", "StatsPlan, ITQPlan, InitPlan, RestorePlan, "
                                          "HopPlan, SpreadPlan, CheckPlan, ZPlan"),
])
def test_every_program_refuses_a_plan_it_does_not_know(program, handles):
    """Before it touches the partition's state (the dicts tagged "kind" of before)."""
    import importlib

    module, name = program.split(":")
    cls = getattr(importlib.import_module(module), name)
    prog = cls.__new__(cls)   # dispatch needs no configuration
    with pytest.raises(TypeError, match=rf"^{name} got a plan of type dict; it handles "
                                        rf"{handles}$"):
        prog.push({}, {"kind": "init", "round": 0})


def test_ccd_refuses_an_update_it_does_not_know():
    from dmp.decomposition._mf_program import CCDProgram

    prog = CCDProgram.__new__(CCDProgram)
    with pytest.raises(TypeError, match=r"^CCDProgram got an update of type dict; it handles "
                                        r"CCDInitUpdate, CCDWUpdate, CCDHUpdate$"):
        prog.apply({}, {"kind": "W", "round": 1, "k": (0, 1)})


class SlowCounter(Counter):
    """A round of about a millisecond, with a progress postfix."""

    def push(self, state, plan):
        import time

        time.sleep(0.001)
        return super().push(state, plan)

    def pull(self, round, partials):
        self.driver["rounds"] = round + 1
        return super().pull(round, partials)

    def progress_postfix(self):
        return {"done": self.driver["rounds"]}


def test_the_progress_bar_draws_at_most_ten_times_a_second_with_its_postfix(monkeypatch):
    """On a terminal, a fit of many short rounds draws tqdm's bar at its interval, not once
    per round, and the last draw has the last postfix."""
    import os
    import pty
    import sys

    import fcntl
    import struct
    import termios

    master, replica = pty.openpty()
    # a terminal 120 columns wide (a new one has none: tqdm would draw an empty bar)
    fcntl.ioctl(replica, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    tty = os.fdopen(replica, "w")
    try:
        monkeypatch.setattr(sys, "stderr", tty)
        res = run(SlowCounter(), LocalBackend(1), max_iter=400, show_progress=True,
                  desc="slow")
        tty.flush()
        monkeypatch.undo()
        # read while the terminal is open (closing it may drop what is unread)
        os.set_blocking(master, False)
        err = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except BlockingIOError:
                break
            err += chunk
    finally:
        tty.close()
        os.close(master)
    err = err.decode()
    assert res.n_rounds == 400
    draws = err.count("\r")
    assert 2 <= draws <= max(20, 15 * res.wall_s)
    last = err.rstrip("\r\n").split("\r")[-1]
    assert "400/400" in last and "done=400" in last


def test_progress_in_a_log_file_is_whole_lines_at_an_interval(capsys, monkeypatch):
    """Not on a terminal (a log file, a pipe), progress is a line every interval and one
    at the end, never a carriage return."""
    import dmp.engine.progress as progress

    res = run(SlowCounter(), LocalBackend(1), max_iter=400, show_progress=True, desc="slow")
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert 1 <= len(lines) <= 1 + res.wall_s / progress.LINE_INTERVAL_S
    assert lines[-1].startswith("slow: 400/400 rounds, ") and lines[-1].endswith(", done=400")

    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 0.05)
    res = run(SlowCounter(), LocalBackend(1), max_iter=400, show_progress=True, desc="slow")
    lines = capsys.readouterr().err.splitlines()
    counts = [int(line.split(": ")[1].split("/")[0]) for line in lines]
    # a line every 0.05 s of a fit of at least 0.4 s, in order, the last one at the end
    assert len(lines) >= 4 and counts == sorted(counts) and counts[-1] == 400
    assert len(set(counts)) == len(counts)
    assert len(lines) <= 2 + res.wall_s / 0.05
