"""Reference optima (scipy L-BFGS) for the objectives of the sparsified estimators."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize


def lbfgs_optimum(X, y, *, loss: str, alpha: float, fit_intercept: bool = True):
    """Minimise ``(1/N) sum_j loss(a_j.w + b, y_j) + alpha/2 |w|^2`` with L-BFGS.

    Parameters
    ----------
    X : array or sparse matrix of shape (N, d)
    y : array of shape (N,)
        Targets; for ``loss="log_loss"`` two classes (the larger is +1).
    loss : {"squared_error", "log_loss"}
        ``squared_error`` is ``(z - y)^2 / 2``.
    alpha : float
        L2 strength (the L2 penalty of the estimators with ``penalty="l2"``).

    Returns
    -------
    fun : float
        The optimal objective F*.
    coef : ndarray of shape (d,)
    intercept : float
    """
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, np.float64)
    y = np.asarray(y)
    N, d = X.shape
    if loss == "log_loss":
        classes = np.unique(y)
        if len(classes) != 2:
            raise ValueError(f"log_loss needs two classes, got {len(classes)}")
        t = np.where(y == classes[1], 1.0, -1.0)
    elif loss == "squared_error":
        t = y.astype(np.float64)
    else:
        raise ValueError(f"unknown loss {loss!r}")

    def fg(v):
        w = v[:d]
        b = v[d] if fit_intercept else 0.0
        z = np.asarray(X @ w).ravel() + b
        if loss == "log_loss":
            f = np.mean(np.logaddexp(0.0, -t * z))
            s = -t / (1.0 + np.exp(t * z)) / N
        else:
            r = z - t
            f = 0.5 * np.mean(r * r)
            s = r / N
        grad = np.asarray(X.T @ s).ravel() + alpha * w
        f += 0.5 * alpha * float(w @ w)
        return f, (np.append(grad, s.sum()) if fit_intercept else grad)

    res = minimize(fg, np.zeros(d + int(fit_intercept)), jac=True, method="L-BFGS-B",
                   options={"maxiter": 50_000, "ftol": 1e-16, "gtol": 1e-12})
    return float(res.fun), res.x[:d].copy(), float(res.x[d]) if fit_intercept else 0.0
