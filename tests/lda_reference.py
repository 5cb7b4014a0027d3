"""Plain numpy / Python collapsed Gibbs sampling for LDA: the references of tests/test_lda.py.

Written from the formulas (docs/algorithms.md, "Collapsed Gibbs conditional"), not from the
Numba kernels: one token at a time, the conditional ``(n_dk + a)(n_wk + b)/(n_k + V b)`` and
its inverse CDF.  The sparse variant reproduces the bucket order of STRADS' "sample by word"
(document bucket over the document's topic list, then the dense bucket) so that it consumes
uniforms identically.
"""

from __future__ import annotations

import math

import numpy as np


def conditional(n_dk_row, n_wk_row, n_k, alpha, beta, vbeta):
    return (n_dk_row + alpha) * (n_wk_row + beta) / (n_k + vbeta)


def dense_sweep(tok_doc, tok_word, z, n_dk, n_wk, n_k, u, alpha, beta, vbeta):
    """One O(K) sweep in token order (``u`` one uniform per token); each token's inverse CDF
    runs over its old topic first, then the others in topic order."""
    Kt = n_k.shape[0]
    # the old topic first, then the others in topic order
    orders = [np.concatenate([[k], np.delete(np.arange(Kt), k)]) for k in range(Kt)]
    for i in range(len(tok_doc)):
        d, w, k = tok_doc[i], tok_word[i], z[i]
        n_dk[d, k] -= 1
        n_wk[w, k] -= 1
        n_k[k] -= 1
        order = orders[k]
        cdf = np.cumsum(conditional(n_dk[d], n_wk[w], n_k, alpha, beta, vbeta)[order])
        # the first interval whose upper end lies above the uniform's point
        j = int(np.searchsorted(cdf, u[i] * cdf[-1], side="right"))
        k = int(order[j]) if j < Kt else Kt - 1
        z[i] = k
        n_dk[d, k] += 1
        n_wk[w, k] += 1
        n_k[k] += 1


def _join_topic(lst, n_dk, d, k_old, k):
    """The token (taken off ``k_old``) joins topic ``k`` of document ``d`` whose topic list
    is ``lst``: a new topic takes the old one's emptied place, else goes at the end; an old
    topic left at zero is then replaced by the last entry."""
    if k not in lst:
        if n_dk[d, k_old] == 0:
            lst[lst.index(k_old)] = k
        else:
            lst.append(k)
    n_dk[d, k] += 1
    if n_dk[d, k_old] == 0 and k_old in lst:
        j = lst.index(k_old)
        lst[j] = lst[-1]
        lst.pop()


def sparse_sweep(tok_doc, tok_word, z, n_dk, n_wk, n_k, u, alpha, beta, vbeta, doc_topics):
    """One sweep of the two-bucket sampler; ``doc_topics[d]`` is the list of d's topics,
    updated as the kernel does: the token's old topic stays listed (with its count less one)
    during the draw; then a new topic takes the old one's place if that count is zero, else
    goes at the end, and an old topic left at zero is replaced by the last entry.  Words must come in runs (word-major order)."""
    Kt = n_k.shape[0]
    w_prev = -1
    phi = np.zeros(Kt)
    X = 0.0
    for i in range(len(tok_doc)):
        d, w, k = tok_doc[i], tok_word[i], z[i]
        if w != w_prev:
            X = 0.0
            for j in range(Kt):
                phi[j] = (n_wk[w, j] + beta) / (n_k[j] + vbeta)
                X += phi[j]
            X *= alpha
            w_prev = w
        n_dk[d, k] -= 1
        n_wk[w, k] -= 1
        n_k[k] -= 1
        k_old = k
        lst = doc_topics[d]            # the old topic stays listed during the draw
        old = phi[k]
        phi[k] = (n_wk[w, k] + beta) / (n_k[k] + vbeta)
        X += alpha * (phi[k] - old)
        Y = 0.0
        cum = []
        for t in lst:
            Y += n_dk[d, t] * phi[t]
            cum.append(Y)
        target = u[i] * (X + Y)
        if target < Y:
            k = lst[-1]
            for j, c in enumerate(cum):
                if target < c:
                    k = lst[j]
                    break
        else:
            target = (target - Y) / alpha
            k = Kt - 1
            acc = 0.0
            for j in range(Kt):
                acc += phi[j]
                if target < acc:
                    k = j
                    break
        z[i] = k
        _join_topic(lst, n_dk, d, k_old, k)
        n_wk[w, k] += 1
        n_k[k] += 1
        old = phi[k]
        phi[k] = (n_wk[w, k] + beta) / (n_k[k] + vbeta)
        X += alpha * (phi[k] - old)



def bucket_sweep(tok_doc, tok_word, z, n_dk, n_wk, n_k, u, alpha, beta, vbeta, doc_topics):
    """One sweep of the three-bucket sampler: ``p(k)`` split into the document bucket
    ``n_dk (n_wk + b) g_k``, the word bucket ``a n_wk g_k`` and the smoothing bucket
    ``a b g_k`` (``g_k = 1 / (n_k + V b)``), drawn in that order.  The document's topic list
    is kept as in `sparse_sweep`; the word's list holds the topics of its row when the word
    starts, in increasing order, then each topic new to the row at the end; the bucket
    totals are kept up to date as the kernel keeps them (same sums in the same order)."""
    Kt = n_k.shape[0]
    g = [1.0 / (n_k[k] + vbeta) for k in range(Kt)]
    gsum = 0.0
    for k in range(Kt):
        gsum += g[k]
    ab = alpha * beta
    w_prev = -1
    wlist, wval, W = [], [], 0.0
    for i in range(len(tok_doc)):
        d, w, k_old = tok_doc[i], tok_word[i], z[i]
        if w != w_prev:
            wlist = [k for k in range(Kt) if n_wk[w, k] != 0]
            wval = [n_wk[w, k] * g[k] for k in wlist]
            W = 0.0
            for v in wval:
                W += v
            w_prev = w
        n_dk[d, k_old] -= 1
        n_wk[w, k_old] -= 1
        n_k[k_old] -= 1
        old = g[k_old]
        g[k_old] = 1.0 / (n_k[k_old] + vbeta)
        gsum += g[k_old] - old
        j = wlist.index(k_old)
        old = wval[j]
        wval[j] = n_wk[w, k_old] * g[k_old]
        W += wval[j] - old
        lst = doc_topics[d]
        Y = 0.0
        cum = []
        for t in lst:
            Y += n_dk[d, t] * ((n_wk[w, t] + beta) * g[t])
            cum.append(Y)
        aW = alpha * W
        target = u[i] * (Y + aW + ab * gsum)
        if target < Y:
            k = lst[min(sum(c <= target for c in cum), len(lst) - 1)]
        else:
            target -= Y
            if target < aW:
                hit = np.flatnonzero(target / alpha < np.cumsum(wval))
                k = wlist[int(hit[0]) if len(hit) else len(wlist) - 1]
            else:
                hit = np.flatnonzero((target - aW) / ab < np.cumsum(g))
                k = int(hit[0]) if len(hit) else Kt - 1
        z[i] = k
        _join_topic(lst, n_dk, d, k_old, k)
        n_wk[w, k] += 1
        n_k[k] += 1
        old = g[k]
        g[k] = 1.0 / (n_k[k] + vbeta)
        gsum += g[k] - old
        if k not in wlist:
            wlist.append(k)
            wval.append(0.0)
        j = wlist.index(k)
        old = wval[j]
        wval[j] = n_wk[w, k] * g[k]
        W += wval[j] - old

def log_joint(n_dk, n_wk, alpha, beta):
    """log p(w, z) (Griffiths and Steyvers), with scipy-free lgamma over all entries."""
    lg = np.vectorize(math.lgamma)
    D, Kt = n_dk.shape
    V = n_wk.shape[0]
    N_d = n_dk.sum(axis=1)
    n_k = n_wk.sum(axis=0)
    doc = (D * math.lgamma(Kt * alpha) - lg(N_d + Kt * alpha).sum()
           + (lg(n_dk + alpha) - math.lgamma(alpha)).sum())
    word = (Kt * math.lgamma(V * beta) - lg(n_k + V * beta).sum()
            + (lg(n_wk + beta) - math.lgamma(beta)).sum())
    return float(doc + word)


def serial_cgs(X, n_topics, alpha, beta, n_sweeps, seed=0):
    """Plain collapsed Gibbs sampling in document order, numpy RNG; returns
    (log-likelihood per token after each sweep, n_wk)."""
    import scipy.sparse as sp

    X = sp.csr_matrix(X)
    rng = np.random.default_rng(seed)
    counts = X.data.astype(np.int64)
    tok_doc = np.repeat(np.repeat(np.arange(X.shape[0]), np.diff(X.indptr)), counts)
    tok_word = np.repeat(X.indices, counts)
    z = rng.integers(0, n_topics, len(tok_doc))
    n_dk = np.zeros((X.shape[0], n_topics), dtype=np.int64)
    n_wk = np.zeros((X.shape[1], n_topics), dtype=np.int64)
    np.add.at(n_dk, (tok_doc, z), 1)
    np.add.at(n_wk, (tok_word, z), 1)
    n_k = n_wk.sum(axis=0)
    vbeta = X.shape[1] * beta
    lls = []
    for _ in range(n_sweeps):
        dense_sweep(tok_doc, tok_word, z, n_dk, n_wk, n_k, rng.random(len(z)), alpha, beta,
                    vbeta)
        lls.append(log_joint(n_dk, n_wk, alpha, beta) / len(z))
    return np.array(lls), n_wk
