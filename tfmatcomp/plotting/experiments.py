"""Figures for the causal experiments: the per-head ablation scan, patching, and loss comparisons.

Layers and heads are labelled with the papers' **1-based** convention (``L1``, ``H1``); the tables
they draw are 0-based, and every title says which convention it shows.

Example:
    >>> import pandas as pd
    >>> scan = pd.DataFrame([[0.01, 0.0], [0.2, 0.03]])
    >>> fig = head_scan_heatmap(scan)
    >>> list(fig.data[0].y), list(fig.data[0].x)
    (['L1', 'L2'], ['H1', 'H2'])
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

__all__ = ["head_scan_heatmap", "patching_figure", "patching_head_heatmap", "loss_bars_figure"]


def head_scan_heatmap(scan: pd.DataFrame, *, title: str | None = None, text: bool = True) -> go.Figure:
    """Heatmap of a :func:`~tfmatcomp.experiments.head_ablation_scan` table (one model).

    Args:
        scan: layers x heads table (0-based index / columns), e.g. the change in ``L_mask``.
        title: figure title (default: from ``scan.attrs``).
        text: write the values in the cells.

    Example:
        >>> import pandas as pd
        >>> head_scan_heatmap(pd.DataFrame([[1.0, -1.0]])).data[0].zmid
        0.0
    """
    if isinstance(scan.index, pd.MultiIndex):
        raise ValueError("scan: pass the table of one model (e.g. scan.loc['post-shift'])")
    z = scan.to_numpy(dtype=float)
    value = scan.attrs.get("value", "change when the head is ablated")
    base = scan.attrs.get("baseline")
    default = f"Per-head ablation: {value}"
    if isinstance(base, (int, float)):
        default += f" (baseline {base:.3g})"
    fig = go.Figure(go.Heatmap(
        z=z, x=[f"H{h + 1}" for h in scan.columns], y=[f"L{l + 1}" for l in scan.index],
        colorscale="RdBu_r", zmid=0.0, colorbar=dict(title="delta"),
        text=np.vectorize(lambda v: f"{v:.2g}")(z) if text and z.size else None,
        texttemplate="%{text}" if text else None,
        hovertemplate="layer %{y}, head %{x} (1-based)<br>delta %{z:.4g}<extra></extra>"))
    fig.update_layout(title=(title or default) + "<br><sup>layers and heads 1-based, as in the papers"
                      "</sup>", xaxis_title="head", yaxis_title="layer",
                      yaxis=dict(autorange="reversed"), width=120 + 70 * max(1, z.shape[1]),
                      height=200 + 50 * max(1, z.shape[0]))
    return fig


def patching_figure(table: pd.DataFrame, *, entries: str = "masked", model: str | None = None,
                    title: str | None = None) -> go.Figure:
    """Grouped bars of ``MSE(f_p, X)`` and ``MSE(f_p, -X)`` per patched layer set, from
    :func:`~tfmatcomp.experiments.activation_patching` (layers 0-based, as in the table).

    Example:
        >>> import pandas as pd
        >>> t = pd.DataFrame({"model": "m", "patched": ["none", "all"], "entries": "masked",
        ...                   "mse_to_X": [0.9, 0.1], "mse_to_neg_X": [0.0, 0.8]})
        >>> [bar.name for bar in patching_figure(t).data]
        ['MSE(f_p, X)', 'MSE(f_p, -X)']
    """
    t = _patching_rows(table, entries, model)
    if "head" in t:  # per-head rows are drawn by patching_head_heatmap
        t = t[t["head"].isna()]
    fig = go.Figure([go.Bar(x=t["patched"], y=t["mse_to_X"], name="MSE(f_p, X)"),
                     go.Bar(x=t["patched"], y=t["mse_to_neg_X"], name="MSE(f_p, -X)")])
    fig.update_layout(barmode="group", yaxis_title="MSE", xaxis_title="patched layers (0-based)",
                      title=title or f"Activation patching X -> -X, {entries} entries")
    return fig


def _patching_rows(table: pd.DataFrame, entries: str, model: str | None) -> pd.DataFrame:
    if entries not in ("masked", "observed"):
        raise ValueError(f"entries: must be 'masked' or 'observed', got {entries!r}")
    t = table[table["entries"] == entries]
    if model is not None:
        t = t[t["model"] == model]
    elif t["model"].nunique() > 1:
        raise ValueError(f"model: the table holds several models {sorted(t['model'].unique())}; pick one")
    return t


def patching_head_heatmap(table: pd.DataFrame, *, entries: str = "masked", model: str | None = None,
                          value: str = "mse_to_X", title: str | None = None) -> go.Figure:
    """Layers x heads heatmap of the per-head rows of
    :func:`~tfmatcomp.experiments.activation_patching` (``per_head=True``): ``value`` with one
    head patched minus ``value`` unpatched (negative ``mse_to_X``: that head alone moves the run
    on ``-X`` towards ``X``). Labels 1-based, as :func:`head_scan_heatmap`.

    Example:
        >>> import pandas as pd
        >>> t = pd.DataFrame({"model": "m", "entries": "masked", "patched": ["none", "head (0, 0)",
        ...                   "head (0, 1)"], "layer": [None, 0, 0], "head": [None, 0, 1],
        ...                   "mse_to_X": [0.5, 0.2, 0.5], "mse_to_neg_X": [0.1, 0.3, 0.1]})
        >>> patching_head_heatmap(t).data[0].z.tolist()
        [[-0.3, 0.0]]
    """
    t = _patching_rows(table, entries, model)
    if value not in ("mse_to_X", "mse_to_neg_X"):
        raise ValueError(f"value: must be 'mse_to_X' or 'mse_to_neg_X', got {value!r}")
    if "head" not in t or t["head"].isna().all():
        raise ValueError("table: has no per-head rows; run activation_patching(..., per_head=True)")
    base = t.loc[t["patched"] == "none", value]
    if len(base) != 1:
        raise ValueError("table: needs exactly one unpatched ('none') row per model and entry kind")
    heads = t[t["head"].notna()]
    grid = heads.pivot_table(index="layer", columns="head", values=value, aggfunc="first")
    grid = (grid - float(base.iloc[0])).round(12)
    grid.index = [int(i) for i in grid.index]
    grid.columns = [int(c) for c in grid.columns]
    grid.attrs.update(value=f"{value}(head patched) - {value}(unpatched)",
                      baseline=float(base.iloc[0]))
    return head_scan_heatmap(grid, title=title or f"Per-head patching X -> -X, {entries} entries: "
                             f"{value} with one head patched minus unpatched ({float(base.iloc[0]):.3g})")


def loss_bars_figure(table: pd.DataFrame, *, x: str = "condition", metric: str = "L_mask",
                     color: str = "model", log: bool = True, title: str | None = None) -> go.Figure:
    """Bars of ``metric`` per ``x`` value, one colour per ``color`` value, with the papers' value (if
    the table has a ``paper_4l8h_<metric>`` column) as black markers.

    Example:
        >>> import pandas as pd
        >>> t = pd.DataFrame({"model": "m", "condition": ["baseline", "ablated"], "L_mask": [0.01, 0.2],
        ...                   "paper_4l8h_L_mask": [0.0128, 0.2183]})
        >>> [trace.type for trace in loss_bars_figure(t).data]
        ['bar', 'scatter']
    """
    if metric not in table:
        raise ValueError(f"metric: {metric!r} is not a column of the table ({list(table.columns)})")
    groups = table[color].unique() if color in table else [None]
    traces: list = []
    for g in groups:
        t = table if g is None else table[table[color] == g]
        traces.append(go.Bar(x=t[x].astype(str), y=t[metric], name=str(g) if g is not None else metric))
    paper = f"paper_4l8h_{metric}"
    if paper in table and table[paper].notna().any():
        t = table[table[paper].notna()]
        traces.append(go.Scatter(x=t[x].astype(str), y=t[paper], mode="markers", name="paper (4L8H 7x7)",
                                 marker=dict(color="black", symbol="diamond", size=10)))
    fig = go.Figure(traces)
    fig.update_layout(barmode="group", yaxis_title=metric, xaxis_title=x, title=title or metric,
                      yaxis_type="log" if log else "linear")
    return fig
