"""Soak: repeated fits with random worker kills, compared with undisturbed results.

    python benchmarks/soak.py                   # 30 minutes
    python benchmarks/soak.py --minutes 2       # a quick look

On one 3-worker `distributed.LocalCluster` (nannies restart killed workers under the same
name), the script fits, round after round of its time budget, one of: MatrixFactorization
CCD++, MatrixFactorization CCD, SparsifiedSGDRegressor (ISEGA), Lasso and
LatentDirichletAllocation (word blocks travelling worker to worker), each with checkpoints.
In most fits (probability ``--kill-prob``) a randomly chosen worker is SIGKILLed at a random
round plus a random 0-50 ms delay, sometimes twice. Every result is compared with
the same model fitted undisturbed on the local backend (same partitions): factors and
coefficients to rtol 1e-7 (Lasso: atol 1e-6, its duality-gap stop may move inside ``tol``
after a recovery), objective to 1e-9 (Lasso 1e-8; LDA's topic-word counts and
log-likelihood exactly). It reports fits completed, kills,
recoveries, divergences (expected: none), failures and hangs (a fit over 120 s), and writes
``benchmarks/results/soak.json``. ``tests/test_soak.py`` runs a version of about a minute.

    python benchmarks/soak.py --leak            # 200 small fits, no kills: memory and fds

``--leak`` instead fits ``--fits`` (200) tiny models in a row (Lasso, MatrixFactorization
CCD++ and CCD, LatentDirichletAllocation, SparsifiedSGDRegressor, BinaryAutoencoder, in
turn) on one 2-worker cluster, with no kills, and reads every worker's and the scheduler's
resident memory (``VmRSS`` of ``/proc/self/status``, after a ``gc.collect()``) and open file
descriptors (``/proc/self/fd``) after a warm-up of ``--warmup`` (20) fits and every 20 fits
after it. Writes ``benchmarks/results/soak-leak.json``; ``tests/test_soak.py`` asserts the
growth after the warm-up is bounded.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import random
import signal
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

FIT_TIMEOUT_S = 120


def _problems(seed=0):
    from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
    from dmp.linear_model import Lasso, SparsifiedSGDRegressor

    rng = np.random.default_rng(seed)
    n_users, n_items, nnz = 2000, 500, 50_000
    flat = rng.choice(n_users * n_items, nnz, replace=False)
    U, V = rng.standard_normal((n_users, 4)), rng.standard_normal((n_items, 4))
    u, i = flat // n_items, flat % n_items
    R = sp.coo_matrix((np.einsum("ij,ij->i", U[u], V[i]) + 0.3 * rng.standard_normal(nnz),
                       (u, i)), shape=(n_users, n_items))
    A = rng.standard_normal((4000, 30))
    b = A @ rng.standard_normal(30) + 0.1 * rng.standard_normal(4000)
    X = sp.random(300, 1500, density=0.03, random_state=seed, format="csc")
    beta = np.zeros(1500)
    beta[:15] = rng.standard_normal(15)
    y = X @ beta + 0.01 * rng.standard_normal(300)
    amax = float(np.abs(X.T @ (y - y.mean())).max()) / 300
    phi = rng.dirichlet(np.full(400, 0.05), 6)
    theta = rng.dirichlet(np.full(6, 0.2), 300)
    C = sp.csr_matrix(np.array([np.bincount(rng.choice(400, 50, p=theta[d] @ phi),
                                            minlength=400) for d in range(300)], dtype=float))
    return {
        "lda": (lambda **kw: LatentDirichletAllocation(6, max_iter=15, random_state=0, **kw),
                (C,), 2, lambda e: e.topic_word_counts_.astype(float), (0, 0, 0)),
        "mf-ccd++": (lambda **kw: MatrixFactorization(n_components=6, max_iter=8, tol=0,
                                                      random_state=0, **kw), (R,), 2,
                     lambda e: np.asarray(e.user_factors_), (1e-7, 1e-9, 1e-9)),
        "mf-ccd": (lambda **kw: MatrixFactorization(n_components=6, max_iter=5, tol=0,
                                                    method="ccd", block_size=2,
                                                    random_state=0, **kw), (R,), 1,
                   lambda e: np.asarray(e.item_factors_), (1e-7, 1e-9, 1e-9)),
        "sparsified-isega": (lambda **kw: SparsifiedSGDRegressor(max_iter=200, tol=None,
                                                                 random_state=0, **kw),
                             (A, b), 40, lambda e: e.coef_, (1e-7, 1e-9, 1e-9)),
        "lasso": (lambda **kw: Lasso(alpha=0.05 * amax, tol=1e-8, random_state=0, **kw),
                  (X, y), 5, lambda e: e.coef_, (1e-7, 1e-6, 1e-8)),
    }


def _metric(est) -> float:
    """The final objective (LDA: its log-likelihood)."""
    return est.objective_ if hasattr(est, "objective_") else est.log_likelihood_


def _kill_random_worker(client, rng):
    pids = client.run(os.getpid)
    if len(pids) < 2:
        return False
    os.kill(pids[rng.choice(sorted(pids))], signal.SIGKILL)
    return True


def _wait_for_workers(client, n, timeout=60):
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info()["workers"]) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    return len(client.scheduler_info()["workers"]) >= n


def run_soak(client, seconds: float, *, seed: int = 0, kill_prob: float = 0.8,
             workdir=None, log=print, min_fits: int = 0) -> dict:
    """Fit and kill for ``seconds`` (and at least ``min_fits`` fits); returns the counts
    (see the module docstring)."""
    import tempfile

    rng = random.Random(seed)
    problems = _problems(seed)
    references = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (make, args, every, result, _) in problems.items():
            # the fits' checkpoint_every (those rounds start drained)
            ref = make(backend="local", n_workers=3, checkpoint_every=every).fit(*args)
            references[name] = (result(ref), _metric(ref), len(ref.history_["round"]))
    stats = {"fits": 0, "kills": 0, "recoveries": 0, "divergences": [], "failures": [],
             "by_model": {n: 0 for n in problems}}
    workdir = Path(workdir or tempfile.mkdtemp(prefix="dmp-soak-"))
    t_end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < t_end or n < min_fits:
        name = rng.choice(sorted(problems))
        make, args, every, result, (rtol, atol, otol) = problems[name]
        ref_result, ref_obj, ref_rounds = references[name]
        kill_rounds = set()
        if rng.random() < kill_prob:
            kill_rounds.add(rng.randrange(max(ref_rounds // 5, 1), max(ref_rounds * 3 // 5, 2)))
            if rng.random() < 0.25:
                kill_rounds.add(rng.randrange(max(ref_rounds * 3 // 5, 2), max(ref_rounds, 3)))
        fired = set()

        def callback(round, metrics, kill_rounds=kill_rounds, fired=fired):
            if round in kill_rounds and round not in fired:
                fired.add(round)
                threading.Timer(rng.uniform(0.0, 0.05), _kill_random_worker,
                                (client, random.Random(rng.random()))).start()
            return False

        _wait_for_workers(client, 3)
        t0 = time.monotonic()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est = make(backend=client, n_workers=3, checkpoint=str(workdir / f"c{n}.zarr"),
                           checkpoint_every=every, callback=callback).fit(*args)
        except Exception as exc:
            stats["failures"].append(f"{name}: {type(exc).__name__}: {exc}"[:300])
            log(f"  {name}: FAILED {type(exc).__name__}: {exc}")
            n += 1
            continue
        wall = time.monotonic() - t0
        if wall > FIT_TIMEOUT_S:
            stats["failures"].append(f"{name}: took {wall:.0f} s")
        stats["fits"] += 1
        stats["by_model"][name] += 1
        stats["kills"] += len(fired)
        stats["recoveries"] += len(est.recoveries_)
        close = (np.allclose(result(est), ref_result, rtol=rtol, atol=atol)
                 and abs(_metric(est) - ref_obj) <= otol * abs(ref_obj))
        if not close:
            stats["divergences"].append(
                f"{name}: objective {_metric(est)!r} vs {ref_obj!r}, max |diff| "
                f"{float(np.max(np.abs(result(est) - ref_result))):.3g}")
        log(f"  fit {n:4d} {name:17s} kills {len(fired)} recoveries {len(est.recoveries_)} "
            f"{wall:6.1f} s {'ok' if close else 'DIVERGED'}")
        n += 1
    _wait_for_workers(client, 3)
    return stats


def _process_usage(dask_worker=None, dask_scheduler=None) -> dict:
    """Resident memory (bytes) and open file descriptors of the calling process, after a
    collection (what a leak keeps, not garbage not yet collected)."""
    import gc

    gc.collect()
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return {"rss": rss, "fds": len(os.listdir("/proc/self/fd"))}


def cluster_usage(client) -> dict:
    """{process: {"rss", "fds"}} of the scheduler and of every worker (by name)."""
    names = {a: str(w["name"]) for a, w in client.scheduler_info()["workers"].items()}
    out = {f"worker {names.get(a, a)}": u for a, u in client.run(_process_usage).items()}
    out["scheduler"] = client.run_on_scheduler(_process_usage)
    return out


def _tiny_fits(seed=0):
    """Tiny fits of every estimator: (name, make(backend), fit args)."""
    from sklearn.datasets import load_digits

    from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
    from dmp.hashing import BinaryAutoencoder
    from dmp.linear_model import Lasso, SparsifiedSGDRegressor

    rng = np.random.default_rng(seed)
    R = sp.random(120, 60, density=0.2, random_state=seed, format="coo")
    R.data = rng.uniform(1, 5, R.nnz)
    X = sp.random(80, 300, density=0.05, random_state=seed, format="csc")
    y = X @ rng.standard_normal(300) + 0.01 * rng.standard_normal(80)
    A = rng.standard_normal((200, 10))
    b = A @ rng.standard_normal(10)
    C = sp.random(60, 100, density=0.1, random_state=seed, format="csr")
    C.data = rng.integers(1, 5, C.nnz).astype(float)
    D = load_digits().data[:200]
    kw = dict(n_workers=2, random_state=0)
    return [
        ("lasso", lambda b: Lasso(alpha=0.01, max_iter=5, tol=0, backend=b, **kw), (X, y)),
        ("mf-ccd++", lambda b: MatrixFactorization(n_components=3, max_iter=2, tol=0,
                                                   backend=b, **kw), (R,)),
        ("mf-ccd", lambda b: MatrixFactorization(n_components=3, max_iter=2, tol=0,
                                                 method="ccd", backend=b, **kw), (R,)),
        ("lda", lambda b: LatentDirichletAllocation(3, max_iter=2, backend=b, **kw), (C,)),
        ("sparsified", lambda b: SparsifiedSGDRegressor(max_iter=10, tol=None, backend=b,
                                                         **kw), (A, b)),
        ("ba", lambda b: BinaryAutoencoder(4, max_iter=1, validation_size=20, backend=b,
                                           **kw), (D,)),
    ]


def run_leak_check(client, n_fits: int = 200, *, warmup: int = 20, every: int = 20,
                   log=print) -> dict:
    """Fit ``n_fits`` tiny models in a row on ``client`` (the first ``warmup`` of them a
    warm-up); returns the usage of every process after the warm-up (``start``), at the end
    (``end``), every ``every`` fits (``samples``) and the growth from start to end."""
    fits = _tiny_fits()
    samples = []
    start = None
    t0 = time.monotonic()
    for n in range(n_fits):
        name, make, args = fits[n % len(fits)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make(client).fit(*args)
        done = n + 1
        if done == warmup or (done > warmup and (done - warmup) % every == 0) \
                or done == n_fits:
            usage = cluster_usage(client)
            samples.append({"fits": done, "seconds": time.monotonic() - t0, **usage})
            if start is None and done >= warmup:
                start = usage
            log(f"  {done:4d} fits {time.monotonic() - t0:6.1f} s  " + "  ".join(
                f"{p}: {u['rss'] / 2**20:.1f} MiB {u['fds']} fds" for p, u in usage.items()))
    end = samples[-1]
    growth = {p: {"rss_mib": (end[p]["rss"] - u["rss"]) / 2**20,
                  "rss_frac": (end[p]["rss"] - u["rss"]) / u["rss"],
                  "fds": end[p]["fds"] - u["fds"]} for p, u in start.items() if p in end}
    return {"fits": n_fits, "warmup": warmup, "seconds": time.monotonic() - t0,
            "start": start, "end": {p: end[p] for p in start if p in end},
            "growth": growth, "samples": samples}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kill-prob", type=float, default=0.8)
    ap.add_argument("--leak", action="store_true",
                    help="fit --fits tiny models in a row and report memory and fds")
    ap.add_argument("--fits", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    if args.leak:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as cluster, \
                Client(cluster) as client:
            stats = run_leak_check(client, args.fits, warmup=args.warmup)
        stats.update(date=datetime.date.today().isoformat(), cores=os.cpu_count(),
                     loadavg_end=os.getloadavg())
        print(json.dumps(stats["growth"], indent=2))
        path = Path(__file__).parent / "results" / "soak-leak.json"
        path.write_text(json.dumps(stats, indent=2))
        print(f"wrote {path}")
        return

    t0 = time.monotonic()
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        stats = run_soak(client, args.minutes * 60, seed=args.seed, kill_prob=args.kill_prob)
    stats.update(minutes=(time.monotonic() - t0) / 60, date=datetime.date.today().isoformat(),
                 cores=os.cpu_count(), loadavg_end=os.getloadavg())
    print(json.dumps({k: v for k, v in stats.items()}, indent=2))
    path = Path(__file__).parent / "results" / "soak.json"
    path.write_text(json.dumps(stats, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
