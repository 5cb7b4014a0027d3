#!/usr/bin/env python
"""How the Lasso's block-Jacobi combination scales with the number of partitions.

In-process backend (no messaging cost, partitions run one after the other), so the numbers
isolate the algorithm: rounds and critical-path compute (per round the slowest partition's
push time, summed) to reach relative suboptimality 1e-6, for 1 and 2 partitions.  Compare the
2-partition critical compute with the kernel time of a 2-worker Dask fit
(``benchmarks/lasso.py --problem b``) to see what running the two partitions at the same time
on one machine costs.

    python benchmarks/lasso_partitions.py          # (a) and a 50k x 500k problem
    python benchmarks/lasso_partitions.py --big    # also (b): 100k x 1M, 250M nnz (~10 GB RAM)
"""

import argparse

import numpy as np

from dmp.io import make_sparse_lasso
from dmp.linear_model import Lasso

PROBLEMS = [("(a) 10k x 100k, 1M nnz", dict(), (0.1, 0.01)),
            ("50k x 500k, 5M nnz", dict(n=50_000, p=500_000, density=2e-4), (0.1, 0.01))]
BIG = ("(b) 100k x 1M, 250M nnz", dict(n=100_000, p=1_000_000, density=2.5e-3), (0.01,))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", action="store_true", help="also problem (b) (slow, ~10 GB RAM)")
    args = ap.parse_args(argv)
    problems = PROBLEMS + ([BIG] if args.big else [])
    print(f"{'problem':26s} {'alpha':>6s} {'P':>2s} {'rounds':>7s} {'critical s':>11s} "
          f"{'total compute s':>16s}", flush=True)
    for name, kw, ratios in problems:
        X, y, _ = make_sparse_lasso(**kw)
        amax = np.abs(X.T @ y).max() / X.shape[0]
        Lasso(alpha=amax, fit_intercept=False, backend="local").fit(X[:, :1000], y)  # warm-up
        for ratio in ratios:
            fits = {P: Lasso(alpha=ratio * amax, fit_intercept=False, tol=1e-7,
                             backend="local", n_workers=P, random_state=0).fit(X, y)
                    for P in (1, 2)}
            best = min(e.objective_ for e in fits.values())
            for P, est in fits.items():
                h = est.history_
                i = int(np.argmax((h["objective"] - best) / best <= 1e-6))
                push = np.asarray(h["push_s"][: i + 1])
                print(f"{name:26s} {ratio:6.2f} {P:2d} {i + 1:7d} "
                      f"{push.max(axis=1).sum():11.2f} {push.sum():16.2f}", flush=True)


if __name__ == "__main__":
    main()
