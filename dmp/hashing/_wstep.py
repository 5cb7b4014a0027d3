"""The W step of the binary autoencoder: its submodels, each trained on one worker's points.

The encoder's L units are linear SVMs (one per bit: inputs x, labels z_l) and the decoder's D
units linear regressions (one per feature: inputs z, target x_d).  They are independent, so
ParMAC trains them concurrently, each travelling round the ring of workers; a unit's state
is its weights, bias and update count (the step-size schedule continues where the previous
worker left it).
"""

from __future__ import annotations

import numpy as np

from dmp.kernels._jit import njit


def sgd_svm(W, bias, steps, X, Y, order, batch, lam, eta0):
    """One pass of minibatch SGD on the L2-regularised hinge loss for each unit.

    ``W`` (m, D), ``bias`` (m,), ``steps`` (m,) int64: the units, updated in place.
    ``X`` (N, D) points, ``Y`` (N, m) 0/1 labels (label column u for unit u), ``order`` the
    visiting order of the points.  Unit u minimises
    ``lam / 2 ||w||^2 + mean_n max(0, 1 - y_n (w x_n + b))`` with ``y = 2 z - 1`` and steps
    ``eta0 / (1 + eta0 lam t)``.

    The units are independent; each minibatch is gathered once into a contiguous buffer
    and reused by every unit (the points are visited in random order: reading them once per
    unit cost a cache miss per point and unit).
    """
    m, D = W.shape
    _sgd_svm(W, bias, steps, X, Y, order, batch, lam, eta0, np.empty(D), np.empty((batch, D)),
             np.empty((batch, m)))


# (the `_` kernels below take their arrays from their callers: dmp.kernels._jit)
@njit(cache=True, nogil=True, fastmath=True)
def _sgd_svm(W, bias, steps, X, Y, order, batch, lam, eta0, g, xb, yb):
    m, D = W.shape
    N = order.shape[0]
    for s in range(0, N, batch):
        e = min(s + batch, N)
        nb = e - s
        for j in range(nb):
            n = order[s + j]
            for d in range(D):
                xb[j, d] = X[n, d]
            for u in range(m):
                yb[j, u] = 2.0 * Y[n, u] - 1.0
        inv = 1.0 / nb
        for u in range(m):
            g[:] = 0.0
            gb = 0.0
            for j in range(nb):
                y = yb[j, u]
                f = bias[u]
                for d in range(D):
                    f += W[u, d] * xb[j, d]
                if y * f < 1.0:
                    for d in range(D):
                        g[d] -= y * xb[j, d]
                    gb -= y
            eta = eta0 / (1.0 + eta0 * lam * steps[u])
            for d in range(D):
                W[u, d] -= eta * (lam * W[u, d] + g[d] * inv)
            bias[u] -= eta * gb * inv
            steps[u] += 1


def sgd_linear(W, bias, steps, Z, X, cols, order, batch, lam, eta0):
    """One pass of minibatch SGD on the squared error for each decoder unit.

    ``W`` (m, L), ``bias`` (m,), ``steps`` (m,) int64: units updated in place; unit u
    predicts feature ``cols[u]`` of the points ``X`` (N, D) from their codes ``Z`` (N, L),
    minimising ``lam / 2 ||w||^2 + mean_n (x_n - w z_n - b)^2 / 2`` with steps
    ``eta0 / (1 + eta0 lam t)``.  Minibatches are gathered once for all units.
    """
    m, L = W.shape
    _sgd_linear(W, bias, steps, Z, X, cols, order, batch, lam, eta0, np.empty(L),
                np.empty((batch, L)), np.empty((batch, m)))


@njit(cache=True, nogil=True, fastmath=True)
def _sgd_linear(W, bias, steps, Z, X, cols, order, batch, lam, eta0, g, zb, tb):
    m, L = W.shape
    N = order.shape[0]
    for s in range(0, N, batch):
        e = min(s + batch, N)
        nb = e - s
        for j in range(nb):
            n = order[s + j]
            for l in range(L):
                zb[j, l] = Z[n, l]
            for u in range(m):
                tb[j, u] = X[n, cols[u]]
        inv = 1.0 / nb
        for u in range(m):
            g[:] = 0.0
            gb = 0.0
            for j in range(nb):
                r = bias[u] - tb[j, u]
                for l in range(L):
                    r += W[u, l] * zb[j, l]
                for l in range(L):
                    g[l] += r * zb[j, l]
                gb += r
            eta = eta0 / (1.0 + eta0 * lam * steps[u])
            for l in range(L):
                W[u, l] -= eta * (lam * W[u, l] + g[l] * inv)
            bias[u] -= eta * gb * inv
            steps[u] += 1


def decoder_normal_equations(X, Z):
    """``(G, F)``: ``G = [Z 1]^T [Z 1]`` and ``F = [Z 1]^T X``, the sums a worker contributes
    to the decoder's least-squares fit (added over workers, solved once)."""
    Z1 = np.hstack([np.asarray(Z, dtype=np.float64), np.ones((len(Z), 1))])
    return Z1.T @ Z1, Z1.T @ np.asarray(X, dtype=np.float64)


def solve_decoder(G, F, ridge: float = 1e-8):
    """``(B, b)`` minimising ``sum_n ||x_n - B z_n - b||^2`` from the summed normal equations
    (a tiny ridge keeps bits that never change solvable)."""
    L1 = G.shape[0]
    scale = max(float(np.trace(G)) / L1, 1.0)
    theta = np.linalg.solve(G + ridge * scale * np.eye(L1), F)      # (L + 1, D)
    return np.ascontiguousarray(theta[:-1].T), theta[-1].copy()


def encode(X, W, bias) -> np.ndarray:
    """``h(x) = step(W x + bias)`` as uint8 codes (points x bits)."""
    return (np.asarray(X, dtype=np.float64) @ W.T + bias > 0).astype(np.uint8)


def dcd_svm(W, bias, alpha, X, xsq, Y, order, C, beta):
    """One pass of dual coordinate descent (Hsieh et al. 2008, LIBLINEAR's solver of the
    L2-loss linear SVM) for each unit, over the points in ``order``.

    Unit u minimises ``1/2 (||w||^2 + (b / beta)^2) + C sum_n max(0, 1 - y_n (w x_n + b))^2``
    with ``y = 2 z - 1`` (the bias is a regularised weight on a constant feature ``beta``,
    as LIBLINEAR's ``-B beta``) through its duals ``alpha`` (N, m), one per point and
    unit, with ``w = sum_n alpha_n y_n x_n`` and ``b = beta^2 sum_n alpha_n y_n``.  ``W``
    (m, D), ``bias`` (m,), ``alpha`` are updated in place and must be consistent on entry
    (``alpha = 0`` with ``W = 0``, ``bias = 0`` to start).  ``xsq`` (N,) holds ``||x_n||^2``,
    ``Y`` (N, m) the 0/1 labels.  Each point is read once for all units.  Returns the largest
    projected-gradient magnitude met (LIBLINEAR's stopping measure).
    """
    return _dcd_svm(W, bias, alpha, X, xsq, Y, order, C, beta, np.empty(W.shape[1]))


@njit(cache=True, nogil=True, fastmath=True)
def _dcd_svm(W, bias, alpha, X, xsq, Y, order, C, beta, xb):
    m, D = W.shape
    N = order.shape[0]
    half_c = 0.5 / C
    b2 = beta * beta
    pg_max = 0.0
    for s in range(N):
        n = order[s]
        for d in range(D):
            xb[d] = X[n, d]
        qii = xsq[n] + b2 + half_c
        for u in range(m):
            y = 2.0 * Y[n, u] - 1.0
            f = bias[u]
            for d in range(D):
                f += W[u, d] * xb[d]
            a0 = alpha[n, u]
            g = y * f - 1.0 + half_c * a0
            pg = g if a0 > 0.0 else min(g, 0.0)
            if pg == 0.0:
                continue
            if abs(pg) > pg_max:
                pg_max = abs(pg)
            a1 = max(a0 - g / qii, 0.0)
            step = (a1 - a0) * y
            if step != 0.0:
                alpha[n, u] = a1
                for d in range(D):
                    W[u, d] += step * xb[d]
                bias[u] += step * b2
    return pg_max


@njit(cache=True, nogil=True)
def dcd_relabel(W, bias, alpha, X, Yold, Ynew, beta):
    """Labels that changed (``Yold != Ynew``): their duals are reset to 0 and their terms
    taken out of ``W``, ``bias``, so that the duals stay consistent with the new labels (the
    warm start of the next W step).  Returns the number of duals reset."""
    m, D = W.shape
    N = X.shape[0]
    b2 = beta * beta
    reset = 0
    for n in range(N):
        for u in range(m):
            if Yold[n, u] != Ynew[n, u]:
                a0 = alpha[n, u]
                if a0 != 0.0:
                    step = -a0 * (2.0 * Yold[n, u] - 1.0)
                    for d in range(D):
                        W[u, d] += step * X[n, d]
                    bias[u] += step * b2
                    alpha[n, u] = 0.0
                    reset += 1
    return reset
