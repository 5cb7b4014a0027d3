"""Dataset recipes: YAML descriptions of datasets, built once and cached.

A recipe is either generated::

    name: lasso_small
    generator: make_sparse_lasso          # or make_correlated_lasso
    params: {n: 2000, p: 20000, density: 0.002, seed: 0}
    n_shards: 8

or converted from a file::

    name: sample_svmlight
    convert: svmlight
    source: sample.svm                    # relative to the recipe file's directory
    params: {n_features: 10}              # optional, passed to read_svmlight
    n_shards: 2
    layout: rows                          # optional: row shards (data-parallel methods);
                                          # default columns (feature blocks, Lasso)
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import re
from pathlib import Path

import yaml

from . import svmlight, synthetic
from .rows import write_sparse_rows
from .sparse import (DatasetError, SparseDataset, _exists, _normalize_path, open_dataset,
                     write_sparse)

__all__ = ["default_cache_dir", "load_recipe", "build_dataset", "GENERATORS", "CONVERTERS"]

GENERATORS = ("make_sparse_lasso", "make_correlated_lasso")
CONVERTERS = ("svmlight",)
_KEYS = {"name", "generator", "convert", "source", "params", "n_shards", "description",
         "layout"}
_LAYOUTS = ("columns", "rows")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_REPO_DATASETS = Path(__file__).resolve().parents[2] / "datasets"


def default_cache_dir() -> Path:
    """Return the dataset cache directory (created if needed).

    ``$DMP_CACHE_DIR`` if set, else ``~/.cache/dmp``.
    """
    d = Path(os.environ.get("DMP_CACHE_DIR") or "~/.cache/dmp").expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d


def _generator(name: str):
    return getattr(synthetic, name)  # looked up at call time (monkeypatchable)


def _coerce(value):
    """YAML 1.1 reads ``1e-3`` as a string; turn numeric strings into floats."""
    if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        return float(value)
    return value


def load_recipe(path_or_dict) -> dict:
    """Load and validate a dataset recipe.

    Parameters
    ----------
    path_or_dict : str, os.PathLike or dict
        A YAML file, a bare recipe name found in the repository's ``datasets/``
        directory, or an already parsed recipe.

    Returns
    -------
    dict
        The recipe with ``params`` defaulted to ``{}``, numeric strings in ``params``
        converted to floats, and (for file recipes) ``source`` made absolute against the
        recipe file's directory.

    Raises
    ------
    ValueError
        Unknown or missing keys, unknown generator/converter, or parameters the
        generator does not accept.
    FileNotFoundError
        The recipe file does not exist.
    """
    if isinstance(path_or_dict, dict):
        where, base = "recipe dict", None
        recipe = copy.deepcopy(path_or_dict)
    else:
        p = Path(os.fspath(path_or_dict)).expanduser()
        if not p.exists() and p.suffix == "" and len(p.parts) == 1:
            cand = _REPO_DATASETS / f"{p}.yaml"
            if cand.exists():
                p = cand
        if not p.is_file():
            raise FileNotFoundError(f"recipe file {str(p)!r} does not exist")
        where, base = f"recipe file {str(p)!r}", p.resolve().parent
        with open(p) as f:
            recipe = yaml.safe_load(f)
        if not isinstance(recipe, dict):
            raise ValueError(f"{where} must contain a YAML mapping, got "
                             f"{type(recipe).__name__}")

    unknown = sorted(set(recipe) - _KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                         f"(allowed: {', '.join(sorted(_KEYS))})")
    name = recipe.get("name")
    if not isinstance(name, str) or not name or "/" in name or os.sep in name:
        raise ValueError(f"{where}: 'name' must be a non-empty string without '/', "
                         f"got {name!r}")
    params = recipe.setdefault("params", {})
    if params is None:
        params = recipe["params"] = {}
    if not isinstance(params, dict):
        raise ValueError(f"{where}: 'params' must be a mapping, got {type(params).__name__}")
    recipe["params"] = params = {k: _coerce(v) for k, v in params.items()}
    n_shards = recipe.get("n_shards")
    if n_shards is not None and (isinstance(n_shards, bool) or not isinstance(n_shards, int)
                                 or n_shards < 1):
        raise ValueError(f"{where}: 'n_shards' must be a positive integer, got {n_shards!r}")

    layout = recipe.setdefault("layout", "columns")
    if layout not in _LAYOUTS:
        raise ValueError(f"{where}: 'layout' must be one of {', '.join(_LAYOUTS)}, "
                         f"got {layout!r}")
    has_gen, has_conv = "generator" in recipe, "convert" in recipe
    if has_gen == has_conv:
        raise ValueError(f"{where}: exactly one of 'generator' or 'convert' is required")
    if has_gen:
        gen = recipe["generator"]
        if gen not in GENERATORS:
            raise ValueError(f"{where}: unknown generator {gen!r} "
                             f"(known: {', '.join(GENERATORS)})")
        if "source" in recipe:
            raise ValueError(f"{where}: 'source' is only valid with 'convert'")
        func = _generator(gen)
    else:
        conv = recipe["convert"]
        if conv not in CONVERTERS:
            raise ValueError(f"{where}: unknown converter {conv!r} "
                             f"(known: {', '.join(CONVERTERS)})")
        src = recipe.get("source")
        if not isinstance(src, str) or not src:
            raise ValueError(f"{where}: 'convert' needs a 'source' file path")
        src = os.path.expanduser(src)
        if base is not None and not os.path.isabs(src):
            src = str(base / src)
        recipe["source"] = src
        func = svmlight.read_svmlight
        if "path" in params:
            raise ValueError(f"{where}: unknown params for read_svmlight: 'path'")

    sig = inspect.signature(func)
    accepted = {k for k, v in sig.parameters.items()
                if v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)} - {"path"}
    var_kw = any(v.kind == v.VAR_KEYWORD for v in sig.parameters.values())
    bad = [] if var_kw else sorted(set(params) - accepted)
    if bad:
        raise ValueError(f"{where}: unknown params for {func.__name__}: "
                         f"{', '.join(map(repr, bad))} (accepted: {', '.join(sorted(accepted))})")
    return recipe


def _recipe_hash(recipe: dict) -> str:
    content = dict(recipe)
    if "source" in content:  # a changed source file gives a new cache entry
        try:
            st = os.stat(content["source"])
            content["_source_stat"] = [st.st_size, st.st_mtime_ns]
        except OSError:
            pass
    blob = json.dumps(content, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def build_dataset(recipe, path=None, *, overwrite=False, storage_options=None) -> SparseDataset:
    """Build (or reuse from the cache) the dataset described by a recipe.

    Parameters
    ----------
    recipe : str, os.PathLike or dict
        Recipe file, recipe name, or parsed recipe (see `load_recipe`).
    path : str or os.PathLike, optional
        Where to write the dataset; default
        ``default_cache_dir() / f"{name}-{hash}.zarr"`` with a short hash of the recipe.
    overwrite : bool, default False
        Rebuild even if a complete dataset already exists at ``path``.
    storage_options : dict, optional
        fsspec options for remote paths.

    Returns
    -------
    SparseDataset
    """
    recipe = load_recipe(recipe)
    cached = path is None
    if cached:
        path = default_cache_dir() / f"{recipe['name']}-{_recipe_hash(recipe)}.zarr"
    path = _normalize_path(path)
    stale = False
    if not overwrite and _exists(path, storage_options):
        try:
            return open_dataset(path, storage_options=storage_options)
        except DatasetError:
            if not cached:  # never replace something at a user-given path silently
                raise
            stale = True  # broken cache entry: rebuild
    params = recipe["params"]
    if "generator" in recipe:
        X, y, _ = _generator(recipe["generator"])(**params)
    else:
        X, y = svmlight.read_svmlight(recipe["source"], **params)
    write = write_sparse_rows if recipe["layout"] == "rows" else write_sparse
    return write(path, X, y, n_shards=recipe.get("n_shards"), overwrite=overwrite or stale,
                 storage_options=storage_options)
