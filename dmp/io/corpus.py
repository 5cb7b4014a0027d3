"""Document collections -> documents x words count stores (for LDA).

Two source formats:

* UCI bag-of-words (``docword.<name>.txt[.gz]`` + ``vocab.<name>.txt``, as for NYTimes, PubMed,
  Enron, KOS, NIPS): three header lines ``D``, ``W``, ``NNZ``, then ``docID wordID count``
  lines, 1-based;
* plain text: one document per line of a file, or one per file of a directory; tokenised by
  a regular expression, lower-cased, stop words removed, and words rarer than ``min_count``
  (over the whole collection) pruned.

Both write a row-block store (`dmp.io.write_sparse_rows`) with the vocabulary; documents left
without tokens are dropped (and counted).
"""

from __future__ import annotations

import gzip
import os
import re
import warnings

import numpy as np
import scipy.sparse as sp

from ..utils.text import shown
from .rows import SparseRowDataset, write_sparse_rows
from ._store import DatasetError, check_allocation

__all__ = ["read_uci_bow", "read_text_corpus", "convert_corpus"]

#: a word: two or more letters or digits (scikit-learn's default token pattern)
TOKEN_PATTERN = r"(?u)\b\w\w+\b"


def _open_text(path):
    path = os.fspath(path)
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="strict")
    return open(path, encoding="utf-8", errors="strict")


def _header_int(line: str, what: str, path) -> int:
    try:
        v = int(line.strip())
    except ValueError:
        raise DatasetError(f"{path}: header line {what} must be an integer, got "
                           f"{line.strip()[:40]!r}") from None
    if v < 0:
        raise DatasetError(f"{path}: header {what} is negative ({v})")
    return v


def read_uci_bow(docword, vocab=None):
    """Read a UCI bag-of-words collection.

    Parameters
    ----------
    docword : str or os.PathLike
        ``docword.*.txt`` (or ``.gz``).
    vocab : str or os.PathLike, optional
        ``vocab.*.txt``: one word per line, line ``j`` naming word ``j`` (1-based ids).

    Returns
    -------
    X : scipy.sparse.csr_matrix, shape (D, W)
        Counts (float64 holding integers).
    vocabulary : list of str or None

    Raises
    ------
    FileNotFoundError
    DatasetError
        A malformed header or line (named by its number), ids out of the declared range,
        counts that are not positive integers, a (document, word) pair listed twice, a
        number of entries other than NNZ, a vocabulary of another length, non-UTF-8 text.
    """
    for f in (docword, vocab):
        if f is not None and not os.path.isfile(os.fspath(f)):
            raise FileNotFoundError(f"UCI bag-of-words file {os.fspath(f)!r} does not exist")
    try:
        with _open_text(docword) as fh:
            head = [fh.readline() for _ in range(3)]
            if not head[2]:
                raise DatasetError(f"{docword}: needs three header lines (D, W, NNZ)")
            D, W, NNZ = (_header_int(h, n, docword) for h, n in zip(head, "DWN"))
            # streamed by numpy: nothing is allocated from the declared sizes
            if D * W >= 2**62:
                raise DatasetError(f"{docword}: header D x W = {D} x {W} is beyond int64")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")   # "input contained no data"
                    a = np.loadtxt(fh, dtype=np.int64, ndmin=2)
            except (ValueError, OverflowError):
                a = None
        if a is None or (a.size and a.shape[1] != 3):
            _locate_bad_line(docword)
    except (UnicodeDecodeError, EOFError, OSError, gzip.BadGzipFile) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise DatasetError(f"{docword}: cannot read ({type(e).__name__}: {e})") from None
    if a.size == 0:
        a = np.zeros((0, 3), dtype=np.int64)
    if len(a) != NNZ:
        raise DatasetError(f"{docword}: header says NNZ = {NNZ}, the file has {len(a)} "
                           f"entries (truncated?)")
    if not len(a):
        raise DatasetError(f"{docword}: the collection holds no words")
    d, w, c = a[:, 0], a[:, 1], a[:, 2]
    for name, v, n in (("docID", d, D), ("wordID", w, W)):
        bad = np.flatnonzero((v < 1) | (v > n))
        if len(bad):
            raise DatasetError(f"{docword}: entry {bad[0] + 1}: {name} {v[bad[0]]} outside "
                               f"1..{n} (the header's {'D' if name == 'docID' else 'W'})")
    bad = np.flatnonzero(c < 1)
    if len(bad):
        raise DatasetError(f"{docword}: entry {bad[0] + 1}: count {c[bad[0]]} must be >= 1")
    key = (d - 1) * W + (w - 1)
    if len(np.unique(key)) != len(key):
        raise DatasetError(f"{docword}: a (docID, wordID) pair is listed more than once")
    check_allocation((D + 1) * 8, f"{docword}: the header's D = {D} documents")
    X = sp.csr_matrix((c.astype(np.float64), (d - 1, w - 1)), shape=(D, W))
    vocabulary = None
    if vocab is not None:
        try:
            with _open_text(vocab) as fh:
                vocabulary = [line.rstrip("\n").rstrip("\r") for line in fh]
        except (UnicodeDecodeError, OSError) as e:
            raise DatasetError(f"{vocab}: cannot read ({type(e).__name__}: {e})") from None
        while vocabulary and vocabulary[-1] == "":
            vocabulary.pop()
        if len(vocabulary) != W:
            raise DatasetError(f"{vocab}: {len(vocabulary)} words, the docword header says "
                               f"W = {W}")
    return X, vocabulary


def _locate_bad_line(docword):
    """Raise `DatasetError` naming the first line that is not ``docID wordID count``."""
    with _open_text(docword) as fh:
        for lineno, line in enumerate(fh, start=1):
            if lineno <= 3 or not line.strip():
                continue
            parts = line.split()
            if len(parts) != 3 or not all(re.fullmatch(r"[+-]?\d+", t) for t in parts):
                raise DatasetError(f"{docword}:{lineno}: expected 'docID wordID count' "
                                   f"(three integers), got {line.strip()[:60]!r}")
    raise DatasetError(f"{docword}: malformed entries")


def drop_empty_documents(X):
    """A UCI collection without its documents that hold no words, and the names
    (``"docID N"``) of those kept."""
    kept = np.flatnonzero(np.diff(X.indptr) > 0)
    return X[kept], [f"docID {k + 1}" for k in kept]


def _documents(source, per: str):
    """(names, texts) of the collection; strict UTF-8."""
    source = os.fspath(source)
    if per == "line":
        if os.path.isdir(source):
            raise FileNotFoundError(f"text corpus {source!r} is a directory; read one document "
                                    f"per file with per='file' (on the command line "
                                    f"--per file)")
        if not os.path.isfile(source):
            raise FileNotFoundError(f"text corpus file {source!r} does not exist")
        try:
            with _open_text(source) as fh:
                texts = [line.rstrip("\n") for line in fh]
        except UnicodeDecodeError as e:
            raise DatasetError(f"{source}: not UTF-8 text ({e})") from None
        return [f"line {i + 1}" for i in range(len(texts))], texts
    if not os.path.isdir(source):
        raise FileNotFoundError(f"text corpus directory {source!r} does not exist")
    names = sorted(n for n in os.listdir(source) if os.path.isfile(os.path.join(source, n)))
    texts = []
    for n in names:
        try:
            with _open_text(os.path.join(source, n)) as fh:
                texts.append(fh.read())
        except UnicodeDecodeError as e:
            raise DatasetError(f"{os.path.join(source, n)}: not UTF-8 text ({e})") from None
    return names, texts


def read_text_corpus(source, *, per="line", stop_words="english", min_count=5,
                     lowercase=True, token_pattern=TOKEN_PATTERN):
    """Tokenise a plain-text collection into counts.

    Parameters
    ----------
    source : str or os.PathLike
        A text file (``per="line"``: one document per line) or a directory (``per="file"``:
        one document per file, in name order).
    stop_words : "english", None or list of str
        Words to drop ("english": scikit-learn's list).
    min_count : int, default 5
        Words occurring fewer times in the whole collection are pruned.
    lowercase : bool, default True
    token_pattern : str
        Regular expression of a token.

    Returns
    -------
    X : scipy.sparse.csr_matrix (documents x words; documents left empty are dropped)
    vocabulary : list of str (sorted)
    kept : ndarray of int
        Index of each kept document among the source's documents.
    """
    X, vocabulary, kept, _ = read_text_named(source, per=per, stop_words=stop_words,
                                             min_count=min_count, lowercase=lowercase,
                                             token_pattern=token_pattern)
    return X, vocabulary, kept


def read_text_named(source, *, per="line", stop_words="english", min_count=5,
                    lowercase=True, token_pattern=TOKEN_PATTERN):
    """`read_text_corpus`, and the names of the kept documents (file names, or
    ``"line N"``), as `convert_corpus` stores them."""
    from sklearn.feature_extraction.text import CountVectorizer

    if per not in ("line", "file"):
        raise ValueError(f"per must be 'line' or 'file', got {shown(per)}")
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be an integer >= 1, got {shown(min_count)}")
    try:
        re.compile(token_pattern)
    except re.error as e:
        raise ValueError(f"token_pattern is not a valid regular expression: {e}") from None
    names, texts = _documents(source, per)
    if not texts:
        raise DatasetError(f"{os.fspath(source)}: no documents")
    vec = CountVectorizer(lowercase=lowercase, stop_words=stop_words,
                          token_pattern=token_pattern, dtype=np.float64)
    try:
        X = vec.fit_transform(texts).tocsc()
    except ValueError as e:   # "empty vocabulary"
        raise DatasetError(f"{os.fspath(source)}: no words left after tokenising ({e})") \
            from None
    vocab = vec.get_feature_names_out()
    keep_w = np.flatnonzero(np.asarray(X.sum(axis=0)).ravel() >= min_count)
    if not len(keep_w):
        raise DatasetError(f"{os.fspath(source)}: no word occurs min_count={min_count} times")
    X = X[:, keep_w].tocsr()
    kept = np.flatnonzero(np.diff(X.indptr) > 0)
    return X[kept], [str(w) for w in vocab[keep_w]], kept, [names[k] for k in kept]


def convert_corpus(source, dest, *, format="uci", vocab=None, n_shards=None, overwrite=False,
                   per="line", stop_words="english", min_count=5) -> SparseRowDataset:
    """Convert a document collection to a documents x words count store.

    Parameters
    ----------
    source : str or os.PathLike
        ``format="uci"``: the docword file; ``format="text"``: a file or directory (see
        `read_text_corpus`).
    dest : str or os.PathLike
        Store path or URL.
    vocab : str or os.PathLike, optional
        UCI: the vocabulary file.
    n_shards : int, optional
        Document shards (default: see `write_sparse_rows`).
    per, stop_words, min_count
        Text: see `read_text_corpus`.

    Returns
    -------
    SparseRowDataset
        With ``load_vocabulary()`` (the words) and ``load_names()`` (each document's file
        name, ``"line N"`` of the source, or UCI ``"docID N"``); documents without tokens
        are dropped.
    """
    if format == "uci":
        X, vocabulary = read_uci_bow(source, vocab)
        X, names = drop_empty_documents(X)
    elif format == "text":
        X, vocabulary, _, names = read_text_named(source, per=per, stop_words=stop_words,
                                                  min_count=min_count)
    else:
        raise ValueError(f"format must be 'uci' or 'text', got {shown(format)}")
    return write_sparse_rows(dest, X, np.zeros(X.shape[0]), n_shards=n_shards,
                             overwrite=overwrite, vocabulary=vocabulary, names=names)
