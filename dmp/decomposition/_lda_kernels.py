"""Numba kernels of collapsed Gibbs sampling for LDA (word-major, one word block at a time).

Tokens of a partition are sorted by (word block, word row, document).  A kernel call samples
the tokens ``[t0, t1)``, all of whose words lie in the block whose word-topic rows ``n_wk`` the
partition holds, using one uniform number per token (drawn by the caller, so that every
backend and the numpy reference in the tests consume the same stream).

Two samplers draw from the same conditional
``p(z = k) ∝ (n_dk + alpha) (n_wk + beta) / (n_k + V beta)`` (counts without the token):

* ``dense``: inverse CDF over the K topics in order, O(K) per token (the reference);
* ``sparse`` (STRADS "sample by word"): for the current word, ``phi_k = (n_wk + beta) /
  (n_k + V beta)`` and the dense bucket ``X = alpha sum_k phi_k`` are kept up to date
  incrementally; the document bucket ``Y = sum_{k: n_dk > 0} n_dk phi_k`` runs over the
  document's nonzero topics only.  ``u < Y`` picks among the document's topics, otherwise
  ``k`` is found in the dense bucket.  Cost O(K_d) per token plus O(K) when the dense bucket
  is hit (probability about ``alpha K / (N_d + alpha K)``) and O(K) once per word.

The nonzero topics of each document are kept in ``dnz_topics[dnz_ptr[d]:dnz_ptr[d] + dnz_cnt[d]]``
(capacity ``min(K, N_d)``); removal swaps with the last entry, so the order is part of the
sampler's state (the numpy reference reproduces it).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _dnz_remove(dnz_topics, dnz_ptr, dnz_cnt, d, k):
    base = dnz_ptr[d]
    n = dnz_cnt[d]
    for j in range(n):
        if dnz_topics[base + j] == k:
            dnz_topics[base + j] = dnz_topics[base + n - 1]
            dnz_cnt[d] = n - 1
            return


@njit(cache=True, nogil=True)
def build_doc_topics(n_dk, dnz_ptr, dnz_topics, dnz_cnt):
    """Fill the per-document nonzero-topic lists from ``n_dk`` (topics in increasing order)."""
    D, K = n_dk.shape
    for d in range(D):
        c = 0
        base = dnz_ptr[d]
        for k in range(K):
            if n_dk[d, k] > 0:
                dnz_topics[base + c] = k
                c += 1
        dnz_cnt[d] = c


@njit(cache=True, nogil=True)
def count_block(t0, t1, tok_row, tok_doc, z, n_wk):
    """Add the topic counts of tokens ``[t0, t1)`` to the block's word-topic rows."""
    for i in range(t0, t1):
        n_wk[tok_row[i], z[i]] += 1


@njit(cache=True, nogil=True)
def sample_dense(t0, t1, tok_row, tok_doc, z, n_dk, n_wk, n_k, u, alpha, beta, vbeta,
                 dnz_ptr, dnz_topics, dnz_cnt, cdf):
    """O(K) collapsed Gibbs sweep over tokens ``[t0, t1)`` (the reference sampler)."""
    K = n_k.shape[0]
    for i in range(t0, t1):
        d = tok_doc[i]
        w = tok_row[i]
        k = z[i]
        n_dk[d, k] -= 1
        n_wk[w, k] -= 1
        n_k[k] -= 1
        if n_dk[d, k] == 0:
            _dnz_remove(dnz_topics, dnz_ptr, dnz_cnt, d, k)
        total = 0.0
        for j in range(K):
            total += (n_dk[d, j] + alpha) * (n_wk[w, j] + beta) / (n_k[j] + vbeta)
            cdf[j] = total
        target = u[i - t0] * total
        k = K - 1
        for j in range(K):
            if target < cdf[j]:
                k = j
                break
        z[i] = k
        if n_dk[d, k] == 0:
            dnz_topics[dnz_ptr[d] + dnz_cnt[d]] = k
            dnz_cnt[d] += 1
        n_dk[d, k] += 1
        n_wk[w, k] += 1
        n_k[k] += 1


@njit(cache=True, nogil=True)
def sample_sparse(t0, t1, tok_row, tok_doc, z, n_dk, n_wk, n_k, u, alpha, beta, vbeta,
                  dnz_ptr, dnz_topics, dnz_cnt, phi, ybuf):
    """Sparse ("sample by word") collapsed Gibbs sweep over tokens ``[t0, t1)``."""
    K = n_k.shape[0]
    X = 0.0
    w_prev = -1
    for i in range(t0, t1):
        d = tok_doc[i]
        w = tok_row[i]
        if w != w_prev:
            # new word: its phi and dense bucket from scratch (also bounds rounding drift)
            X = 0.0
            for j in range(K):
                phi[j] = (n_wk[w, j] + beta) / (n_k[j] + vbeta)
                X += phi[j]
            X *= alpha
            w_prev = w
        k = z[i]
        n_dk[d, k] -= 1
        n_wk[w, k] -= 1
        n_k[k] -= 1
        if n_dk[d, k] == 0:
            _dnz_remove(dnz_topics, dnz_ptr, dnz_cnt, d, k)
        old = phi[k]
        phi[k] = (n_wk[w, k] + beta) / (n_k[k] + vbeta)
        X += alpha * (phi[k] - old)
        base = dnz_ptr[d]
        nd = dnz_cnt[d]
        Y = 0.0
        for j in range(nd):
            t = dnz_topics[base + j]
            Y += n_dk[d, t] * phi[t]
            ybuf[j] = Y
        target = u[i - t0] * (X + Y)
        if target < Y:
            k = dnz_topics[base + nd - 1]
            for j in range(nd):
                if target < ybuf[j]:
                    k = dnz_topics[base + j]
                    break
        else:
            target = (target - Y) / alpha
            k = K - 1
            acc = 0.0
            for j in range(K):
                acc += phi[j]
                if target < acc:
                    k = j
                    break
        z[i] = k
        if n_dk[d, k] == 0:
            dnz_topics[base + nd] = k
            dnz_cnt[d] = nd + 1
        n_dk[d, k] += 1
        n_wk[w, k] += 1
        n_k[k] += 1
        old = phi[k]
        phi[k] = (n_wk[w, k] + beta) / (n_k[k] + vbeta)
        X += alpha * (phi[k] - old)


@njit(cache=True, nogil=True)
def doc_loglik(n_dk, doc_len, alpha, dnz_ptr, dnz_topics, dnz_cnt):
    """sum_d [lgG(K a) - lgG(N_d + K a) + sum_k (lgG(n_dk + a) - lgG(a))] (nonzeros only)."""
    D, K = n_dk.shape
    lg_a = math.lgamma(alpha)
    lg_ka = math.lgamma(K * alpha)
    total = 0.0
    for d in range(D):
        total += lg_ka - math.lgamma(doc_len[d] + K * alpha)
        base = dnz_ptr[d]
        for j in range(dnz_cnt[d]):
            total += math.lgamma(n_dk[d, dnz_topics[base + j]] + alpha) - lg_a
    return total


@njit(cache=True, nogil=True)
def word_loglik(n_wk, beta):
    """sum over the block's rows and topics of lgG(n_wk + b) - lgG(b) (nonzeros only)."""
    lg_b = math.lgamma(beta)
    total = 0.0
    R, K = n_wk.shape
    for r in range(R):
        for k in range(K):
            c = n_wk[r, k]
            if c > 0:
                total += math.lgamma(c + beta) - lg_b
    return total


@njit(cache=True, nogil=True)
def fold_in(doc_ptr, tok_word, phi_wk, alpha, n_iter, u, z, theta):
    """Gibbs fold-in with the topics fixed: ``p(z = k) ∝ (n_dk + alpha) phi_wk``.

    ``u`` holds ``n_iter`` uniforms per token (iteration-major); ``z`` the initial topics.
    ``theta`` (D x K) receives the doc-topic counts averaged over the second half of the
    iterations.
    """
    D = doc_ptr.shape[0] - 1
    K = phi_wk.shape[1]
    n_tok = tok_word.shape[0]
    cdf = np.empty(K)
    cnt = np.zeros(K)
    burn = n_iter // 2
    for d in range(D):
        cnt[:] = 0.0
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            cnt[z[i]] += 1.0
        for it in range(n_iter):
            for i in range(doc_ptr[d], doc_ptr[d + 1]):
                w = tok_word[i]
                cnt[z[i]] -= 1.0
                total = 0.0
                for j in range(K):
                    total += (cnt[j] + alpha) * phi_wk[w, j]
                    cdf[j] = total
                target = u[it * n_tok + i] * total
                k = K - 1
                for j in range(K):
                    if target < cdf[j]:
                        k = j
                        break
                z[i] = k
                cnt[k] += 1.0
            if it >= burn:
                for j in range(K):
                    theta[d, j] += cnt[j]
