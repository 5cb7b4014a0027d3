"""Cells of the fault matrix (RELIABILITY.md) that the Lasso's tests in
test_checkpoint_faults.py covered for one model only: a corrupt and an incomplete latest
checkpoint of MatrixFactorization, LatentDirichletAllocation and SparsifiedSGDRegressor fall
back to the checkpoint before, and the resumed fit ends with the uninterrupted result."""

import os
import shutil
import warnings

import numpy as np
import pytest
import zarr
from sklearn.exceptions import ConvergenceWarning

from dmp.engine.checkpoint import CheckpointStore
from dmp.exceptions import CheckpointWarning

from test_checkpoint_faults import MODELS

NAMES = ["sparsified", "mf", "lda"]


def _two_checkpoints(tmp_path, name):
    """The uninterrupted fit, and a checkpoint location holding two complete rounds of the
    same fit stopped halfway."""
    make, args, _, result, every = MODELS[name]
    every = 1 if name == "lda" else every   # its few rounds: two checkpoints before the stop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        full = make(backend="local", n_workers=2, checkpoint_every=every).fit(*args)
        n_rounds = len(full.history_["round"])
        ckpt = str(tmp_path / "ck.zarr")
        stop = max(n_rounds // 2, 2 * every + 1)
        make(backend="local", n_workers=2, checkpoint=ckpt, checkpoint_every=every,
             callback=lambda round, metrics: round >= stop).fit(*args)
    rounds = sorted(n for n in os.listdir(ckpt) if n.startswith("round_"))
    assert len(rounds) >= 2, rounds
    assert CheckpointStore(ckpt).latest() == int(rounds[-1][len("round_"):])
    return make, args, result, every, full, ckpt, rounds


def _resume(make, args, every, ckpt):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = make(backend="local", n_workers=2, checkpoint=ckpt, checkpoint_every=every,
                   resume=True).fit(*args)
    return est, [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]


def _partition_arrays(ckpt, round_name):
    group = zarr.open_group(f"{ckpt}/{round_name}/partitions/p0000", mode="r+")
    return group, sorted(group.array_keys())


@pytest.mark.parametrize("name", NAMES)
def test_a_corrupt_latest_checkpoint_falls_back_to_the_round_before(tmp_path, name):
    make, args, result, every, full, ckpt, rounds = _two_checkpoints(tmp_path, name)
    group, keys = _partition_arrays(ckpt, rounds[-1])
    arr = next(group[k] for k in keys if group[k].size > 0)
    first = arr[(0,) * arr.ndim]
    # NaN in a float array; an integer array (LDA's counts) gets a changed value
    arr[(0,) * arr.ndim] = np.nan if arr.dtype.kind == "f" else first + 1
    resumed, msgs = _resume(make, args, every, ckpt)
    latest, before = (int(r[len("round_"):]) for r in (rounds[-1], rounds[-2]))
    assert len(msgs) == 1 and f"round {before}" in msgs[0] and f"round {latest}" in msgs[0], \
        msgs
    assert "p0000" in msgs[0]
    np.testing.assert_allclose(result(resumed), result(full), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_a_latest_checkpoint_missing_a_piece_falls_back_to_the_round_before(tmp_path, name):
    make, args, result, every, full, ckpt, rounds = _two_checkpoints(tmp_path, name)
    shutil.rmtree(f"{ckpt}/{rounds[-1]}/partitions/p0001")
    resumed, msgs = _resume(make, args, every, ckpt)
    before = int(rounds[-2][len("round_"):])
    assert len(msgs) == 1 and f"resumed from the checkpoint of round {before}" in msgs[0], msgs
    assert "p0001" in msgs[0] and "missing" in msgs[0]
    np.testing.assert_allclose(result(resumed), result(full), rtol=1e-7, atol=1e-9)
