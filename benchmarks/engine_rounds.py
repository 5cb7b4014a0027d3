#!/usr/bin/env python
"""The engine's own cost per round and per fit on the in-process backend (one partition).

Run from the repository root (``PYTHONPATH`` picks the tree to measure)::

    python benchmarks/engine_rounds.py                 # every case, 7 repeats
    python benchmarks/engine_rounds.py --cases noop lasso --repeats 11

For each case the fit runs ``--repeats`` times after a warm-up; every method the runner calls
on the program (``schedule``, ``pull``, ``metrics``, ``converged``, ``needs_barrier``, ...
and, through the backend, ``push`` and ``apply``) is timed (``time.perf_counter``), and so
is the runner's round loop.  The engine's cost of a round is the loop's time less the
program's, divided by the rounds: what the runner, the backend and the partition's worker
add around the algorithm (payload sizes, history records, calls, bookkeeping).  It includes
the timers' own overhead (well under a microsecond per timed call, 6-8 calls a round).
Medians over the repeats; the machine's load average is printed (on a shared machine run
the trees alternately and compare medians).

Cases: ``noop`` (a program whose push and pull do almost nothing: 2,000 rounds), ``lasso``
(400 x 120 dense, tol 1e-6, as in ``benchmarks/small.py``), ``sgd`` (2,000 x 50, 20 epochs,
as there) and ``lda`` (gensim's Lee corpus, K = 20, 150 sweeps, as in
``benchmarks/lda_small.py``).  Also printed: the whole fit and, for the estimators, the
fit's time outside the round loop (validation, input preparation, partition and driver
set-up, the fitted attributes).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("noop", "lasso", "sgd", "lda")
#: what the runner calls on a program (driver side, and worker side through the backend)
PROGRAM_METHODS = ("schedule", "needs_barrier", "ring_inbox", "batch_rounds", "pull",
                   "metrics", "converged", "progress_postfix", "push", "apply", "receive")


def _noop_program():
    from dmp.engine.program import Broadcast, Message, Program

    @dataclass(frozen=True)
    class Plan(Message):
        round: int
        idx: np.ndarray

    @dataclass(frozen=True)
    class Part(Message):
        dr: tuple
        kept: np.ndarray
        value: float

    class Noop(Program):
        name = "noop"

        def partition_specs(self, n):
            return [{"k": k} for k in range(n)]

        def init_partition(self, spec):
            return {"x": np.zeros(8)}

        def start(self, n):
            self.driver = {"n": n, "objective": 0.0}

        def schedule(self, r):
            return [Plan(r, np.arange(4))] * self.driver["n"]

        def push(self, s, plan):
            return Part(("dense", s["x"]), plan.idx, 1.0)

        def pull(self, r, partials):
            self.driver["objective"] += 1.0
            return Broadcast(np.ones(8))

        def metrics(self):
            return {"objective": self.driver["objective"]}

    return Noop


class Timers:
    """Cumulative perf_counter seconds of wrapped callables, by label."""

    def __init__(self):
        self.acc: dict = {}
        self.calls: dict = {}

    def wrap(self, owner, name, label):
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.acc[label] = self.acc.get(label, 0.0) + time.perf_counter() - t0
                self.calls[label] = self.calls.get(label, 0) + 1

        setattr(owner, name, timed)

    def reset(self):
        self.acc.clear()
        self.calls.clear()


def _program_class(case):
    if case == "noop":
        return None
    if case == "lasso":
        from dmp.linear_model._lasso_program import LassoProgram
        return LassoProgram
    if case == "sgd":
        from dmp.linear_model._sparsified_program import SparsifiedProgram
        return SparsifiedProgram
    from dmp.decomposition._lda_program import LDAProgram
    return LDAProgram


def _fit_fn(case):
    """``fit() -> rounds`` for the case, its data made here."""
    rng = np.random.default_rng(0)
    if case == "noop":
        from dmp.engine import run
        from dmp.engine.backends import LocalBackend

        cls = _noop_program()
        _fit_fn.noop_cls = cls

        def fit():
            return run(cls(), LocalBackend(1), max_iter=2000).n_rounds
        return fit
    if case == "lasso":
        from dmp.linear_model import Lasso

        X = rng.standard_normal((400, 120))
        w = np.zeros(120)
        w[:12] = rng.standard_normal(12)
        y = X @ w + 0.1 * rng.standard_normal(400)
        alpha = float(np.abs((X - X.mean(0)).T @ (y - y.mean())).max() / len(y)) / 20

        def fit():
            return Lasso(alpha=alpha, tol=1e-6, random_state=0).fit(X, y).n_iter_
        return fit
    if case == "sgd":
        from dmp.linear_model import SparsifiedSGDClassifier

        X = rng.standard_normal((2000, 50))
        y = (X @ rng.standard_normal(50) + 0.5 * rng.standard_normal(2000) > 0).astype(int)

        def fit():
            est = SparsifiedSGDClassifier(loss="log_loss", alpha=1e-4, max_iter=20, tol=None,
                                          random_state=0).fit(X, y)
            return len(est.history_["round"])
        return fit
    import importlib.util

    spec = importlib.util.spec_from_file_location("lda_bench", os.path.join(HERE, "lda.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    X = mod.corpus("lee", False).tocsr()
    from dmp.decomposition import LatentDirichletAllocation

    def fit():
        est = LatentDirichletAllocation(20, doc_topic_prior=0.1, topic_word_prior=0.01,
                                        max_iter=150, backend="local", n_workers=1,
                                        random_state=0).fit(X)
        return len(est.history_["round"])
    return fit


def measure(case: str, repeats: int) -> dict:
    from dmp.engine import runner

    fit = _fit_fn(case)
    timers = Timers()
    cls = _program_class(case) or _fit_fn.noop_cls
    for name in PROGRAM_METHODS:
        if hasattr(cls, name):
            timers.wrap(cls, name, "program")
    timers.wrap(runner._Run, "_run_rounds", "loop")
    for _ in range(2):
        fit()
    per_round, outside, whole, rounds = [], [], [], 0
    for _ in range(repeats):
        timers.reset()
        t0 = time.perf_counter()
        rounds = fit()
        total = time.perf_counter() - t0
        loop, prog = timers.acc["loop"], timers.acc.get("program", 0.0)
        per_round.append((loop - prog) / rounds)
        outside.append(total - loop)
        whole.append(total)
    return {"rounds": rounds, "engine_us_per_round": 1e6 * statistics.median(per_round),
            "outside_loop_ms": 1e3 * statistics.median(outside),
            "fit_ms": 1e3 * statistics.median(whole)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    import dmp

    print(f"dmp from {os.path.dirname(dmp.__file__)}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in args.cases:
            r = measure(case, args.repeats)
            print(f"  {case:6s} rounds {r['rounds']:5d}  engine {r['engine_us_per_round']:7.1f} "
                  f"us/round  outside the loop {r['outside_loop_ms']:7.3f} ms  whole fit "
                  f"{r['fit_ms']:8.3f} ms", flush=True)
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
