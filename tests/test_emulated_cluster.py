"""dmp.testing.EmulatedCluster: Dask workers confined by CPU cgroups emulate one-core
machines slowed to ``cpu`` of a core; fits on it equal in-process fits, a killed worker is
recovered, and nothing is left behind.

The cgroup tests need Linux, root and the cgroup ``cpu`` controller; they skip with the
reason where those are absent, unless ``DMP_REQUIRE_CGROUPS=1`` (CI), which fails them."""

import os
import signal
import subprocess
import time
import warnings

import numpy as np
import pytest

from dmp.linear_model import Lasso
from dmp.testing import (CgroupsUnavailable, EmulatedCluster, _find_hierarchy,
                         emulation_unavailable, remove_stale_cgroups, spin)

from conftest import alpha_max, make_problem

pytestmark = [pytest.mark.dask, pytest.mark.timeout(240)]

Q = 0.3          # cores per worker of the shared cluster: 3 x 0.3 + 0.4 + 0.3 <= 2 cores
DRIVER = 0.4


@pytest.fixture(scope="module", autouse=True)
def _spawned_workers():
    """The emulated clusters' nannies spawn their workers, as a user's do (the session's
    LocalCluster workers are forked from a warm server, tests/conftest.py): a fork server
    outliving its nanny for a moment would count as a process left behind."""
    import dask

    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        yield


def _require_cgroups():
    reason = emulation_unavailable()
    if reason is None:
        return
    if os.environ.get("DMP_REQUIRE_CGROUPS") == "1":
        pytest.fail(f"DMP_REQUIRE_CGROUPS=1 but EmulatedCluster cannot run: {reason}")
    pytest.skip(f"EmulatedCluster cannot run here: {reason}")


def _lasso_problem():
    X, y = make_problem(n=200, p=1500, density=0.03, seed=5)
    return X, y, dict(alpha=0.05 * alpha_max(X, y), tol=1e-9, random_state=0, n_workers=3)


def _objective(X, y, est, alpha):
    r = y - X @ est.coef_ - est.intercept_
    return 0.5 * float(r @ r) / X.shape[0] + alpha * np.abs(est.coef_).sum()


def _workers(client):
    info = client.scheduler_info(n_workers=-1)["workers"]
    return {str(w["name"]): addr for addr, w in info.items()}


def _own_cpu_cgroup():
    h = _find_hierarchy()
    return h.own


def _ours():
    """This process's emulated-cluster cgroups still on the machine."""
    h = _find_hierarchy()
    base = h.base()
    return [d for d in os.listdir(base) if d.startswith(f"dmp-emulated-{os.getpid()}-")]


# ------------------------------------------------------------------ without cgroups


def test_refuses_more_cores_than_the_machine_has():
    cores = len(os.sched_getaffinity(0))
    n = int(cores / 0.25) + 1
    before = set(_ours()) if emulation_unavailable() is None else set()
    with pytest.raises(ValueError, match=rf"asks for {n * 0.25 + 0.5:g} cores \({n} workers "
                                         rf"x 0.25 \+ driver 0.25 \+ scheduler 0.25\) but "
                                         rf"this machine has {cores} cores"):
        EmulatedCluster(n_workers=n, cpu=0.25)
    if emulation_unavailable() is None:
        assert set(_ours()) == before


def test_exactly_the_machine_is_accepted():
    cores = len(os.sched_getaffinity(0))
    cluster = EmulatedCluster(n_workers=2, cpu=(cores - 0.5) / 2)   # nothing starts yet
    assert cluster.cores_asked() == pytest.approx(cores)


@pytest.mark.parametrize("bad", [0, -0.5, "1"])
def test_rejects_a_nonpositive_cpu(bad):
    with pytest.raises(ValueError, match="cpu must be a positive number of cores"):
        EmulatedCluster(n_workers=1, cpu=bad)


def test_refuses_when_cgroups_cannot_be_written(monkeypatch):
    """A cpu hierarchy whose directory refuses new cgroups (as /sys/fs/cgroup/cpu does for a
    user who is not root; /sys/kernel refuses even root)."""
    import dmp.testing

    unwritable = dmp.testing._Hierarchy(1, "/sys/kernel", "/sys/kernel")
    monkeypatch.setattr(dmp.testing, "_find_hierarchy", lambda: unwritable)
    reason = emulation_unavailable()
    assert reason.startswith("cannot write the cgroup /sys/kernel/dmp-emulated-")
    with pytest.raises(CgroupsUnavailable, match=r"cannot write the cgroup /sys/kernel/"
                                                 r"dmp-emulated-\d+-\d+: Operation not "
                                                 r"permitted"):
        EmulatedCluster(n_workers=1, cpu=0.2).start()


def test_cgroup_v2_is_detected_and_written(tmp_path):
    """On a v2 machine (``cpu.max``), checked on a directory laid out like cgroupfs."""
    root = tmp_path / "cg2"
    (root / "user.slice" / "me").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("cpu memory\n")
    (root / "user.slice" / "cgroup.subtree_control").write_text("memory\n")
    mounts = f"cgroup2 {root} cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
    h = _find_hierarchy(mounts, "0::/user.slice/me\n")
    assert (h.version, h.own) == (2, str(root / "user.slice" / "me"))
    # user.slice does not delegate cpu: the nearest ancestor that does is the root
    assert h.base() == str(root)
    (root / "user.slice" / "cgroup.subtree_control").write_text("cpu memory\n")
    assert h.base() == str(root / "user.slice")
    g = root / "user.slice" / "g"
    g.mkdir()
    (g / "cpu.max").write_text("")   # cgroupfs makes a new cgroup's files itself
    h.set_cpu(str(g), 0.2)
    assert (g / "cpu.max").read_text() == "2000 10000"
    (g / "cpu.max").write_text("")
    h.set_cpu(str(g), 0.05)       # under the kernel's 1 ms minimum quota: a longer period
    assert (g / "cpu.max").read_text() == "1000 20000"
    assert h.quota_cores(str(g)) == pytest.approx(0.05)
    # the cluster's parent: cpu for its children, weighed like its 5 processes
    for f in ("cgroup.subtree_control", "cpu.weight"):
        (g / f).write_text("")
    h.prepare_parent(str(g), 5)
    assert ((g / "cgroup.subtree_control").read_text(), (g / "cpu.weight").read_text()) == \
        ("+cpu", "500")


def test_v1_cpu_mount_wins_and_missing_controller_is_named(tmp_path):
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("hugetlb\n")
    v1 = tmp_path / "cpu"
    (v1 / "a").mkdir(parents=True)
    mounts = (f"cgroup2 {v2} cgroup2 rw,relatime 0 0\n"
              f"cgroup {v1} cgroup rw,relatime,cpu 0 0\n")
    h = _find_hierarchy(mounts, "1:cpu:/a\n0::/\n")
    assert (h.version, h.own, h.base()) == (1, str(v1 / "a"), str(v1 / "a"))
    with pytest.raises(CgroupsUnavailable, match=r"no cpu cgroup controller.*offers only "
                                                 r"\['hugetlb'\]"):
        _find_hierarchy(f"cgroup2 {v2} cgroup2 rw,relatime 0 0\n", "0::/\n")


# ------------------------------------------------------------------ on emulated workers


@pytest.fixture(scope="class")
def lasso_reference():
    # fitted before the cluster confines this process (emulated3 asks for it first); it
    # also compiles the cached kernels the workers then load
    X, y, kw = _lasso_problem()
    return Lasso(backend="local", **kw).fit(X, y)


@pytest.fixture(scope="class")
def emulated3(lasso_reference):
    """One cluster for the class below (it starts in seconds on an idle machine, tens on a
    busy one), closed before the cleanup tests start their own."""
    _require_cgroups()
    with EmulatedCluster(n_workers=3, cpu=Q, memory_limit="1GiB", driver_cpu=DRIVER,
                         scheduler_cpu=0.3) as cluster:
        yield cluster


class TestOnThreeEmulatedWorkers:
    def test_a_worker_gets_its_quota_and_no_more(self, emulated3):
        share = emulated3.cpu_share("w0", seconds=2.0)
        # unconfined, the spin would take a whole core (or what the machine's load leaves)
        assert 0.25 * Q <= share <= 1.1 * Q, share
        # the worker runs in its own cgroup (with its nanny)
        client = emulated3.client
        addr = _workers(client)["w0"]
        pid = client.run(os.getpid, workers=[addr])[addr]
        assert pid in emulated3.hierarchy.procs(emulated3.cgroups["w0"])
        # on a busy machine the cluster's 5 processes compete like 5 processes, not one
        if emulated3.hierarchy.version == 1:
            parent = os.path.dirname(emulated3.cgroups["w0"])
            with open(os.path.join(parent, "cpu.shares")) as f:
                assert int(f.read()) == 5 * 1024

    def test_workers_get_the_drivers_dask_config_and_quiet_housekeeping(self, emulated3):
        import dask

        key = "distributed.deploy.lost-worker-timeout"   # set for the session in conftest
        got = emulated3.client.run(dask.config.get, key)
        assert set(got.values()) == {dask.config.get(key)} and len(got) == 3
        # with dmp's quieter housekeeping over them (an idle worker takes 0.01 core, not 0.04)
        got = emulated3.client.run(dask.config.get, "distributed.admin.tick.interval")
        assert set(got.values()) == {"200ms"}

    def test_the_driver_is_confined_while_the_cluster_is_open(self, emulated3):
        assert _own_cpu_cgroup() == emulated3.cgroups["driver"]
        cpu, wall = spin(1.0)
        assert cpu / wall <= 1.1 * DRIVER, (cpu, wall)

    @pytest.mark.slow      # the first fit: the workers import dmp and load its kernels
    def test_lasso_on_three_emulated_workers_equals_in_process(self, emulated3,
                                                               lasso_reference):
        X, y, kw = _lasso_problem()
        est = Lasso(backend=emulated3.client, **kw).fit(X, y)
        # the same seed and worker count: the same coefficients, round for round
        np.testing.assert_allclose(est.coef_, lasso_reference.coef_, rtol=0, atol=1e-13)
        assert est.n_iter_ == lasso_reference.n_iter_
        assert est.history_["push_s"].shape[1] == 3

    @pytest.mark.slow
    def test_a_killed_worker_is_recovered(self, emulated3, lasso_reference, tmp_path):
        X, y, kw = _lasso_problem()
        client = emulated3.client
        killed = []

        def kill_once(round, metrics):
            if round == 15 and not killed:
                addr = _workers(client)["w1"]
                pid = client.run(os.getpid, workers=[addr])[addr]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            return False

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = Lasso(backend=client, checkpoint=str(tmp_path / "ck.zarr"),
                        checkpoint_every=10, callback=kill_once, **kw).fit(X, y)
        assert len(killed) == 1 and len(est.recoveries_) == 1, est.recoveries_
        f_ref = _objective(X, y, lasso_reference, kw["alpha"])
        assert abs(_objective(X, y, est, kw["alpha"]) - f_ref) <= 1e-8 * f_ref
        np.testing.assert_allclose(est.coef_, lasso_reference.coef_, atol=1e-6)
        # the nanny restarted w1 in w1's cgroup: still an emulated machine of Q cores
        deadline = time.monotonic() + 60
        while "w1" not in _workers(client) and time.monotonic() < deadline:
            time.sleep(0.2)
        addr = _workers(client)["w1"]
        pid = client.run(os.getpid, workers=[addr])[addr]
        assert pid != killed[0]
        assert pid in emulated3.hierarchy.procs(emulated3.cgroups["w1"])


# ------------------------------------------------------------------ cleanup


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead: only its exit status waits to be read
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _run_and_interrupt(how, raises, seen):
    """An emulated cluster's ``with`` block left by an exception or by Ctrl-C, with what it
    started recorded in ``seen``."""
    with pytest.raises(raises):
        with EmulatedCluster(n_workers=1, cpu=0.3) as cluster:
            seen["groups"] = dict(cluster.cgroups)
            seen["pids"] = [p for r, g in cluster.cgroups.items() if r != "driver"
                            for p in cluster.hierarchy.procs(g)]
            assert _own_cpu_cgroup() == cluster.cgroups["driver"]
            # the driver's own child: confined with it, moved back with it, left running
            seen["child"] = subprocess.Popen(["sleep", "60"])
            if how == "exception":
                raise RuntimeError("boom")
            # to this thread: os.kill's signal may reach another of the process's threads
            # (the client's event loop), and the main thread then sees it late or not in
            # this block
            signal.raise_signal(signal.SIGINT)
            time.sleep(5)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exception", "ctrl-c"])
def test_nothing_is_left_behind_after_an_exception(how):
    _require_cgroups()
    home = _own_cpu_cgroup()
    seen = {}
    raises = RuntimeError if how == "exception" else KeyboardInterrupt
    # Ctrl-C must mean KeyboardInterrupt here: a suite started as a background job of a
    # non-interactive shell inherits SIGINT ignored, and Python then keeps it ignored (what
    # made two fresh-clone runs see no KeyboardInterrupt)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _run_and_interrupt(how, raises, seen)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(seen["pids"]) >= 2     # the scheduler, the nanny and its worker
    assert not [p for p in seen["pids"] if _alive(p)]
    assert not [g for g in seen["groups"].values() if os.path.exists(g)]
    assert _ours() == []
    assert _own_cpu_cgroup() == home
    child = seen["child"]
    try:
        assert child.poll() is None
        assert child.pid in _find_hierarchy().procs(home)
    finally:
        child.kill()
        child.wait()


def test_rejects_a_bad_memory_limit():
    with pytest.raises(ValueError, match="memory_limit must be a size such as '1GiB'"):
        EmulatedCluster(n_workers=1, memory_limit="not-a-size")


@pytest.mark.slow
def test_a_failed_start_leaves_nothing_behind():
    _require_cgroups()
    home = _own_cpu_cgroup()
    with pytest.raises(TimeoutError, match=r"did not start within 0.5 s"):
        EmulatedCluster(n_workers=1, cpu=0.3, timeout=0.5).start()
    assert _ours() == []
    assert _own_cpu_cgroup() == home


@pytest.mark.slow
def test_a_killed_drivers_cgroups_are_removed_as_stale(tmp_path):
    """A driver SIGKILLed inside its ``with``: its children get SIGTERM from the kernel, the
    next start (or remove_stale_cgroups) removes its cgroups."""
    import sys

    _require_cgroups()
    script = ("import os, signal\n"
              "from dmp.testing import EmulatedCluster\n"
              "with EmulatedCluster(n_workers=1, cpu=0.3) as c:\n"
              "    print(os.getpid(), c.cgroups['w0'], flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    pid, w0 = out.stdout.split()
    parent = os.path.dirname(w0)
    assert os.path.isdir(parent)
    removed = remove_stale_cgroups()
    assert parent in removed and not os.path.exists(parent)
    import tempfile

    assert not [n for n in os.listdir(tempfile.gettempdir())
                if n.startswith(f"dmp-emulated-{pid}-")]
