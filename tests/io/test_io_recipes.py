"""Tests for dmp.io.recipes."""

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

import dmp.io.synthetic as synthetic
from dmp.io import build_dataset, default_cache_dir, load_recipe, make_sparse_lasso

REPO_DATASETS = Path(__file__).resolve().parents[2] / "dmp" / "datasets"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DMP_CACHE_DIR", str(tmp_path / "cache"))


def _tiny(**kw):
    r = {"name": "tiny", "generator": "make_sparse_lasso",
         "params": {"n": 50, "p": 200, "density": 0.02, "seed": 1}, "n_shards": 4}
    r.update(kw)
    return r


def test_default_cache_dir(tmp_path, monkeypatch):
    assert default_cache_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()
    monkeypatch.delenv("DMP_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "dmp"


def test_build_matches_generator_and_caches(tmp_path, monkeypatch):
    ds = build_dataset(_tiny())
    assert Path(ds.path).parent == tmp_path / "cache"
    assert Path(ds.path).name.startswith("tiny-") and ds.path.endswith(".zarr")
    X, y, _ = make_sparse_lasso(n=50, p=200, density=0.02, seed=1)
    np.testing.assert_array_equal(ds.load_shards(range(4)).toarray(), X.toarray())
    np.testing.assert_array_equal(ds.load_y(), y)
    mtime = os.stat(Path(ds.path) / "zarr.json").st_mtime_ns

    def boom(**kw):
        raise AssertionError("generator called again")

    monkeypatch.setattr(synthetic, "make_sparse_lasso", boom)
    ds2 = build_dataset(_tiny())
    assert ds2.path == ds.path
    assert os.stat(Path(ds.path) / "zarr.json").st_mtime_ns == mtime
    with pytest.raises(AssertionError, match="called again"):
        build_dataset(_tiny(), overwrite=True)
    # a different recipe gets a different cache entry
    monkeypatch.undo()
    monkeypatch.setenv("DMP_CACHE_DIR", str(tmp_path / "cache"))
    ds3 = build_dataset(_tiny(params={"n": 50, "p": 200, "density": 0.02, "seed": 2}))
    assert ds3.path != ds.path


def test_build_explicit_path(tmp_path):
    ds = build_dataset(_tiny(), tmp_path / "x.zarr")
    assert ds.path == str(tmp_path / "x.zarr") and ds.n_shards == 4
    # the same recipe again reuses it
    assert build_dataset(_tiny(), tmp_path / "x.zarr").shape == ds.shape


def test_a_path_holding_another_recipes_dataset_is_not_returned(tmp_path):
    """At a user's path, an existing dataset is reused only if this recipe built it."""
    path = tmp_path / "x.zarr"
    build_dataset(_tiny(), path)
    other = _tiny(name="other", params={"n": 40, "p": 100, "density": 0.05, "seed": 3})
    with pytest.raises(FileExistsError, match="not built from recipe 'other'"):
        build_dataset(other, path)
    assert build_dataset(_tiny(), path).shape == (50, 200)   # untouched
    assert build_dataset(other, path, overwrite=True).shape == (40, 100)
    assert build_dataset(other, path).shape == (40, 100)


def test_overwrite_replaces_only_a_dataset(tmp_path, foreign):
    """``overwrite`` replaces a dmp dataset, never a folder or file of something else."""
    for path in foreign.paths:
        with pytest.raises(FileExistsError, match="not a dmp dataset"):
            build_dataset(_tiny(), path, overwrite=True)
    assert foreign.untouched()
    assert {"file.txt", "notes"} <= {p.name for p in tmp_path.iterdir()}
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_broken_cache_entry_is_rebuilt(tmp_path):
    ds = build_dataset(_tiny())
    (Path(ds.path) / "zarr.json").write_text("{ not json")
    again = build_dataset(_tiny())
    assert again.path == ds.path and again.shape == (50, 200)


def test_unknown_key_names_key_and_file(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump(_tiny(shards=3)))
    with pytest.raises(ValueError, match=r"'shards'.*|r\.yaml") as e:
        load_recipe(f)
    assert "'shards'" in str(e.value) and "r.yaml" in str(e.value)


def test_unknown_generator_and_params():
    with pytest.raises(ValueError, match="make_sparse_lasso, make_correlated_lasso"):
        load_recipe(_tiny(generator="make_dense"))
    with pytest.raises(ValueError, match="'rho'"):
        load_recipe(_tiny(params={"n": 10, "rho": 0.5}))
    with pytest.raises(ValueError, match="exactly one"):
        load_recipe({"name": "x", "params": {}})


def test_yaml_float_strings(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("name: t\ngenerator: make_sparse_lasso\nparams: {n: 20, p: 50, density: 5e-2}\n")
    assert load_recipe(f)["params"]["density"] == 0.05


@pytest.mark.parametrize("name", ["lasso_sparse_a", "lasso_small", "lasso_correlated",
                                  "sample_svmlight"])
def test_shipped_recipes_are_valid(name):
    r = load_recipe(REPO_DATASETS / f"{name}.yaml")
    assert r["name"] == name and r["n_shards"] >= 1


def test_svmlight_recipe_resolves_relative_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # source must resolve against the recipe's directory
    ds = build_dataset(REPO_DATASETS / "sample_svmlight.yaml")
    lines = (REPO_DATASETS / "sample.svm").read_text().splitlines()
    assert ds.n_samples == len(lines) >= 15
    y = np.array([float(line.split()[0]) for line in lines])
    np.testing.assert_array_equal(ds.load_y(), y)
    ds.validate()


def test_row_layout_recipe_builds_a_row_store(tmp_path, monkeypatch):
    from sklearn.datasets import load_breast_cancer

    from dmp.io import SparseRowDataset

    monkeypatch.setenv("DMP_CACHE_DIR", str(tmp_path / "cache"))
    ds = build_dataset("breast_cancer_scale")
    assert isinstance(ds, SparseRowDataset) and ds.shape == (569, 30) and ds.n_shards == 10
    X, y = ds.load_row_shards(list(range(ds.n_shards)))
    Xr, yr = load_breast_cancer(return_X_y=True)
    lo, hi = Xr.min(0), Xr.max(0)
    np.testing.assert_allclose(X.toarray(), 2 * (Xr - lo) / (hi - lo) - 1, atol=1e-5)
    np.testing.assert_array_equal(y, np.where(yr == 1, 1.0, -1.0))
    with pytest.raises(ValueError, match="'layout' must be one of columns, rows"):
        load_recipe({"name": "x", "generator": "make_sparse_lasso", "layout": "diagonal"})
