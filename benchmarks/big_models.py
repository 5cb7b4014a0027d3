#!/usr/bin/env python
"""Models larger than any worker, on more workers (issue 26, part 5).

Run from the repository root as root (CPU cgroups), with the project's environment::

    python benchmarks/big_models.py                  # 4 GiB LDA table, 4 GiB MF factors
    python benchmarks/big_models.py --quick          # ~1 GiB models, a few minutes
    python benchmarks/big_models.py --models mf

On ``--workers`` (8) `dmp.testing.EmulatedCluster` workers of ``--cpu`` (0.2) core and
``--memory-limit`` (1 GiB) each, driver and scheduler ``--cpu`` each:

* ``lda``: `LatentDirichletAllocation` with K = ``--lda-topics`` (100,000) topics over
  V = ``--lda-words`` (10,744) words: the int32 word-topic table is K x V x 4 B = 4.0 GiB,
  one word block of 512 MiB per worker.  The corpus (`make_lda_corpus`,
  ``--lda-true-topics`` (50) generating topics, ``--lda-beta`` (1: every word is used),
  ``--lda-docs`` x 200 tokens, ``--lda-seed``) is written to a row store of one shard per
  worker.  ``--lda-sweeps`` Gibbs sweeps after the counting rotation.  ``--lda-words 10000
  --lda-docs 50000 --lda-true-topics 1000 --lda-beta 0.01 --lda-seed 3`` is the 10M-token
  corpus of ``lda_large_k.py``; with ``--lda-priors 0.1 0.01`` its model too (whose one-core
  run gives the log-likelihood to compare).
* ``mf``: `MatrixFactorization` CCD++ at rank ``--mf-rank`` (200) on ``--mf-users``
  (2,680,000) x ``--mf-items`` (20,000) with ``--mf-ratings`` ratings (`make_ratings`, true
  rank 20, 10% kept out as the test split): W + H = (m + n) x rank x 8 B = 4.0 GiB;
  ``--mf-iters`` iterations; ``factors_store=``: every worker writes its own rows to Zarr.

Per model: the planner's memory per worker (`dmp.planning.plan_memory`, the figure the
backend's up-front check uses) against the measured peak resident memory of every worker
process (the kernel's high-water mark ``VmHWM``, and ``psutil`` samples every 0.2 s),
workers lost (none may be: the fit's recoveries, the worker pids before and after), the
round loop and the whole fit's wall time, and the model's own checks.

Dask's pause threshold is ``--pause`` (0.85) of the limit, for the workers and for the
up-front check alike: with the default 0.8 and the 300 MiB a worker takes before it holds a
partition (``dmp.memory.worker-base``), 1 GiB workers have 519 MiB for a partition, and
exactly 4 GiB over 8 workers is 512 MiB of model alone.  The nanny still restarts a worker
at 95% (973 MiB).

The end of the LDA fit: the estimator assembles ``topic_word_counts_`` (int32, 4 GiB) and
``components_`` (float64, 8 GiB) on the driver, which needs about 3 times the table there;
by default the benchmark streams the table off the workers through the same path
(`DaskBackend.collect_stream`, 4 MiB pieces) into per-word and per-topic totals, checked
against the corpus, and sets no ``components_`` (``--lda-collect`` keeps the estimator's
own end, for a driver with the memory).  MF's factors never pass through the driver.

Writes ``benchmarks/results/big_models.json`` (``--out``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB, MIB = 2**30, 2**20


# --------------------------------------------------------------------------- problems

def lda_problem(args, folder: Path):
    from dmp.decomposition import LatentDirichletAllocation
    from dmp.io import write_sparse_rows
    from dmp.io.synthetic import make_lda_corpus

    X = make_lda_corpus(args.lda_docs, args.lda_words, args.lda_true_topics, 200,
                        beta=args.lda_beta, seed=args.lda_seed)[0]
    ds = write_sparse_rows(folder / "corpus.zarr", X, np.zeros(X.shape[0]),
                           n_shards=args.workers)
    priors = ({} if args.lda_priors is None else
              dict(zip(("doc_topic_prior", "topic_word_prior"), args.lda_priors)))
    est = LatentDirichletAllocation(args.lda_topics, max_iter=args.lda_sweeps,
                                    random_state=0, **priors)
    model = args.lda_topics * args.lda_words * 4
    return est, ds, model, {"tokens": int(X.sum()), "documents": X.shape[0],
                            "word_counts": np.asarray(X.sum(axis=0)).ravel().astype(np.int64)}


def mf_problem(args, folder: Path):
    from dmp.decomposition import MatrixFactorization
    from dmp.io import write_ratings
    from dmp.io.synthetic import make_ratings

    (u, i, r), (tu, ti, tr), _, _ = make_ratings(args.mf_users, args.mf_items,
                                                 args.mf_ratings, rank=20, noise=0.5, seed=3)
    codes = np.r_[np.zeros(len(r), np.int8), np.full(len(tr), 2, np.int8)]
    ds = write_ratings(folder / "ratings.zarr", np.r_[u, tu], np.r_[i, ti], np.r_[r, tr],
                       shape=(args.mf_users, args.mf_items), split=codes)
    est = MatrixFactorization(args.mf_rank, method="ccd++", max_iter=args.mf_iters, tol=None,
                              random_state=0, factors_store=str(folder / "factors.zarr"))
    model = (args.mf_users + args.mf_items) * args.mf_rank * 8
    return est, ds, model, {"ratings": len(r), "test_ratings": len(tr)}


# --------------------------------------------------------------------------- LDA's end

def stream_lda_table(est, out: dict) -> None:
    """Make ``est``'s fit end by streaming its word-topic table off the workers into
    per-word and per-topic totals (``out``) instead of assembling it on the driver, and set
    the scalar fitted attributes only (no ``components_``)."""
    from dmp.decomposition._lda_program import word_blocks

    hook = est._run_options

    def run_options(fit):
        opts = hook(fit)
        program = fit.program
        program.gather_partitions = False   # the table comes over below, piece by piece
        opts["collect"] = lambda backend: _table_totals(backend, program, word_blocks, out)
        return opts

    def set_fitted(fit, result):
        dr = fit.program.driver
        est.log_likelihood_ = float(dr["ll"])
        est.n_iter_ = int(dr["sweep"])
        est.n_tokens_ = int(dr["n_tokens"])
        est.n_features_in_ = int(fit.dataset.shape[1])
        out["n_k"] = np.asarray(dr["n_k"], dtype=np.int64)

    est._run_options = run_options
    est._set_fitted = set_fitted


def _table_totals(backend, program, word_blocks, out):
    P = backend.n_partitions
    block, _ = word_blocks(program.n_words, P, program.seed, program.word_freq)
    members = [np.flatnonzero(block == b) for b in range(P)]
    words = np.zeros(program.n_words, np.int64)
    topics = np.zeros(program.n_topics, np.int64)
    held = {}
    seen = {"bytes": 0, "negative": 0}

    def sink(k, name, row, piece):
        if name == "block_id":
            held[k] = int(piece[0])
        elif name == "block":
            words[members[held[k]][row:row + len(piece)]] += piece.sum(axis=1)
            topics[:] += piece.sum(axis=0)
            seen["bytes"] += piece.nbytes
            seen["negative"] += int((piece < 0).sum())

    t0 = time.perf_counter()
    backend.collect_stream(sink)
    out.update(word_totals=words, topic_totals=topics, table_bytes=seen["bytes"],
               negative_counts=seen["negative"], blocks=sorted(held.values()),
               collect_s=time.perf_counter() - t0)


# --------------------------------------------------------------------------- measuring

def _pid():
    return os.getpid()


def hwm(pid: int) -> int | None:
    """The process's peak resident memory (``VmHWM``), in bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Watch:
    """Every worker process's resident memory every ``every`` seconds (psutil, from this
    process: nothing asks the busy workers)."""

    def __init__(self, pids: dict, every: float = 0.2):
        import psutil

        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.every = every
        self.peak = dict.fromkeys(pids, 0)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for name, p in self.procs.items():
                try:
                    self.peak[name] = max(self.peak[name], p.memory_info().rss)
                except Exception:  # noqa: BLE001 - a process gone: counted as lost
                    pass
            self.samples += 1
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def worker_pids(client) -> dict:
    info = client.scheduler_info(n_workers=-1)["workers"]
    names = {addr: str(w["name"]) for addr, w in info.items()}
    return {names[a]: pid for a, pid in client.run(_pid).items()}


def run_model(name, args, folder, limit):
    import dask

    from dmp.planning import plan_memory
    from dmp.testing import EmulatedCluster

    t0 = time.perf_counter()
    est, ds, model_bytes, facts = (lda_problem if name == "lda" else mf_problem)(args, folder)
    build_s = time.perf_counter() - t0
    print(f"{name}: model {model_bytes / GIB:.2f} GiB ({model_bytes / limit:.1f} worker "
          f"limits), store {ds} ({build_s:.0f} s)", flush=True)
    plan = plan_memory(est, ds, workers=sorted({args.workers // 2, args.workers}),
                       memory_per_worker=limit, as_frame=False)
    pred = {r["workers"]: r for r in plan}
    for r in plan:
        print(f"  plan_memory P={r['workers']}: {r['memory_per_worker'] / MIB:.0f} MiB per "
              f"worker, fits {r['fits']} (workers needed {r['workers_needed']})", flush=True)
    out = {"model": name, "model_bytes": model_bytes, "build_s": build_s, "plan": plan,
           **{k: v for k, v in facts.items() if not isinstance(v, np.ndarray)}}
    lda_end: dict = {}
    if name == "lda" and not args.lda_collect:
        stream_lda_table(est, lda_end)
    with EmulatedCluster(n_workers=args.workers, cpu=args.cpu, memory_limit=limit,
                         driver_cpu=args.cpu, scheduler_cpu=args.cpu) as cluster:
        client = cluster.client
        pids = worker_pids(client)
        base = {w: hwm(p) for w, p in pids.items()}
        est.set_params(backend=client, n_workers=args.workers)
        with Watch(pids) as watch, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            try:
                est.fit(ds)
                error = None
            except Exception as exc:  # noqa: BLE001 - recorded: the benchmark's verdict
                error = f"{type(exc).__name__}: {exc}"
            fit_s = time.perf_counter() - t0
        after = worker_pids(client) if client.status == "running" else {}
        peaks = {w: hwm(p) for w, p in pids.items()}
    lost = sorted(w for w in pids if after.get(w) != pids[w])
    out.update(error=error, fit_s=fit_s, worker_pids=pids, workers_lost=lost,
               base_rss=base, peak_rss=peaks, sampled_peak_rss=watch.peak,
               samples=watch.samples)
    predicted = pred[args.workers]["memory_per_worker"]
    measured = max(v for v in peaks.values() if v) if any(peaks.values()) else None
    out["predicted_per_worker"] = predicted
    out["measured_peak_per_worker"] = measured
    out["prediction_error"] = (predicted / measured - 1.0) if measured else None
    if error is None:
        h = est.history_
        out.update(loop_s=float(h["time"][-1]), rounds=len(h["round"]),
                   recoveries=len(est.recoveries_),
                   worker_losses=int(np.max(h["worker_losses"])),
                   n_iter=int(est.n_iter_))
        if name == "lda":
            out["log_likelihood"] = float(est.log_likelihood_)
            ends = np.r_[h["sweep"][1:] != h["sweep"][:-1], True]
            out["ll_per_token"] = [float(v) for v in h["ll_per_token"][ends]]
            out["sweep_end_s"] = [float(v) for v in h["time"][ends]]
            if lda_end:
                ok_words = bool(np.array_equal(lda_end["word_totals"], facts["word_counts"]))
                ok_topics = bool(np.array_equal(lda_end["topic_totals"], lda_end["n_k"]))
                out.update(table_streamed_bytes=lda_end["table_bytes"],
                           collect_s=lda_end["collect_s"], blocks=lda_end["blocks"],
                           words_match_corpus=ok_words, topics_match_n_k=ok_topics,
                           negative_counts=lda_end["negative_counts"])
            else:
                out["words_match_corpus"] = bool(np.array_equal(
                    est.topic_word_counts_.sum(axis=0), facts["word_counts"]))
        else:
            it = np.asarray(h["iteration"])
            ends = np.r_[it[1:] != it[:-1], True]
            out.update(objective=[float(v) for v in h["objective"][ends]],
                       train_rmse=[float(v) for v in h["train_rmse"][ends]],
                       factors_shape=[list(est.user_factors_.shape),
                                      list(est.item_factors_.shape)])
    return out


def markdown(results, limit) -> str:
    lines = ["| model | size | P x limit | fit s | round loop s | rounds | workers lost | "
             "peak RSS per worker (MiB, min-max) | predicted MiB | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        peaks = [v / MIB for v in r["peak_rss"].values() if v]
        lines.append(
            f"| {r['model']} | {r['model_bytes'] / GIB:.2f} GiB | {len(r['peak_rss'])} x "
            f"{limit / GIB:g} GiB | {r['fit_s']:.0f} | {r.get('loop_s', float('nan')):.0f} | "
            f"{r.get('rounds', '-')} | {len(r['workers_lost'])} | "
            f"{min(peaks):.0f}-{max(peaks):.0f} | {r['predicted_per_worker'] / MIB:.0f} | "
            f"{r['prediction_error']:+.1%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="lda,mf")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--cpu", type=float, default=0.2)
    ap.add_argument("--memory-limit", default="1GiB")
    ap.add_argument("--pause", type=float, default=0.85,
                    help="distributed.worker.memory.pause for the workers and the check")
    ap.add_argument("--lda-topics", type=int, default=100_000)
    ap.add_argument("--lda-words", type=int, default=10_744)
    ap.add_argument("--lda-docs", type=int, default=10_000)
    ap.add_argument("--lda-sweeps", type=int, default=2)
    ap.add_argument("--lda-true-topics", type=int, default=50,
                    help="the corpus' generating topics (lda_large_k.py's corpus: 1000)")
    ap.add_argument("--lda-beta", type=float, default=1.0,
                    help="the corpus' topic-word Dirichlet (lda_large_k.py's: 0.01)")
    ap.add_argument("--lda-seed", type=int, default=2, help="(lda_large_k.py's: 3)")
    ap.add_argument("--lda-priors", type=float, nargs=2, metavar=("ALPHA", "BETA"),
                    help="doc_topic_prior, topic_word_prior (default: the estimator's; "
                         "lda_large_k.py's: 0.1 0.01)")
    ap.add_argument("--lda-collect", action="store_true",
                    help="the estimator's own end: the whole table assembled on the driver")
    ap.add_argument("--mf-users", type=int, default=2_680_000)
    ap.add_argument("--mf-items", type=int, default=20_000)
    ap.add_argument("--mf-ratings", type=int, default=9_000_000)
    ap.add_argument("--mf-rank", type=int, default=200)
    ap.add_argument("--mf-iters", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="~1 GiB models")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "big_models.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.lda_topics, args.lda_docs, args.lda_sweeps = 25_000, 4_000, 1
        args.mf_users, args.mf_ratings, args.mf_rank, args.mf_iters = 650_000, 2_000_000, \
            200, 1
    from dask.utils import parse_bytes

    import dask

    from dmp.testing import emulation_unavailable

    why = emulation_unavailable()
    if why:
        print(f"cannot emulate a cluster here: {why}", file=sys.stderr)
        return 2
    limit = int(parse_bytes(args.memory_limit))
    results = []
    load0 = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="dmp-big-models-"))
    try:
        with dask.config.set({"distributed.worker.memory.pause": args.pause}):
            for name in [m.strip() for m in args.models.split(",") if m.strip()]:
                folder = tmp / name
                folder.mkdir()
                r = run_model(name, args, folder, limit)
                results.append(r)
                shutil.rmtree(folder, ignore_errors=True)
                print(json.dumps({k: v for k, v in r.items() if k not in ("plan",)},
                                 default=str), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.node()}: {os.cpu_count()} cores",
              "command": "python benchmarks/big_models.py " + " ".join(argv or sys.argv[1:]),
              "load_before": load0, "load_after": os.getloadavg(),
              "args": vars(args), "results": results}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=lambda o: o.tolist()
                              if isinstance(o, np.ndarray) else str(o)))
    print(markdown(results, limit))
    print(f"wrote {out}")
    return 0 if all(r["error"] is None and not r["workers_lost"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
