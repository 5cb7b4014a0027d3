"""LDA refuses counts that are not token counts the same way for every input: in memory on
the driver, and a corpus store on the worker, as its shards load (one check for both)."""

import numpy as np
import pytest
import scipy.sparse as sp

from dmp.decomposition import LatentDirichletAllocation
from dmp.io import open_dataset, write_sparse_rows

from test_lda import lda_corpus


def _bad_corpus(tmp_path, value, row=17):
    X, _, _ = lda_corpus(n_docs=40, n_words=50, n_topics=3, doc_len=20, seed=3)
    X = sp.csr_matrix(X, dtype=np.float64)
    X.data[X.indptr[row]] = value        # one count of document `row`
    ds = write_sparse_rows(tmp_path / "c.zarr", X, np.zeros(X.shape[0]), n_shards=4)
    return X, open_dataset(ds.path)


@pytest.mark.parametrize("value, words", [
    (1.5, r"non-integer counts \(e\.g\. 1\.5\); LDA needs token counts"),
    (-2.0, r"negative counts \(min -2\)"),
])
def test_a_store_with_counts_that_are_not_token_counts_is_refused(tmp_path, value, words):
    X, ds = _bad_corpus(tmp_path, value)
    kw = dict(max_iter=2, random_state=0, backend="local", n_workers=2)
    with pytest.raises(ValueError, match=rf"^X contains {words}"):
        LatentDirichletAllocation(3, **kw).fit(X)
    # the store's shard 1 holds document 17: named where the shard is loaded
    with pytest.raises(ValueError, match=rf"corpus {ds.path!r}, shard 1 contains {words}"):
        LatentDirichletAllocation(3, **kw).fit(ds)


@pytest.mark.dask
@pytest.mark.timeout(240)
def test_the_workers_check_the_shards_they_load(dask_client, tmp_path):
    X, ds = _bad_corpus(tmp_path, 0.25)
    with pytest.raises(ValueError, match=rf"corpus {ds.path!r}, shard 1 contains "
                                         r"non-integer counts \(e\.g\. 0\.25\)"):
        LatentDirichletAllocation(3, max_iter=2, random_state=0, backend=dask_client).fit(ds)
    # a good store still fits on the same cluster
    good = write_sparse_rows(tmp_path / "g.zarr", np.round(abs(X.toarray())) + 1,
                             np.zeros(X.shape[0]), n_shards=2)
    LatentDirichletAllocation(3, max_iter=2, random_state=0, backend=dask_client).fit(good)


def test_a_store_with_empty_documents_is_refused_as_in_memory(tmp_path):
    """Documents without a token are refused in memory; a corpus store holding them (written
    with `write_sparse_rows`: `convert_corpus` drops them) is refused the same way, where its
    shards load, naming the shard and the documents' rows in the corpus."""
    X, _, _ = lda_corpus(n_docs=40, n_words=50, n_topics=3, doc_len=20, seed=3)
    X = sp.lil_matrix(X, dtype=np.float64)
    X[12, :] = 0
    X[31, :] = 0
    X = sp.csr_matrix(X)
    X.eliminate_zeros()
    ds = write_sparse_rows(tmp_path / "c.zarr", X, np.zeros(X.shape[0]), n_shards=4)
    first = int(np.searchsorted(ds.row_bounds, 12, side="right")) - 1   # the shard of row 12
    assert first < np.searchsorted(ds.row_bounds, 31, side="right") - 1
    kw = dict(max_iter=2, random_state=0, backend="local", n_workers=2)
    with pytest.raises(ValueError, match=r"^X has 2 empty document\(s\) \(no tokens\), e\.g\. "
                                         r"rows \[12, 31\]; remove them before fitting"):
        LatentDirichletAllocation(3, **kw).fit(X)
    with pytest.raises(ValueError, match=rf"corpus {ds.path!r}, shard {first} has 1 empty "
                                         rf"document\(s\) \(no tokens\), e\.g\. rows \[12\]"):
        LatentDirichletAllocation(3, **kw).fit(open_dataset(ds.path))
