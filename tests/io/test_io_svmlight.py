"""Tests for dmp.io.svmlight."""

import gzip
import re
import warnings

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


# --------------------------------------------------------------------------- a file cut short;
# every parse error names its line

def test_a_file_cut_at_a_token_boundary_warns_and_names_its_last_line(tmp_path):
    f = tmp_path / "cut.svm"
    f.write_bytes(b"1 1:0.5 3:2\n# a comment\n\n2 1:0.3 4:1.5 7:2\n1 2:1 5:3")  # cut after "5:3"
    with pytest.warns(UserWarning, match=r"cut\.svm:5: the svmlight file does not end with "
                                         r"a newline.*its sample \(row 2\) may be missing "
                                         r"features") as w:
        X, y = read_svmlight(f)
    assert w[0].filename == __file__   # the warning points at the caller, not into dmp
    assert X.shape == (3, 7) and X[2].toarray().tolist() == [[0, 1, 0, 0, 3, 0, 0]]
    with pytest.warns(UserWarning, match="does not end with a newline"):
        convert_svmlight(f, tmp_path / "cut.zarr")
    f.write_bytes(f.read_bytes() + b"\n")   # complete: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_svmlight(f)
        f.write_bytes(b"1 1:0.5\n# a trailing comment")   # nothing can have been cut
        read_svmlight(f)


def test_a_compressed_file_cut_short_warns_too(tmp_path):
    f = tmp_path / "cut.svm.gz"
    with gzip.open(f, "wb") as g:
        g.write(b"1 1:0.5 3:2\n2 1:0.3")
    with pytest.warns(UserWarning, match=r"cut\.svm\.gz:2: the svmlight file does not end"):
        read_svmlight(f)


@pytest.mark.parametrize("text, line, why", [
    (b"1 1:0.5 3:2\n2 1:0.3 4:", 2, "the feature '4:' has no value"),
    (b"1 1:0.5 3:2\n2 1:0.3 4", 2, "the feature '4' is not index:value"),
    (b"1 1:0.5\n\n# c\n1 2:1 3:1 3:4\n", 4, "feature indices must be strictly increasing "
                                           "within a line: 3 comes after 3"),
    (b"1 1:0.5\n2 3:1 1:0.3\n", 2, "feature indices must be strictly increasing within a "
                                  "line: 1 comes after 3"),
    (b"1 1:0.5\n2 1:abc\n", 2, "the value in '1:abc' is not a number"),
    (b"1 1:0.5\nfoo 1:3\n", 2, "the label 'foo' is not a number"),
    (b"1 1:0.5\n2 a:3\n", 2, "the feature index in 'a:3' is not an integer"),
    (b"1 1:0.5\n2 -1:3\n", 2, "invalid feature index -1"),
    (b"1 qid:3 1:0.5\n2 qid:3 x:1\n", 2, "the feature index in 'x:1' is not an integer"),
])
def test_parse_errors_name_the_line(tmp_path, text, line, why):
    f = tmp_path / "bad.svm"
    f.write_bytes(text)
    with pytest.raises(DatasetError, match=rf"bad\.svm:{line}: cannot parse the svmlight "
                                           rf"line: {re.escape(why)}"):
        read_svmlight(f)


def test_value_errors_name_the_line(tmp_path):
    f = tmp_path / "v.svm"
    f.write_text("1 1:0.5\n# comment\n2 2:nan\n")
    with pytest.raises(DatasetError, match=r"v\.svm:3: X contains NaN"):
        read_svmlight(f)
    f.write_text("1 1:0.5\n\n-inf 2:1\n")
    with pytest.raises(DatasetError, match=r"v\.svm:3: the label is NaN or infinite"):
        read_svmlight(f)
    f.write_text("1 1:0.5\n# comment\n2 2:1 9:1\n")
    with pytest.raises(DatasetError, match=r"v\.svm:3: a feature index is beyond "
                                           r"n_features=5 \(the file has 9 features\)"):
        read_svmlight(f, n_features=5)
    X, _ = read_svmlight(f, n_features=12)
    assert X.shape == (2, 12) and X[1, 8] == 1


def test_the_command_line_prints_the_warning_as_one_line(tmp_path, capsys):
    from dmp.cli import main

    f = tmp_path / "cut.svm"
    f.write_bytes(b"1 1:0.5 3:2\n2 1:0.3 4:1")
    assert main(["data", "convert", "svmlight", str(f), str(tmp_path / "c.zarr")]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"dmp: warning: {f}:2: the svmlight file does not end with a "
                          f"newline") and "UserWarning" not in err
    f.write_bytes(b"1 1:0.5 3:2\n2 1:0.3 4:\n")
    assert main(["data", "convert", "svmlight", str(f), str(tmp_path / "d.zarr")]) == 2
    assert f"{f}:2: cannot parse the svmlight line: the feature '4:' has no value" in \
        capsys.readouterr().err
