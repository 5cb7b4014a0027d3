"""The ParMAC runtime and speed-up model (ALGORITHMS.md 2.4), and its inputs measured from a
fit.

With N points on P workers, M travelling submodels, e epochs per W step, ``t_w`` seconds to
update one submodel on one point, ``t_z`` seconds for one point's Z step and ``t_c``
seconds to hand one submodel to the next worker::

    T_W(P) = e ceil(M/P) (N t_w + P t_c)  [+ (P - 1) ceil(M/P) t_c for the final copy pass]
    T_Z(P) = (N / P) t_z
    T(P)   = T_W(P) + T_Z(P),      S(P) = T(1) / T(P)

(``T(1)`` has no communication.)  For P dividing M this is ``S(P) = P / (1 + rho P)`` with
``rho = e M t_c / (N (e M t_w + t_z))``.
"""

from __future__ import annotations

import math

import numpy as np


def _check(P, n_points, n_submodels, n_epochs, t_w, t_z, t_c):
    if isinstance(P, bool) or int(P) != P or P < 1:
        raise ValueError(f"P must be a positive integer, got {P!r}")
    for name, v in (("n_points", n_points), ("n_submodels", n_submodels),
                    ("n_epochs", n_epochs)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    for name, v in (("t_w", t_w), ("t_z", t_z), ("t_c", t_c)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite time >= 0, got {v!r}")


def parmac_time(P, *, n_points, n_submodels, n_epochs, t_w, t_z, t_c,
                final_pass: bool = True) -> float:
    """Predicted seconds of one MAC iteration (W step + Z step) on ``P`` workers.

    Parameters
    ----------
    P : int
        Workers on the ring.
    n_points, n_submodels, n_epochs : int
        N, M (travelling submodels: the encoder's bits, plus the decoder's features when it
        is trained by SGD) and e.
    t_w, t_z, t_c : float
        Seconds: one submodel's SGD update on one point; one point's Z step; handing one
        submodel to the next worker.
    final_pass : bool, default True
        Count the communication-only pass that gives every worker every submodel.
    """
    _check(P, n_points, n_submodels, n_epochs, t_w, t_z, t_c)
    per = math.ceil(n_submodels / P)
    comm = P * t_c if P > 1 else 0.0
    T_w = n_epochs * per * (n_points * t_w + comm)
    if final_pass and P > 1:
        T_w += (P - 1) * per * t_c
    return T_w + n_points / P * t_z


def parmac_speedup(P, **costs) -> float:
    """``T(1) / T(P)`` (see `parmac_time`, which takes the same keyword arguments)."""
    return parmac_time(1, **costs) / parmac_time(P, **costs)


def measured_costs(estimator) -> dict:
    """The model's inputs measured in a fitted `BinaryAutoencoder`'s rounds.

    ``t_w``: the median hop's slowest SGD pass over ``ceil(M/P)`` submodels and ``N/P``
    points, per submodel-point; ``t_z``: the median Z step's slowest worker, per point;
    ``t_c``: the median hop's time beyond its slowest push (hand-over, barrier and
    scheduling -- everything the compute does not explain), per submodel.  Returned with
    ``n_points``, ``n_submodels`` and ``n_epochs``, ready for `parmac_time`.
    """
    h = estimator.round_history_
    P = estimator.n_workers_
    M = estimator.coef_.shape[0] + (estimator.n_features_in_
                                    if estimator.decoder == "sgd" else 0)
    N = estimator.n_samples_fit_
    per = math.ceil(M / P)
    phase = np.asarray(h["phase"])
    push = np.asarray(h["push_s"], dtype=float).reshape(len(phase), -1).max(axis=1)
    round_s = np.asarray(h["round_s"], dtype=float)
    hops = phase == "hop"
    t_w = float(np.median(push[hops])) / (per * N / P)
    t_z = float(np.median(push[phase == "z"])) / (N / P)
    sends = hops | (phase == "spread")
    t_c = float(np.median(round_s[sends] - push[sends])) / per
    return {"n_points": N, "n_submodels": M, "n_epochs": int(estimator.n_epochs),
            "t_w": t_w, "t_z": t_z, "t_c": max(t_c, 0.0)}
