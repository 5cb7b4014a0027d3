"""The pipeline YAML format, declared once: every key, its type, its default and what it means,
and the typed spec a file is read into.

`load_pipeline` checks a file against `PIPELINE` (the `dmp.utils.schema` checks, worded here
with ``file:line:``) and the estimator's own parameter checks, and returns a `PipelineSpec`;
the README's "Pipeline files" table is `reference_markdown()` verbatim (a test keeps them
equal), and `json_schema()` gives the same format as a JSON Schema for editors.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .utils import schema as _schema
from .utils.schema import Key, key_lines

#: estimator classes a pipeline may name (``class:``), and where they live
ESTIMATORS = {"Lasso": "dmp.linear_model:Lasso",
              "SparsifiedSGDClassifier": "dmp.linear_model:SparsifiedSGDClassifier",
              "SparsifiedSGDRegressor": "dmp.linear_model:SparsifiedSGDRegressor",
              "MatrixFactorization": "dmp.decomposition:MatrixFactorization",
              "LatentDirichletAllocation": "dmp.decomposition:LatentDirichletAllocation",
              "BinaryAutoencoder": "dmp.hashing:BinaryAutoencoder"}
SPARSIFIED = ("SparsifiedSGDClassifier", "SparsifiedSGDRegressor")


class PipelineError(ValueError):
    """A pipeline file is invalid."""


def _check_compare(value):
    if len(value) > 1 or any(not isinstance(v, list) or not v for v in value.values()):
        return "'compare' must map one parameter to a non-empty list of values"
    return None


PIPELINE = {
    "name": Key("string", "Label of the pipeline (metrics.json, the default output folder).",
                required=True),
    "description": Key("string", "Free text, for the reader."),
    "dataset": Key("string_or_mapping",
                   "A recipe name (a `datasets/<name>.yaml` beside the pipeline's folder, "
                   "else one of dmp's own), a recipe file, a dmp Zarr dataset, an fsspec URL "
                   "(`s3://...`, read by the workers) or an inline recipe mapping. Relative "
                   "paths: the pipeline file's folder first, then the working directory.",
                   required=True),
    "estimator": Key("mapping", "What is fitted.", required=True, keys={
        "class": Key("string", "The estimator class.", required=True,
                     choices=tuple(sorted(ESTIMATORS)), noun="estimator class"),
        "params": Key("mapping", "Constructor parameters (the estimator checks them at "
                      "load time). Lasso also takes `alpha_ratio` (alpha = ratio x "
                      "alpha_max of the data).", default={}, default_doc="`{}`"),
    }),
    "compare": Key("mapping", "One parameter mapped to a list of values: one fit per value, "
                   "all in the same plots.", default_doc="one fit", check=_check_compare),
    "cluster": Key("mapping", "The embedded `LocalCluster` (ignored with `--scheduler`).",
                   default={}, default_doc="`{}`", keys={
                       "n_workers": Key("positive_integer", "Worker processes (`--workers` "
                                        "overrides it).", default=2),
                       "threads_per_worker": Key("positive_integer", "Threads per worker.",
                                                 default=1),
                       "memory_limit": Key("size", "Memory limit per worker (`4GiB`, bytes "
                                           "or `auto`).", default="auto"),
                   }),
    "checkpoint_every": Key("positive_integer", "Rounds between checkpoints (estimators "
                            "that checkpoint).", default=50),
    "checkpoints": Key("string", "Where the checkpoint stores go (folder or fsspec URL); "
                       "relative to the working directory.",
                       default_doc="`.<output name>-checkpoints` beside the output"),
    "storage_options": Key("mapping", "fsspec options for a dataset URL (checkpoint stores "
                           "use the environment's credentials)."),
    "output": Key("string", "Output folder, relative to the working directory "
                  "(`--output` overrides it).", default_doc="`runs/<name>`"),
    "in_process": Key("boolean_or_auto", "Also time the same estimator and parameters in "
                      "one process (`backend=\"local\"`: the partitions `n_workers` asks for, "
                      "else 1) and print it beside the cluster's time; `auto`: when the "
                      "embedded cluster runs and the dataset holds at most "
                      "`dmp.pipeline.in-process-max-values` stored values (20 million by "
                      "default).", default="auto"),
    "reference": Key("string", "`lbfgs`: the optimum by scipy L-BFGS on the driver, for "
                     "suboptimality plots.", choices=("lbfgs",), only_for=SPARSIFIED),
    "evaluation": Key("mapping", "Retrieval evaluation of the hash codes.",
                      only_for=("BinaryAutoencoder",), keys={
                          "k": Key("positive_integer", "Neighbours for precision@k.",
                                   default=50),
                          "baselines": Key("list", "Hashing baselines to compare with.",
                                           default=["itq", "pca"], choices=("itq", "pca")),
                      }),
}


# -- checking a file ----------------------------------------------------------------------

def validate(spec, fail, schema=None, prefix=()) -> None:
    """Check ``spec`` against the schema; ``fail(message, *key_path)`` reports the first
    problem at the line of the deepest key of ``key_path`` that the file has (it raises)."""
    for problem in _schema.problems(spec, PIPELINE if schema is None else schema, prefix):
        fail(problem.message(), *problem.where)


def check_applies(spec, fail, class_name) -> None:
    """Keys that only mean something for some estimator classes."""
    for key, k in PIPELINE.items():
        if k.only_for and key in spec and spec[key] is not None and class_name not in k.only_for:
            fail(f"{key!r} is only defined for {' / '.join(k.only_for)}, not {class_name}",
                 key)


def apply_defaults(spec, schema=None) -> dict:
    """Fill the plain defaults in (mappings recursively), in place; returns ``spec``."""
    return _schema.apply_defaults(spec, PIPELINE if schema is None else schema)


def reference_markdown() -> str:
    """The README's table of every key: name, type, default, meaning."""
    return _schema.reference_markdown(PIPELINE)


def json_schema() -> dict:
    """The format as a JSON Schema (draft 2020-12), for editors; `validate` is the check."""
    return _schema.json_schema(PIPELINE, "dmp pipeline")


def estimator_class(name: str) -> type:
    """The estimator class a pipeline's ``class:`` names (imported when asked for)."""
    module, attr = ESTIMATORS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def load_pipeline(path) -> PipelineSpec:
    """Read and validate a pipeline YAML file.

    Every error names the file, the line and the key (``file.yaml:7: ...``), including the
    estimator's own parameter checks, so a typo is found before any data is built or any
    cluster is started.

    Returns
    -------
    PipelineSpec
        The file with the schema's defaults filled in.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    PipelineError
        The file is not valid YAML or not a valid pipeline.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pipeline file {str(path)!r} does not exist")
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise PipelineError(f"{path}: not a text file ({exc})") from None
    try:
        spec = yaml.safe_load(text)
        lines = key_lines(yaml.compose(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise PipelineError(f"{where}: not valid YAML: {problem}") from None

    def fail(msg, *keys):
        while keys and keys not in lines:
            keys = keys[:-1]
        where = f"{path}:{lines[keys]}" if keys else str(path)
        raise PipelineError(f"{where}: {msg}")

    if not isinstance(spec, dict):
        fail("a pipeline must be a mapping of keys")
    validate(spec, fail)
    est = spec["estimator"]
    check_applies(spec, fail, est["class"])
    apply_defaults(spec)
    compare = spec.get("compare") or {}
    params = est.get("params") or {}
    if "alpha_ratio" in params and est["class"] != "Lasso":
        fail("'alpha_ratio' is only defined for Lasso", "estimator", "params", "alpha_ratio")
    if "alpha_ratio" in params and "alpha" in params:
        fail("give either 'alpha' or 'alpha_ratio', not both",
             "estimator", "params", "alpha_ratio")
    _check_params(est["class"], params, compare, fail)
    spec.setdefault("output", f"runs/{spec['name']}")
    return PipelineSpec.from_dict(spec, path=path.resolve(), lines=lines)


def _check_params(class_name, params, compare, fail) -> None:
    """Run the estimator's own parameter checks on ``params`` (and on every ``compare``
    value) now, reporting the line of the offending parameter."""
    cls = estimator_class(class_name)
    known = set(cls().get_params())
    for key in params:
        if key not in known and key != "alpha_ratio":
            fail(f"unknown parameter {key!r} for {class_name}; known: {sorted(known)}",
                 "estimator", "params", key)
    for key in compare:
        if key not in known:
            fail(f"'compare' names {key!r}, not a parameter of {class_name}", "compare", key)
    values = dict(params)
    if "alpha_ratio" in values:
        ratio = values.pop("alpha_ratio")
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0:
            fail(f"'alpha_ratio' must be a number > 0, got {ratio!r}",
                 "estimator", "params", "alpha_ratio")
        values["alpha"] = 1.0   # the real alpha is known once the data is
    (cmp_key, cmp_values), = compare.items() if compare else ((None, [None]),)
    for value in cmp_values:
        trial = {**values, cmp_key: value} if cmp_key else values
        try:
            cls(**trial)._validate_params()
        except (TypeError, ValueError) as exc:
            bad = [k for k in trial if re.search(rf"\b{re.escape(k)}\b", str(exc))]
            keys = (("compare", cmp_key) if cmp_key in bad else
                    ("estimator", "params", bad[0]) if bad else ("estimator", "params"))
            fail(f"invalid parameter for {class_name}: {exc}", *keys)


# -- the typed spec -----------------------------------------------------------------------

@dataclass(frozen=True)
class EstimatorSpec:
    """``estimator:``: the class a pipeline fits and its constructor parameters as the file
    gives them (Lasso's ``alpha_ratio`` included: the data resolves it)."""

    class_name: str
    params: dict

    @property
    def cls(self) -> type:
        return estimator_class(self.class_name)


@dataclass(frozen=True)
class Compare:
    """``compare:``: one fit per value of one estimator parameter."""

    key: str
    values: tuple


@dataclass(frozen=True)
class ClusterSpec:
    """``cluster:``: the embedded ``LocalCluster``."""

    n_workers: int
    threads_per_worker: int
    memory_limit: object


@dataclass(frozen=True)
class EvaluationSpec:
    """``evaluation:``: the retrieval evaluation of hash codes."""

    k: int
    baselines: tuple


@dataclass(frozen=True)
class PipelineSpec(Mapping):
    """A checked pipeline file (`load_pipeline`), every default filled in.

    The fields are the keys of `PIPELINE`; ``path`` is the file (resolved) and ``lines`` the
    line of every key path in it (``{("estimator", "params", "tol"): 7, ...}``).  A spec
    also reads as the mapping the file gives, defaults included
    (``spec["estimator"]["params"]``): what `load_pipeline` returned before it was typed.
    """

    name: str
    dataset: object
    estimator: EstimatorSpec
    cluster: ClusterSpec
    checkpoint_every: int
    in_process: object
    output: str
    path: Path
    lines: dict = field(repr=False)
    description: str | None = None
    compare: Compare | None = None
    checkpoints: str | None = None
    storage_options: dict | None = None
    reference: str | None = None
    evaluation: EvaluationSpec | None = None

    @classmethod
    def from_dict(cls, spec: dict, *, path, lines=None) -> PipelineSpec:
        """The spec of a checked pipeline mapping with its defaults filled in."""
        est = spec["estimator"]
        compare = spec.get("compare") or {}
        (key, values), = compare.items() if compare else ((None, None),)
        ev = spec.get("evaluation")
        return cls(
            name=spec["name"], dataset=spec["dataset"],
            estimator=EstimatorSpec(est["class"], dict(est.get("params") or {})),
            cluster=ClusterSpec(**spec["cluster"]),
            checkpoint_every=spec["checkpoint_every"], in_process=spec["in_process"],
            output=spec["output"], path=Path(path), lines=dict(lines or {}),
            description=spec.get("description"),
            compare=Compare(key, tuple(values)) if key is not None else None,
            checkpoints=spec.get("checkpoints"), storage_options=spec.get("storage_options"),
            reference=spec.get("reference"),
            evaluation=EvaluationSpec(ev["k"], tuple(ev["baselines"])) if ev else None)

    def as_dict(self) -> dict:
        """The mapping form: the file's keys with the defaults filled in."""
        out = {"name": self.name, "description": self.description, "dataset": self.dataset,
               "estimator": {"class": self.estimator.class_name,
                             "params": self.estimator.params},
               "compare": ({self.compare.key: list(self.compare.values)}
                           if self.compare else None),
               "cluster": {"n_workers": self.cluster.n_workers,
                           "threads_per_worker": self.cluster.threads_per_worker,
                           "memory_limit": self.cluster.memory_limit},
               "checkpoint_every": self.checkpoint_every, "checkpoints": self.checkpoints,
               "storage_options": self.storage_options, "output": self.output,
               "in_process": self.in_process, "reference": self.reference,
               "evaluation": ({"k": self.evaluation.k,
                               "baselines": list(self.evaluation.baselines)}
                              if self.evaluation else None)}
        return {k: v for k, v in out.items() if v is not None}

    def __getitem__(self, key):
        return self.as_dict()[key]

    def __iter__(self):
        return iter(self.as_dict())

    def __len__(self):
        return len(self.as_dict())
