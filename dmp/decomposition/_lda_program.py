"""STRADS LDA: collapsed Gibbs sampling with word rotation, as a `dmp.engine.Program`.

Documents are sharded over the P partitions; each owns its documents' tokens, topic
assignments ``z`` and doc-topic counts ``n_dk``.  The vocabulary is dealt into P word blocks
(balanced by token count: `word_blocks`); the word-topic table
``n_wk`` exists only as these P blocks.  In round ``r`` partition ``p`` holds block
``(p + r) mod P`` exclusively, works on its own tokens of those words, and hands the block to
partition ``p - 1`` (`Sends`: worker to worker) -- after P rounds every block has visited every
partition once.

* Rounds ``0 .. P-1`` (one rotation) build the table: each partition adds its tokens' counts
  to the block it holds.  Round 0's pull also sums the topic totals ``n_k``.
* Every later round is a sub-round of a Gibbs sweep: the partition samples its tokens of the
  held block against its copy of ``n_k`` and sends its change of ``n_k`` to every other
  partition (with the block to its neighbour), which adds it before its next sub-round: every
  sub-round samples against the exact totals of the round before, on any backend and worker
  count, and the driver is out of the loop -- its pulls only score the rounds (sum the
  changes; the last sub-round of a sweep also returns the log-likelihood parts, so the pull
  records ``log p(w, z)`` once per sweep), so the runner issues the sub-rounds in batches
  (`Program.batch_rounds`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .. import config
from ..engine.program import Broadcast, DriverState, Message, Program, Sends, unexpected
from . import _lda_kernels as kernels


@dataclass(frozen=True)
class CountPlan(Message):
    """A round of the first rotation: add the partition's token counts to the held block."""

    round: int


@dataclass(frozen=True)
class SamplePlan(Message):
    """A Gibbs sub-round over the partition's tokens of the held block."""

    round: int
    #: the last sub-round of a sweep (its partial says when the sweep ended)
    last: bool
    #: the sweep's state is scored: the partial carries the log-likelihood parts (the last
    #: sub-round of every ``evaluate_every``-th sweep and of the fit's last sweep)
    score: bool = False


_PLANS = (CountPlan, SamplePlan)


@dataclass
class LDADriver(DriverState):
    """The driver's state of `LDAProgram`."""

    #: number of partitions
    P: int
    #: topic totals, once round 0 is pulled
    n_k: np.ndarray | None = None
    #: log-likelihood of the last sweep, sweeps done
    ll: float = math.nan
    sweep: int = 0
    #: tokens per second of the last sweep, and when it ended (wall clock)
    tokens_s: float = math.nan
    t_sweep: float | None = None
    n_tokens: int = 0
    #: "count" during the first rotation, then "sample"
    phase: str = "count"
    #: the fit's result (`LDAProgram.collect_counts`): topic-word counts, topic assignments
    n_kw: np.ndarray | None = field(default=None, repr=False)
    z: list | None = field(default=None, repr=False)


def check_count_values(data, what: str) -> None:
    """Raise `ValueError` unless every value of ``data`` is a token count (a finite,
    non-negative integer).

    The one check of LDA's input: `check_counts` runs it on an in-memory matrix on the
    driver, `LDAProgram.init_partition` on every store shard as it loads on the worker.
    """
    d = np.asarray(data)
    if not np.all(np.isfinite(d)):
        raise ValueError(f"{what} contains NaN or infinite counts")
    if np.any(d < 0):
        raise ValueError(f"{what} contains negative counts (min {d.min():g}). Negative "
                         f"values in data are not token counts")
    frac = d != np.round(d)
    if np.any(frac):
        raise ValueError(f"{what} contains non-integer counts (e.g. {d[frac][0]:g}); LDA "
                         f"needs token counts")


def check_documents(indptr, what: str, first_row: int = 0) -> None:
    """Raise `ValueError` if a document (a row of the CSR ``indptr``, whose stored counts
    are all positive) holds no token; ``first_row`` numbers the rows in the message.

    The one check of LDA's documents, as `check_count_values` is of its counts: run by the
    estimator on an in-memory matrix and by `LDAProgram.init_partition` on every store shard
    as it loads on the worker."""
    empty = np.flatnonzero(np.diff(np.asarray(indptr)) == 0)
    if len(empty):
        raise ValueError(f"{what} has {len(empty)} empty document(s) (no tokens), e.g. rows "
                         f"{(empty[:5] + first_row).tolist()}; remove them before fitting")


def word_blocks(n_words: int, n_blocks: int, seed: int,
                weights=None) -> tuple[np.ndarray, np.ndarray]:
    """``(block, row)`` of every word; ``row`` is the word's position in its block (blocks
    keep word-id order).

    Without ``weights``: a seeded shuffle dealt round-robin.  With ``weights`` (the words'
    token counts): heaviest first, equal weights in seeded random order, dealt in snake order
    (0, 1, .., P-1, P-1, .., 0) so that every block gets about the same number of tokens --
    a sub-round lasts as long as its slowest partition.
    """
    perm = np.random.default_rng([seed, 7]).permutation(n_words)
    if weights is None:
        block = (perm % n_blocks).astype(np.int32)
    else:
        order = perm[np.argsort(-np.asarray(weights)[perm], kind="stable")]
        cyc = np.arange(n_words) % (2 * n_blocks)
        block = np.empty(n_words, dtype=np.int32)
        block[order] = np.where(cyc < n_blocks, cyc, 2 * n_blocks - 1 - cyc)
    row = np.empty(n_words, dtype=np.int32)
    for b in range(n_blocks):
        words = np.flatnonzero(block == b)
        row[words] = np.arange(len(words), dtype=np.int32)
    return block, row


def block_sizes(block: np.ndarray, n_blocks: int) -> np.ndarray:
    return np.bincount(block, minlength=n_blocks).astype(np.int64)


def _stream_key(*values: int) -> np.uint64:
    """A SplitMix64 stream's start, mixed from integers (``seed, round, part``)."""
    mask, key = (1 << 64) - 1, 0x243F6A8885A308D3
    for v in values:
        x = (key ^ (int(v) & mask)) + 0x9E3779B97F4A7C15 & mask
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & mask
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & mask
        key = x ^ (x >> 31)
    return np.uint64(key)


def round_uniforms(seed: int, round: int, part: int, n: int, out=None) -> np.ndarray:
    """The uniforms partition ``part`` uses in ``round`` (one per token sampled), written
    into ``out[:n]`` when given (the same values): the SplitMix64 stream of ``(seed, round,
    part)`` (`_lda_kernels.fill_uniforms`; a numpy generator built per round cost more than
    sampling a small corpus's round)."""
    if out is None:
        out = np.empty(n)
    kernels.fill_uniforms(_stream_key(seed, 1, round, part), out, n)
    return out[:n]


def expand_tokens(indptr, indices, data, block, row, n_blocks):
    """Tokens of a document shard (CSR counts), sorted by (word block, word row, document).

    Returns ``tok_doc, tok_row, tok_word, block_ptr`` (``block_ptr[b]:block_ptr[b+1]`` are the
    tokens of block ``b``) and the document lengths.
    """
    counts = data.astype(np.int64)
    n_docs = len(indptr) - 1
    doc_of_entry = np.repeat(np.arange(n_docs, dtype=np.int32), np.diff(indptr))
    tok_word = np.repeat(indices.astype(np.int32), counts)
    tok_doc = np.repeat(doc_of_entry, counts)
    order = np.lexsort((tok_doc, row[tok_word], block[tok_word]))
    tok_word, tok_doc = tok_word[order], tok_doc[order]
    tok_row = row[tok_word]
    block_ptr = np.zeros(n_blocks + 1, dtype=np.int64)
    np.cumsum(np.bincount(block[tok_word], minlength=n_blocks), out=block_ptr[1:])
    doc_len = np.bincount(doc_of_entry, weights=counts, minlength=n_docs).astype(np.int64)
    return tok_doc, tok_row, tok_word, block_ptr, doc_len


def _travels_dense(nnz: int, shape, itemsize: int) -> bool:
    """Whether a block of ``nnz`` nonzeros travels dense: its nonzeros (8 bytes each) would
    take at least half its dense bytes."""
    return nnz * 8 >= int(np.prod(shape)) * itemsize // 2


def empty_block(shape) -> dict:
    """A word block of no counts in `pack_block`'s form."""
    dtype = np.int32 if int(np.prod(shape)) < 2**31 else np.int64
    return {"shape": tuple(shape), "idx": np.empty(0, dtype=dtype),
            "val": np.empty(0, dtype=np.int32)}


def count_packed(packed: dict, t0, t1, tok_row, z):
    """`kernels.count_block` on a block in `pack_block`'s form: its nonzeros with one count
    added for each token ``[t0, t1)`` at (its word row, its topic), in the same form (dense
    once most of its counts are nonzero, as `pack_block` decides)."""
    K = packed["shape"][1]
    idx, val = packed["idx"], packed["val"]
    keys = np.concatenate([idx.astype(np.int64),
                           tok_row[t0:t1].astype(np.int64) * K + z[t0:t1]])
    counts = np.concatenate([val, np.ones(t1 - t0, dtype=val.dtype)])
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    starts = np.flatnonzero(np.diff(keys, prepend=-1))
    out = {"shape": packed["shape"], "idx": keys[starts].astype(idx.dtype),
           # (reduceat would sum int32 counts into int64: twice the bytes, dense or not)
           "val": np.add.reduceat(counts, starts, dtype=val.dtype) if len(starts) else counts}
    if _travels_dense(len(starts), packed["shape"], val.itemsize):
        return unpack_block(out)
    return out


def pack_block(table: np.ndarray):
    """A word block as it travels: its nonzeros (position, count) when that is less than half
    the dense bytes -- at large K most word-topic counts are zero -- else the block itself."""
    flat = table.reshape(-1)
    nnz = int(np.count_nonzero(flat))
    if _travels_dense(nnz, table.shape, table.itemsize):
        return table
    idx = np.empty(nnz, dtype=np.int32 if flat.size < 2**31 else np.int64)
    val = np.empty(nnz, dtype=table.dtype)
    kernels.pack_nonzero(flat, idx, val)
    return {"shape": table.shape, "idx": idx, "val": val}


# a block sent on packed whose memory is at most ``dmp.lda.spare-block-bytes`` is kept to
# take the next block unpacked (`unpack_block`): a fresh block costs a page fault per page it
# touches, as much CPU time as sampling its tokens at K = 100.  A larger one is let go: a
# fresh block's untouched pages stay unmapped, and the block of a model larger than a worker
# is mostly zeros, so a reused one would keep the pages of every block it held resident
def unpack_block(packed, spare=None) -> np.ndarray:
    """The dense block of ``pack_block``'s output.  ``spare``: ``(block, positions)``, a
    dense block no longer needed and the flat positions of its nonzeros (those it was
    packed with), whose memory takes the new block when large enough."""
    if isinstance(packed, np.ndarray):
        return packed
    shape, dtype = packed["shape"], packed["val"].dtype
    n = int(np.prod(shape))
    if spare is not None and spare[0].dtype == dtype and spare[0].size >= n:
        flat = spare[0].reshape(-1)
        flat[spare[1]] = 0
        table = flat[:n].reshape(shape)
    else:
        table = np.zeros(shape, dtype=dtype)
    kernels.unpack_nonzero(packed["idx"], packed["val"], table.reshape(-1))
    return table


class LDAProgram(Program):
    """Driver and worker logic of word-rotation LDA (see the module docstring).

    Parameters
    ----------
    dataset : row dataset of documents x words counts (``dmp.io.SparseRowDataset`` or the
        in-memory equivalent)
    n_topics, alpha, beta : int, float, float
    n_sweeps : int
        Gibbs sweeps after the counting rotation.
    sampler : {"sparse", "dense", "buckets", "auto"}
        ``"auto"``: `pick_sampler`'s choice (`sampler` holds the one picked).
    seed : int
    """

    name = "lda"
    # the log-likelihood per token: higher is better (`dmp.engine.events.primary_of`)
    primary_metric = "ll_per_token"
    primary_direction = "max"
    uses_ring = True
    # the word-topic table comes over in pieces (`collect_counts`), not the whole partitions
    gather_partitions = False

    def __init__(self, dataset, *, n_topics, alpha, beta, n_sweeps, sampler, seed,
                 evaluate_every=1):
        super().__init__()
        if int(evaluate_every) < 1:
            raise ValueError(f"evaluate_every must be >= 1, got {evaluate_every}")
        if sampler not in ("sparse", "dense", "buckets", "auto"):
            raise ValueError(f"sampler must be 'sparse', 'dense', 'buckets' or 'auto', got "
                             f"{sampler!r}")
        # word frequencies balance the word blocks (None: a store without them, random deal)
        sums = dataset.column_sums() if hasattr(dataset, "column_sums") else None
        self.word_freq = None if sums is None else np.asarray(sums, dtype=np.int64)
        if sampler == "auto":
            n_docs = int(dataset.shape[0])
            mean_len = (float(self.word_freq.sum()) / n_docs
                        if self.word_freq is not None and n_docs else None)
            sampler = kernels.pick_sampler(n_topics, mean_len)
        self.dataset = dataset
        self.n_topics = int(n_topics)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.n_sweeps = int(n_sweeps)
        self.evaluate_every = int(evaluate_every)
        self.sampler = sampler
        self.seed = int(seed)
        self.n_words = int(dataset.shape[1])

    # ================================================================== worker side
    def _check_shards(self, X, ks) -> None:
        """`check_count_values` and `check_documents` of the loaded shards ``ks`` (stacked
        in ``X``), naming the shard at fault (and the documents by their corpus rows)."""
        try:
            check_count_values(X.data, "X")
            check_documents(X.indptr, "X")
        except ValueError:
            bounds, row = self.dataset.row_bounds, 0
            where = getattr(self.dataset, "path", None)
            where = "in memory" if where is None else repr(where)
            for k in ks:
                n = int(bounds[k + 1] - bounds[k])
                check_count_values(X.data[X.indptr[row]:X.indptr[row + n]],
                                   f"corpus {where}, shard {k}")
                check_documents(X.indptr[row:row + n + 1], f"corpus {where}, shard {k}",
                                int(bounds[k]))
                row += n
            raise

    def init_partition(self, spec):
        X, _ = self.dataset.load_row_shards(spec["shards"])
        X = X.tocsr()
        # a store is not checked on the driver (it never reads the shards): here, on the
        # worker, with the check of in-memory input
        self._check_shards(X, spec["shards"])
        P, p = spec["n_parts"], spec["index"]
        block, row = word_blocks(self.n_words, P, self.seed, self.word_freq)
        tok_doc, tok_row, tok_word, block_ptr, doc_len = expand_tokens(
            X.indptr, X.indices, X.data, block, row, P)
        Kt = self.n_topics
        z = np.random.default_rng([self.seed, 2, p]).integers(0, Kt, len(tok_doc)).astype(
            np.int32)
        dnz_ptr, dnz, dnz_cnt = kernels.doc_topic_lists(tok_doc, z, len(doc_len), Kt)
        sizes = block_sizes(block, P)
        n_k = np.bincount(z, minlength=Kt).astype(np.int64)
        return {"p": p, "P": P, "tok_doc": tok_doc, "tok_row": tok_row, "z": z,
                "block_ptr": block_ptr, "doc_len": doc_len,
                "dnz_ptr": dnz_ptr, "dnz": dnz, "dnz_cnt": dnz_cnt,
                "sizes": sizes, "local_nk": n_k,
                # the block this partition starts with: its own, empty
                "held": (p, empty_block((int(sizes[p]), Kt)) if self._keeps_packed(P)
                         else np.zeros((int(sizes[p]), Kt), dtype=np.int32)),
                # blocks arrived (by the round they were sent in), and the other
                # partitions' changes of n_k (summed per round) not yet added to n_k
                "inbox": {}, "n_k": None, "dn_in": {},
                # the last block sent on packed (and where its nonzeros were): its memory
                # takes the next one unpacked
                "spare": None,
                # the uniforms of a push (the most tokens of any of its word blocks)
                "u": np.empty(int(np.diff(block_ptr).max(initial=0))),
                # one more than the round of this partition's last finished push
                "next_push": 0,
                "phi": np.empty(Kt), "buf": np.empty(Kt), "tree": np.empty(Kt + 1)}

    def receive(self, s, round, src, payload):
        blk, dn = payload
        if dn is not None:
            # a new array, never an update in place: in process every receiver gets the
            # sender's own array
            acc = s["dn_in"].get(round)
            s["dn_in"][round] = dn if acc is None else acc + dn
        if blk is not None:
            self._receive_block(s, round, blk)

    def _receive_block(self, s, round, blk):
        # the block for round + 1; it may arrive while this partition still samples the
        # block of round `round` (a neighbour a round ahead), so the inbox is keyed by round,
        # and it is kept as it travelled (its nonzeros when most counts are zero) until its
        # round takes it (see `partition_nbytes`).  The block of the
        # next push arriving after this partition's push of `round` finished (so no push
        # holds a dense block: the next one waits for this very block) is unpacked at once,
        # off that push's critical path (BENCHMARKS.md, "A model larger than a worker")
        b, packed = blk
        if s["next_push"] == round + 1 and not self._keeps_packed(s["P"]):
            blk = (b, self._unpack(s, packed))
        s["inbox"][round] = blk

    def lead_rounds(self, n_partitions):
        # the counting rotation (P rounds of counting, far cheaper than a sampling
        # sub-round) and the first sweep (P sub-rounds from random topics, where a document
        # holds min(K, its length) topics: 1.2-1.4x the second sweep's cost at K = 100-1000;
        # BENCHMARKS.md, "Lead rounds and ring bytes")
        return 2 * max(int(n_partitions), 1)

    def warm_up_rounds(self, n_partitions):
        # a counting round, then the first sampling sub-round
        return max(int(n_partitions), 1) + 1

    def _keeps_packed(self, P) -> bool:
        """Whether the partitions of a fit on ``P`` count and sample a word block in the
        form it travelled in, never making it dense: the buckets sampler's on several
        partitions (`count_packed`, `kernels.sample_buckets_packed`); a lone partition
        keeps its one block dense."""
        return self.sampler == "buckets" and P > 1

    @staticmethod
    def _unpack(s, packed):
        """`unpack_block` into the partition's spare block, which it uses up."""
        spare, s["spare"] = s["spare"], None
        return unpack_block(packed, spare)

    def _take_block(self, s, round):
        if round > 0:
            if round - 1 not in s["inbox"]:
                raise RuntimeError(f"partition {s['p']}: no word block arrived for round "
                                   f"{round}")
            s["held"] = s["inbox"].pop(round - 1)
        b, table = s["held"]
        if isinstance(table, dict) and not self._keeps_packed(s["P"]):
            table = self._unpack(s, table)
        want = (s["p"] + round) % s["P"]
        if b != want:
            raise RuntimeError(f"partition {s['p']} holds word block {b} in round {round}, "
                               f"expected {want}")
        return b, table

    def push(self, s, plan):
        if not isinstance(plan, _PLANS):
            raise unexpected(self, "a plan", plan, _PLANS)
        try:
            return self._push(s, plan)
        finally:
            s["next_push"] = plan.round + 1

    def _push(self, s, plan):
        round = plan.round
        b, table = self._take_block(s, round)
        t0, t1 = int(s["block_ptr"][b]), int(s["block_ptr"][b + 1])
        dest = (s["p"] - 1) % s["P"]
        # the block now belongs to the neighbour: drop it here, so a worker holds its next
        # block and (while it arrives) the one in transit, never an old one besides
        s["held"] = None
        match plan:
            case CountPlan():
                if isinstance(table, dict):
                    table = count_packed(table, t0, t1, s["tok_row"], s["z"])
                else:
                    kernels.count_block(t0, t1, s["tok_row"], s["tok_doc"], s["z"], table)
                partial = {"n_k": s["local_nk"].copy()} if round == 0 else {}
                return Sends(partial, {dest: ((b, self._pack(s, table, dest)), None)})
            case SamplePlan():
                return self._sample(s, plan, round, b, table, t0, t1, dest)

    def _sample(self, s, plan: SamplePlan, round, b, table, t0, t1, dest):
        n_k = self._totals(s, round)
        before = n_k.copy()
        u = round_uniforms(self.seed, round, s["p"], t1 - t0, out=s["u"])
        vbeta = self.n_words * self.beta
        if self.sampler == "buckets":
            if "wpos" not in s:
                # the word bucket's list, positions (-1: not listed), values and tree
                K = self.n_topics
                s["wtop"], s["wpos"] = np.empty(K, np.int32), np.full(K, -1, np.int32)
                s["wval"], s["wtree"], s["h"] = np.empty(K), np.empty(K + 1), np.empty(K)
            scratch = (s["dnz_ptr"], s["dnz"], s["dnz_cnt"], s["phi"], s["h"], s["tree"],
                       s["wtop"], s["wpos"], s["wval"], s["wtree"], s["buf"])
            if isinstance(table, dict):
                table = self._sample_packed(s, table, t0, t1, n_k, u, vbeta, scratch)
            else:
                kernels.sample_buckets(t0, t1, s["tok_row"], s["tok_doc"], s["z"], table,
                                       n_k, u, self.alpha, self.beta, vbeta, *scratch)
        elif self.sampler == "sparse":
            kernels.sample_sparse(t0, t1, s["tok_row"], s["tok_doc"], s["z"], table, n_k, u,
                                  self.alpha, self.beta, vbeta, s["dnz_ptr"], s["dnz"],
                                  s["dnz_cnt"], s["phi"], s["buf"], s["tree"])
        else:
            if "n_dk" not in s:
                # the dense sampler's documents x topics counts (zero between calls), in the
                # pairs' integer type: a token reads a random document's row, and 16-bit rows
                # are a quarter of float64's bytes
                s["n_dk"] = np.zeros((len(s["doc_len"]), self.n_topics), dtype=s["dnz"].dtype)
            kernels.sample_dense(t0, t1, s["tok_row"], s["tok_doc"], s["z"], table, n_k, u,
                                 self.alpha, self.beta, vbeta, s["dnz_ptr"], s["dnz"],
                                 s["dnz_cnt"], s["n_dk"], s["phi"], s["buf"])
        dn = n_k - before
        partial = {"dn_k": dn, "tokens": t1 - t0}
        if plan.score:
            partial["ll_doc"] = kernels.doc_loglik(s["doc_len"], self.n_topics, self.alpha,
                                             s["dnz_ptr"], s["dnz"], s["dnz_cnt"])
            ll_word = np.nan
            if s["P"] == 1 and not isinstance(table, dict):
                # a lone partition holds every token of its block: its rows' nonzeros are
                # found through them (O(tokens), not O(words x K))
                ll_word = kernels.word_loglik_of_tokens(table, self.beta, t0, t1,
                                                        s["tok_row"], s["z"])
            if np.isnan(ll_word):
                # (a packed block's nonzeros score as its dense form)
                ll_word = kernels.word_loglik(
                    table["val"].reshape(1, -1) if isinstance(table, dict) else table,
                    self.beta)
            partial["ll_word"] = ll_word
        if plan.last:
            # when the sweep ended here (wall clock, comparable across the workers): the
            # driver scores batched rounds after the batch, so its own clock cannot say
            partial["t_end"] = time.time()
        messages = {q: (None, dn) for q in range(s["P"]) if q != s["p"]}
        # the neighbour's message carries the block too (a lone partition sends it to itself)
        messages[dest] = ((b, self._pack(s, table, dest)), dn if dest != s["p"] else None)
        return Sends(partial, messages)

    def _sample_packed(self, s, packed, t0, t1, n_k, u, vbeta, scratch):
        """`kernels.sample_buckets_packed` on a block as it travelled; returns the block
        as it travels on (dense once most of its counts are nonzero, as `pack_block`)."""
        if "row" not in s:
            s["row"] = np.zeros(self.n_topics, dtype=np.int32)
        idx, val = packed["idx"], packed["val"]
        room = len(idx) + (t1 - t0)
        out_idx, out_val = np.empty(room, dtype=idx.dtype), np.empty(room, dtype=val.dtype)
        n = kernels.sample_buckets_packed(t0, t1, s["tok_row"], s["tok_doc"], s["z"], idx,
                                          val, self.n_topics, out_idx, out_val, s["row"],
                                          n_k, u, self.alpha, self.beta, vbeta, *scratch)
        out = {"shape": packed["shape"], "idx": out_idx[:n], "val": out_val[:n]}
        if _travels_dense(n, packed["shape"], val.itemsize):
            return unpack_block(out)
        return out

    @staticmethod
    def _totals(s, round):
        """The topic totals round ``round`` samples against: with the other partitions'
        changes of the round before, all of which arrived (the runner waits for the declared
        messages, `ring_inbox`)."""
        others = s["dn_in"].pop(round - 1, None)
        if others is not None:
            s["n_k"] += others
        return s["n_k"]

    @staticmethod
    def _pack(s, table, dest):
        """The block as it travels to ``dest``; a block that travels as its nonzeros stays
        here as the spare.  Packing only pays for bytes on the wire: a lone partition keeps
        its block as it is."""
        if dest == s["p"] or isinstance(table, dict):
            return table
        packed = pack_block(table)
        if packed is not table and table.nbytes <= config.nbytes("dmp.lda.spare-block-bytes"):
            s["spare"] = (table, packed["idx"])
        return packed

    def apply(self, s, update):
        # the totals of the counting rotation (the sampling rounds' pulls send nothing)
        s["n_k"] = np.array(update["n_k"], dtype=np.int64)

    @staticmethod
    def _next_block(s):
        """Between rounds: (round it was sent in, block id, table) of the block this
        partition works on next (-1: the one it holds, before the first round)."""
        if s["inbox"]:
            (r, (b, packed)), = s["inbox"].items()
            # into the spare: with it, a second dense block would not fit where the
            # memory estimate says one does
            return r, b, LDAProgram._unpack(s, packed)
        if s["held"] is None:
            raise RuntimeError(f"partition {s['p']} holds no word block between rounds")
        b, table = s["held"]
        return -1, b, unpack_block(table) if isinstance(table, dict) else table

    def partition_arrays(self, s):
        r, b, table = self._next_block(s)
        # the documents' topic lists too: their order is part of the sparse sampler's state
        out = {"z": s["z"], "block_id": np.array([b, r]), "block": table,
               "dnz_topics": s["dnz"][:, 0], "dnz_cnt": s["dnz_cnt"]}
        if s["n_k"] is not None:
            # the totals the next push samples against: with the changes received for it
            out["n_k"] = s["n_k"] + sum(s["dn_in"].values(), np.zeros_like(s["n_k"]))
        return out

    def restore_partition(self, s, arrays):
        z = np.asarray(arrays["z"], dtype=np.int32)
        if z.shape != s["z"].shape:
            raise ValueError(f"checkpoint 'z' has {z.shape[0]} tokens, this partition "
                             f"has {s['z'].shape[0]}")
        s["z"][:] = z
        # the lists' order comes from the checkpoint, their counts from the assignments
        topics = np.asarray(arrays["dnz_topics"], dtype=np.int32)
        cnt = np.asarray(arrays["dnz_cnt"], dtype=np.int32)
        if topics.shape != (s["dnz"].shape[0],) or cnt.shape != s["dnz_cnt"].shape:
            raise ValueError("checkpoint document-topic lists do not match this partition")
        Kt = self.n_topics
        keys, counts = np.unique(s["tok_doc"].astype(np.int64) * Kt + s["z"],
                                 return_counts=True)
        docs, slots = kernels.pair_slots(s["dnz_ptr"], cnt)
        want = docs * Kt + topics[slots]
        at = np.searchsorted(keys, want)
        if len(want) != len(keys) or not np.array_equal(keys[np.minimum(at, len(keys) - 1)],
                                                        want):
            raise ValueError("checkpoint document-topic lists do not match its assignments")
        s["dnz"][:] = 0
        s["dnz"][slots, 0] = topics[slots]
        s["dnz"][slots, 1] = counts[at]
        s["dnz_cnt"][:] = cnt
        s["local_nk"] = np.bincount(s["z"], minlength=self.n_topics).astype(np.int64)
        b, r = (int(v) for v in arrays["block_id"])
        table = np.array(arrays["block"], dtype=np.int32)
        if r < 0:
            s["held"], s["inbox"] = (b, table), {}
        else:
            s["inbox"] = {r: (b, table)}
        # (-1: the next push's round is not known here; its block then waits packed)
        s["next_push"] = r + 1 if r >= 0 else -1
        s["n_k"] = np.array(arrays["n_k"], dtype=np.int64) if "n_k" in arrays else None
        s["dn_in"] = {}

    def check_counts(self, s) -> dict:
        """Count invariants of this partition (for tests): doc-topic rows sum to document
        lengths, no negative counts, the nonzero-topic lists match ``n_dk``."""
        n_dk = np.zeros((len(s["doc_len"]), self.n_topics), dtype=np.int64)
        np.add.at(n_dk, (s["tok_doc"], s["z"]), 1)
        lists = kernels.doc_topic_counts(s["dnz_ptr"], s["dnz"], s["dnz_cnt"], self.n_topics)
        ok_len = bool(np.array_equal(lists.sum(axis=1), s["doc_len"]))
        lists_ok = bool(np.array_equal(lists, n_dk)) and all(
            len(set(s["dnz"][s["dnz_ptr"][d]:s["dnz_ptr"][d] + s["dnz_cnt"][d], 0]))
            == s["dnz_cnt"][d] for d in range(len(s["doc_len"])))
        _, b, table = self._next_block(s)
        return {"doc_lengths": ok_len, "nonnegative": bool(lists.min(initial=0) >= 0
                                                          and table.min(initial=0) >= 0),
                "doc_topic_lists": lists_ok, "block": int(b), "block_counts": table.sum(axis=1),
                "local_n_k": np.bincount(s["z"], minlength=self.n_topics)}

    # ================================================================== driver side
    def partition_specs(self, n_partitions):
        groups = self.dataset.row_partition(n_partitions)
        return [{"shards": g, "index": k, "n_parts": n_partitions}
                for k, g in enumerate(groups)]

    def partition_nbytes(self, spec):
        ds = self.dataset
        if not hasattr(ds, "shard_nnz"):
            return None
        entries = int(np.asarray(ds.shard_nnz())[spec["shards"]].sum())
        P = spec["n_parts"]
        block_rows = math.ceil(self.n_words / P)
        dense = block_rows * self.n_topics * 4
        # a block travels as its nonzeros (8 bytes each, at most one per token of its words)
        # when that is under half the dense bytes (`pack_block`), else dense
        travel = dense
        if self.word_freq is not None:
            block, _ = word_blocks(self.n_words, P, self.seed, self.word_freq)
            tokens = int(np.bincount(block, weights=self.word_freq, minlength=P).max())
            if 8 * tokens < dense // 2:
                travel = 8 * tokens
        # the block being sampled (dense) and the one arriving: no partition runs more than
        # a round ahead of another (each push waits for every other's round before).  The
        # buckets sampler on several partitions keeps its blocks packed while it counts and
        # samples, but makes the block dense to checkpoint or collect it: the same peak
        waiting = 1 if P > 1 else 0
        # the dense sampler's documents x topics scratch
        scratch = 0
        if self.sampler == "dense" and hasattr(ds, "row_bounds"):
            bounds = np.asarray(ds.row_bounds)
            rows = int(sum(bounds[k + 1] - bounds[k] for k in spec["shards"]))
            scratch = rows * self.n_topics * 8
        # per token: document, word row, topic (and the sort's temporaries) plus at most one
        # [topic, count] pair; each stored entry is at least one token, so this is a lower
        # bound; the word maps
        return entries * 24 + dense + waiting * travel + self.n_words * 8 + scratch

    def start(self, n_partitions):
        self.driver = LDADriver(P=n_partitions)

    @property
    def n_rounds(self) -> int:
        P = self.driver.P
        return P * (self.n_sweeps + 1)

    def schedule(self, round):
        P = self.driver.P
        if round < P:
            return [CountPlan(round)] * P
        last = (round - P) % P == P - 1
        sweep = (round - P) // P + 1
        score = last and (sweep % self.evaluate_every == 0 or sweep == self.n_sweeps)
        return [SamplePlan(round, last, score)] * P

    def needs_barrier(self, round):
        # the first sampling round needs the totals of the counting rotation
        return round == self.driver.P

    def ring_inbox(self, round):
        # every partition hands its block to its left neighbour each round, and once
        # sampling its change of the totals to every other partition (with the block to the
        # neighbour)
        P = self.driver.P
        if P == 1:
            return [0]
        return [1] * P if round < P else [P - 1] * P

    def batch_rounds(self, round):
        # sampling rounds take everything from the other partitions' messages
        P = self.driver.P
        return 1 if round < P else self.n_rounds - round

    def pull(self, round, partials):
        dr = self.driver
        P = dr.P
        if round < P:
            if round == 0:
                dr.n_k = np.sum([q["n_k"] for q in partials], axis=0).astype(np.int64)
                dr.n_tokens = int(dr.n_k.sum())
                dr.t_sweep = time.time()
            dr.phase = "count"
            return Broadcast({"round": round, "n_k": dr.n_k})
        dr.phase = "sample"
        # (one partition: its change as it is; a sum over a list of one costs as much)
        dn = partials[0]["dn_k"] if P == 1 else np.sum([q["dn_k"] for q in partials], axis=0)
        dr.n_k = dr.n_k + dn
        if partials[0].get("ll_doc") is not None:
            Kt, V, b = self.n_topics, self.n_words, self.beta
            ll = sum(q["ll_doc"] + q["ll_word"] for q in partials)
            ll += Kt * math.lgamma(V * b) + kernels.topic_loglik(dr.n_k, V * b)
            dr.ll = ll
        if partials[0].get("t_end") is not None:
            dr.sweep += 1
            now = max(q["t_end"] for q in partials)
            dr.tokens_s = dr.n_tokens / max(now - dr.t_sweep, 1e-12)
            dr.t_sweep = now
        return None

    def metrics(self):
        dr = self.driver
        n = max(dr.n_tokens, 1)
        return {"sweep": dr.sweep, "phase": dr.phase, "log_likelihood": dr.ll,
                "ll_per_token": dr.ll / n, "tokens_per_s": dr.tokens_s,
                "n_k_min": int(dr.n_k.min()) if dr.n_k is not None else 0}

    def progress_postfix(self):
        return {"sweep": self.driver.sweep,
                "ll_per_token": f"{self.metrics()['ll_per_token']:.4f}"}

    def driver_state(self):
        dr = self.driver
        return {"n_k": dr.n_k, "ll": dr.ll, "sweep": dr.sweep,
                "n_tokens": dr.n_tokens}

    def load_driver_state(self, state):
        dr = self.driver
        dr.n_k = np.asarray(state["n_k"], dtype=np.int64)
        dr.ll = float(state["ll"])
        dr.sweep = int(state["sweep"])
        dr.n_tokens = int(state["n_tokens"])
        dr.t_sweep = time.time()

    def collect_counts(self, backend, assignments: bool = False) -> np.ndarray:
        """Bring the topic-word counts ``n_kw`` (topics x words, int32) to the driver at the
        end of a fit (`dmp.engine.run`'s ``collect``): each partition's word block streams
        over piece by piece (`Backend.collect_stream`) straight into its columns, so the
        driver holds the table once, never the blocks besides it.  ``assignments``: also
        collect every partition's topic assignments into ``driver.z`` (for tests)."""
        P = self.driver.P
        block, _ = word_blocks(self.n_words, P, self.seed, self.word_freq)
        n_kw = np.zeros((self.n_topics, self.n_words), dtype=np.int32)
        words = [np.flatnonzero(block == b) for b in range(P)]
        held = {}
        z = [None] * P

        def sink(k, name, row, piece):
            if name == "block_id":
                held[k] = words[int(piece[0])]
            elif name == "block":
                kernels.rows_into_columns(piece, held[k][row:row + len(piece)], n_kw)
            elif name == "z":
                z[k] = piece if z[k] is None else np.concatenate([z[k], piece])

        backend.collect_stream(sink, method="collect_assignments" if assignments
                               else "word_block")
        self.driver.n_kw = n_kw
        if assignments:
            self.driver.z = z
        return n_kw

    def word_block(self, s) -> dict:
        """The word block this partition holds after the last round (id first: the
        collection sink needs it before the rows)."""
        _, b, table = self._next_block(s)
        return {"block_id": np.array([b]), "block": table}

    def collect_assignments(self, s) -> dict:
        return {**self.word_block(s), "z": s["z"]}
