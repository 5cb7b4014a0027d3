"""dmp as a user installs it: the dataset recipes and their data files are package data, a wheel
holds them, an install outside the checkout builds them, and building the wheel prints no
deprecation warning."""

import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml

import dmp
from dmp.io import build_dataset, load_recipe

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(dmp.__file__).resolve().parent
RECIPES = sorted((PACKAGE / "datasets").glob("*.yaml"))


def test_recipes_are_package_data():
    names = {p.stem for p in RECIPES}
    # the recipes the README, the pipelines and the tests name
    assert {"tiny_corpus", "digits", "lasso_small", "lasso_sparse_a", "ratings_small",
            "sample_svmlight", "breast_cancer_scale", "hashing_mixture"} <= names
    for path in RECIPES:
        recipe = load_recipe(path.stem)         # a bare name is found in the package
        assert recipe["name"] == path.stem
        raw = yaml.safe_load(path.read_text()).get("source")
        if isinstance(raw, str) and (path.parent / raw).is_file():   # a file beside its recipe
            assert Path(recipe["source"]) == path.parent / raw
    stray = sorted(p.name for p in (REPO / "datasets").glob("*"))
    assert not stray, f"datasets/ holds {stray}: recipes and their files go in dmp/datasets/ " \
        "(package data), where an installed dmp finds them"


def test_unknown_recipe_lists_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match=r"unknown recipe 'no_such'.*tiny_corpus"):
        load_recipe("no_such")


def _source_copy(dest: Path) -> Path:
    """The files a wheel is built from, copied (an in-tree build would write build/ and
    *.egg-info into the checkout, which other test runs share)."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "dmp", dest / "dmp",
                    ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    return dest


@pytest.mark.slow
def test_wheel_ships_recipes_and_installs_outside_the_checkout(tmp_path):
    pytest.importorskip("setuptools", reason="the test extra installs setuptools to build dmp")
    (tmp_path / "src").mkdir()
    src = _source_copy(tmp_path / "src")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "--no-cache-dir", "-w", str(tmp_path / "dist"),
                          str(src)], capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "deprecat" not in log.lower(), log   # e.g. setuptools' licence-table warning
    (wheel,) = (tmp_path / "dist").glob("dmp-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(zf.read(meta).decode())
    shipped = {f"dmp/datasets/{p.name}" for p in (PACKAGE / "datasets").iterdir()
               if p.is_file() and not p.name.startswith(".")}
    assert {f"dmp/datasets/{p.name}" for p in RECIPES} <= shipped
    assert shipped <= names, f"not in the wheel: {sorted(shipped - names)}"
    assert "dmp/dmp.yaml" in names                   # dmp's settings (dmp/config.py)
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir",
                          "--target", str(site), str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    # a user's folder, nowhere near the checkout: dmp comes from the install, its
    # dependencies from this environment
    env = {**os.environ, "PYTHONPATH": str(site), "DMP_CACHE_DIR": str(tmp_path / "cache")}
    code = ("import dmp; from dmp.io import build_dataset\n"
            "print(dmp.__file__)\n"
            "ds = build_dataset('tiny_corpus'); print(ds.shape)\n"
            "r = build_dataset('sample_svmlight'); print(r.shape)\n"
            "import dask; print(dask.config.get('dmp.batch.max-rounds'))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert Path(lines[0]).resolve().is_relative_to(site.resolve()), lines[0]
    # the same datasets as this checkout builds
    assert lines[1:3] == [str(build_dataset("tiny_corpus").shape),
                          str(build_dataset("sample_svmlight").shape)]
    # the installed dmp's settings are those of its dmp.yaml
    assert lines[3:] == [str(yaml.safe_load((PACKAGE / "dmp.yaml").read_text())
                             ["dmp"]["batch"]["max-rounds"])]



def test_a_process_that_imported_dmp_skips_the_heap_walk_at_exit():
    """Shutdown's last garbage collection of a process holding numba, scipy and distributed
    costs seconds (Dask workers took ~4 s to exit after a fit); dmp freezes the heap at exit so
    it is skipped.  Seen from an exit handler that runs after dmp's (handlers run last first):
    what the import left on the heap is frozen by then."""
    code = ("import atexit, gc\n"
            "atexit.register(lambda: print('frozen at exit:',"
            " len(gc.get_objects()) < n // 2))\n"
            "import dmp\n"
            "n = len(gc.get_objects()) + gc.get_freeze_count()\n")  # the heap after import
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "frozen at exit: True" in out.stdout, out.stdout + out.stderr
