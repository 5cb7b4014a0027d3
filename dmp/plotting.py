"""Convergence figures from ``history_`` (matplotlib is imported lazily)."""

from __future__ import annotations

import numpy as np


def plot_convergence(histories: dict, *, path=None, ax=None, best=None):
    """Objective suboptimality and duality gap against wall time, one line per run.

    Parameters
    ----------
    histories : dict
        ``{label: history_}`` of fitted estimators.
    path : str, optional
        Save the figure there (PNG) instead of returning it open.
    best : float, optional
        Reference objective; defaults to the smallest objective seen in any run.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if ax is None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    else:
        axes = np.atleast_1d(ax)
        fig = axes[0].figure
    if best is None:
        best = min(float(np.min(h["objective"])) for h in histories.values() if len(h))
    for label, h in histories.items():
        if not len(h):
            continue
        t = np.asarray(h["time"])
        sub = np.maximum(np.asarray(h["objective"]) - best, 1e-16) / max(abs(best), 1e-300)
        axes[0].semilogy(t, sub, label=label)
        if len(axes) > 1 and "dual_gap" in h:
            gap = np.asarray(h["dual_gap"], dtype=float)
            ok = np.isfinite(gap)
            axes[1].semilogy(t[ok], np.maximum(gap[ok], 1e-16), marker=".", label=label)
    axes[0].set(xlabel="wall time (s)", ylabel="relative suboptimality",
                title="objective (vs best seen)")
    axes[0].legend()
    if len(axes) > 1:
        if any("dual_gap" in h for h in histories.values()):
            axes[1].set(xlabel="wall time (s)", ylabel="duality gap", title="duality gap")
            axes[1].legend()
        else:  # no gap (e.g. matrix factorisation): the objective itself, log scale
            for label, h in histories.items():
                if len(h):
                    axes[1].semilogy(np.asarray(h["time"]), np.asarray(h["objective"]),
                                     label=label)
            axes[1].set(xlabel="wall time (s)", ylabel="objective", title="objective")
            axes[1].legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    return fig


def plot_suboptimality(histories: dict, *, reference: float, path=None, x_blocks=True):
    """Relative suboptimality against iterations and against uploaded blocks.

    Parameters
    ----------
    histories : dict
        ``{label: history_}`` of fitted sparsified estimators (``objective`` and
        ``blocks_uploaded`` per round; round 0 is the starting point).
    reference : float
        The optimal objective F* (e.g. from scipy L-BFGS).
    path : str, optional
        Save the figure there (PNG) instead of returning it open.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if x_blocks else 1, figsize=(11 if x_blocks else 6, 4))
    axes = np.atleast_1d(axes)
    scale = max(abs(reference), 1e-300)
    for label, h in histories.items():
        f = np.asarray(h["objective"], dtype=float)
        ok = np.isfinite(f)
        sub = np.maximum(f - reference, 1e-16) / scale
        it = np.arange(len(f))
        axes[0].semilogy(it[ok], sub[ok], label=label)
        if x_blocks:
            blocks = np.cumsum(np.asarray(h["blocks_uploaded"], dtype=float))
            axes[1].semilogy(blocks[ok], sub[ok], label=label)
    axes[0].set(xlabel="iteration", ylabel="(F - F*) / |F*|", title="vs iterations")
    if x_blocks:
        axes[1].set(xlabel="blocks uploaded (all workers)", ylabel="(F - F*) / |F*|",
                    title="vs communication")
        axes[1].set_xscale("log")
    for a in axes:
        a.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    return fig


def plot_rmse(histories: dict, *, path=None, test_rmse=None):
    """Training and validation RMSE against wall time and against iterations, one colour per
    run (matrix factorisation ``history_``).

    Parameters
    ----------
    histories : dict
        ``{label: history_}``; each needs ``time``, ``iteration``, ``train_rmse`` and
        ``valid_rmse`` (NaN when there was no validation data).
    path : str, optional
        Save the figure there (PNG) instead of returning it open.
    test_rmse : dict, optional
        ``{label: final test RMSE}``, drawn as a horizontal marker.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n, (label, h) in enumerate(histories.items()):
        if not len(h):
            continue
        color = f"C{n % 10}"
        t = np.asarray(h["time"], dtype=float)
        it = np.asarray(h["iteration"], dtype=float)
        # iteration axis: the fraction of the iteration done at each round
        frac = np.zeros_like(it)
        for v in np.unique(it):
            idx = np.flatnonzero(it == v)
            frac[idx] = v - 1 + (np.arange(1, len(idx) + 1) / len(idx)) if v > 0 else 0
        for key, style in (("train_rmse", "--"), ("valid_rmse", "-")):
            y = np.asarray(h[key], dtype=float)
            if not np.isfinite(y).any():
                continue
            name = f"{label} {key.split('_')[0]}"
            axes[0].plot(t, y, style, color=color, label=name)
            axes[1].plot(frac, y, style, color=color, label=name)
        if test_rmse and label in test_rmse:
            for a in axes:
                a.axhline(test_rmse[label], color=color, lw=0.8, ls=":")
    axes[0].set_xlabel("wall time (s)")
    axes[1].set_xlabel("iteration")
    for a in axes:
        a.set_ylabel("RMSE")
        a.set_yscale("log")
        a.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return None
    return fig
