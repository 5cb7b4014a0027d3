"""Synthetic sparse Lasso problems (STRADS-style, p >> n), low-rank ratings and LDA corpora."""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp

from ..utils.text import shown

__all__ = ["make_hashing_mixture", "make_sparse_lasso", "make_correlated_lasso", "lasso_alpha_max", "make_ratings",
           "make_lda_corpus"]


def _check_int(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {shown(value)}")
    return int(value)


def _check_real(name, value, low, high, low_open=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not np.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {shown(value)}")
    if value < low or value > high or (low_open and value == low):
        lo = "(" if low_open else "["
        raise ValueError(f"{name} must be in {lo}{low}, {high}], got {shown(value)}")
    return float(value)


def make_sparse_lasso(n=10_000, p=100_000, density=1e-3, frac_nz=0.01, noise_rel=0.1,
                      seed=0):
    """Random sparse Lasso problem with i.i.d. N(0, 1) entries at uniform positions.

    Parameters
    ----------
    n, p : int
        Number of samples and features.
    density : float
        Expected fraction of stored entries (``round(density * n * p)`` draws; duplicate
        positions are summed).
    frac_nz : float
        Fraction of nonzero coefficients in the true ``beta``.
    noise_rel : float
        Noise standard deviation relative to ``std(X @ beta)``.
    seed : int
        Seed of `numpy.random.default_rng`.

    Returns
    -------
    X : scipy.sparse.csc_matrix, shape (n, p)
    y : numpy.ndarray, shape (n,)
    beta : numpy.ndarray, shape (p,)
    """
    _check_int("n", n)
    _check_int("p", p)
    _check_real("density", density, 0.0, 1.0)
    _check_real("frac_nz", frac_nz, 0.0, 1.0)
    _check_real("noise_rel", noise_rel, 0.0, np.inf)
    # Do not change anything below: it reproduces published anchor numbers bit for bit.
    rng = np.random.default_rng(seed)
    nnz = int(round(density * n * p))
    rows = rng.integers(0, n, nnz)
    cols = rng.integers(0, p, nnz)
    vals = rng.standard_normal(nnz)
    X = sp.coo_matrix((vals, (rows, cols)), shape=(n, p)).tocsc()
    X.sum_duplicates()
    X.sort_indices()
    k = int(round(frac_nz * p))
    support = rng.permutation(p)[:k]
    beta = np.zeros(p)
    beta[support] = rng.standard_normal(k)
    Xb = X @ beta
    y = Xb + noise_rel * Xb.std() * rng.standard_normal(n)
    return X, y, beta


def make_correlated_lasso(n=2_000, p=20_000, density=0.01, group_size=10, group_corr=0.8,
                          frac_nz=0.01, noise_rel=0.1, seed=0):
    """Sparse Lasso problem (p >> n) with groups of correlated columns.

    Consecutive groups of ``group_size`` columns share a latent sparse column ``z``
    (``max(1, round(density * n))`` rows, N(0, 1) values).  Each column of the group is
    ``sqrt(group_corr) * z + sqrt(1 - group_corr) * e`` on the latent support (``e``
    independent N(0, 1)), plus ``round(0.05 * support_size)`` independent N(0, 1)
    entries at random rows.  Columns of a group therefore have cosine similarity of
    about ``group_corr`` (slightly less, because of the extra entries); columns of
    different groups are nearly uncorrelated.

    Parameters
    ----------
    n, p : int
        Number of samples and features.
    density : float
        Fraction of rows in each latent support, in (0, 1].
    group_size : int
        Columns per group (the last group may be smaller).
    group_corr : float
        Target within-group correlation, in [0, 1].
    frac_nz : float
        Fraction of nonzero coefficients in the true ``beta`` (N(0, 1) values).
    noise_rel : float
        Noise standard deviation relative to ``std(X @ beta)``.
    seed : int
        Seed of `numpy.random.default_rng`.

    Returns
    -------
    X : scipy.sparse.csc_matrix, shape (n, p)
    y : numpy.ndarray, shape (n,)
    beta : numpy.ndarray, shape (p,)
    """
    n = _check_int("n", n)
    p = _check_int("p", p)
    density = _check_real("density", density, 0.0, 1.0, low_open=True)
    group_size = _check_int("group_size", group_size)
    group_corr = _check_real("group_corr", group_corr, 0.0, 1.0)
    frac_nz = _check_real("frac_nz", frac_nz, 0.0, 1.0)
    noise_rel = _check_real("noise_rel", noise_rel, 0.0, np.inf)

    rng = np.random.default_rng(seed)
    s = max(1, int(round(density * n)))
    n_extra = int(round(0.05 * s))
    a, b = np.sqrt(group_corr), np.sqrt(1.0 - group_corr)
    rows_l, cols_l, vals_l = [], [], []
    for c0 in range(0, p, group_size):
        gs = min(group_size, p - c0)
        support = rng.choice(n, size=s, replace=False)
        z = rng.standard_normal(s)
        v = a * z[None, :] + b * rng.standard_normal((gs, s))
        cols = np.arange(c0, c0 + gs)
        rows_l += [np.tile(support, gs), rng.integers(0, n, gs * n_extra)]
        cols_l += [np.repeat(cols, s), np.repeat(cols, n_extra)]
        vals_l += [v.ravel(), rng.standard_normal(gs * n_extra)]
    X = sp.coo_matrix((np.concatenate(vals_l), (np.concatenate(rows_l),
                                                np.concatenate(cols_l))),
                      shape=(n, p)).tocsc()
    X.sum_duplicates()
    X.eliminate_zeros()
    X.sort_indices()
    k = int(round(frac_nz * p))
    beta = np.zeros(p)
    beta[rng.permutation(p)[:k]] = rng.standard_normal(k)
    Xb = X @ beta
    y = Xb + noise_rel * Xb.std() * rng.standard_normal(n)
    return X, y, beta


def lasso_alpha_max(X, y, fit_intercept=False) -> float:
    """Smallest ``alpha`` for which the Lasso solution is zero.

    For the objective ``||y - X b||^2 / (2 n) + alpha ||b||_1`` this is
    ``||X^T y||_inf / n``, with ``y`` replaced by ``y - mean(y)`` when ``fit_intercept``
    (centring the columns of ``X`` as well gives the same value, since
    ``(X - 1 xbar)^T (y - ybar) = X^T (y - ybar)``).

    Parameters
    ----------
    X : array-like or sparse matrix, shape (n, p)
    y : array-like, shape (n,)
    fit_intercept : bool, default False

    Returns
    -------
    float
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1 or X.shape[0] != y.shape[0]:
        raise ValueError(f"X of shape {X.shape} and y of shape {y.shape} are incompatible")
    if fit_intercept:
        y = y - y.mean()
    g = X.T @ y
    return float(np.max(np.abs(np.asarray(g).ravel())) / X.shape[0])


def make_ratings(n_users=50_000, n_items=10_000, n_obs=2_000_000, rank=20, noise=0.5,
                 test_frac=0.1, seed=3):
    """Low-rank explicit ratings with Gaussian noise (matrix-factorisation benchmark).

    ``U`` and ``Vt`` have i.i.d. N(0, rank**-1/2) entries, so ``U[u] @ Vt[i]`` has unit
    variance; ``n_obs`` distinct (user, item) pairs are drawn uniformly and rated
    ``U[u] @ Vt[i] + noise * N(0, 1)``; a random ``test_frac`` of them forms the test set.

    Parameters
    ----------
    n_users, n_items : int
        Matrix shape.
    n_obs : int
        Number of ratings, at most ``n_users * n_items``.
    rank : int
        True rank.
    noise : float
        Noise standard deviation, >= 0.
    test_frac : float
        Fraction of the ratings in the test set, in [0, 1).
    seed : int
        Seed of `numpy.random.default_rng`.

    Returns
    -------
    train : tuple (users int32, items int32, ratings float64)
    test : tuple (users int32, items int32, ratings float64)
    U : numpy.ndarray, shape (n_users, rank)
    Vt : numpy.ndarray, shape (n_items, rank)
        The true factors (``Vt`` holds one row per item).
    """
    n_users = _check_int("n_users", n_users)
    n_items = _check_int("n_items", n_items)
    n_obs = _check_int("n_obs", n_obs)
    rank = _check_int("rank", rank)
    noise = _check_real("noise", noise, 0.0, np.inf)
    test_frac = _check_real("test_frac", test_frac, 0.0, 1.0)
    if test_frac >= 1.0:
        raise ValueError(f"test_frac must be in [0, 1), got {shown(test_frac)}")
    if n_users * n_items >= 2 ** 63:
        raise ValueError(f"n_users * n_items = {n_users * n_items} does not fit in int64")
    if n_obs > n_users * n_items:
        raise ValueError(f"n_obs = {n_obs} exceeds n_users * n_items = {n_users * n_items} "
                         "(the number of distinct pairs)")
    # Do not change anything below: it reproduces published anchor numbers bit for bit.
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((n_users, rank)) / rank ** 0.25
    Vt = rng.standard_normal((n_items, rank)) / rank ** 0.25
    keys = np.unique(rng.integers(0, n_users * n_items, int(n_obs * 1.05)))
    while len(keys) < n_obs:  # dense variants: top up (not reached for the default)
        extra = rng.integers(0, n_users * n_items, n_obs - len(keys) + n_obs // 10)
        keys = np.unique(np.concatenate([keys, extra]))
    keys = keys[rng.permutation(len(keys))[:n_obs]]
    u = (keys // n_items).astype(np.int32)
    i = (keys % n_items).astype(np.int32)
    r = np.einsum("ij,ij->i", U[u], Vt[i]) + noise * rng.standard_normal(n_obs)
    perm = rng.permutation(n_obs)
    nt = int(test_frac * n_obs)
    te, tr = perm[:nt], perm[nt:]
    return (u[tr], i[tr], r[tr]), (u[te], i[te], r[te]), U, Vt


def make_lda_corpus(n_docs=5_000, n_words=10_000, n_topics=50, doc_len=200, alpha=0.1,
                    beta=0.01, seed=2):
    """A corpus drawn from the LDA generative process (the defaults: benchmarks/lda.py's corpus).

    Topics ``phi_k ~ Dirichlet(beta)`` over ``n_words`` words, document mixtures
    ``theta_d ~ Dirichlet(alpha)``, document lengths ``Poisson(doc_len)`` (at least 1), each
    token's topic from ``theta_d`` and its word from ``phi_topic``.

    Returns
    -------
    X : scipy.sparse.csr_matrix of float64, shape (n_docs, n_words)
        Token counts.
    phi : ndarray (n_topics, n_words)
    theta : ndarray (n_docs, n_topics)
    """
    for name, v in (("n_docs", n_docs), ("n_words", n_words), ("n_topics", n_topics),
                    ("doc_len", doc_len)):
        _check_int(name, v)
    _check_real("alpha", alpha, 0, math.inf, low_open=True)
    _check_real("beta", beta, 0, math.inf, low_open=True)
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(n_words, beta), n_topics)
    theta = rng.dirichlet(np.full(n_topics, alpha), n_docs)
    lengths = np.maximum(rng.poisson(doc_len, n_docs), 1)
    doc = np.repeat(np.arange(n_docs), lengths)
    # each token's topic by inverse CDF of its document's mixture, then its word likewise
    cum_theta = np.cumsum(theta, axis=1)
    u = rng.random(len(doc))
    z = np.empty(len(doc), dtype=np.int64)
    # in pieces of about 32M comparisons: a token x topic table of a 10M-token corpus would
    # be gigabytes (the same draws as in one piece)
    step = max(1, 2**25 // n_topics)
    for t in range(0, len(doc), step):
        z[t:t + step] = (u[t:t + step, None] > cum_theta[doc[t:t + step]]).sum(axis=1)
    z = np.minimum(z, n_topics - 1)
    words = np.empty(len(doc), dtype=np.int64)
    cum_phi = np.cumsum(phi, axis=1)
    for k in range(n_topics):
        at = np.flatnonzero(z == k)
        words[at] = np.minimum(np.searchsorted(cum_phi[k], rng.random(len(at)), side="right"),
                               n_words - 1)
    X = sp.csr_matrix((np.ones(len(doc)), (doc, words)), shape=(n_docs, n_words))
    X.sum_duplicates()
    return X, phi, theta


def make_hashing_mixture(n=50_000, dim=64, n_clusters=50, decay=1.0, separation=2.0,
                         seed=4):
    """Gaussian-mixture feature vectors with a decaying spectrum, for hashing (float32).

    Direction ``j`` of a random rotation has scale ``(1 + j) ** -decay`` -- image
    descriptors (SIFT, GIST, CNN features) have such decaying principal variances, unlike an
    isotropic mixture, whose within-cluster neighbours no code can find better than chance.
    Cluster centres are drawn with ``separation`` times the within-cluster spread.

    Returns
    -------
    X : ndarray of float32, shape (n, dim)
    labels : ndarray of int64, shape (n,)
    """
    _check_int("n", n)
    _check_int("dim", dim)
    _check_int("n_clusters", n_clusters)
    _check_real("decay", decay, 0, np.inf)
    _check_real("separation", separation, 0, np.inf)
    rng = np.random.default_rng(seed)
    scale = (1.0 + np.arange(dim)) ** -float(decay)
    rotation, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    centres = rng.standard_normal((n_clusters, dim)) * scale * separation
    labels = rng.integers(0, n_clusters, n)
    X = (centres[labels] + rng.standard_normal((n, dim)) * scale) @ rotation
    return X.astype(np.float32), labels
