"""Messages count in words a user reads: singular for one ("1 shard", "1 partition"), and
numbers as Python shows them, never numpy 2's ``np.int64(1)``."""

import numpy as np
import pytest

from dmp.io import (DatasetError, InMemoryDenseDataset, InMemoryRatingsDataset,
                    convert_ratings, write_dense, write_ratings, write_sparse_rows)


def test_plural_and_shown():
    from dmp.utils.text import plural, shown

    assert plural(1, "partition") == "1 partition"
    assert plural(np.int64(1), "shard") == "1 shard"
    assert plural(0, "shard") == "0 shards" and plural(3, "entry", "entries") == "3 entries"
    assert plural(1234, "value", grouped=True) == "1,234 values"
    assert shown(np.int64(3)) == "3" and shown((np.int64(0), 3)) == "(0, 3)"
    assert shown([np.float64(1.5), "a"]) == "[1.5, 'a']" and shown({"k": np.int32(2)}) == \
        "{'k': 2}"


def test_one_shard_is_singular(tmp_path):
    ds = write_sparse_rows(tmp_path / "r.zarr", np.eye(3), np.zeros(3), n_shards=1)
    with pytest.raises(DatasetError, match=r"shard 7 out of range: dataset has 1 shard$"):
        ds.load_rows(7)
    with pytest.raises(ValueError, match=r"the dataset has only 1 shard; rewrite"):
        ds.row_partition(2)
    dense = write_dense(tmp_path / "d.zarr", np.zeros((4, 2), np.float32), n_shards=1)
    with pytest.raises(IndexError, match=r"^shard 5 out of range: dataset has 1 shard$"):
        dense.load_shard(np.int64(5))
    with pytest.raises(IndexError, match=r"^shard 5 out of range: dataset has 1 shard$"):
        InMemoryDenseDataset(np.zeros((4, 2), np.float32), 1).load_shard(np.int64(5))
    with pytest.raises(DatasetError, match=r"^1 rating is in no split"):
        write_ratings(tmp_path / "x.zarr", [0, 1], [0, 1], [1.0, 2.0],
                      split={"train": [0]})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_partition_is_singular_in_the_pipeline_log(tmp_path, capsys):
    from dmp.cli import main
    from dmp.io import make_sparse_lasso, write_sparse

    X, y, _ = make_sparse_lasso(n=40, p=60, density=0.1, seed=0)
    write_sparse(tmp_path / "d.zarr", X, y, n_shards=2)
    spec = tmp_path / "p.yaml"
    spec.write_text(f"name: one\ndataset: {tmp_path / 'd.zarr'}\nestimator: {{class: Lasso, "
                    f"params: {{alpha_ratio: 0.2, max_iter: 200, tol: 1.0e-4}}}}\n"
                    f"output: {tmp_path / 'out'}\n")
    assert main(["run", str(spec), "--workers", "1", "--no-progress"]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "with 1 partition on 1 Dask worker" in text, text
    assert "1 partitions" not in text and "1 Dask workers" not in text


@pytest.mark.parametrize("labels, words", [
    ("1,10,4\n1,10,5\n", "the first is user 1, item 10 at line 2 and line 3"),
    ("a,x,4\na,x,5\n", "the first is user 'a', item 'x' at line 2"),
])
def test_numpy_scalars_are_shown_as_python_values(tmp_path, labels, words):
    f = tmp_path / "dup.csv"
    f.write_text("user,item,rating\n" + labels)
    with pytest.raises(DatasetError) as e:
        convert_ratings(f, tmp_path / "r.zarr")
    assert words in str(e.value) and "np." not in str(e.value)
    for call in (lambda: InMemoryRatingsDataset(([0, 1], [0, 1], [1.0, 2.0]),
                                                user_ids=[5, 5], item_ids=[1, 2]),
                 lambda: write_ratings(tmp_path / "s.zarr", [0], [0], [1.0],
                                       shape=(np.int64(0), 3)),
                 lambda: InMemoryRatingsDataset(([0, 1], [0, 1], [1.0, 2.0]))
                 .balanced_bounds(np.int64(0), 0)):
        with pytest.raises(ValueError) as e:
            call()
        assert "np." not in str(e.value), str(e.value)
        assert "(0, 3)" in str(e.value) or "got 0" in str(e.value) or "e.g. 5" in str(e.value)


def test_numpy_arguments_are_shown_as_python_values_outside_io():
    from dmp.hashing._speedup import parmac_time

    kw = dict(n_points=10, n_submodels=2, n_epochs=1, t_w=1.0, t_z=1.0, t_c=1.0)
    with pytest.raises(ValueError, match=r"^P must be a positive integer, got 0$"):
        parmac_time(np.int64(0), **kw)
    with pytest.raises(ValueError, match=r"^t_w must be a finite time >= 0, got -1\.0$"):
        parmac_time(2, **{**kw, "t_w": np.float64(-1.0)})


def test_a_one_byte_vecs_file_is_singular(tmp_path):
    from dmp.io import read_vecs

    f = tmp_path / "x.fvecs"
    f.write_bytes(b"\x01")
    with pytest.raises(ValueError, match=r"empty or truncated file \(1 byte\)$"):
        read_vecs(f)
