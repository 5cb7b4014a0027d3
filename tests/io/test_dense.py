"""Dense row-sharded datasets and the feature-file readers (fvecs/bvecs/ivecs, npy, CSV,
digits)."""

import json
import os

import numpy as np
import pytest

from dmp.io import (DatasetError, DenseDataset, InMemoryDenseDataset, append_dense_shard,
                    convert_features, open_dataset, read_features, read_vecs, write_dense)


def _write_vecs(path, X, dtype):
    X = np.asarray(X)
    n, d = X.shape
    rec = np.empty(n, dtype=[("d", "<i4"), ("v", dtype, (d,))])
    rec["d"] = d
    rec["v"] = X
    rec.tofile(path)


@pytest.fixture
def X():
    return np.random.default_rng(0).standard_normal((1003, 7)).astype(np.float32)


def test_round_trip_shards_and_points(tmp_path, X):
    ds = write_dense(tmp_path / "d.zarr", X, n_shards=4)
    assert isinstance(ds, DenseDataset) and ds.shape == X.shape and ds.n_shards == 4
    sizes = np.diff(ds.row_bounds)
    assert sizes.sum() == 1003 and sizes.max() - sizes.min() <= 1
    b = ds.row_bounds
    again = open_dataset(tmp_path / "d.zarr")
    np.testing.assert_array_equal(again.load_row_shards([2, 0]),
                                  np.concatenate([X[b[2]:b[3]], X[:b[1]]]))
    rows = np.array([1000, 3, 600, 3])
    np.testing.assert_array_equal(again.load_points(rows), X[rows])
    assert again.row_partition(2) == [[0, 1], [2, 3]]
    mem = InMemoryDenseDataset(X, n_shards=4)
    np.testing.assert_array_equal(mem.row_bounds, ds.row_bounds)
    np.testing.assert_array_equal(mem.load_points(rows), X[rows])
    again.validate()


def test_append_shard_and_atomic_overwrite(tmp_path, X):
    path = tmp_path / "d.zarr"
    ds = write_dense(path, X[:1000], n_shards=2)
    ds = append_dense_shard(ds, X[1000:])
    assert ds.n_shards == 3 and ds.n_samples == 1003
    np.testing.assert_array_equal(ds.load_row_shards([0, 1, 2]), X)
    with pytest.raises(ValueError, match="has 3 features, expected 7"):
        append_dense_shard(ds, X[:5, :3])
    with pytest.raises(FileExistsError):
        write_dense(path, X)
    with pytest.raises(ValueError, match="NaN or infinite"):
        write_dense(path, np.where(np.arange(X.size).reshape(X.shape) == 9, np.nan, X),
                    overwrite=True)
    # the failed overwrite left the old dataset and no temporary directory
    assert open_dataset(path).n_samples == 1003
    assert os.listdir(tmp_path) == ["d.zarr"]


def test_failed_append_leaves_the_dataset_as_it_was(tmp_path, X, monkeypatch):
    import zarr

    path = tmp_path / "d.zarr"
    ds = write_dense(path, X[:1000], n_shards=2)

    def disk_full(self, key, value):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(zarr.Array, "__setitem__", disk_full)
        with pytest.raises(OSError, match="disk full"):
            append_dense_shard(ds, X[1000:])
    again = open_dataset(path)
    assert (again.n_shards, again.n_samples) == (2, 1000)
    assert "s0002" not in zarr.open_group(str(path), mode="r")["shards"]
    # a leftover of a crash (never cleaned up) is replaced by the next append
    zarr.open_group(str(path), mode="r+").create_array("shards/s0002", shape=(1, 7),
                                                        dtype="float32")
    np.testing.assert_array_equal(append_dense_shard(again, X[1000:]).load_shard(2), X[1000:])


def test_dask_input_is_written_block_by_block(tmp_path, X):
    da = pytest.importorskip("dask.array")
    ds = write_dense(tmp_path / "d.zarr", da.from_array(X, chunks=(100, 7)), n_shards=3)
    np.testing.assert_array_equal(ds.load_row_shards([0, 1, 2]), X)


def test_corrupt_store_errors_name_the_problem(tmp_path, X):
    path = tmp_path / "d.zarr"
    write_dense(path, X, n_shards=2)
    meta = path / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["row_bounds"] = [0, 5, 900]
    meta.write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match="inconsistent attributes"):
        open_dataset(path)
    doc["attributes"]["row_bounds"] = [0, 501, 1003]
    meta.write_text(json.dumps(doc))
    import shutil

    shutil.rmtree(path / "shards" / "s0001")
    with pytest.raises(DatasetError, match="s0001' is missing"):
        open_dataset(path).load_shard(1)
    with pytest.raises(FileNotFoundError):
        open_dataset(tmp_path / "nothing.zarr")


@pytest.mark.parametrize("ext, dtype", [("fvecs", "<f4"), ("bvecs", "u1"), ("ivecs", "<i4")])
def test_vecs_formats(tmp_path, ext, dtype):
    rng = np.random.default_rng(1)
    A = rng.integers(0, 200, (50, 12)).astype(dtype)
    path = tmp_path / f"a.{ext}"
    _write_vecs(path, A, dtype)
    np.testing.assert_array_equal(read_vecs(path), A)
    ds = convert_features(path, tmp_path / "a.zarr", n_shards=2)
    np.testing.assert_array_equal(ds.load_row_shards([0, 1]), A.astype(np.float32))
    # truncated file, inconsistent dimensions
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(ValueError, match="truncated"):
        read_vecs(path)
    B = np.zeros((2, 12), dtype=dtype)
    _write_vecs(path, B, dtype)
    with open(path, "ab") as f:
        _write_vecs(tmp_path / "b.bin", np.zeros((1, 12), dtype=dtype), dtype)
        rec = bytearray((tmp_path / "b.bin").read_bytes())
        rec[0:4] = np.int32(11).tobytes() if dtype != "u1" else np.int32(11).tobytes()
        f.write(bytes(rec))
    with pytest.raises(ValueError, match="record 2 has dimension 11|truncated"):
        read_vecs(path)


def test_npy_csv_and_digits(tmp_path, X):
    np.save(tmp_path / "x.npy", X)
    np.testing.assert_array_equal(read_features(tmp_path / "x.npy"), X)
    np.savetxt(tmp_path / "x.csv", X[:20], delimiter=",")
    np.testing.assert_allclose(read_features(tmp_path / "x.csv"), X[:20], rtol=1e-6)
    np.savetxt(tmp_path / "x.txt", X[:20])
    np.testing.assert_allclose(read_features(tmp_path / "x.txt"), X[:20], rtol=1e-6)
    ds = convert_features("digits", tmp_path / "digits.zarr", n_shards=3, max_points=1000)
    assert ds.shape == (1000, 64)
    (tmp_path / "bad.csv").write_text("1,2,3\n4,five,6\n")
    with pytest.raises(ValueError, match="cannot parse"):
        read_features(tmp_path / "bad.csv")
    with pytest.raises(ValueError, match="unknown feature format"):
        read_features(tmp_path / "x.npy", format="parquet")
    with pytest.raises(FileNotFoundError):
        read_features(tmp_path / "missing.fvecs")
