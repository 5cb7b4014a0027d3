#!/usr/bin/env python
"""What two workers computing at once cost each other on this machine: the ceiling of any
2-worker speed-up, measured without Dask.

    python benchmarks/concurrency.py               # about 40 s on 2 cores
    python benchmarks/concurrency.py --repeat 9 --topics 100 1000

Two plain processes (``multiprocessing``, spawned) each hold the same kind of work on their
own data.  Every repeat runs three phases, separated by barriers: process 0 alone, process 1
alone, both at once; in each phase a process runs its work ``--burst`` times back to back
(as a fit's pushes follow each other: single runs after a rest come out faster, the cores'
clock boost).  A workload's *slowdown* is the median time of a run with both busy
over the median alone; two workers can then be at most ``2 / slowdown`` times faster than
one, before any communication or scheduling cost.  Workloads:

* ``alu``: an integer hash loop on a few registers (no memory traffic): a slowdown here is
  the processor itself (clock boost with one busy core, or host threads shared by the VM's
  cores);
* ``lda-K<k>``: one sweep of dmp's sparse LDA sampler over half of the synthetic LDA corpus
  (`benchmarks/lda.py`'s: 5,000 documents, 10,000 words, ~1M tokens; each process takes one
  half of the documents), K topics: the workload of ``benchmarks/lda.py``'s 2-worker runs.

Writes ``benchmarks/results/concurrency.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mf import machine_info  # noqa: E402

ALU_STEPS = 40_000_000


@njit(cache=True, nogil=True)
def _alu(n):
    x = np.uint64(88172645463325252)
    acc = np.uint64(0)
    for _ in range(n):
        x ^= x << np.uint64(13)
        x ^= x >> np.uint64(7)
        x ^= x << np.uint64(17)
        acc += x
    return acc


def _lda_state(half: int, n_topics: int):
    """Tokens, assignments and counts of one half of the corpus (one block of all words)."""
    from dmp.decomposition import _lda_kernels as kernels
    from dmp.decomposition._lda_program import expand_tokens, word_blocks
    from dmp.io.synthetic import make_lda_corpus

    X = make_lda_corpus()[0].tocsr()
    n = X.shape[0] // 2
    Xp = X[half * n:(half + 1) * n]
    block, row = word_blocks(X.shape[1], 1, 0)
    tok_doc, tok_row, _, _, doc_len = expand_tokens(Xp.indptr, Xp.indices, Xp.data, block,
                                                    row, 1)
    z = np.random.default_rng(half).integers(0, n_topics, len(tok_doc)).astype(np.int32)
    ptr, pairs, cnt = kernels.doc_topic_lists(tok_doc, z, len(doc_len), n_topics)
    n_wk = np.zeros((X.shape[1], n_topics), np.int32)
    kernels.count_block(0, len(z), tok_row, tok_doc, z, n_wk)
    n_k = n_wk.sum(axis=0).astype(np.int64)
    return (tok_row, tok_doc, z, n_wk, n_k, ptr, pairs, cnt, np.empty(n_topics),
            np.empty(n_topics), np.empty(n_topics + 1), X.shape[1])


def _make_work(name: str, half: int):
    """A callable that runs one unit of the workload (state built once, here)."""
    if name == "alu":
        return lambda i: _alu(ALU_STEPS)
    from dmp.decomposition import _lda_kernels as kernels
    from dmp.decomposition._lda_program import round_uniforms

    n_topics = int(name.split("K")[1])
    (tok_row, tok_doc, z, n_wk, n_k, ptr, pairs, cnt, phi, buf, tree,
     n_words) = _lda_state(half, n_topics)
    alpha, beta = 0.1, 0.01

    def sweep(i):
        u = round_uniforms(0, i, half, len(z))
        kernels.sample_sparse(0, len(z), tok_row, tok_doc, z, n_wk, n_k, u, alpha, beta,
                              n_words * beta, ptr, pairs, cnt, phi, buf, tree)
    return sweep


def _child(half, names, repeat, burst, barrier, queue):
    works = {name: _make_work(name, half) for name in names}
    out = {name: {"alone": [], "both": []} for name in names}
    for name, work in works.items():
        for i in range(3):       # warm-up: compiled code, caches, the topics settling
            work(1000 + i)
        for i in range(repeat):
            for phase in ("alone-0", "alone-1", "both"):
                barrier.wait()
                if phase == "both" or phase == f"alone-{half}":
                    # runs back to back, as a fit's pushes: a core that rested boosts
                    for j in range(burst):
                        t0 = time.perf_counter()
                        work(i * burst + j)
                        out[name]["both" if phase == "both" else "alone"].append(
                            time.perf_counter() - t0)
    queue.put((half, out))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--burst", type=int, default=6,
                    help="runs back to back in each phase (default 6)")
    ap.add_argument("--topics", type=int, nargs="+", default=[100])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                         "concurrency.json"))
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.burst < 1 or any(k < 1 for k in args.topics):
        ap.error("--repeat, --burst and --topics must be >= 1")
    names = ["alu"] + [f"lda-K{k}" for k in args.topics]
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_child, args=(h, names, args.repeat, args.burst, barrier, queue))
             for h in (0, 1)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    report = {"machine": machine_info(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "repeat": args.repeat, "burst": args.burst, "workloads": {}}
    print(f"{'workload':<10} {'alone s':>9} {'both s':>9} {'slowdown':>9} "
          f"{'2-worker ceiling':>17}")
    for name in names:
        alone = float(np.median([t for h in (0, 1) for t in results[h][name]["alone"]]))
        both = float(np.median([t for h in (0, 1) for t in results[h][name]["both"]]))
        slowdown = both / alone
        report["workloads"][name] = {"alone_s": alone, "both_s": both, "slowdown": slowdown,
                                     "ceiling_speedup": 2 / slowdown,
                                     "runs": {str(h): results[h][name] for h in (0, 1)}}
        print(f"{name:<10} {alone:9.4f} {both:9.4f} {slowdown:9.3f} {2 / slowdown:17.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
