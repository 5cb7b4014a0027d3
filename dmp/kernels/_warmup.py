"""Compile every Numba kernel once on tiny inputs (fills the on-disk cache).

Run ``python -m dmp.kernels._warmup`` before starting workers (CI, container builds): parallel
first compilation on several worker processes is slow and can race (numba#4807).
"""

import numpy as np
import scipy.sparse as sp

from . import lasso
from .sparse import csc_check, csc_column_stats


def warm_lasso() -> None:
    X = sp.random(6, 4, density=0.6, format="csc", random_state=0)
    indptr = X.indptr.astype(np.int64)
    indices = X.indices.astype(np.int32)
    data = X.data.astype(np.float64)
    n, p = X.shape
    sq = np.asarray(X.multiply(X).sum(0)).ravel()
    means = np.zeros(p)
    sums = np.asarray(X.sum(0)).ravel()
    w, r = np.zeros(p), np.ones(n)
    idx = np.arange(p, dtype=np.int64)
    out = np.empty(p)
    lasso.cd_sweep(indptr, indices, data, sq, means, sums, w, r, idx, 0.1, out)
    lasso.cd_sweeps(indptr, indices, data, sq, means, sums, w, r, idx, 0.1, 2, 1e-6, out)
    lasso.gather_columns(indptr, indices, data, idx)
    csc_column_stats(indptr, data)
    csc_check(indptr, indices, data, n)
    lasso.correlations(indptr, indices, data, r, out)
    lasso.dense_correlations(np.ones(n * p), n, r, out)
    full = np.arange(0, n * p + 1, n, dtype=np.int64)
    lasso.cd_sweep(full, indices, np.ones(n * p), sq, means, sums, w, r, idx, 0.1, out, True)
    lasso.cd_sweeps(full, indices, np.ones(n * p), sq, means, sums, w, r, idx, 0.1, 2, 1e-6,
                    out, True)
    lasso.gap_priorities(out, sq, w, 0.1, out.copy())
    lasso.block_matvec(indptr, indices, data, means, w, np.zeros(n))
    nnz = len(data)
    lasso.dependency_filter(indptr, indices, data, means, sq, idx, p, 0.5, float(n), 10 * nnz,
                            np.full(n, -1, np.int64), np.empty(nnz, np.int64),
                            np.empty(nnz, np.int64), np.empty(nnz), np.empty(p, np.int64))
    # the scheduler's priority sampling (`priority_sample`)
    prio = np.array([0.0, 1.0, 2.0, 0.0])
    live = np.flatnonzero(prio)
    lasso.priority_keys_top(prio, live, 0.1, 2, np.ones(2), np.ones(2), 2, np.empty(4),
                            np.empty(4, np.int64))
    lasso.uniform_settled(prio, np.ones(2), 1, np.empty(2, np.int64))


def warm_sparsify() -> None:
    from . import sparsify

    A = sp.random(6, 5, density=0.6, format="csr", random_state=0)
    args = (A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data.astype(np.float64),
            np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0]))
    x, g = np.zeros(6), np.zeros(6)
    bounds = np.array([0, 3, 6], dtype=np.int64)
    blocks = sparsify.tau_nice(0, 0, 0, 2, 1)
    rows = sparsify.tau_nice(0, 1, 0, 6, 2)
    for loss in (sparsify.SQUARED, sparsify.LOGISTIC):
        sparsify.loss_gradient(*args, x, loss, True, g)
        sparsify.loss_value(*args, x, loss, True)
        dense = np.ones((6, 5))
        sparsify.loss_gradient_dense(dense, args[3], x, loss, True, g)
        sparsify.loss_value_dense(dense, args[3], x, loss, True)
        sparsify.batch_gradient(*args, x, rows, loss, True, g)
        sparsify.saga_delta(*args, x, rows, loss, True, np.zeros((6, 2)),
                            np.array([0, 0, 0, 1, 1, 1], dtype=np.int64), bounds, blocks)
    sparsify.scatter_add_blocks(g, bounds, blocks,
                                sparsify.gather_blocks(g, bounds, blocks, 1.0), 1.0)
    sparsify.assign_blocks(x, bounds, blocks, sparsify.shift_delta(g, np.zeros(6), bounds, blocks))
    sparsify.prox_elastic_net(g, 0.1, 0.1, 0.1, 5, x)
    sparsify.row_sq_norms(args[0], args[2], True)


def warm_mf() -> None:
    from . import mf

    A = sp.random(6, 5, density=0.6, format="csr", random_state=0)
    indptr, indices = A.indptr.astype(np.int64), A.indices.astype(np.int32)
    res = A.data.astype(np.float64)
    F, lam = mf.uniform_init(0, 1, 0, 6, 3), np.full(6, 0.1)
    O, delta = mf.uniform_init(0, 1, 0, 5, 2), np.empty((6, 2))
    mf.ccd_block_update(indptr, indices, res, F, 1, O, lam, delta)
    mf.subtract_lowrank(indptr, indices, res, delta, 0, O)
    f, o, z = np.zeros(6), np.ones(5), np.zeros(5)
    for swap in (False, True):
        mf.rank1_row_pass(indptr, indices, res, swap, f, o, f, o, lam, f, z.copy(), z.copy())
        mf.rank1_column_sums(indptr, indices, res, swap, f, o, f, o, f, z.copy(), z.copy())
    mf.predict_pairs(F, F, np.arange(3), np.arange(3), 0.5)


def main() -> None:
    warm_lasso()
    warm_sparsify()
    warm_mf()


if __name__ == "__main__":
    main()
