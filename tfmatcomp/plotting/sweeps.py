"""Figures of a sweep (:func:`tfmatcomp.sweep`): final L_mask and the drop step against the swept
value, the papers' width and depth figures (the NeurIPS paper, Figs. 13 and 14) as two panels.

Example:
    >>> import pandas as pd
    >>> table = pd.DataFrame({"d_model": [32, 32, 64, 64], "seed": [0, 1, 0, 1],
    ...                       "final_L_mask": [0.1, 0.09, 0.02, 0.03],
    ...                       "drop_step": [float("nan"), 900.0, 500.0, 600.0]})
    >>> fig = sweep_figure(table, "d_model")
    >>> [t.name for t in fig.data]
    ['final L_mask', 'median', 'drop step', 'median']
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["sweep_figure"]

_PALETTE = ["#5778A4", "#E49444", "#D1615D", "#85B6B2", "#6A9F58", "#E7CA60", "#A87C9F", "#967662"]


def sweep_figure(table: pd.DataFrame, x: str, *, color: str | None = None,
                 title: str | None = None) -> go.Figure:
    """Final L_mask (log scale, left) and the drop step (right) against ``x``: one point per seed,
    a line through the medians; seeds without a detected drop are left out of the right panel and
    counted in its title.

    Args:
        table: :attr:`tfmatcomp.training.sweeps.SweepResult.table` (columns ``x``, ``final_L_mask``,
            ``drop_step``, and ``color`` when given).
        x: the swept field on the horizontal axis (log scale when its values are positive
            numbers spanning 8x or more, as widths do).
        color: a second swept field: one series per value of it.
    """
    needed = [x, "final_L_mask", "drop_step"] + ([color] if color else [])
    if not isinstance(table, pd.DataFrame) or any(c not in table.columns for c in needed):
        have = list(table.columns) if isinstance(table, pd.DataFrame) else type(table).__name__
        raise ValueError(f"table: needs the columns {needed}; got {have}")
    no_drop = int(table["drop_step"].isna().sum())
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "final L_mask", "drop step" + (f" ({no_drop} of {len(table)} runs without a drop)"
                                       if no_drop else "")))
    groups = table.groupby(color, sort=True) if color else [(None, table)]
    for i, (value, part) in enumerate(groups):
        c = _PALETTE[i % len(_PALETTE)]
        label = f"{color}={value}" if color else None
        for col, (column, name) in enumerate([("final_L_mask", "final L_mask"),
                                              ("drop_step", "drop step")], start=1):
            points = part.dropna(subset=[column]).sort_values(x)
            medians = points.groupby(x, sort=True)[column].median()
            fig.add_trace(go.Scatter(x=points[x], y=points[column], mode="markers",
                                     name=label or name, legendgroup=label or name,
                                     showlegend=col == 1 or not color, marker=dict(color=c, size=7),
                                     text=[f"seed {s}" for s in points.get("seed", [])]),
                          row=1, col=col)
            fig.add_trace(go.Scatter(x=medians.index, y=medians.values, mode="lines",
                                     name="median", legendgroup=label or name, showlegend=False,
                                     line=dict(color=c, width=1.5)), row=1, col=col)
    values = pd.to_numeric(table[x], errors="coerce")
    if values.notna().all() and (values > 0).all() and values.max() >= 8 * values.min():
        fig.update_xaxes(type="log")
    fig.update_xaxes(title_text=x)
    fig.update_yaxes(type="log", exponentformat="power", title_text="L_mask", row=1, col=1)
    fig.update_yaxes(title_text="step", rangemode="tozero", row=1, col=2)
    fig.update_layout(title=title or f"Sweep over {x}" + (f" and {color}" if color else ""),
                      template="plotly_white")
    return fig
