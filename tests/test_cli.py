"""`dmp run` end to end on the embedded LocalCluster, and `dmp data`."""

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from dmp.cli import main
from dmp.io import open_dataset

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dmp_run_small_pipeline(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", str(REPO / "pipelines" / "lasso_small.yaml"), "--output", str(out),
               "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "Dask dashboard: http" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["runs"]) == {"priority", "round_robin"}
    for run in metrics["runs"].values():
        assert run["dual_gap"] >= 0 and run["rounds"] > 0
        assert set(run["bytes"]) == {"schedule", "push", "pull"}
        assert 0 < run["kernel_fraction"] <= 1
    # both schedules reach the same optimum
    objs = [r["objective"] for r in metrics["runs"].values()]
    assert abs(objs[0] - objs[1]) <= 1e-5 * min(objs)
    coef = zarr.open_group(str(out / "coef.zarr"), mode="r")["coef"][:]
    assert coef.shape == (metrics["shape"][1],)
    assert np.count_nonzero(coef) == metrics["runs"]["priority"]["nnz_coef"]
    png = (out / "convergence.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for label in ("schedule=priority", "schedule=round_robin"):
        assert (out / f"training-{label}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing half-written is left next to the output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dmp_run_sparsified_pipeline(tmp_path, capsys):
    """The LIBSVM breast-cancer data through the row-store recipe, ISEGA for two values of
    blocks per worker on the embedded cluster, suboptimality against L-BFGS."""
    spec = (REPO / "pipelines" / "sparsified_logreg.yaml").read_text()
    spec = spec.replace("blocks_per_worker: [1, 2, 3, 6, all]", "blocks_per_worker: [3, all]")
    spec = spec.replace("max_iter: 1000", "max_iter: 120")
    path = tmp_path / "p.yaml"
    path.write_text(spec)
    out = tmp_path / "run"
    assert main(["run", str(path), "--output", str(out), "--no-progress"]) == 0
    assert "reference optimum (L-BFGS" in capsys.readouterr().out
    m = json.loads((out / "metrics.json").read_text())
    runs = m["runs"]
    assert set(runs) == {"3", "all"} and m["shape"] == [569, 30]
    assert runs["3"]["blocks_per_worker"] == 3 and runs["all"]["blocks_per_worker"] == 30
    # each of the 10 partitions uploads exactly tau blocks per iteration
    assert runs["3"]["blocks_uploaded"] == 120 * 10 * 3
    assert runs["all"]["blocks_uploaded"] == 120 * 10 * 30
    for r in runs.values():
        # 120 iterations bring (F - F*) / F* from 2.03 (F(0) = log 2) to about 1e-2
        assert 0 < r["final_suboptimality"] < 5e-2
        assert r["reference_objective"] == m["reference_objective"]
    png = (out / "convergence.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    coef = zarr.open_group(str(out / "coef.zarr"), mode="r")["coef"][:]
    assert coef.shape == (30,)


def test_failed_run_leaves_no_output(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "pipelines" / "lasso_small.yaml").read_text()
                   .replace("alpha_ratio: 0.05", "alpha_ratio: 0.05\n    schedule_size: -3"))
    out = tmp_path / "out"
    rc = main(["run", str(bad), "--output", str(out), "--no-progress"])
    assert rc == 2
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "bad.yaml"] == []


def test_run_refuses_an_output_folder_of_other_files(tmp_path, capsys):
    """Only an earlier run's output (or an empty folder) is replaced: a folder of other
    files -- say the working directory -- is refused before anything starts."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    rc = main(["run", str(REPO / "pipelines" / "lasso_small.yaml"), "--output", str(out),
               "--no-progress"])
    assert rc == 2
    assert "is not the output of an earlier dmp run" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["precious.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_removes_only_its_own_checkpoints(tmp_path, dask_client):
    """A successful run deletes the checkpoint stores it wrote, not the other contents of
    the ``checkpoints`` folder; an empty output folder is filled, not replaced.  (On the
    session's cluster, ``--scheduler``: the files matter here, not the embedded cluster,
    which the tests above start.)"""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "other.txt").write_text("not dmp's")
    spec = (REPO / "pipelines" / "lasso_small.yaml").read_text()
    spec = spec.replace("checkpoint_every: 25", f"checkpoint_every: 5\ncheckpoints: {ck}")
    spec = spec.replace("compare:\n  schedule: [priority, round_robin]\n", "")
    spec = spec.replace("max_iter: 3000", "max_iter: 20")   # the files matter, not the fit
    path = tmp_path / "p.yaml"
    path.write_text(spec)
    out = tmp_path / "out"
    out.mkdir()
    run = ["run", str(path), "--output", str(out), "--no-progress",
           "--scheduler", dask_client.scheduler.address]
    assert main(run) == 0
    assert [p.name for p in ck.iterdir()] == ["other.txt"]
    assert (out / "metrics.json").is_file() and (out / "coef.zarr").is_dir()
    # a second run replaces the first one's output ...
    (out / "metrics.json").write_text("{}")
    assert main(run) == 0
    assert json.loads((out / "metrics.json").read_text())["pipeline"] == "lasso_small"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "out", "p.yaml"]
    # ... but not once the user put a file of their own in it
    (out / "notes.md").write_text("mine")
    assert main(run) == 2
    assert (out / "notes.md").read_text() == "mine" and (out / "metrics.json").is_file()


def test_run_refuses_checkpoints_inside_the_output(tmp_path, capsys):
    spec = (REPO / "pipelines" / "lasso_small.yaml").read_text()
    path = tmp_path / "p.yaml"
    path.write_text(spec + f"checkpoints: {tmp_path / 'res' / 'ck'}\n")
    assert main(["run", str(path), "--output", str(tmp_path / "res"), "--no-progress"]) == 2
    assert "must not be inside the output folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


@pytest.mark.parametrize("argv, words", [
    (["run", "p.yaml", "--workers", "-1"], "argument --workers: must be >= 1, got -1"),
    (["run", "p.yaml", "--workers", "0"], "argument --workers: must be >= 1, got 0"),
    (["data", "convert", "features", "digits", "f.zarr", "--max-points", "0"],
     "argument --max-points: must be >= 1, got 0"),
    (["data", "convert", "svmlight", "a.svm", "b.zarr", "--shards", "two"],
     "argument --shards: expected an integer, got 'two'"),
])
def test_numeric_options_are_checked_at_once(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_data_errors_speak_the_command_line(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("one document")
    assert main(["data", "convert", "text", str(docs), str(tmp_path / "t.zarr")]) == 2
    assert "is a directory; read one document per file" in capsys.readouterr().err
    assert main(["data", "make", "no_such_recipe"]) == 2
    err = capsys.readouterr().err
    assert "unknown recipe 'no_such_recipe'" in err and "lasso_small" in err
    src = REPO / "dmp" / "datasets" / "sample.svm"
    dest = tmp_path / "s.zarr"
    assert main(["data", "convert", "svmlight", str(src), str(dest)]) == 0
    assert main(["data", "convert", "svmlight", str(src), str(dest)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_run_refuses_a_store_of_the_wrong_kind_before_starting_a_cluster(tmp_path, capsys):
    spec = tmp_path / "p.yaml"
    spec.write_text(f"name: x\ndataset: tiny_corpus\nestimator: {{class: Lasso}}\n"
                    f"output: {tmp_path / 'out'}\n")
    assert main(["run", str(spec), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert "Lasso needs a column-sharded sparse store" in captured.err
    assert "Dask dashboard" not in captured.out and not (tmp_path / "out").exists()


def test_a_malformed_scheduler_address_is_refused_at_once(capsys):
    import time

    t0 = time.perf_counter()
    assert main(["monitor", "notanaddress", "--timeout", "3"]) == 2
    assert main(["run", str(REPO / "pipelines" / "lasso_small.yaml"), "--scheduler",
                 "tcp://nohost", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "not a Dask scheduler address: 'notanaddress'" in err
    assert "not a Dask scheduler address: 'tcp://nohost'" in err
    assert "Traceback" not in err and time.perf_counter() - t0 < 8


def test_pipeline_validation_messages(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndataset: lasso_small\nestimator: {class: Lasso}\nbogus: 1\n")
    assert main(["run", str(bad)]) == 2
    assert f"{bad}:4: unknown key 'bogus'" in capsys.readouterr().err
    bad.write_text("name: x\ndataset: lasso_small\nestimator: {class: Ridge}\n")
    assert main(["run", str(bad)]) == 2
    assert "unknown estimator class 'Ridge'" in capsys.readouterr().err
    bad.write_text("name: x\ndataset: d\nestimator: {class: SparsifiedSGDClassifier, "
                   "params: {alpha_ratio: 0.1}}\n")
    assert main(["run", str(bad)]) == 2
    assert "'alpha_ratio' is only defined for Lasso" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


GOOD = """\
name: t
dataset: lasso_small
estimator:
  class: Lasso
  params:
    alpha_ratio: 0.05
    tol: 1.0e-6
compare: {schedule: [priority, round_robin]}
cluster: {n_workers: 2}
checkpoint_every: 10
"""


@pytest.mark.parametrize("edit, line, words", [
    (("tol: 1.0e-6", "tol: 1.0e-6\n    tool: 3"), 8, "unknown parameter 'tool' for Lasso"),
    (("tol: 1.0e-6", "tol: -1"), 7, "'tol' parameter of Lasso"),
    (("alpha_ratio: 0.05", "alpha_ratio: -2"), 6, "'alpha_ratio' must be a number > 0"),
    (("alpha_ratio: 0.05", "alpha_ratio: 0.05\n    alpha: 0.1"), 6, "not both"),
    (("round_robin]", "sideways]"), 8, "'schedule'"),
    (("{schedule:", "{shedule:"), 8, "'compare' names 'shedule'"),
    (("{n_workers: 2}", "{n_workers: 2, nworkers: 3}"), 9, "unknown key 'nworkers' under"),
    (("{n_workers: 2}", "{n_workers: 0}"), 9, "positive integer"),
    (("checkpoint_every: 10", "checkpoint_every: often"), 10, "'checkpoint_every'"),
    (("  class: Lasso", "  class: Lasso\n  param: {}"), 5, "unknown key 'param' under"),
    (("name: t\n", "name: t\nestimater: 1\n"), 2, "unknown key 'estimater'"),
    (("    tol: 1.0e-6", "    tol: [1.0e-6"), 8, "not valid YAML"),
])
def test_pipeline_errors_name_the_line(tmp_path, edit, line, words):
    """Every pipeline error points at the line of the offending key, before any data is
    built or any cluster started (the estimator's own parameter checks included)."""
    from dmp.pipeline import PipelineError, load_pipeline

    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    assert load_pipeline(good)["estimator"]["params"]["tol"] == 1e-6
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace(*edit))
    with pytest.raises(PipelineError) as err:
        load_pipeline(bad)
    msg = str(err.value)
    assert msg.startswith(f"{bad}:{line}:") and words in msg, msg


def test_data_make_convert_info(tmp_path, capsys):
    dest = tmp_path / "sample.zarr"
    assert main(["data", "convert", "svmlight", str(REPO / "dmp" / "datasets" / "sample.svm"),
                 str(dest), "--shards", "2"]) == 0
    ds = open_dataset(dest)
    assert ds.n_shards == 2 and ds.n_samples == 20
    assert main(["data", "info", str(dest), "--validate"]) == 0
    assert main(["data", "make", "lasso_small", "--output", str(tmp_path / "s.zarr")]) == 0
    assert open_dataset(tmp_path / "s.zarr").shape == (2000, 20000)
    assert main(["data", "info", str(tmp_path / "nothing.zarr")]) == 2
    assert "no dmp dataset" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dmp_run_mf_pipeline_on_a_converted_ratings_file(tmp_path, capsys):
    """A MovieLens-format file (user::item::rating::timestamp) -> recipe -> ratings store
    -> CCD++ and CCD on the embedded cluster -> RMSE curves, metrics, factors."""
    rng = np.random.default_rng(0)
    n_users, n_items, k = 300, 120, 3
    U = rng.standard_normal((n_users, k))
    V = rng.standard_normal((n_items, k))
    pairs = rng.choice(n_users * n_items, 15_000, replace=False)
    u, i = pairs // n_items, pairs % n_items
    r = np.clip(np.round(3 + 0.5 * np.einsum("ij,ij->i", U[u], V[i])
                         + 0.3 * rng.standard_normal(len(u)), 1), 1, 5)
    lines = [f"{a + 1}::{b + 101}::{c:g}::97830{n}" for n, (a, b, c) in enumerate(zip(u, i, r))]
    (tmp_path / "ratings.dat").write_text("\n".join(lines) + "\n")
    (tmp_path / "recipe.yaml").write_text(
        "name: tiny_ml\nconvert: ratings\nsource: ratings.dat\n"
        "params: {format: movielens, split: [0.8, 0.1, 0.1], seed: 0}\n")
    spec = (REPO / "pipelines" / "mf.yaml").read_text()
    spec = spec.replace("dataset: ml100k", f"dataset: {tmp_path / 'recipe.yaml'}")
    spec = spec.replace("max_iter: 50", "max_iter: 8").replace("n_components: 10",
                                                               "n_components: 3")
    path = tmp_path / "p.yaml"
    path.write_text(spec)
    out = tmp_path / "run"
    assert main(["run", str(path), "--output", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "fitting MatrixFactorization (method=ccd++)" in printed
    m = json.loads((out / "metrics.json").read_text())
    assert m["shape"] == [n_users, n_items] and set(m["runs"]) == {"ccd++", "ccd", "als"}
    sd = float(np.std(r))
    for run in m["runs"].values():
        assert 3 <= run["iterations"] <= 8  # tol 1e-5 may stop it early
        # well below predicting the mean (about sd), and no better than the noise allows
        assert 0.3 < run["test_rmse"] < 0.75 * sd
        assert run["train_rmse"] <= run["valid_rmse"] + 0.05
        assert run["bytes"]["ring"] > 0  # sums (ccd++) or blocks (ccd, als), worker to worker
    g = zarr.open_group(str(out / "factors.zarr"), mode="r")
    assert g["user_factors"].shape == (n_users, 3) and g["item_factors"].shape == (n_items, 3)
    for png in ("rmse.png", "convergence.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml", "ratings.dat",
                                                         "recipe.yaml", "run"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dmp_run_lda_pipeline_on_a_text_corpus(tmp_path):
    """A plain-text file -> corpus recipe -> word-rotation LDA on the embedded cluster ->
    top words per topic, the log-likelihood curve, metrics, topic-word counts."""
    out = tmp_path / "lda"
    assert main(["run", str(REPO / "pipelines" / "lda_small.yaml"), "--output", str(out),
                 "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    run = metrics["runs"]["LatentDirichletAllocation"]
    assert run["sweeps"] == 30 and run["bytes"]["ring"] > 0 and run["ll_per_token"] < 0
    # the figures' time axis (the round loop) and the setup around it, beside the wall time
    assert 0 < run["round_loop_time_s"] < run["wall_time_s"]
    assert run["round_loop_time_s"] + run["setup_time_s"] == pytest.approx(run["wall_time_s"])
    lines = (out / "top_words.txt").read_text().splitlines()
    assert len(lines) == 4
    # the four themes of datasets/tiny_corpus.txt come out as the four topics
    themes = [{"football", "goal", "referee", "stadium"}, {"recipe", "oven", "garlic", "butter"},
              {"rocket", "orbit", "planet", "galaxy"}, {"guitar", "melody", "concert", "piano"}]
    found = [next(i for i, t in enumerate(themes) if len(t & set(line.split()[2:])) >= 3)
             for line in lines]
    assert sorted(found) == [0, 1, 2, 3]
    counts = zarr.open_group(str(out / "components.zarr"), mode="r")["topic_word_counts"][:]
    assert counts.shape == (4, metrics["shape"][1]) and counts.sum() == run["tokens"]
    assert (out / "convergence.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dmp_run_parmac_pipeline(tmp_path, capsys):
    """digits -> dense recipe with held-out queries -> ParMAC on 1 and 2 workers of the
    embedded cluster -> precision@50 / recall against the Euclidean ground truth for the BA,
    ITQ and PCA hashing, E_BA per iteration, measured and predicted speed-up, hash.zarr."""
    out = tmp_path / "parmac"
    assert main(["run", str(REPO / "pipelines" / "parmac.yaml"), "--output", str(out),
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    # every figure says what it is: the speed-up per MAC iteration and of the whole fit, and
    # the BA's precision against ITQ's as measured here (not a claim from elsewhere)
    walls = {P: metrics["runs"][P]["wall_time_s"] for P in ("1", "2")}
    assert "speed-up with 2 workers, per MAC iteration" in printed, printed
    assert f"whole fit (wall time incl. setup, {walls['1']:.2f} s with 1 worker, " \
           f"{walls['2']:.2f} s with 2): {walls['1'] / walls['2']:.2f}" in printed, printed
    assert metrics["hashing"]["speedup"]["whole_fit_speedup"]["2"] == \
        pytest.approx(walls["1"] / walls["2"])
    q = metrics["hashing"]["quality"]
    for name in ("BA n_workers=1", "BA n_workers=2"):
        d = 100 * (q[name]["precision_at_k"] - q["itq"]["precision_at_k"])
        assert q[name]["precision_vs_itq_points"] == pytest.approx(d)
        assert f"{name} {d:+.2f}" in printed
    assert metrics["shape"] == [1497, 64]
    rep = metrics["hashing"]
    q = rep["quality"]
    assert set(q) == {"BA n_workers=1", "BA n_workers=2", "itq", "pca"}
    assert rep["k"] == 50 and rep["n_queries"] == 300
    for name, r in q.items():
        assert 0 < r["precision_at_k"] <= 1 and r["recall"] == sorted(r["recall"])
    assert min(q["BA n_workers=1"]["precision_at_k"], q["BA n_workers=2"]["precision_at_k"]) \
        > q["pca"]["precision_at_k"] + 0.1
    for run in metrics["runs"].values():
        assert run["stop_reason"] == "Z = h(X)" and run["penalty"][-1] == 0
        assert run["E_BA"][-1] < run["E_BA"][0]
    assert metrics["runs"]["2"]["bytes"]["ring"] > 0 == metrics["runs"]["1"]["bytes"]["ring"]
    sp = rep["speedup"]
    assert set(sp["measured_speedup"]) == {"1", "2"} and "128" in sp["predicted_speedup"]
    assert all(v > 0 for v in sp["costs"].values())
    # what the model (and speedup.png's legend) is fitted from: one fit of each size
    assert sp["costs_measured_with_workers"] == {"t_w": 1, "t_z": 1, "t_c": 2, "t_round": 2}
    h = zarr.open_group(str(out / "hash.zarr"), mode="r")
    assert h["coef"].shape == (16, 64) and h["decoder_coef"].shape == (64, 16)
    for png in ("retrieval.png", "convergence.png", "speedup.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


#: every format of `dmp data convert` and its own options
CONVERT_OPTIONS = {
    "svmlight": {"--shards", "--layout", "--n-features"},
    "ratings": {"--format", "--split", "--seed", "--duplicates", "--sep", "--columns"},
    "uci": {"--shards", "--vocab"},
    "text": {"--shards", "--per", "--min-count", "--stop-words"},
    "features": {"--shards", "--queries", "--queries-file", "--max-points", "--seed"},
}


def test_data_convert_has_one_parser_per_format(capsys):
    """``dmp data convert --help`` lists the formats, and each format's ``--help`` its own
    options only (and --overwrite); another format's option is refused by name."""
    import re

    with pytest.raises(SystemExit) as exc:
        main(["data", "convert", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for fmt in CONVERT_OPTIONS:
        assert re.search(rf"^\s+{fmt}\s+\S", out, flags=re.M), out
    every = set().union(*CONVERT_OPTIONS.values())
    for fmt, own in CONVERT_OPTIONS.items():
        with pytest.raises(SystemExit) as exc:
            main(["data", "convert", fmt, "--help"])
        assert exc.value.code == 0
        flags = set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out))
        assert flags == own | {"--help", "--overwrite"}, fmt
        other = sorted(every - own)[0]
        with pytest.raises(SystemExit) as exc:
            main(["data", "convert", fmt, "in", "out", other, "1"])
        assert exc.value.code == 2
        assert f"{other}: not an option of {fmt} conversion" in capsys.readouterr().err


def test_data_convert_features(tmp_path, capsys):
    X = np.random.default_rng(0).standard_normal((40, 5)).astype(np.float32)
    rec = np.empty(40, dtype=[("d", "<i4"), ("v", "<f4", (5,))])
    rec["d"], rec["v"] = 5, X
    rec.tofile(tmp_path / "x.fvecs")
    rec[:3].tofile(tmp_path / "q.fvecs")
    assert main(["data", "convert", "features", str(tmp_path / "x.fvecs"),
                 str(tmp_path / "x.zarr"), "--shards", "2", "--queries-file",
                 str(tmp_path / "q.fvecs")]) == 0
    ds = open_dataset(tmp_path / "x.zarr")
    np.testing.assert_array_equal(ds.load_row_shards([0, 1]), X)
    np.testing.assert_array_equal(ds.load_queries(), X[:3])
    assert main(["data", "info", str(tmp_path / "x.zarr")]) == 0
    assert "held-out queries: 3" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:   # an argparse error, before any conversion
        main(["data", "convert", "features", str(tmp_path / "x.fvecs"),
              str(tmp_path / "y.zarr"), "--vocab", "v.txt"])
    assert exc.value.code != 0
    assert "--vocab: not an option of features conversion" in capsys.readouterr().err
    assert not (tmp_path / "y.zarr").exists()


def test_embedded_cluster_keeps_dask_housekeeping_quiet():
    """`dmp run`'s own cluster: no statistical profiler, a slow tick, a slow system monitor
    in every process (QUIET_DASK_CONFIG), so the driver does not take the workers' cores."""
    import dask

    from dmp.engine.backends.dask import QUIET_DASK_CONFIG
    from dmp.pipeline import _start_cluster

    client, cluster = _start_cluster({"cluster": {"n_workers": 1}}, None, None)
    try:
        keys = sorted(QUIET_DASK_CONFIG)
        seen = client.run(lambda: [dask.config.get(k) for k in keys])
        assert list(seen.values()) == [[QUIET_DASK_CONFIG[k] for k in keys]]
        # the scheduler (in this process) was created with the slow tick
        assert cluster.scheduler.periodic_callbacks["tick"].callback_time == 200
    finally:
        client.close()
        cluster.close()


def test_data_info_validate_says_what_it_checked(tmp_path, capsys):
    """`dmp data info --validate` names what it read and checked, for every kind of store
    (singular for one shard), and fails with the problem on a corrupt one."""
    from dmp.io import write_dense, write_ratings, write_sparse, write_sparse_rows

    rng = np.random.default_rng(0)
    X = np.where(rng.random((40, 6)) < 0.4, rng.integers(1, 5, (40, 6)), 0).astype(float)
    X[:, 0] = 1.0
    y = rng.standard_normal(40)
    stores = {
        "c.zarr": (write_sparse, (X, y), {"n_shards": 3},
                   f"validated: ok (3 shards, {int((X != 0).sum())} stored values and 40 "
                   f"targets: every array present with its dtype and length, indices in "
                   f"range and strictly increasing, no stored zeros, values and targets "
                   f"finite, counts as in the metadata, column sums and squared norms "
                   f"matching the data)"),
        "r.zarr": (write_sparse_rows, (X, y), {"n_shards": 1, "names": [f"d{i}" for i in
                                                                        range(40)]},
                   f"validated: ok (1 shard, {int((X != 0).sum())} stored values and 40 "
                   f"targets: every array present with its dtype and length, indices in "
                   f"range and strictly increasing, no stored zeros, values and targets "
                   f"finite, counts as in the metadata, document names of the right "
                   f"length)"),
        "d.zarr": (write_dense, (X.astype(np.float32),), {"n_shards": 2},
                   "validated: ok (2 shards of 40 points: float32 of the declared shapes, "
                   "every value finite)"),
        "m.zarr": (write_ratings, ([0, 1, 1], [2, 0, 1], [4.0, 3.0, 5.0]), {},
                   "validated: ok (1 split, 3 ratings: every array present with its dtype "
                   "and length, indices in range and sorted, ratings finite, the by-user "
                   "and by-item copies equal, counts as in the metadata, no pair in two "
                   "splits)"),
    }
    for name, (write, data, kw, words) in stores.items():
        write(tmp_path / name, *data, **kw)
        capsys.readouterr()
        assert main(["data", "info", str(tmp_path / name), "--validate"]) == 0
        out = capsys.readouterr().out
        assert words in out, out
        assert main(["data", "info", str(tmp_path / name)]) == 0
        assert "validated" not in capsys.readouterr().out
    zarr.open_group(tmp_path / "c.zarr")["shards/s0001/data"][:1] = np.nan
    assert main(["data", "info", str(tmp_path / "c.zarr"), "--validate"]) == 2
    assert "shard 1: 'data' contains NaN or infinite values" in capsys.readouterr().err
