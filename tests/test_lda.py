"""LatentDirichletAllocation: word-rotation collapsed Gibbs sampling against plain references."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment

from dmp.decomposition import LatentDirichletAllocation
from dmp.decomposition import _lda_kernels as kernels
from dmp.decomposition._lda_program import (CountPlan, LDAProgram, expand_tokens, round_uniforms,
                                            word_blocks)
from dmp.engine import LocalBackend, run
from dmp.io import InMemorySparseRowDataset

import lda_reference as ref


def lda_corpus(n_docs=300, n_words=400, n_topics=8, doc_len=60, alpha=0.1, beta=0.05, seed=0):
    """A corpus drawn from the LDA generative process; returns (X, true topics, true
    doc-topic proportions)."""
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(n_words, beta), n_topics)
    theta = rng.dirichlet(np.full(n_topics, alpha), n_docs)
    rows = [np.bincount(rng.choice(n_words, doc_len, p=theta[d] @ phi), minlength=n_words)
            for d in range(n_docs)]
    return sp.csr_matrix(np.array(rows, dtype=np.float64)), phi, theta


def matched_cosine(A, B) -> float:
    """Mean cosine similarity of the rows of A and B after the best one-to-one matching."""
    An = A / np.linalg.norm(A, axis=1, keepdims=True)
    Bn = B / np.linalg.norm(B, axis=1, keepdims=True)
    C = An @ Bn.T
    r, c = linear_sum_assignment(-C)
    return float(C[r, c].mean())


# ---------------------------------------------------------------- the samplers' kernels
# K = 300: the sparse sampler's dense bucket is searched with its Fenwick tree
@pytest.mark.parametrize("sampler, Kt", [("dense", 7), ("sparse", 7),
                                         ("sparse", kernels.TREE_MIN_TOPICS + 44),
                                         ("buckets", 7), ("buckets", 300)])
def test_one_draw_follows_the_exact_conditional(sampler, Kt):
    """A token's topic as a function of its uniform: the intervals of [0, 1) leading to each
    topic have the lengths of the exact collapsed conditional."""
    rng = np.random.default_rng(1)
    V, alpha, beta = 5, 0.3, 0.2
    n_dk = rng.integers(0, 4, (1, Kt)).astype(np.int32)
    n_dk[0, 2] = 0
    n_dk[0, 0] += 1                       # the token itself: doc 0, topic 0, word 3
    n_wk = rng.integers(0, 6, (V, Kt)).astype(np.int32)
    n_wk[3, 0] += 1
    n_k = n_wk.sum(axis=0).astype(np.int64) + rng.integers(0, 20, Kt)
    vbeta = 50 * beta
    # the expected distribution, the token removed
    d_, w_, k_ = n_dk[0].astype(float), n_wk[3].astype(float), n_k.astype(float)
    d_[0] -= 1
    w_[0] -= 1
    k_[0] -= 1
    p = ref.conditional(d_, w_, k_, alpha, beta, vbeta)
    p /= p.sum()
    grid = (np.arange(4000) + 0.5) / 4000
    hits = np.zeros(Kt)
    for g in grid:
        nw, nk = n_wk.copy(), n_k.copy()
        z = np.array([0], dtype=np.int32)
        dnz_ptr, dnz, dnz_cnt = kernels.doc_topic_lists(np.zeros(n_dk.sum(), np.int32),
                                                        np.repeat(np.arange(Kt), n_dk[0]), 1, Kt)
        args = (0, 1, np.array([3], np.int32), np.array([0], np.int32), z, nw, nk,
                np.array([g]), alpha, beta, vbeta, dnz_ptr, dnz, dnz_cnt)
        if sampler == "dense":
            kernels.sample_dense(*args, np.zeros((1, Kt), dnz.dtype), np.empty(Kt), np.empty(Kt))
        elif sampler == "buckets":
            kernels.sample_buckets(*args, *bucket_scratch(Kt))
        else:
            kernels.sample_sparse(*args, np.empty(Kt), np.empty(Kt), np.empty(Kt + 1))
        hits[z[0]] += 1
        # counts stay consistent: the token moved from topic 0 to z
        nd = kernels.doc_topic_counts(dnz_ptr, dnz, dnz_cnt, Kt)
        moved = n_dk.copy()
        moved[0, 0] -= 1
        moved[0, z[0]] += 1
        np.testing.assert_array_equal(nd, moved)
        assert nw[3].sum() == n_wk[3].sum() and nk.sum() == n_k.sum()
    # a topic's mass is one interval per bucket (two buckets, three for "buckets"); each
    # interval's count on the grid is off by at most one point
    intervals = 3 if sampler == "buckets" else 2
    np.testing.assert_allclose(hits / len(grid), p, atol=intervals / len(grid))


def bucket_scratch(Kt):
    """``sample_buckets``' scratch: ``g, h, gtree, wtop, wpos, wval, wtree, ybuf``."""
    return (np.empty(Kt), np.empty(Kt), np.empty(Kt + 1), np.empty(Kt, np.int32),
            np.full(Kt, -1, np.int32), np.empty(Kt), np.empty(Kt + 1), np.empty(Kt))


def _serial_tokens(X, n_topics, seed):
    """Token order, initial topics and the word-row maps of a one-partition fit."""
    X = sp.csr_matrix(X)
    block, row = word_blocks(X.shape[1], 1, seed)
    tok_doc, tok_row, tok_word, _, _ = expand_tokens(X.indptr, X.indices, X.data, block, row, 1)
    z0 = np.random.default_rng([seed, 2, 0]).integers(0, n_topics, len(tok_doc))
    return tok_doc, tok_row, tok_word, z0


@pytest.mark.parametrize("sampler, Kt", [("dense", 4), ("sparse", 4),
                                         ("sparse", kernels.TREE_MIN_TOPICS + 44),
                                         ("buckets", 4), ("buckets", 300)])
def test_one_worker_equals_the_serial_reference(sampler, Kt):
    """With one worker the rotation sampler is serial CGS: same seed, same traversal order,
    same uniforms -> the same assignments and counts as the plain Python sampler."""
    X, _, _ = lda_corpus(n_docs=40, n_words=60, n_topics=4, doc_len=25)
    _check_serial_reference(X, sampler, Kt, alpha=0.2, beta=0.05, sweeps=4, seed=11)


@pytest.mark.parametrize("sampler", ["dense", "sparse", "buckets"])
def test_empty_topics_with_v_beta_one_follow_the_serial_reference(sampler):
    """More topics than tokens (most stay empty) and V beta exactly 1, where an empty
    topic's ``n_k - 1 + V beta`` is zero: the same chain as the plain Python sampler."""
    X, _, _ = lda_corpus(n_docs=6, n_words=20, n_topics=2, doc_len=4)
    assert X.shape[1] * 0.05 == 1.0 and X.sum() < 40
    _check_serial_reference(X, sampler, 40, alpha=0.2, beta=0.05, sweeps=6, seed=3)


def _check_serial_reference(X, sampler, Kt, *, alpha, beta, sweeps, seed):
    n_docs = X.shape[0]
    prog = LDAProgram(InMemorySparseRowDataset(X, np.zeros(n_docs), n_shards=1), n_topics=Kt,
                      alpha=alpha, beta=beta, n_sweeps=sweeps, sampler=sampler, seed=seed)
    backend = LocalBackend(1)
    res = run(prog, backend, max_iter=sweeps + 1,
              collect=lambda b: prog.collect_counts(b, assignments=True))
    tok_doc, tok_row, tok_word, z = _serial_tokens(X, Kt, seed)
    n_dk = np.zeros((n_docs, Kt), dtype=np.int64)
    n_wk = np.zeros((X.shape[1], Kt), dtype=np.int64)
    np.add.at(n_dk, (tok_doc, z), 1)
    np.add.at(n_wk, (tok_row, z), 1)
    n_k = n_wk.sum(axis=0)
    doc_topics = [list(np.flatnonzero(n_dk[d])) for d in range(n_docs)]
    lls = []
    for r in range(1, sweeps + 1):
        u = round_uniforms(seed, r, 0, len(z))
        if sampler == "dense":
            ref.dense_sweep(tok_doc, tok_row, z, n_dk, n_wk, n_k, u, alpha, beta,
                            X.shape[1] * beta)
        elif sampler == "buckets":
            ref.bucket_sweep(tok_doc, tok_row, z, n_dk, n_wk, n_k, u, alpha, beta,
                             X.shape[1] * beta, doc_topics)
        else:
            ref.sparse_sweep(tok_doc, tok_row, z, n_dk, n_wk, n_k, u, alpha, beta,
                             X.shape[1] * beta, doc_topics)
        lls.append(ref.log_joint(n_dk, n_wk, alpha, beta))
    np.testing.assert_array_equal(prog.driver["z"][0], z)
    _, row = word_blocks(X.shape[1], 1, seed)
    np.testing.assert_array_equal(prog.driver["n_kw"].T, n_wk[row])
    got = [h["log_likelihood"] for h in res.history[1:]]
    np.testing.assert_allclose(got, lls, rtol=1e-10)


def test_auto_takes_the_dense_sampler_at_small_k_and_buckets_at_large_k():
    """Dense up to DENSE_ANY_LENGTH_TOPICS, and up to DENSE_MAX_TOPICS where the documents
    are long enough (at least K / 2 tokens on average); sparse, then buckets, above."""
    picked = {}
    for doc_len in (10, 120):
        X, _, _ = lda_corpus(n_docs=20, n_words=30, n_topics=3, doc_len=doc_len)
        ds = InMemorySparseRowDataset(X, np.zeros(20), n_shards=1)
        picked[doc_len] = [
            LDAProgram(ds, n_topics=K, alpha=0.1, beta=0.1, n_sweeps=1, sampler="auto",
                       seed=0).sampler
            for K in (2, kernels.DENSE_ANY_LENGTH_TOPICS, kernels.DENSE_ANY_LENGTH_TOPICS + 1,
                      kernels.DENSE_MAX_TOPICS, kernels.DENSE_MAX_TOPICS + 1,
                      kernels.BUCKETS_MIN_TOPICS - 1, kernels.BUCKETS_MIN_TOPICS)]
    assert picked[10] == ["dense", "dense", "sparse", "sparse", "sparse", "sparse", "buckets"]
    assert picked[120] == ["dense", "dense", "dense", "dense", "sparse", "sparse", "buckets"]
    # a store without word frequencies (lengths unknown): dense only where any length is
    assert kernels.pick_sampler(kernels.DENSE_MAX_TOPICS, None) == "sparse"
    X, _, _ = lda_corpus(n_docs=20, n_words=30, n_topics=3, doc_len=10)
    est = LatentDirichletAllocation(3, max_iter=2, backend="local", random_state=0).fit(X)
    assert est.sampler == "auto" and np.isfinite(est.log_likelihood_)


# ---------------------------------------------------------------- the rotation
def test_a_block_waits_packed_unless_the_next_push_needs_it_now():
    """A word block arriving while this partition's push of that round has not finished
    (a neighbour running ahead) waits as it travelled; the block of the very next push,
    arriving once the push before finished, is unpacked at once."""
    from dmp.decomposition._lda_program import pack_block

    X, _, _ = lda_corpus(n_docs=40, n_words=200, n_topics=4, doc_len=10)
    prog = LDAProgram(InMemorySparseRowDataset(X, np.zeros(40), n_shards=2), n_topics=64,
                      alpha=0.1, beta=0.05, n_sweeps=1, sampler="sparse", seed=0)
    prog.start(2)
    s = prog.init_partition(prog.partition_specs(2)[0])
    table = np.zeros((int(s["sizes"][1]), 64), dtype=np.int32)
    table[0, 3] = 5
    packed = pack_block(table)
    assert isinstance(packed, dict)                 # mostly zeros: it travels packed
    prog.receive(s, 0, 1, ((1, packed), None))      # its push of round 0 has not run yet
    assert s["inbox"][0][1] is packed
    s["inbox"].clear()
    prog.push(s, CountPlan(0))
    prog.receive(s, 0, 1, ((1, packed), None))      # now it is the next push's block
    np.testing.assert_array_equal(s["inbox"][0][1], table)
    prog.receive(s, 1, 1, ((0, packed), None))      # a round further ahead waits packed
    assert s["inbox"][1][1] is packed


@pytest.mark.parametrize("P, sampler", [(2, "sparse"), (3, "sparse"), (2, "dense"),
                                       (3, "buckets")])
def test_count_invariants_after_every_sub_round(P, sampler):
    """After every sub-round: doc-topic rows sum to document lengths, no negative counts,
    every word block held by exactly one partition, and (once the first rotation has built
    them) the blocks' rows sum to the word frequencies and the topic totals agree."""
    X, _, _ = lda_corpus(n_docs=60, n_words=90, n_topics=5, doc_len=30, seed=2)
    freq = np.asarray(X.sum(axis=0)).ravel().astype(np.int64)
    prog = LDAProgram(InMemorySparseRowDataset(X, np.zeros(60), n_shards=P), n_topics=5,
                      alpha=0.1, beta=0.05, n_sweeps=3, sampler=sampler, seed=0)
    backend = LocalBackend(P)
    block, _ = word_blocks(X.shape[1], P, 0, freq)
    seen = []

    def check(round, metrics):
        states = backend.call_all("check_counts")
        assert all(s["doc_lengths"] and s["nonnegative"] and s["doc_topic_lists"]
                   for s in states)
        held = sorted(s["block"] for s in states)
        assert held == list(range(P)), held
        if round >= P - 1:
            for s in states:
                np.testing.assert_array_equal(s["block_counts"],
                                              freq[block == s["block"]])
            total = np.sum([s["local_n_k"] for s in states], axis=0)
            np.testing.assert_array_equal(total, prog.driver["n_k"])
        seen.append(round)
        return False

    run(prog, backend, max_iter=P * 4, callback=check)
    assert seen == list(range(P * 4))


class _NkProgram(LDAProgram):
    """Records, at the start of every sampling push, the totals it samples against and the
    partition's own counts then."""

    def _totals(self, s, round):
        n_k = LDAProgram._totals(s, round)
        s.setdefault("seen", []).append(
            (round, n_k.copy(), np.bincount(s["z"], minlength=self.n_topics)))
        return n_k

    def seen(self, s):
        return s["seen"]


@pytest.mark.parametrize("P", [2, 3])
def test_every_sub_round_samples_against_the_exact_totals(P):
    """Each partition adds the others' changes of the topic totals (sent with the blocks)
    before its next sub-round: every push samples against the sum of all partitions'
    counts after the round before, and the driver's totals end equal to them."""
    X, _, _ = lda_corpus(n_docs=60, n_words=90, n_topics=5, doc_len=30, seed=2)
    prog = _NkProgram(InMemorySparseRowDataset(X, np.zeros(60), n_shards=P), n_topics=5,
                      alpha=0.1, beta=0.05, n_sweeps=4, sampler="sparse", seed=0)
    backend = LocalBackend(P)
    res = run(prog, backend, max_iter=P * 5, staleness=1)
    assert len(res.history) == P * 5
    seen = backend.call_all("seen")
    for r in range(P, P * 5):
        # nothing changes a partition's counts between its push of r - 1 and that of r
        exact = np.sum([next(own for q, _, own in part if q == r) for part in seen], axis=0)
        for part in seen:
            n_k = next(t for q, t, _ in part if q == r)
            np.testing.assert_array_equal(n_k, exact)
    assert [len(part) for part in seen] == [P * 4] * P
    final = np.sum([s["local_n_k"] for s in backend.call_all("check_counts")], axis=0)
    np.testing.assert_array_equal(prog.driver["n_k"], final)


def test_blocks_move_partition_to_partition_and_bytes_are_counted():
    X, _, _ = lda_corpus(n_docs=60, n_words=90, n_topics=5, doc_len=30, seed=3)
    lda = LatentDirichletAllocation(5, max_iter=2, backend="local", n_workers=3,
                                    random_state=0).fit(X)
    h = lda.history_
    # each sub-round every partition hands its block (rows x K int32, plus the block id) to
    # its neighbour: all 90 word rows move once per sub-round; once sampling, every
    # partition also sends its change of the topic totals (K int64) to the two others
    assert list(h["phase"][:3]) == ["count"] * 3 and set(h["phase"][3:]) == {"sample"}
    assert np.all(h["bytes_ring"][:3] == 90 * 5 * 4 + 3 * 8)
    assert np.all(h["bytes_ring"][3:] == 90 * 5 * 4 + 3 * 8 + 3 * 2 * 5 * 8)
    # the driver sends only the totals of the counting rotation (K int64 and the round per
    # partition, with the rounds up to the first sampling one); the sampling rounds' pulls
    # send nothing
    assert set(h["bytes_pull"][:4]) == {0, 3 * (5 * 8 + 8)}
    assert np.all(h["bytes_pull"][4:] == 0)


def test_word_blocks_balance_tokens():
    rng = np.random.default_rng(0)
    V, P = 5000, 4
    freq = np.floor(2e5 / np.arange(1, V + 1) ** 1.1).astype(np.int64)   # Zipf-like
    rng.shuffle(freq)
    block, row = word_blocks(V, P, 3, freq)
    sizes = np.bincount(block, minlength=P)
    assert sizes.max() - sizes.min() <= 1                      # words per block: even
    for b in range(P):                                         # rows: word-id order
        np.testing.assert_array_equal(row[block == b], np.arange(sizes[b]))
    tokens = np.bincount(block, weights=freq, minlength=P)
    # snake dealing: blocks differ by at most about the heaviest word
    assert tokens.max() - tokens.min() <= freq.max()
    random_deal, _ = word_blocks(V, P, 3)
    rand_tokens = np.bincount(random_deal, weights=freq, minlength=P)
    assert np.ptp(tokens) < np.ptp(rand_tokens)
    # the same on every partition: a function of its arguments
    np.testing.assert_array_equal(word_blocks(V, P, 3, freq)[0], block)


def test_a_spare_block_takes_the_next_one_unpacked():
    """The memory of the block last sent on packed takes the next block: same counts as a
    fresh block, only the spare's own nonzeros cleared; a spare too small is not used."""
    from dmp.decomposition._lda_program import pack_block, unpack_block

    rng = np.random.default_rng(1)

    def sparse(shape):
        t = np.where(rng.random(shape) < 0.03, rng.integers(1, 9, shape), 0)
        return t.astype(np.int32)

    old, new = sparse((300, 400)), sparse((280, 400))
    spare = (old, pack_block(old)["idx"])
    table = unpack_block(pack_block(new), spare)
    np.testing.assert_array_equal(table, new)
    assert np.shares_memory(table, old)
    small = sparse((100, 400))
    table = unpack_block(pack_block(new), (small, pack_block(small)["idx"]))
    np.testing.assert_array_equal(table, new)
    assert not np.shares_memory(table, small)


def test_round_uniforms_are_uniform_and_differ_by_round_and_partition():
    from scipy.stats import kstest

    u = round_uniforms(7, 3, 1, 100_000)
    assert 0.0 <= u.min() and u.max() < 1.0
    assert kstest(u, "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02
    for other in (round_uniforms(7, 4, 1, 1000), round_uniforms(7, 3, 0, 1000),
                  round_uniforms(8, 3, 1, 1000)):
        assert abs(np.corrcoef(u[:1000], other)[0, 1]) < 0.15
        assert not np.isin(other, u).any()
    np.testing.assert_array_equal(round_uniforms(7, 3, 1, 10), u[:10])


def test_uniforms_written_in_place_are_the_same():
    buf = np.full(50, -1.0)
    u = round_uniforms(7, 3, 1, 40, out=buf)
    np.testing.assert_array_equal(u, round_uniforms(7, 3, 1, 40))
    assert np.shares_memory(u, buf) and np.all(buf[40:] == -1.0)


def test_mostly_zero_blocks_travel_as_their_nonzeros():
    from dmp.decomposition._lda_program import pack_block, unpack_block
    from dmp.engine.comm import payload_nbytes

    rng = np.random.default_rng(0)
    sparse_table = np.where(rng.random((300, 400)) < 0.02, rng.integers(1, 9, (300, 400)), 0)
    sparse_table = sparse_table.astype(np.int32)
    packed = pack_block(sparse_table)
    nnz = np.count_nonzero(sparse_table)
    assert payload_nbytes(packed) == nnz * 8 + 2 * 8      # positions, counts, the shape
    np.testing.assert_array_equal(unpack_block(packed), sparse_table)
    dense_table = rng.integers(0, 3, (30, 40)).astype(np.int32)      # two thirds nonzero
    assert pack_block(dense_table) is dense_table and unpack_block(dense_table) is dense_table
    empty = np.zeros((5, 7), dtype=np.int32)
    np.testing.assert_array_equal(unpack_block(pack_block(empty)), empty)
    # in a fit at large K the ring carries far less than the dense blocks, same result
    X, _, _ = lda_corpus(n_docs=60, n_words=90, n_topics=5, doc_len=30, seed=3)
    kw = dict(max_iter=2, backend="local", n_workers=3, random_state=0)
    lda = LatentDirichletAllocation(400, **kw).fit(X)
    assert np.all(lda.history_["bytes_ring"] < 90 * 400 * 4 / 4)
    np.testing.assert_array_equal(lda.topic_word_counts_.sum(axis=0),
                                  np.asarray(X.sum(axis=0)).ravel())



def test_the_packed_buckets_kernel_draws_what_the_dense_one_draws():
    """`sample_buckets_packed` on a block's nonzeros makes the same draws, counts and lists
    as `sample_buckets` on the dense block, and hands the block on in `pack_block`'s form
    (rows without tokens here included)."""
    from dmp.decomposition._lda_program import pack_block

    rng = np.random.default_rng(4)
    Kt, rows, n_docs, n_tok = 300, 12, 15, 400
    tok_row = np.sort(rng.choice([0, 1, 4, 5, 6, 9], n_tok)).astype(np.int32)
    tok_doc = rng.integers(0, n_docs, n_tok).astype(np.int32)
    order = np.lexsort((tok_doc, tok_row))
    tok_row, tok_doc = tok_row[order], tok_doc[order]
    z = rng.integers(0, 40, n_tok).astype(np.int32)
    table = np.zeros((rows, Kt), dtype=np.int32)
    np.add.at(table, (tok_row, z), 1)
    table[[2, 3, 11], rng.integers(0, Kt, 3)] += 7    # other partitions' tokens, elsewhere
    n_k = table.sum(axis=0).astype(np.int64) + rng.integers(0, 30, Kt)
    u = rng.random(n_tok)
    vbeta = 0.01 * 2000

    def state():
        return (z.copy(), n_k.copy(), *kernels.doc_topic_lists(tok_doc, z, n_docs, Kt))

    z1, nk1, ptr1, dnz1, cnt1 = state()
    dense = table.copy()
    kernels.sample_buckets(0, n_tok, tok_row, tok_doc, z1, dense, nk1, u, 0.1, 0.01, vbeta,
                           ptr1, dnz1, cnt1, *bucket_scratch(Kt))
    z2, nk2, ptr2, dnz2, cnt2 = state()
    packed = pack_block(table)
    room = len(packed["idx"]) + n_tok
    out_idx, out_val = np.empty(room, np.int32), np.empty(room, np.int32)
    row = np.zeros(Kt, dtype=np.int32)
    n = kernels.sample_buckets_packed(0, n_tok, tok_row, tok_doc, z2, packed["idx"],
                                      packed["val"], Kt, out_idx, out_val, row, nk2, u, 0.1,
                                      0.01, vbeta, ptr2, dnz2, cnt2, *bucket_scratch(Kt))
    assert not np.array_equal(z1, z)                  # it sampled
    np.testing.assert_array_equal(z2, z1)
    np.testing.assert_array_equal(nk2, nk1)
    np.testing.assert_array_equal(dnz2, dnz1)
    np.testing.assert_array_equal(cnt2, cnt1)
    expect = pack_block(dense)
    np.testing.assert_array_equal(out_idx[:n], expect["idx"])
    np.testing.assert_array_equal(out_val[:n], expect["val"])
    assert not row.any()


class _PackedCalls(LDAProgram):
    """Counts the pushes that sampled a block in its travelling form."""

    def _sample_packed(self, s, *args):
        s["packed_pushes"] = s.get("packed_pushes", 0) + 1
        return super()._sample_packed(s, *args)

    def packed_pushes(self, s):
        return s.get("packed_pushes", 0)


class _DenseOnly(LDAProgram):
    def _keeps_packed(self, P):
        return False


def test_counting_into_a_packed_block_is_counting_into_the_dense_one():
    from dmp.decomposition._lda_program import count_packed, empty_block, pack_block

    rng = np.random.default_rng(5)
    Kt, rows, n_tok = 300, 12, 500
    tok_row = np.sort(rng.choice([0, 2, 3, 7, 11], n_tok)).astype(np.int32)
    z = rng.integers(0, 60, n_tok).astype(np.int32)
    table = np.zeros((rows, Kt), dtype=np.int32)
    table[[1, 2, 7], [5, 0, 299]] = [3, 1, 4]                 # other partitions' counts
    for t0, t1 in [(0, n_tok), (100, 250), (0, 0)]:
        dense = table.copy()
        kernels.count_block(t0, t1, tok_row, np.zeros(n_tok, np.int32), z, dense)
        got = count_packed(pack_block(table), t0, t1, tok_row, z)
        want = pack_block(dense)
        np.testing.assert_array_equal(got["idx"], want["idx"])
        np.testing.assert_array_equal(got["val"], want["val"])
        assert got["idx"].dtype == want["idx"].dtype and got["val"].dtype == np.int32
    empty = count_packed(empty_block((rows, Kt)), 0, 0, tok_row, z)
    assert empty["idx"].size == 0 and empty["shape"] == (rows, Kt)
    # a block most of whose counts are nonzero goes on dense, as pack_block sends it
    full = count_packed(empty_block((2, 3)), 0, 6, np.array([0, 0, 0, 1, 1, 1], np.int32),
                        np.array([0, 1, 2, 0, 1, 1], np.int32))
    np.testing.assert_array_equal(full, [[1, 1, 1], [1, 2, 0]])
    assert full.dtype == np.int32


@pytest.mark.parametrize("P", [2, 3])
def test_blocks_sampled_as_they_travel_give_the_dense_blocks_chain(P, monkeypatch):
    """At large K the buckets sampler counts into and samples the blocks as their
    nonzeros: the same assignments, counts and log-likelihoods, sub-round by sub-round, as
    making each block dense first."""
    from dmp.decomposition import _lda_program

    counted = []

    def count_packed(*args):
        counted.append(1)
        return real_count(*args)

    real_count = _lda_program.count_packed
    monkeypatch.setattr(_lda_program, "count_packed", count_packed)
    X, _, _ = lda_corpus(n_docs=60, n_words=90, n_topics=5, doc_len=30, seed=2)
    runs = []
    for cls in (_PackedCalls, _DenseOnly):
        prog = cls(InMemorySparseRowDataset(X, np.zeros(60), n_shards=P), n_topics=400,
                   alpha=0.1, beta=0.05, n_sweeps=3, sampler="buckets", seed=0)
        backend = LocalBackend(P)
        res = run(prog, backend, max_iter=P * 4,
                  collect=lambda b, prog=prog: prog.collect_counts(b, assignments=True))
        extra = backend.call_all("packed_pushes") if cls is _PackedCalls else None
        runs.append((prog.driver, [h["log_likelihood"] for h in res.history], extra))
    (packed, ll_packed, pushes), (dense, ll_dense, _) = runs
    assert pushes == [P * 3] * P                      # every sampling push took it packed
    assert len(counted) == P * P                      # and every counting push
    for a, b in zip(packed["z"], dense["z"]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(packed["n_kw"], dense["n_kw"])
    np.testing.assert_array_equal(packed["n_k"], dense["n_k"])
    assert ll_packed == ll_dense


# ---------------------------------------------------------------- quality
@pytest.mark.slow
def test_recovers_the_true_topics_and_matches_the_numpy_reference():
    """Topics recovered (Hungarian-matched cosine >= 0.9), and the log-likelihood per token
    within 1% of plain serial CGS after the same number of sweeps.  Chains of both sit in
    worse modes now and then (seen at -4.38 against -4.25 here), so the best of three seeds
    of each is compared."""
    X, phi, theta = lda_corpus(n_docs=150, n_words=250, n_topics=6, doc_len=50, seed=0)
    kw = dict(doc_topic_prior=0.1, topic_word_prior=0.05, max_iter=30)
    fits = [LatentDirichletAllocation(6, backend="local", n_workers=2, random_state=seed,
                                      **kw).fit(X) for seed in range(3)]
    best = max(fits, key=lambda f: f.log_likelihood_)
    assert matched_cosine(best.components_, phi) >= 0.9
    ours = best.log_likelihood_ / best.n_tokens_
    theirs = max(ref.serial_cgs(X, 6, 0.1, 0.05, 30, seed=seed)[0][-1] for seed in range(3))
    assert abs(ours - theirs) <= 0.01 * abs(theirs), (ours, theirs)
    # the fitted document mixtures: fold-in of the training documents
    th = best.transform(X)
    np.testing.assert_allclose(th.sum(axis=1), 1.0, rtol=1e-12)
    assert matched_cosine(th.T, theta.T) >= 0.85


def test_sparse_and_dense_samplers_reach_the_same_likelihood():
    """Same conditional, different chains: the median over eight seeds of the final
    log-likelihood per token agree (a chain can sit in a worse mode for a while: about one in
    five here, at -4.09 or -4.19 against -4.03)."""
    X, _, _ = lda_corpus(n_docs=200, n_words=300, n_topics=6, doc_len=50, seed=5)
    lls = {}
    for sampler in ("sparse", "dense"):
        lls[sampler] = np.median([
            LatentDirichletAllocation(6, doc_topic_prior=0.1, topic_word_prior=0.05,
                                      max_iter=80, sampler=sampler, backend="local",
                                      n_workers=2, random_state=seed).fit(X)
            .history_["ll_per_token"][-20:].mean() for seed in range(8)])
    assert abs(lls["sparse"] - lls["dense"]) <= 0.002 * abs(lls["dense"])


@pytest.mark.parametrize("P", [1, 3])
def test_evaluate_every_scores_every_nth_and_the_last_sweep_of_the_same_chain(P):
    """Fewer evaluations, the same chain: each evaluated sweep's log-likelihood equals the
    fit that scores every sweep, the sweeps between carry the last evaluated value, the last
    sweep is scored although 7 is not a multiple of 3, and sweeps and speed are kept."""
    X, _, _ = lda_corpus(n_docs=60, n_words=80, n_topics=4, doc_len=30, seed=2)
    kw = dict(n_components=5, max_iter=7, sampler="sparse", backend="local", n_workers=P,
              random_state=1)
    every = LatentDirichletAllocation(**kw).fit(X)
    some = LatentDirichletAllocation(evaluate_every=3, **kw).fit(X)
    np.testing.assert_array_equal(some.topic_word_counts_, every.topic_word_counts_)
    assert some.n_iter_ == every.n_iter_ == 7
    assert some.log_likelihood_ == every.log_likelihood_ == every.history_["log_likelihood"][-1]
    h1, h3 = every.history_, some.history_
    np.testing.assert_array_equal(h3["sweep"], h1["sweep"])
    assert np.all(np.isfinite(h3["tokens_per_s"][h3["sweep"] >= 1]))

    def at_sweep(h, s):
        return h["log_likelihood"][np.flatnonzero(h["sweep"] == s)[0]]

    scored = {1: None, 2: None, 3: 3, 4: 3, 5: 3, 6: 6, 7: 7}
    for s, e in scored.items():
        if e is None:
            assert math.isnan(at_sweep(h3, s))
        else:
            assert at_sweep(h3, s) == at_sweep(h1, e), s
    assert len({at_sweep(h1, s) for s in range(1, 8)}) == 7
    with pytest.raises(ValueError, match="evaluate_every"):
        LatentDirichletAllocation(evaluate_every=0).fit(X)


def test_score_perplexity_and_top_words():
    X, phi, _ = lda_corpus(n_docs=150, n_words=200, n_topics=5, doc_len=50, seed=4)
    lda = LatentDirichletAllocation(5, max_iter=30, backend="local", random_state=0).fit(X)
    theta = lda.transform(X)
    topic_word = lda.components_ / lda.components_.sum(axis=1, keepdims=True)
    Xc = X.tocoo()
    expected = float(np.sum(Xc.data * np.log(np.einsum("ij,ji->i", theta[Xc.row],
                                                       topic_word[:, Xc.col]))))
    assert lda.score(X) == pytest.approx(expected, rel=1e-12)
    assert lda.perplexity(X) == pytest.approx(np.exp(-expected / X.sum()), rel=1e-12)
    untrained = LatentDirichletAllocation(5, max_iter=1, backend="local", random_state=0).fit(X)
    assert lda.perplexity(X) < untrained.perplexity(X)
    top = lda.top_words(3)
    assert len(top) == 5 and all(len(t) == 3 for t in top)
    assert top[0] == list(np.argsort(-lda.components_[0], kind="stable")[:3])
    vocab = [f"w{j}" for j in range(200)]
    assert lda.top_words(2, vocab)[1] == [vocab[j] for j in top[1][:2]]
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="n must be a positive integer"):
            lda.top_words(bad)
    with pytest.raises(ValueError, match="vocabulary has"):
        lda.top_words(2, vocab[:-1])



def test_components_are_made_on_first_access_only():
    """A fit leaves ``components_`` (topics x words float64, the largest attribute at large
    K) unmade; transform, score and top_words give the same results without making it as
    with it; first access makes ``topic_word_counts_ + beta`` and keeps it; a refit drops it."""
    X, _, _ = lda_corpus(n_docs=60, n_words=80, n_topics=4, doc_len=30, seed=5)
    lda = LatentDirichletAllocation(4, max_iter=5, backend="local", random_state=0).fit(X)
    before = dict(vars(lda))
    assert "_components" not in before
    theta, score, top = lda.transform(X), lda.score(X), lda.top_words(5)
    assert vars(lda).keys() == before.keys()
    comp = lda.components_
    assert comp.dtype == np.float64 and lda.components_ is comp
    np.testing.assert_array_equal(comp, lda.topic_word_counts_ + lda.topic_word_prior_)
    np.testing.assert_array_equal(lda.transform(X), theta)
    assert lda.score(X) == score and lda.top_words(5) == top
    # a user's components_ is what inference reads
    lda.components_ = comp[:, ::-1].copy()
    assert lda.top_words(1)[0] == [int(np.argmax(comp[0, ::-1]))]
    lda.fit(X)
    assert "_components" not in vars(lda) and lda.top_words(5) == top
    with pytest.raises(AttributeError):
        LatentDirichletAllocation(4).components_


def test_word_rows_go_into_their_columns():
    rng = np.random.default_rng(3)
    piece = rng.integers(0, 9, (150, 70)).astype(np.int32)
    for cols in (np.arange(150), np.sort(rng.choice(400, 150, replace=False))):
        out = np.zeros((70, 400), dtype=np.int32)
        kernels.rows_into_columns(piece, cols, out)
        want = np.zeros_like(out)
        want[:, cols] = piece.T
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", [np.int32, np.uint16])
def test_word_score_is_lgamma_over_the_counts_in_any_layout(dtype):
    """The word part of log p(w, z) against math.lgamma entry by entry, with counts on
    both sides of the tallied range; the same value for the block's nonzeros alone (a
    packed block) and for a transposed copy."""
    rng = np.random.default_rng(4)
    block = rng.integers(0, 40, (60, 33)) * (rng.random((60, 33)) < 0.3)
    block[5, 7], block[59, 0], block[0, 32] = 1023, 1024, 50_000
    block = block.astype(dtype)
    beta = 0.01
    want = sum(math.lgamma(c + beta) - math.lgamma(beta) for c in block.ravel().tolist())
    got = kernels.word_loglik(block, beta)
    assert got == pytest.approx(want, rel=1e-12)
    packed = block[block != 0].reshape(1, -1)
    assert kernels.word_loglik(packed, beta) == got
    assert kernels.word_loglik(np.ascontiguousarray(block.T), beta) == got


def test_document_score_is_lgamma_over_the_pairs():
    """The document part of log p(w, z) against math.lgamma, with counts on both sides of
    the tallied range."""
    counts = [[3, 1], [1023, 1024, 1], [2000]]
    K, alpha = 5, 0.3
    dnz_cnt = np.array([len(c) for c in counts], dtype=np.int32)
    dnz_ptr = np.concatenate([[0], np.cumsum(dnz_cnt)[:-1]]).astype(np.int64)
    dnz = np.array([[k, c] for cs in counts for k, c in enumerate(cs)], dtype=np.int32)
    doc_len = np.array([sum(c) for c in counts], dtype=np.int64)
    want = sum(math.lgamma(K * alpha) - math.lgamma(n + K * alpha) for n in doc_len.tolist())
    want += sum(math.lgamma(c + alpha) - math.lgamma(alpha) for cs in counts for c in cs)
    got = kernels.doc_loglik(doc_len, K, alpha, dnz_ptr, dnz, dnz_cnt)
    assert got == pytest.approx(want, rel=1e-12)


def test_a_lone_partition_scores_its_words_through_its_tokens():
    """The word score found through the tokens equals the whole block's bit for bit, and
    gives way (NaN) when a count is past the tallied range."""
    X, _, _ = lda_corpus(n_docs=60, n_words=80, n_topics=5, doc_len=40)
    tok_doc, tok_row, _, z = _serial_tokens(X, 7, seed=3)
    n_wk = np.zeros((X.shape[1], 7), dtype=np.int32)
    np.add.at(n_wk, (tok_row, z), 1)
    assert np.count_nonzero(n_wk) < n_wk.size          # rows with zeros between their counts
    got = kernels.word_loglik_of_tokens(n_wk, 0.05, 0, len(z), tok_row, z.astype(np.int32))
    assert got == kernels.word_loglik(n_wk, 0.05)
    heavy = n_wk.copy()
    heavy[tok_row[0], z[0]] = 5000
    assert np.isnan(kernels.word_loglik_of_tokens(heavy, 0.05, 0, len(z), tok_row,
                                                  z.astype(np.int32)))


# ---------------------------------------------------------------- input and conventions
@pytest.mark.parametrize("X, match", [
    (sp.csr_matrix(np.array([[1.0, 2.0], [0.0, 0.0]])), "empty document"),
    (np.array([[1.0, -2.0]]), "negative counts"),
    (np.array([[1.0, 2.5]]), "non-integer counts"),
    (np.array([[1.0, np.nan]]), "NaN or infinite"),
    (np.zeros((3, 4)), "no tokens"),
    (np.zeros((0, 4)), "empty"),
    (np.array([1.0, 2.0]), "2-D"),
])
def test_bad_corpora_are_rejected(X, match):
    with pytest.raises(ValueError, match=match):
        LatentDirichletAllocation(3, backend="local").fit(X)


def test_bad_parameters_and_vocabulary_mismatch():
    X, _, _ = lda_corpus(n_docs=20, n_words=30, n_topics=3, doc_len=10)
    with pytest.raises(ValueError, match="n_components"):
        LatentDirichletAllocation(0, backend="local").fit(X)
    with pytest.raises(ValueError, match="sampler"):
        LatentDirichletAllocation(3, sampler="fast", backend="local").fit(X)
    lda = LatentDirichletAllocation(3, max_iter=2, backend="local", random_state=0).fit(X)
    with pytest.raises(ValueError, match="vocabulary of 30"):
        lda.transform(sp.csr_matrix((2, 31)))
    with pytest.raises(ValueError, match="2 workers"):
        LatentDirichletAllocation(3, backend="local", n_workers=2).fit(X[:1])


def test_sklearn_conventions():
    from sklearn.base import clone

    lda = LatentDirichletAllocation(4, doc_topic_prior=0.3, max_iter=3, random_state=0,
                                    backend="local")
    assert lda.get_params()["doc_topic_prior"] == 0.3
    c = clone(lda).set_params(max_iter=2)
    X, _, _ = lda_corpus(n_docs=20, n_words=30, n_topics=3, doc_len=10)
    assert c.fit(X) is c and c.n_iter_ == 2 and c.components_.shape == (4, 30)
    assert c.doc_topic_prior_ == 0.3 and c.topic_word_prior_ == 0.25
    assert list(c.get_feature_names_out()) == [f"latentdirichletallocation{k}"
                                               for k in range(4)]


def test_make_lda_corpus_follows_the_generative_process():
    from dmp.io.synthetic import make_lda_corpus

    X, phi, theta = make_lda_corpus(n_docs=400, n_words=300, n_topics=5, doc_len=120, seed=1)
    assert X.shape == (400, 300) and phi.shape == (5, 300) and theta.shape == (400, 5)
    assert abs(X.sum() / 400 - 120) < 3            # Poisson(120) lengths
    assert np.all(X.data >= 1) and np.all(X.data == np.round(X.data))
    # expected word frequencies: sum_d N_d theta_d . phi
    lengths = np.asarray(X.sum(axis=1)).ravel()
    expected = (lengths[:, None] * theta).sum(axis=0) @ phi
    observed = np.asarray(X.sum(axis=0)).ravel()
    chi2 = np.sum((observed - expected) ** 2 / np.maximum(expected, 1e-9))
    assert chi2 < 300 + 6 * np.sqrt(2 * 300)       # about chi-square with 300 degrees
    X2, _, _ = make_lda_corpus(n_docs=400, n_words=300, n_topics=5, doc_len=120, seed=1)
    assert (X2 != X).nnz == 0
