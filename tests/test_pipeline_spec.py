"""The pipeline format (one declaration, documented in the README, file:line messages), what
`dmp run` reports (in-process time, warnings at the pipeline's line, Ctrl-C), and that the
shipped pipelines and estimators warn only about what the user caused."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from sklearn.exceptions import ConvergenceWarning

from dmp.pipeline import PipelineError, load_pipeline
from dmp.pipeline_schema import PIPELINE, json_schema, reference_markdown

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
PIPELINES = sorted((REPO / "pipelines").glob("*.yaml"))


def _keys(schema, prefix=()):
    for key, k in schema.items():
        yield ".".join((*prefix, key)), k
        if k.keys:
            yield from _keys(k.keys, (*prefix, key))


def test_readme_reference_is_the_schema():
    """The README's table is generated from the declaration the files are checked against,
    so neither can change without the other; every key and its default are in it."""
    assert reference_markdown() in README
    for name, k in _keys(PIPELINE):
        row = next(line for line in README.splitlines() if line.startswith(f"| `{name}` |"))
        assert ("required" if k.required else "") in row
        if k.default not in (None, {}) and not isinstance(k.default, list):
            assert f"`{k.default}`" in row, row


def test_readme_pipeline_example_loads_and_names_its_lines(tmp_path):
    block = re.search(r"## Pipeline files.*?```yaml\n(.*?)```", README, flags=re.S).group(1)
    path = tmp_path / "my_lasso.yaml"
    path.write_text(block)
    spec = load_pipeline(path)
    # the schema's defaults are filled in: what `dmp run` uses
    assert spec["cluster"] == {"n_workers": 2, "threads_per_worker": 1, "memory_limit": "auto"}
    assert spec["checkpoint_every"] == 50 and spec["in_process"] == "auto"
    assert spec["output"] == "runs/my_lasso" and "evaluation" not in spec
    path.write_text(block.replace("tol: 1.0e-6", "tool: 1.0e-6"))
    with pytest.raises(PipelineError, match=rf"^{re.escape(str(path))}:5: unknown parameter "
                                            r"'tool' for Lasso"):
        load_pipeline(path)


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: p.stem)
def test_shipped_pipelines_validate(pipeline):
    spec = load_pipeline(pipeline)
    assert spec["name"] == pipeline.stem
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(yaml.safe_load(pipeline.read_text()), json_schema())


BASE = """\
name: t
dataset: lasso_small
estimator:
  class: Lasso
  params: {alpha_ratio: 0.05}
"""


@pytest.mark.parametrize("extra, line, words", [
    ("cluster: {memory_limit: []}\n", 6, "'cluster.memory_limit' must be a size"),
    ("in_process: maybe\n", 6, "'in_process' must be true, false or auto"),
    ("evaluation: {k: 5}\n", 6, "'evaluation' is only defined for BinaryAutoencoder"),
    ("reference: lbfgs\n", 6, "'reference' is only defined for SparsifiedSGDClassifier"),
    ("output: ''\n", 6, "'output' must be a non-empty string"),
    ("checkpoints: [a]\n", 6, "'checkpoints' must be a non-empty string"),
    ("storage_options: 3\n", 6, "'storage_options' must be a mapping"),
    ("compare: {schedule: [], tol: [1]}\n", 6, "one parameter to a non-empty list"),
    ("cluster:\n  threads_per_worker: true\n", 7, "'cluster.threads_per_worker' must be a "
                                                  "positive integer, got True"),
])
def test_schema_errors_name_the_line(tmp_path, extra, line, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + extra)
    with pytest.raises(PipelineError) as err:
        load_pipeline(bad)
    msg = str(err.value)
    assert msg.startswith(f"{bad}:{line}:") and words in msg, msg


def test_missing_keys_are_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\ndataset: d\nestimator: {params: {}}\n")
    with pytest.raises(PipelineError, match=r"bad.yaml:3: missing required key 'class' under "
                                            r"'estimator' \(one of \['BinaryAutoencoder'"):
        load_pipeline(bad)
    bad.write_text("name: t\nestimator: {class: Lasso}\n")
    with pytest.raises(PipelineError, match=r"bad.yaml: missing required key 'dataset'"):
        load_pipeline(bad)


# -- the typed spec, and one reporter per estimator class --------------------------------

def test_load_pipeline_gives_a_typed_spec_that_reads_as_the_mapping_too():
    from dmp.hashing import BinaryAutoencoder
    from dmp.pipeline_schema import ClusterSpec, Compare, EvaluationSpec, PipelineSpec

    path = REPO / "pipelines" / "parmac.yaml"
    spec = load_pipeline(path)
    assert isinstance(spec, PipelineSpec) and spec.path == path.resolve()
    assert spec.estimator.class_name == "BinaryAutoencoder"
    assert spec.estimator.cls is BinaryAutoencoder
    assert spec.compare == Compare("n_workers", (1, 2))
    assert spec.cluster == ClusterSpec(n_workers=2, threads_per_worker=1, memory_limit="auto")
    assert spec.evaluation == EvaluationSpec(k=50, baselines=("itq", "pca"))
    assert spec.reference is None and spec.checkpoint_every == 50
    k_line = next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                  if line.strip().startswith("k:"))
    assert spec.lines[("evaluation", "k")] == k_line
    # the mapping load_pipeline returned before the spec was typed
    assert spec["compare"] == {"n_workers": [1, 2]} and spec["evaluation"]["k"] == 50
    assert spec["estimator"]["params"] == spec.estimator.params
    assert "reference" not in spec and spec.get("checkpoints") is None


@pytest.mark.parametrize("name", sorted(PIPELINE["estimator"].keys["class"].choices))
def test_every_estimator_a_pipeline_names_has_a_reporter(name):
    """What dmp run reports of a fit is chosen by the estimator's class, and the reporter's
    primary metric is its program's."""
    from dmp.engine.events import primary_of
    from dmp.engine.program import Program
    from dmp.pipeline_schema import estimator_class
    from dmp.reports import Reporter, reporter_for

    reporter = reporter_for(estimator_class(name))
    assert issubclass(reporter, Reporter) and reporter is not Reporter
    assert issubclass(reporter.program, Program)
    assert primary_of(reporter.program)[1] in ("min", "max")


def test_a_reporter_is_found_through_the_class_hierarchy():
    from sklearn.base import BaseEstimator

    from dmp.linear_model import Lasso
    from dmp.reports import Reporter, register, reporter_for

    class MyLasso(Lasso):
        pass

    assert reporter_for(MyLasso) is reporter_for(Lasso)

    class Unreported(BaseEstimator):
        pass

    with pytest.raises(TypeError, match=r"dmp run has no report for Unreported \(it reports "
                                        r".*Lasso.*\); register one with dmp.reports.register"):
        reporter_for(Unreported)

    @register(Unreported)
    class UnreportedReport(Reporter):
        pass

    class Sub(Unreported):
        pass

    assert reporter_for(Sub) is UnreportedReport


# -- warnings: at the user's call -------------------------------------------------------

def _lasso_data():
    from conftest import make_problem

    return make_problem(n=80, p=300)


@pytest.mark.parametrize("make", [
    lambda: ("Lasso", dict(alpha=1e-4, max_iter=2, tol=1e-12, backend="local")),
    lambda: ("SparsifiedSGDRegressor", dict(max_iter=3, tol=1e-12, backend="local")),
    lambda: ("SparsifiedSGDClassifier", dict(max_iter=3, tol=1e-12, backend="local")),
], ids=["Lasso", "SparsifiedSGDRegressor", "SparsifiedSGDClassifier"])
def test_convergence_warning_points_at_the_callers_line(make):
    import dmp.linear_model as lm

    name, kw = make()
    X, y = _lasso_data()
    if name == "SparsifiedSGDClassifier":
        y = (y > np.median(y)).astype(int)
    est = getattr(lm, name)(**kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(X, y)
    conv = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert conv, [str(w.message) for w in caught]
    assert all(w.filename == __file__ for w in conv), [(w.filename, w.lineno) for w in conv]


def test_mf_convergence_warning_points_at_the_callers_line():
    import scipy.sparse as sp

    from dmp.decomposition import MatrixFactorization
    from dmp.io.synthetic import make_ratings

    (u, i, r), _, _, _ = make_ratings(n_users=60, n_items=40, n_obs=800, rank=3, noise=0.1,
                                      seed=0)
    R = sp.coo_matrix((r, (u, i)), shape=(60, 40))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MatrixFactorization(n_components=3, max_iter=1, tol=1e-12, backend="local",
                            random_state=0).fit(R)
    conv = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert conv and all(w.filename == __file__ for w in conv)


def _fit_as_shipped(name, **override):
    """The shipped pipeline's estimator on its dataset, in-process: the same iterates as on
    the cluster (tested elsewhere), in a fraction of the time."""
    from dmp.pipeline import _open_data
    from dmp.pipeline_schema import estimator_class

    spec = load_pipeline(REPO / "pipelines" / f"{name}.yaml")
    ds = _open_data(spec)
    params = {**spec["estimator"]["params"], "backend": "local", **override}
    (key, values), = (spec.get("compare") or {None: [None]}).items()
    cls = estimator_class(spec["estimator"]["class"])
    for value in values:
        p = dict(params, **({key: value} if key else {}))
        p.setdefault("n_workers", spec["cluster"]["n_workers"])
        cls(**p).fit(ds)


@pytest.mark.parametrize("name", ["mf_small", "sparsified_logreg"])
def test_shipped_pipelines_converge_or_have_a_fixed_budget(name):
    """No ConvergenceWarning the user did not cause: the shipped fits converge within
    max_iter or run a deliberate fixed budget (tol: null)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        _fit_as_shipped(name)


TINY = """\
name: tiny
dataset: lasso_small
estimator:
  class: Lasso
  params:
    alpha_ratio: 0.05
    max_iter: 3
    tol: 1.0e-12
cluster: {n_workers: 1}
in_process: true
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_reports_warnings_at_the_pipeline_line_and_the_in_process_time(tmp_path):
    """A fit stopped by the pipeline's max_iter warns at that line of the pipeline file (the
    user's call), and the run prints the cluster's and the in-process fit time and the
    sentence on when workers pay; metrics.json has both times."""
    from dmp.pipeline import run_pipeline

    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    printed = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = run_pipeline(load_pipeline(path), output=str(tmp_path / "out"),
                               show_progress=False, log=printed.append)
    conv = [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert len(conv) == 1, [(str(w.message), w.filename) for w in caught]
    assert (conv[0].filename, conv[0].lineno) == (str(path.resolve()), 7)
    text = "\n".join(printed)
    run = metrics["runs"]["Lasso"]
    assert run["in_process_wall_time_s"] > 0 and run["wall_time_s"] > 0
    assert re.search(r"fit time: [0-9.]+ s on 1 Dask worker; the same estimator and "
                     r"parameters in one process \(backend='local', 1 partition, no Dask\): "
                     r"[0-9.]+ s", text), text
    assert "they pay when the model or the data is bigger than one process" in text
    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert saved["runs"]["Lasso"]["in_process_wall_time_s"] == run["in_process_wall_time_s"]


LONG = """\
name: long
dataset: lasso_small
estimator:
  class: Lasso
  params:
    alpha_ratio: 0.05
    schedule: round_robin
    max_iter: 1000000
    tol: 0.0
cluster: {n_workers: 2}
checkpoint_every: 5
in_process: false
"""


def test_ctrl_c_handler_silences_the_loop_thread_before_it_raises():
    """`dmp run`'s SIGINT handler: after Ctrl-C, distributed's ``sync()`` cancels the call it
    waited on from its loop thread and, when the interrupt came before that call began, logs
    a NameError through ``tornado.application`` (what failed the Ctrl-C test below on CI);
    the handler silences that logger and Dask's before the interrupt is raised."""
    import logging

    from dmp.cli import _interrupt_quietly

    names = ["distributed", "distributed.client", "tornado.application"]
    saved = {n: logging.getLogger(n).level for n in names}
    saved.update({n: logging.getLogger(n).level for n in logging.root.manager.loggerDict
                  if n.startswith("distributed.")})
    try:
        assert logging.getLogger("tornado.application").getEffectiveLevel() <= logging.ERROR
        with pytest.raises(KeyboardInterrupt):
            _interrupt_quietly(signal.SIGINT, None)
        for name in names:
            assert logging.getLogger(name).getEffectiveLevel() > logging.ERROR, name
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_prints_one_line_with_the_resume_command(tmp_path):
    """SIGINT to the whole process group (what Ctrl-C in a terminal does, the embedded
    cluster's workers included) once fitting has begun: one short message naming the exact
    --resume command, no traceback, exit status 130, the checkpoints kept."""
    path = tmp_path / "long.yaml"
    path.write_text(LONG)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "dmp.cli", "run", str(path), "--output",
                             str(out), "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("fitting"):
                break
        # the rounds have begun once the first checkpoint round is there (the store itself
        # is made at the start, to hold the fit's lock)
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".out-checkpoints/*.zarr/round_*")) \
                and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        assert proc.poll() is None, "the fit ended before the interrupt"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) <= 2 and "Traceback" not in err, err
    assert "interrupted" in lines[-1]
    assert lines[-1].endswith(f"dmp run {path} --resume --output {out} --no-progress"), err
    assert list(tmp_path.glob(".out-checkpoints/*.zarr/round_*")) and not out.exists()
