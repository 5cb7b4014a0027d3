"""Declarative checks of the YAML mappings dmp reads (pipeline files, dataset recipes).

A schema is a mapping of key names to `Key` declarations.  `problems` walks a parsed mapping
against it and yields what is wrong, as typed `Problem` values that know where they are (the
key path); the loader that read the file words them (`Problem.message` is the default
wording) and says where (``file:line:``, or the recipe's name).  `apply_defaults` fills the
declared defaults in, `reference_markdown` and `json_schema` describe a schema for readers and
editors, and `key_lines` finds the line of every key in a YAML text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import yaml

__all__ = ["Key", "Problem", "UnknownKeys", "MissingKey", "WrongKind", "NotAChoice", "Invalid",
           "problems", "apply_defaults", "key_lines", "reference_markdown", "json_schema"]


@dataclass(frozen=True)
class Key:
    """One key of a format.

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
    nullable : bool
        ``key: null`` means the key is absent (a mapping's null always does: its defaults).
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
    nullable: bool = False


_EXPECT = {"string": "a non-empty string", "positive_integer": "a positive integer",
           "mapping": "a mapping", "list": "a list", "any": "a value",
           "string_or_mapping": "a name, path or URL, or a recipe mapping",
           "size": "a size such as 4GiB, a number of bytes or 'auto'",
           "boolean_or_auto": "true, false or auto"}


# -- what is wrong ----------------------------------------------------------------------

@dataclass(frozen=True)
class Problem:
    """Something wrong in a mapping: ``path`` is the keys above it, ``where`` the key path
    whose line it is at (the loader reports the deepest of them that the file has)."""

    path: tuple

    @property
    def where(self) -> tuple:
        return self.path

    @property
    def under(self) -> str:
        return f" under {'.'.join(self.path)!r}" if self.path else ""

    def message(self) -> str:   # pragma: no cover - every kind words itself
        raise NotImplementedError


@dataclass(frozen=True)
class UnknownKeys(Problem):
    """Keys the schema does not declare (``keys`` in the file's order)."""

    keys: tuple
    allowed: tuple

    @property
    def where(self):
        return (*self.path, self.keys[0])

    def message(self):
        return f"unknown key {self.keys[0]!r}{self.under}; allowed: {list(self.allowed)}"


@dataclass(frozen=True)
class _KeyProblem(Problem):
    key: str

    @property
    def where(self):
        return (*self.path, self.key)

    @property
    def dotted(self) -> str:
        return ".".join((*self.path, self.key))


@dataclass(frozen=True)
class MissingKey(_KeyProblem):
    """A required key is absent."""

    choices: tuple | None = None

    @property
    def where(self):
        return self.path

    def message(self):
        hint = f" (one of {list(self.choices)})" if self.choices else ""
        return f"missing required key {self.key!r}{self.under}{hint}"


@dataclass(frozen=True)
class WrongKind(_KeyProblem):
    """A value of the wrong kind (``kind`` as in `Key`)."""

    kind: str
    value: object

    def message(self):
        return f"{self.dotted!r} must be {_EXPECT[self.kind]}, got {self.value!r}"


@dataclass(frozen=True)
class NotAChoice(_KeyProblem):
    """A value (or a list's item) outside the declared ``choices``."""

    value: object
    choices: tuple
    noun: str | None = None

    def message(self):
        if self.noun:
            return f"unknown {self.noun} {self.value!r}; known: {list(self.choices)}"
        return f"{self.dotted!r}: {self.value!r} is not one of {list(self.choices)}"


@dataclass(frozen=True)
class Invalid(_KeyProblem):
    """What a key's own ``check`` said."""

    value: object
    text: str

    def message(self):
        return self.text


# -- the checks ---------------------------------------------------------------------------

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


def problems(spec: dict, schema: dict, prefix: tuple = ()):
    """Yield what is wrong in ``spec`` against ``schema``, in the order a reader meets it:
    unknown keys first, then each declared key (missing, kind, choices, its own check, then
    a mapping's keys).  A loader reports the first one."""
    unknown = tuple(key for key in spec if key not in schema)
    if unknown:
        yield UnknownKeys(prefix, unknown, tuple(sorted(schema)))
    for key, k in schema.items():
        if key not in spec:
            if k.required:
                yield MissingKey(prefix, key, k.choices)
            continue
        value = spec[key]
        if value is None and not k.required and (k.nullable or k.kind == "mapping"):
            continue   # `cluster:` with nothing under it: the defaults
        if not _kind_ok(k.kind, value):
            yield WrongKind(prefix, key, k.kind, value)
            continue
        if k.choices is not None:
            items = value if k.kind == "list" else [value]
            bad = [v for v in items if v not in k.choices]
            if bad:
                yield NotAChoice(prefix, key, bad[0], k.choices, k.noun)
                continue
        if k.check is not None:
            msg = k.check(value)
            if msg:
                yield Invalid(prefix, key, value, msg)
                continue
        if k.kind == "mapping" and k.keys is not None:
            yield from problems(value, k.keys, (*prefix, key))


def apply_defaults(spec: dict, schema: dict) -> dict:
    """Fill the plain defaults in (mappings recursively; a null mapping is its defaults),
    in place; returns ``spec``."""
    for key, k in schema.items():
        if k.kind == "mapping" and k.keys is not None and (key in spec or k.default is not None):
            if spec.get(key) is None:
                spec[key] = {}
            apply_defaults(spec[key], k.keys)
        elif k.default is not None and (key not in spec or (spec[key] is None
                                                            and k.kind == "mapping")):
            spec[key] = _copy(k.default)
    return spec


def _copy(v):
    return list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v


def key_lines(node, prefix=()) -> dict:
    """``{(key, subkey, ...): line}`` (1-based) of every mapping key in a composed YAML node
    (``yaml.compose(text)``)."""
    lines = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                path = (*prefix, key.value)
                lines[path] = key.start_mark.line + 1
                lines.update(key_lines(value, path))
    return lines


# -- for readers and editors --------------------------------------------------------------

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


def reference_markdown(schema: dict) -> str:
    """A Markdown table of every key: name, type, default, meaning."""
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

    walk(schema, ())
    return "\n".join(rows) + "\n"


def json_schema(schema: dict, title: str) -> dict:
    """The format as a JSON Schema (draft 2020-12), for editors; `problems` is the check."""
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
            "title": title, "type": "object", **mapping(schema)}
