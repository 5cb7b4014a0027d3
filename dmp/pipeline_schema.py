"""The pipeline YAML format, declared once: every key, its type, its default and what it means.

`dmp.pipeline.load_pipeline` validates every file against `PIPELINE` (with the
``file:line:`` messages of `validate`), the README's "Pipeline files" table is
`reference_markdown()` verbatim (a test keeps them equal), and `json_schema()` gives the same
format as a JSON Schema for editors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

#: estimator classes a pipeline may name (``class:``), and where they live
ESTIMATORS = {"Lasso": "dmp.linear_model:Lasso",
              "SparsifiedSGDClassifier": "dmp.linear_model:SparsifiedSGDClassifier",
              "SparsifiedSGDRegressor": "dmp.linear_model:SparsifiedSGDRegressor",
              "MatrixFactorization": "dmp.decomposition:MatrixFactorization",
              "LatentDirichletAllocation": "dmp.decomposition:LatentDirichletAllocation",
              "BinaryAutoencoder": "dmp.hashing:BinaryAutoencoder"}
SPARSIFIED = ("SparsifiedSGDClassifier", "SparsifiedSGDRegressor")


@dataclass(frozen=True)
class Key:
    """One key of the format.

    Parameters
    ----------
    kind : str
        ``"string"`` (non-empty), ``"positive_integer"``, ``"mapping"`` (of the ``keys``
        given, or free-form when ``keys`` is None), ``"list"``, ``"string_or_mapping"``,
        ``"size"`` (a string such as ``4GiB`` or a number of bytes), ``"boolean_or_auto"``,
        ``"any"``.
    doc : str
        What it means (the README's reference says this).
    default : object
        The value used when the key is absent (None: absent means "none").
    default_doc : str, optional
        The default as the reference prints it, where it is not a plain value.
    required : bool
    keys : dict, optional
        A mapping's own keys.
    choices : tuple, optional
        The allowed values (of the key, or of a list's items).
    only_for : tuple, optional
        Estimator classes the key applies to.
    noun : str, optional
        What a value is, for the message when it is not one of ``choices``.
    check : callable, optional
        ``check(value) -> message or None``, for what the kind alone cannot say.
    """

    kind: str
    doc: str
    default: object = None
    default_doc: str | None = None
    required: bool = False
    keys: dict | None = None
    choices: tuple | None = None
    only_for: tuple | None = None
    noun: str | None = None
    check: Callable | None = field(default=None, compare=False)


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
                      "embedded cluster runs and the dataset holds at most 20 million stored "
                      "values.", default="auto"),
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

_EXPECT = {"string": "a non-empty string", "positive_integer": "a positive integer",
           "mapping": "a mapping", "list": "a list", "any": "a value",
           "string_or_mapping": "a name, path or URL, or a recipe mapping",
           "size": "a size such as 4GiB, a number of bytes or 'auto'",
           "boolean_or_auto": "true, false or auto"}


def _kind_ok(kind, value) -> bool:
    if kind == "string":
        return isinstance(value, str) and bool(value.strip())
    if kind == "positive_integer":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if kind == "mapping":
        return isinstance(value, dict)
    if kind == "list":
        return isinstance(value, list)
    if kind == "string_or_mapping":
        return (isinstance(value, str) and bool(value.strip())) or isinstance(value, dict)
    if kind == "size":
        return ((isinstance(value, str) and bool(value.strip()))
                or (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and value > 0))
    if kind == "boolean_or_auto":
        return isinstance(value, bool) or value == "auto"
    return True


def validate(spec, fail, schema=None, prefix=()) -> None:
    """Check ``spec`` against the schema; ``fail(message, *key_path)`` reports a problem at
    the line of the deepest key of ``key_path`` that the file has (it raises)."""
    schema = PIPELINE if schema is None else schema
    under = f" under {'.'.join(prefix)!r}" if prefix else ""
    for key in spec:
        if key not in schema:
            fail(f"unknown key {key!r}{under}; allowed: {sorted(schema)}", *prefix, key)
    for key, k in schema.items():
        if key not in spec:
            if k.required:
                hint = f" (one of {list(k.choices)})" if k.choices else ""
                fail(f"missing required key {key!r}{under}{hint}", *prefix)
            continue
        value = spec[key]
        dotted = ".".join((*prefix, key))
        if value is None and not k.required and k.kind in ("mapping",):
            continue   # `cluster:` with nothing under it: the defaults
        if not _kind_ok(k.kind, value):
            fail(f"{dotted!r} must be {_EXPECT[k.kind]}, got {value!r}", *prefix, key)
        if k.choices is not None:
            items = value if k.kind == "list" else [value]
            bad = [v for v in items if v not in k.choices]
            if bad and k.noun:
                fail(f"unknown {k.noun} {bad[0]!r}; known: {list(k.choices)}", *prefix, key)
            if bad:
                fail(f"{dotted!r}: {bad[0]!r} is not one of {list(k.choices)}", *prefix, key)
        if k.check is not None:
            msg = k.check(value)
            if msg:
                fail(msg, *prefix, key)
        if k.kind == "mapping" and k.keys is not None:
            validate(value, fail, k.keys, (*prefix, key))


def check_applies(spec, fail, class_name) -> None:
    """Keys that only mean something for some estimator classes."""
    for key, k in PIPELINE.items():
        if k.only_for and key in spec and spec[key] is not None and class_name not in k.only_for:
            fail(f"{key!r} is only defined for {' / '.join(k.only_for)}, not {class_name}",
                 key)


def apply_defaults(spec, schema=None) -> dict:
    """Fill the plain defaults in (mappings recursively), in place; returns ``spec``."""
    schema = PIPELINE if schema is None else schema
    for key, k in schema.items():
        if k.kind == "mapping" and k.keys is not None and (key in spec or k.default is not None):
            if spec.get(key) is None:
                spec[key] = {}
            apply_defaults(spec[key], k.keys)
        elif key not in spec and k.default is not None:
            spec[key] = _copy(k.default)
    return spec


def _copy(v):
    return list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v


def _default_text(k: Key) -> str:
    if k.required:
        return "required"
    if k.default_doc is not None:
        return k.default_doc
    if k.default is None:
        return "none"
    if isinstance(k.default, list):
        return "`[" + ", ".join(map(str, k.default)) + "]`"
    return f"`{k.default}`"


def reference_markdown() -> str:
    """The README's table of every key: name, type, default, meaning."""
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]

    def walk(schema, prefix):
        for key, k in schema.items():
            name = ".".join((*prefix, key))
            kind = k.kind.replace("_", " ")
            if k.choices:
                kind += ": " + ", ".join(f"`{c}`" for c in k.choices)
            doc = k.doc + (f" Only for {', '.join(k.only_for)}." if k.only_for else "")
            rows.append(f"| `{name}` | {kind} | {_default_text(k)} | {doc} |")
            if k.keys:
                walk(k.keys, (*prefix, key))

    walk(PIPELINE, ())
    return "\n".join(rows) + "\n"


def json_schema() -> dict:
    """The format as a JSON Schema (draft 2020-12), for editors; `validate` is the check."""
    def node(k: Key) -> dict:
        out = {"description": k.doc}
        if k.kind == "string":
            out.update(type="string", minLength=1)
        elif k.kind == "positive_integer":
            out.update(type="integer", minimum=1)
        elif k.kind == "list":
            out["type"] = "array"
            if k.choices:
                out["items"] = {"enum": list(k.choices)}
        elif k.kind == "string_or_mapping":
            out["type"] = ["string", "object"]
        elif k.kind == "size":
            out["type"] = ["string", "number"]
        elif k.kind == "boolean_or_auto":
            out["enum"] = [True, False, "auto"]
        elif k.kind == "mapping":
            out["type"] = "object"
            if k.keys is not None:
                out.update(mapping(k.keys))
        if k.choices and k.kind != "list":
            out["enum"] = list(k.choices)
        if k.default is not None:
            out["default"] = k.default
        return out

    def mapping(schema):
        return {"properties": {key: node(k) for key, k in schema.items()},
                "required": [key for key, k in schema.items() if k.required],
                "additionalProperties": False}

    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "dmp pipeline", "type": "object", **mapping(PIPELINE)}
