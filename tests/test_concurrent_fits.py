"""Two fits at once on one cluster do not cross-talk: two threads sharing one client, and two
client processes of their own.  Each fit's result equals the same fit run alone on the same
cluster (actors of the two fits kept apart, ParMAC's and LDA's ring messages delivered to
their own fit), and the monitor's JSON route lists the two fits separately, each with its
own rounds."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import make_corpus, make_ratings

pytestmark = [pytest.mark.dask, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- the models
def _ratings(seed=0, n_users=400, n_items=150, nnz=8000):
    return make_ratings(n_users, n_items, nnz, rank=4, seed=seed)


def _corpus(seed=4, n_docs=150, n_words=200, n_topics=4, doc_len=40):
    return make_corpus(n_docs, n_words, n_topics=n_topics, doc_len=doc_len, seed=seed)


def _lasso_data(seed=2):
    from conftest import make_problem

    return make_problem(n=150, p=800, density=0.04, seed=seed)


def model(name: str, seed: int, backend):
    """(estimator, fit args, result arrays) of a small fit of kind ``name``; ``seed`` picks
    the data and the random state, so two seeds give two different fits."""
    from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
    from dmp.hashing import BinaryAutoencoder
    from dmp.linear_model import Lasso, SparsifiedSGDRegressor

    kw = dict(backend=backend, n_workers=2, random_state=seed)
    if name == "ba":
        from sklearn.datasets import load_digits

        X = load_digits().data[100 * seed:100 * seed + 500]
        return (BinaryAutoencoder(8, max_iter=3, validation_size=50, **kw), (X,),
                lambda e: (e.coef_, e.decoder_coef_))
    if name == "mf-ccd":
        return (MatrixFactorization(n_components=4, max_iter=4, tol=0, method="ccd",
                                    block_size=2, **kw), (_ratings(seed),),
                lambda e: (np.asarray(e.user_factors_), np.asarray(e.item_factors_)))
    if name == "mf-ccd++":
        return (MatrixFactorization(n_components=4, max_iter=4, tol=0, **kw),
                (_ratings(seed),),
                lambda e: (np.asarray(e.user_factors_), np.asarray(e.item_factors_)))
    if name == "lda":
        return (LatentDirichletAllocation(4, max_iter=8, **kw), (_corpus(seed),),
                lambda e: (e.topic_word_counts_,))
    if name == "lasso":
        from conftest import alpha_max

        X, y = _lasso_data(seed)
        return (Lasso(alpha=0.1 * alpha_max(X, y), tol=1e-8, schedule="round_robin",
                      schedule_size=100, **kw), (X, y), lambda e: (e.coef_,))
    if name == "sparsified":
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((600, 20))
        b = A @ rng.standard_normal(20)
        return (SparsifiedSGDRegressor(max_iter=80, tol=None, **kw), (A, b),
                lambda e: (e.coef_,))
    raise ValueError(name)


def fit(name, seed, backend):
    est, args, result = model(name, seed, backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.time()
        est.fit(*args)
    return est, result(est), (t0, time.time())


def _assert_same(got, alone, what):
    for g, a in zip(got, alone):
        np.testing.assert_array_equal(g, a, err_msg=what)


# --------------------------------------------------------------------- the monitor's view
def _monitor_fits(client) -> dict:
    from dmp.monitor import JSON_PATH

    base = client.dashboard_link.rsplit("/status", 1)[0]
    with urllib.request.urlopen(base + JSON_PATH, timeout=10) as resp:
        return {f["fit"]: f for f in json.loads(resp.read().decode())["fits"]}


#: per-round timings: the only values of a round that differ from one run to another
_TIMINGS = {"time", "round_s", "push_s", "idle_s", "ring_s"}


def _same_rounds(rounds: list, hist: dict) -> bool:
    """The monitor's rounds are the fit's per-round history (timings aside; JSON has no NaN:
    None)."""
    if len(rounds) != len(hist["round"]):
        return False
    for key, values in hist.items():
        if key in _TIMINGS or np.asarray(values).ndim != 1:
            continue
        jkey = "round_kind" if key == "kind" else key
        for rec, v in zip(rounds, np.asarray(values).tolist()):
            got = rec.get(jkey)
            if isinstance(v, float) and not np.isfinite(v):
                if got is not None:
                    return False
            elif got != v:
                return False
    return True


def _assert_monitor_lists_each_fit_apart(client, before: set, fits: list, timeout=10):
    """The fits started since ``before`` are exactly ``fits`` (estimators), one record
    each, whose rounds are that fit's ``history_`` and nothing of the other's."""
    deadline = time.monotonic() + timeout
    while True:
        now = _monitor_fits(client)
        new = {k: f for k, f in now.items() if k not in before}
        if (len(new) == len(fits) and all(f["status"] != "running" for f in new.values())
                or time.monotonic() > deadline):
            break
        time.sleep(0.2)
    assert len(new) == len(fits), sorted(new)
    unmatched = dict(new)
    for est in fits:
        hist = getattr(est, type(est)._rounds_attribute)   # ParMAC: its engine rounds
        match = [k for k, f in unmatched.items()
                 if f["estimator"] == type(est).__name__ and _same_rounds(f["rounds"], hist)]
        assert len(match) == 1, (type(est).__name__, sorted(unmatched))
        rec = unmatched.pop(match[0])
        assert rec["n_rounds"] == len(hist["round"]) and rec["status"] != "running"
        assert rec["params"]["random_state"] == est.random_state


# ------------------------------------------------------------------------------- threads
PAIRS = [("ba", "ba"), ("mf-ccd", "lda"), ("lasso", "sparsified"), ("mf-ccd++", "mf-ccd++")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pair", PAIRS, ids=["+".join(p) for p in PAIRS])
def test_two_threads_one_client(dask_client, pair):
    jobs = [(name, seed) for seed, name in enumerate(pair)]
    alone = [fit(name, seed, dask_client)[1] for name, seed in jobs]
    before = set(_monitor_fits(dask_client))
    start = threading.Barrier(len(jobs))
    out, errors = [None] * len(jobs), []

    def run(k):
        try:
            start.wait(30)
            out[k] = fit(*jobs[k], dask_client)
        except BaseException as exc:   # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a concurrent fit hangs"
    if errors:
        raise errors[0]
    (s0, e0), (s1, e1) = out[0][2], out[1][2]
    assert max(s0, s1) < min(e0, e1), "the two fits did not overlap"
    for (name, seed), (_, got, _), ref in zip(jobs, out, alone):
        _assert_same(got, ref, f"{name} (seed {seed}) run beside another fit")
    _assert_monitor_lists_each_fit_apart(dask_client, before, [o[0] for o in out])


# ----------------------------------------------------------------------------- processes
_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {here!r})
    import numpy as np
    from distributed import Client
    import test_concurrent_fits as m

    address, name, seed, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    with Client(address) as client:
        m.model(name, seed, client)          # data built before the start signal
        (folder / f"ready-{{seed}}").touch()
        deadline = time.monotonic() + 120
        while not (folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        est, result, (t0, t1) = m.fit(name, seed, client)
    arrays = {{f"r{{i}}": r for i, r in enumerate(result)}}
    np.savez(folder / f"out-{{seed}}.npz", t=np.array([t0, t1]),
             rounds=len(est.round_history_["round"]), **arrays)
""")


@pytest.mark.timeout(300)
def test_two_client_processes(dask_client, tmp_path):
    """Two driver processes, each with its own client, fit the same kind of ring model
    (ParMAC: submodels sent worker to worker) at once."""
    jobs = [("ba", 0), ("ba", 1)]
    alone = [fit(name, seed, dask_client)[1] for name, seed in jobs]
    before = set(_monitor_fits(dask_client))
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(here=str(HERE)))
    address = dask_client.scheduler.address
    procs = [subprocess.Popen([sys.executable, str(script), address, name, str(seed),
                               str(tmp_path)], env=os.environ.copy(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, seed in jobs]
    try:
        deadline = time.monotonic() + 120
        while (not all((tmp_path / f"ready-{s}").exists() for _, s in jobs)
               and time.monotonic() < deadline and all(p.poll() is None for p in procs)):
            time.sleep(0.05)
        (tmp_path / "go").touch()
        logs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    outs = [np.load(tmp_path / f"out-{s}.npz") for _, s in jobs]
    (s0, e0), (s1, e1) = outs[0]["t"], outs[1]["t"]
    assert max(s0, s1) < min(e0, e1), "the two fits did not overlap"
    for (name, seed), o, ref in zip(jobs, outs, alone):
        _assert_same([o[f"r{i}"] for i in range(len(ref))], ref,
                     f"{name} (seed {seed}) in a second client process")
    now = _monitor_fits(dask_client)
    new = [f for k, f in now.items() if k not in before]
    assert len(new) == 2 and all(f["estimator"] == "BinaryAutoencoder" for f in new)
    assert sorted(f["params"]["random_state"] for f in new) == [0, 1]
    for f in new:
        o = outs[f["params"]["random_state"]]
        assert f["n_rounds"] == int(o["rounds"]) and f["status"] != "running"
        assert [r["round"] for r in f["rounds"]] == list(range(int(o["rounds"])))
