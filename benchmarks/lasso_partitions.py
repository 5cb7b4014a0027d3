#!/usr/bin/env python
"""How the Lasso's block-Jacobi combination scales with the number of partitions.

In-process backend (no messaging cost), so the numbers isolate the algorithm: rounds and
critical-path compute (per round the slowest partition's push time, summed) to reach relative
suboptimality 1e-6, for 1 and 2 partitions.

    python benchmarks/lasso_partitions.py
"""

import numpy as np

from dmp.io import make_sparse_lasso
from dmp.linear_model import Lasso

PROBLEMS = [("(a) 10k x 100k, 1M nnz", dict()),
            ("50k x 500k, 5M nnz", dict(n=50_000, p=500_000, density=2e-4))]


def main():
    print(f"{'problem':26s} {'alpha':>6s} {'P':>2s} {'rounds':>7s} {'critical s':>11s} "
          f"{'total compute s':>16s}")
    for name, kw in PROBLEMS:
        X, y, _ = make_sparse_lasso(**kw)
        amax = np.abs(X.T @ y).max() / X.shape[0]
        Lasso(alpha=amax, fit_intercept=False, backend="local").fit(X[:, :1000], y)  # warm-up
        for ratio in (0.1, 0.01):
            fits = {P: Lasso(alpha=ratio * amax, fit_intercept=False, tol=1e-7,
                             backend="local", n_workers=P, random_state=0).fit(X, y)
                    for P in (1, 2)}
            best = min(e.objective_ for e in fits.values())
            for P, est in fits.items():
                h = est.history_
                i = int(np.argmax((h["objective"] - best) / best <= 1e-6))
                push = np.asarray(h["push_s"][: i + 1])
                print(f"{name:26s} {ratio:6.2f} {P:2d} {i + 1:7d} "
                      f"{push.max(axis=1).sum():11.2f} {push.sum():16.2f}")


if __name__ == "__main__":
    main()
