"""Figures for attention heads: attention grids, head-score heatmaps, head types, score evolution.

Layers and heads are shown with the papers' 1-based labels (``(2,1)`` = layer index 1, head 0 in
code); every title says so.

Example:
    >>> import torch
    >>> from tfmatcomp.analyses.heads import head_scores, classify_heads
    >>> p = torch.full((2, 3, 4, 4), 0.25)                      # 2 layers x 3 heads, uniform maps
    >>> fig = attention_grid_figure(p, table=classify_heads(head_scores(p, None, 2)))
    >>> len(fig.data)
    6
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from tfmatcomp.analyses.heads import HEAD_TYPES, HeadAnalysis, paper_label

__all__ = ["attention_grid_figure", "structured_mask_pairs_figure", "head_scores_figure",
           "head_types_figure", "head_score_evolution_figure"]


def _add_pattern(fig: go.Figure, pattern: Tensor, zmax: float, row: int, col: int) -> None:
    """One attention map (query down, key across) in the shared colour axis."""
    fig.add_trace(go.Heatmap(z=pattern.numpy(), zmin=0.0, zmax=zmax, coloraxis="coloraxis",
                             hovertemplate="query %{y}<br>key %{x}<br>p=%{z:.3f}<extra></extra>"),
                  row=row, col=col)
    fig.update_yaxes(autorange="reversed", showticklabels=False, row=row, col=col)
    fig.update_xaxes(showticklabels=False, row=row, col=col)


def _add_mask(fig: go.Figure, observed, n_rows: int | None, n_cols: int | None, row: int,
              col: int) -> None:
    """A mask as the matrix it masks: masked entries blue, observed white."""
    obs = torch.as_tensor(observed).reshape(-1)
    if n_rows is None:
        n_rows = int(round(obs.numel() ** 0.5))
    n_cols = n_cols or obs.numel() // n_rows
    if n_rows * n_cols != obs.numel():
        raise ValueError(f"observed: {obs.numel()} entries do not form a {n_rows}x{n_cols} matrix")
    fig.add_trace(go.Heatmap(z=obs.reshape(n_rows, n_cols).int().numpy(), zmin=0, zmax=1,
                             colorscale=[[0, "royalblue"], [1, "white"]], showscale=False,
                             hovertemplate="row %{y}<br>col %{x}<br>observed=%{z}<extra></extra>"),
                  row=row, col=col)
    fig.update_yaxes(autorange="reversed", row=row, col=col)


def attention_grid_figure(
    patterns,
    *,
    table: pd.DataFrame | None = None,
    observed=None,
    n_rows: int | None = None,
    n_cols: int | None = None,
    layers: Sequence[int] | None = None,
    zmax: float | None = None,
    title: str | None = None,
    panel_size: int = 150,
) -> go.Figure:
    """Layers x heads grid of (mean) attention maps, query on the y axis, key on the x axis.

    Args:
        patterns: ``[layer, head, query, key]`` tensor, or a :class:`~tfmatcomp.analyses.heads.HeadAnalysis`
            (its mean maps, classification table and structured mask are used).
        table: a :func:`~tfmatcomp.analyses.heads.classify_heads` table; each panel title then shows the type.
        observed: a single mask ``[pos]`` drawn in an extra panel (True = observed).
        n_rows, n_cols: matrix shape, for the mask panel (default: square).
        layers: 0-based layer index of each row of ``patterns`` (default ``0..L-1``).
        zmax: colour-scale maximum (default the largest probability shown).

    Example:
        >>> import torch
        >>> fig = attention_grid_figure(torch.eye(4).expand(1, 2, 4, 4), observed=torch.tensor([1, 0, 1, 1]).bool())
        >>> [a.text for a in fig.layout.annotations][:2]
        ['(1,1)', '(1,2)']
    """
    if isinstance(patterns, HeadAnalysis):
        table = patterns.table if table is None else table
        observed = patterns.observed if observed is None else observed
        n_rows = patterns.n_rows if n_rows is None else n_rows
        n_cols = patterns.n_cols if n_cols is None else n_cols
        if layers is None:
            layers = sorted(patterns.table["layer"].unique().tolist())
        patterns = patterns.mean_patterns
    p = torch.as_tensor(patterns).detach().to(torch.float64).cpu()
    if p.ndim != 4 or p.shape[-1] != p.shape[-2]:
        raise ValueError(f"patterns: expected [layer, head, query, key], got {tuple(p.shape)}")
    n_l, n_h = p.shape[:2]
    layers = list(range(n_l)) if layers is None else [int(l) for l in layers]
    if len(layers) != n_l:
        raise ValueError(f"layers: expected {n_l} layer indices, got {layers}")
    types = {}
    if table is not None:
        types = {(int(r.layer), int(r.head)): r.type for r in table.itertuples() if hasattr(r, "type")}
    titles = []
    for li, l in enumerate(layers):
        for h in range(n_h):
            t = paper_label(l, h)
            titles.append(f"{t} {types[(l, h)]}" if (l, h) in types else t)
    extra = observed is not None
    grid_rows = n_l + (1 if extra else 0)
    if extra:
        titles += ["mask (observed = 1)"] + [""] * (n_h - 1)
    height = panel_size * grid_rows + 80
    # room for each row's panel titles (about 30 px), so they never sit on the row above
    fig = make_subplots(rows=grid_rows, cols=n_h, subplot_titles=titles,
                        horizontal_spacing=0.02,
                        vertical_spacing=min(0.3, max(0.06 / max(1, grid_rows / 4),
                                                      30 / height)))
    zmax = float(p.max()) if zmax is None else zmax
    for li in range(n_l):
        for h in range(n_h):
            _add_pattern(fig, p[li, h], zmax, li + 1, h + 1)
    if extra:
        _add_mask(fig, observed, n_rows, n_cols, grid_rows, 1)
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=0, cmax=zmax),
                      title=title or "Mean attention maps (layer, head), 1-based as in the papers",
                      height=height, width=panel_size * n_h + 160)
    return fig


def structured_mask_pairs_figure(
    row: HeadAnalysis,
    column: HeadAnalysis,
    *,
    zmax: float | None = None,
    title: str | None = None,
    panel_size: int = 120,
) -> go.Figure:
    """Every head's mean attention under a row mask and under a column mask, side by side.

    The top row shows the two masks (blue = masked); below, one row per layer holds each head's
    pair: its map under the row mask (``R``) then under the column mask (``C``), titled with the
    papers' 1-based label and the type each mask's classification assigns (the NeurIPS paper Sec. 3.2,
    Figs. 5 and 23: masked-row, observed-copy, mask-ignore and longest-contiguous-column heads
    show themselves by how their maps move with the mask).

    Args:
        row, column: :func:`~tfmatcomp.analyses.heads.analyse_heads` results of one model with a fixed row
            mask and a fixed column mask (``observed=`` from :mod:`tfmatcomp.task.masks`).
        zmax: colour-scale maximum (default the largest probability shown).

    Example:
        >>> import torch
        >>> from tfmatcomp import EncoderConfig, HookedEncoder, MatrixCompletionTask
        >>> from tfmatcomp.analyses.heads import analyse_heads
        >>> from tfmatcomp.task.masks import column_mask, row_mask
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9))
        >>> task = MatrixCompletionTask(n_rows=3, rank=1)
        >>> r = analyse_heads(m, task, 4, observed=row_mask(3, masked_rows=[1], keep=0))
        >>> c = analyse_heads(m, task, 4, observed=column_mask(3, masked_cols=[1], keep=0))
        >>> fig = structured_mask_pairs_figure(r, c)
        >>> [a.text for a in fig.layout.annotations][:4]
        ['row mask', 'column mask', '(1,1) R uniform', '(1,1) C uniform']
    """
    for name, a in (("row", row), ("column", column)):
        if not isinstance(a, HeadAnalysis) or a.observed is None:
            raise ValueError(f"{name}: expected an analyse_heads result with a fixed structured "
                             f"mask (observed=...), got {type(a).__name__}")
    if row.mean_patterns.shape != column.mean_patterns.shape:
        raise ValueError(f"row, column: the analyses differ in shape ({tuple(row.mean_patterns.shape)}"
                         f" vs {tuple(column.mean_patterns.shape)}); analyse one model twice")
    pr, pc = (torch.as_tensor(a.mean_patterns).detach().to(torch.float64).cpu() for a in (row, column))
    n_l, n_h = pr.shape[:2]
    layers = sorted(row.table["layer"].unique().tolist())
    types = [{(int(r.layer), int(r.head)): r.type for r in a.table.itertuples()} for a in (row, column)]
    titles = ["row mask", "column mask"]
    for l in layers:
        for h in range(n_h):
            titles += [f"{paper_label(l, h)} {side} {t.get((l, h), '')}".rstrip()
                       for side, t in zip("RC", types)]
    specs = [[{}, {}] + [None] * (2 * n_h - 2)] + [[{}] * (2 * n_h) for _ in range(n_l)]
    fig = make_subplots(rows=n_l + 1, cols=2 * n_h, specs=specs, subplot_titles=titles,
                        horizontal_spacing=0.012, vertical_spacing=0.08 / max(1, (n_l + 1) / 4))
    _add_mask(fig, row.observed, row.n_rows, row.n_cols, 1, 1)
    _add_mask(fig, column.observed, column.n_rows, column.n_cols, 1, 2)
    zmax = float(max(pr.max(), pc.max())) if zmax is None else zmax
    for li in range(n_l):
        for h in range(n_h):
            _add_pattern(fig, pr[li, h], zmax, li + 2, 2 * h + 1)
            _add_pattern(fig, pc[li, h], zmax, li + 2, 2 * h + 2)
    fig.update_annotations(font_size=10)
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=0, cmax=zmax),
                      title=title or "Heads under a row mask (R) and a column mask (C), pairwise "
                                     "(layer, head) 1-based",
                      height=panel_size * (n_l + 1) + 100, width=panel_size * 2 * n_h + 160)
    return fig


def _grid(table: pd.DataFrame, column: str):
    layers = sorted(table["layer"].unique().tolist())
    heads = sorted(table["head"].unique().tolist())
    z = [[None] * len(heads) for _ in layers]
    for r in table.itertuples():
        z[layers.index(int(r.layer))][heads.index(int(r.head))] = getattr(r, column)
    return layers, heads, z


def head_scores_figure(table: pd.DataFrame, scores: Sequence[str] = ("row", "column", "identity",
                       "observed_copy", "masked_row", "longest_contiguous_column", "mask_ignore",
                       "static"), *, title: str | None = None) -> go.Figure:
    """One layers x heads heatmap per score (rows = layers, columns = heads, 1-based labels).

    Example:
        >>> import torch
        >>> from tfmatcomp.analyses.heads import head_scores
        >>> fig = head_scores_figure(head_scores(torch.eye(4).expand(2, 3, 4, 4), None, 2), ["row", "identity"])
        >>> len(fig.data)
        2
    """
    missing = [s for s in scores if s not in table]
    if missing:
        raise ValueError(f"scores: {missing} are not columns of the table; choose from "
                         f"{[c for c in table.columns if c not in ('layer', 'head', 'paper_label')]}")
    fig = make_subplots(rows=1, cols=len(scores), subplot_titles=list(scores), horizontal_spacing=0.03)
    for i, s in enumerate(scores):
        layers, heads, z = _grid(table, s)
        fig.add_trace(go.Heatmap(z=z, x=[h + 1 for h in heads], y=[l + 1 for l in layers],
                                 coloraxis="coloraxis", text=[[f"{v:.2f}" if v == v and v is not None
                                                               else "" for v in row] for row in z],
                                 texttemplate="%{text}",
                                 hovertemplate="layer %{y}, head %{x}<br>%{z:.3f}<extra>" + s + "</extra>"),
                      row=1, col=i + 1)
        fig.update_yaxes(autorange="reversed", dtick=1, row=1, col=i + 1,
                         title_text="layer (1-based)" if i == 0 else None)
        fig.update_xaxes(dtick=1, title_text="head (1-based)", row=1, col=i + 1)
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=-0.0, cmax=1.0),
                      title=title or "Head scores", width=max(400, 260 * len(scores)), height=380)
    return fig


def head_types_figure(table: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Layers x heads map of the assigned head ``type`` (from :func:`~tfmatcomp.analyses.heads.classify_heads`).

    Example:
        >>> import torch
        >>> from tfmatcomp.analyses.heads import head_scores, classify_heads
        >>> t = classify_heads(head_scores(torch.eye(4).expand(1, 2, 4, 4), None, 2))
        >>> head_types_figure(t).data[0].text[0][0]
        'identity'
    """
    if "type" not in table:
        raise ValueError("table: needs a 'type' column; pass classify_heads(...) output")
    layers, heads, names = _grid(table, "type")
    z = [[HEAD_TYPES.index(n) if n in HEAD_TYPES else len(HEAD_TYPES) for n in row] for row in names]
    n = len(HEAD_TYPES)
    palette = ["#dddddd", "#1f77b4", "#17becf", "#d62728", "#9467bd", "#2ca02c", "#ff7f0e",
               "#8c564b", "#bcbd22", "#e377c2", "#7f7f7f"]
    scale = []
    for i, c in enumerate(palette[:n]):
        scale += [[i / n, c], [(i + 1) / n, c]]
    fig = go.Figure(go.Heatmap(z=z, x=[h + 1 for h in heads], y=[l + 1 for l in layers], text=names,
                               texttemplate="%{text}", zmin=0, zmax=n, colorscale=scale, showscale=False,
                               hovertemplate="layer %{y}, head %{x}: %{text}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", dtick=1, title_text="layer (1-based)")
    fig.update_xaxes(dtick=1, title_text="head (1-based)")
    fig.update_layout(title=title or "Head types", width=max(400, 110 * len(heads)),
                      height=max(300, 70 * len(layers) + 150))
    return fig


def head_score_evolution_figure(evolution: pd.DataFrame, score: str = "row", *,
                                heads: Sequence[str] | Sequence[tuple[int, int]] | None = None,
                                title: str | None = None) -> go.Figure:
    """One line per head of ``score`` against training step (from
    :func:`~tfmatcomp.analyses.heads.head_score_evolution`).

    Args:
        heads: restrict to these heads: paper labels like ``"(2,1)"`` or 0-based ``(layer, head)``
            tuples; all when None.

    Example:
        >>> import pandas as pd
        >>> ev = pd.DataFrame({"step": [0, 0, 10, 10], "layer": [0, 0, 0, 0], "head": [0, 1, 0, 1],
        ...                    "paper_label": ["(1,1)", "(1,2)"] * 2, "row": [0.1, 0.2, 0.8, 0.3]})
        >>> [t.name for t in head_score_evolution_figure(ev, "row").data]
        ['(1,1)', '(1,2)']
    """
    if score not in evolution:
        raise ValueError(f"score: {score!r} is not a column of the evolution table")
    df = evolution
    if heads is not None:
        labels = {h if isinstance(h, str) else paper_label(*h) for h in heads}
        df = df[df["paper_label"].isin(labels)]
    fig = go.Figure()
    for label, g in df.sort_values("step").groupby("paper_label", sort=False):
        fig.add_trace(go.Scatter(x=g["step"], y=g[score], mode="lines+markers", name=str(label)))
    fig.data = tuple(sorted(fig.data, key=lambda t: tuple(int(v) for v in t.name.strip("()").split(","))))
    fig.update_layout(title=title or f"Head score '{score}' across training (heads 1-based)",
                      xaxis_title="step", yaxis_title=score, legend_title="(layer, head)")
    return fig
