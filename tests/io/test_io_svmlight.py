"""Tests for dmp.io.svmlight."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

from dmp.io import DatasetError, convert_svmlight, read_svmlight


def _sample(tmp_path, zero_based=False):
    rng = np.random.default_rng(0)
    X = sp.random(30, 15, density=0.2, format="csr", random_state=rng,
                  data_rvs=rng.standard_normal)
    X = X.tolil()
    X[0, 14] = 1.25  # make the last column non-empty so p is inferred exactly
    X = X.tocsr()
    y = rng.standard_normal(30)
    f = tmp_path / "data.svm"
    dump_svmlight_file(X, y, str(f), zero_based=zero_based)
    return f, X, y


def test_read_roundtrip(tmp_path):
    f, X, y = _sample(tmp_path)
    X2, y2 = read_svmlight(f)
    assert isinstance(X2, sp.csr_matrix) and X2.dtype == np.float64
    np.testing.assert_allclose(X2.toarray(), X.toarray(), rtol=1e-15)
    np.testing.assert_allclose(y2, y, rtol=1e-15)
    X3, _ = read_svmlight(str(f), n_features=20)
    assert X3.shape == (30, 20)


def test_convert(tmp_path):
    f, X, y = _sample(tmp_path)
    ds = convert_svmlight(f, tmp_path / "ds.zarr", n_shards=3)
    assert ds.shape == (30, 15) and ds.n_shards == 3
    np.testing.assert_allclose(ds.load_shards([0, 1, 2]).toarray(), X.toarray(), rtol=1e-15)
    np.testing.assert_allclose(ds.load_y(), y, rtol=1e-15)
    with pytest.raises(FileExistsError):
        convert_svmlight(f, tmp_path / "ds.zarr")


def test_malformed_line(tmp_path):
    f = tmp_path / "bad.svm"
    f.write_text("1.0 1:0.5 3:2\n2.0 2:abc\n")
    with pytest.raises(DatasetError, match=r"bad\.svm"):
        read_svmlight(f)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.svm"):
        read_svmlight(tmp_path / "missing.svm")


def test_empty_and_nonfinite(tmp_path):
    f = tmp_path / "empty.svm"
    f.write_text("")
    with pytest.raises(DatasetError, match="no samples"):
        read_svmlight(f)
    f.write_text("1.0 1:nan\n")
    with pytest.raises(DatasetError, match="X contains NaN"):
        read_svmlight(f)
    f.write_text("inf 1:1\n")
    with pytest.raises(DatasetError, match="labels"):
        read_svmlight(f)
