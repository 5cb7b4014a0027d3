"""``dmp.decomposition.LatentDirichletAllocation``: STRADS word-rotation collapsed Gibbs LDA."""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_array, check_is_fitted

from ..base import DMPEstimator, InMemoryData, computed
from ..io import InMemorySparseRowDataset, write_sparse_rows
from ..utils.estimator import seed_from
from ..utils.text import shown
from . import _lda_kernels as kernels
from ._lda_program import LDAProgram, check_count_values, check_documents


def _is_row_dataset(X) -> bool:
    return hasattr(X, "load_row_shards") and hasattr(X, "row_partition")


#: the scikit-learn estimator checks that fit on random real values (`_expected_failed_checks`)
_CHECKS_ON_REAL_VALUES = (
    "check_dict_unchanged", "check_dont_overwrite_parameters", "check_dtype_object",
    "check_estimators_dtypes", "check_estimators_fit_returns_self", "check_estimators_nan_inf",
    "check_estimators_overwrite_params", "check_estimators_pickle",
    "check_f_contiguous_array_estimator", "check_fit2d_1feature", "check_fit2d_1sample",
    "check_fit2d_predict1d", "check_fit_check_is_fitted", "check_fit_idempotent",
    "check_fit_score_takes_y", "check_methods_sample_order_invariance",
    "check_methods_subset_invariance", "check_n_features_in",
    "check_n_features_in_after_fitting", "check_pipeline_consistency",
    "check_readonly_memmap_input", "check_transformer_data_not_an_array",
    "check_transformer_general", "check_transformer_n_iter",
    "check_transformer_preserve_dtypes")
_SPARSE_CHECKS = ("check_estimator_sparse_array", "check_estimator_sparse_matrix",
                  "check_estimator_sparse_tag")


def check_counts(X, what: str = "X", n_features: int | None = None) -> sp.csr_matrix:
    """A documents x words matrix of token counts as CSR float64, validated: 2-D, real,
    finite, non-negative integers, at least one token, the expected number of words
    (refused with scikit-learn's words where it has them)."""
    X = check_array(computed(X), accept_sparse=True, dtype="numeric", ensure_all_finite=False,
                    ensure_2d=False, allow_nd=True, ensure_min_samples=0,
                    ensure_min_features=0, input_name=what)
    if X.ndim != 2:
        raise ValueError(f"{what} must be 2-D (documents x words), got shape {X.shape}. "
                         f"Reshape your data with X.reshape(1, -1) if it holds one document")
    if X.shape[0] < 1 or X.shape[1] < 1:
        found = f"{X.shape[1]} feature(s)" if X.shape[1] < 1 else f"{X.shape[0]} sample(s)"
        raise ValueError(f"{what} is empty: found {found} (shape={X.shape}) while a minimum "
                         f"of 1 is required.")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"{what} has {X.shape[1]} features, but LatentDirichletAllocation "
                         f"is expecting {n_features} features as input (the vocabulary of "
                         f"{n_features} words it was fitted on)")
    # a copy with one index dtype: the caller's matrix is never modified, and a CSR with
    # int64 indptr but int32 indices (as loaded from a store) works in place
    X = sp.csr_matrix(X, dtype=np.float64, copy=True)
    X.indptr = X.indptr.astype(np.int64)
    X.indices = X.indices.astype(np.int64)
    X.sum_duplicates()
    check_count_values(X.data, what)
    X.eliminate_zeros()
    return X


class LatentDirichletAllocation(ClassNamePrefixFeaturesOutMixin, TransformerMixin,
                                DMPEstimator):
    """Latent Dirichlet allocation by collapsed Gibbs sampling with STRADS word rotation.

    Documents are sharded over the workers, which keep their tokens, topic assignments and
    doc-topic counts.  The word-topic table is split into one word block per worker; in
    each sub-round every worker samples its tokens of the block it holds exclusively, then
    hands the block to the next worker (directly, worker to worker); after one rotation
    every token was sampled once (one *sweep*).  No worker ever holds the whole table
    during training: with P workers each holds about ``n_words x n_components / P`` counts
    (two blocks while one arrives).  The topic totals (``n_components`` numbers) are kept
    exact: each worker sends its change of them to every other after each sub-round (worker
    to worker, with the block), so every sub-round samples against the totals of the one
    before on any backend and number of workers, and the driver only scores the sub-rounds,
    which run in batches (one call per worker for many sub-rounds).

    Parameters
    ----------
    n_components : int, default 10
        Number of topics K.
    doc_topic_prior : float, optional
        alpha (defaults to ``1 / n_components``, as scikit-learn).
    topic_word_prior : float, optional
        beta (defaults to ``1 / n_components``, as scikit-learn).
    max_iter : int, default 100
        Gibbs sweeps (each samples every token once).
    schedule : {"rotation"}
        The STRADS word-rotation schedule (the only one).
    sampler : {"auto", "sparse", "dense", "buckets"}, default "auto"
        ``"sparse"``: STRADS "sample by word", cost per token growing with the topics present
        in the document, and O(K) per word; ``"dense"``: O(K) per token, vectorised over
        the topics (the faster one at small K); ``"buckets"``: SparseLDA's three buckets in
        word order, no O(K) arithmetic per word (the faster one at large K, and on many
        workers, each of which samples every word once a sweep); ``"auto"``: dense up to 50
        topics (up to 200 where documents hold at least K / 2 tokens on average), sparse
        below 1,000, buckets from 1,000.  All draw from the same conditional
        distribution.
    evaluate_every : int, default 1
        Sweeps between evaluations of the log-likelihood ``log p(w, z)`` (``history_``,
        the progress bar and the live monitor show the last one); the last sweep is always
        evaluated.  Scoring reads every partition's counts once: on a small corpus at small
        K it is about a tenth of a sweep, which ``evaluate_every=10`` saves.  The chain
        does not depend on it.
    transform_max_iter : int, default 50
        Gibbs fold-in sweeps of `transform` (the second half is averaged).
    backend : {"auto", "local", "dask"}, Client or backend, default "auto"
        The active ``distributed.Client`` if there is one, else in-process.
    n_workers : int, optional
        Number of partitions (default: the cluster's workers, or 1 locally).
    random_state : int, RandomState or None
    checkpoint : str, optional
        Zarr checkpoint location (local path or fsspec URL).
    checkpoint_every : int, default 10
        Sweeps between checkpoints.
    resume : bool, default False
        Continue from the latest complete checkpoint at ``checkpoint``.
    show_progress : bool, default False
    callback : callable, optional
        ``callback(round, metrics) -> bool`` after every sub-round; True stops the fit.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Topic-word pseudo-counts ``n_kw + beta`` (as scikit-learn's: normalise each row for
        the topic-word distributions), float64, made from ``topic_word_counts_`` on first
        access and kept: a fit does not make it (8 GB at 100,000 topics and 10,000 words).
    topic_word_counts_ : ndarray of int32, shape (n_components, n_features)
    doc_topic_prior_, topic_word_prior_ : float
    log_likelihood_ : float
        ``log p(w, z)`` of the final state (Griffiths and Steyvers); of the last evaluated
        sweep when a callback stopped the fit before its last (``evaluate_every``).
    n_iter_ : int
        Sweeps run.
    history_ : dict of arrays
        Per sub-round: ``round``, ``sweep``, ``phase`` ("count" for the first rotation, which
        builds the table; "sample"), ``log_likelihood`` and ``ll_per_token`` (updated at
        the end of each evaluated sweep: ``evaluate_every``), ``tokens_per_s``, ``time``
        (for sub-rounds run in a batch on Dask: when they ended on the workers), ``push_s``
        (per worker), ``bytes_ring`` (word blocks and the changes of the topic totals handed
        on), ``bytes_push``/``bytes_pull`` (topic totals, through the driver), ``batch`` (the
        first sub-round of the call the sub-round ran in), ``worker_losses``.
    recoveries_ : list of dict
    n_features_in_ : int
    """

    #: the kinds of dmp store it fits (`dmp.io.sparse.STORE_KINDS`)
    _store_kinds = ("sparse-rows",)
    _scratch_kind = "lda"

    _parameter_constraints: dict = {
        **DMPEstimator._parameter_constraints,
        **DMPEstimator._checkpoint_constraints,
        "n_components": [Interval(numbers.Integral, 1, None, closed="left")],
        "doc_topic_prior": [Interval(numbers.Real, 0, None, closed="neither"), None],
        "topic_word_prior": [Interval(numbers.Real, 0, None, closed="neither"), None],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "schedule": [StrOptions({"rotation"})],
        "sampler": [StrOptions({"auto", "sparse", "dense", "buckets"})],
        "evaluate_every": [Interval(numbers.Integral, 1, None, closed="left")],
        "transform_max_iter": [Interval(numbers.Integral, 2, None, closed="left")],
    }

    def __init__(self, n_components=10, *, doc_topic_prior=None, topic_word_prior=None,
                 max_iter=100, schedule="rotation", sampler="auto", evaluate_every=1,
                 transform_max_iter=50,
                 backend="auto", n_workers=None, random_state=None, checkpoint=None,
                 checkpoint_every=10, resume=False, show_progress=False, callback=None):
        self.n_components = n_components
        self.doc_topic_prior = doc_topic_prior
        self.topic_word_prior = topic_word_prior
        self.max_iter = max_iter
        self.schedule = schedule
        self.sampler = sampler
        self.evaluate_every = evaluate_every
        self.transform_max_iter = transform_max_iter
        self.backend = backend
        self.n_workers = n_workers
        self.random_state = random_state
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.show_progress = show_progress
        self.callback = callback

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.positive_only = True
        tags.requires_fit = True
        tags.transformer_tags.preserves_dtype = ["float64"]
        return tags

    def _expected_failed_checks(self):
        real = ("it fits on random real values: collapsed Gibbs sampling needs token counts "
                "(non-negative integers), and LDA refuses anything else")
        sparse = ("its sparse matrices hold random real values and rows of zeros: LDA needs "
                  "token counts and refuses empty documents")
        return {**dict.fromkeys(_CHECKS_ON_REAL_VALUES, real),
                **dict.fromkeys(_SPARSE_CHECKS, sparse)}

    @property
    def _n_features_out(self):
        return self._pseudo_counts_source().shape[0]

    @property
    def components_(self):
        comp = self.__dict__.get("_components")
        if comp is None:
            comp = self._components = self.topic_word_counts_ + self.topic_word_prior_
        return comp

    @components_.setter
    def components_(self, value):
        self._components = value

    def _pseudo_counts_source(self):
        """``components_`` if it was made or set, else ``topic_word_counts_`` (the same
        order within every row, and ``+ topic_word_prior_`` away).  What `transform`,
        `score` and `top_words` read: they make no attribute (``components_`` at large K is
        bigger than the counts twice over)."""
        comp = self.__dict__.get("_components")
        return self.topic_word_counts_ if comp is None else comp

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y=None):
        """Sample topic assignments for the corpus X.

        Parameters
        ----------
        X : scipy.sparse matrix, ndarray or dask array of shape (n_documents, n_words), or
            a dmp row store (`dmp.io.open_dataset`; e.g. from ``dmp data convert``)
            Token counts: non-negative integers; every document needs at least one token.
        y : None
            Ignored.

        Returns
        -------
        self
        """
        return self._fit(X)

    _is_dataset = staticmethod(_is_row_dataset)

    def _prepare_store(self, fit):
        X = fit.X
        if X.n_samples < 1 or X.n_features < 1 or X.nnz < 1:
            raise ValueError(f"corpus {getattr(X, 'path', '')!r} is empty "
                             f"(shape {X.shape}, {X.nnz} nonzeros)")
        self._check_shards(X, fit.n_partitions, "corpus")
        return X

    def _prepare_in_memory(self, fit):
        X = check_counts(fit.X)
        if X.nnz == 0:
            raise ValueError("X holds no tokens (every count is zero)")
        check_documents(X.indptr, "X")
        P = fit.n_partitions
        self._check_split(X.shape[0], "document", P)
        y = np.zeros(X.shape[0])
        return InMemoryData(
            local=lambda: InMemorySparseRowDataset(X, y, n_shards=P),
            write=lambda tmp: write_sparse_rows(f"{tmp}/corpus.zarr", X, y, n_shards=P),
            content=(X,))

    def _priors(self):
        k = int(self.n_components)
        a = 1.0 / k if self.doc_topic_prior is None else float(self.doc_topic_prior)
        b = 1.0 / k if self.topic_word_prior is None else float(self.topic_word_prior)
        return a, b

    def _make_program(self, fit):
        alpha, beta = self._priors()
        return LDAProgram(fit.dataset, n_topics=self.n_components, alpha=alpha, beta=beta,
                          n_sweeps=self.max_iter, sampler=self.sampler,
                          seed=seed_from(self.random_state),
                          evaluate_every=self.evaluate_every)

    def _fingerprint(self, fit):
        return {"n_components": self.n_components, "alpha": fit.program.alpha,
                "beta": fit.program.beta, "sampler": fit.program.sampler}

    def _run_options(self, fit):
        P = fit.n_partitions
        # staleness: the next batch of sub-rounds in flight while the driver scores the
        # last (the chain does not depend on it)
        return {"max_iter": P * (self.max_iter + 1), "staleness": 1,
                "checkpoint_every": self.checkpoint_every * P,
                "collect": fit.program.collect_counts}

    def _set_fitted(self, fit, result):
        dr, beta = fit.program.driver, fit.program.beta
        self.topic_word_counts_ = dr["n_kw"]
        self.__dict__.pop("_components", None)
        self.doc_topic_prior_, self.topic_word_prior_ = fit.program.alpha, beta
        self.log_likelihood_ = float(dr["ll"])
        self.n_iter_ = int(dr["sweep"])
        self.n_features_in_ = int(fit.dataset.shape[1])
        self.n_tokens_ = int(dr["n_tokens"])

    # ------------------------------------------------------------------ inference
    def _topic_word(self) -> np.ndarray:
        """phi as words x topics: ``(n_kw + beta) / (n_k + V beta)``."""
        comp = self.__dict__.get("_components")
        if comp is None:
            comp = self.topic_word_counts_ + self.topic_word_prior_
        return np.ascontiguousarray((comp / comp.sum(axis=1, keepdims=True)).T)

    def _fold_in(self, X) -> tuple[np.ndarray, np.ndarray]:
        """(doc-topic distributions, document lengths) by Gibbs fold-in, topics fixed."""
        check_is_fitted(self, "topic_word_counts_")
        X = check_counts(X, "X", self.n_features_in_)
        Kt = self._n_features_out
        counts = X.data.astype(np.int64)
        tok_word = np.repeat(X.indices.astype(np.int64), counts)
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
        doc_len = np.bincount(rows, weights=counts, minlength=X.shape[0]).astype(np.int64)
        doc_ptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
        np.cumsum(doc_len, out=doc_ptr[1:])
        rng = np.random.default_rng(seed_from(self.random_state))
        n_iter = int(self.transform_max_iter)
        z = rng.integers(0, Kt, len(tok_word)).astype(np.int64)
        u = rng.random(n_iter * len(tok_word))
        theta = np.zeros((X.shape[0], Kt))
        kernels.fold_in(doc_ptr, tok_word, self._topic_word(), self.doc_topic_prior_, n_iter, u, z,
                        theta)
        kept = n_iter - n_iter // 2
        theta = theta / kept + self.doc_topic_prior_
        theta /= theta.sum(axis=1, keepdims=True)
        return theta, doc_len

    def transform(self, X):
        """Doc-topic distributions of new documents (Gibbs fold-in with the topics fixed).

        Parameters
        ----------
        X : sparse matrix, ndarray or dask array of shape (n_documents, n_features)
            Token counts; empty documents get the prior (uniform).

        Returns
        -------
        ndarray of shape (n_documents, n_components)
            Rows sum to 1: ``(n_dk + alpha) / (N_d + K alpha)``, ``n_dk`` averaged over the
            second half of ``transform_max_iter`` fold-in sweeps.
        """
        return self._fold_in(X)[0]

    def score(self, X, y=None):
        """Log-likelihood of X given the topics and its fold-in doc-topic distributions:
        ``sum_d sum_w x_dw log(sum_k theta_dk phi_kw)`` (higher is better)."""
        theta, _ = self._fold_in(X)
        X = check_counts(X, "X", self.n_features_in_).tocoo()
        phi = self._topic_word()
        p = np.einsum("ij,ij->i", theta[X.row], phi[X.col])
        return float(np.sum(X.data * np.log(p)))

    def perplexity(self, X):
        """``exp(-score(X) / number of tokens)`` (lower is better)."""
        n = float(check_counts(X, "X", self.n_features_in_).sum())
        if n == 0:
            raise ValueError("X holds no tokens")
        return float(math.exp(-self.score(X) / n))

    def top_words(self, n: int = 10, vocabulary=None) -> list[list]:
        """The ``n`` most probable words of each topic (indices, or entries of
        ``vocabulary``)."""
        check_is_fitted(self, "topic_word_counts_")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be a positive integer, got {shown(n)}")
        comp = self._pseudo_counts_source()
        order = np.argsort(-comp, axis=1, kind="stable")[:, :n]
        if vocabulary is None:
            return order.tolist()
        vocab = np.asarray(vocabulary)
        if vocab.ndim != 1 or len(vocab) != comp.shape[1]:
            raise ValueError(f"vocabulary has {vocab.shape} entries, but the model has "
                             f"{comp.shape[1]} words")
        return [vocab[row].tolist() for row in order]

    def plot(self):
        """The training figures (log-likelihood per token against time and sub-round, push and
        idle time per worker, bytes per primitive); returns the matplotlib figure."""
        from ..plotting import plot_training

        return plot_training(self.history_, metric="ll_per_token",
                             title="LatentDirichletAllocation")
