"""Numba kernels of collapsed Gibbs sampling for LDA (word-major, one word block at a time).

Tokens of a partition are sorted by (word block, word row, document).  A kernel call samples
the tokens ``[t0, t1)``, all of whose words lie in the block whose word-topic rows ``n_wk`` the
partition holds, using one uniform number per token (drawn by the caller, so that every
backend and the numpy reference in the tests consume the same stream).

Three samplers draw from the same conditional
``p(z = k) ∝ (n_dk + alpha) (n_wk + beta) / (n_k + V beta)`` (counts without the token):

* ``dense``: O(K) per token, on a dense row of the document's counts (unpacked from its
  pairs for the call): K products and their total, which vectorise, then an inverse CDF
  that tries the token's old topic first (once the chain has mixed most tokens keep their
  topic, and those write nothing); the faster one up to ``DENSE_MAX_TOPICS``;
* ``sparse`` (STRADS "sample by word"): for the current word, ``phi_k = (n_wk + beta) /
  (n_k + V beta)`` and the dense bucket ``X = alpha sum_k phi_k`` are kept up to date
  incrementally; the document bucket ``Y = sum_{k: n_dk > 0} n_dk phi_k`` runs over the
  document's nonzero topics only.  ``u < Y`` picks among the document's topics, otherwise
  ``k`` is found in the dense bucket (for K >= 256 by descending a Fenwick tree over ``phi``,
  kept up to date with the two changes of each token).  Cost O(K_d + log K) per token and O(K) once
  per word (rebuilding ``phi`` and its tree);
* ``buckets``: SparseLDA's document, word and smoothing buckets (`sample_buckets`): O(K_d +
  log K) per token and, per word, a scan of its row for its nonzeros and O(K_w) -- no O(K)
  arithmetic per word, which at large K and on many partitions (each samples every word
  once a sweep) is most of ``sparse``'s cost.

A document's topic counts exist only in sparse form: its nonzero topics and their counts are
the rows ``dnz[dnz_ptr[d]:dnz_ptr[d] + dnz_cnt[d]]`` (``[topic, count]`` pairs of 16-bit
integers where they fit, capacity ``min(K, N_d)``), contiguous so that the document bucket
reads one short run of memory rather than a K-wide row.  A count reaching zero is removed by moving the last pair into its place and
a new topic is appended, so the order is part of the sampler's state (the numpy reference
reproduces it).  The sparse sampler takes a token's count off its topic while it computes the
document bucket (the topic's pair stays, with its smaller count, during the draw); after the
draw a new topic takes that pair if it is empty (else goes at the end), and a pair left
empty is replaced by the last one.  No D x K table is kept between calls (the dense
sampler unpacks the lists into one for the call).
"""

from __future__ import annotations

import math

import numpy as np

from dmp.kernels._jit import njit


def pair_dtype(n_topics: int, max_doc_len: int):
    """``uint16`` when every topic id and count fits, else ``int32``.

    Half the bytes per pair: the document bucket reads a random document's pairs for every
    token, and at 16 bits a corpus's pairs stay in a core's L2 twice as long (BENCHMARKS.md,
    "A leaner sampler")."""
    return np.uint16 if n_topics <= 2**16 and max_doc_len < 2**16 else np.int32


def doc_topic_lists(tok_doc, z, n_docs, n_topics):
    """``(dnz_ptr, dnz, dnz_cnt)`` of documents whose tokens are ``(tok_doc, z)``, each
    document's topics in increasing order; the pairs' dtype is `pair_dtype`'s."""
    tok_doc = np.asarray(tok_doc, dtype=np.int64)
    doc_len = np.bincount(tok_doc, minlength=n_docs)
    dnz_ptr = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(np.minimum(doc_len, n_topics), out=dnz_ptr[1:])
    keys, counts = np.unique(tok_doc * n_topics + np.asarray(z, dtype=np.int64),
                             return_counts=True)
    dnz_cnt = np.bincount(keys // n_topics, minlength=n_docs).astype(np.int32)
    _, slot = pair_slots(dnz_ptr, dnz_cnt)
    dnz = np.zeros((max(int(dnz_ptr[-1]), 1), 2),
                   dtype=pair_dtype(n_topics, int(doc_len.max(initial=0))))
    dnz[slot, 0] = keys % n_topics
    dnz[slot, 1] = counts
    return dnz_ptr, dnz, dnz_cnt


def pair_slots(dnz_ptr, dnz_cnt):
    """``(docs, slots)``: the document and the storage row of every pair in use, document by
    document."""
    cnt = np.asarray(dnz_cnt, dtype=np.int64)
    docs = np.repeat(np.arange(len(cnt)), cnt)
    return docs, np.asarray(dnz_ptr)[docs] + np.arange(len(docs)) - np.repeat(
        np.cumsum(cnt) - cnt, cnt)


def doc_topic_counts(dnz_ptr, dnz, dnz_cnt, n_topics):
    """The dense documents x topics counts of the sparse lists (for tests and inspection)."""
    n_docs = len(dnz_cnt)
    out = np.zeros((n_docs, n_topics), dtype=np.int64)
    for d in range(n_docs):
        rows = dnz[dnz_ptr[d]:dnz_ptr[d] + dnz_cnt[d]]
        out[d, rows[:, 0]] = rows[:, 1]
    return out


@njit(cache=True, nogil=True)
def _dnz_decrement(dnz, base, nd, k):
    """Take one count off topic ``k`` of the document whose pairs start at ``base``; returns
    the new number of pairs."""
    for j in range(nd):
        if dnz[base + j, 0] == k:
            c = dnz[base + j, 1] - 1
            if c == 0:
                dnz[base + j, 0] = dnz[base + nd - 1, 0]
                dnz[base + j, 1] = dnz[base + nd - 1, 1]
                return nd - 1
            dnz[base + j, 1] = c
            return nd
    return nd


@njit(cache=True, nogil=True)
def _dnz_increment(dnz, base, nd, k, spare):
    """Add one count to topic ``k``; a new topic takes pair ``spare`` (an emptied pair) when
    it is >= 0, else goes at the end.  Returns the new number of pairs."""
    for j in range(nd):
        if dnz[base + j, 0] == k:
            dnz[base + j, 1] += 1
            return nd
    if spare >= 0:
        dnz[base + spare, 0] = k
        dnz[base + spare, 1] = 1
        return nd
    dnz[base + nd, 0] = k
    dnz[base + nd, 1] = 1
    return nd + 1


@njit(cache=True, nogil=True)
def count_block(t0, t1, tok_row, tok_doc, z, n_wk):
    """Add the topic counts of tokens ``[t0, t1)`` to the block's word-topic rows."""
    for i in range(t0, t1):
        n_wk[tok_row[i], z[i]] += 1


#: up to this many topics ``sampler="auto"`` takes the dense sampler: its O(K) per token,
#: vectorised over the topics, with most tokens' searches ending at their old topic, beats
#: the sparse sampler's O(K_d) with its branches up to K = 200 on four corpora of 90-270
#: tokens a document (BENCHMARKS.md, "LDA at small K") ...
DENSE_MAX_TOPICS = 200
#: ... and whatever the documents' length up to this many; between the two only where the
#: mean document holds at least K / 2 tokens (a short document's few topics are the sparse
#: sampler's whole cost, while the dense one pays K per token and a documents x K scratch)
DENSE_ANY_LENGTH_TOPICS = 50


def pick_sampler(n_topics: int, mean_doc_len: float | None = None) -> str:
    """``sampler="auto"``'s choice: ``"dense"`` up to `DENSE_ANY_LENGTH_TOPICS` topics, and
    up to `DENSE_MAX_TOPICS` where the mean document length (tokens; None: unknown) is at
    least half the topics; else ``"sparse"`` below `BUCKETS_MIN_TOPICS`, else
    ``"buckets"``."""
    if n_topics <= DENSE_ANY_LENGTH_TOPICS or (
            n_topics <= DENSE_MAX_TOPICS and mean_doc_len is not None
            and mean_doc_len >= n_topics / 2):
        return "dense"
    return "sparse" if n_topics < BUCKETS_MIN_TOPICS else "buckets"


#: from this many topics ``sampler="auto"`` takes the three-bucket sampler (no O(K) work per
#: word; BENCHMARKS.md, "LDA at 10,000 topics and beyond")
BUCKETS_MIN_TOPICS = 1000

# the dense sampler's sums over the topics may be reassociated (vectorised); nothing else is
# relaxed (no reciprocal approximations, NaN or infinity assumptions)
_VECTOR_SUMS = {"reassoc", "contract", "nsz"}


@njit(cache=True, nogil=True)
def pairs_to_dense(dnz_ptr, dnz, dnz_cnt, n_dk):
    """Add the documents' ``[topic, count]`` pairs to the rows of ``n_dk`` (zero on entry)."""
    for d in range(dnz_cnt.shape[0]):
        base = dnz_ptr[d]
        for j in range(dnz_cnt[d]):
            n_dk[d, dnz[base + j, 0]] = dnz[base + j, 1]


@njit(cache=True, nogil=True)
def dense_to_pairs(n_dk, dnz_ptr, dnz, dnz_cnt):
    """The rows of ``n_dk`` as pair lists (each document's topics in increasing order);
    leaves ``n_dk`` zero."""
    D, K = n_dk.shape
    for d in range(D):
        base = dnz_ptr[d]
        n = 0
        for k in range(K):
            c = n_dk[d, k]
            if c != 0:
                dnz[base + n, 0] = k
                dnz[base + n, 1] = c
                n += 1
                n_dk[d, k] = 0
        dnz_cnt[d] = n


@njit(cache=True, nogil=True)
def _reciprocal_without_one(n, vbeta):
    """``1 / (n - 1 + V beta)``; 0 for an empty topic, where that can be zero or negative
    (V beta <= 1) and where no token's old topic lies."""
    den = n - 1 + vbeta
    return 1.0 / den if den > 0.0 else 0.0


@njit(cache=True, nogil=True, fastmath=_VECTOR_SUMS)
def _sample_dense_rows(t0, t1, tok_row, tok_doc, z, n_wk, n_k, u, alpha, beta, vbeta,
                       n_dk, phi, p, inv, inv_out):
    K = n_k.shape[0]
    # inv: 1 / (n_k + V beta), which changes only when a token moves: a new word's phi is
    # then K products, not K divisions (a word has few tokens in a small corpus); inv_out:
    # 1 / (n_k - 1 + V beta), a token's old topic without the token, a product too (read
    # only for a topic that holds the token, n_k >= 1)
    for j in range(K):
        inv[j] = 1.0 / (n_k[j] + vbeta)
        inv_out[j] = _reciprocal_without_one(n_k[j], vbeta)
    w_prev = -1
    # the current document's K products with every token counted, and their total: a
    # word's tokens of one document come one after another, and while they keep their
    # topics neither changes
    d_summed = -1
    total_with = 0.0
    for i in range(t0, t1):
        d = tok_doc[i]
        w = tok_row[i]
        k_old = z[i]
        if w != w_prev:
            # new word: phi_k = (n_wk + beta) / (n_k + V beta), then kept up to date with
            # the two changes of each token
            for j in range(K):
                phi[j] = (n_wk[w, j] + beta) * inv[j]
            w_prev = w
            d_summed = -1
        # the token's old topic without the token (the counts themselves change only if
        # it moves: most tokens keep their topic once the chain has mixed, and then nothing
        # is written)
        phi_old = (n_wk[w, k_old] - 1 + beta) * inv_out[k_old]
        p_old = (n_dk[d, k_old] - 1 + alpha) * phi_old
        if d != d_summed:
            # the unnormalised conditional: K independent products and their total, which
            # vectorise (the old topic's term with the token, replaced below)
            total_with = 0.0
            for j in range(K):
                q = (n_dk[d, j] + alpha) * phi[j]
                p[j] = q
                total_with += q
            d_summed = d
        total = total_with + (p_old - p[k_old])
        # the inverse CDF with the old topic first, then the others in topic order: a
        # token that keeps its topic ends the serial search (the cost growing with K) at
        # its first step
        target = u[i - t0] * total
        if target < p_old:
            continue
        d_summed = -1
        acc = p_old
        p[k_old] = 0.0
        k = K - 1
        for j in range(K):
            acc += p[j]
            if target < acc:
                k = j
                break
        z[i] = k
        n_dk[d, k_old] -= 1
        n_wk[w, k_old] -= 1
        n_k[k_old] -= 1
        inv[k_old] = inv_out[k_old]
        inv_out[k_old] = _reciprocal_without_one(n_k[k_old], vbeta)
        phi[k_old] = phi_old
        n_dk[d, k] += 1
        n_wk[w, k] += 1
        n_k[k] += 1
        inv_out[k] = inv[k]
        inv[k] = 1.0 / (n_k[k] + vbeta)
        phi[k] = (n_wk[w, k] + beta) * inv[k]


def sample_dense(t0, t1, tok_row, tok_doc, z, n_wk, n_k, u, alpha, beta, vbeta,
                 dnz_ptr, dnz, dnz_cnt, n_dk, phi, p):
    """O(K) collapsed Gibbs sweep over tokens ``[t0, t1)``: inverse CDF over the K topics,
    each token's old topic first and then the others in order (as the numpy reference), the
    fastest sampler at small K.

    The documents' pair lists are unpacked into ``n_dk`` (a documents x topics scratch of
    counts, any numeric type, zero on entry and left zero) for the call, so that a token's
    conditional is a contiguous K-wide row, and packed back after it (topics in increasing
    order).  ``phi`` and ``p``: K floats of scratch.
    """
    K = n_k.shape[0]
    _sample_dense(t0, t1, tok_row, tok_doc, z, n_wk, n_k, u, alpha, beta, vbeta, dnz_ptr,
                  dnz, dnz_cnt, n_dk, phi, p, np.empty(K), np.empty(K))


# (the `_` kernels below take their arrays from their callers: dmp.kernels._jit)
@njit(cache=True, nogil=True)
def _sample_dense(t0, t1, tok_row, tok_doc, z, n_wk, n_k, u, alpha, beta, vbeta, dnz_ptr,
                  dnz, dnz_cnt, n_dk, phi, p, inv, inv_out):
    pairs_to_dense(dnz_ptr, dnz, dnz_cnt, n_dk)
    _sample_dense_rows(t0, t1, tok_row, tok_doc, z, n_wk, n_k, u, alpha, beta, vbeta, n_dk,
                       phi, p, inv, inv_out)
    dense_to_pairs(n_dk, dnz_ptr, dnz, dnz_cnt)


# below this many topics a linear scan of the dense bucket beats keeping the Fenwick tree
# (BENCHMARKS.md, "The sampler's constants")
TREE_MIN_TOPICS = 256


@njit(cache=True, nogil=True)
def _fenwick_build(tree, values):
    """``tree[1..K]``: the Fenwick (binary indexed) tree of ``values[0..K-1]``, in O(K)."""
    K = values.shape[0]
    tree[0] = 0.0
    for i in range(1, K + 1):
        tree[i] = values[i - 1]
    for i in range(1, K + 1):
        j = i + (i & -i)
        if j <= K:
            tree[j] += tree[i]


@njit(cache=True, nogil=True)
def _fenwick_add(tree, k, delta):
    K = tree.shape[0] - 1
    i = k + 1
    while i <= K:
        tree[i] += delta
        i += i & -i


@njit(cache=True, nogil=True)
def _fenwick_search(tree, target, top):
    """The first index whose prefix sum exceeds ``target`` (``K - 1`` if none does);
    ``top`` is the largest power of two not above K."""
    K = tree.shape[0] - 1
    pos = 0
    step = top
    while step > 0:
        nxt = pos + step
        if nxt <= K and tree[nxt] <= target:
            pos = nxt
            target -= tree[nxt]
        step >>= 1
    return pos if pos < K else K - 1


@njit(cache=True, nogil=True)
def _doc_bucket(dnz, base, nd, k_old, factor, ybuf):
    """The document bucket ``sum_j c_j factor[t_j]`` over a document's pairs, its running
    sums into ``ybuf``, the token's own count taken off its topic ``k_old`` on the way (one
    pass: no separate search for the old topic's pair).  Returns the total and the old
    topic's pair."""
    j_old = 0
    Y = 0.0
    for j in range(nd):
        t = dnz[base + j, 0]
        c = dnz[base + j, 1]
        if t == k_old:
            c -= 1
            dnz[base + j, 1] = c
            j_old = j
        Y += c * factor[t]
        ybuf[j] = Y
    return Y, j_old


@njit(cache=True, nogil=True)
def _doc_pick(dnz, base, nd, ybuf, target):
    """The topic of the first pair whose running sum exceeds ``target`` (< the total), its
    count raised by one.  The first such pair = the number of running sums not above the
    target (they never decrease): a branch-free count, no mispredicted early exit
    (BENCHMARKS.md, "A leaner sampler")."""
    jk = 0
    for j in range(nd):
        jk += ybuf[j] <= target
    if jk >= nd:
        jk = nd - 1
    dnz[base + jk, 1] += 1
    return dnz[base + jk, 0]


@njit(cache=True, nogil=True)
def _doc_settle(dnz, base, nd, j_old, k):
    """After a draw of ``k`` outside the document bucket: ``k`` joins the document (taking
    the pair the old topic just emptied, if it did: never more pairs than tokens, so the
    capacity min(N_d, K) holds); then, either way, an emptied old pair is replaced by the
    last one.  Returns the number of pairs."""
    if k >= 0:
        nd = _dnz_increment(dnz, base, nd, k, j_old if dnz[base + j_old, 1] == 0 else -1)
    if dnz[base + j_old, 1] == 0:
        nd -= 1
        dnz[base + j_old, 0] = dnz[base + nd, 0]
        dnz[base + j_old, 1] = dnz[base + nd, 1]
    return nd


@njit(cache=True, nogil=True)
def sample_sparse(t0, t1, tok_row, tok_doc, z, n_wk, n_k, u, alpha, beta, vbeta,
                  dnz_ptr, dnz, dnz_cnt, phi, ybuf, tree):
    """Sparse ("sample by word") collapsed Gibbs sweep over tokens ``[t0, t1)``.

    For ``K >= TREE_MIN_TOPICS``, ``tree`` (K + 1 floats) holds a Fenwick tree over the
    current word's ``phi``, so a draw from the dense bucket costs O(log K) rather than O(K).
    """
    K = n_k.shape[0]
    use_tree = K >= TREE_MIN_TOPICS
    top = 1
    while top * 2 <= K:
        top *= 2
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
            if use_tree:
                _fenwick_build(tree, phi)
            w_prev = w
        k_old = z[i]
        n_wk[w, k_old] -= 1
        n_k[k_old] -= 1
        old = phi[k_old]
        phi[k_old] = (n_wk[w, k_old] + beta) / (n_k[k_old] + vbeta)
        X += alpha * (phi[k_old] - old)
        if use_tree:
            _fenwick_add(tree, k_old, phi[k_old] - old)
        base = dnz_ptr[d]
        nd = dnz_cnt[d]
        Y, j_old = _doc_bucket(dnz, base, nd, k_old, phi, ybuf)
        target = u[i - t0] * (X + Y)
        k_new = -1
        if target < Y:
            k = _doc_pick(dnz, base, nd, ybuf, target)
        else:
            if use_tree:
                k = _fenwick_search(tree, (target - Y) / alpha, top)
            else:
                target = (target - Y) / alpha
                k = K - 1
                acc = 0.0
                for j in range(K):
                    acc += phi[j]
                    if target < acc:
                        k = j
                        break
            k_new = k
        nd = _doc_settle(dnz, base, nd, j_old, k_new)
        dnz_cnt[d] = nd
        z[i] = k
        n_wk[w, k] += 1
        n_k[k] += 1
        old = phi[k]
        phi[k] = (n_wk[w, k] + beta) / (n_k[k] + vbeta)
        X += alpha * (phi[k] - old)
        if use_tree:
            _fenwick_add(tree, k, phi[k] - old)


@njit(cache=True, nogil=True)
def _fenwick_search_n(tree, n, target, top):
    """`_fenwick_search` over the first ``n`` values of ``tree`` (``top``: the largest power
    of two not above ``n``)."""
    pos = 0
    step = top
    while step > 0:
        nxt = pos + step
        if nxt <= n and tree[nxt] <= target:
            pos = nxt
            target -= tree[nxt]
        step >>= 1
    return pos if pos < n else n - 1


@njit(cache=True, nogil=True)
def _fenwick_add_n(tree, n, k, delta):
    i = k + 1
    while i <= n:
        tree[i] += delta
        i += i & -i


@njit(cache=True, nogil=True)
def _fenwick_prefix(tree, i):
    """The sum of the first ``i`` values."""
    total = 0.0
    while i > 0:
        total += tree[i]
        i -= i & -i
    return total


@njit(cache=True, nogil=True)
def _fenwick_append(tree, n, value):
    """Append ``value`` as the ``n + 1``-th value of the tree over the first ``n``."""
    i = n + 1
    tree[i] = value + _fenwick_prefix(tree, n) - _fenwick_prefix(tree, i - (i & -i))


@njit(cache=True, nogil=True)
def _row_nonzeros(row, out):
    """The positions of ``row``'s nonzeros into ``out``; returns how many.  Eight entries
    at a time are skipped when all are zero (most of a row at large K); inside a group
    with a nonzero the positions are written branch-free."""
    K = row.shape[0]
    n = 0
    k0 = 0
    while k0 + 8 <= K:
        if (row[k0] | row[k0 + 1] | row[k0 + 2] | row[k0 + 3] | row[k0 + 4] | row[k0 + 5]
                | row[k0 + 6] | row[k0 + 7]) != 0:
            for k in range(k0, k0 + 8):
                out[n] = k
                n += row[k] != 0
        k0 += 8
    for k in range(k0, K):
        out[n] = k
        n += row[k] != 0
    return n


@njit(cache=True, nogil=True)
def _buckets_start(n_k, beta, vbeta, g, h, gtree):
    """A call's smoothing-bucket state: ``g_k = 1 / (n_k + V beta)`` and its Fenwick tree,
    ``h = beta g``; returns ``sum g`` and the tree's top power of two."""
    K = n_k.shape[0]
    gsum = 0.0
    for k in range(K):
        g[k] = 1.0 / (n_k[k] + vbeta)
        gsum += g[k]
        h[k] = beta * g[k]
    _fenwick_build(gtree, g)
    gtop = 1
    while gtop * 2 <= K:
        gtop *= 2
    return gsum, gtop


@njit(cache=True, nogil=True)
def _buckets_word(i0, i1, row, tok_doc, z, n_k, u, u0, alpha, beta, vbeta, gsum, gtop,
                  dnz_ptr, dnz, dnz_cnt, g, h, gtree, wtop, wpos, wval, wtree, ybuf):
    """Sample tokens ``[i0, i1)``, all of one word whose topic counts are ``row`` (K
    ints, updated in place); ``u[i - u0]`` is token ``i``'s uniform.  Returns the new
    ``sum g``; leaves ``wpos`` at -1 and ``h`` at ``beta g``, as on entry."""
    nw = _row_nonzeros(row, wtop)
    W = 0.0
    for j in range(nw):
        k = wtop[j]
        wpos[k] = j
        wval[j] = row[k] * g[k]
        W += wval[j]
        h[k] = (row[k] + beta) * g[k]
    _fenwick_build(wtree[:nw + 1], wval[:nw])
    wtop_pow = 1
    while wtop_pow * 2 <= nw:
        wtop_pow *= 2
    ab = alpha * beta
    for i in range(i0, i1):
        d = tok_doc[i]
        # the token leaves its topic: its count, g and the two trees
        k_old = z[i]
        row[k_old] -= 1
        n_k[k_old] -= 1
        old = g[k_old]
        g[k_old] = 1.0 / (n_k[k_old] + vbeta)
        gsum += g[k_old] - old
        _fenwick_add(gtree, k_old, g[k_old] - old)
        h[k_old] = (row[k_old] + beta) * g[k_old]
        j = wpos[k_old]
        old = wval[j]
        wval[j] = row[k_old] * g[k_old]
        W += wval[j] - old
        _fenwick_add_n(wtree, nw, j, wval[j] - old)
        base = dnz_ptr[d]
        nd = dnz_cnt[d]
        Y, j_old = _doc_bucket(dnz, base, nd, k_old, h, ybuf)
        aW = alpha * W
        target = u[i - u0] * (Y + aW + ab * gsum)
        k_new = -1
        if target < Y:
            k = _doc_pick(dnz, base, nd, ybuf, target)
        else:
            target -= Y
            if target < aW:
                k = wtop[_fenwick_search_n(wtree, nw, target / alpha, wtop_pow)]
            else:
                k = _fenwick_search(gtree, (target - aW) / ab, gtop)
            k_new = k
        nd = _doc_settle(dnz, base, nd, j_old, k_new)
        dnz_cnt[d] = nd
        # the token joins topic k (a topic new to the word's row joins its list)
        z[i] = k
        row[k] += 1
        n_k[k] += 1
        old = g[k]
        g[k] = 1.0 / (n_k[k] + vbeta)
        gsum += g[k] - old
        _fenwick_add(gtree, k, g[k] - old)
        h[k] = (row[k] + beta) * g[k]
        j = wpos[k]
        if j < 0:
            j = nw
            wtop[j] = k
            wpos[k] = j
            wval[j] = 0.0
            _fenwick_append(wtree, nw, 0.0)
            nw += 1
            if wtop_pow * 2 <= nw:
                wtop_pow *= 2
        old = wval[j]
        wval[j] = row[k] * g[k]
        W += wval[j] - old
        _fenwick_add_n(wtree, nw, j, wval[j] - old)
    for j in range(nw):
        k = wtop[j]
        wpos[k] = -1
        h[k] = beta * g[k]
    return gsum


@njit(cache=True, nogil=True)
def _word_end(tok_row, i, t1):
    """The end of the run of tokens of token ``i``'s word (tokens are sorted by word)."""
    w = tok_row[i]
    j = i + 1
    while j < t1 and tok_row[j] == w:
        j += 1
    return j


@njit(cache=True, nogil=True)
def sample_buckets(t0, t1, tok_row, tok_doc, z, n_wk, n_k, u, alpha, beta, vbeta,
                   dnz_ptr, dnz, dnz_cnt, g, h, gtree, wtop, wpos, wval, wtree, ybuf):
    """Three-bucket collapsed Gibbs sweep over tokens ``[t0, t1)``: no O(K) work per word.

    With ``g_k = 1 / (n_k + V beta)`` the conditional splits into
    ``n_dk (n_wk + beta) g_k`` (the document bucket, over the document's pairs),
    ``alpha n_wk g_k`` (the word bucket, over the topics the word's row holds, searched
    through a Fenwick tree of their values) and ``alpha beta g_k`` (the smoothing bucket,
    over all K topics through a Fenwick tree of ``g`` kept for the call) -- SparseLDA's
    buckets (Yao, Mimno and McCallum, 2009) in word-major order.  A new word costs a scan of
    its row for its nonzeros (compares only) and O(K_w); ``sample_sparse`` rebuilds a
    K-wide ``phi`` and its tree per word, which at large K, and on every one of P partitions
    (each samples every word once a sweep), outweighs the tokens.

    ``h_k = (n_wk + beta) g_k`` of the current word, the document bucket's factor, is kept
    for every topic: ``beta g_k`` where the word's row is zero, set for the word's listed
    topics when it starts and put back when it ends (one load a pair, as ``phi`` in
    `sample_sparse`, without the O(K) rebuild).

    Scratch: ``g``, ``h``, ``wval``, ``ybuf`` (K floats), ``gtree``, ``wtree`` (K + 1
    floats), ``wtop`` (K ints), ``wpos`` (K ints, -1 on entry and left so).
    """
    gsum, gtop = _buckets_start(n_k, beta, vbeta, g, h, gtree)
    i = t0
    while i < t1:
        w = tok_row[i]
        j = _word_end(tok_row, i, t1)
        gsum = _buckets_word(i, j, n_wk[w], tok_doc, z, n_k, u, t0, alpha, beta, vbeta,
                             gsum, gtop, dnz_ptr, dnz, dnz_cnt, g, h, gtree, wtop, wpos,
                             wval, wtree, ybuf)
        i = j


@njit(cache=True, nogil=True)
def sample_buckets_packed(t0, t1, tok_row, tok_doc, z, idx, val, n_topics, out_idx,
                          out_val, row, n_k, u, alpha, beta, vbeta, dnz_ptr, dnz, dnz_cnt,
                          g, h, gtree, wtop, wpos, wval, wtree, ybuf):
    """`sample_buckets` on a word block that stays in its travelling form (`pack_block`:
    the flat positions ``idx``, row-major ascending, and values ``val`` of its nonzeros):
    each sampled word's row is scattered into ``row`` (K ints, zero on entry and left so),
    sampled as in `sample_buckets` -- the same draws, bit for bit -- and gathered back;
    the block as it leaves goes into ``out_idx`` / ``out_val`` (room for ``len(idx) + t1 -
    t0`` entries: a token adds at most one nonzero), in the same order.  Returns the
    number of entries written.  No dense block is made: at large K a block's dense bytes
    are mostly zeros, which cost more to fill and to scan than its tokens to sample."""
    K = n_topics
    gsum, gtop = _buckets_start(n_k, beta, vbeta, g, h, gtree)
    E = idx.shape[0]
    e = 0
    n = 0
    i = t0
    while i < t1:
        w = tok_row[i]
        j = _word_end(tok_row, i, t1)
        lo = w * K
        while e < E and idx[e] < lo:            # rows without tokens here go as they came
            out_idx[n] = idx[e]
            out_val[n] = val[e]
            n += 1
            e += 1
        while e < E and idx[e] < lo + K:
            row[idx[e] - lo] = val[e]
            e += 1
        gsum = _buckets_word(i, j, row, tok_doc, z, n_k, u, t0, alpha, beta, vbeta,
                             gsum, gtop, dnz_ptr, dnz, dnz_cnt, g, h, gtree, wtop, wpos,
                             wval, wtree, ybuf)
        for q in range(_row_nonzeros(row, wtop)):
            k = wtop[q]
            out_idx[n] = lo + k
            out_val[n] = row[k]
            row[k] = 0
            n += 1
        i = j
    while e < E:
        out_idx[n] = idx[e]
        out_val[n] = val[e]
        n += 1
        e += 1
    return n


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def _mix64(x):
    """SplitMix64's finaliser (Steele, Lea and Flood, 2014) of a uint64."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, nogil=True)
def fill_uniforms(key, out, n):
    """``out[:n]``: uniforms in [0, 1) of the SplitMix64 stream that starts at ``key`` (a
    uint64): counter-based, so a round's numbers cost a few nanoseconds each and no
    generator is built per call."""
    s = np.uint64(key)
    for i in range(n):
        s += _GOLDEN
        out[i] = (_mix64(s) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


def doc_loglik(doc_len, n_topics, alpha, dnz_ptr, dnz, dnz_cnt):
    """sum_d [lgG(K a) - lgG(N_d + K a) + sum_k (lgG(n_dk + a) - lgG(a))] (nonzeros only;
    the counts priced through a tally, as in `word_loglik`)."""
    return _doc_loglik(doc_len, n_topics, alpha, dnz_ptr, dnz, dnz_cnt, _empty_tally())


@njit(cache=True, nogil=True)
def _doc_loglik(doc_len, n_topics, alpha, dnz_ptr, dnz, dnz_cnt, tally):
    lg_a = math.lgamma(alpha)
    lg_ka = math.lgamma(n_topics * alpha)
    total = 0.0
    for d in range(doc_len.shape[0]):
        total += lg_ka - math.lgamma(doc_len[d] + n_topics * alpha)
        base = dnz_ptr[d]
        for j in range(dnz_cnt[d]):
            c = dnz[base + j, 1]
            if c < _TALLIED_COUNTS:
                tally[(base + j) & 3, c] += 1
            else:
                total += math.lgamma(c + alpha) - lg_a
    return total + _priced_tally(tally, alpha)


@njit(cache=True, nogil=True)
def pack_nonzero(flat, idx, val):
    """Positions and values of the nonzeros of ``flat`` into ``idx`` / ``val`` (sized by
    ``np.count_nonzero``)."""
    n = 0
    for i in range(flat.shape[0]):
        if flat[i] != 0:
            idx[n] = i
            val[n] = flat[i]
            n += 1
    return n


@njit(cache=True, nogil=True)
def unpack_nonzero(idx, val, flat):
    for j in range(idx.shape[0]):
        flat[idx[j]] = val[j]


@njit(cache=True, nogil=True)
def rows_into_columns(piece, cols, out):
    """``out[:, cols[i]] = piece[i]`` for every row ``i`` of ``piece``: a word block's rows
    (words x topics) into the topics x words table, transposed tile by tile so that reads
    and writes both stay within a few cache lines (numpy's fancy-indexed transposed
    assignment walked the table column by column)."""
    R, K = piece.shape
    T = 64
    for i0 in range(0, R, T):
        i1 = min(i0 + T, R)
        for k0 in range(0, K, T):
            k1 = min(k0 + T, K)
            for i in range(i0, i1):
                c = cols[i]
                for k in range(k0, k1):
                    out[k, c] = piece[i, k]


#: the scores (`word_loglik`, `doc_loglik`) tally the counts below this and price each
#: distinct one once
_TALLIED_COUNTS = 1024


def _empty_tally():
    """Four tallies of the counts below `_TALLIED_COUNTS` (filled by position, so that runs
    of one count do not wait on each other's increments)."""
    return np.zeros((4, _TALLIED_COUNTS), dtype=np.int64)


@njit(cache=True, nogil=True)
def _priced_tally(tally, prior):
    """sum over the tallied counts c >= 1 of (how many) x (lgG(c + prior) - lgG(prior)), in
    increasing c."""
    lg_p = math.lgamma(prior)
    total = 0.0
    for c in range(1, tally.shape[1]):
        m = tally[0, c] + tally[1, c] + tally[2, c] + tally[3, c]
        if m != 0:
            total += m * (math.lgamma(c + prior) - lg_p)
    return total


def word_loglik(n_wk, beta):
    """sum over the block's rows and topics of lgG(n_wk + b) - lgG(b) (nonzeros only).

    The counts below `_TALLIED_COUNTS` are tallied (`_empty_tally`) and each distinct
    count's term is computed once; the sum depends only on which counts occur, not on their
    order or on the zeros between them, so a packed block scores exactly as its dense form."""
    return _word_loglik(n_wk, beta, _empty_tally())


@njit(cache=True, nogil=True)
def _word_loglik(n_wk, beta, tally):
    lg_b = math.lgamma(beta)
    R, K = n_wk.shape
    large = 0.0
    for r in range(R):
        for k in range(K):
            c = n_wk[r, k]
            if c < _TALLIED_COUNTS:
                tally[k & 3, c] += 1
            else:
                large += math.lgamma(c + beta) - lg_b
    return _priced_tally(tally, beta) + large


def word_loglik_of_tokens(n_wk, beta, t0, t1, tok_row, z):
    """`word_loglik` of a block whose tokens are all ``[t0, t1)`` (one partition holds the
    whole corpus), found through them: a row's nonzero counts are at its tokens' topics, so
    the work is O(tokens), not O(rows x K).  The same value bit for bit; NaN when a count
    reaches `_TALLIED_COUNTS` (the caller then scores the whole block)."""
    # seen: the last row each topic was tallied for (tokens come grouped by row)
    return _word_loglik_of_tokens(n_wk, beta, t0, t1, tok_row, z, _empty_tally(),
                                  np.full(n_wk.shape[1], -1, dtype=np.int64))


@njit(cache=True, nogil=True)
def _word_loglik_of_tokens(n_wk, beta, t0, t1, tok_row, z, tally, seen):
    for i in range(t0, t1):
        r = tok_row[i]
        k = z[i]
        c = n_wk[r, k]
        if c >= _TALLIED_COUNTS:
            return np.nan
        # (no branch on the topic seen before: which one it is, is random)
        tally[k & 3, c] += seen[k] != r
        seen[k] = r
    return _priced_tally(tally, beta)


@njit(cache=True, nogil=True)
def topic_loglik(n_k, vbeta):
    """``-sum_k lgG(n_k + V b)``: the topic totals' part of log p(w, z) (the driver's, once
    per sweep: compiled, as a Python loop over K numpy scalars costs more than the rest of a
    small corpus's scoring)."""
    total = 0.0
    for k in range(n_k.shape[0]):
        total -= math.lgamma(n_k[k] + vbeta)
    return total


def fold_in(doc_ptr, tok_word, phi_wk, alpha, n_iter, u, z, theta):
    """Gibbs fold-in with the topics fixed: ``p(z = k) ∝ (n_dk + alpha) phi_wk``.

    ``u`` holds ``n_iter`` uniforms per token (iteration-major); ``z`` the initial topics.
    ``theta`` (D x K) receives the doc-topic counts averaged over the second half of the
    iterations.
    """
    K = phi_wk.shape[1]
    _fold_in(doc_ptr, tok_word, phi_wk, alpha, n_iter, u, z, theta, np.empty(K), np.empty(K))


@njit(cache=True, nogil=True)
def _fold_in(doc_ptr, tok_word, phi_wk, alpha, n_iter, u, z, theta, cdf, cnt):
    D = doc_ptr.shape[0] - 1
    K = phi_wk.shape[1]
    n_tok = tok_word.shape[0]
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
