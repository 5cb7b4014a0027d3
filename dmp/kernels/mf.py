"""Numba kernels for matrix factorisation by coordinate descent (CCD and CCD++) and block ALS.

Conventions: a *local* sparse block is CSR over the rows this worker owns (or CSC over its
columns, which is the same thing with the roles of users and items swapped): ``indptr``
(int64), ``indices`` (int32, ids of the *other* side) and the residual ``res``
(``r_ij - w_i.h_j`` in the factors' precision: float64, or float32 for ALS and CCD),
updated in place.  Own factors are ``F`` (n_local x K, row per owned
user or item); the other side's factors arrive as a block ``O`` (n_other x B) holding its
coordinates ``k0 .. k0+B-1``, so that the block of one user or item is contiguous (one or two
cache lines per stored entry, whatever B is).
"""

from __future__ import annotations

import numpy as np
from ._jit import njit

from .sparsify import _splitmix64


#: coordinates per cache block: the rows O[j, c:c+CHUNK] of the other side's block that a
#: sweep touches stay in cache (CHUNK x n_other values instead of B x n_other)
CHUNK = 16

#: LLVM may reassociate sums and fuse multiply-adds (no assumptions about NaN or inf): what
#: lets it vectorise dot products over a row of coordinates.  Every reassociated sum is a
#: loop that only reads: in a loop that also stores, LLVM checks at run time that the
#: arrays do not overlap and else runs it serially, so the sum's order (and its rounding)
#: would depend on where the arrays lie, and fits would differ between processes
VECTORISE = {"reassoc", "contract"}


@njit(cache=True, nogil=True)
def _ccd_row(a, b, indices, res, F, i, k0, O, lam_i, delta, c0, c1):
    """CCD on coordinates ``k0+c0 .. k0+c1-1`` of one row (see `ccd_block_update`)."""
    w = F[i, k0 + c0]
    num = 0.0
    den = lam_i
    for p in range(a, b):
        h = O[indices[p], c0]
        num += (res[p] + w * h) * h
        den += h * h
    for kk in range(c0, c1):
        new = num / den if den > 0.0 else 0.0
        d = new - w
        delta[i, kk] = d
        F[i, k0 + kk] = new
        if kk + 1 < c1:
            w = F[i, k0 + kk + 1]
            num = 0.0
            den = lam_i
            for p in range(a, b):
                j = indices[p]
                r = res[p]
                if d != 0.0:
                    r -= d * O[j, kk]
                    res[p] = r
                h = O[j, kk + 1]
                num += (r + w * h) * h
                den += h * h
        elif d != 0.0:
            for p in range(a, b):
                res[p] -= d * O[indices[p], kk]


@njit(cache=True, nogil=True)
def ccd_block_update(indptr, indices, res, F, k0, O, lam, delta):
    """Exact CCD on coordinates ``k0 .. k0+B-1`` of every local row, in that order.

    ``f_ik <- sum_j (e_ij + f_ik o_kj) o_kj / (lam_i + sum_j o_kj^2)`` over the row's
    entries, then ``e_ij -= (f_ik^new - f_ik) o_kj``.  Rows are independent given ``O``, so
    this equals a row-by-row serial sweep.  ``delta`` (n_local x B) receives the changes.
    The residual update of coordinate k and the sums of coordinate k+1 share one pass, and
    all rows go through `CHUNK` coordinates before the next ones (same result per row).
    """
    n = indptr.shape[0] - 1
    B = O.shape[1]
    for c0 in range(0, B, CHUNK):
        c1 = min(B, c0 + CHUNK)
        for i in range(n):
            _ccd_row(indptr[i], indptr[i + 1], indices, res, F, i, k0, O, lam[i], delta,
                     c0, c1)


# (the `_` kernels below take their arrays from their callers: dmp.kernels._jit)
def subtract_lowrank(indptr, indices, res, X, xk0, Y):
    """``res_ij -= sum_kk X[i, xk0+kk] * Y[j, kk]`` for every stored entry.

    Brings a residual up to date after the other side changed (``Y`` = its deltas) or after
    this side changed (``X`` = own deltas, ``Y`` = the other side's block).  One dot product
    over a contiguous row of ``Y`` per entry (vectorised), summed in the residual's precision
    (float32 or float64).
    """
    _subtract_lowrank(indptr, indices, res, X, xk0, Y, res.dtype.type(0))


@njit(cache=True, nogil=True, fastmath=VECTORISE)
def _subtract_lowrank(indptr, indices, res, X, xk0, Y, zero):
    n = indptr.shape[0] - 1
    B = Y.shape[1]
    for i in range(n):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            s = zero
            for kk in range(B):
                s += X[i, xk0 + kk] * Y[j, kk]
            res[p] -= s


def cg_block_update(indptr, indices, res, F, k0, O, lam, delta, steps, ratings, mean, fresh):
    """Block ALS: each local row's least-squares problem in coordinates ``k0 .. k0+B-1``,
    approximately solved by ``steps`` conjugate-gradient steps from its current value.

    Row i minimises ``sum_j (e_ij + o_j . f_old - o_j . f)^2 + lam_i |f|^2`` over
    ``f = F[i, k0:k0+B]`` (``o_j`` = ``O[j]``, ``e`` = the residual ``res``): the normal
    equations ``(O_i^T O_i + lam_i I) f = O_i^T (e_i + O_i f_old)`` are never formed; each CG
    step costs one product with ``O_i`` and one with its transpose, over the row's entries
    (``steps >= B`` solves them exactly, up to rounding).  A row without entries gets
    ``f = 0``, as in exact CCD.  ``delta`` receives ``f - f_old`` and the residual is brought
    up to date without another pass over ``O``: ``o_j . (f - f_old)`` is the sum over the
    steps of ``alpha_s (o_j . p_s)``, whose dot products the steps already computed.

    ``fresh`` (with a block of all K coordinates, ``k0 = 0``): the residual is first
    recomputed as ``ratings - mean - f_old . o_j`` in the pass that reads ``o_j`` anyway, so
    that the other side's last update need not have been applied to ``res``.
    """
    B = O.shape[1]
    longest = int(np.max(np.diff(indptr))) if len(indptr) > 1 else 0
    # all arithmetic in O's precision: float32 factors run about twice as fast
    dt = O.dtype
    _cg_block_update(indptr, indices, res, F, k0, O, lam, delta, steps, ratings, mean, fresh,
                     dt.type(0), np.empty((steps, longest), dt), np.empty(steps, dt),
                     np.empty(B, dt), np.empty(B, dt), np.empty(B, dt), np.empty(B, dt))


@njit(cache=True, nogil=True, fastmath=VECTORISE)
def _cg_block_update(indptr, indices, res, F, k0, O, lam, delta, steps, ratings, mean, fresh,
                     zero, dots, step, x, r, pv, q):
    n = indptr.shape[0] - 1
    B = O.shape[1]
    for i in range(n):
        a = indptr[i]
        b = indptr[i + 1]
        li = lam[i]
        if a == b:
            for c in range(B):
                delta[i, c] = -F[i, k0 + c]
                F[i, k0 + c] = 0.0
            continue
        for c in range(B):
            x[c] = F[i, k0 + c]
            r[c] = -li * x[c]
        for p in range(a, b):
            j = indices[p]
            if fresh:
                t = zero
                for c in range(B):
                    t += x[c] * O[j, c]
                res[p] = ratings[p] - mean - t
            e = res[p]
            for c in range(B):
                r[c] += e * O[j, c]
        for c in range(B):
            pv[c] = r[c]
        rr = zero
        for c in range(B):
            rr += r[c] * r[c]
        done = 0
        for s in range(steps):
            if not rr > 0.0:
                break
            for c in range(B):
                q[c] = li * pv[c]
            for p in range(a, b):
                j = indices[p]
                t = zero
                for c in range(B):
                    t += O[j, c] * pv[c]
                dots[s, p - a] = t
                for c in range(B):
                    q[c] += t * O[j, c]
            pq = zero
            for c in range(B):
                pq += pv[c] * q[c]
            if not pq > 0.0:
                break
            al = rr / pq
            step[s] = al
            done = s + 1
            for c in range(B):
                x[c] += al * pv[c]
                r[c] -= al * q[c]
            rn = zero
            for c in range(B):
                rn += r[c] * r[c]
            be = rn / rr
            rr = rn
            for c in range(B):
                pv[c] = r[c] + be * pv[c]
        for c in range(B):
            delta[i, c] = x[c] - F[i, k0 + c]
            F[i, k0 + c] = x[c]
        if done:
            for p in range(a, b):
                t = zero
                for s in range(done):
                    t += step[s] * dots[s, p - a]
                res[p] -= t


@njit(cache=True, nogil=True, fastmath=VECTORISE)
def sum_squares(x):
    """``sum x^2`` accumulated in float64 (``x`` float32 or float64)."""
    s = 0.0
    for v in x:
        s += np.float64(v) * np.float64(v)
    return s


@njit(cache=True, nogil=True)
def rank1_row_pass(indptr, indices, res, swap, f_out, o_out, f_in, o, lam, f, num, den):
    """One CCD++ round on a worker's users, two loops over each row while it is in cache:

    1. if ``swap``: ``res_ij = (res_ij - f_out_i o_out_j) + f_in_i o_j`` (close the previous
       feature, open this one; ``o`` = this feature's current item values);
    2. ``f_i = sum_j res_ij o_j / (lam_i + sum_j o_j^2)`` (the user update);
    3. the items' partial sums with the new ``f``: ``num_j += res_ij f_i`` and
       ``den_j += f_i^2`` (added into the given arrays).

    Returns ``sum res_ij^2``; after the reduction the item update is
    ``h_j = sum num_j / (lam_j + sum den_j)`` and the exact loss
    ``sum res^2 - 2 h.num + (h*h).den``.
    """
    n = indptr.shape[0] - 1
    total = 0.0
    for i in range(n):
        a = indptr[i]
        b = indptr[i + 1]
        nm = 0.0
        oo = 0.0
        sq = 0.0
        if swap:
            a_out = f_out[i]
            a_in = f_in[i]
            for p in range(a, b):
                j = indices[p]
                h = o[j]
                r = (res[p] - a_out * o_out[j]) + a_in * h
                res[p] = r
                nm += r * h
                oo += h * h
                sq += r * r
        else:
            for p in range(a, b):
                h = o[indices[p]]
                r = res[p]
                nm += r * h
                oo += h * h
                sq += r * r
        d = lam[i] + oo
        v = nm / d if d > 0.0 else 0.0
        f[i] = v
        total += sq
        vv = v * v
        for p in range(a, b):
            j = indices[p]
            num[j] += res[p] * v
            den[j] += vv
    return total


@njit(cache=True, nogil=True)
def rank1_column_sums(indptr, indices, res, swap, f_out, o_out, f_in, o, f, num, den):
    """`rank1_row_pass` with the users' values ``f`` given (held-out ratings): the optional
    swap, then the items' partial sums; returns ``sum res^2``."""
    n = indptr.shape[0] - 1
    total = 0.0
    for i in range(n):
        v = f[i]
        vv = v * v
        if swap:
            a_out = f_out[i]
            a_in = f_in[i]
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            r = res[p]
            if swap:
                r = (r - a_out * o_out[j]) + a_in * o[j]
                res[p] = r
            num[j] += r * v
            den[j] += vv
            total += r * r
    return total


def uniform_init(seed, stream, start, n, K):
    """Rows ``start .. start+n-1`` of a (., K) matrix of U(0, 1) entries that depend only on
    ``(seed, stream, row, k)`` (the same values whatever the partitioning)."""
    out = np.empty((n, K))
    _uniform_fill(seed, stream, start, out)
    return out


@njit(cache=True, nogil=True)
def _uniform_fill(seed, stream, start, out):
    n, K = out.shape
    for i in range(n):
        state = np.uint64(seed) * np.uint64(0xD1B54A32D192ED03)
        state, _ = _splitmix64(state ^ np.uint64(stream))
        state = state * np.uint64(0x9E3779B97F4A7C15)
        state, _ = _splitmix64(state ^ np.uint64(start + i))
        for k in range(K):
            state, r = _splitmix64(state)
            out[i, k] = np.float64(r >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def predict_pairs(F, G, rows, cols, offset):
    """``offset + F[rows[t]] . G[cols[t]]`` for every pair t."""
    K = F.shape[1]
    out = np.empty(rows.shape[0])
    for t in range(rows.shape[0]):
        i = rows[t]
        j = cols[t]
        s = offset
        for k in range(K):
            s += F[i, k] * G[j, k]
        out[t] = s
    return out
