"""Testing helpers: an emulated multi-machine Dask cluster on one Linux machine.

:class:`EmulatedCluster` starts a ``dask scheduler`` and ``P`` ``dask worker`` processes on
127.0.0.1, each confined to a fraction of a core by its own CPU cgroup, so that ``P`` workers
behave like ``P`` one-core machines slowed to ``cpu`` of a core.  The calling process (the
driver) is confined too while the cluster is open.  It exists to measure how dmp scales on
more workers than the machine has cores.
"""

from __future__ import annotations

import atexit
import errno
import json
import math
import numbers
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref

__all__ = ["EmulatedCluster", "CgroupsUnavailable", "emulation_unavailable",
           "remove_stale_cgroups", "spin", "cpu_period"]

#: the CFS period of every cgroup; the quota is ``cpu`` times it.  A short period keeps a
#: confined process's bursts short (it runs at most ``q x 10 ms`` before it is throttled).
CFS_PERIOD_US = 10_000
#: the kernel refuses quotas under 1 ms; below ``cpu = 0.1`` the period grows instead.
_MIN_QUOTA_US = 1_000
_PREFIX = "dmp-emulated-"
_ROLES_FIXED = ("scheduler", "driver")


def _period_us(cores: float) -> int:
    return max(CFS_PERIOD_US, math.ceil(_MIN_QUOTA_US / cores))


def cpu_period(cores: float) -> float:
    """The CFS period in seconds of a cgroup given ``cores`` (what `dmp.plan`'s
    ``cpu_period`` is for these workers)."""
    return _period_us(cores) / 1e6


class CgroupsUnavailable(RuntimeError):
    """The machine cannot confine processes with CPU cgroups (not Linux, not root, no ``cpu``
    controller, or cgroups mounted read-only)."""


# --------------------------------------------------------------------------- cgroup layer


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    # one write() call: cgroup files take a whole value per write
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class _Hierarchy:
    """One mounted cgroup hierarchy holding the ``cpu`` controller (v1 or v2)."""

    def __init__(self, version: int, mount: str, own: str):
        self.version = version
        self.mount = mount
        self.own = own            # the calling process's cgroup, as a directory

    def __repr__(self):
        return f"cgroup v{self.version} cpu hierarchy at {self.mount}"

    def base(self) -> str:
        """The directory under which the cluster's parent cgroup is made.

        v1: the caller's own cgroup (any cgroup can hold both processes and children).
        v2: processes may not sit in a cgroup whose children get controllers ("no internal
        processes"), so the nearest ancestor of the caller's cgroup that already delegates
        ``cpu`` to its children (the mount's root always qualifies once ``cpu`` is enabled).
        """
        if self.version == 1:
            return self.own
        d = os.path.dirname(self.own) if self.own != self.mount else self.mount
        while True:
            try:
                if "cpu" in _read(os.path.join(d, "cgroup.subtree_control")).split():
                    return d
            except OSError:
                pass
            if os.path.normpath(d) == os.path.normpath(self.mount):
                raise CgroupsUnavailable(
                    f"the cgroup v2 hierarchy at {self.mount} does not delegate the cpu "
                    f"controller to child cgroups (no 'cpu' in any cgroup.subtree_control "
                    f"from {self.own} up); enable it with "
                    f"`echo +cpu > {self.mount}/cgroup.subtree_control` as root")
            d = os.path.dirname(d)

    def prepare_parent(self, parent: str, n_groups: int) -> None:
        """Enable ``cpu`` for the parent's children (v2) and weigh the parent like
        ``n_groups`` ordinary processes.

        CFS shares a busy machine among the entities at each level: the parent, holding all
        the cluster's processes, would otherwise get what one process gets, and ``P``
        emulated machines would get the CPU of one where other work competes for it.  With
        this weight each confined process competes like the unconfined process it stands
        for (no more); the quotas still cap each one.
        """
        if self.version == 1:
            _write(os.path.join(parent, "cpu.shares"), str(min(262_144, 1024 * n_groups)))
        else:
            _write(os.path.join(parent, "cgroup.subtree_control"), "+cpu")
            _write(os.path.join(parent, "cpu.weight"), str(min(10_000, 100 * n_groups)))

    def set_cpu(self, path: str, cores: float | None) -> None:
        if cores is None:
            return
        period = _period_us(cores)
        quota = max(_MIN_QUOTA_US, int(round(cores * period)))
        if self.version == 1:
            _write(os.path.join(path, "cpu.cfs_period_us"), str(period))
            _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))
        else:
            _write(os.path.join(path, "cpu.max"), f"{quota} {period}")

    def procs(self, path: str) -> list[int]:
        try:
            return [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]
        except OSError:
            return []

    def add(self, path: str, pid: int) -> None:
        _write(os.path.join(path, "cgroup.procs"), str(pid))

    def quota_cores(self, path: str) -> float | None:
        """The CPU limit of ``path`` and its ancestors in cores, ``None`` if unlimited."""
        limit = None
        d = path
        while True:
            try:
                if self.version == 1:
                    q = int(_read(os.path.join(d, "cpu.cfs_quota_us")))
                    p = int(_read(os.path.join(d, "cpu.cfs_period_us")))
                    cores = q / p if q > 0 else None
                else:
                    q, p = _read(os.path.join(d, "cpu.max")).split()
                    cores = None if q == "max" else int(q) / int(p)
            except (OSError, ValueError):
                cores = None
            if cores is not None:
                limit = cores if limit is None else min(limit, cores)
            if os.path.normpath(d) == os.path.normpath(self.mount) or d in ("/", ""):
                return limit
            d = os.path.dirname(d)


def _find_hierarchy(mounts: str | None = None, self_cgroup: str | None = None) -> _Hierarchy:
    """The hierarchy holding the ``cpu`` controller, from ``/proc/mounts`` and
    ``/proc/self/cgroup`` (passed as text in tests).  A v1 ``cpu`` mount wins over a v2
    hierarchy (hybrid machines mount v2 without controllers)."""
    if not sys.platform.startswith("linux"):
        raise CgroupsUnavailable(f"EmulatedCluster needs Linux cgroups; this is {sys.platform}")
    try:
        mounts = _read("/proc/mounts") if mounts is None else mounts
        self_cgroup = _read("/proc/self/cgroup") if self_cgroup is None else self_cgroup
    except OSError as e:
        raise CgroupsUnavailable(f"cannot read the cgroup mounts: {e}") from e
    own_v1, own_v2 = {}, None
    for line in self_cgroup.splitlines():
        num, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if num == "0" and controllers == "":
            own_v2 = path
        for c in controllers.split(","):
            own_v1[c] = path
    v2 = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mount, fstype, options = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup" and "cpu" in options:
            return _Hierarchy(1, mount, _own_dir(mount, own_v1.get("cpu", "/")))
        if fstype == "cgroup2" and v2 is None:
            v2 = mount
    if v2 is not None:
        try:
            controllers = _read(os.path.join(v2, "cgroup.controllers")).split()
        except OSError:
            controllers = []
        if "cpu" in controllers:
            return _Hierarchy(2, v2, _own_dir(v2, own_v2 or "/"))
        raise CgroupsUnavailable(
            f"no cpu cgroup controller: no cgroup v1 'cpu' mount and the cgroup v2 "
            f"hierarchy at {v2} offers only {controllers or 'no controllers'}")
    raise CgroupsUnavailable("no cgroup hierarchy with the cpu controller is mounted "
                             "(looked for a cgroup v1 'cpu' mount and a cgroup2 mount)")


def _own_dir(mount: str, path: str) -> str:
    d = os.path.join(mount, path.lstrip("/"))
    # inside a container the recorded path is the host's; the mount is already our subtree
    return d if os.path.isdir(d) else mount


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_all(hier: _Hierarchy, groups, timeout: float = 10.0) -> list[int]:
    """SIGKILL every process in ``groups`` until they are empty; returns any survivors."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for g in groups for p in hier.procs(g)]
        if not left:
            return []
        if time.monotonic() > deadline:
            return left
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _rmdir_tree(parent: str, timeout: float = 5.0) -> None:
    """Remove a cgroup directory and its child cgroups (cgroupfs: ``rmdir`` only; a cgroup
    just emptied can answer EBUSY for a moment)."""
    deadline = time.monotonic() + timeout
    children = [os.path.join(parent, c) for c in sorted(os.listdir(parent))
                if os.path.isdir(os.path.join(parent, c))] if os.path.isdir(parent) else []
    for d in children + [parent]:
        while os.path.isdir(d):
            try:
                os.rmdir(d)
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def remove_stale_cgroups(hierarchy: _Hierarchy | None = None) -> list[str]:
    """Remove the cgroups (and kill their processes) of emulated clusters whose driver process
    no longer exists, e.g. one SIGKILLed inside its ``with`` block.

    Returns the cgroup directories removed.  Clusters of live processes are left alone.
    Their temporary folders (logs, the workers' local directories) are removed too.
    """
    _remove_stale_folders()
    hier = hierarchy or _find_hierarchy()
    try:
        base = hier.base()
        names = os.listdir(base)
    except (OSError, CgroupsUnavailable):
        return []
    removed = []
    for name in names:
        owner = _owner(name)
        if owner is None or _pid_alive(owner):
            continue
        parent = os.path.join(base, name)
        try:
            groups = [os.path.join(parent, c) for c in os.listdir(parent)
                      if os.path.isdir(os.path.join(parent, c))]
            _kill_all(hier, groups)
            _rmdir_tree(parent)
            removed.append(parent)
        except OSError:
            pass
    return removed


def _owner(name: str) -> int | None:
    try:
        return int(name[len(_PREFIX):].split("-")[0]) if name.startswith(_PREFIX) else None
    except ValueError:
        return None


def _remove_stale_folders() -> None:
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        owner = _owner(name)
        if owner is not None and not _pid_alive(owner):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


def emulation_unavailable() -> str | None:
    """Why an :class:`EmulatedCluster` cannot start here, or ``None`` if it can.

    Probes by creating (and removing) a CPU cgroup with a quota, the one thing the cluster
    needs besides Dask itself.
    """
    try:
        hier = _find_hierarchy()
        base = hier.base()
    except CgroupsUnavailable as e:
        return str(e)
    probe = os.path.join(base, f"{_PREFIX}{os.getpid()}-probe-{threading.get_ident()}")
    try:
        os.mkdir(probe)
    except OSError as e:
        return _permission_message(probe, e)
    try:
        hier.set_cpu(probe, 0.1)
    except OSError as e:
        return _permission_message(probe, e)
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass
    return None


def _permission_message(path: str, e: OSError) -> str:
    who = "" if os.geteuid() == 0 else " (this process is not root)"
    return f"cannot write the cgroup {path}: {e.strerror}{who}"


# --------------------------------------------------------------------------- processes

# Runs first in every child, confined already (the shell put its own pid into the cgroup
# before exec'ing Python): asks for SIGTERM if the driver dies, then becomes the Dask CLI.
_CHILD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the driver exited before this process started')\n"
    "sys.argv = ['dask'] + sys.argv[2:]\n"
    "from dask.__main__ import main\n"
    "sys.exit(main())\n"
)
# `echo $$` is the shell's pid, which exec keeps: the process is in its cgroup before it
# runs any Python, so no start-up CPU escapes the quota.
_SHELL = 'echo $$ > "$0" && exec "$@"'

_LIVE: "weakref.WeakSet[EmulatedCluster]" = weakref.WeakSet()


@atexit.register
def _close_live_clusters():
    for cluster in list(_LIVE):
        cluster._close(report=False)


def _format_cores(n_workers, cpu, driver_cpu, scheduler_cpu) -> str:
    parts = [f"{n_workers} workers x {cpu:g}"]
    if driver_cpu is not None:
        parts.append(f"driver {driver_cpu:g}")
    if scheduler_cpu is not None:
        parts.append(f"scheduler {scheduler_cpu:g}")
    return " + ".join(parts)


def _driver_path() -> list[str]:
    """The driver's import path for the children, as LocalCluster's spawned workers get it:
    the scheduler and the workers unpickle functions of dmp and of the driver's modules."""
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]   # above dmp/
    prefixes = tuple(os.path.abspath(p) + os.sep for p in {sys.prefix, sys.base_prefix})
    for p in sys.path + os.environ.get("PYTHONPATH", "").split(os.pathsep):
        p = os.path.abspath(p) if p else os.getcwd()
        if os.path.isdir(p) and not p.startswith(prefixes) and p not in paths:
            paths.append(p)
    return paths


def spin(seconds: float) -> tuple[float, float]:
    """Busy-loop for ``seconds`` of wall time; returns (this process's CPU seconds, wall
    seconds) over the loop."""
    w0, c0 = time.monotonic(), time.process_time()
    while time.monotonic() - w0 < seconds:
        pass
    return time.process_time() - c0, time.monotonic() - w0


def _machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class EmulatedCluster:
    """A Dask cluster of CPU-confined worker processes emulating ``n_workers`` machines.

    Starts ``dask scheduler`` and ``n_workers`` ``dask worker --nthreads 1 --name w<k>``
    processes on 127.0.0.1 (random free ports), each in its own CPU cgroup with a quota of
    ``cpu`` cores, and moves the calling process (the driver) into a cgroup of
    ``driver_cpu`` cores while the cluster is open.  A worker then behaves like a one-core
    machine slowed to ``cpu`` of a core, so the speed-up of ``P`` workers can be measured on
    a machine with fewer than ``P`` cores.  The network is loopback: relatively faster than
    a real one.

    Use it as a context manager; on exit (also on an exception, Ctrl-C or a failed start)
    every process it started is killed, the driver is moved back to its original cgroup and
    every cgroup it made is removed.

    Parameters
    ----------
    n_workers : int
        Number of worker processes (emulated machines).
    cpu : float, default 0.25
        Cores per worker: the CFS quota of each worker's cgroup is ``cpu`` x 10 ms per
        10 ms period.
    memory_limit : str or int or None, default "1GiB"
        Passed to ``dask worker --memory-limit``: Dask's own memory management (spilling,
        pausing, and the nanny restarting a worker past 95 %).  ``None`` for no limit.
        No memory cgroup is used (a kernel OOM kill would bypass Dask's management, and a
        cgroup of our own would move the workers out of the caller's memory cgroup).
    driver_cpu : float or None, default 0.25
        Cores of the calling process while the cluster is open; ``None`` leaves it
        unconfined.
    scheduler_cpu : float or None, default 0.25
        Cores of the scheduler process; ``None`` leaves it unconfined.
    nanny : bool, default True
        Start each worker under a nanny (in the worker's cgroup) that restarts it, under the
        same name, when it dies, as a LocalCluster does.  With ``False`` a killed worker
        just leaves the cluster.
    dashboard : bool, default False
        Serve the scheduler's dashboard (and with it dmp's live monitor page) on a random
        port of 127.0.0.1.
    dask_config : dict or None, default None
        Dask settings for the scheduler and the workers, over the driver's (which they
        inherit, ``dask.config.set`` included).  ``None`` is dmp's
        ``QUIET_DASK_CONFIG`` (event-loop tick every 200 ms, system monitor every 5 s, no
        profiler): with Dask's defaults an idle worker and its nanny take a noticeable share
        of a small emulated machine (BENCHMARKS.md, "Dask round costs").  ``{}`` keeps the
        driver's settings.
    timeout : float, default 120
        Seconds to wait for the scheduler and all workers to start.

    Attributes
    ----------
    client : distributed.Client
        A client of the cluster, usable as any estimator's ``backend=``.
    scheduler_address : str
        The scheduler's ``tcp://127.0.0.1:<port>`` address.
    cgroups : dict of str to str
        The cgroup directory of each role: ``"scheduler"``, ``"driver"``, ``"w0"``, ...
    hierarchy : object
        The cgroup hierarchy used (``.version`` is 1 or 2, ``.mount`` its mount point).

    Raises
    ------
    ValueError
        If the cores asked for (``n_workers * cpu + driver_cpu + scheduler_cpu``) exceed the
        machine's: the emulation would then be slower than asked.
    CgroupsUnavailable
        If CPU cgroups cannot be written here (not Linux, not root, no ``cpu`` controller).
    TimeoutError, RuntimeError
        If the scheduler or a worker does not start; the message ends with its log.

    Notes
    -----
    Needs Linux, root (or a delegated cgroup) and the cgroup ``cpu`` controller: cgroup v1
    (``cpu.cfs_quota_us``) or v2 (``cpu.max``, with ``cpu`` enabled in the parent's
    ``cgroup.subtree_control``).  The cgroups live under one parent,
    ``<cpu hierarchy>/<caller's cgroup>/dmp-emulated-<pid>-<n>``; :func:`remove_stale_cgroups`
    (also run on every start) removes those of a driver that was killed.  Children get
    ``SIGTERM`` when the thread that started them exits, so enter and leave the cluster
    from one thread.

    Examples
    --------
    >>> from dmp.linear_model import Lasso
    >>> with EmulatedCluster(n_workers=4, cpu=0.2) as cluster:   # doctest: +SKIP
    ...     est = Lasso(alpha=0.1, backend=cluster.client, n_workers=4).fit(X, y)
    """

    _counter = 0
    _counter_lock = threading.Lock()

    def __init__(self, n_workers: int, cpu: float = 0.25, memory_limit="1GiB",
                 driver_cpu: float | None = 0.25, scheduler_cpu: float | None = 0.25, *,
                 nanny: bool = True, dashboard: bool = False, dask_config: dict | None = None,
                 timeout: float = 120.0):
        if (isinstance(n_workers, bool) or not isinstance(n_workers, numbers.Integral)
                or n_workers < 1):
            raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
        for name, value, optional in (("cpu", cpu, False), ("driver_cpu", driver_cpu, True),
                                      ("scheduler_cpu", scheduler_cpu, True)):
            if value is None and optional:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of cores, got {value!r}")
        if memory_limit is not None:
            from dask.utils import parse_bytes

            try:
                parse_bytes(memory_limit)
            except (TypeError, ValueError) as e:
                raise ValueError(f"memory_limit must be a size such as '1GiB' or a number "
                                 f"of bytes, got {memory_limit!r}") from e
        self.n_workers = int(n_workers)
        self.cpu = float(cpu)
        self.memory_limit = memory_limit
        self.driver_cpu = driver_cpu
        self.scheduler_cpu = scheduler_cpu
        self.nanny = nanny
        self.dashboard = dashboard
        if dask_config is None:
            from .utils.cluster import QUIET_DASK_CONFIG

            dask_config = QUIET_DASK_CONFIG
        self.dask_config = dict(dask_config)
        self.timeout = timeout
        self.client = None
        self.scheduler_address = None
        self.cgroups: dict[str, str] = {}
        self.hierarchy = None
        self._parent = None
        self._driver_home = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._tmp = None
        self._check_cores()

    # ---- sizing

    def cores_asked(self) -> float:
        """Cores the cluster confines its processes to, all roles together."""
        return (self.n_workers * self.cpu + (self.driver_cpu or 0.0)
                + (self.scheduler_cpu or 0.0))

    def _check_cores(self, limit: float | None = None) -> None:
        machine = _machine_cores()
        have, what = machine, f"this machine has {machine} cores"
        if limit is not None and limit < machine:
            have, what = limit, f"this process's cgroup is limited to {limit:g} cores"
        asked = self.cores_asked()
        if asked > have + 1e-9:
            raise ValueError(
                f"EmulatedCluster asks for {asked:g} cores "
                f"({_format_cores(self.n_workers, self.cpu, self.driver_cpu, self.scheduler_cpu)})"
                f" but {what}: the emulated machines would be slower than asked. Use fewer "
                f"workers or smaller cpu, driver_cpu, scheduler_cpu.")

    # ---- life cycle

    def __enter__(self) -> "EmulatedCluster":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # an exception already on its way out is not masked by a cleanup problem
        self._close(report=exc_type is None)

    def start(self) -> "EmulatedCluster":
        """Create the cgroups, start the scheduler and the workers, confine the driver."""
        if self._parent is not None:
            raise RuntimeError("this EmulatedCluster is already started")
        try:
            self._start()
        except BaseException:
            self._close(report=False)
            raise
        return self

    def _start(self) -> None:
        from distributed import Client

        hier = self.hierarchy = _find_hierarchy()
        base = hier.base()
        self._check_cores(hier.quota_cores(base))
        remove_stale_cgroups(hier)
        with EmulatedCluster._counter_lock:
            EmulatedCluster._counter += 1
            n = EmulatedCluster._counter
        parent = os.path.join(base, f"{_PREFIX}{os.getpid()}-{n}")
        try:
            os.mkdir(parent)
        except OSError as e:
            raise CgroupsUnavailable(_permission_message(parent, e)) from e
        self._parent = parent
        _LIVE.add(self)
        roles = {"scheduler": self.scheduler_cpu}
        if self.driver_cpu is not None:
            roles["driver"] = self.driver_cpu
        roles.update({f"w{k}": self.cpu for k in range(self.n_workers)})
        try:
            hier.prepare_parent(parent, len(roles))
            for role, cores in roles.items():
                path = os.path.join(parent, role)
                os.mkdir(path)
                self.cgroups[role] = path
                hier.set_cpu(path, cores)
        except OSError as e:
            raise CgroupsUnavailable(_permission_message(parent, e)) from e

        import dask.config

        # the driver's Dask settings (dask.config.set included), as a LocalCluster's
        # workers get them from their in-process nannies, and dask_config over them
        with dask.config.set(self.dask_config):
            self._config = dask.config.serialize(dask.config.config)
        self._tmp = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-{n}-")
        scheduler_file = os.path.join(self._tmp, "scheduler.json")
        dash = (["--dashboard-address", "127.0.0.1:0"] if self.dashboard
                else ["--no-dashboard"])
        self._spawn("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", "0",
                                  "--scheduler-file", scheduler_file, *dash])
        deadline = time.monotonic() + self.timeout
        while True:
            self._check_alive("scheduler")
            try:
                with open(scheduler_file) as f:
                    self.scheduler_address = json.load(f)["address"]
                break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the emulated cluster's scheduler did not start within "
                                   f"{self.timeout:g} s{self._log_tail('scheduler')}")
            time.sleep(0.1)

        memory = "0" if self.memory_limit is None else str(self.memory_limit)
        for k in range(self.n_workers):
            role = f"w{k}"
            local = os.path.join(self._tmp, role)
            os.mkdir(local)
            self._spawn(role, [
                "worker", self.scheduler_address, "--host", "127.0.0.1", "--nthreads", "1",
                "--name", role, "--memory-limit", memory, "--local-directory", local,
                "--no-dashboard", "--worker-port", "0", "--death-timeout", "60",
                *(["--nanny", "--nanny-port", "0"] if self.nanny else ["--no-nanny"])])

        self.client = Client(self.scheduler_address, timeout=max(self.timeout, 1),
                             set_as_default=False)
        while True:
            up = {str(w["name"]) for w in
                  self.client.scheduler_info(n_workers=-1)["workers"].values()}
            missing = [f"w{k}" for k in range(self.n_workers) if f"w{k}" not in up]
            if not missing:
                break
            for role in self._procs:
                self._check_alive(role)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {self.n_workers - len(missing)} of {self.n_workers} emulated "
                    f"workers started within {self.timeout:g} s (missing "
                    f"{', '.join(missing)}){self._log_tail(missing[0])}")
            time.sleep(0.1)
        if self.driver_cpu is not None:
            self._driver_home = hier.own
            hier.add(self.cgroups["driver"], os.getpid())

    def _spawn(self, role: str, args: list[str]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(_driver_path())
        env["DASK_INTERNAL_INHERIT_CONFIG"] = self._config
        log = open(os.path.join(self._tmp, f"{role}.log"), "wb")
        try:
            self._procs[role] = subprocess.Popen(
                ["/bin/sh", "-c", _SHELL, os.path.join(self.cgroups[role], "cgroup.procs"),
                 sys.executable, "-c", _CHILD, str(os.getpid()), *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                # Ctrl-C reaches the driver only; close() then tears the cluster down
                start_new_session=True, close_fds=True)
        finally:
            log.close()

    def _check_alive(self, role: str) -> None:
        proc = self._procs[role]
        if proc.poll() is not None:
            raise RuntimeError(f"the emulated cluster's {role} process exited with status "
                               f"{proc.returncode} while starting{self._log_tail(role)}")

    def _log_tail(self, role: str, n_chars: int = 3000) -> str:
        try:
            with open(os.path.join(self._tmp, f"{role}.log"), errors="replace") as f:
                text = f.read()[-n_chars:]
        except (OSError, TypeError):
            return ""
        return f"; its log ends:\n{text}" if text.strip() else ""

    def close(self) -> None:
        """Kill every process of the cluster, move the driver back, remove the cgroups.

        Safe to call more than once; Ctrl-C during it is held until it is done.

        Raises
        ------
        RuntimeError
            If a process or cgroup could not be removed (the message names it).
        """
        self._close(report=True)

    def _close(self, report: bool) -> None:
        if self._parent is None and not self._procs and self._tmp is None:
            return
        interrupted = []
        old = None
        if threading.current_thread() is threading.main_thread():
            old = signal.signal(signal.SIGINT, lambda *a: interrupted.append(a))
        try:
            problems = self._teardown()
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)
        _LIVE.discard(self)
        if interrupted:
            raise KeyboardInterrupt
        if problems and report:
            raise RuntimeError("EmulatedCluster could not clean up: " + "; ".join(problems))

    def _teardown(self) -> list[str]:
        problems = []
        hier = self.hierarchy
        if self._driver_home is not None:
            # with the driver, any process it started while confined (they are its own)
            try:
                for pid in [os.getpid()] + hier.procs(self.cgroups["driver"]):
                    try:
                        hier.add(self._driver_home, pid)
                    except ProcessLookupError:
                        pass
                self._driver_home = None
            except OSError as e:
                problems.append(f"the driver could not move back to {self._driver_home}: {e}")
        if self.client is not None:
            try:
                self.client.close(timeout=5)
            except Exception:  # noqa: BLE001 - the cluster is being killed anyway
                pass
            self.client = None
        for proc in self._procs.values():
            if proc.poll() is None:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
        if hier is not None and self.cgroups:
            survivors = _kill_all(hier, [g for r, g in self.cgroups.items() if r != "driver"])
            if survivors:
                problems.append(f"processes {survivors} survived SIGKILL")
        for proc in self._procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                problems.append(f"process {proc.pid} did not exit")
        self._procs.clear()
        if self._parent is not None:
            try:
                _rmdir_tree(self._parent)
                self._parent = None
                self.cgroups = {}
            except OSError as e:
                problems.append(f"cannot remove the cgroup {self._parent}: {e}")
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        return problems

    def cpu_share(self, worker: str = "w0", seconds: float = 2.0) -> float:
        """Spin on one worker for ``seconds`` of wall time and return the CPU seconds its
        process got per wall second: at most ``cpu`` (less on a busy machine).

        Parameters
        ----------
        worker : str, default "w0"
            The worker's name.
        seconds : float, default 2.0
            Wall time to spin.
        """
        if self.client is None:
            raise RuntimeError("the EmulatedCluster is not started")
        names = {str(w["name"]): addr for addr, w in
                 self.client.scheduler_info(n_workers=-1)["workers"].items()}
        if worker not in names:
            raise ValueError(f"no worker named {worker!r}; the cluster has {sorted(names)}")
        cpu, wall = self.client.submit(spin, seconds, workers=[names[worker]],
                                       pure=False).result()
        return cpu / wall

    def __repr__(self):
        state = self.scheduler_address or "not started"
        return (f"EmulatedCluster(n_workers={self.n_workers}, cpu={self.cpu:g}, "
                f"driver_cpu={self.driver_cpu}, scheduler_cpu={self.scheduler_cpu}: {state})")
