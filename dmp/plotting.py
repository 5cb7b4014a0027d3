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
        axes[1].set(xlabel="wall time (s)", ylabel="duality gap", title="duality gap")
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
