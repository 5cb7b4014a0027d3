"""Runnable pipelines: dataset -> estimator -> evaluation -> report (``dmp run``).

A pipeline is a YAML file::

    name: lasso
    dataset: lasso_sparse_a        # recipe name (dmp/datasets/), recipe file, or a Zarr dataset path
    estimator:
      class: Lasso
      params: {alpha_ratio: 0.01, tol: 1.0e-6}   # alpha_ratio: alpha = ratio * alpha_max
    compare: {schedule: [priority, round_robin]} # one fit per value, all in the plot
    cluster: {n_workers: 2, threads_per_worker: 1, memory_limit: 4GiB}
    checkpoint_every: 20
    checkpoints: s3://bucket/ckpt   # optional: where checkpoints go (default: beside the output)
    storage_options: {anon: false}  # optional: fsspec options for a dataset URL
    output: runs/lasso

Every key, its default and where relative paths are resolved: `dmp.pipeline_schema.PIPELINE`
(the one declaration files are validated against; `load_pipeline` reads a file into a typed
`dmp.pipeline_schema.PipelineSpec`) and the README's "Pipeline files" section.
A dataset or checkpoint location may be an fsspec URL (``s3://...``); workers read their shards
and write their checkpoint partitions there themselves, with the credentials of their
environment (``AWS_*`` variables, as a Kubernetes Secret provides them).

`run_pipeline` runs one in named steps: the output and checkpoint locations, the dataset, the
cluster, the parameters, the fits, the metrics and the output folder.  What is reported of the
fits (metrics.json entries, console lines, model files and figures) is the estimator's
`dmp.reports.Reporter`'s, chosen by the estimator's class.  The output folder receives the
model's files (``coef.zarr``, ...), ``metrics.json``, ``convergence.png``, one
``training-<run>.png`` per fit (the dashboard's figures, `dmp.plotting.plot_training`) and a copy
of the pipeline; it is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import uuid
import warnings
from pathlib import Path

import numpy as np

from . import config
from .engine.backends.dask import cluster_workers
from .io.sparse import DatasetError, require_store_kind
from .pipeline_schema import PipelineError, PipelineSpec, load_pipeline
from .reports import Fits, reporter_for
from .utils.cluster import dashboard_base
from .utils.text import plural

__all__ = ["PipelineError", "PipelineSpec", "load_pipeline", "run_pipeline"]


def run_pipeline(spec: PipelineSpec, *, scheduler=None, workers=None, resume=False,
                 output=None, show_progress=True, log=print) -> dict:
    """Run a loaded pipeline (`load_pipeline`); returns the metrics written to
    ``metrics.json``.

    The output folder is written beside ``output`` and moved there at the end; an existing
    one is replaced only if it is an earlier run's output (or empty).  Checkpoints go to
    ``<checkpoints>/<run label>.zarr`` and are deleted after a successful run (only those).
    """
    out = Path(output or spec.output).resolve()
    _check_output(out)
    checkpoints = _Checkpoints(spec, out)
    ds = _open_data(spec)
    log(f"dataset: {ds}")
    cls = spec.estimator.cls
    _check_store_kind(spec, ds, cls)   # before any cluster starts
    reporter = reporter_for(cls)(spec, ds, log)
    client, cluster = _start_cluster(spec, scheduler, workers)
    try:
        base = dashboard_base(client)
        log(f"Dask dashboard: {base}/status  (live dmp page: {base}/dmp)" if base else
            "Dask dashboard: none (the scheduler serves no dashboard)")
        params = _resolve_params(spec, client, ds, log)
        n_workers = len(cluster_workers(client))
        reporter.prepare(params)
        fits = _fit_all(spec, cls, params, ds, reporter, client, n_workers, checkpoints,
                        resume=resume, in_process=_in_process_wanted(spec, scheduler, ds, params),
                        show_progress=show_progress, log=log)
        _log_worker_cost(fits.runs, log)
        metrics = _metrics(spec, ds, client, n_workers, params, fits, reporter)
        report = reporter.report(fits)
        metrics.update(report)
        _write_output(out, spec, reporter, fits, report, metrics)
        checkpoints.remove()
        log(f"wrote {out}/ ({', '.join(sorted(p.name for p in out.iterdir()))})")
        return metrics
    except KeyboardInterrupt:
        _quiet_interrupted_cluster(client, own=cluster is not None)
        raise
    finally:
        _close_cluster(client, cluster)


class _Checkpoints:
    """Where a run's checkpoint stores go (``<root>/<run label>.zarr``), and their removal
    after a successful run."""

    def __init__(self, spec: PipelineSpec, out: Path):
        from .engine.checkpoint import is_remote

        root = str(spec.checkpoints or out.parent / f".{out.name}-checkpoints")
        if not is_remote(root):
            root = str(Path(root).resolve())
        if not is_remote(root) and Path(root).is_relative_to(out):
            raise PipelineError(f"checkpoints {root!r} must not be inside the output folder "
                                f"{str(out)!r} (the output is replaced as a whole)")
        self.root = root
        # a local root is removed afterwards (when empty) if it is dmp's default one or this
        # run creates it; an object store has no folders to leave behind
        self.keep_root = is_remote(root) or (os.path.lexists(root) and bool(spec.checkpoints))
        self.stores = []

    def prepare(self, label: str, resume: bool) -> tuple[str, bool]:
        """The checkpoint location of the fit ``label`` and whether it holds a checkpoint to
        resume from; an earlier run's checkpoints there are deleted unless ``resume``."""
        from .engine.checkpoint import CheckpointStore

        location = f"{self.root.rstrip('/')}/{label}.zarr"
        store = CheckpointStore(location)
        self.stores.append(store)
        has_ckpt = store.latest() is not None
        if store.exists() and not resume:
            if has_ckpt:
                print(f"dmp run: deleting the checkpoints of an earlier run in {location} "
                      f"(pass --resume to continue it instead)", file=sys.stderr)
            store.clear()
        return location, has_ckpt

    def remove(self) -> None:
        """After a successful run: its own checkpoint stores, and the root folder unless
        ``keep_root`` (it is removed only if nothing else is in it)."""
        for store in self.stores:
            store.clear()
        if not self.keep_root:
            try:
                os.rmdir(self.root)
            except OSError:
                pass


def _open_data(spec: PipelineSpec):
    from .engine.checkpoint import is_remote
    from .io import build_dataset, open_dataset

    ref = spec.dataset
    if isinstance(ref, dict):
        return build_dataset(ref)
    if is_remote(str(ref)):
        return open_dataset(str(ref), storage_options=spec.storage_options)
    p = Path(ref)
    if not p.is_absolute():
        here = spec.path.parent
        # a recipe name: a datasets/ folder beside the pipeline's folder (a user's project)
        # comes before the recipes shipped in dmp/datasets/
        candidates = [here / ref]
        if "/" not in str(ref) and not p.suffix:
            candidates.append(here.parent / "datasets" / f"{ref}.yaml")
        for cand in candidates:
            if cand.exists():
                p = cand
                break
    if p.suffix in (".yaml", ".yml") or (not p.exists() and "/" not in str(ref)):
        return build_dataset(str(p) if p.exists() else ref)
    return open_dataset(str(p))


def _check_store_kind(spec: PipelineSpec, ds, cls) -> None:
    try:
        require_store_kind(ds, cls._store_kinds, spec.estimator.class_name)
    except DatasetError as exc:
        raise PipelineError(f"{spec.path}: {exc}") from None


def _start_cluster(spec, scheduler, workers):
    """A client of the cluster at ``scheduler``, else of an embedded ``LocalCluster`` as the
    spec's ``cluster`` (a `PipelineSpec`, or any mapping of its form) asks for, with
    ``workers`` worker processes if given: ``(client, the embedded cluster or None)``."""
    from distributed import Client

    from .engine.backends.dask import connect, quiet_local_cluster

    if scheduler:
        return connect(scheduler), None

    c = dict(spec.get("cluster") or {})
    n = workers or c.get("n_workers", 2)
    with warnings.catch_warnings():
        # a loaded machine's slow scratch folder is no concern of the user's
        warnings.filterwarnings("ignore", message="Creating scratch directories is taking")
        # the embedded cluster's workers use every core: keep Dask's housekeeping quiet
        cluster = quiet_local_cluster(int(n),
                                      threads_per_worker=int(c.get("threads_per_worker", 1)),
                                      memory_limit=c.get("memory_limit", "auto"),
                                      dashboard_address="127.0.0.1:0",    # not on the network
                                      silence_logs=logging.WARNING,
                                      preload=["dmp._run_worker"])
    return Client(cluster), cluster


#: every ``dmp run`` output folder lists what the run wrote in it: an existing folder is
#: replaced only if it holds nothing else (an earlier run's output), never other files
RUN_MANIFEST = ".dmp-run.json"
#: what output folders of runs before the manifest held
_OLD_RUN_FILES = {"metrics.json", "pipeline.yaml", "top_words.txt", "components.zarr",
                  "hash.zarr", "coef.zarr", "factors.zarr"}


def _check_output(out: Path) -> None:
    """Refuse an output location that is not empty and not only an earlier run's output."""
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise PipelineError(f"output {str(out)!r} exists and is not a folder")
    names = {p.name for p in out.iterdir()}
    if not names:
        return
    try:
        allowed = set(json.loads((out / RUN_MANIFEST).read_text())) | {RUN_MANIFEST}
    except (OSError, ValueError, TypeError):
        allowed = None
    if allowed is None and {"metrics.json", "pipeline.yaml"} <= names:
        allowed = _OLD_RUN_FILES | {n for n in names if n.endswith(".png")}
    if allowed is None:
        raise PipelineError(
            f"output folder {str(out)!r} is not empty and is not the output of an earlier "
            f"dmp run; it is left alone -- choose another output")
    other = sorted(names - allowed)
    if other:
        raise PipelineError(
            f"output folder {str(out)!r} holds files an earlier dmp run did not write "
            f"({', '.join(other[:5])}); it is left alone -- move them or choose another output")


def _close_cluster(client, cluster) -> None:
    if cluster is not None:
        # the outcome is known (written, or the exception on its way): the embedded
        # cluster's teardown races (a heartbeat to a scheduler already closed) are not
        _silence_workers(client)
    client.close()
    if cluster is not None:
        # a worker slow to stop (busy in a kernel the fit no longer needs) is killed
        # after a few seconds: the embedded cluster's end, not news for the user
        nanny_log = logging.getLogger("distributed.nanny")
        level = nanny_log.level
        nanny_log.setLevel(logging.ERROR)
        try:
            cluster.close()
        finally:
            nanny_log.setLevel(level)


def _resolve_params(spec: PipelineSpec, client, ds, log) -> dict:
    """The estimator's parameters, Lasso's ``alpha_ratio`` turned into ``alpha`` (ratio x
    alpha_max of the data)."""
    params = dict(spec.estimator.params)
    ratio = params.pop("alpha_ratio", None)
    fit_intercept = params.get("fit_intercept", True)
    if ratio is not None:
        params["alpha"] = float(ratio) * _alpha_max(client, ds, fit_intercept)
        log(f"alpha = {ratio} x alpha_max = {params['alpha']:.6g}")
    return params


def _fit_all(spec: PipelineSpec, cls, params, ds, reporter, client, n_workers, checkpoints, *,
             resume, in_process, show_progress, log) -> Fits:
    """One fit per ``compare`` value (or one fit), each reported by ``reporter`` as it ends;
    with ``in_process``, each timed in one process too."""
    name = spec.estimator.class_name
    cmp_key, values = (spec.compare.key, spec.compare.values) if spec.compare else (None, [None])
    fits = Fits(name, cmp_key, estimators={}, runs={})
    for value in values:
        label = str(value) if cmp_key else name
        p = dict(params)
        if cmp_key:
            p[cmp_key] = value
        location, has_ckpt = checkpoints.prepare(label, resume)
        # backend: local in the params simulates its n_workers in this process
        p.setdefault("backend", client)
        if "checkpoint" in cls().get_params():
            p.update(checkpoint=location, checkpoint_every=spec.checkpoint_every,
                     resume=bool(resume and has_ckpt))
        est = cls(**p, show_progress=show_progress)
        where = (f"{plural(p.get('n_workers') or n_workers, 'partition')} on "
                 f"{plural(n_workers, 'Dask worker')}"
                 if p["backend"] is client else f"backend {p['backend']!r}")
        what = f" ({cmp_key}={value})" if cmp_key else ""
        log(f"fitting {name}{what} with {where}")
        t0 = time.perf_counter()
        _fit_reporting_warnings(est, ds, spec)
        wall = time.perf_counter() - t0
        run = fits.runs[label] = reporter.run_metrics(est, wall)
        fits.estimators[label] = est
        log(reporter.fit_line(est, run, wall))
        if in_process and p["backend"] is client:
            local_s = _time_in_process(cls, p, ds)
            parts = p.get("n_workers") or 1   # the local backend's default
            parts = f"{parts} partition{'s' if parts != 1 else ''}"
            run["in_process_wall_time_s"] = local_s
            on = f"{n_workers} Dask worker{'s' if n_workers != 1 else ''}"
            log(f"  fit time: {wall:.2f} s on {on}; the same estimator and parameters "
                f"in one process (backend='local', {parts}, no Dask): {local_s:.2f} s")
    return fits


def _log_worker_cost(runs: dict, log) -> None:
    """What the Dask workers cost per round beyond the in-process fits (when timed)."""
    overheads = [(r["wall_time_s"] - r["in_process_wall_time_s"]) / max(r["rounds"], 1)
                 for r in runs.values() if "in_process_wall_time_s" in r]
    cost = float(np.median(overheads)) if overheads else None
    if cost is not None and cost > 0:
        log(f"Dask workers cost about {1e3 * cost:.0f} ms per round here beyond the "
            f"in-process fit: they pay when the model or the data is bigger than one "
            f"process can hold, or when a round's compute is much larger than that "
            f"overhead.")
    elif cost is not None:
        log("Dask workers were faster than one process here: a round's compute outweighs "
            "their per-round overhead (they also pay when the model or the data is bigger "
            "than one process can hold).")


def _best(runs: dict) -> dict:
    """The best run's primary metric (the lowest, or the highest for a maximised one), and
    ``best_objective`` where the primary metric is minimised."""
    first = next(iter(runs.values()))
    values = [r["value"] for r in runs.values() if r["value"] is not None]
    pick = max if first["direction"] == "max" else min
    out = {"primary_metric": first["primary_metric"], "direction": first["direction"],
           "best_value": pick(values) if values else None}
    if first["direction"] == "min":
        out["best_objective"] = min(r["objective"] for r in runs.values())
    return out


def _metrics(spec: PipelineSpec, ds, client, n_workers, params, fits: Fits, reporter) -> dict:
    """``metrics.json``: the run, its dataset and cluster, every fit's record, the best."""
    return {
        "pipeline": spec.name, "dataset": str(ds.path),
        "shape": list(ds.shape), "nnz": int(ds.nnz), "n_workers": n_workers,
        "scheduler": client.scheduler.address, "params": params,
        **_best(fits.runs), "runs": fits.runs,
        "reference_objective": reporter.reference, "reference_time_s": reporter.reference_time_s,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _write_output(out: Path, spec: PipelineSpec, reporter, fits: Fits, report: dict,
                  metrics: dict) -> None:
    """The output folder, written beside ``out`` under a temporary name and moved there:
    the reporter's model files and figures, ``metrics.json``, the pipeline and the
    manifest."""
    from .utils.scratch import clean_stale_partials, mark_partial, unmark_partial

    clean_stale_partials(out)   # output folders of killed runs of this output
    tmp_out = out.parent / f"{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp_out.mkdir(parents=True)
        mark_partial(tmp_out)
        reporter.write(tmp_out, fits, report)
        with open(tmp_out / "metrics.json", "w") as f:
            json.dump(metrics, f, indent=2, default=_json_default)
        shutil.copy(spec.path, tmp_out / "pipeline.yaml")
        unmark_partial(tmp_out)
        (tmp_out / RUN_MANIFEST).write_text(json.dumps(sorted(
            p.name for p in tmp_out.iterdir())))
        _check_output(out)   # again: something may have appeared there during the fits
        if out.is_dir() and not any(out.iterdir()):
            # an empty folder (perhaps the working directory) stays; the files move in
            for child in tmp_out.iterdir():
                os.replace(child, out / child.name)
            tmp_out.rmdir()
        elif out.exists():
            old = out.parent / f"{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(out, old)
            os.replace(tmp_out, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp_out, out)
    finally:
        shutil.rmtree(tmp_out, ignore_errors=True)


def _in_process_wanted(spec, scheduler, ds, params) -> bool:
    """Whether to time the same fit in-process too (``in_process`` of the pipeline; ``auto``:
    up to ``dmp.pipeline.in-process-max-values`` stored values)."""
    choice = spec.in_process
    if choice != "auto":
        return bool(choice)
    if scheduler or params.get("backend") is not None:
        return False
    nnz = ds.nnz
    limit = config.count("dmp.pipeline.in-process-max-values")
    return isinstance(nnz, (int, np.integer)) and nnz <= limit


def _time_in_process(cls, params, ds) -> float:
    """Seconds of the same estimator and parameters on the in-process backend (the
    partitions the parameters ask for, else the local backend's one): what the fit costs
    without a cluster.

    Its convergence warnings are dropped: the cluster fit of the same parameters has
    reported them already."""
    from sklearn.exceptions import ConvergenceWarning

    q = {k: v for k, v in params.items() if k not in ("checkpoint", "checkpoint_every",
                                                      "resume")}
    q["backend"] = "local"
    est = cls(**q, show_progress=False)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(ds)
    return time.perf_counter() - t0


def _fit_reporting_warnings(est, ds, spec) -> None:
    """``est.fit(ds)``; a ConvergenceWarning is re-issued at the pipeline file's line of
    ``max_iter`` (else ``tol``, else ``estimator``): the file is the user's call, not dmp's
    code that calls ``fit``.  Other warnings pass through unchanged."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(ds)
    lines = spec.lines
    for w in caught:
        if issubclass(w.category, ConvergenceWarning):
            key = next((k for k in (("estimator", "params", "max_iter"),
                                    ("estimator", "params", "tol"), ("estimator",))
                        if k in lines), None)
            warnings.warn_explicit(w.message, w.category, str(spec.path),
                                   lines.get(key, 1))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno,
                                   source=w.source)


def _silence_distributed() -> None:
    # tornado.application: distributed's sync() cancels its call on the loop thread after
    # Ctrl-C and, when the interrupt came before the call began, logs a NameError there
    names = ["distributed", "tornado.application",
             *(n for n in logging.root.manager.loggerDict if n.startswith("distributed."))]
    for name in names:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _silence_workers(client, timeout: float = 2.0) -> None:
    """`_silence_distributed` on every worker, waiting at most ``timeout`` seconds (a worker
    busy in a kernel answers late; it is stopped anyway)."""
    import threading

    def call():
        try:
            client.run(_silence_distributed)
        except Exception:   # a worker already gone: nothing of its to silence
            pass

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout)


def _quiet_interrupted_cluster(client, own: bool) -> None:
    """After Ctrl-C: the tasks cancelled and workers stopped mid-round are the user's doing,
    not news; keep Dask's warnings about them (here and on the embedded cluster's
    workers) off the console."""
    _silence_distributed()
    if own:
        _silence_workers(client)


def _shard_max_corr(ds, k, ytil):
    return float(np.abs(ds.load_shard(k).T @ ytil).max(initial=0.0))


def _alpha_max(client, ds, fit_intercept) -> float:
    """``||X~^T y~||_inf / n``, computed shard by shard on the workers (data stays there)."""
    y = ds.load_y()
    ytil = y - y.mean() if fit_intercept else y
    yf = client.scatter(ytil, broadcast=True)
    futs = client.map(_shard_max_corr, [ds] * ds.n_shards, range(ds.n_shards),
                      [yf] * ds.n_shards, pure=False)
    return max(client.gather(futs)) / ds.n_samples


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
