"""Every scipy sparse shard dmp hands out goes to scikit-learn's estimators as it is: one
index dtype, int32 (what their compiled code takes) unless the shard is too large."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.decomposition import LatentDirichletAllocation, TruncatedSVD
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Lasso, SGDClassifier

from dmp.io import (InMemorySparseRowDataset, convert_corpus, read_svmlight,
                    read_text_corpus, read_uci_bow, write_sparse, write_sparse_rows)
from dmp.io.sparse import InMemorySparseDataset


def _data(n=60, p=25, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.3, format="csr", random_state=seed,
                  data_rvs=lambda k: rng.integers(1, 4, k).astype(float))
    return X, rng.standard_normal(n)


def _fits(M, y):
    """Fit the estimators whose compiled code refuses mixed or int64 index arrays."""
    assert M.indices.dtype == np.int32 and M.indptr.dtype == np.int32, \
        (M.indices.dtype, M.indptr.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        Lasso(alpha=0.01, max_iter=50).fit(M, y)
        SGDClassifier(max_iter=5, tol=None, random_state=0).fit(M, y > 0)
        TruncatedSVD(2, random_state=0).fit(M)
        LatentDirichletAllocation(n_components=2, max_iter=2, random_state=0).fit(M)


def _shards(tmp_path):
    X, y = _data()
    cols = write_sparse(tmp_path / "c.zarr", X, y, n_shards=3)
    rows = write_sparse_rows(tmp_path / "r.zarr", X, y, n_shards=3)
    mem = InMemorySparseRowDataset(X, y, n_shards=3)
    mcols = InMemorySparseDataset(X, y, n_shards=3)
    yield "SparseDataset.load_shard", cols.load_shard(1), y
    yield "SparseDataset.load_shards", cols.load_shards([0, 1]), y
    r0, r1 = rows.row_bounds[1], rows.row_bounds[2]
    yield "SparseRowDataset.load_rows", rows.load_rows(1)[0], y[r0:r1]
    yield "SparseRowDataset.load_row_shards", rows.load_row_shards([2, 0])[0], \
        np.concatenate([y[rows.row_bounds[2]:], y[:rows.row_bounds[1]]])
    yield "InMemorySparseRowDataset.load_rows", mem.load_rows(1)[0], y[r0:r1]
    yield "InMemorySparseRowDataset.load_row_shards (views)", \
        mem.load_row_shards([0, 1, 2])[0], y
    yield "InMemorySparseRowDataset.load_row_shards (copies)", \
        mem.load_row_shards([2, 0, 1])[0], mem.load_row_shards([2, 0, 1])[1]
    yield "InMemorySparseDataset.load_shards", mcols.load_shards([1, 2]), y
    yield "InMemorySparseDataset.load_shards (all)", mcols.load_shards([0, 1, 2]), y


def test_every_shard_goes_to_sklearn_as_it_is(tmp_path):
    names = []
    for name, M, y in _shards(tmp_path):
        names.append(name)
        assert M.shape[0] == len(y), name
        _fits(M, y)
    assert len(names) == 9


def test_corpus_and_file_readers_give_sklearn_ready_matrices(tmp_path):
    docs = tmp_path / "docs.txt"
    docs.write_text("apple banana apple cherry\nbanana cherry date\napple date date\n" * 4)
    ds = convert_corpus(docs, tmp_path / "c.zarr", format="text", min_count=1, n_shards=2)
    X, _ = ds.load_row_shards([0, 1])
    _fits(X, np.arange(X.shape[0], dtype=float))
    f = tmp_path / "d.svm"
    f.write_text("1 1:0.5 3:2\n-1 2:1\n1 1:1 2:1 3:1\n")
    X, y = read_svmlight(f)
    _fits(X, y)
    X, _, _ = read_text_corpus(docs, min_count=1)
    _fits(X, np.arange(X.shape[0], dtype=float))
    uci = tmp_path / "docword.txt"
    uci.write_text("3\n4\n5\n1 1 2\n1 3 1\n2 2 4\n3 1 1\n3 4 2\n")
    X, _ = read_uci_bow(uci)
    _fits(X, np.arange(3, dtype=float))


def test_shards_too_large_for_int32_take_int64_for_both():
    from dmp.io.sparse import sklearn_indices

    M = sp.csr_matrix((2, 2**31 + 3))   # no values, but a column beyond int32
    M.indptr = M.indptr.astype(np.int32)
    sklearn_indices(M)
    assert M.indices.dtype == M.indptr.dtype == np.int64
    M = sklearn_indices(sp.csc_matrix(np.eye(3)))
    assert M.indices.dtype == M.indptr.dtype == np.int32
