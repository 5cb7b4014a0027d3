"""The dmp page of the Dask dashboard (Bokeh), fed by `DMPMonitor`'s state.

One table lists every fit the scheduler has seen (estimator, parameters, status, round,
metric); the selected fit (the newest running one by default) gets live figures: its metric
against time and round, per-worker push and idle time per round, cumulative bytes per
primitive, schedule statistics, and the checkpoint / worker-loss log.  Updated every 500 ms
by streaming only the rounds not shown yet.
"""

from __future__ import annotations

import math

from .state import _NOT_METRICS, FitState, format_value, run_labels, scheduler_state

UPDATE_MS = 500
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
# metrics drawn in the schedule panel rather than with the model's metrics; a program can add
# its own (block positions of a rotation, submodel positions on a ring) as "sched_<name>"
_SCHEDULE_KEYS = ("n_candidates", "n_kept", "blocks_uploaded")
_NOT_PLOTTED = {"updates", "iteration", "step", "phase", "sweep"}


def _num(v) -> float:
    if isinstance(v, bool) or v is None:
        return math.nan
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def _params_text(params: dict, limit: int = 120) -> str:
    text = ", ".join(f"{k}={v}" for k, v in params.items()
                     if v is not None and k not in ("callback", "backend", "show_progress"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_scalar(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def choose_axis(lo: float, hi: float, n_finite: int, direction: str = "min") -> str:
    """``"log"`` or ``"linear"`` for a panel whose finite values lie in ``[lo, hi]``.

    Log only for a quantity that is minimised (or of no declared direction), positive, and
    spanning at least a decade: a log axis cannot show zero or negative values (Bokeh draws
    nothing, "could not determine minimum data value for log axis"), and flattens a small
    range into a line; a maximised metric (LDA's log-likelihood) reads best on a linear one.
    """
    if direction == "max" or n_finite == 0 or not lo > 0:
        return "linear"
    return "log" if hi >= 10 * lo else "linear"


class _Range:
    """Running count, minimum and maximum of the finite values of some columns."""

    __slots__ = ("n", "lo", "hi")

    def __init__(self):
        self.n, self.lo, self.hi = 0, math.inf, -math.inf

    def add(self, f: float) -> None:
        if math.isfinite(f):
            self.n += 1
            self.lo = min(self.lo, f)
            self.hi = max(self.hi, f)


class FitView:
    """Figures for one fit; ``update(fit)`` streams the rounds it has not shown yet.

    The panels and their axes follow the data: a metric gets a panel once it has a finite
    value, and each panel's y axis is chosen by `choose_axis` from the values shown.  When
    new rounds change that choice ``stale`` turns True and the page builds a new view.
    """

    def __init__(self, fit: FitState, max_rounds: int):
        from bokeh.layouts import column, row
        from bokeh.models import ColumnDataSource, DataTable, Div, TableColumn

        self.fit_id = fit.fit_id
        self.max_rounds = max_rounds
        self.seq = 0
        self.n_events = -1
        self.stale = False
        self.filled = False
        self.n_workers = max(len(fit.push_total), 1)
        self.primary = fit.primary_metric
        self.direction = fit.primary_direction
        kept = list(fit.rounds)
        keys: dict = {}
        for rec in kept:
            for k, v in rec.items():
                keys.setdefault(k, v)
        self.metric_keys = [k for k, v in keys.items()
                            if k not in _NOT_METRICS
                            and not k.startswith("bytes_") and k not in _NOT_PLOTTED
                            and k not in _SCHEDULE_KEYS and not k.startswith("sched_")
                            and k != self.primary and _is_scalar(v)]
        self.byte_keys = [k for k in keys if k.startswith("bytes_")]
        self.sched_keys = [k for k in keys if (k in _SCHEDULE_KEYS or k.startswith("sched_"))
                           and _is_scalar(keys[k])]
        self.has_prio = any(isinstance(r.get("priority_q"), (list, tuple)) for r in kept)
        self.key_signature = self.signature(fit)
        self.cum = {k: 0.0 for k in self.byte_keys}
        # value ranges of the panels whose axis depends on the data, over every round shown
        self.ranges = {c: _Range() for c in
                       ["primary", "pq"] + [f"m_{k}" for k in self.metric_keys]}
        for rec in kept:
            self._track(rec)
        self.layout = self._layout()

        cols = ["round", "time", "primary"] + [f"m_{k}" for k in self.metric_keys]
        cols += [f"push_{w}" for w in range(self.n_workers)]
        cols += [f"idle_{w}" for w in range(self.n_workers)]
        cols += [f"cum_{k}" for k in self.byte_keys] + [f"s_{k}" for k in self.sched_keys]
        if self.has_prio:
            cols += [f"pq{i}" for i in range(5)]
        self.source = ColumnDataSource({c: [] for c in cols})
        self.events = ColumnDataSource({"time": [], "kind": [], "round": [], "detail": []})

        workers = fit.worker_names() or [f"partition-{w}" for w in range(self.n_workers)]
        axes = dict(self.layout)
        figs = []
        if "primary" in axes:
            for x, xlabel in (("time", "time (s)"), ("round", "round")):
                figs.append(self._figure(
                    f"{self.primary} vs {x} ({'higher' if self.direction == 'max' else 'lower'}"
                    f" is better)", xlabel, [("primary", self.primary)], x=x,
                    log=axes["primary"] == "log"))
        for k in self.metric_keys:
            if f"m_{k}" in axes:
                figs.append(self._figure(f"{k} vs round", "round", [(f"m_{k}", k)],
                                         log=axes[f"m_{k}"] == "log"))
        figs.append(self._figure("push time per worker (s)", "round",
                                 [(f"push_{w}", workers[w] if w < len(workers) else str(w))
                                  for w in range(self.n_workers)]))
        figs.append(self._figure("idle (barrier wait) time per worker (s)", "round",
                                 [(f"idle_{w}", workers[w] if w < len(workers) else str(w))
                                  for w in range(self.n_workers)]))
        if self.byte_keys:
            figs.append(self._figure("bytes moved, cumulative", "round",
                                     [(f"cum_{k}", k[len("bytes_"):]) for k in self.byte_keys]))
        if self.sched_keys:
            figs.append(self._figure("schedule: variables per round", "round",
                                     [(f"s_{k}", k) for k in self.sched_keys]))
        if "pq" in axes:
            figs.append(self._priority_figure(log=axes["pq"] == "log"))
        table = DataTable(source=self.events, height=160, width=700, index_position=None,
                          columns=[TableColumn(field="time", title="time (s)"),
                                   TableColumn(field="kind", title="event"),
                                   TableColumn(field="round", title="round"),
                                   TableColumn(field="detail", title="detail")])
        grid = [row(*figs[i:i + 2]) for i in range(0, len(figs), 2)]
        self.root = column(*grid, Div(text="<b>checkpoints and worker losses</b>"), table)

    @staticmethod
    def signature(fit: FitState) -> tuple:
        first = fit.rounds[-1] if fit.rounds else {}
        return (tuple(sorted(first)), len(fit.push_total))

    def _track(self, rec: dict) -> None:
        self.ranges["primary"].add(_num(rec.get(self.primary)))
        for k in self.metric_keys:
            self.ranges[f"m_{k}"].add(_num(rec.get(k)))
        q = rec.get("priority_q")
        if isinstance(q, (list, tuple)):
            for v in q:
                self.ranges["pq"].add(_num(v))

    def _layout(self) -> tuple:
        """``((column, axis), ...)`` of the data-dependent panels that have data."""
        out = []
        for col, r in self.ranges.items():
            if r.n:
                direction = self.direction if col == "primary" else "min"
                out.append((col, choose_axis(r.lo, r.hi, r.n, direction)))
        return tuple(out)

    def _figure(self, title, xlabel, series, x="round", log=False):
        from bokeh.models import HoverTool
        from bokeh.plotting import figure

        fig = figure(title=title, height=260, width=540, x_axis_label=xlabel,
                     y_axis_type="log" if log else "linear", tools="pan,wheel_zoom,box_zoom,reset",
                     output_backend="canvas")
        for i, (col, label) in enumerate(series):
            fig.line(x, col, source=self.source, legend_label=str(label),
                     color=_PALETTE[i % len(_PALETTE)], line_width=2)
        fig.add_tools(HoverTool(tooltips=[(x, f"@{x}")] + [(str(lab), f"@{c}")
                                                           for c, lab in series]))
        fig.legend.location = "top_right"
        fig.legend.click_policy = "hide"
        return fig

    def _priority_figure(self, log=True):
        from bokeh.plotting import figure

        fig = figure(title="priority of the scheduled variables (min, quartiles, max)",
                     height=260, width=540, x_axis_label="round",
                     y_axis_type="log" if log else "linear",
                     tools="pan,wheel_zoom,box_zoom,reset")
        fig.varea("round", "pq0", "pq4", source=self.source, fill_alpha=0.15, color=_PALETTE[0],
                  legend_label="min-max")
        fig.varea("round", "pq1", "pq3", source=self.source, fill_alpha=0.35, color=_PALETTE[0],
                  legend_label="quartiles")
        fig.line("round", "pq2", source=self.source, color=_PALETTE[0], line_width=2,
                 legend_label="median")
        fig.legend.location = "top_right"
        return fig

    def update(self, fit: FitState) -> None:
        rows = fit.rounds_since(self.seq)
        self.seq = fit.n_rounds
        if rows:
            new = {c: [] for c in self.source.data}
            for rec in rows:
                new["round"].append(rec.get("round"))
                new["time"].append(_num(rec.get("time")))
                new["primary"].append(_num(rec.get(self.primary)))
                for k in self.metric_keys:
                    new[f"m_{k}"].append(_num(rec.get(k)))
                for name in ("push", "idle"):
                    vals = rec.get(f"{name}_s") or []
                    for w in range(self.n_workers):
                        new[f"{name}_{w}"].append(_num(vals[w]) if w < len(vals) else math.nan)
                for k in self.byte_keys:
                    self.cum[k] += _num(rec.get(k)) if math.isfinite(_num(rec.get(k))) else 0.0
                    new[f"cum_{k}"].append(self.cum[k])
                for k in self.sched_keys:
                    new[f"s_{k}"].append(_num(rec.get(k)))
                if self.has_prio:
                    q = rec.get("priority_q")
                    q = q if isinstance(q, (list, tuple)) and len(q) == 5 else [math.nan] * 5
                    for i in range(5):
                        new[f"pq{i}"].append(_num(q[i]))
                self._track(rec)   # (again for the rounds the constructor saw: harmless)
            if self.filled:
                self.source.stream(new, rollover=self.max_rounds)
            else:
                # a new view's first rounds are its data, not a stream: a stream to a model
                # added to the document in the same callback reaches the browser twice
                self.source.data = new
                self.filled = True
            self.stale = self._layout() != self.layout
        if len(fit.events) != self.n_events:
            self.n_events = len(fit.events)
            t0 = fit.info.get("started")
            evs = [e for e in fit.events if e.get("kind") in
                   ("checkpoint", "worker_lost", "recovered", "fit_end")]
            self.events.data = {
                "time": [f"{e['time'] - t0:.1f}" if t0 else "" for e in evs],
                "kind": [str(e.get("kind")) for e in evs],
                "round": [str(e.get("round", e.get("resumed_round", e.get("n_rounds", ""))))
                          for e in evs],
                "detail": [str(e.get("error", e.get("status", "")))[:100] for e in evs]}


class DMPPage:
    """The whole page: fit table + selector, status line, the selected fit's figures.

    The table lists the newest fit first, shows every fit (up to the monitor's ``max_fits``)
    without scrolling and highlights the one whose figures are shown; clicking a row shows
    that fit.  Runs of one estimator that differ in a few parameters (the runs a pipeline
    compares) are labelled by them (`run_labels`).
    """

    _COLUMNS = (("run", "run", 150), ("fit", "fit", 200), ("estimator", "estimator", 170),
                ("status", "status", 70), ("round", "round", 50), ("metric", "metric", 130),
                ("value", "value", 90), ("params", "params", 250))
    _ROW_PX = 25

    def __init__(self, scheduler):
        from bokeh.layouts import column, row
        from bokeh.models import ColumnDataSource, DataTable, Div, Select, TableColumn

        self.scheduler = scheduler
        self.view: FitView | None = None
        self.follow_newest = True
        self.title = Div(text="<h2>dmp: model-parallel training</h2>")
        self.status = Div(text="waiting for a dmp fit on this cluster...", width=1100,
                          name="dmp-status")
        self.select = Select(title="fit", options=[], value="", width=760,
                             name="dmp-fit-select")
        self.select.on_change("value", self._on_select)
        self.fits = ColumnDataSource({c: [] for c, _, _ in self._COLUMNS})
        self.fits.selected.on_change("indices", self._on_row)
        self.table = DataTable(source=self.fits, height=self._table_height(1), width=1110,
                               index_position=None, selectable=True, name="dmp-fits-table",
                               columns=[TableColumn(field=c, title=t, width=w)
                                        for c, t, w in self._COLUMNS])
        self.body = column(Div(text=""), name="dmp-body")
        self.root = column(self.title, row(self.select), self.status, self.table, self.body)
        self._setting = False

    def _table_height(self, n_rows: int) -> int:
        return self._ROW_PX * (max(n_rows, 1) + 1) + 6   # every row and the header

    def _state(self):
        return scheduler_state(self.scheduler)

    def _on_select(self, attr, old, new) -> None:
        if not self._setting:
            self.follow_newest = False

    def _on_row(self, attr, old, new) -> None:
        if self._setting or not new:
            return
        ids = self.fits.data.get("fit") or []
        if 0 <= new[0] < len(ids) and ids[new[0]] != self.select.value:
            self.follow_newest = False
            self.select.value = ids[new[0]]

    def update(self) -> None:
        state = self._state()
        if state is None or not state.fits:
            return
        fits = list(state.fits.values())[::-1]          # newest first
        ids = [f.fit_id for f in fits]
        labels = run_labels(fits)
        data = {
            "run": [labels.get(i, "") for i in ids],
            "fit": ids, "estimator": [f.estimator for f in fits],
            "status": [f.status for f in fits], "round": [f.last_round for f in fits],
            "metric": [f"{f.primary_metric} ({f.primary_direction})" for f in fits],
            "value": [format_value(f.last_metrics().get(f.primary_metric)) for f in fits],
            "params": [_params_text(f.info.get("params") or {}) for f in fits]}
        options = [(i, f"{labels[i]} \u00b7 {i} ({f.status})" if labels.get(i)
                    else f"{i} ({f.status})") for i, f in zip(ids, fits)]
        self._setting = True
        try:
            if self.fits.data != data:
                self.fits.data = data
            height = self._table_height(len(ids))
            if self.table.height != height:
                self.table.height = height
            if self.select.options != options:
                self.select.options = options
            chosen = self.select.value
            if self.follow_newest or chosen not in ids:
                running = [f.fit_id for f in fits if f.status == "running"]
                chosen = running[0] if running else ids[0]
            if self.select.value != chosen:
                self.select.value = chosen
            selected = [ids.index(chosen)]
            if list(self.fits.selected.indices) != selected:
                self.fits.selected.indices = selected
        finally:
            self._setting = False
        fit = state.fits[chosen]
        if not fit.rounds:
            self.status.text = f"<b>{fit.fit_id}</b>: starting..."
            return
        for _ in range(2):   # a view whose panels no longer fit the data is built anew
            if (self.view is None or self.view.fit_id != fit.fit_id or self.view.stale
                    or self.view.key_signature != FitView.signature(fit)):
                self.view = FitView(fit, state.max_rounds)
                self.body.children = [self.view.root]
            self.view.update(fit)
            if not self.view.stale:
                break
        self.status.text = self._status_text(fit)

    @staticmethod
    def _status_text(fit: FitState) -> str:
        m = fit.last_metrics()
        primary = fit.primary_metric
        better = "higher" if fit.primary_direction == "max" else "lower"
        metrics = " &middot; ".join(
            [f"<b>{primary}</b> {format_value(m.get(primary))} ({better} is better)"]
            + [f"{k} {format_value(v)}" for k, v in m.items()
               if k not in _NOT_PLOTTED and k != primary])
        total = fit.info.get("max_iter")
        elapsed = fit.rounds[-1].get("time", 0.0) if fit.rounds else 0.0
        ck = (f"checkpoints {fit.n_checkpoints} (last at round {fit.last_checkpoint_round})"
              if fit.n_checkpoints else "no checkpoint yet")
        return (f"<b>{fit.estimator}</b> <code>{fit.fit_id}</code> ({fit.status}) &middot; "
                f"<b>round {fit.last_round}</b>{'' if total is None else f' / {total}'} &middot; "
                f"{metrics} &middot; elapsed {_num(elapsed):.1f} s<br>{ck} &middot; "
                f"worker losses {fit.n_worker_losses}, recoveries {fit.n_recoveries} &middot; "
                f"{fit.n_rounds} rounds in {fit.n_batches} batches &middot; "
                f"params: {_params_text(fit.info.get('params') or {}, 400)}")


def dmp_doc(scheduler, extra, doc) -> None:
    """Bokeh document function, ``(scheduler, extra, doc)`` like the dashboard's own pages."""
    page = DMPPage(scheduler)
    page.update()
    doc.title = "Dask: dmp"
    doc.add_root(page.root)
    doc.add_periodic_callback(page.update, UPDATE_MS)
    try:   # the dashboard's template: its navigation bar and style
        from distributed.dashboard.components.scheduler import env

        doc.template = env.get_template("simple.html")
        doc.template_variables.update(extra)
    except Exception:
        pass
