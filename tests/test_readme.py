"""The README's Python examples run and do what they say."""

import re
from pathlib import Path

import numpy as np
import pytest

# the examples converge within their budget: a ConvergenceWarning is a README bug
pytestmark = pytest.mark.filterwarnings("error::sklearn.exceptions.ConvergenceWarning")

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_the_examples():
    assert len(BLOCKS) == 6
    first_lines = "\n".join(README.splitlines()[:12])
    assert "bash .ci/install && .venv/bin/dmp run pipelines/lasso.yaml" in first_lines
    assert ".venv/bin/python -m pytest -q" in first_lines
    assert ".venv/bin/python -m pytest -q" in README


def test_lasso_example():
    ns = {}
    exec(BLOCKS[0], ns)
    est = ns["est"]
    assert est.coef_.shape == (20_000,) and np.count_nonzero(est.coef_) > 0
    assert est.dual_gap_ <= est.tol * np.var(ns["y"]) + 1e-12


def test_sparsified_example():
    ns = {}
    exec(BLOCKS[1], ns)
    clf = ns["clf"]
    assert (clf.blocks_per_worker_, clf.n_blocks_) == (3, 31)
    # tau blocks of one value and one id each, and the objective; every few rounds the
    # stopping test's 8-value sketch of the local gradient too
    blocks = 3 * (8 + 4) + 8
    assert set(np.unique(clf.history_["upload_bytes"][1:])) == {blocks, blocks + 8 * 8}
    assert clf.score(ns["X"], ns["y"]) > 0.97


def test_program_example():
    ns = {}
    exec(BLOCKS[5], ns)
    np.testing.assert_allclose(ns["program"].driver["w"], np.arange(5.0), atol=1e-6)
    assert ns["result"].converged


def test_mf_example():
    ns = {}
    exec(BLOCKS[2], ns)
    mf = ns["mf"]
    assert mf.user_factors_.shape == (2000, 10) and mf.item_factors_.shape == (500, 10)
    assert -0.16 < mf.score(ns["R_test"]) < -0.1
    assert np.all(np.diff(mf.history_["objective"][1:]) <= 1e-9 * mf.history_["objective"][2:])


def test_lda_example():
    ns = {}
    exec(BLOCKS[3], ns)
    lda, theta = ns["lda"], ns["theta"]
    assert lda.components_.shape == (4, ns["corpus"].shape[1])
    np.testing.assert_allclose(theta.sum(axis=1), 1.0)
    # the four themes of the tiny corpus: every topic's top words come from one theme
    top = lda.top_words(5, ns["corpus"].load_vocabulary())
    themes = [{"football", "goal", "referee", "stadium", "player", "match", "league", "coach",
               "striker", "penalty", "season", "trophy", "keeper", "tackle", "fans"},
              {"rocket", "orbit", "planet", "galaxy", "telescope", "astronaut", "launch", "moon",
               "comet", "gravity", "satellite", "nebula", "mission", "crater", "solar"}]
    assert sum(set(t) <= th for t in top for th in themes) == 2
    assert lda.perplexity(ns["X"]) < 60


def test_hashing_example():
    ns = {}
    exec(BLOCKS[4], ns)
    ba, codes = ns["ba"], ns["codes"]
    assert codes.shape == (1497, 2) and codes.dtype == np.uint8
    assert ns["found"].shape == (300, 50)
    assert ns["precision"] > 0.5 and ba.stop_reason_ == "Z = h(X)"
    assert ba.iteration_history_["bytes_ring"][0] > 0
