"""The LDA samplers' chains: long-run frequencies of the topic assignments of a tiny corpus
against its exact posterior ``p(z | w)``, enumerated (tests/lda_reference.py's log p(w, z))."""

import itertools

import numpy as np
import pytest

from dmp.decomposition import _lda_kernels as kernels

import lda_reference as ref

# two documents, three words, four tokens in word-major order (word, then document), as a
# partition holds them; K = 3 topics: 81 assignments
TOK_DOC = np.array([0, 1, 0, 1], dtype=np.int32)
TOK_ROW = np.array([0, 0, 1, 2], dtype=np.int32)
D, V, K = 2, 3, 3
ALPHA, BETA = 0.1, 0.1
STATES = np.array(list(itertools.product(range(K), repeat=len(TOK_DOC))))
SWEEPS = 20_000
# total variation between the chain's frequencies and the posterior: about 0.022 from
# sampling noise at 20,000 sweeps (seeds 0-4); a sampler that keeps the token's own count in
# its conditional converges to a distribution 0.097 away
TOLERANCE = 0.045


def _counts(z):
    n_dk = np.zeros((D, K), dtype=np.int64)
    n_wk = np.zeros((V, K), dtype=np.int64)
    np.add.at(n_dk, (TOK_DOC, z), 1)
    np.add.at(n_wk, (TOK_ROW, z), 1)
    return n_dk, n_wk


def _posterior():
    lj = np.array([ref.log_joint(*_counts(z), ALPHA, BETA) for z in STATES])
    p = np.exp(lj - lj.max())
    return p / p.sum()


def _stationary_of_sweep(remove_token: bool):
    """The exact stationary distribution of a systematic Gibbs sweep in token order whose
    conditional takes the token's own count off (``remove_token``, the right one) or not."""
    index = {tuple(z): i for i, z in enumerate(STATES)}
    T = np.eye(len(STATES))
    for i in range(len(TOK_DOC)):
        Ti = np.zeros_like(T)
        for a, z in enumerate(STATES):
            n_dk, n_wk = _counts(z)
            n_k = n_wk.sum(axis=0)
            if remove_token:
                n_dk[TOK_DOC[i], z[i]] -= 1
                n_wk[TOK_ROW[i], z[i]] -= 1
                n_k[z[i]] -= 1
            p = ref.conditional(n_dk[TOK_DOC[i]], n_wk[TOK_ROW[i]], n_k, ALPHA, BETA,
                                V * BETA)
            for k in range(K):
                moved = z.copy()
                moved[i] = k
                Ti[a, index[tuple(moved)]] += p[k] / p.sum()
        T = T @ Ti
    w, v = np.linalg.eig(T.T)
    st = np.real(v[:, np.argmin(np.abs(w - 1))])
    return st / st.sum()


def _tv(p, q) -> float:
    return 0.5 * float(np.abs(p - q).sum())


def test_the_test_tells_a_wrong_conditional_apart():
    """The tolerance separates the right chain from a classic mistake: the exact stationary
    distribution of the right sweep is the posterior, that of a sweep keeping the token's own
    count lies more than twice the tolerance away."""
    post = _posterior()
    assert _tv(_stationary_of_sweep(True), post) < 1e-12
    assert _tv(_stationary_of_sweep(False), post) > 2 * TOLERANCE


@pytest.mark.parametrize("sampler", ["dense", "sparse", "buckets"])
def test_long_run_assignments_follow_the_exact_posterior(sampler):
    """The kernel's chain (one call per sweep, as a one-partition fit) visits the 81
    assignments with the posterior's frequencies, and its counts stay those of z."""
    rng = np.random.default_rng(0)
    N = len(TOK_DOC)
    z = rng.integers(0, K, N).astype(np.int32)
    n_wk = np.zeros((V, K), dtype=np.int32)
    kernels.count_block(0, N, TOK_ROW, TOK_DOC, z, n_wk)
    n_k = n_wk.sum(axis=0).astype(np.int64)
    dnz_ptr, dnz, dnz_cnt = kernels.doc_topic_lists(TOK_DOC, z, D, K)
    n_dk = np.zeros((D, K), dtype=dnz.dtype)   # as the program keeps it
    phi, buf, tree = np.empty(K), np.empty(K), np.empty(K + 1)
    wtop, wpos = np.empty(K, np.int32), np.full(K, -1, np.int32)
    wval, wtree = np.empty(K), np.empty(K + 1)
    U = rng.random((SWEEPS, N))
    seen = np.empty((SWEEPS, N), dtype=np.int32)
    for s in range(SWEEPS):
        if sampler == "dense":
            kernels.sample_dense(0, N, TOK_ROW, TOK_DOC, z, n_wk, n_k, U[s], ALPHA, BETA,
                                 V * BETA, dnz_ptr, dnz, dnz_cnt, n_dk, phi, buf)
        elif sampler == "buckets":
            kernels.sample_buckets(0, N, TOK_ROW, TOK_DOC, z, n_wk, n_k, U[s], ALPHA, BETA,
                                   V * BETA, dnz_ptr, dnz, dnz_cnt, phi, np.empty(K), tree, wtop, wpos,
                                   wval, wtree, buf)
        else:
            kernels.sample_sparse(0, N, TOK_ROW, TOK_DOC, z, n_wk, n_k, U[s], ALPHA, BETA,
                                  V * BETA, dnz_ptr, dnz, dnz_cnt, phi, buf, tree)
        seen[s] = z
    freq = np.bincount(seen @ K ** np.arange(N)[::-1], minlength=len(STATES)) / SWEEPS
    assert _tv(freq, _posterior()) < TOLERANCE
    # the counts are those of the final assignments, the dense scratch left zero
    want_dk, want_wk = _counts(z)
    np.testing.assert_array_equal(kernels.doc_topic_counts(dnz_ptr, dnz, dnz_cnt, K), want_dk)
    np.testing.assert_array_equal(n_wk, want_wk)
    np.testing.assert_array_equal(n_k, want_wk.sum(axis=0))
    assert not n_dk.any()
