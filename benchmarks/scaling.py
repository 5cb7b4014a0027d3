#!/usr/bin/env python
"""Strong scaling of every dmp model on an emulated cluster, beside `dmp.plan`'s prediction.

Run from the repository root as root (CPU cgroups), with the project's environment::

    python benchmarks/scaling.py                      # P = 1, 2, 4, 8 at cpu = 0.2
    python benchmarks/scaling.py --quick              # smaller problems, P = 1, 2, 4
    python benchmarks/scaling.py --size issue --probe-seconds 20   # issue 26's sizes
    python benchmarks/scaling.py --weak               # LDA and MF, P times the work on P
    python benchmarks/scaling.py --models lda100,mf_ccd --repeats 2

Each P gets one `dmp.testing.EmulatedCluster` (P workers of ``--cpu`` cores each; driver and
scheduler ``--cpu`` each: 8 x 0.2 + 0.4 = 2.0 cores, this machine's), on which every model
is fitted on a store written beforehand (so setup is the workers loading their shards). Per
model and P: the round loop (``history_["time"][-1]``), the whole fit (``fit``'s wall time)
and the setup between them (issue 26 part 4: the workers loading their shards), speed-up and
parallel efficiency against P = 1, rounds, bytes per worker per round (all message kinds),
the peak memory of each worker process (the scheduler's samples, every 0.2 s), the CPU share
each worker got while all of them spun at once (at most ``cpu``; less on a busy machine),
and the planner's prediction of the round loop for the same P, the cores the workers got
(the median CPU share; the nominal ``cpu`` too) and the emulation's engine costs (a round of
no work measured at that P; ``pred_line_*``: the a + b P line fitted over all P instead),
which are measured on each cluster with `dmp.planning.NullProgram` (tiny and 1 MiB partials,
ring hops in batches of rounds). The planner probes each model on the in-process backend
before the clusters start, on the worker of a one-worker emulated cluster of the same ``cpu``
(``--probe-on worker``, the default: a CPU-limited process spends more CPU seconds on the same
kernel than an unconfined one), on every worker of each P's own cluster at once before that
P's fits (``--probe-on cluster``: `dmp.plan`'s ``probe_all_workers``, the kernels timed while
all P workers share the machine's cores, caches and memory bus) or in this process
(``--probe-on here``).

``--weak`` measures weak scaling instead: P workers fit a problem P times as large (P times
the documents, users and their ratings, points or rows), and the speed-up is the scaled one,
``P x T(1) / T(P)`` (ideal: P).

Problem sizes (``--size``; ``small``, the default, runs in minutes on a shared 2-core machine;
``issue`` is issue 26's: >= 10M LDA tokens, >= 200k ParMAC points, about 30 minutes):

* ``lasso``: `make_sparse_lasso`, alpha = 0.01 alpha_max, tol 1e-5: n x p at the density
  given (small 5,000 x 50,000 at 2e-3, 500k nonzeros; quick 2,000 x 20,000; issue 20,000 x
  200,000 at 1e-3, 4M nonzeros);
* ``lda100`` / ``lda1000``: `make_lda_corpus` documents of 200 tokens over 10,000 words,
  K = 100 / 1000 (small 10,000 documents, 2M tokens, 5 sweeps; quick 2,000, 3 sweeps; issue
  50,000 documents, 10M tokens, 3 sweeps);
* ``mf_ccd`` / ``mf_ccdpp`` / ``mf_als``: `make_ratings`, rank 200 (small 5,000 x 2,000,
  200k ratings (90% train), CCD 3 / CCD++ 2 iterations; quick 2,000 x 1,000, 50k; issue
  20,000 x 5,000, 2M ratings, 2 / 1 iterations); ``mf_als``: block ALS in float32, CCD's
  iteration count;
* ``parmac``: `BinaryAutoencoder` 32 bits on `make_hashing_mixture` points of 64 dimensions
  (small 10,000, 2 iterations; quick 5,000; issue 200,000, 1 iteration);
* ``sgd``: `SparsifiedSGDRegressor` (ISEGA) on a sparse n x 2,000 design (density 1e-2), 100
  iterations (small n = 5,000; quick 2,000; issue 50,000).

Writes ``benchmarks/results/scaling.json`` (``--out``) and ``scaling.png`` (speed-up against
P, measured and predicted, with the ideal line) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization  # noqa: E402
from dmp.hashing import BinaryAutoencoder  # noqa: E402
from dmp.io import (open_dataset, write_dense, write_ratings, write_sparse,  # noqa: E402
                    write_sparse_rows)
from dmp.io.synthetic import (make_hashing_mixture, make_lda_corpus, make_ratings,  # noqa: E402
                              make_sparse_lasso)
from dmp.linear_model import Lasso, SparsifiedSGDRegressor  # noqa: E402
from dmp.planning import EngineCosts, Network, measure_engine, predict, probe  # noqa: E402
from dmp.testing import EmulatedCluster, cpu_period, emulation_unavailable  # noqa: E402

MODELS = ("lasso", "lda100", "lda1000", "mf_ccd", "mf_ccdpp", "mf_als", "parmac", "sgd")
WEAK_MODELS = ("lda100", "lda1000", "mf_ccd", "mf_ccdpp")


#: problem sizes per preset (``--size``); "issue" is issue 26's (>= 10M LDA tokens, >= 200k
#: ParMAC points), "small" the default that runs in minutes on a shared 2-core machine
SIZES = {
    "quick": {"lasso": (2000, 20000, 2e-3), "lda": (2000, 3), "mf": (2000, 1000, 50_000, 3, 2),
              "parmac": (5000, 2), "sgd": 2000},
    "small": {"lasso": (5000, 50000, 2e-3), "lda": (10000, 5),
              "mf": (5000, 2000, 200_000, 3, 2), "parmac": (10000, 2), "sgd": 5000},
    "issue": {"lasso": (20000, 200000, 1e-3), "lda": (50000, 3),
              "mf": (20000, 5000, 2_000_000, 2, 1), "parmac": (200_000, 1), "sgd": 50000},
}


def build(model: str, folder: Path, size: str, n_shards: int, scale: int = 1):
    """``(estimator, opened store)`` of one model's problem, written under ``folder``;
    ``scale`` multiplies its examples (documents, users with their ratings, points, rows:
    weak scaling)."""
    path = folder / f"{model}-x{scale}.zarr"
    sz = SIZES[size]
    if model == "lasso":
        n, p, density = sz["lasso"]
        n *= scale
        X, y, *_ = make_sparse_lasso(n, p, density, seed=0)
        ds = write_sparse(path, X, y, n_shards=n_shards)
        yt = y - y.mean()
        alpha = 0.01 * float(np.abs(X.T @ yt).max()) / n
        return Lasso(alpha=alpha, tol=1e-5, random_state=0), ds
    if model.startswith("lda"):
        docs, sweeps = sz["lda"]
        docs *= scale
        other = folder / f"lda100-x{scale}.zarr"
        ds = (open_dataset(str(other)) if model == "lda1000" and other.exists()
              else write_sparse_rows(path, make_lda_corpus(docs, 10000, 100, 200, seed=2)[0],
                                     np.zeros(docs), n_shards=n_shards))
        return LatentDirichletAllocation(int(model[3:]), max_iter=sweeps, random_state=0), ds
    if model.startswith("mf"):
        nu, ni, nobs, it_ccd, it_ccdpp = sz["mf"]
        nu, nobs = nu * scale, nobs * scale
        (u, i, r), *_ = make_ratings(nu, ni, nobs, rank=20, seed=3)
        others = [folder / f"{m}-x{scale}.zarr" for m in ("mf_ccd", "mf_ccdpp", "mf_als")]
        other = next((o for o in others if o != path and o.exists()), None)
        ds = (open_dataset(str(other)) if other is not None
              else write_ratings(path, u, i, r, shape=(nu, ni)))
        if model == "mf_als":
            return MatrixFactorization(200, method="als", dtype="float32", max_iter=it_ccd,
                                       random_state=0), ds
        method = "ccd" if model == "mf_ccd" else "ccd++"
        return MatrixFactorization(200, method=method,
                                   max_iter=it_ccd if method == "ccd" else it_ccdpp,
                                   random_state=0), ds
    if model == "parmac":
        n, iters = sz["parmac"]
        X, _ = make_hashing_mixture(n * scale, 64, seed=4)
        ds = write_dense(path, X, n_shards=n_shards)
        return BinaryAutoencoder(32, max_iter=iters, random_state=0), ds
    if model == "sgd":
        n = sz["sgd"] * scale
        rng = np.random.default_rng(0)
        X = sp.random(n, 2000, density=1e-2, format="csr", random_state=0,
                      data_rvs=rng.standard_normal)
        y = np.asarray(X @ rng.standard_normal(2000)).ravel() + rng.standard_normal(n)
        ds = write_sparse_rows(path, X, y, n_shards=n_shards)
        return SparsifiedSGDRegressor(max_iter=100, tol=None, random_state=0), ds
    raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")


def round_history(est) -> dict:
    # the binary autoencoder's history_ is per MAC iteration; its rounds are apart
    return getattr(est, "round_history_", None) or est.history_


class MemoryWatch:
    """The peak memory of each worker while a fit runs (the scheduler's samples)."""

    def __init__(self, client, every: float = 0.2):
        self.client, self.every = client, every
        self.peak: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                for w in self.client.scheduler_info(n_workers=-1)["workers"].values():
                    m = int((w.get("metrics") or {}).get("memory") or 0)
                    self.peak[w["name"]] = max(self.peak.get(w["name"], 0), m)
            except Exception:  # noqa: BLE001 - a sample missed
                pass
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def engine_costs(client, P: int) -> dict:
    """The emulation's round cost with no work: tiny partials, 1 MiB partials, ring
    messages of 8 bytes and of `RING_BIG` bytes (P >= 2)."""
    out = {"null_s": measure_engine(client, rounds=40)["round_s"],
           "big_s": measure_engine(client, rounds=20, partial_bytes=2**20)["round_s"]}
    if P > 1:
        out["ring_s"] = measure_engine(client, rounds=30, ring_bytes=8)["round_s"]
        out["hop_s"] = measure_engine(client, rounds=400, ring_bytes=8, batched=True)["round_s"]
        out["hop_big_s"] = measure_engine(client, rounds=30, ring_bytes=RING_BIG,
                                          batched=True)["round_s"]
    if P > 2:
        # every partition to every other one in each round of a batch (CCD++'s rounds)
        out["fan_s"] = measure_engine(client, rounds=200, ring_bytes=8, batched=True,
                                      fanout=True)["round_s"]
    return out


#: the ring message of the hops that time a ring byte (`engine_costs`)
RING_BIG = 4 * 2**20


def busy_share(client, seconds: float = 1.0) -> float:
    """The CPU share each worker gets while all of them spin at once (at most ``cpu``;
    less when the machine is busy): the cores a compute-bound round really has."""
    from dmp.testing import spin

    addrs = list(client.scheduler_info(n_workers=-1)["workers"])
    futs = [client.submit(spin, seconds, workers=[a], pure=False) for a in addrs]
    return float(np.median([cpu / wall for cpu, wall in client.gather(futs)]))


class _StopAfter:
    """A fit callback that stops the fit after round ``last``."""

    def __init__(self, last: int):
        self.last = last

    def __call__(self, round, record) -> bool:
        return round >= self.last


def warm_workers(est, ds, client, P: int) -> None:
    """A fit cut after its first 2P + 2 rounds, not measured: a fresh cluster's workers pay
    their imports and kernel loads in their first fit (seconds at 0.2 core), which the
    probes pay otherwise."""
    callback = est.callback
    est = est.set_params(backend=client, n_workers=P, callback=_StopAfter(2 * P + 2))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(ds)
    except Exception:   # noqa: BLE001 - a model that cannot finish a fit stopped this early
        pass
    finally:
        est.set_params(callback=callback)


def fit_on(est, ds, client, P: int) -> dict:
    est = est.set_params(backend=client, n_workers=P)
    with MemoryWatch(client) as mem, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        est.fit(ds)
        wall = time.perf_counter() - t0
    h = round_history(est)
    rounds = len(h["round"])
    nbytes = (np.sum(h["bytes_schedule"]) + np.sum(h["bytes_push"]) + np.sum(h["bytes_pull"])
              + np.sum(h["bytes_ring"]))
    # the workers' push time (wall, on the confined workers): what the planner's compute
    # term predicts (`pred_split`), the slowest partition's of each round summed
    push = np.asarray(h["push_s"], dtype=float) if "push_s" in h else None
    pushes = ({"push_max_s": float(push.max(axis=1).sum()),
               "push_mean_s": float(push.mean(axis=1).sum())}
              if push is not None and push.ndim == 2 and push.size else
              {"push_max_s": None, "push_mean_s": None})
    return {"loop_s": float(h["time"][-1]), "fit_s": wall, "rounds": rounds, **pushes,
            "bytes_per_worker_round": float(nbytes / rounds / P),
            "peak_memory_per_worker": int(max(mem.peak.values())) if mem.peak else None}


def calibrated(costs: dict, cpu: float, driver_cpu: float):
    """`EngineCosts` and `Network` of the emulation from the null rounds at every P: the
    fixed cost as a + b P (b: the driver's, per call; a: the workers'), the byte cost from
    the 1 MiB partials (P MiB through the driver a round), the message cost from the ring
    rounds, each further message of a round from the all-to-all ones and a ring byte from
    the hops of `RING_BIG` bytes; in seconds of one core where the planner divides by the
    cores."""
    Ps = np.array(sorted(costs), dtype=float)
    null = np.array([costs[int(P)]["null_s"] for P in Ps])
    b, a = np.polyfit(Ps, null, 1) if len(Ps) > 1 else (0.0, null[0])
    b, a = max(b, 0.0), max(a, 0.0)
    per_byte = np.median([max(costs[int(P)]["big_s"] - costs[int(P)]["null_s"], 1e-9)
                          / (P * 2**20) for P in Ps])
    # a ring hop inside a batch of rounds (the rounds of a batch are a chain of hops)
    hops = [costs[int(P)]["hop_s"] for P in Ps if P > 1]
    message = float(np.median(hops)) if hops else 0.0
    # each further message of an all-to-all round: (fan-out round - hop) / (P - 2)
    fans = [max(costs[int(P)]["fan_s"] - costs[int(P)]["hop_s"], 0.0) / (P - 2)
            for P in Ps if P > 2 and "fan_s" in costs[int(P)]]
    fan = float(np.median(fans)) if fans else message
    # a ring byte: what a hop of RING_BIG bytes adds to one of 8
    bigs = [max(costs[int(P)]["hop_big_s"] - costs[int(P)]["hop_s"], 0.0) / RING_BIG
            for P in Ps if "hop_big_s" in costs[int(P)]]
    ring_byte = float(np.median(bigs)) if bigs else 0.0
    eng = EngineCosts(call_s=b * driver_cpu, worker_call_s=a * cpu, message_s=message * cpu,
                      round_s=0.0, fanout_message_s=fan * cpu, ring_byte_s=ring_byte * cpu)
    return eng, Network(bandwidth=1.0 / per_byte, latency=0.0)


def say_probe(model: str, P: int, pr) -> None:
    print(f"probe {model} P={P}: {pr.probed_rounds} rounds in {pr.probe_s:.1f} s "
          f"({pr.rounds_source}, {pr.where})", flush=True)


def run_probes(problems, models, Ps, scales, args) -> dict:
    """The planner's probes of every model at every P: on a worker of a one-worker
    emulated cluster of the workers' ``cpu`` (``--probe-on worker``: the kernels timed as
    the workers run them) or in this process, unconfined (``--probe-on here``)."""
    # strong scaling: one problem, probed at every P in one go; weak: a problem per P
    groups = [Ps] if len(set(scales.values())) == 1 else [[P] for P in Ps]

    def each(client):
        probes = {}
        for m in models:
            for group in groups:
                est, ds = problems[(m, scales[group[0]])]
                got = probe(est, ds, workers=group, seconds=args.probe_seconds, on=client)
                for P, pr in got.items():
                    probes[(m, P)] = pr
                    say_probe(m, P, pr)
        return probes

    if args.probe_on == "cluster":
        return {}               # probed on each P's own cluster (`main`)
    if args.probe_on == "here":
        return each(None)
    with EmulatedCluster(n_workers=1, cpu=args.cpu, memory_limit="4GiB", driver_cpu=args.cpu,
                         scheduler_cpu=args.cpu) as cluster:
        return each(cluster.client)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the same as --size quick")
    ap.add_argument("--size", choices=sorted(SIZES), default="small",
                    help="problem sizes (see the module docstring)")
    ap.add_argument("--workers", default=None, help="comma-separated P (default 1,2,4,8)")
    ap.add_argument("--cpu", type=float, default=0.2)
    ap.add_argument("--models", default=None,
                    help=f"comma-separated (default: all, {','.join(MODELS)}; with --weak "
                         f"{','.join(WEAK_MODELS)})")
    ap.add_argument("--weak", action="store_true",
                    help="weak scaling: P workers fit a problem P times the size's")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--probe-seconds", type=float, default=60.0,
                    help="planner probe per model and P (long: probes then run whole fits)")
    ap.add_argument("--probe-on", choices=("worker", "cluster", "here"), default="worker",
                    help="run the planner's probes on an emulated worker of --cpu cores "
                         "(default), on every worker of each P's own emulated cluster at "
                         "once before its fits (the kernels timed with all P workers busy), "
                         "or in this process, unconfined")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scaling.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.size = "quick"
    why = emulation_unavailable()
    if why:
        print(f"cannot emulate a cluster here: {why}", file=sys.stderr)
        return 2
    Ps = [int(p) for p in (args.workers or ("1,2,4" if args.quick else "1,2,4,8")).split(",")]
    models = [m.strip() for m in (args.models or ",".join(WEAK_MODELS if args.weak else MODELS))
              .split(",") if m.strip()]
    # strong scaling: one problem for every P; weak: a problem P times as large at each P
    scales = {P: (P if args.weak else 1) for P in Ps}
    cpu = args.cpu
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="dmp-scaling-"))
    try:
        problems = {}
        for m in models:
            for scale in sorted(set(scales.values())):
                t0 = time.perf_counter()
                problems[(m, scale)] = pr = build(m, tmp, args.size, n_shards=max(Ps),
                                                  scale=scale)
                print(f"built {m} x{scale}: {pr[1]} ({time.perf_counter() - t0:.1f} s)",
                      flush=True)
        probes = run_probes(problems, models, Ps, scales, args)
        measured: dict = {}
        costs: dict = {}
        shares: dict = {}
        for rep in range(args.repeats):
            order = Ps if rep % 2 == 0 else Ps[::-1]
            for P in order:
                with EmulatedCluster(n_workers=P, cpu=cpu, memory_limit="2GiB",
                                     driver_cpu=cpu, scheduler_cpu=cpu) as cluster:
                    client = cluster.client
                    shares.setdefault(P, []).append(busy_share(client))
                    c = engine_costs(client, P)
                    costs.setdefault(P, []).append(c)
                    print(f"P={P} rep {rep}: cpu share {shares[P][-1]:.3f}, null round "
                          f"{c['null_s'] * 1e3:.1f} ms", flush=True)
                    mods = models if rep % 2 == 0 else models[::-1]
                    probed = args.probe_on == "cluster" and rep == 0
                    if probed:
                        for m in mods:
                            est, ds = problems[(m, scales[P])]
                            pr = probe(est, ds, workers=[P], seconds=args.probe_seconds,
                                       on=client, all_workers=True)[P]
                            probes[(m, P)] = pr
                            say_probe(m, P, pr)
                    for m in mods:
                        est, ds = problems[(m, scales[P])]
                        if not probed:
                            warm_workers(est, ds, client, P)
                        r = fit_on(est, ds, client, P)
                        measured.setdefault((m, P), []).append(r)
                        pushes = ("" if r["push_max_s"] is None else
                                  f", pushes {r['push_max_s']:.2f} s (slowest) / "
                                  f"{r['push_mean_s']:.2f} s (mean)")
                        print(f"  {m:9s} P={P}: loop {r['loop_s']:.2f} s, fit "
                              f"{r['fit_s']:.2f} s, {r['rounds']} rounds{pushes}", flush=True)
                    # the engine's costs again after the fits: one sample at the start of a
                    # cluster moved by 2x between runs (a P = 8 null round 21-58 ms)
                    c = engine_costs(client, P)
                    costs[P].append(c)
                    print(f"P={P} rep {rep}: null round after the fits "
                          f"{c['null_s'] * 1e3:.1f} ms", flush=True)
        med_costs = {P: {k: float(np.median([c[k] for c in costs[P]])) for k in costs[P][0]}
                     for P in costs}
        # the planner is given the cores the workers got (a spinning worker's CPU share,
        # at most cpu) and, for comparison, the nominal cpu
        got = float(np.median([v for vs in shares.values() for v in vs]))
        eng, net = calibrated(med_costs, got, got)
        eng_nom, _ = calibrated(med_costs, cpu, cpu)
        # at a measured P, the engine's cost of a round measured at that P (the a + b P
        # line of `calibrated` is for other P)
        at_P = {P: EngineCosts(call_s=0.0, round_s=0.0, worker_call_s=med_costs[P]["null_s"] * got,
                               message_s=eng.message_s,
                               fanout_message_s=eng.fanout_message_s,
                               ring_byte_s=eng.ring_byte_s) for P in med_costs}
        at_P_nom = {P: EngineCosts(call_s=0.0, round_s=0.0,
                                   worker_call_s=med_costs[P]["null_s"] * cpu,
                                   message_s=eng_nom.message_s,
                                   fanout_message_s=eng_nom.fanout_message_s,
                                   ring_byte_s=eng_nom.ring_byte_s)
                    for P in med_costs}
        rows = []
        for m in models:
            base = None
            for P in Ps:
                runs = measured[(m, P)]
                med = {k: float(np.median([r[k] for r in runs if r[k] is not None]))
                       if any(r[k] is not None for r in runs) else None for k in runs[0]}
                pred = predict(probes[(m, P)], P, network=net, engine=at_P[P],
                               cores_per_worker=got, driver_cores=got)
                nominal = predict(probes[(m, P)], P, network=net, engine=at_P_nom[P],
                                  cores_per_worker=cpu, driver_cores=cpu)
                line = predict(probes[(m, P)], P, network=net, engine=eng,
                               cores_per_worker=got, driver_cores=got)
                # the pushes priced as bursts of the workers' CPU quota instead
                quota = predict(probes[(m, P)], P, network=net, engine=at_P[P],
                                cores_per_worker=got, driver_cores=got,
                                cpu_period=cpu_period(cpu))
                if base is None:
                    base = med
                # weak scaling: P times the work in the time of one (scaled speed-up)
                work = scales[P] / scales[Ps[0]]
                rows.append({
                    "model": m, "P": P, **med, "repeats": len(runs), "scale": scales[P],
                    "speedup": work * base["loop_s"] / med["loop_s"],
                    "efficiency": work * base["loop_s"] / med["loop_s"] / P,
                    "setup_s": med["fit_s"] - med["loop_s"],
                    "setup_ratio": (med["fit_s"] - med["loop_s"])
                    / (base["fit_s"] - base["loop_s"]),
                    "fit_speedup": work * base["fit_s"] / med["fit_s"],
                    "fit_efficiency": work * base["fit_s"] / med["fit_s"] / P,
                    "pred_loop_s": pred["loop_s"], "pred_rounds": pred["rounds"],
                    "pred_split": {k: pred[k] for k in ("compute_s", "driver_s", "comm_s",
                                                        "overhead_s")},
                    "pred_error": pred["loop_s"] / med["loop_s"] - 1.0,
                    "pred_line_loop_s": line["loop_s"],
                    "pred_line_error": line["loop_s"] / med["loop_s"] - 1.0,
                    "pred_quota_loop_s": quota["loop_s"],
                    "pred_quota_error": quota["loop_s"] / med["loop_s"] - 1.0,
                    "pred_nominal_loop_s": nominal["loop_s"],
                    "pred_nominal_error": nominal["loop_s"] / med["loop_s"] - 1.0,
                    "pred_bytes_per_worker_round": pred["bytes_per_worker_round"],
                    # what the planner was given, to re-plan from the file
                    "probe": dataclasses.asdict(probes[(m, P)])})
        result = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.processor()}",
            "command": "python benchmarks/scaling.py " + " ".join(argv or sys.argv[1:]),
            "cpu": cpu, "cores_given_to_planner": got, "workers": Ps, "size": args.size,
            "probe_on": args.probe_on,
            "weak": args.weak,
            "cpu_share": {str(P): v for P, v in shares.items()},
            "engine": {"null_rounds": {str(P): v for P, v in med_costs.items()},
                       "null_round_samples": {str(P): [c["null_s"] for c in v]
                                              for P, v in costs.items()},
                       "calibrated": eng.__dict__, "network_bytes_per_s": net.bandwidth},
            "rows": rows, "total_s": time.perf_counter() - t_start}
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=float))
        plot(rows, Ps, out.with_suffix(".png"), cpu, weak=args.weak)
        print(markdown(rows))
        print(f"wrote {out} and {out.with_suffix('.png')} ({result['total_s']:.0f} s)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def markdown(rows) -> str:
    lines = ["| model | P | round loop s | speed-up | eff. | whole fit s | fit eff. | setup s "
             "(/ P=1) | rounds | KiB/worker/round | peak MiB/worker | planner s (error) | "
             "planner, pushes as quota bursts (error) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mem = (f"{r['peak_memory_per_worker'] / 2**20:.0f}"
               if r["peak_memory_per_worker"] else "?")
        lines.append(
            f"| {r['model']} | {r['P']} | {r['loop_s']:.2f} | {r['speedup']:.2f} | "
            f"{r['efficiency']:.2f} | {r['fit_s']:.1f} | {r['fit_efficiency']:.2f} | "
            f"{r['setup_s']:.1f} ({r['setup_ratio']:.2f}) | "
            f"{r['rounds']:.0f} | {r['bytes_per_worker_round'] / 1024:,.1f} | {mem} | "
            f"{r['pred_loop_s']:.2f} ({r['pred_error']:+.0%}) | "
            f"{r['pred_quota_loop_s']:.2f} ({r['pred_quota_error']:+.0%}) |")
    return "\n".join(lines)


def plot(rows, Ps, path, cpu, weak=False):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(6.5, 5))
    ax.plot(Ps, Ps, "k--", lw=1, label="ideal")
    for j, m in enumerate(models):
        rs = [r for r in rows if r["model"] == m]
        color = f"C{j}"
        ax.plot([r["P"] for r in rs], [r["speedup"] for r in rs], "o-", color=color, label=m)
        base = rs[0]["pred_loop_s"] / rs[0]["scale"]
        ax.plot([r["P"] for r in rs], [r["scale"] * base / r["pred_loop_s"] for r in rs], ":",
                color=color)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(Ps, [str(p) for p in Ps])
    ax.set_xlabel("workers P (emulated, %g core each)" % cpu)
    ax.set_ylabel("round-loop speed-up against P = 1" + (" (scaled: work x P)" if weak else ""))
    ax.set_title(f"dmp {'weak' if weak else 'strong'} scaling (solid: measured, dotted: dmp.plan)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
