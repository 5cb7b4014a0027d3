"""MatrixFactorization on a real LocalCluster: identical to in-process, data read on the
workers from a ratings store, only one coordinate block in flight per round."""

import numpy as np
import pytest

from dmp.decomposition import MatrixFactorization
from dmp.io import write_ratings

from mf_reference import low_rank_ratings

pytestmark = pytest.mark.dask


def test_store_on_more_partitions_than_workers_and_bounded_broadcasts(dask_client, tmp_path):
    """Read from a store by the workers; each round moves the items' partial sums (CCD++)
    between the partitions, never a whole factor matrix, and nothing from the driver."""
    tr, te = low_rank_ratings(n=200, m=150, k=3, density=0.2, seed=9)
    u = np.concatenate([tr.row, te.row])
    i = np.concatenate([tr.col, te.col])
    r = np.concatenate([tr.data, te.data])
    codes = np.r_[np.zeros(tr.nnz, np.int8), np.ones(te.nnz, np.int8)]
    ds = write_ratings(tmp_path / "r.zarr", u, i, r, shape=tr.shape, split=codes)
    k, P = 8, 4
    kw = dict(alpha=0.1, max_iter=3, tol=None, n_workers=P, random_state=0)
    remote = MatrixFactorization(k, backend="dask", **kw).fit(ds)
    local = MatrixFactorization(k, backend="local", **kw).fit(tr, X_val=te)
    np.testing.assert_array_equal(remote.user_factors_, local.user_factors_)
    np.testing.assert_array_equal(remote.history_["valid_rmse"], local.history_["valid_rmse"])
    h = remote.history_
    assert h["push_s"].shape == (1 + 3 * k, P)  # one round per feature
    n_users, n_items = tr.shape
    # per round: each partition's partial sums of all items (and its items' values of the
    # next feature at a feature boundary) to each of the P - 1 others; its scores to the
    # driver, which sends nothing back
    ring = h["bytes_ring"][1:]
    assert ring.min() >= P * (P - 1) * 8 * 2 * n_items
    assert ring.max() <= P * (P - 1) * (8 * 3 * n_items + 1024)
    # a message is a few item vectors, never a block of factors
    assert ring.max() / (P * (P - 1)) < 8 * k * n_items / 2
    assert h["bytes_pull"].max() == 0
    assert h["bytes_push"][1:].max() <= P * (8 * 7 * n_items + 4096)


def test_ccdpp_rounds_run_in_batches_and_stop_where_in_process_stops(dask_client):
    """CCD++ rounds run in batches on Dask; a fit stopped by ``tol`` ends after the same
    iteration, with the same factors, as in process."""
    tr, te = low_rank_ratings(n=150, m=100, k=3, density=0.3, seed=12)
    kw = dict(alpha=1.0, max_iter=60, tol=1e-3, n_workers=2, random_state=4)
    local = MatrixFactorization(5, backend="local", **kw).fit(tr, X_val=te)
    remote = MatrixFactorization(5, backend=dask_client, **kw).fit(tr, X_val=te)
    assert 2 < local.n_iter_ < 60
    assert remote.n_iter_ == local.n_iter_
    np.testing.assert_array_equal(remote.user_factors_, local.user_factors_)
    np.testing.assert_array_equal(remote.item_factors_, local.item_factors_)
    np.testing.assert_array_equal(remote.history_["objective"], local.history_["objective"])
    batch = remote.history_["batch"]
    assert len(np.unique(batch)) < len(batch) // 2
    np.testing.assert_array_equal(local.history_["batch"], local.history_["round"])


@pytest.mark.parametrize("n_inner,validation", [(1, False), (2, False), (1, True)])
def test_ccdpp_batches_are_scored_on_the_partitions_exactly_as_by_the_driver(
        dask_client, n_inner, validation):
    """A CCD++ round inside a batch is scored by partition 0 from the partial sums it
    receives anyway (the others add their validation sums to its message): the driver gets
    every partition's item vectors only for a batch's last round, and every round's scores
    are the in-process fit's (where the driver scores each round from those vectors) to
    the last bit."""
    tr, te = low_rank_ratings(n=120, m=90, k=3, density=0.3, seed=13)
    P, k = 3, 6
    kw = dict(alpha=0.5, max_iter=4, tol=None, n_inner=n_inner, n_workers=P, random_state=2)
    val = {"X_val": te} if validation else {}
    local = MatrixFactorization(k, backend="local", **kw).fit(tr, **val)
    remote = MatrixFactorization(k, backend=dask_client, **kw).fit(tr, **val)
    for key in ("objective", "train_rmse", "valid_rmse"):
        np.testing.assert_array_equal(remote.history_[key], local.history_[key])
    assert np.isfinite(remote.history_["valid_rmse"]).all() == validation
    np.testing.assert_array_equal(remote.item_factors_, local.item_factors_)
    h = remote.history_
    batch, push = h["batch"][1:], h["bytes_push"][1:]
    last = np.r_[batch[1:] != batch[:-1], True]     # a batch's last round
    assert (~last).sum() > len(last) // 2            # most rounds ran inside a batch
    n_items = tr.shape[1]
    assert push[last].min() >= P * 2 * 8 * n_items   # every partition's sums
    assert push[~last].max() < 1024                  # scores only


def test_ccd_blocks_limit_what_is_in_flight(dask_client):
    tr, _ = low_rank_ratings(n=100, m=80, k=3, density=0.3, seed=10)
    k, bs = 6, 2
    mf = MatrixFactorization(k, method="ccd", block_size=bs, alpha=0.1, max_iter=2, tol=None,
                             backend=dask_client, n_workers=2, random_state=0).fit(tr)
    assert mf.block_size_ == bs
    h = mf.history_
    # 3 blocks per half: a worker sends the other one its part of the deltas of one block
    # and of the next block, actor to actor; the driver only sees losses
    n_users, n_items = tr.shape
    ring = h["bytes_ring"][1:]
    assert ring.min() > 0
    assert ring.max() <= 2 * 8 * 2 * bs * max(n_users, n_items) + 4096
    assert ring.max() < 8 * k * (n_users + n_items)  # never the whole factors
    assert max(h["bytes_pull"][1:].max(), h["bytes_push"][1:].max()) <= 1024


def test_factors_store_written_by_the_workers(dask_client, tmp_path, foreign):
    tr, te = low_rank_ratings(n=80, m=60, k=2, density=0.3, seed=11)
    kw = dict(alpha=0.1, max_iter=3, tol=None, n_workers=2, random_state=0)
    ref = MatrixFactorization(3, backend="local", **kw).fit(tr)
    store = tmp_path / "factors.zarr"
    mf = MatrixFactorization(3, backend=dask_client, factors_store=str(store), **kw).fit(tr)
    assert not isinstance(mf.user_factors_, np.ndarray)  # lazy, read from the store
    np.testing.assert_array_equal(np.asarray(mf.user_factors_), ref.user_factors_)
    np.testing.assert_array_equal(np.asarray(mf.item_factors_), ref.item_factors_)
    np.testing.assert_array_equal(mf.predict(te.row, te.col), ref.predict(te.row, te.col))
    # no temporaries (beside the foreign files the fixture put there)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["factors.zarr", "file.txt", "notes"]
    # a second fit replaces its own store; anything else at the path is refused up front
    again = MatrixFactorization(3, backend=dask_client, factors_store=str(store), **kw).fit(tr)
    np.testing.assert_array_equal(np.asarray(again.user_factors_), ref.user_factors_)
    for other in (*foreign.paths, tmp_path / "factors.zarr" / "zarr.json"):
        with pytest.raises(FileExistsError, match="is not a factors store"):
            MatrixFactorization(3, backend=dask_client, factors_store=str(other), **kw).fit(tr)
    assert foreign.untouched()
