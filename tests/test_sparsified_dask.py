"""Sparsified methods on a real LocalCluster: same result as in-process, data read on the
workers, more partitions than workers."""

import numpy as np

from dmp.io import write_sparse_rows
from dmp.linear_model import SparsifiedSGDRegressor


def test_more_partitions_than_workers_from_a_store(dask_client, tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 40))
    y = X @ rng.standard_normal(40) + 0.1 * rng.standard_normal(400)
    ds = write_sparse_rows(tmp_path / "r.zarr", X, y, n_shards=8)
    kw = dict(alpha=1e-3, n_workers=8, max_iter=80, tol=None, random_state=0)
    remote = SparsifiedSGDRegressor(backend="dask", **kw).fit(ds)
    local = SparsifiedSGDRegressor(backend="local", **kw).fit(X, y)
    assert remote.history_["push_s"].shape == (81, 8)
    assert remote.blocks_per_worker_ == 5  # 41 coordinates in 41 blocks, n = 8
    np.testing.assert_allclose(remote.coef_, local.coef_, rtol=0, atol=1e-12)
