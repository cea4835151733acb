"""Figures for training dynamics: the loss curve with the detected drop, component-wise training.

* :func:`loss_curve_figure`: ``L``, ``L_obs``, ``L_mask`` (log scale) against the step, with the
  sudden drop found by :func:`tfmatcomp.analyses.dynamics.detect_drop` marked (drop step, 10-90% band,
  plateau and final levels);
* :func:`component_training_figure`: one curve per trained component group (the NeurIPS paper Fig. 8),
  from :func:`tfmatcomp.analyses.dynamics.component_training`, with each group's drop step marked;
* :func:`seed_curves_figure`: every seed's ``L_mask`` of a multi-seed run, onsets marked;
* :func:`drop_steps_figure`: the distribution of drop onsets over seeds;
* :func:`measures_figure`: measures of :func:`tfmatcomp.analyses.dynamics.over_checkpoints` over
  the steps, one panel each, under ``L_mask`` with the detector's drop band.

Example:
    >>> import numpy as np, pandas as pd
    >>> t = np.arange(0, 4000, 20.0)
    >>> mask = 10 ** (-2 + 1 / (1 + np.exp((t - 2500) / 40)))
    >>> df = pd.DataFrame({"step": t, "train_L": 0.3 * mask, "train_L_obs": 1e-4 + 0 * t, "train_L_mask": mask})
    >>> fig = loss_curve_figure(df, prefix="train", drop_column="train_L_mask")
    >>> [tr.name for tr in fig.data][:3]
    ['L', 'L_obs', 'L_mask']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tfmatcomp.analyses.dynamics import DropResult, detect_drop

__all__ = ["loss_curve_figure", "component_training_figure", "seed_curves_figure",
           "drop_steps_figure", "measures_figure"]

_LOSS_COLORS = {"L": "#4C4C4C", "L_obs": "#5778A4", "L_mask": "#D1615D"}
_PALETTE = ["#5778A4", "#E49444", "#D1615D", "#85B6B2", "#6A9F58", "#E7CA60", "#A87C9F", "#967662"]


def _check_metrics(metrics: pd.DataFrame, columns: Sequence[str]) -> None:
    if not isinstance(metrics, pd.DataFrame):
        raise ValueError(f"metrics: expected a pandas DataFrame (a metrics log), got {type(metrics).__name__}")
    missing = [c for c in columns if c not in metrics.columns]
    if missing:
        raise ValueError(f"metrics: missing columns {missing}; columns are {list(metrics.columns)}")


def _mark_drop(fig: go.Figure, drop: DropResult, color: str = "black", label: str = "") -> None:
    if not drop.has_drop:
        return
    fig.add_vrect(x0=drop.drop_start, x1=drop.drop_end, fillcolor=color, opacity=0.08, line_width=0)
    fig.add_vline(x=drop.drop_step, line=dict(color=color, dash="dash", width=1),
                  annotation_text=f"{label}drop @ {drop.drop_step:,.0f}", annotation_position="top")


def loss_curve_figure(
    metrics: pd.DataFrame,
    *,
    prefix: str = "eval",
    losses: Sequence[str] = ("L", "L_obs", "L_mask"),
    drop: DropResult | bool | None = True,
    drop_column: str | None = None,
    title: str | None = None,
) -> go.Figure:
    """Loss curves on a log scale with the detected sudden drop marked.

    Args:
        metrics: a metrics log (``step`` and ``{prefix}_{loss}`` columns), e.g. ``result.metrics``.
        prefix: ``"eval"`` or ``"train"``.
        losses: which losses to draw.
        drop: True detects the drop on ``drop_column`` (default ``{prefix}_L_mask``); a
            :class:`~tfmatcomp.analyses.dynamics.DropResult` is drawn as given; False / None draws none.
            A found drop is marked by a dashed line at the drop step, a shaded 10-90% band and the
            fitted plateau-drop curve (dotted).

    Example:
        >>> import numpy as np, pandas as pd
        >>> df = pd.DataFrame({"step": [1, 2, 3], "eval_L": [1.0, 0.5, 0.2], "eval_L_obs": [0.1] * 3,
        ...                    "eval_L_mask": [2.0, 1.0, 0.5]})
        >>> loss_curve_figure(df, drop=False).layout.yaxis.type
        'log'
    """
    cols = [f"{prefix}_{name}" for name in losses]
    _check_metrics(metrics, ["step", *cols])
    df = metrics.sort_values("step")
    fig = go.Figure()
    for name, col in zip(losses, cols):
        fig.add_trace(go.Scatter(x=df["step"], y=df[col], mode="lines", name=name,
                                 line=dict(color=_LOSS_COLORS.get(name), width=1.5)))
    if drop is True:
        drop = detect_drop(df, column=drop_column or f"{prefix}_L_mask")
    if isinstance(drop, DropResult) and drop.params:
        if drop.has_drop:
            fig.add_trace(go.Scatter(x=df["step"], y=drop.curve(df["step"]), mode="lines",
                                     name=f"fit ({drop.column or 'loss'})",
                                     line=dict(color="black", dash="dot", width=1)))
        _mark_drop(fig, drop)
    fig.update_yaxes(type="log", title_text="MSE", exponentformat="power")
    fig.update_xaxes(title_text="step")
    subtitle = ""
    if isinstance(drop, DropResult):
        subtitle = (f" | drop at step {drop.drop_step:,.0f}, width {drop.drop_width:,.0f}, "
                    f"{drop.plateau_level:.3g} -> {drop.final_level:.3g}" if drop.has_drop
                    else " | no sudden drop")
    fig.update_layout(title=(title or f"{prefix} losses") + subtitle, template="plotly_white")
    return fig


def component_training_figure(
    df: pd.DataFrame,
    column: str = "eval_L_mask",
    *,
    mark_drops: bool = True,
    title: str | None = None,
) -> go.Figure:
    """One curve of ``column`` per component group (log scale), each group's drop step marked.

    Args:
        df: :func:`tfmatcomp.analyses.dynamics.component_training` output (``component`` and ``step``
            columns plus the metrics).
        column: the loss to draw (``eval_L_mask``, ``train_L``, ...).
        mark_drops: run :func:`~tfmatcomp.analyses.dynamics.detect_drop` per group and mark found drops.

    Example:
        >>> import pandas as pd
        >>> df = pd.DataFrame({"component": ["mlp"] * 3 + ["all"] * 3, "step": [1, 2, 3] * 2,
        ...                    "eval_L_mask": [0.3, 0.1, 0.05, 0.3, 0.2, 0.1]})
        >>> [t.name for t in component_training_figure(df, mark_drops=False).data]
        ['mlp', 'all']
    """
    _check_metrics(df, ["component", "step", column])
    fig = go.Figure()
    for i, (group, part) in enumerate(df.groupby("component", sort=False)):
        part = part.sort_values("step")
        color = _PALETTE[i % len(_PALETTE)]
        label = "all components" if group == "all" else str(group)
        fig.add_trace(go.Scatter(x=part["step"], y=part[column], mode="lines", name=str(group),
                                 legendgroup=str(group), line=dict(color=color, width=1.5),
                                 hovertemplate=f"{label}<br>step %{{x}}<br>{column} %{{y:.3g}}<extra></extra>"))
        if mark_drops and len(part) >= 8:
            drop = detect_drop(part, column=column)
            if drop.has_drop:
                fig.add_vline(x=drop.drop_step, line=dict(color=color, dash="dash", width=1))
    fig.update_yaxes(type="log", title_text=column, exponentformat="power")
    fig.update_xaxes(title_text="step")
    fig.update_layout(title=title or f"Component-wise training ({column}); others frozen at their trained values",
                      template="plotly_white")
    return fig


def seed_curves_figure(
    metrics: Mapping[int, pd.DataFrame],
    drops: Mapping[int, DropResult] | None = None,
    *,
    column: str = "eval_L_mask",
    highlight: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """Every seed's ``column`` (log scale) on one plot; a circle marks each detected onset.

    Args:
        metrics: ``{seed: metrics log}``.
        drops: ``{seed: DropResult}`` (default: detected here).
        highlight: a seed drawn thicker (the one a report analyses).

    Example:
        >>> import pandas as pd
        >>> logs = {s: pd.DataFrame({"step": [1, 2, 3], "eval_L_mask": [0.1, 0.1, 0.01]}) for s in (0, 1)}
        >>> [t.name for t in seed_curves_figure(logs, {}, highlight=1).data]
        ['seed 0', 'seed 1']
    """
    fig = go.Figure()
    for i, (seed, df) in enumerate(sorted(metrics.items())):
        _check_metrics(df, ["step", column])
        df = df.sort_values("step")
        color = _PALETTE[i % len(_PALETTE)]
        width = 3 if seed == highlight else 1.2
        fig.add_trace(go.Scatter(x=df["step"], y=df[column], mode="lines", name=f"seed {seed}",
                                 legendgroup=str(seed), line=dict(color=color, width=width)))
        drop = (drops or {}).get(seed) if drops is not None else detect_drop(df, column=column)
        if drop is not None and drop.has_drop:
            fig.add_trace(go.Scatter(x=[drop.drop_start], y=[drop.plateau_level], mode="markers",
                                     legendgroup=str(seed), showlegend=False,
                                     marker=dict(color=color, size=9, symbol="circle-open"),
                                     hovertemplate=f"seed {seed}: onset %{{x:,.0f}}<extra></extra>"))
    fig.update_yaxes(type="log", title_text=column, exponentformat="power")
    fig.update_xaxes(title_text="step")
    fig.update_layout(title=title or f"{column} of every seed (circles: detected onsets)",
                      template="plotly_white")
    return fig


def drop_steps_figure(drops: Mapping[int, DropResult], *, title: str | None = None) -> go.Figure:
    """The drop onsets of the seeds that dropped, one point per seed over a box plot; the seeds
    without a drop are counted in the title.

    Example:
        >>> import numpy as np
        >>> from tfmatcomp.analyses.dynamics import detect_drop
        >>> t = np.arange(0, 20_000, 50.0)
        >>> d = detect_drop(t, 10 ** (-2 + 1 / (1 + np.exp((t - 9_000) / 150))))
        >>> [round(x) for x in drop_steps_figure({0: d, 1: d}).data[0].x]
        [8670, 8670]
    """
    dropped = {s: d for s, d in sorted(drops.items()) if d.has_drop}
    onsets = [d.drop_start for d in dropped.values()]
    fig = go.Figure(go.Box(x=onsets, boxpoints="all", jitter=0.4, pointpos=0, name="onset",
                           text=[f"seed {s}" for s in dropped], orientation="h",
                           marker=dict(color=_PALETTE[0]), line=dict(color="#888")))
    missing = len(drops) - len(dropped)
    fig.update_xaxes(title_text="step at which L_mask leaves the plateau", rangemode="tozero")
    fig.update_layout(title=title or f"Drop onsets: {len(dropped)} of {len(drops)} seeds dropped"
                      + (f" ({missing} still on the plateau)" if missing else ""),
                      template="plotly_white", height=280)
    return fig


def measures_figure(
    table: pd.DataFrame,
    metrics: pd.DataFrame | None = None,
    *,
    measures: Sequence[str] | None = None,
    column: str = "eval_L_mask",
    drop: DropResult | bool | None = True,
    title: str | None = None,
) -> go.Figure:
    """Measures over training: ``L_mask`` on top (log scale), then one panel per measure, every
    panel with the drop band of :func:`~tfmatcomp.analyses.dynamics.detect_drop` shaded.

    Args:
        table: :func:`~tfmatcomp.analyses.dynamics.over_checkpoints` output (``seed``, ``step``,
            ``measure``, ``value``); one line per seed in each panel.
        metrics: the run's metrics log (``step`` and ``column``), e.g. ``read_metrics(run_dir)``:
            the top panel's ``L_mask`` curve and the drop detected on it. None: the top panel is
            the table's ``L_mask`` measure, if it has one, and no drop is detected.
        measures: which measures to draw (default: all of the table's but ``L_mask``).
        drop: True detects the drop on ``metrics[column]``; a DropResult is drawn as given;
            False / None draws no band.

    Example:
        >>> import pandas as pd
        >>> t = pd.DataFrame({"seed": 0, "step": [1, 2, 1, 2], "measure": ["L_mask", "L_mask", "a", "a"],
        ...                   "value": [0.1, 0.01, 0.2, 0.8]})
        >>> [tr.name for tr in measures_figure(t).data]
        ['L_mask (seed 0)', 'a (seed 0)']
    """
    _check_metrics(table, ["seed", "step", "measure", "value"])
    names = list(measures) if measures is not None else [
        m for m in dict.fromkeys(table["measure"]) if m != "L_mask"]
    unknown = [m for m in names if m not in set(table["measure"])]
    if unknown:
        raise ValueError(f"measures: {unknown} are not in the table; it has "
                         f"{sorted(set(table['measure']))}")
    fig = make_subplots(rows=len(names) + 1, cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        subplot_titles=[column if metrics is not None else "L_mask", *names])
    if metrics is not None:
        _check_metrics(metrics, ["step", column])
        log = metrics.sort_values("step")
        fig.add_trace(go.Scatter(x=log["step"], y=log[column], mode="lines", name=column,
                                 line=dict(color=_LOSS_COLORS["L_mask"], width=1.5)), row=1, col=1)
        if drop is True:
            drop = detect_drop(log, column=column) if len(log) >= 8 else None
    elif drop is True:
        drop = None
    seeds = sorted(set(table["seed"]))
    for panel, name in enumerate(["L_mask", *names] if metrics is None else names,
                                 start=1 if metrics is None else 2):
        part = table[table["measure"] == name]
        for i, seed in enumerate(seeds):
            rows = part[part["seed"] == seed].sort_values("step")
            if len(rows):
                fig.add_trace(go.Scatter(x=rows["step"], y=rows["value"], mode="lines+markers",
                                         name=f"{name} (seed {seed})", legendgroup=str(seed),
                                         line=dict(color=_PALETTE[i % len(_PALETTE)], width=1.5)),
                              row=panel, col=1)
    if isinstance(drop, DropResult) and drop.has_drop:
        for panel in range(1, len(names) + 2):
            fig.add_vrect(x0=drop.drop_start, x1=drop.drop_end, fillcolor="black", opacity=0.08,
                          line_width=0, row=panel, col=1)
    fig.update_yaxes(type="log", exponentformat="power", row=1, col=1)
    fig.update_xaxes(title_text="step", row=len(names) + 1, col=1)
    band = (f" | drop band {drop.drop_start:,.0f}-{drop.drop_end:,.0f}"
            if isinstance(drop, DropResult) and drop.has_drop else "")
    fig.update_layout(title=(title or "Measures over training") + band, template="plotly_white",
                      height=220 * (len(names) + 1), showlegend=len(seeds) > 1)
    return fig
