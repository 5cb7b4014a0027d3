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


#: the x label of every time axis: ``history_["time"]`` starts when the round loop does, after
#: the data was loaded and the partitions were set up (that time is in a fit's whole wall time,
#: ``wall_time_s`` of ``metrics.json``, not on the axis)
TIME_LABEL = "time in the round loop (s; setup before it not drawn)"


def _fit_label(label, wall_time):
    """``label`` with the whole fit's wall time, so that a figure and the console agree."""
    if wall_time and label in wall_time:
        return f"{label} (whole fit {wall_time[label]:.2f} s)"
    return label


def _gap_rounds(h) -> np.ndarray:
    """Rounds at which the duality gap was computed (`history_` repeats the last gap)."""
    gap = np.asarray(h["dual_gap"], dtype=float)
    if "kind" in h:
        at = np.asarray(h["kind"]).astype(str) == "gap"
    else:
        at = np.r_[True, gap[1:] != gap[:-1]]
    return at & np.isfinite(gap)


def _dual_bound(histories) -> float | None:
    """The largest dual objective ``P - gap`` at any gap round of any run: a certified lower
    bound on the optimum (None without a finite gap)."""
    bounds = []
    for h in histories.values():
        if len(h) and "dual_gap" in h:
            at = _gap_rounds(h)
            if at.any():
                f = np.asarray(h["objective"], dtype=float)[at]
                bounds.append(float(np.max(f - np.asarray(h["dual_gap"], dtype=float)[at])))
    return max(bounds) if bounds else None


def _iteration_ends(h) -> np.ndarray:
    """Rounds that end an iteration (``history_["iteration"]``), or every round."""
    if "iteration" not in h:
        return np.ones(len(np.asarray(h["objective"])), dtype=bool)
    it = np.asarray(h["iteration"])
    return np.r_[it[1:] != it[:-1], True]


def plot_convergence(histories: dict, *, path=None, ax=None, best=None, wall_time=None):
    """Objective suboptimality and duality gap against time in the round loop, one line per
    run.

    The left panel's reference is, in this order: ``best`` if given; the best dual objective
    ``max(P - gap)`` over all runs (Lasso), a certified lower bound on the optimum, so the
    curve is a certified upper bound on the suboptimality and never reaches zero; otherwise
    the smallest objective seen, where the point that defines it (compared with itself) is
    left out.  The right panel is the duality gap, at the rounds it was computed, or (without
    one) the relative decrease of the objective per iteration, the quantity ``tol`` bounds.

    Parameters
    ----------
    histories : dict
        ``{label: history_}`` of fitted estimators.
    path : str, optional
        Save the figure there (PNG) instead of returning it open.
    best : float, optional
        Reference objective (e.g. a known optimum).
    wall_time : dict, optional
        ``{label: seconds}``: each fit's whole wall time, shown in the legend (the time axis
        starts with the round loop).
    """
    plt = _pyplot(path)

    if ax is None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    else:
        axes = np.atleast_1d(ax)
        fig = axes[0].figure
    if best is not None:
        ref, drop_self = float(best), False
        title, ylabel = "objective vs the given optimum", "(F - F*) / |F*|"
    elif (bound := _dual_bound(histories)) is not None:
        ref, drop_self = bound, False
        title = "objective vs the best dual bound (certified)"
        ylabel = "(P - D_best) / |D_best|  >= rel. subopt."
    else:
        ref = min(float(np.nanmin(h["objective"])) for h in histories.values() if len(h))
        drop_self = True
        title = "objective vs best seen (that point omitted)"
        ylabel = "(F - F_best) / |F_best|"
    scale = max(abs(ref), 1e-300)
    for label, h in histories.items():
        if not len(h):
            continue
        t = np.asarray(h["time"], dtype=float)
        f = np.asarray(h["objective"], dtype=float)
        sub = (f - ref) / scale
        # a point at the reference itself has no suboptimality to show; others at <= 0 are
        # below a given optimum only by rounding
        ok = np.isfinite(sub) & ((sub > 0) if drop_self else np.ones_like(sub, dtype=bool))
        axes[0].semilogy(t[ok], np.maximum(sub[ok], 1e-16), label=_fit_label(label, wall_time))
    axes[0].set(xlabel=TIME_LABEL, ylabel=ylabel, title=title)
    axes[0].legend(fontsize=8)
    if len(axes) > 1:
        has_gap = any("dual_gap" in h for h in histories.values())
        for label, h in histories.items():
            if not len(h):
                continue
            t = np.asarray(h["time"], dtype=float)
            if has_gap:
                if "dual_gap" not in h:
                    continue
                at = _gap_rounds(h)
                y = np.maximum(np.asarray(h["dual_gap"], dtype=float)[at], 1e-16)
                axes[1].semilogy(t[at], y, marker=".", label=label)
            else:
                end = _iteration_ends(h)
                f = np.asarray(h["objective"], dtype=float)[end]
                dec = -np.diff(f) / np.maximum(np.abs(f[1:]), 1e-300)
                ok = np.isfinite(dec) & (dec > 0)
                axes[1].semilogy(t[end][1:][ok], dec[ok], marker=".", label=label)
        if has_gap:
            axes[1].set(xlabel=TIME_LABEL, ylabel="duality gap",
                        title="duality gap (at the rounds it was computed)")
        else:
            per = "iteration" if any("iteration" in h for h in histories.values()) else "round"
            axes[1].set(xlabel=TIME_LABEL, ylabel=f"(F_prev - F) / |F| per {per}",
                        title=f"relative decrease of the objective per {per}")
        if axes[1].lines:
            axes[1].legend(fontsize=8)
    fig.tight_layout()
    return _finish(fig, path)


def plot_loglik(histories: dict, *, path=None, wall_time=None):
    """LDA convergence: the log-likelihood per token against time in the round loop (linear
    axis: it is negative), and how much it still changes from one Gibbs sweep to the next
    (log axis; a sampler at stationarity fluctuates at a noise floor rather than reaching 0).

    Parameters
    ----------
    histories : dict
        ``{label: history_}`` of fitted `LatentDirichletAllocation` (``ll_per_token`` and
        ``sweep`` per round).
    path : str, optional
        Save the figure there (PNG) instead of returning it open.
    wall_time : dict, optional
        ``{label: seconds}``: each fit's whole wall time, shown in the legend.
    """
    plt = _pyplot(path)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, h in histories.items():
        if not len(h):
            continue
        t = np.asarray(h["time"], dtype=float)
        ll = np.asarray(h["ll_per_token"], dtype=float)
        ok = np.isfinite(ll)
        axes[0].plot(t[ok], ll[ok], label=_fit_label(label, wall_time))
        sweep = np.asarray(h["sweep"]) if "sweep" in h else np.arange(len(ll))
        # the value after each sweep: the last round of it
        end = ok & np.r_[sweep[1:] != sweep[:-1], True]
        change = np.abs(np.diff(ll[end]))
        keep = change > 0
        axes[1].semilogy(sweep[end][1:][keep], change[keep], marker=".", label=label)
    axes[0].set(xlabel=TIME_LABEL, ylabel="log-likelihood per token",
                title="log-likelihood per token")
    axes[1].set(xlabel="Gibbs sweep", ylabel="|change| per sweep",
                title="change of log-likelihood per token, sweep to sweep")
    for a in axes:
        if a.lines:
            a.legend(fontsize=8)
        a.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return _finish(fig, path)


def plot_suboptimality(histories: dict, *, reference=None, path=None, x_blocks=True):
    """Relative suboptimality against iterations and against uploaded blocks.

    Parameters
    ----------
    histories : dict
        ``{label: history_}`` of fitted sparsified estimators (``objective`` and
        ``blocks_uploaded`` per round; round 0 is the starting point).
    reference : float, optional
        The optimal objective F* (e.g. from scipy L-BFGS).  Without it, the smallest
        objective seen, where the point that defines it (compared with itself) is left out.
    path : str, optional
        Save the figure there (PNG) instead of returning it open.
    """
    plt = _pyplot(path)

    fig, axes = plt.subplots(1, 2 if x_blocks else 1, figsize=(11 if x_blocks else 6, 4))
    axes = np.atleast_1d(axes)
    drop_self = reference is None
    if drop_self:
        reference = min(float(np.nanmin(h["objective"])) for h in histories.values())
    ylabel = "(F - F_best) / |F_best|" if drop_self else "(F - F*) / |F*|"
    scale = max(abs(reference), 1e-300)
    for label, h in histories.items():
        f = np.asarray(h["objective"], dtype=float)
        ok = np.isfinite(f) & ((f > reference) if drop_self else True)
        sub = np.maximum(f - reference, 1e-16) / scale
        it = np.arange(len(f))
        axes[0].semilogy(it[ok], sub[ok], label=label)
        if x_blocks:
            blocks = np.cumsum(np.asarray(h["blocks_uploaded"], dtype=float))
            axes[1].semilogy(blocks[ok], sub[ok], label=label)
    note = " (vs best seen, that point omitted)" if drop_self else ""
    axes[0].set(xlabel="iteration", ylabel=ylabel, title="vs iterations" + note)
    if x_blocks:
        axes[1].set(xlabel="blocks uploaded (all partitions)", ylabel=ylabel,
                    title="vs communication" + note)
        axes[1].set_xscale("log")
    for a in axes:
        a.legend(fontsize=8)
    fig.tight_layout()
    return _finish(fig, path)


def plot_rmse(histories: dict, *, path=None, test_rmse=None, wall_time=None):
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
        ``{label: final test RMSE}``, drawn as a dotted horizontal line (in the legend).
    wall_time : dict, optional
        ``{label: seconds}``: each fit's whole wall time, shown in the legend (the time axis
        starts with the round loop).

    Returns
    -------
    matplotlib.figure.Figure or None
        The open figure, or None when it was saved to ``path``.
    """
    plt = _pyplot(path)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n, (label, h) in enumerate(histories.items()):
        if not len(h):
            continue
        color = f"C{n % 10}"
        n_line = 0
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
            if n_line == 0:   # the whole fit's time once per run
                name = _fit_label(name, {name: wall_time[label]}
                                  if wall_time and label in wall_time else None)
            n_line += 1
            axes[0].plot(t, y, style, color=color, label=name)
            axes[1].plot(frac, y, style, color=color, label=name)
        if test_rmse and label in test_rmse:
            for a in axes:
                a.axhline(test_rmse[label], color=color, lw=0.8, ls=":",
                          label=f"{label} test (final model)")
    axes[0].set_xlabel(TIME_LABEL)
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
    the default ``objective`` first, then those every `Program` subclass defined so far
    declares (a model's program is defined once its estimator is imported)."""
    from .engine.events import primary_of
    from .engine.program import Program

    out = [primary_of(Program)]
    if out[0][0] in history:
        return out
    todo = list(Program.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        try:
            out.append(primary_of(cls))
        except ValueError:   # a program that misdeclares its own is refused when it runs
            pass
    return out


def plot_training(history, *, path=None, metric: str | None = None, title: str | None = None):
    """The dashboard's figures, after the fact, from one fit's ``history_``.

    Four panels: ``metric`` against time in the round loop and against round, push and idle
    (barrier wait) time per partition per round (the median and the range over the partitions
    when there are more than four), and cumulative bytes per primitive.  The metric's axis is
    logarithmic only for a minimised metric that is positive and spans a decade (as on the
    ``/dmp`` page): a raw objective that moves by a few percent stays linear.

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
    rounds = getattr(type(history), "_rounds_attribute", "history_")
    if not isinstance(history, dict) and hasattr(history, rounds):
        history = getattr(history, rounds)
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
    for ax, x, xlabel, short in ((axes[0, 0], np.asarray(history["time"]), TIME_LABEL, "time"),
                                 (axes[0, 1], rounds, "round", "round")):
        ax.plot(x, y, marker="." if len(y) < 60 else None)
        ax.set(xlabel=xlabel, ylabel=f"{metric} ({better} is better)",
               yscale="log" if log else "linear", title=f"{metric} vs {short}")
    push = np.atleast_2d(np.asarray(history.get("push_s", np.zeros((len(rounds), 0))),
                                    dtype=float))
    idle = np.atleast_2d(np.asarray(history.get("idle_s", np.zeros_like(push)), dtype=float))
    ax = axes[1, 0]
    n_parts = push.shape[1]
    series = [("push", push, "-")] + ([("idle", idle, "--")] if idle.shape == push.shape else [])
    if n_parts <= 4:
        for w in range(n_parts):
            for n, (name, v, ls) in enumerate(series):
                ax.plot(rounds, v[:, w], ls=ls, color=f"C{w % 10}",
                        label=f"{name}, partition {w}")
    else:  # one line per partition would need a legend longer than the panel
        for n, (name, v, ls) in enumerate(series):
            ax.fill_between(rounds, v.min(axis=1), v.max(axis=1), color=f"C{n}", alpha=0.25,
                            lw=0, label=f"{name}, range over the {n_parts} partitions")
            ax.plot(rounds, np.median(v, axis=1), ls=ls, color=f"C{n}",
                    label=f"{name}, median partition")
    ax.set(xlabel="round", ylabel="seconds", title="push and idle time per round")
    if n_parts:
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


def plot_speedup(measured: dict, predicted, *, path=None, fitted_from: str | None = None):
    """Measured speed-ups per MAC iteration ``{P: S}`` against the model's curve ``(P values,
    S values)``.

    The model's curve beyond the largest measured worker count is an extrapolation: it is
    drawn dashed over a shaded span that says so, and the legend says what the model's
    costs were measured in (``fitted_from``; by default, the fits with the measured worker
    counts).
    """
    plt = _pyplot(path)
    fig, ax = plt.subplots(figsize=(7, 5))
    P, S = np.asarray(predicted[0], dtype=float), np.asarray(predicted[1], dtype=float)
    mp = sorted(measured)
    top = max(mp) if mp else np.inf
    if fitted_from is None:
        fitted_from = f"the fits with {', '.join(map(str, mp))} workers"
    inside = P <= top
    line, = ax.plot(P[inside], S[inside], label=f"model T(1)/T(P), costs from {fitted_from}")
    beyond = P >= top
    if beyond.sum() > 1:
        ax.plot(P[beyond], S[beyond], ls="--", color=line.get_color(),
                label="model, extrapolated")
        ax.axvspan(top, P.max(), color="grey", alpha=0.12,
                   label=f"extrapolated: no fit with more than {top} workers")
    ax.plot(P, P, ls=":", color="grey", label="perfect")
    ax.plot(mp, [measured[p] for p in mp], "o", ms=8,
            label="measured (median MAC iteration, one fit each)")
    ax.set(xscale="log", yscale="log", xlabel="workers P",
           ylabel="speed-up per MAC iteration, T(1)/T(P)",
           title="ParMAC speed-up per MAC iteration: measured and model")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _finish(fig, path)
