"""Plain numpy serial CCD / block ALS / CCD++ (one residual array, row by row, column by
column): the independent reference for the model-parallel MatrixFactorization."""

import numpy as np
import scipy.sparse as sp

from dmp.kernels.mf import uniform_init


def block_least_squares(O, e, x0, lam, cg_steps):
    """One row's block problem ``min |e + O x0 - O x|^2 + lam |x|^2``: textbook CG on the
    explicit normal equations from ``x0`` (``cg_steps`` steps), or ``np.linalg.solve`` when
    ``cg_steps`` is None; 0 for a row without entries."""
    if len(e) == 0:
        return np.zeros_like(x0)
    A = O.T @ O + lam * np.eye(len(x0))
    b = O.T @ (e + O @ x0)
    if cg_steps is None:
        return np.linalg.solve(A, b)
    x = x0.copy()
    r = b - A @ x
    p = r.copy()
    rr = r @ r
    for _ in range(cg_steps):
        if rr <= 0:
            break
        q = A @ p
        a = rr / (p @ q)
        x += a * p
        r -= a * q
        rr, rr_old = r @ r, rr
        p = r + (rr / rr_old) * p
    return x


def serial_mf(R, k, alpha, n_iter, seed, method="ccd", n_inner=1, center=True,
              reg_scaling="none", block_size=None, cg_steps=3):
    """Return (W, H, objective after every half-iteration / CCD++ half-pass, residuals).

    ``method="als"``: block ALS, blocks of ``block_size`` coordinates (all k by default),
    each row's block by `block_least_squares` (``cg_steps=None``: solved exactly)."""
    A = sp.csr_matrix(R)
    A.sort_indices()
    n, m = A.shape
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    cols = A.indices
    mu = A.data.mean() if center else 0.0
    e = A.data - mu
    W = np.zeros((n, k))
    H = uniform_init(seed, 1, 0, m, k)
    if method == "als":
        H = 0.1 * (H - 0.5)
    row_pos = [np.arange(A.indptr[i], A.indptr[i + 1]) for i in range(n)]
    col_pos = [np.flatnonzero(cols == j) for j in range(m)]
    if reg_scaling == "count":
        lam_r = alpha * np.array([len(p) for p in row_pos], float)
        lam_c = alpha * np.array([len(p) for p in col_pos], float)
    else:
        lam_r, lam_c = np.full(n, alpha), np.full(m, alpha)

    def objective():
        return e @ e + lam_r @ (W * W).sum(1) + lam_c @ (H * H).sum(1)

    def solve(num, den):
        return num / den if den > 0 else 0.0

    traj = []
    bs = block_size or k
    for _ in range(n_iter):
        if method == "als":
            for F, G, pos, other, lam in ((W, H, row_pos, cols, lam_r),
                                          (H, W, col_pos, rows, lam_c)):
                for k0 in range(0, k, bs):
                    blk = slice(k0, min(k, k0 + bs))
                    for i in range(len(pos)):
                        p = pos[i]
                        O = G[other[p], blk]
                        x = block_least_squares(O, e[p], F[i, blk], lam[i], cg_steps)
                        e[p] -= O @ (x - F[i, blk])
                        F[i, blk] = x
                traj.append(objective())
        elif method == "ccd":
            for i in range(n):
                p = row_pos[i]
                for t in range(k):
                    h, w = H[cols[p], t], W[i, t]
                    new = solve(np.sum((e[p] + w * h) * h), lam_r[i] + np.sum(h * h))
                    e[p] -= (new - w) * h
                    W[i, t] = new
            traj.append(objective())
            for j in range(m):
                p = col_pos[j]
                for t in range(k):
                    w, h = W[rows[p], t], H[j, t]
                    new = solve(np.sum((e[p] + h * w) * w), lam_c[j] + np.sum(w * w))
                    e[p] -= (new - h) * w
                    H[j, t] = new
            traj.append(objective())
        else:
            for t in range(k):
                e_hat = e + W[rows, t] * H[cols, t]
                for _ in range(n_inner):
                    for i in range(n):
                        h = H[cols[row_pos[i]], t]
                        W[i, t] = solve(e_hat[row_pos[i]] @ h, lam_r[i] + h @ h)
                    e = e_hat - W[rows, t] * H[cols, t]
                    traj.append(objective())
                    for j in range(m):
                        w = W[rows[col_pos[j]], t]
                        H[j, t] = solve(e_hat[col_pos[j]] @ w, lam_c[j] + w @ w)
                    e = e_hat - W[rows, t] * H[cols, t]
                    traj.append(objective())
    return W, H, np.array(traj), mu


def low_rank_ratings(n=300, m=200, k=3, density=0.3, noise=0.1, seed=0, test_frac=0.1):
    """Observed entries of U V^T + noise (U, V ~ N(0, 1/sqrt(k))) at random positions, split
    into train and test COO matrices."""
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((n, k)) / k ** 0.25
    V = rng.standard_normal((m, k)) / k ** 0.25
    mask = rng.random((n, m)) < density
    u, i = np.nonzero(mask)
    r = np.einsum("ij,ij->i", U[u], V[i]) + noise * rng.standard_normal(len(u))
    test = rng.random(len(u)) < test_frac
    tr = sp.coo_matrix((r[~test], (u[~test], i[~test])), shape=(n, m))
    te = sp.coo_matrix((r[test], (u[test], i[test])), shape=(n, m))
    return tr, te
