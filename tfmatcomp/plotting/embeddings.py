"""Figures for token and positional embeddings (the workshop paper Figs. 4, 7, 8; the NeurIPS paper Fig. 7, App. C).

Positions, rows and columns are 0-based in hover text and axes, and the axis titles say so.

Example:
    >>> from tfmatcomp import HookedEncoder, EncoderConfig
    >>> from tfmatcomp.analyses.embeddings import token_embedding_norms
    >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
    >>> token_norms_figure(token_embedding_norms(m, v_min=-0.1, v_max=0.1)).layout.xaxis.title.text
    'value'
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tfmatcomp.analyses.embeddings import PositionalPCA, TokenEmbeddingPCA

__all__ = ["token_norms_figure", "token_pca_figure", "positional_norms_figure",
           "positional_pca_figure", "checkpoint_projection_figure"]


def _need(df: pd.DataFrame, cols, name: str) -> None:
    missing = [c for c in cols if c not in df]
    if missing:
        raise ValueError(f"{name}: missing columns {missing}")


def token_norms_figure(norms: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """l2 norm of token embeddings against the value (from
    :func:`~tfmatcomp.analyses.embeddings.token_embedding_norms`), with the mirror image ``norm(-v)`` dashed
    so asymmetry about 0 is visible.

    Example:
        >>> import pandas as pd
        >>> fig = token_norms_figure(pd.DataFrame({"value": [-1.0, 0.0, 1.0], "norm": [2.0, 1.0, 2.0]}))
        >>> [t.name for t in fig.data]
        ['norm(v)', 'norm(-v)']
    """
    _need(norms, ["value", "norm"], "norms")
    df = norms.sort_values("value")
    fig = go.Figure([
        go.Scatter(x=df["value"], y=df["norm"], mode="lines", name="norm(v)"),
        go.Scatter(x=-df["value"], y=df["norm"], mode="lines", name="norm(-v)",
                   line=dict(dash="dash")),
    ])
    fig.update_layout(title=title or "Token embedding l2 norm", xaxis_title="value",
                      yaxis_title="||W_E[token(value)]||")
    return fig


def token_pca_figure(result: TokenEmbeddingPCA, *, x_pc: int | None = None, y_pc: int | None = None,
                     title: str | None = None) -> go.Figure:
    """Token embeddings on two principal components, coloured by value.

    By default x is the component most correlated with ``|value|`` and y the one most correlated
    with ``sign(value)`` (the papers' Fig. 7b layout); ``x_pc`` / ``y_pc`` (1-based) override.

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> from tfmatcomp.analyses.embeddings import token_embedding_pca
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> fig = token_pca_figure(token_embedding_pca(m, v_min=-0.2, v_max=0.2))
        >>> fig.layout.xaxis.title.text.startswith("PC")
        True
    """
    corr = result.correlations.set_index("pc")
    n = len(corr)
    x_pc = x_pc or result.magnitude_axis + 1
    y_pc = y_pc or result.sign_axis + 1
    if x_pc == y_pc:
        y_pc = next(k for k in range(1, n + 1) if k != x_pc) if n > 1 else x_pc
    for name, k in (("x_pc", x_pc), ("y_pc", y_pc)):
        if not 1 <= k <= n:
            raise ValueError(f"{name}: must be in [1, {n}] (1-based component), got {k}")

    def label(k):
        c = corr.loc[k]
        return (f"PC{k} ({100 * c['explained_variance_ratio']:.1f}% var; corr |v| "
                f"{c['corr_magnitude']:+.2f}, sign {c['corr_sign']:+.2f})")

    t = result.table
    fig = go.Figure(go.Scatter(
        x=t[f"pc{x_pc}"], y=t[f"pc{y_pc}"], mode="markers", text=t["value"],
        marker=dict(color=t["value"], colorscale="RdBu", colorbar=dict(title="value"), size=6),
        hovertemplate="value %{text}<extra></extra>"))
    fig.update_layout(title=title or "PCA of token embeddings", xaxis_title=label(x_pc),
                      yaxis_title=label(y_pc))
    return fig


def positional_norms_figure(norms: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """l2 norm of positional embeddings per position (from
    :func:`~tfmatcomp.analyses.embeddings.positional_embedding_norms`); hover shows (row, col).

    Example:
        >>> import pandas as pd
        >>> df = pd.DataFrame({"position": [0, 1], "row": [0, 0], "col": [0, 1], "norm": [1.0, 2.0]})
        >>> positional_norms_figure(df).data[0].type
        'bar'
    """
    _need(norms, ["position", "row", "col", "norm"], "norms")
    fig = go.Figure(go.Bar(x=norms["position"], y=norms["norm"],
                           customdata=norms[["row", "col"]].to_numpy(),
                           marker=dict(color=norms["row"], colorscale="Viridis"),
                           hovertemplate="position %{x} (row %{customdata[0]}, col %{customdata[1]})"
                                         "<br>norm %{y:.3f}<extra></extra>"))
    fig.update_layout(title=title or "Positional embedding l2 norm (colour = row)",
                      xaxis_title="position (0-based, row-major)", yaxis_title="||W_pos[position]||")
    return fig


def positional_pca_figure(result: PositionalPCA, *, title: str | None = None) -> go.Figure:
    """Positional embeddings on their top-2 principal components, twice: coloured by row (left)
    and by column (right); each point is labelled ``row,col`` (0-based).

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> from tfmatcomp.analyses.embeddings import positional_embedding_pca
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> len(positional_pca_figure(positional_embedding_pca(m, 2)).data)
        4
    """
    t = result.table
    sim = result.similarity
    fig = make_subplots(rows=1, cols=2, subplot_titles=["coloured by row", "coloured by column"])
    text = [f"{r},{c}" for r, c in zip(t["row"], t["col"])]
    t = t.assign(text=text)
    for col_i, key in enumerate(("row", "col")):
        for value, g in t.groupby(key):
            fig.add_trace(go.Scatter(x=g["pc1"], y=g["pc2"], mode="markers+text", text=g["text"],
                                     textposition="top center", name=f"{key} {value}",
                                     legendgroup=key, marker=dict(size=9)),
                          row=1, col=col_i + 1)
    ev = result.pca.explained_variance_ratio
    for c in (1, 2):
        fig.update_xaxes(title_text=f"PC1 ({100 * float(ev[0]):.1f}%)", row=1, col=c)
        fig.update_yaxes(title_text=f"PC2 ({100 * float(ev[1]):.1f}%)" if len(ev) > 1 else "", row=1, col=c)
    fig.update_layout(title=title or (f"PCA of positional embeddings (0-based row,col); mean cos: "
                                      f"same row {sim['same_row']:.2f}, same col {sim['same_col']:.2f}, "
                                      f"other {sim['other']:.2f}"), width=1000, height=480)
    return fig


def checkpoint_projection_figure(projection: pd.DataFrame, *, max_cols: int = 4,
                                 title: str | None = None) -> go.Figure:
    """Token embeddings of each checkpoint on the final checkpoint's PC1 / PC2, one panel per step,
    coloured by value (from :func:`~tfmatcomp.analyses.embeddings.checkpoint_token_projection`).

    Example:
        >>> import pandas as pd
        >>> df = pd.DataFrame({"step": [0, 0, 9, 9], "value": [-1, 1, -1, 1], "pc1": [0, 0, -1, 1],
        ...                    "pc2": [0, 0, 1, 1], "distance_to_final": [1.0, 1.0, 0.0, 0.0]})
        >>> len(checkpoint_projection_figure(df).data)
        2
    """
    _need(projection, ["step", "value", "pc1", "pc2"], "projection")
    steps = sorted(projection["step"].unique().tolist())
    n_cols = min(max_cols, len(steps))
    n_rows = math.ceil(len(steps) / n_cols)
    titles = []
    for s in steps:
        d = projection.loc[projection.step == s, "distance_to_final"].iloc[0] \
            if "distance_to_final" in projection else None
        titles.append(f"step {s}" + (f" (dist {d:.2f})" if d is not None else ""))
    fig = make_subplots(rows=n_rows, cols=n_cols, subplot_titles=titles, shared_xaxes=True,
                        shared_yaxes=True)
    vmax = float(projection["value"].abs().max()) or 1.0
    for i, s in enumerate(steps):
        g = projection[projection.step == s]
        fig.add_trace(go.Scatter(x=g["pc1"], y=g["pc2"], mode="markers", text=g["value"],
                                 marker=dict(color=g["value"], colorscale="RdBu", cmin=-vmax, cmax=vmax,
                                             size=5, showscale=i == 0),
                                 name=f"step {s}", hovertemplate="value %{text}<extra></extra>"),
                      row=i // n_cols + 1, col=i % n_cols + 1)
    fig.update_layout(title=title or "Token embeddings on the final checkpoint's PC1 / PC2",
                      showlegend=False, height=320 * n_rows + 80, width=300 * n_cols + 120)
    return fig
