"""Convergence figures from ``history_`` (matplotlib is imported lazily)."""

from __future__ import annotations

import numpy as np


def _pyplot(path):
    """matplotlib.pyplot, on the file-only Agg backend when the figure goes to ``path``."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _finish(fig, path):
    """Save ``fig`` to ``path`` (PNG) and close it, returning the path; or return it open."""
    if path is None:
        return fig
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    plt = _pyplot(path)

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
    return _finish(fig, path)


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
    plt = _pyplot(path)

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
    return _finish(fig, path)


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
    plt = _pyplot(path)

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
    out = _finish(fig, path)
    return None if path is not None else out


def _declared_primaries(history) -> list[tuple[str, str]]:
    """``(name, direction)`` of the programs' primary metrics (`dmp.engine.events.primary_of`),
    the default ``objective`` first; the estimators' modules are imported only when
    ``history`` has no objective (they are slow to import)."""
    from .engine.events import primary_of
    from .engine.program import Program

    out = [primary_of(Program)]
    if out[0][0] in history:
        return out
    from .decomposition._lda_program import LDAProgram
    from .decomposition._mf_program import _MFBase
    from .hashing._parmac import ParMACProgram
    from .linear_model._lasso_program import LassoProgram
    from .linear_model._sparsified_program import SparsifiedProgram

    return out + [primary_of(p) for p in (LassoProgram, SparsifiedProgram, _MFBase,
                                          LDAProgram, ParMACProgram)]


def plot_training(history, *, path=None, metric: str | None = None, title: str | None = None):
    """The dashboard's figures, after the fact, from one fit's ``history_``.

    Four panels: ``metric`` against wall time and against round, push and idle (barrier wait)
    time per worker per round, and cumulative bytes per primitive.  The metric's axis is
    logarithmic only for a minimised metric that is positive and spans a decade (as on the
    ``/dmp`` page).

    Parameters
    ----------
    history : dict or fitted estimator
        An estimator's ``history_`` (arrays per key, ``push_s``/``idle_s`` rounds x workers),
        or the estimator itself (its per-round history: ``round_history_`` where it has one).
        A `BinaryAutoencoder`'s ``history_`` holds MAC iterations, not rounds: it gets the
        estimator's own figure (`plot_parmac`).
    path : str, optional
        Save the figure there (PNG) instead of returning it open.
    metric : str, optional
        The metric to draw (``objective``, ``dual_gap``, ``valid_rmse``, ...); by default the
        primary metric its program declares (``objective``, LDA's ``ll_per_token``, the
        binary autoencoder's ``E_BA``).
    title : str, optional
        A title over the figure.
    """
    if not isinstance(history, dict) and hasattr(history, "history_"):
        history = getattr(history, "round_history_", history.history_)
    if not len(history):
        raise ValueError("history is empty: fit the estimator first")
    if "round" not in history:
        if {"iteration", "E_BA", "penalty"} <= set(history) and metric in (None, "E_BA"):
            kw = {} if title is None else {"title": title}
            return plot_parmac(history, path=path, **kw)
        raise ValueError(f"history has no 'round' (keys: {', '.join(history)}): pass an "
                         f"estimator's history_ (or round_history_) or the estimator")
    primaries = _declared_primaries(history)
    if metric is None:
        metric = next((name for name, _ in primaries if name in history), None)
        if metric is None:
            raise ValueError(f"history has none of the declared primary metrics "
                             f"{sorted({n for n, _ in primaries})}; pass metric=")
    if metric not in history:
        scalars = [k for k in history if k not in ("push_s", "idle_s", "ring_s")]
        raise ValueError(f"history has no {metric!r}; it has {', '.join(scalars)}")
    direction = dict(primaries).get(metric, "min")
    plt = _pyplot(path)
    rounds = np.asarray(history["round"])
    y = np.asarray(history[metric], dtype=float)
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    fin = y[np.isfinite(y)]
    log = bool(direction == "min" and fin.size and fin.min() > 0 and fin.max() >= 10 * fin.min())
    better = "higher" if direction == "max" else "lower"
    for ax, x, xlabel in ((axes[0, 0], np.asarray(history["time"]), "wall time (s)"),
                          (axes[0, 1], rounds, "round")):
        ax.plot(x, y, marker="." if len(y) < 60 else None)
        ax.set(xlabel=xlabel, ylabel=f"{metric} ({better} is better)",
               yscale="log" if log else "linear",
               title=f"{metric} vs {xlabel.split(' (')[0]}")
    push = np.atleast_2d(np.asarray(history.get("push_s", np.zeros((len(rounds), 0))),
                                    dtype=float))
    idle = np.atleast_2d(np.asarray(history.get("idle_s", np.zeros_like(push)), dtype=float))
    ax = axes[1, 0]
    for w in range(push.shape[1]):
        line, = ax.plot(rounds, push[:, w], label=f"push, worker {w}")
        if idle.shape == push.shape:
            ax.plot(rounds, idle[:, w], ls="--", color=line.get_color(),
                    label=f"idle, worker {w}")
    ax.set(xlabel="round", ylabel="seconds", title="push and idle time per round")
    if push.shape[1]:
        ax.legend(fontsize="small")
    ax = axes[1, 1]
    for key in (k for k in history if k.startswith("bytes_")):
        vals = np.asarray(history[key], dtype=float)
        if vals.ndim == 1:
            ax.plot(rounds, np.cumsum(np.nan_to_num(vals)), label=key[len("bytes_"):])
    ax.set(xlabel="round", ylabel="bytes", title="bytes moved, cumulative")
    if ax.lines:
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _finish(fig, path)


def plot_parmac(history, *, path=None, title: str = "BinaryAutoencoder (ParMAC)"):
    """A binary autoencoder's MAC iterations (`BinaryAutoencoder.history_`): E_BA after each
    W step, the penalty ``||Z - h(X)||^2`` after each Z step, the validation precision, and
    the W- and Z-step seconds."""
    plt = _pyplot(path)
    if not len(history) or "iteration" not in history:
        raise ValueError("history is empty: fit the estimator first")
    it = np.asarray(history["iteration"])
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    axes[0, 0].plot(it, history["E_BA"], marker=".")
    axes[0, 0].set(xlabel="MAC iteration", ylabel="E_BA (mean, scaled data)",
                   title="reconstruction error of h and f")
    pen = np.asarray(history["penalty"], dtype=float)
    axes[0, 1].plot(it, np.maximum(pen, 0.5), marker=".")
    axes[0, 1].set(xlabel="MAC iteration", ylabel="bits with z != h(x)", yscale="log",
                   title="penalty after the Z step")
    axes[1, 0].plot(it, history["precision"], marker=".")
    axes[1, 0].set(xlabel="MAC iteration", ylabel="precision", title="validation precision")
    axes[1, 1].bar(it - 0.2, history["w_s"], width=0.4, label="W step")
    axes[1, 1].bar(it + 0.2, history["z_s"], width=0.4, label="Z step")
    axes[1, 1].set(xlabel="MAC iteration", ylabel="seconds", title="step times")
    axes[1, 1].legend()
    fig.suptitle(title)
    fig.tight_layout()
    return _finish(fig, path)


def plot_retrieval(curves: dict, *, k: int, path=None):
    """Recall of the ``k`` true Euclidean neighbours against the number of points retrieved
    in Hamming order, one line per method (``curves[name] = (n_retrieved, recall)``)."""
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, (n, recall) in curves.items():
        ax.plot(n, recall, marker=".", label=name)
    ax.set(xscale="log", xlabel="points retrieved (Hamming ranking)",
           ylabel=f"recall of the {k} Euclidean neighbours", ylim=(0, 1.02),
           title="retrieval quality")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _finish(fig, path)


def plot_speedup(measured: dict, predicted, *, path=None):
    """Measured speed-ups ``{P: S}`` against the model's curve ``(P values, S values)``."""
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(7, 5))
    P, S = predicted
    ax.plot(P, S, label="model T(1)/T(P)")
    ax.plot(P, P, ls=":", color="grey", label="perfect")
    mp = sorted(measured)
    ax.plot(mp, [measured[p] for p in mp], "o", ms=8, label="measured")
    ax.set(xscale="log", yscale="log", xlabel="workers P", ylabel="speed-up",
           title="ParMAC speed-up: measured and predicted")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _finish(fig, path)
