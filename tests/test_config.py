"""dmp's settings are the ``dmp`` section of Dask's configuration: the shipped file
(``dmp/dmp.yaml``) gives the defaults, `dask.config.set` and ``DASK_DMP__...`` environment
variables change them, a malformed value names its key, a key dmp does not know is reported
when a fit starts, and the README lists them all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import dask
import numpy as np
import pytest
import yaml

import dmp.config as config
from conftest import make_problem
from dmp.exceptions import ConfigWarning

ROOT = Path(__file__).resolve().parents[1]


def _leaves(d: dict, prefix: str) -> dict:
    out = {}
    for k, v in d.items():
        out.update(_leaves(v, f"{prefix}.{k}") if isinstance(v, dict) else {f"{prefix}.{k}": v})
    return out


def _documented() -> dict:
    """``{key: [where it is read]}`` from the comment above each setting of dmp.yaml."""
    out, path, comment = {}, [], []
    for line in (ROOT / "dmp" / "dmp.yaml").read_text().splitlines():
        text = line.strip()
        if text.startswith("#"):
            comment.append(text)
            continue
        if text:
            name, _, rest = text.partition(":")
            path = path[:(len(line) - len(line.lstrip())) // 2] + [name]
            if rest.split("#")[0].strip():
                out[".".join(path)] = re.findall(r"\[(driver|workers|scheduler)\]",
                                                 " ".join(comment))
        comment = []
    return out


def _python(code: str, tmp_path, **env_vars) -> str:
    """``code``'s output in a fresh interpreter that sees no Dask setting of this machine
    (none of its DASK_* variables, an empty config folder) but ``env_vars``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    (tmp_path / "dask-config").mkdir(exist_ok=True)
    env.update(DASK_CONFIG=str(tmp_path / "dask-config"), PYTHONPATH=str(ROOT), **env_vars)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_shipped_file_gives_the_defaults(tmp_path):
    shipped = _leaves(yaml.safe_load((ROOT / "dmp" / "dmp.yaml").read_text())["dmp"], "dmp")
    assert len(shipped) >= 20 and shipped["dmp.monitor"] is True
    # what `import dmp` leaves in Dask's configuration, key by key
    got = json.loads(_python(
        "import json, dask, dmp\n"
        f"print(json.dumps({{k: dask.config.get(k) for k in {sorted(shipped)!r}}}))",
        tmp_path))
    assert got == shipped
    assert config.KEYS == shipped
    # each setting says, in the comment above it, what it does and which process reads it
    assert set(_documented()) == set(shipped)
    for key, tags in _documented().items():
        assert len(tags) == 1, (key, tags)


def test_typed_readers_parse_the_defaults():
    assert config.seconds("dmp.batch.target-duration") == 0.25
    assert config.seconds("dmp.worker-pause-timeout") == 30.0
    assert config.nbytes("dmp.batch.max-bytes") == 64 * 2**20
    assert config.nbytes("dmp.ring.piece-bytes") == 16 * 2**20
    assert config.count("dmp.batch.max-rounds") == 1024
    assert config.count("dmp.store.shard-values") == 2_000_000
    assert config.flag("dmp.monitor") is True
    with pytest.raises(KeyError, match="'dmp.batch.max-round' is not one of dmp's settings"):
        config.get("dmp.batch.max-round")


def test_environment_variables_are_honoured(tmp_path):
    """``DASK_DMP__SECTION__KEY`` (underscores for hyphens, as Dask reads them) changes a
    setting for a process, and what reads it: here the shards a store is written with."""
    code = (
        "import dmp.config as c\n"
        "from dmp.engine.events import monitor_enabled\n"
        "from dmp.io import write_sparse\n"
        "import scipy.sparse as sp, numpy as np\n"
        "X = sp.random(30, 40, density=0.5, random_state=0, format='csc')\n"
        "ds = write_sparse('s.zarr', X, np.zeros(30), overwrite=True)\n"
        "print(c.count('dmp.batch.max-rounds'), c.seconds('dmp.checkpoint.lock-stale'),\n"
        "      monitor_enabled(), ds.n_shards, -(-X.nnz // 100), c.unknown_keys())\n")
    changed = _python(code, tmp_path, DASK_DMP__BATCH__MAX_ROUNDS="7",
                      DASK_DMP__CHECKPOINT__LOCK_STALE="5m", DASK_DMP__MONITOR="off",
                      DASK_DMP__STORE__SHARD_VALUES="100").split()
    assert changed[:3] == ["7", "300.0", "False"]
    # ceil(nnz / 100) shards, where the default (2,000,000 values a shard) writes one
    assert changed[3] == changed[4] and int(changed[3]) > 1
    assert changed[5] == "[]"


def test_a_malformed_setting_names_its_key():
    bad = {"dmp.ring.timeout": ("soon", config.seconds, "a duration"),
           "dmp.batch.max-bytes": ("lots", config.nbytes, "a size"),
           "dmp.batch.max-rounds": (2.5, config.count, "a whole number"),
           "dmp.store.shard-values": (0, config.count, "at least 1"),
           "dmp.monitor": ("perhaps", config.flag, "a switch")}
    for key, (value, read, what) in bad.items():
        with dask.config.set({key: value}):
            with pytest.raises(ValueError, match=rf"Dask setting {re.escape(key)} must be "
                                                 rf"{what}.*, got {re.escape(repr(value))}"):
                read(key)


def test_a_word_setting_takes_one_of_its_words():
    with dask.config.set({"dmp.ring.transport": " Dask "}):
        assert config.choice("dmp.ring.transport", ("socket", "dask")) == "dask"
    with dask.config.set({"dmp.ring.transport": "pigeon"}):
        with pytest.raises(ValueError, match=r"Dask setting dmp.ring.transport must be one of "
                                             r"'socket', 'dask', got 'pigeon'"):
            config.choice("dmp.ring.transport", ("socket", "dask"))


def test_switches_read_words_and_booleans():
    for value, on in [(False, False), ("off", False), ("No", False), ("0", False),
                      (True, True), ("on", True), ("yes", True), ("1", True)]:
        with dask.config.set({"dmp.monitor": value}):
            assert config.flag("dmp.monitor") is on, value


def test_a_whole_section_replaced_keeps_the_other_defaults():
    with dask.config.set({"dmp": {"monitor": False}}):
        assert config.flag("dmp.monitor") is False
        assert config.count("dmp.batch.max-rounds") == 1024
        assert config.unknown_keys() == []


def test_an_unknown_setting_is_reported_when_a_fit_starts():
    from dmp.linear_model import Lasso

    X, y = make_problem(n=40, p=60, seed=1)
    fit = Lasso(alpha=0.1, max_iter=2, tol=0, backend="local", random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        with dask.config.set({"dmp.batch.max_rounds": 8}):   # underscores: Dask's env spelling
            fit.fit(X, y)
    with dask.config.set({"dmp.batch.max-round": 8, "dmp.monitr": False, "dmp.ring": 3}):
        with pytest.warns(ConfigWarning) as record:
            fit.fit(X, y)
    messages = sorted(str(w.message) for w in record if w.category is ConfigWarning)
    assert len(messages) == 3, messages
    assert re.search(r"'dmp.batch.max-round' is not one of dmp's settings and is ignored; "
                     r"did you mean 'dmp.batch.max-rounds'\?.*dmp\.yaml", messages[0])
    assert "'dmp.monitr'" in messages[1] and "did you mean 'dmp.monitor'" in messages[1]
    assert "'dmp.ring'" in messages[2]
    np.testing.assert_array_equal(fit.coef_, Lasso(**fit.get_params()).fit(X, y).coef_)


def _readme_table() -> dict:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(dmp\.[a-z.-]+)` \| `([^`]*)` \| (\w+) \|", section, re.M)
    return {key: (default, where) for key, default, where in rows}


def test_readme_lists_every_setting():
    """The README's table of settings matches dmp.yaml: every key, its default, where it is
    read."""
    def shown(v):
        return str(v).lower() if isinstance(v, bool) else str(v)

    where = _documented()
    expected = {key: (shown(v), where[key][0]) for key, v in config.KEYS.items()}
    table = _readme_table()
    rows = "\n".join(f"| `{k}` | `{d}` | {w} | ... |" for k, (d, w) in expected.items())
    assert table == expected, f"the README's Configuration table should list:\n{rows}"
