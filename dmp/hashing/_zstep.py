"""The Z step of the binary autoencoder (per point, no communication)."""

from __future__ import annotations

import numpy as np

from . import _kernels

#: the longest code searched exhaustively (2^L codes per point)
MAX_ENUM_BITS = 16


def _qr_terms(X, B, b):
    X = np.asarray(X, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if X.ndim != 2 or B.ndim != 2 or B.shape[0] != X.shape[1] or b.shape != (X.shape[1],):
        raise ValueError(f"decoder B {B.shape} and b {b.shape} do not match X {X.shape} "
                         f"(B must be features x bits)")
    if B.shape[1] > B.shape[0]:
        raise ValueError(f"{B.shape[1]} bits exceed the {B.shape[0]} features")
    Q, R = np.linalg.qr(B)
    return np.ascontiguousarray((X - b) @ Q), np.ascontiguousarray(R)


def z_objective(X, B, b, H, Z, mu: float) -> np.ndarray:
    """``||x_n - B z_n - b||^2 + mu * Hamming(z_n, h_n)`` for every point."""
    X = np.asarray(X, dtype=np.float64)
    r = X - np.asarray(Z, dtype=np.float64) @ np.asarray(B, dtype=np.float64).T - b
    return np.einsum("ij,ij->i", r, r) + mu * np.sum(np.asarray(Z) != np.asarray(H), axis=1)


def z_step(X, B, b, H, mu: float, *, method: str = "auto", Z0=None,
           max_trials: int | None = None) -> np.ndarray:
    """Codes minimising ``||x - B z - b||^2 + mu ||z - h(x)||^2`` over ``z in {0,1}^L``.

    Parameters
    ----------
    X : (N, D) points; B : (D, L) decoder; b : (D,) decoder bias
    H : (N, L) 0/1 encoder outputs ``h(x)``
    mu : penalty weight, >= 0
    method : {"auto", "enumerate", "alternate"}
        Exhaustive search (exact; ``L <= 16``) or alternating optimisation over bits (from
        the better of ``Z0`` and ``H`` per point); "auto" enumerates up to 10 bits.
    Z0 : (N, L) 0/1, optional
        The current codes: alternating optimisation starts from them when they are better
        than ``H``, so the returned codes are never worse than ``Z0``.

    Returns
    -------
    Z : (N, L) uint8
    """
    if not np.isfinite(mu) or mu < 0:
        raise ValueError(f"mu must be a finite number >= 0, got {mu}")
    C, R = _qr_terms(X, B, b)
    H = np.ascontiguousarray(H, dtype=np.uint8)
    if H.shape != C.shape:
        raise ValueError(f"H must be {C.shape}, got {H.shape}")
    if Z0 is not None:
        Z0 = np.ascontiguousarray(Z0, dtype=np.uint8)
        if Z0.shape != C.shape:
            raise ValueError(f"Z0 must be {C.shape}, got {Z0.shape}")
    return z_step_qr(C, R, H, mu, method=method, Z0=Z0, max_trials=max_trials)


def z_step_qr(C, R, H, mu: float, *, method: str = "auto", Z0=None,
              max_trials: int | None = None) -> np.ndarray:
    """`z_step` in QR coordinates: ``C = (X - b) Q`` (float64, N x L), ``R`` upper
    triangular (``B = Q R``), ``H`` and ``Z0`` uint8 (N x L), all checked by the caller."""
    if method not in ("auto", "enumerate", "alternate"):
        raise ValueError(f"method must be 'auto', 'enumerate' or 'alternate', got {method!r}")
    N, L = C.shape
    if method == "auto":
        method = "enumerate" if L <= 10 else "alternate"
    Z = np.empty((N, L), dtype=np.uint8)
    if method == "enumerate":
        if L > MAX_ENUM_BITS:
            raise ValueError(f"enumeration over {L} bits (2^{L} codes per point) is too "
                             f"slow; use method='alternate' (at most {MAX_ENUM_BITS} bits)")
        _kernels.z_enumerate(C, R, H, float(mu), Z)
        return Z
    Z[:] = H
    if Z0 is not None:
        e_h = np.empty(N)
        e_0 = np.empty(N)
        _kernels.z_objective_qr(C, R, H, float(mu), H, e_h)
        _kernels.z_objective_qr(C, R, H, float(mu), Z0, e_0)
        better = e_0 < e_h
        Z[better] = Z0[better]
    _kernels.z_alternate(C, R, H, float(mu), Z, int(max_trials or 100 * L))
    return Z
