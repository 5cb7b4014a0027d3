"""Evaluation of hash functions for reports: precision and recall of Hamming ranking against
the Euclidean ground truth (with ITQ and PCA hashing as baselines), and measured against
predicted ParMAC speed-ups."""

from __future__ import annotations

import math
import time

import numpy as np

from ._itq import itq, pca_hash
from ._retrieval import euclidean_neighbors, hamming_search, pack_codes
from ._speedup import measured_costs, parmac_time

#: the baselines are fitted on at most this many base points (on the driver)
BASELINE_SAMPLE = 200_000


def ranking_quality(query_codes, base_codes, n_bits: int, truth) -> dict:
    """Precision@k (``k = truth.shape[1]``) and the recall of the ``k`` true neighbours
    among the first R points in Hamming order, for R = k, 2k, 5k, ... (up to the base)."""
    k = truth.shape[1]
    n = len(base_codes)
    grid = [r for r in (k * m for m in (1, 2, 5, 10, 20, 50, 100)) if r <= n] or [n]
    found, _ = hamming_search(query_codes, base_codes, grid[-1], n_bits)
    recall = []
    for r in grid:
        hits = [len(np.intersect1d(f[:r], t, assume_unique=True)) for f, t in zip(found, truth)]
        recall.append(float(np.mean(hits)) / k)
    return {"precision_at_k": recall[0], "n_retrieved": grid, "recall": recall}


def evaluate_hashing(models: dict, base, queries, *, k: int = 50, n_bits: int,
                     baselines=("itq", "pca"), random_state=0) -> dict:
    """Precision@k and recall curves of fitted models (``name -> transform-able``) and of
    ITQ / PCA hashing fitted here on the base (a sample of at most `BASELINE_SAMPLE`)."""
    base = np.asarray(base, dtype=np.float64)
    queries = np.asarray(queries, dtype=np.float64)
    k = min(int(k), len(base))
    truth = euclidean_neighbors(queries, base, k)
    out = {}
    for name, model in models.items():
        out[name] = ranking_quality(model.transform(queries), model.transform(base), n_bits,
                                    truth)
    rng = np.random.default_rng(random_state)
    sample = base if len(base) <= BASELINE_SAMPLE else \
        base[rng.choice(len(base), BASELINE_SAMPLE, replace=False)]
    for name in baselines:
        t0 = time.perf_counter()
        h = itq(sample, n_bits, random_state=random_state) if name == "itq" else \
            pca_hash(sample, n_bits)
        fit_s = time.perf_counter() - t0
        out[name] = ranking_quality(pack_codes(h.codes(queries)), pack_codes(h.codes(base)),
                                    n_bits, truth)
        out[name]["train_s"] = fit_s
    return out


def iteration_seconds(estimator) -> float:
    """Median seconds of a MAC iteration's W and Z steps (driver clock)."""
    h = estimator.iteration_history_
    return float(np.median(np.asarray(h["w_s"]) + np.asarray(h["z_s"])))


def speedup_report(fits: dict, predict_for=(128,)) -> dict:
    """Measured speed-ups of fits with different worker counts (``{P: estimator}``, one
    with P = 1) against the model of `parmac_time`, its compute costs measured in the
    1-worker fit, its hand-over and per-round costs in the fit with the most workers."""
    if 1 not in fits:
        raise ValueError("a speed-up needs a 1-worker fit")
    per_fit = {P: measured_costs(e) for P, e in fits.items()}
    costs = dict(per_fit[1])
    top = max(fits)
    if top > 1:
        # the hand-over and the round's fixed cost as measured on the ring
        for key in ("t_c", "t_round"):
            costs[key] = per_fit[top][key]
    T = {P: iteration_seconds(e) for P, e in sorted(fits.items())}
    model = {P: parmac_time(P, **costs) for P in sorted({*fits, *predict_for})}
    measured = {P: T[1] / T[P] for P in T}
    predicted = {P: model[1] / model[P] for P in model}
    # the model's structure alone: each fit's time from the costs measured in that fit
    own = {P: parmac_time(P, **per_fit[P]) for P in sorted(fits)}
    # the worker count of the fit each of the model's times was measured in: one fit each,
    # so the curve beyond the largest of them is an extrapolation from single measurements
    sources = {key: top if key in ("t_c", "t_round") and top > 1 else 1
               for key in ("t_w", "t_z", "t_c", "t_round")}
    return {"costs": costs, "costs_measured_with_workers": sources,
            "iteration_s": T, "model_iteration_s": model,
            "model_own_costs_s": own, "per_fit_costs": per_fit,
            "measured_speedup": measured, "predicted_speedup": predicted,
            "relative_error": {P: (measured[P] - predicted[P]) / predicted[P]
                               for P in measured if P > 1 and math.isfinite(predicted[P])}}
