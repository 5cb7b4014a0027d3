"""Bad input is rejected at the boundary with a message naming the problem."""

import numpy as np
import pytest
import scipy.sparse as sp

from dmp.io import DatasetError, open_dataset, write_sparse
from dmp.linear_model import Lasso

from conftest import make_problem


@pytest.mark.parametrize("where", ["X", "y"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_input(where, bad):
    X, y = make_problem(dense=True)
    if where == "X":
        X[3, 4] = bad
    else:
        y[7] = bad
    with pytest.raises(ValueError, match="NaN|infinity"):
        Lasso(backend="local").fit(X, y)


def test_mismatched_lengths():
    X, y = make_problem()
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        Lasso(backend="local").fit(X, y[:-1])


def test_empty_data():
    with pytest.raises(ValueError, match="0 sample"):
        Lasso(backend="local").fit(np.empty((0, 3)), np.empty(0))
    with pytest.raises(ValueError, match="0 feature"):
        Lasso(backend="local").fit(np.empty((4, 0)), np.ones(4))


@pytest.mark.parametrize("params, match", [
    ({"alpha": -1.0}, "'alpha' parameter"),
    ({"schedule": "cyclic"}, "'schedule' parameter"),
    ({"schedule_size": 0}, "'schedule_size' parameter"),
    ({"backend": "spark"}, "backend"),
    ({"staleness": -1}, "'staleness' parameter"),
])
def test_bad_parameters(params, match):
    X, y = make_problem()
    with pytest.raises(ValueError, match=match):
        Lasso(**params).fit(X, y)


def test_dask_backend_without_client():
    X, y = make_problem()
    with pytest.raises(ValueError, match="needs an active distributed.Client"):
        Lasso(backend="dask").fit(X, y)


def test_missing_and_corrupt_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="no dmp dataset"):
        open_dataset(tmp_path / "nothing.zarr")
    X, y = make_problem()
    ds = write_sparse(tmp_path / "d.zarr", sp.csc_matrix(X), y, n_shards=2)
    import zarr

    g = zarr.open_group(str(tmp_path / "d.zarr"), mode="a")
    g["shards/s0001/indices"][:3] = 10**6  # out of range row ids
    with pytest.raises(DatasetError, match="indices"):
        Lasso(backend="local", n_workers=2).fit(ds)


def test_dataset_with_y_given_is_rejected(tmp_path):
    X, y = make_problem()
    ds = write_sparse(tmp_path / "d.zarr", X, y, n_shards=2)
    with pytest.raises(ValueError, match="y must be None"):
        Lasso(backend="local").fit(ds, y)


def test_more_workers_than_shards(tmp_path):
    X, y = make_problem()
    ds = write_sparse(tmp_path / "d.zarr", X, y, n_shards=2)
    with pytest.raises(ValueError, match="2 shard"):
        Lasso(backend="local", n_workers=3).fit(ds)
    # in-memory input has no shards to rewrite: the limit is one feature per worker
    with pytest.raises(ValueError, match=r"5 workers were requested for 4 feature\(s\)"):
        Lasso(backend="local", n_workers=5).fit(X[:, :4], y)


def test_a_store_of_the_wrong_kind_is_named(tmp_path):
    """Every estimator says which kind of store it needs and which kind it was given."""
    from dmp.decomposition import LatentDirichletAllocation, MatrixFactorization
    from dmp.hashing import BinaryAutoencoder
    from dmp.io import write_dense, write_sparse_rows
    from dmp.linear_model import SparsifiedSGDRegressor

    X, y = make_problem(n=30, p=40, density=0.2, seed=1)
    cols = write_sparse(tmp_path / "cols.zarr", X, y, n_shards=2)
    rows = write_sparse_rows(tmp_path / "rows.zarr", X, y, n_shards=2)
    dense = write_dense(tmp_path / "dense.zarr", np.random.default_rng(0).random((30, 4)),
                        n_shards=2)
    cases = [(Lasso, rows, "column-sharded", "row-sharded"),
             (Lasso, dense, "column-sharded", "a dense store"),
             (SparsifiedSGDRegressor, cols, "row-sharded", "column-sharded"),
             (LatentDirichletAllocation, dense, "row-sharded", "a dense store"),
             (MatrixFactorization, cols, "a ratings store", "column-sharded"),
             (BinaryAutoencoder, rows, "a dense store", "row-sharded")]
    for cls, ds, needs, got in cases:
        with pytest.raises(DatasetError) as exc:
            cls(backend="local").fit(ds)
        text = str(exc.value)
        assert text.startswith(f"{cls.__name__} needs") and needs in text.split(";")[0]
        assert got in text.split(";")[1] and str(ds.path) in text
