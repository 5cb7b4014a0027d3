#!/usr/bin/env python
"""Small problems and the first fit: every dmp estimator against its closest reference.

Run from the repository root with the project's environment active (cmfrec is in the
``bench`` extra)::

    python benchmarks/small.py                  # both parts, about 3-5 minutes on 2 cores
    python benchmarks/small.py --warm           # the warm comparison only
    python benchmarks/small.py --first-fit      # the fresh-process part only
    python benchmarks/small.py --cases lasso sgd --repeats 9

Two parts (issue 28, target 4: within 1.5x of the reference after warm-up on data under
about 1e6 stored values; the first fit in a fresh process adds at most 0.3 s over the second):

* ``--warm``: in this process, every case fitted once by dmp and once by its reference
  (warm-up: kernels compiled or loaded, imports done), then ``--repeats`` interleaved pairs
  (dmp, reference, dmp, ...).  The whole ``fit`` call is timed, dmp's input preparation
  included; the table shows the medians of wall time and of the process's CPU time (steadier
  on a shared machine; every fit runs on one thread), their ratios (dmp / reference) and
  each side's quality on the same data.
* ``--first-fit``: each case in fresh subprocesses, ``--fresh-repeats`` of them per side,
  interleaved over cases and sides (after one pass not counted, which fills Numba's on-disk
  cache).  A child loads its data (written by the parent as .npz,
  read with numpy / scipy only, so that nothing of dmp or the reference is imported before
  it is timed), then times the estimator's import, its first fit and a second fit of a new
  estimator on the same data.  Reported: medians of the import, of first - second (what the
  first fit adds: imports inside ``fit``, dispatch, Numba kernels loaded from the on-disk
  cache) and the reference's same numbers, in wall time and in the process's CPU time.

Cases (dmp with its default ``backend="auto"``, as a user starts: without a Dask client that
is the in-process backend with one partition; references single threaded through
``threadpoolctl`` where they use BLAS):

* ``lasso``: dense 400 x 120 (48k values), ``alpha = alpha_max / 20``, ``tol=1e-6``;
  scikit-learn ``Lasso``.  Quality: the objective.
* ``sgd``: dense 2,000 x 50 binary classification (100k values), log loss, ``alpha=1e-4``,
  20 epochs with ``tol=None`` on both; scikit-learn ``SGDClassifier``.  Quality: training
  accuracy.
* ``lda``: 300 documents of 100 tokens over 500 words (30k tokens), K = 10, 50 iterations
  (dmp: Gibbs sweeps; scikit-learn: batch variational EM ``max_iter=50``).  Quality: held-in
  perplexity from each model's topic-word distribution and the documents' topic mixtures
  computed the same way (`_lda_perplexity`).
* ``mf``: 2,000 x 500 ratings, 100k observed (rank 10), 10 iterations at rank 10, unscaled
  ``alpha = 0.05``, no centring / biases; cmfrec ``CMF(method="als")`` Cholesky, float64.
  Quality: test RMSE on 10% held out.
* ``ba``: 2,000 x 32 points (64k values), 16 bits; dmp's own ``dmp.hashing.itq`` (the
  binary autoencoder's initialisation; 50 iterations) is the reference.  Quality: precision
  of the 50 nearest codes in Hamming distance against the 50 nearest points of 200 queries.

The machine is printed with the load average: on a shared machine the medians of the
interleaved repeats are what to compare.  ``--json PATH`` also writes the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CASES = ("lasso", "sgd", "lda", "mf", "ba")


# ---------------------------------------------------------------------- data (parent)
def make_data(case: str, folder: str) -> None:
    """Write the case's data to ``folder/<case>.npz`` (numpy / scipy formats only)."""
    rng = np.random.default_rng(0)
    path = os.path.join(folder, f"{case}.npz")
    if case == "lasso":
        X = rng.standard_normal((400, 120))
        w = np.zeros(120)
        w[:12] = rng.standard_normal(12)
        y = X @ w + 0.1 * rng.standard_normal(400)
        np.savez(path, X=X, y=y)
    elif case == "sgd":
        X = rng.standard_normal((2000, 50))
        y = (X @ rng.standard_normal(50) + 0.5 * rng.standard_normal(2000) > 0).astype(int)
        np.savez(path, X=X, y=y)
    elif case == "lda":
        from dmp.io.synthetic import make_lda_corpus

        X, _, _ = make_lda_corpus(n_docs=300, n_words=500, n_topics=10, doc_len=100,
                                  seed=0)
        import scipy.sparse as sp

        sp.save_npz(path, sp.csr_matrix(X))
    elif case == "mf":
        from dmp.io.synthetic import make_ratings

        (u, i, r), (ut, it, rt), _, _ = make_ratings(n_users=2000, n_items=500,
                                                     n_obs=100_000, rank=10, seed=0)
        np.savez(path, u=u, i=i, r=r, ut=ut, it=it, rt=rt)
    elif case == "ba":
        centres = rng.standard_normal((20, 32)) * 2
        X = centres[rng.integers(0, 20, 2000)] + rng.standard_normal((2000, 32))
        np.savez(path, X=X)
    else:
        raise ValueError(f"unknown case {case!r}")


def load_data(case: str, folder: str) -> dict:
    path = os.path.join(folder, f"{case}.npz")
    if case == "lda":
        import scipy.sparse as sp

        return {"X": sp.load_npz(path).tocsr()}
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


# ---------------------------------------------------------------------- the fits
def _import(case: str, side: str):
    """Import what the side's fit needs (timed separately in the first-fit part)."""
    if side == "dmp":
        if case in ("lasso", "sgd"):
            import dmp.linear_model as m
        elif case in ("lda", "mf"):
            import dmp.decomposition as m
        else:
            import dmp.hashing as m
        # the estimators load on first use (module __getattr__): the import a user's
        # ``from dmp.linear_model import Lasso`` makes includes the class's module
        getattr(m, _DMP_CLASS[case])
        return m
    if case == "lasso":
        from sklearn.linear_model import Lasso as m
    elif case == "sgd":
        from sklearn.linear_model import SGDClassifier as m
    elif case == "lda":
        from sklearn.decomposition import LatentDirichletAllocation as m
    elif case == "mf":
        import cmfrec as m
    else:
        import dmp.hashing as m
    return m


_DMP_CLASS = {"lasso": "Lasso", "sgd": "SparsifiedSGDClassifier",
              "lda": "LatentDirichletAllocation", "mf": "MatrixFactorization",
              "ba": "BinaryAutoencoder"}


def _alpha_max(X, y) -> float:
    Xc = X - X.mean(0)
    return float(np.abs(Xc.T @ (y - y.mean())).max() / len(y))


def fit(case: str, side: str, data: dict):
    """One whole fit; returns what `quality` needs."""
    m = _import(case, side)
    if case == "lasso":
        alpha = _alpha_max(data["X"], data["y"]) / 20
        est = (m.Lasso(alpha=alpha, tol=1e-6, random_state=0) if side == "dmp"
               else m(alpha=alpha, tol=1e-6))
        return est.fit(data["X"], data["y"])
    if case == "sgd":
        kw = dict(loss="log_loss", alpha=1e-4, max_iter=20, tol=None, random_state=0)
        est = (m.SparsifiedSGDClassifier(**kw) if side == "dmp" else m(**kw))
        return est.fit(data["X"], data["y"])
    if case == "lda":
        if side == "dmp":
            est = m.LatentDirichletAllocation(n_components=10, max_iter=50, random_state=0)
        else:
            est = m(n_components=10, max_iter=50, learning_method="batch", random_state=0)
        return est.fit(data["X"])
    if case == "mf":
        if side == "dmp":
            import scipy.sparse as sp

            R = sp.coo_matrix((data["r"], (data["u"], data["i"])), shape=(2000, 500))
            est = m.MatrixFactorization(n_components=10, alpha=0.05, max_iter=10, tol=None,
                                        center=False, random_state=0)
            return est.fit(R)
        import scipy.sparse as sp

        # a COO matrix keeps the ids (a data frame would be re-indexed)
        R = sp.coo_matrix((data["r"], (data["u"], data["i"])), shape=(2000, 500))
        est = m.CMF(method="als", k=10, lambda_=0.05, scale_lam=False, center=False,
                    user_bias=False, item_bias=False, niter=10, nthreads=1, use_cg=False,
                    finalize_chol=False, precompute_for_predictions=False, use_float=False,
                    random_state=0, verbose=False)
        return est.fit(R)
    if case == "ba":
        if side == "dmp":
            return m.BinaryAutoencoder(n_bits=16, random_state=0).fit(data["X"])
        return m.itq(data["X"], 16, random_state=0)
    raise ValueError(case)


def _lda_perplexity(X, topic_word, doc_topic) -> float:
    """exp(-log-likelihood per token) of X under normalised doc-topic x topic-word."""
    phi = topic_word / topic_word.sum(1, keepdims=True)
    theta = doc_topic / doc_topic.sum(1, keepdims=True)
    X = X.tocoo()
    p = np.einsum("nk,nk->n", theta[X.row], phi[:, X.col].T)
    return float(np.exp(-(X.data * np.log(p)).sum() / X.data.sum()))


def quality(case: str, side: str, data: dict, est) -> str:
    if case == "lasso":
        X, y = data["X"], data["y"]
        res = y - X @ est.coef_ - est.intercept_
        alpha = _alpha_max(X, y) / 20
        obj = 0.5 * res @ res / len(y) + alpha * np.abs(est.coef_).sum()
        return f"obj {obj:.8g}"
    if case == "sgd":
        return f"acc {np.mean(est.predict(data['X']) == data['y']):.4f}"
    if case == "lda":
        X = data["X"]
        return f"ppl {_lda_perplexity(X, est.components_, est.transform(X)):.1f}"
    if case == "mf":
        if side == "dmp":
            pred = est.predict(data["ut"], data["it"])
        else:
            pred = np.einsum("nk,nk->n", est.A_[data["ut"]], est.B_[data["it"]])
        return f"rmse {np.sqrt(np.mean((pred - data['rt']) ** 2)):.4f}"
    if case == "ba":
        from dmp.hashing import (euclidean_neighbors, hamming_search, pack_codes,
                                 retrieval_precision)

        X = data["X"]
        codes = est.transform(X) if side == "dmp" else pack_codes(est.codes(X))
        found, _ = hamming_search(codes[:200], codes, 50, n_bits=16)
        prec, _ = retrieval_precision(found, euclidean_neighbors(X[:200], X, 50))
        return f"prec@50 {prec:.3f}"
    raise ValueError(case)


def _single_thread():
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


# ---------------------------------------------------------------------- warm part
def warm(cases, repeats: int, folder: str) -> dict:
    import warnings

    out = {}
    with _single_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in cases:
            data = load_data(case, folder)
            times = {"dmp": [], "ref": []}
            cpu = {"dmp": [], "ref": []}
            qual = {}
            for side in ("dmp", "ref"):   # warm-up
                qual[side] = quality(case, side, data, fit(case, side, data))
            for _ in range(repeats):
                for side in ("dmp", "ref"):
                    t0, c0 = time.perf_counter(), time.process_time()
                    fit(case, side, data)
                    times[side].append(time.perf_counter() - t0)
                    cpu[side].append(time.process_time() - c0)
            med = {s: statistics.median(v) for s, v in times.items()}
            mcpu = {s: statistics.median(v) for s, v in cpu.items()}
            ratio, cpu_ratio = med["dmp"] / med["ref"], mcpu["dmp"] / mcpu["ref"]
            out[case] = {"dmp_s": med["dmp"], "ref_s": med["ref"], "ratio": ratio,
                         "dmp_cpu_s": mcpu["dmp"], "ref_cpu_s": mcpu["ref"],
                         "cpu_ratio": cpu_ratio, "times": times, "cpu": cpu, "quality": qual}
            print(f"  {case:6s} wall dmp {1e3 * med['dmp']:8.1f} ms ref {1e3 * med['ref']:8.1f} ms"
                  f" ratio {ratio:5.2f} {'PASS' if ratio <= 1.5 else 'MISS'} | cpu dmp "
                  f"{1e3 * mcpu['dmp']:8.1f} ms ref {1e3 * mcpu['ref']:8.1f} ms ratio "
                  f"{cpu_ratio:5.2f}   [{qual['dmp']} | {qual['ref']}]", flush=True)
    return out


# ---------------------------------------------------------------------- first-fit part
def child(case: str, side: str, folder: str) -> None:
    """Fresh process: import, first fit, second fit; prints one JSON line."""
    import warnings

    warnings.simplefilter("ignore")
    data = load_data(case, folder)
    limits = _single_thread()
    clock = [(time.perf_counter(), time.process_time())]
    _import(case, side)
    clock.append((time.perf_counter(), time.process_time()))
    fit(case, side, data)
    clock.append((time.perf_counter(), time.process_time()))
    fit(case, side, data)
    clock.append((time.perf_counter(), time.process_time()))
    del limits
    (w0, c0), (w1, c1), (w2, c2), (w3, c3) = clock
    print(json.dumps({"import_s": w1 - w0, "first_s": w2 - w1, "second_s": w3 - w2,
                      "import_cpu_s": c1 - c0, "first_cpu_s": c2 - c1,
                      "second_cpu_s": c3 - c2}))


def first_fit(cases, repeats: int, folder: str, baseline: str | None = None) -> dict:
    """``baseline``: another checkout of dmp whose fits run interleaved with this one's
    (side ``"base"``), for before/after numbers taken under the same load."""
    sides = ("dmp", "ref") + (("base",) if baseline else ())
    runs = {(c, s): [] for c in cases for s in sides}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def env_for(side):
        env = dict(os.environ)
        root = os.path.abspath(baseline) if side == "base" else here
        env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)
        return env

    for rep in range(repeats + 1):   # the first pass fills Numba's on-disk cache: not kept
        for key in runs:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", key[0],
                   "dmp" if key[1] == "base" else key[1], "--data", folder]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env_for(key[1]),
                                 check=False)
            if res.returncode != 0:
                raise RuntimeError(f"child {key} failed:\n{res.stderr[-3000:]}")
            if rep:
                runs[key].append(json.loads(res.stdout.strip().splitlines()[-1]))
    out = {}
    for case in cases:
        row = {}
        for side in sides:
            rs = runs[(case, side)]
            row[side] = {"import_s": statistics.median(r["import_s"] for r in rs),
                         "first_s": statistics.median(r["first_s"] for r in rs),
                         "second_s": statistics.median(r["second_s"] for r in rs),
                         "added_s": statistics.median(r["first_s"] - r["second_s"]
                                                      for r in rs),
                         "import_cpu_s": statistics.median(
                             r.get("import_cpu_s", np.nan) for r in rs),
                         "added_cpu_s": statistics.median(
                             r.get("first_cpu_s", np.nan) - r.get("second_cpu_s", np.nan)
                             for r in rs),
                         "runs": rs}
        out[case] = row
        d, r = row["dmp"], row["ref"]
        print(f"  {case:6s} dmp import {d['import_s']:5.2f} s (cpu {d['import_cpu_s']:5.2f} s)"
              f"  first-second "
              f"{d['added_s']:6.3f} s (cpu {d['added_cpu_s']:6.3f} s) "
              f"{'PASS' if d['added_s'] <= 0.3 else 'MISS'}   ref import {r['import_s']:5.2f} s"
              f"  first-second {r['added_s']:6.3f} s (cpu {r['added_cpu_s']:6.3f} s)",
              flush=True)
        if baseline:
            b = row["base"]
            print(f"  {'':6s} baseline import {b['import_s']:5.2f} s (cpu "
                  f"{b['import_cpu_s']:5.2f} s)  first-second {b['added_s']:6.3f} s (cpu "
                  f"{b['added_cpu_s']:6.3f} s)", flush=True)
    return out


def machine() -> str:
    import platform

    import numba
    import sklearn

    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
            f"{' '.join(f'{x:.2f}' for x in load)}; python {platform.python_version()}, "
            f"numpy {np.__version__}, numba {numba.__version__}, scikit-learn "
            f"{sklearn.__version__}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--first-fit", action="store_true")
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--fresh-repeats", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--baseline", metavar="PATH",
                    help="another dmp checkout to time interleaved in --first-fit")
    ap.add_argument("--child", nargs=2, metavar=("CASE", "SIDE"))
    ap.add_argument("--data")
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.data)
        return
    both = not (args.warm or args.first_fit)
    print(machine())
    result = {"machine": machine(), "cases": args.cases}
    with tempfile.TemporaryDirectory(prefix="dmp-small-") as folder:
        for case in args.cases:
            make_data(case, folder)
        if both or args.first_fit:
            print(f"first fit in a fresh process (medians of {args.fresh_repeats}):")
            result["first_fit"] = first_fit(args.cases, args.fresh_repeats, folder,
                                            args.baseline)
        if both or args.warm:
            print(f"after warm-up (medians of {args.repeats} interleaved repeats):")
            result["warm"] = warm(args.cases, args.repeats, folder)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
