"""dmp's settings: the ``dmp`` section of Dask's configuration.

The defaults, with what each setting does and which process reads it, are in ``dmp.yaml``
beside this module; importing it adds them to Dask's defaults once
(`dask.config.update_defaults`, as distributed does with its own file), under what a user's
Dask YAML files and ``DASK_DMP__...`` environment variables say, with `dask.config.set` above
all.  Code reads a setting where it uses it, through the typed readers here
(``config.seconds("dmp.ring.timeout")``), so that a change takes effect at once and a
malformed value is reported with its key.  `check` reports keys dmp does not know (a
misspelt key would otherwise be ignored without a word); the runner calls it as a fit starts.
"""

from __future__ import annotations

import copy
import difflib
import warnings
from pathlib import Path

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

from .exceptions import ConfigWarning

#: the file of dmp's defaults (package data)
PATH = Path(__file__).with_name("dmp.yaml")

with PATH.open(encoding="utf-8") as _f:
    DEFAULTS: dict = yaml.safe_load(_f)

dask.config.update_defaults(DEFAULTS)


def _flatten(d: dict, prefix: str) -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}.{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name))
        else:
            out[name] = v
    return out


#: ``{"dmp.batch.max-rounds": 1024, ...}``: every setting and its shipped default
KEYS: dict = _flatten(DEFAULTS["dmp"], "dmp")
_SECTIONS = {k.rsplit(".", i)[0] for k in KEYS for i in range(1, k.count("."))}

_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def get(key: str):
    """The value of setting ``key`` (e.g. ``"dmp.batch.max-rounds"``) as Dask's configuration
    holds it now; its shipped default when a user's config replaced its whole section."""
    if key not in KEYS:
        raise KeyError(f"{key!r} is not one of dmp's settings (see {PATH})")
    return dask.config.get(key, KEYS[key])


def _bad(key, value, what):
    return ValueError(f"Dask setting {key} must be {what}, got {value!r}")


def seconds(key: str) -> float:
    """Setting ``key`` in seconds: a duration such as ``"30s"``, ``"2m"`` or a number of
    seconds."""
    value = get(key)
    try:
        out = float(parse_timedelta(value, default="s"))
    except (KeyError, ValueError, TypeError):
        raise _bad(key, value, "a duration such as '30s' or '2m'") from None
    if out < 0:
        raise _bad(key, value, "a duration of at least 0 s")
    return out


def nbytes(key: str) -> int:
    """Setting ``key`` in bytes: a number of bytes or a size such as ``"64MiB"``."""
    value = get(key)
    try:
        out = int(parse_bytes(value))
    except (KeyError, ValueError, TypeError):
        raise _bad(key, value, "a size such as '64MiB' or a number of bytes") from None
    if out < 1:
        raise _bad(key, value, "a size of at least 1 byte")
    return out


def count(key: str) -> int:
    """Setting ``key`` as a whole number of at least 1 (``"20_000"`` and ``2e7`` too)."""
    value = get(key)
    try:
        number = float(str(value).replace("_", ""))
        if isinstance(value, bool) or not number.is_integer():
            raise ValueError
    except (ValueError, TypeError):
        raise _bad(key, value, "a whole number") from None
    out = int(number)
    if out < 1:
        raise _bad(key, value, "at least 1")
    return out


def choice(key: str, options: tuple[str, ...]) -> str:
    """Setting ``key`` as one of the words ``options`` (any case)."""
    value = get(key)
    word = value.strip().lower() if isinstance(value, str) else value
    if word not in options:
        raise _bad(key, value, "one of " + ", ".join(map(repr, options)))
    return word


def flag(key: str) -> bool:
    """Setting ``key`` as a switch: a boolean, or one of ``on``/``off``, ``yes``/``no``,
    ``true``/``false``, ``1``/``0`` (an environment variable gives a string)."""
    value = get(key)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _FALSE or word in _TRUE:
            return word in _TRUE
        raise _bad(key, value, "a switch: true or false (on/off, yes/no, 1/0)")
    return bool(value)


def _unknown(user, prefix: str) -> list[str]:
    """The keys under ``prefix`` of the user's config ``user`` that no setting has."""
    if not isinstance(user, dict):          # a section (or the dmp section) given a value
        return [prefix]
    out = []
    for k, v in user.items():
        name = f"{prefix}.{str(k).replace('_', '-')}"
        if name in KEYS:
            continue
        out.extend(_unknown(v, name) if name in _SECTIONS else [name])
    return out


def unknown_keys() -> list[str]:
    """The keys of the ``dmp`` section of Dask's configuration that are none of dmp's
    settings (hyphens and underscores alike, as Dask reads them), or a section given a
    plain value."""
    return sorted(_unknown(dask.config.get("dmp", {}), "dmp"))


#: a copy of the last ``dmp`` section `check` found nothing wrong with (every fit checks;
#: the section seldom changes between fits, and comparing it costs less than walking it)
_checked: list = [None]


def check(stacklevel: int = 2) -> list[str]:
    """Warn (`ConfigWarning`) about each key of Dask's ``dmp`` section that is none of dmp's
    settings, with the closest setting's name; returns those keys."""
    section = dask.config.get("dmp", {})
    if _checked[0] is not None and section == _checked[0]:
        return []
    unknown = unknown_keys()
    if not unknown:
        _checked[0] = copy.deepcopy(section)
    for name in unknown:
        close = difflib.get_close_matches(name, list(KEYS) + sorted(_SECTIONS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        warnings.warn(f"Dask setting {name!r} is not one of dmp's settings and is ignored"
                      f"{hint} (dmp's settings and their defaults: {PATH})", ConfigWarning,
                      stacklevel=stacklevel + 1)
    return unknown
