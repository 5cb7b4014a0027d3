"""The ParMAC runtime and speed-up model (docs/algorithms.md, "Speed-up model"), and its
inputs measured from a fit.

With N points on P workers, M travelling submodels, e epochs per W step, ``t_w`` seconds to
update one submodel on one point, ``t_z`` seconds for one point's Z step and ``t_c``
seconds to hand one submodel to the next worker::

    T_W(P) = e ceil(M/P) (N t_w + P t_c)  [+ (P - 1) ceil(M/P) t_c for the final copy pass]
    T_Z(P) = (N / P) t_z
    T(P)   = T_W(P) + T_Z(P),      S(P) = T(1) / T(P)

(``T(1)`` has no communication.)  For P dividing M this is ``S(P) = P / (1 + rho P)`` with
``rho = e M t_c / (N (e M t_w + t_z))``.

dmp adds one term the paper's asynchronous MPI implementation does not have: every hop is
a round of the engine, closed by a barrier at the driver, so an iteration also costs
``rounds(P) t_round`` with ``rounds(P) = e P + (P - 1) + 1`` (hops, copy hops, the Z step)
and ``t_round`` the engine's fixed cost of a round (scheduling, the barrier's round trips,
bookkeeping).  ``t_round = 0`` gives the paper's model.
"""

from __future__ import annotations

import math

import numpy as np

from ..utils.text import shown


def _check(P, n_points, n_submodels, n_epochs, t_w, t_z, t_c):
    if isinstance(P, bool) or int(P) != P or P < 1:
        raise ValueError(f"P must be a positive integer, got {shown(P)}")
    for name, v in (("n_points", n_points), ("n_submodels", n_submodels),
                    ("n_epochs", n_epochs)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {shown(v)}")
    for name, v in (("t_w", t_w), ("t_z", t_z), ("t_c", t_c)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite time >= 0, got {shown(v)}")


def parmac_time(P, *, n_points, n_submodels, n_epochs, t_w, t_z, t_c, t_round=0.0,
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
    t_round : float, default 0
        Seconds of fixed cost per engine round (see the module docstring).
    final_pass : bool, default True
        Count the communication-only pass that gives every worker every submodel.
    """
    _check(P, n_points, n_submodels, n_epochs, t_w, t_z, t_c)
    if not (math.isfinite(t_round) and t_round >= 0):
        raise ValueError(f"t_round must be a finite time >= 0, got {shown(t_round)}")
    per = math.ceil(n_submodels / P)
    comm = P * t_c if P > 1 else 0.0
    T_w = n_epochs * per * (n_points * t_w + comm)
    rounds = n_epochs * P + 1
    if final_pass and P > 1:
        T_w += (P - 1) * per * t_c
        rounds += P - 1
    return T_w + n_points / P * t_z + rounds * t_round


def parmac_speedup(P, **costs) -> float:
    """``T(1) / T(P)`` (see `parmac_time`, which takes the same keyword arguments)."""
    return parmac_time(1, **costs) / parmac_time(P, **costs)


def measured_costs(estimator) -> dict:
    """The model's inputs measured in a fitted `BinaryAutoencoder`'s rounds (medians).

    ``t_w``: a hop's slowest SGD pass (``ceil(M/P)`` submodels, ``N/P`` points) per
    submodel-point; ``t_z``: the Z step's slowest worker per point; ``t_c``: a hop's
    slowest hand-over of its submodels to the next worker, per submodel; ``t_round``: what
    a round costs beyond its slowest push and hand-over (driver and barrier).  Returned with
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
    ring = np.asarray(h["ring_s"], dtype=float).reshape(len(phase), -1).max(axis=1)
    # a round's length as the driver sees it: from the end of the previous one
    span = np.diff(np.asarray(h["time"], dtype=float), prepend=np.nan)
    hops = phase == "hop"
    steps = hops | (phase == "spread") | (phase == "z")
    steps[0] = False
    t_w = float(np.median(push[hops])) / (per * N / P)
    t_z = float(np.median(push[phase == "z"])) / (N / P)
    t_c = float(np.median(ring[hops])) / per if P > 1 else 0.0
    t_round = float(np.median(span[steps] - push[steps] - ring[steps]))
    return {"n_points": N, "n_submodels": M, "n_epochs": int(estimator.n_epochs),
            "t_w": t_w, "t_z": t_z, "t_c": t_c, "t_round": max(t_round, 0.0)}
