"""The point of model parallelism, shown: an LDA word-topic table larger than one Dask worker's
memory limit is trained across workers, none of whose resident memory ever reaches the limit."""

import logging

import numpy as np
import pytest

from dmp.decomposition import LatentDirichletAllocation
from dmp.engine.backends.base import InsufficientMemoryError
from dmp.io.synthetic import make_lda_corpus

MIB = 2**20


@pytest.fixture(scope="module", autouse=True)
def _spawned_workers():
    """Workers spawned, as a user's are, not forked from the session's warm server
    (tests/conftest.py): a forked worker does not count the server's pages it has not
    touched, and its peak would understate a spawned worker's by ~100 MiB."""
    import dask

    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        yield


def _peak_rss() -> int:
    # The kernel's high-water mark of this process image (VmHWM, KiB). Not ru_maxrss: it keeps
    # the forked parent's copy from before exec, so a spawned worker would report the pytest
    # process's own size (952 MiB late in a full run) instead of its own.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


@pytest.mark.slow
@pytest.mark.dask
def test_word_topic_table_larger_than_a_worker_memory_limit():
    from distributed import Client, LocalCluster

    V, Kt, P = 131_072, 2_048, 3
    limit = 950 * MIB
    table = V * Kt * 4                                   # int32 word-topic counts: 1 GiB
    assert table > limit
    X = make_lda_corpus(n_docs=2_000, n_words=V, n_topics=20, doc_len=100, seed=3)[0]
    with LocalCluster(n_workers=P, threads_per_worker=1, processes=True, memory_limit=limit,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        # halves of 512 MiB do not fit a worker: refused before anything is loaded (a worker
        # samples its block dense; the next one waits as it travelled, as its nonzeros)
        with pytest.raises(InsufficientMemoryError, match="at least 3 workers"):
            LatentDirichletAllocation(Kt, max_iter=1, backend=client, n_workers=2,
                                      random_state=0, show_progress=False).fit(X)
        lda = LatentDirichletAllocation(Kt, max_iter=1, backend=client, random_state=0,
                                        show_progress=False).fit(X)
        peaks = client.run(_peak_rss)
        assert len(peaks) == P                           # no worker was restarted or lost
    assert lda.recoveries_ == [] and lda.history_["worker_losses"].max() == 0
    # every worker held at most its share (its block and the one arriving), never the table
    assert max(peaks.values()) < limit, {w: p // MIB for w, p in peaks.items()}
    # the blocks really moved worker to worker: every partition handed a block to its
    # neighbour every sub-round (as their nonzeros: at this K most counts are zero)
    assert lda.history_["ring_s"].shape == (P * 2, P) and np.all(lda.history_["ring_s"] > 0)
    assert np.all(lda.history_["bytes_ring"][P:] > 0)
    # and the model is the corpus's: counts per word, finite likelihood
    np.testing.assert_array_equal(lda.topic_word_counts_.sum(axis=0),
                                  np.asarray(X.sum(axis=0)).ravel())
    assert lda.topic_word_counts_.shape == (Kt, V) and np.isfinite(lda.log_likelihood_)
