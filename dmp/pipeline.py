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
(the one declaration files are validated against) and the README's "Pipeline files" section.
A dataset or checkpoint location may be an fsspec URL (``s3://...``); workers read their shards
and write their checkpoint partitions there themselves, with the credentials of their
environment (``AWS_*`` variables, as a Kubernetes Secret provides them).

The output folder receives ``coef.zarr``, ``metrics.json``, ``convergence.png``, one
``training-<run>.png`` per fit (the dashboard's figures, `dmp.plotting.plot_training`) and a copy of
the pipeline; it is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import yaml

from .engine.backends.dask import cluster_workers
from .io.sparse import DatasetError, require_store_kind
from .utils.text import plural

from .pipeline_schema import ESTIMATORS as _ESTIMATORS
from .pipeline_schema import SPARSIFIED as _SPARSIFIED
from .pipeline_schema import apply_defaults, check_applies, validate as validate_schema


class PipelineError(ValueError):
    """A pipeline file is invalid."""


def _key_lines(node, prefix=()) -> dict:
    """``{(key, subkey, ...): line}`` (1-based) of every mapping key in a composed YAML node."""
    lines = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                path = (*prefix, key.value)
                lines[path] = key.start_mark.line + 1
                lines.update(_key_lines(value, path))
    return lines


def load_pipeline(path) -> dict:
    """Read and validate a pipeline YAML file.

    Every error names the file, the line and the key (``file.yaml:7: ...``), including the
    estimator's own parameter checks, so a typo is found before any data is built or any
    cluster is started.
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
        lines = _key_lines(yaml.compose(text))
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
    validate_schema(spec, fail)
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
    spec["_path"] = str(path.resolve())
    spec["_lines"] = lines
    spec.setdefault("output", f"runs/{spec['name']}")
    return spec


def _check_params(class_name, params, compare, fail) -> None:
    """Run the estimator's own parameter checks on ``params`` (and on every ``compare``
    value) now, reporting the line of the offending parameter."""
    cls = _estimator_class(class_name)
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


def _estimator_class(name):
    module, attr = _ESTIMATORS[name].split(":")
    import importlib

    return getattr(importlib.import_module(module), attr)


def _open_data(spec):
    from .engine.checkpoint import is_remote
    from .io import build_dataset, open_dataset

    ref = spec["dataset"]
    if isinstance(ref, dict):
        return build_dataset(ref)
    if is_remote(str(ref)):
        return open_dataset(str(ref), storage_options=spec.get("storage_options"))
    p = Path(ref)
    if not p.is_absolute():
        here = Path(spec["_path"]).parent
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


def _start_cluster(spec, scheduler, workers):
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


def _mf_summary(est, wall_s, ds, kernel_s):
    h = est.history_
    last = {k: float(np.asarray(h[k], dtype=float)[-1]) for k in ("train_rmse", "valid_rmse")}
    out = {"objective": est.objective_, "iterations": int(est.n_iter_),
           "rounds": int(len(h["objective"]) - 1), "wall_time_s": wall_s,
           "train_rmse": last["train_rmse"],
           "valid_rmse": last["valid_rmse"] if np.isfinite(last["valid_rmse"]) else None,
           "test_rmse": -est.score(ds) if "test" in ds.splits else None,
           "mean": est.mean_, "n_components": est.n_components, "block_size": est.block_size_,
           "bytes": {"schedule": int(np.sum(h["bytes_schedule"])),
                     "push": int(np.sum(h["bytes_push"])),
                     "pull": int(np.sum(h["bytes_pull"])),
                     "ring": int(np.sum(h["bytes_ring"]))},
           "kernel_time_s": kernel_s, "kernel_fraction": kernel_s / max(wall_s, 1e-12),
           "recoveries": est.recoveries_}
    return out


def _lda_summary(est, wall_s, kernel_s):
    h = est.history_
    tps = np.asarray(h["tokens_per_s"], dtype=float)
    # (no "objective": LDA's primary metric is ll_per_token, maximised; see _primary_fields)
    return {"log_likelihood": est.log_likelihood_,
            "ll_per_token": est.log_likelihood_ / est.n_tokens_, "sweeps": int(est.n_iter_),
            "rounds": int(len(h["round"])), "wall_time_s": wall_s, "tokens": est.n_tokens_,
            "tokens_per_s_median": float(np.nanmedian(tps)) if np.isfinite(tps).any() else None,
            "n_components": est.n_components, "sampler": est.sampler,
            "bytes": {"push": int(np.sum(h["bytes_push"])), "pull": int(np.sum(h["bytes_pull"])),
                      "ring": int(np.sum(h["bytes_ring"]))},
            "kernel_time_s": kernel_s, "kernel_fraction": kernel_s / max(wall_s, 1e-12),
            "recoveries": est.recoveries_}


def _write_topics(out: Path, est, ds) -> None:
    """top_words.txt (the 15 most probable words of each topic) and components.zarr."""
    import zarr

    vocab = ds.load_vocabulary() if hasattr(ds, "load_vocabulary") else None
    with open(out / "top_words.txt", "w") as f:
        for k, words in enumerate(est.top_words(15, vocab)):
            f.write(f"topic {k:3d}: {' '.join(map(str, words))}\n")
    g = zarr.open_group(str(out / "components.zarr"), mode="w")
    g.create_array("topic_word_counts", data=est.topic_word_counts_)
    g.attrs.update({"doc_topic_prior": est.doc_topic_prior_,
                    "topic_word_prior": est.topic_word_prior_})


def _ba_summary(est, wall_s):
    h = est.history_
    return {"objective": float(h["E_BA"][-1]), "E_BA": [float(v) for v in h["E_BA"]],
            "penalty": [int(v) for v in h["penalty"]], "mu": [float(v) for v in h["mu"]],
            "validation_precision": [float(v) for v in h["precision"]],
            "mac_iterations": int(est.n_iter_), "stop_reason": est.stop_reason_,
            "best_iteration": est.best_iteration_, "rounds": int(len(est.round_history_["round"])),
            "wall_time_s": wall_s, "w_step_s": float(np.sum(h["w_s"])),
            "z_step_s": float(np.sum(h["z_s"])), "n_workers": est.n_workers_,
            "bytes": {"ring": int(np.sum(h["bytes_ring"])),
                      "driver": int(np.sum(h["bytes_driver"]))},
            "recoveries": est.recoveries_}


def _hashing_report(out: Path, spec, ds, fitted, cmp_key, log, runs=None) -> dict:
    """Precision@k and recall against the Euclidean ground truth for every fit and for the
    ITQ / PCA baselines (retrieval.png), E_BA per iteration (convergence.png), measured
    against predicted speed-up when the fits compared worker counts (speedup.png); the
    hash functions go to hash.zarr."""
    import zarr

    from .hashing import parmac_time
    from .hashing._report import evaluate_hashing, speedup_report
    from .plotting import plot_parmac, plot_retrieval, plot_speedup

    ev = spec.get("evaluation") or {}
    main = next(iter(fitted.values()))
    base = ds.load_row_shards(list(range(ds.n_shards)))
    queries = ds.load_queries() if hasattr(ds, "load_queries") else None
    if queries is None:   # no held-out queries: 500 base points, left in the base
        rng = np.random.default_rng(0)
        queries = base[rng.choice(len(base), min(500, len(base)), replace=False)]
        log("the dataset has no held-out queries: using 500 of its points")
    labelled = {f"BA {cmp_key}={k}" if cmp_key else "BA": e for k, e in fitted.items()}
    k = int(ev.get("k", 50))
    quality = evaluate_hashing(labelled, base, queries, k=k, n_bits=main.coef_.shape[0],
                               baselines=tuple(ev.get("baselines", ["itq", "pca"])))
    for name, q in quality.items():
        log(f"  {name:>16}: precision@{k} {q['precision_at_k']:.4f}  recall@"
            f"{q['n_retrieved'][-1]} {q['recall'][-1]:.4f}")
    if "itq" in quality:
        # the comparison the README's claims are about, stated as measured here
        top = quality["itq"]["precision_at_k"]
        diffs = {n: 100 * (q["precision_at_k"] - top) for n, q in quality.items()
                 if n in labelled}
        for n, d in diffs.items():
            quality[n]["precision_vs_itq_points"] = d
        log(f"  precision@{k} of the BA minus ITQ's, in points (same {len(queries)} queries "
            f"and Euclidean neighbours): "
            + ", ".join(f"{n} {d:+.2f}" for n, d in diffs.items()))
    plot_retrieval({n: (q["n_retrieved"], q["recall"]) for n, q in quality.items()}, k=k,
                   path=str(out / "retrieval.png"))
    plot_parmac(main.history_, path=str(out / "convergence.png"))
    report = {"k": k, "n_queries": int(len(queries)), "quality": quality}
    by_workers = {int(P): e for P, e in fitted.items()} if cmp_key == "n_workers" else {}
    if 1 in by_workers:
        sp = speedup_report(by_workers)
        report["speedup"] = sp
        grid = np.unique(np.geomspace(1, 128, 30).astype(int))
        T1 = parmac_time(1, **sp["costs"])
        src = sp["costs_measured_with_workers"]
        plot_speedup(sp["measured_speedup"],
                     (grid, [T1 / parmac_time(int(P), **sp["costs"]) for P in grid]),
                     path=str(out / "speedup.png"),
                     fitted_from="one 1-worker fit (compute)" + (
                         f" and one {src['t_c']}-worker fit (hand-over, per round)"
                         if src["t_c"] > 1 else ""))
        walls = {int(P): float(r["wall_time_s"]) for P, r in (runs or {}).items()}
        if 1 in walls:
            sp["whole_fit_speedup"] = {P: walls[1] / t for P, t in walls.items()}
        for P, s in sp["measured_speedup"].items():
            if P == 1:
                continue
            log(f"  speed-up with {P} workers, per MAC iteration (median W + Z step time "
                f"{sp['iteration_s'][1]:.3f} s with 1 worker, {sp['iteration_s'][P]:.3f} s "
                f"with {P}): measured {s:.2f}, speed-up model {sp['predicted_speedup'][P]:.2f}")
            if P in walls:
                log(f"  speed-up with {P} workers, whole fit (wall time incl. setup, "
                    f"{walls[1]:.2f} s with 1 worker, {walls[P]:.2f} s with {P}): "
                    f"{walls[1] / walls[P]:.2f}")
    g = zarr.open_group(str(out / "hash.zarr"), mode="w")
    for name in ("coef_", "intercept_", "decoder_coef_", "decoder_intercept_"):
        g.create_array(name.rstrip("_"), data=np.asarray(getattr(main, name)))
    g.attrs.update({"estimator": type(main).__name__, "n_bits": int(main.coef_.shape[0])})
    return report


def _loop_times(est, wall_s) -> dict:
    """The fit's time in the round loop (what the figures' time axes show: the last round's
    ``time``) and the rest of its wall time (loading the data, setting up the partitions,
    collecting the result), beside ``wall_time_s``.  A resumed fit's loop time includes the
    rounds before the resume; its setup time is then not known (None)."""
    t = np.asarray(getattr(est, "round_history_", est.history_).get("time", []), dtype=float)
    loop = float(t[-1]) if len(t) else 0.0
    rest = wall_s - loop
    return {"round_loop_time_s": loop, "setup_time_s": rest if rest >= 0 else None}


def _primary_fields(est) -> dict:
    """The run's primary metric as its program declares it (`dmp.engine.events.primary_of`)
    and as the live monitor reports it (JSON route, ``/dmp`` page, Prometheus): name,
    direction and the last round's value."""
    from .engine.events import primary_of

    if hasattr(est, "decoder_coef_"):
        from .hashing._parmac import ParMACProgram as program
    elif hasattr(est, "topic_word_counts_"):
        from .decomposition._lda_program import LDAProgram as program
    elif hasattr(est, "user_factors_"):
        from .decomposition._mf_program import _MFBase as program
    elif hasattr(est, "dual_gap_"):
        from .linear_model._lasso_program import LassoProgram as program
    else:
        from .linear_model._sparsified_program import SparsifiedProgram as program
    name, direction = primary_of(program)
    value = float(np.asarray(getattr(est, "round_history_", est.history_)[name],
                             dtype=float)[-1])
    return {"primary_metric": name, "direction": direction,
            "value": value if np.isfinite(value) else None}


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


def _summary(est, wall_s, reference=None, ds=None):
    if hasattr(est, "decoder_coef_"):
        return _ba_summary(est, wall_s)
    h = est.history_
    push = np.asarray(h["push_s"], dtype=float)
    kernel_s = float(push.mean(axis=1).sum())
    if hasattr(est, "topic_word_counts_"):
        return _lda_summary(est, wall_s, kernel_s)
    if hasattr(est, "user_factors_"):
        return _mf_summary(est, wall_s, ds, kernel_s)
    out = {
        "objective": est.objective_, "rounds": int(est.n_iter_), "wall_time_s": wall_s,
        "nnz_coef": int(np.count_nonzero(est.coef_)),
        "intercept": float(np.ravel(est.intercept_)[0]),
        "bytes": {"schedule": int(np.sum(h["bytes_schedule"])),
                  "push": int(np.sum(h["bytes_push"])), "pull": int(np.sum(h["bytes_pull"]))},
        "kernel_time_s": kernel_s, "kernel_fraction": kernel_s / max(wall_s, 1e-12),
        "recoveries": est.recoveries_,
    }
    if hasattr(est, "dual_gap_"):
        out.update(dual_gap=est.dual_gap_, coordinate_updates=int(est.n_updates_))
    if hasattr(est, "blocks_per_worker_"):
        f = np.asarray(h["objective"], dtype=float)
        out.update(n_blocks=est.n_blocks_, blocks_per_worker=est.blocks_per_worker_,
                   step_size=est.step_size_, blocks_uploaded=int(np.sum(h["blocks_uploaded"])),
                   upload_bytes=int(np.sum(h["upload_bytes"])))
        if reference is not None:
            sub = (f - reference) / max(abs(reference), 1e-300)
            out["reference_objective"] = reference
            out["final_suboptimality"] = float(sub[np.isfinite(sub)][-1])
            for target in (1e-4, 1e-6, 1e-8):
                hit = np.flatnonzero(sub <= target)
                # round t evaluates the iterate x^(t-1)
                out[f"iterations_to_{target:g}"] = int(max(hit[0] - 1, 0)) if len(hit) else None
                out[f"blocks_to_{target:g}"] = (int(np.sum(h["blocks_uploaded"][:hit[0] + 1]))
                                                if len(hit) else None)
    return out


def _reference(spec, ds, params, cls_name):
    """F* by scipy L-BFGS on the driver (the data is loaded here: small data only)."""
    from .linear_model._reference import lbfgs_optimum

    penalty = params.get("penalty", "l2")
    if penalty not in ("l2", None):
        raise PipelineError(f"{spec['_path']}: reference 'lbfgs' needs penalty l2 or None")
    X, y = ds.load_row_shards(list(range(ds.n_shards)))
    loss = "log_loss" if cls_name == "SparsifiedSGDClassifier" else "squared_error"
    alpha = float(params.get("alpha", 1e-4)) if penalty == "l2" else 0.0
    fun, _, _ = lbfgs_optimum(X, y, loss=loss, alpha=alpha,
                              fit_intercept=bool(params.get("fit_intercept", True)))
    return fun


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


def _remove_checkpoints(stores, root: str, keep_root: bool) -> None:
    """After a successful run: its own checkpoint stores, and the root folder unless
    ``keep_root`` (it is removed only if nothing else is in it)."""
    for store in stores:
        store.clear()
    if not keep_root:
        try:
            os.rmdir(root)
        except OSError:
            pass


def run_pipeline(spec, *, scheduler=None, workers=None, resume=False, output=None,
                 show_progress=True, log=print) -> dict:
    """Run a loaded pipeline; returns the metrics written to ``metrics.json``.

    The output folder is written beside ``output`` and moved there at the end; an existing
    one is replaced only if it is an earlier run's output (or empty).  Checkpoints go to
    ``<checkpoints>/<run label>.zarr`` and are deleted after a successful run (only those).
    """
    from .engine.checkpoint import CheckpointStore, is_remote

    out = Path(output or spec["output"]).resolve()
    _check_output(out)
    ckpt_root = str(spec.get("checkpoints") or out.parent / f".{out.name}-checkpoints")
    if not is_remote(ckpt_root):
        ckpt_root = str(Path(ckpt_root).resolve())
    if not is_remote(ckpt_root) and Path(ckpt_root).is_relative_to(out):
        raise PipelineError(f"checkpoints {ckpt_root!r} must not be inside the output folder "
                            f"{str(out)!r} (the output is replaced as a whole)")
    # a local root is removed afterwards (when empty) if it is dmp's default one or this run
    # creates it; an object store has no folders to leave behind
    keep_root = is_remote(ckpt_root) or (os.path.lexists(ckpt_root)
                                         and bool(spec.get("checkpoints")))
    stores = []
    ds = _open_data(spec)
    log(f"dataset: {ds}")
    est_spec = spec["estimator"]
    params = dict(est_spec.get("params") or {})
    ratio = params.pop("alpha_ratio", None)
    fit_intercept = params.get("fit_intercept", True)
    cls = _estimator_class(est_spec["class"])
    try:
        require_store_kind(ds, cls._store_kinds, est_spec["class"])
    except DatasetError as exc:  # before any cluster starts
        raise PipelineError(f"{spec['_path']}: {exc}") from None
    compare = spec.get("compare") or {}
    (cmp_key, cmp_values), = compare.items() if compare else ((None, [None]),)

    client, cluster = _start_cluster(spec, scheduler, workers)
    from .utils.scratch import clean_stale_partials, mark_partial, unmark_partial

    tmp_out = out.parent / f"{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        link = client.dashboard_link
        log(f"Dask dashboard: {link}  (live dmp page: {link.rsplit('/status', 1)[0]}/dmp)")
        if ratio is not None:
            params["alpha"] = float(ratio) * _alpha_max(client, ds, fit_intercept)
            log(f"alpha = {ratio} x alpha_max = {params['alpha']:.6g}")
        n_workers = len(cluster_workers(client))
        reference = reference_s = None
        if spec.get("reference") == "lbfgs":
            t0 = time.perf_counter()
            reference = _reference(spec, ds, params, est_spec["class"])
            reference_s = time.perf_counter() - t0
            log(f"reference optimum (L-BFGS on the driver): F* = {reference:.12g} "
                f"({reference_s:.2f} s)")
        local_too = _in_process_wanted(spec, scheduler, ds, params)
        runs, histories, fitted, overheads = {}, {}, {}, []
        for value in cmp_values:
            label = str(value) if cmp_key else est_spec["class"]
            p = dict(params)
            if cmp_key:
                p[cmp_key] = value
            ckpt = f"{ckpt_root.rstrip('/')}/{label}.zarr"
            store = CheckpointStore(ckpt)
            stores.append(store)
            has_ckpt = store.latest() is not None
            if store.exists() and not resume:
                if has_ckpt:
                    print(f"dmp run: deleting the checkpoints of an earlier run in {ckpt} "
                          f"(pass --resume to continue it instead)", file=sys.stderr)
                store.clear()
            # backend: local in the params simulates its n_workers in this process
            p.setdefault("backend", client)
            if "checkpoint" in cls().get_params():
                p.update(checkpoint=str(ckpt),
                         checkpoint_every=int(spec.get("checkpoint_every", 50)),
                         resume=bool(resume and has_ckpt))
            est = cls(**p, show_progress=show_progress)
            where = (f"{plural(p.get('n_workers') or n_workers, 'partition')} on "
                     f"{plural(n_workers, 'Dask worker')}"
                     if p["backend"] is client else f"backend {p['backend']!r}")
            what = f" ({cmp_key}={value})" if cmp_key else ""
            log(f"fitting {est_spec['class']}{what} with {where}")
            t0 = time.perf_counter()
            _fit_reporting_warnings(est, ds, spec)
            wall = time.perf_counter() - t0
            runs[label] = {**_primary_fields(est), **_summary(est, wall, reference, ds),
                           **_loop_times(est, wall)}
            histories[label] = getattr(est, "round_history_", est.history_)
            fitted[label] = est
            if hasattr(est, "decoder_coef_"):
                extra = f"MAC iterations {est.n_iter_} ({est.stop_reason_})"
            elif hasattr(est, "topic_word_counts_"):
                extra = (f"log-likelihood {runs[label]['log_likelihood']:.6g}  "
                         f"sweeps {est.n_iter_}")
            elif hasattr(est, "dual_gap_"):
                extra = f"gap {est.dual_gap_:.3e}"
            elif hasattr(est, "user_factors_"):
                extra = "  ".join(f"{k} {runs[label][k]:.4f}" for k in
                                  ("train_rmse", "valid_rmse", "test_rmse")
                                  if runs[label][k] is not None)
            else:
                extra = f"blocks uploaded {runs[label]['blocks_uploaded']}"
            run_ = runs[label]
            value = "n/a" if run_["value"] is None else f"{run_['value']:.10g}"
            log(f"  {run_['primary_metric']} {value} "
                f"({'higher' if run_['direction'] == 'max' else 'lower'} is better)  "
                f"{extra}  rounds {run_['rounds']}  {wall:.2f}s "
                f"({run_['round_loop_time_s']:.2f}s in the round loop)")
            if local_too and p["backend"] is client:
                local_s = _time_in_process(cls, p, ds)
                parts = p.get("n_workers") or 1   # the local backend's default
                parts = f"{parts} partition{'s' if parts != 1 else ''}"
                runs[label]["in_process_wall_time_s"] = local_s
                overheads.append((wall - local_s) / max(runs[label]["rounds"], 1))
                on = f"{n_workers} Dask worker{'s' if n_workers != 1 else ''}"
                log(f"  fit time: {wall:.2f} s on {on}; the same estimator and parameters "
                    f"in one process (backend='local', {parts}, no Dask): {local_s:.2f} s")
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
        metrics = {
            "pipeline": spec["name"], "dataset": str(getattr(ds, "path", ds)),
            "shape": list(ds.shape), "nnz": int(ds.nnz), "n_workers": n_workers,
            "scheduler": client.scheduler.address, "params": params,
            **_best(runs), "runs": runs,
            "reference_objective": reference, "reference_time_s": reference_s,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        clean_stale_partials(out)   # output folders of killed runs of this output
        tmp_out.mkdir(parents=True)
        mark_partial(tmp_out)
        main = fitted[next(iter(fitted))]
        from .plotting import plot_convergence, plot_loglik, plot_rmse, plot_suboptimality

        labelled = {f"{cmp_key}={k}" if cmp_key else k: h for k, h in histories.items()}
        walls = {f"{cmp_key}={k}" if cmp_key else k: r["wall_time_s"] for k, r in runs.items()}
        if hasattr(main, "decoder_coef_"):
            metrics["hashing"] = _hashing_report(tmp_out, spec, ds, fitted, cmp_key, log,
                                                 runs=runs)
        elif hasattr(main, "topic_word_counts_"):
            _write_topics(tmp_out, main, ds)
            plot_loglik(labelled, path=str(tmp_out / "convergence.png"), wall_time=walls)
        elif hasattr(main, "user_factors_"):
            _write_factors(tmp_out / "factors.zarr", main)
            tests = {f"{cmp_key}={k}" if cmp_key else k: r["test_rmse"]
                     for k, r in runs.items() if r["test_rmse"] is not None}
            plot_rmse(labelled, path=str(tmp_out / "rmse.png"), test_rmse=tests,
                      wall_time=walls)
            plot_convergence(labelled, path=str(tmp_out / "convergence.png"), wall_time=walls)
        elif est_spec["class"] in _SPARSIFIED:
            _write_coef(tmp_out / "coef.zarr", main)
            plot_suboptimality(labelled, reference=reference,
                               path=str(tmp_out / "convergence.png"))
        else:
            _write_coef(tmp_out / "coef.zarr", main)
            plot_convergence(labelled, path=str(tmp_out / "convergence.png"), wall_time=walls)
        from .plotting import plot_training

        for label, h in labelled.items():
            safe = re.sub(r"[^A-Za-z0-9_.+=-]+", "_", label)
            plot_training(h, path=str(tmp_out / f"training-{safe}.png"),
                          title=f"{est_spec['class']} {label}" if cmp_key else label,
                          metric=next(m for m in ("ll_per_token", "E_BA", "objective")
                                      if m in h))
        with open(tmp_out / "metrics.json", "w") as f:
            json.dump(metrics, f, indent=2, default=_json_default)
        shutil.copy(spec["_path"], tmp_out / "pipeline.yaml")
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
        _remove_checkpoints(stores, ckpt_root, keep_root)
        log(f"wrote {out}/ ({', '.join(sorted(p.name for p in out.iterdir()))})")
        return metrics
    except KeyboardInterrupt:
        _quiet_interrupted_cluster(client, own=cluster is not None)
        raise
    finally:
        shutil.rmtree(tmp_out, ignore_errors=True)
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


#: ``in_process: auto`` times the in-process fit up to this many stored values
IN_PROCESS_MAX_VALUES = 20_000_000


def _in_process_wanted(spec, scheduler, ds, params) -> bool:
    """Whether to time the same fit in-process too (``in_process`` of the pipeline)."""
    choice = spec.get("in_process", "auto")
    if choice != "auto":
        return bool(choice)
    if scheduler or params.get("backend") is not None:
        return False
    nnz = getattr(ds, "nnz", None)
    return isinstance(nnz, (int, np.integer)) and nnz <= IN_PROCESS_MAX_VALUES


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
    lines = spec.get("_lines") or {}
    for w in caught:
        if issubclass(w.category, ConvergenceWarning):
            key = next((k for k in (("estimator", "params", "max_iter"),
                                    ("estimator", "params", "tol"), ("estimator",))
                        if k in lines), None)
            warnings.warn_explicit(w.message, w.category, spec.get("_path", "pipeline"),
                                   lines.get(key, 1))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno,
                                   source=w.source)


def _silence_distributed() -> None:
    names = ["distributed", *(n for n in logging.root.manager.loggerDict
                              if n.startswith("distributed."))]
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


def _write_factors(path, est):
    """User and item factors (rows chunked) and the mean rating, as a Zarr group."""
    import zarr

    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    for name in ("user_factors", "item_factors"):
        F = np.asarray(getattr(est, name + "_"), dtype=np.float64)
        rows = max(1, min(len(F), (8 << 20) // max(8 * F.shape[1], 1)))
        a = g.create_array(name, shape=F.shape, dtype="float64", chunks=(rows, F.shape[1]))
        a[:] = F
    g.attrs.update({"mean": est.mean_, "estimator": type(est).__name__,
                    "params": {k: v for k, v in est.get_params().items()
                               if isinstance(v, (int, float, str, bool, type(None)))}})


def _write_coef(path, est):
    import zarr

    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    coef = np.ravel(np.asarray(est.coef_, dtype=np.float64))
    a = g.create_array("coef", shape=coef.shape, dtype="float64",
                       chunks=(min(len(coef), 1 << 20),))
    a[:] = coef
    g.attrs.update({"intercept": float(np.ravel(est.intercept_)[0]), "estimator": type(est).__name__,
                    "params": {k: v for k, v in est.get_params().items()
                               if isinstance(v, (int, float, str, bool, type(None)))}})
