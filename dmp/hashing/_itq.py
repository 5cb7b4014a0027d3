"""Linear hashing baselines (and the BA's initialisation): PCA hashing and ITQ.

ITQ (Gong and Lazebnik, 2011): project the centred data on its top ``L`` principal
directions ``V``, then find the rotation ``R`` minimising the quantisation loss
``||sign(V R) - V R||_F`` by alternating the codes and an orthogonal Procrustes step.
"""

from __future__ import annotations

import numpy as np


class LinearHash:
    """``h(x) = step((x - mean) W)``: the codes of a linear hash function (PCA hashing, ITQ).

    Attributes
    ----------
    mean_ : (D,) array
    projection_ : (D, L) array
    """

    def __init__(self, mean, projection):
        self.mean_ = np.asarray(mean, dtype=np.float64)
        self.projection_ = np.asarray(projection, dtype=np.float64)

    @property
    def n_bits(self) -> int:
        return self.projection_.shape[1]

    def codes(self, X) -> np.ndarray:
        """0/1 codes (uint8, points x bits)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.mean_.shape[0]:
            raise ValueError(f"X must have {self.mean_.shape[0]} features, got shape "
                             f"{X.shape}")
        return ((X - self.mean_) @ self.projection_ > 0).astype(np.uint8)


def _principal(X, n_bits):
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (points x features), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or infinity")
    n, D = X.shape
    if not 1 <= int(n_bits) <= min(n, D):
        raise ValueError(f"n_bits must be in [1, {min(n, D)}] (points and features of X), "
                         f"got {n_bits}")
    mean = X.mean(axis=0)
    # top right singular vectors of the centred data = principal directions
    _, _, Vt = np.linalg.svd(X - mean, full_matrices=False)
    return X, mean, Vt[:int(n_bits)].T


def pca_hash(X, n_bits: int) -> LinearHash:
    """PCA hashing (tPCA): the signs of the top ``n_bits`` principal components."""
    _, mean, W = _principal(X, n_bits)
    return LinearHash(mean, W)


def itq(X, n_bits: int, *, n_iter: int = 50, random_state=None) -> LinearHash:
    """Iterative quantisation: PCA to ``n_bits`` dimensions, then the rotation that best
    matches the signs (``n_iter`` alternations from a random orthogonal matrix)."""
    X, mean, W = _principal(X, n_bits)
    V = (X - mean) @ W
    from sklearn.utils import check_random_state

    rng = check_random_state(random_state)
    R, _ = np.linalg.qr(rng.standard_normal((int(n_bits), int(n_bits))))
    for _ in range(int(n_iter)):
        R = procrustes(V.T @ np.where(V @ R >= 0, 1.0, -1.0))
    return LinearHash(mean, W @ R)


def procrustes(C) -> np.ndarray:
    """The orthogonal ``R`` maximising ``trace(R^T C)``, i.e. ITQ's rotation step
    ``argmin_R ||B - V R||_F`` from ``C = V^T B`` (a sum over workers' points)."""
    U, _, Wt = np.linalg.svd(C)
    return U @ Wt


def quantization_loss(X, h: LinearHash) -> float:
    """``||sign(V R) - V R||_F^2`` of the centred, projected data (what ITQ minimises)."""
    V = (np.asarray(X, dtype=np.float64) - h.mean_) @ h.projection_
    return float(np.sum((np.where(V >= 0, 1.0, -1.0) - V) ** 2))
