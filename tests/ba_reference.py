"""Serial binary-autoencoder MAC with SGD W steps, in plain numpy (the reference ParMAC must
equal with one worker): scaling, ITQ, hinge-loss minibatch SGD per bit written with array
operations, the decoder by regularised normal equations, and the Z step by brute-force
enumeration of all 2^L codes.  It draws the same random numbers as the program (the initial
rotation, the partition's one-off point shuffle and each hop's minibatch order) and stores
the points in float32 like it."""

import numpy as np


def _scaled_itq_start(X32, L, seed, itq_iter, init_margin=None):
    """The program's start: the points scaled to [0, 1] by one common range (float32, as
    stored), their covariance and eigen-decomposition, and ITQ's hash function ``A, a`` on
    the scaled points."""
    X64 = X32.astype(np.float64)
    n = len(X64)
    lo = X64.min(axis=0)
    scale = float(np.max(X64.max(axis=0) - lo))
    mean_raw = X64.sum(axis=0) / n
    cov = ((X64.T @ X64) / n - np.outer(mean_raw, mean_raw)) / scale ** 2
    mean = (mean_raw - lo) / scale
    Xs = (X32 - lo.astype(np.float32)) * np.float32(1.0 / scale)
    evals, evecs = np.linalg.eigh(cov)
    W_pca = evecs[:, ::-1][:, :L]
    R, _ = np.linalg.qr(np.random.default_rng([seed, 4]).standard_normal((L, L)))
    V = (Xs - mean) @ W_pca
    for _ in range(itq_iter):
        U, _, Wt = np.linalg.svd(V.T @ np.where(V @ R >= 0, 1.0, -1.0))
        R = U @ Wt
    proj = W_pca @ R
    if init_margin is not None:       # each bit's A x + a with standard deviation init_margin
        proj = proj * (init_margin / np.sqrt(np.diag(proj.T @ cov @ proj)))
    return X64, lo, scale, cov, mean, Xs, evals, evecs, proj.T.copy(), -mean @ proj


def serial_ba_mac(X, *, n_bits, n_epochs, mu0, mu_factor, max_iter, batch, lam, seed,
                  itq_iter, init_margin=None):
    X32 = np.asarray(X, dtype=np.float32)
    # the partition's one-off shuffle of its points
    X32 = X32[np.random.default_rng([seed, 6, 0, 0]).permutation(len(X32))]
    L = n_bits
    X64, lo, scale, cov, mean, Xs, _, _, A, a = _scaled_itq_start(X32, L, seed, itq_iter,
                                                                 init_margin)
    n, D = X64.shape
    Z = ((Xs @ A.T + a) > 0).astype(np.float64)
    eta0 = 1.0 / (np.trace(cov) + mean @ mean + 1.0)
    steps = 0
    codes = np.array([[(c >> l) & 1 for l in range(L)] for c in range(2 ** L)], dtype=float)

    def decoder(Z):
        Z1 = np.hstack([Z, np.ones((n, 1))])
        G, F = Z1.T @ Z1, Z1.T @ Xs.astype(np.float64)
        ridge = 1e-8 * max(np.trace(G) / (L + 1), 1.0)
        theta = np.linalg.solve(G + ridge * np.eye(L + 1), F)
        return theta[:-1].T, theta[-1]

    B, b = decoder(Z)
    history = []
    for it in range(max_iter):
        mu = mu0 * mu_factor ** it
        # W step: e epochs of minibatch SGD for every bit's SVM (one worker: hop = epoch)
        Y = 2.0 * Z - 1.0
        for hop in range(n_epochs):
            # minibatches of consecutive points in random order, the partial one last
            blocks = np.random.default_rng([seed, 3, it, hop, 0]).permutation(n // batch)
            starts = [int(b) * batch for b in blocks] + ([n // batch * batch] if n % batch
                                                         else [])
            for s in starts:
                idx = np.arange(s, min(s + batch, n))
                Xb, Yb = Xs[idx].astype(np.float64), Y[idx]
                active = (Yb * (Xb @ A.T + a)) < 1.0             # (batch, L)
                gW = -(Yb * active).T @ Xb / len(idx)
                gb = -(Yb * active).sum(axis=0) / len(idx)
                eta = eta0 / (1.0 + eta0 * lam * steps)
                A -= eta * (lam * A + gW)
                a -= eta * gb
                steps += 1
        # Z step: every code of every point
        H = ((Xs @ A.T + a) > 0).astype(np.float64)
        rec = Xs.astype(np.float64)[:, None, :] - (codes @ B.T + b)[None, :, :]
        e = np.einsum("nkd,nkd->nk", rec, rec) + mu * (H @ (1 - codes.T) + (1 - H) @ codes.T)
        Z = codes[np.argmin(e, axis=1)]
        used = (B, b)               # the decoder of this Z step (the fitted model's)
        B, b = decoder(Z)
        history.append({"mu": mu, "penalty": int(np.sum(Z != H))})
        if np.array_equal(Z, H):
            break
    return {"A": A, "a": a, "B": used[0], "b": used[1], "Z": Z.astype(np.uint8), "X": X32,
            "lo": lo,
            "scale": scale, "history": history}


def serial_ba_mac_dcd(X, *, n_bits, n_epochs, mu0, mu_factor, max_iter, C, seed, itq_iter,
                      n_parts):
    """Serial MAC with the "dcd" W step: each bit's L2-loss SVM by dual coordinate descent,
    written in plain numpy, on centred, whitened points, visiting the points in the order a
    ring of ``n_parts`` workers does (unit ``u`` travels in group ``u mod P``; in hop ``h``
    it is on partition ``(u - h) mod P``, whose points it visits in that hop's random order;
    on its first visit in a W step the duals of labels that changed are reset).  The Z step
    by enumeration, the decoder by normal equations."""
    P, L = n_parts, n_bits
    X = np.asarray(X, dtype=np.float32)
    bounds = np.linspace(0, len(X), P + 1).round().astype(int)
    parts = [X[bounds[p]:bounds[p + 1]] for p in range(P)]
    parts = [Xp[np.random.default_rng([seed, 6, p, 0]).permutation(len(Xp))]
             for p, Xp in enumerate(parts)]
    starts = np.cumsum([0] + [len(Xp) for Xp in parts])
    X32 = np.concatenate(parts)
    X64, lo, scale, cov, mean, Xs, evals, evecs, A, a = _scaled_itq_start(X32, L, seed,
                                                                         itq_iter)
    n, D = X64.shape
    keep = evals > 1e-9 * evals.max()
    white = evecs[:, keep] / np.sqrt(evals[keep])
    U = (Xs - mean) @ white                           # what the SVMs see
    usq = np.einsum("ij,ij->i", U, U)
    Z = ((Xs @ A.T + a) > 0).astype(np.float64)
    Zw = Z.copy()                                     # the labels of the last W step
    Wt_, bt = np.zeros((L, U.shape[1])), np.zeros(L)  # units on whitened points
    alpha = np.zeros((n, L))
    codes = np.array([[(c >> l) & 1 for l in range(L)] for c in range(2 ** L)], dtype=float)

    def decoder(Z):
        Z1 = np.hstack([Z, np.ones((n, 1))])
        G, F = Z1.T @ Z1, Z1.T @ Xs.astype(np.float64)
        ridge = 1e-8 * max(np.trace(G) / (L + 1), 1.0)
        theta = np.linalg.solve(G + ridge * np.eye(L + 1), F)
        return theta[:-1].T, theta[-1]

    B, b = decoder(Z)
    history = []
    for it in range(max_iter):
        mu = mu0 * mu_factor ** it
        for u in range(L):
            g = u % P
            for h in range(n_epochs * P):
                p = (g - h) % P
                rows = starts[p] + np.random.default_rng([seed, 3, it, h, p]).permutation(
                    starts[p + 1] - starts[p])
                if h < P:     # first visit: reset the duals of flipped labels
                    for i in rows:
                        if Zw[i, u] != Z[i, u] and alpha[i, u] != 0:
                            y_old = 2 * Zw[i, u] - 1
                            Wt_[u] -= alpha[i, u] * y_old * U[i]
                            bt[u] -= alpha[i, u] * y_old
                            alpha[i, u] = 0.0
                        Zw[i, u] = Z[i, u]
                for i in rows:
                    y = 2 * Z[i, u] - 1
                    grad = y * (Wt_[u] @ U[i] + bt[u]) - 1 + alpha[i, u] / (2 * C)
                    new = max(alpha[i, u] - grad / (usq[i] + 1 + 1 / (2 * C)), 0.0)
                    Wt_[u] += (new - alpha[i, u]) * y * U[i]
                    bt[u] += (new - alpha[i, u]) * y
                    alpha[i, u] = new
        A = Wt_ @ white.T
        a = bt - A @ mean
        H = ((Xs @ A.T + a) > 0).astype(np.float64)
        rec = Xs.astype(np.float64)[:, None, :] - (codes @ B.T + b)[None, :, :]
        e = np.einsum("nkd,nkd->nk", rec, rec) + mu * (H @ (1 - codes.T) + (1 - H) @ codes.T)
        Z = codes[np.argmin(e, axis=1)]
        used = (B, b)
        B, b = decoder(Z)
        history.append({"mu": mu, "penalty": int(np.sum(Z != H))})
        if np.array_equal(Z, H):
            break
    return {"A": A, "a": a, "B": used[0], "b": used[1], "Z": Z.astype(np.uint8), "X": X32,
            "lo": lo, "scale": scale, "history": history}
