"""LDA on a real multi-process LocalCluster: word blocks go worker to worker (actor to actor),
and the result is the in-process one."""

import numpy as np
import pytest

from dmp.decomposition import LatentDirichletAllocation
from dmp.io import open_dataset, write_sparse_rows

from test_lda import lda_corpus

pytestmark = [pytest.mark.dask, pytest.mark.timeout(240)]


def test_corpus_store_read_by_the_workers(dask_client, tmp_path):
    X, _, _ = lda_corpus(n_docs=90, n_words=120, n_topics=4, doc_len=30, seed=8)
    ds = write_sparse_rows(tmp_path / "corpus.zarr", X, np.zeros(90), n_shards=4)
    kw = dict(max_iter=4, random_state=0)
    a = LatentDirichletAllocation(4, backend=dask_client, **kw).fit(open_dataset(ds.path))
    b = LatentDirichletAllocation(4, backend="local", n_workers=2, **kw).fit(X)
    # 4 shards dealt to 2 workers as 2 + 2 in order: the same documents per partition
    np.testing.assert_array_equal(a.topic_word_counts_, b.topic_word_counts_)


def test_one_partition_on_dask_sends_its_block_to_itself(dask_client):
    X, _, _ = lda_corpus(n_docs=40, n_words=60, n_topics=3, doc_len=20, seed=9)
    kw = dict(max_iter=3, random_state=2, n_workers=1)
    local = LatentDirichletAllocation(3, backend="local", **kw).fit(X)
    remote = LatentDirichletAllocation(3, backend=dask_client, **kw).fit(X)
    np.testing.assert_array_equal(remote.topic_word_counts_, local.topic_word_counts_)
    assert np.all(remote.history_["bytes_ring"] == 0)   # nothing left the worker
