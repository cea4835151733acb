"""Figures of ``tfmatcomp geometry`` (Song & Zhong on any model): per-layer measurements with the paper's
values, similarity by document, rotated ``W_QK`` per head (Fig. 5), and the two theorems measured.

Example:
    >>> import pandas as pd
    >>> df = pd.DataFrame({"layer": [0, 1], "rank_estimate": [3, 2], "stable_rank": [1.5, 1.2],
    ...                    "relative_norm": [0.3, 0.2], "incoherence_max": [0.1, 0.2],
    ...                    "inter_similarity": [0.1, 0.1], "intra_similarity": [0.3, 0.4]})
    >>> type(layer_measurements_figure(df)).__name__
    'Figure'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

__all__ = ["layer_measurements_figure", "label_similarity_figure", "rotated_wqk_figure",
           "theorem1_figure", "theorem2_figure", "induction_figure"]

_PANELS = (("rank_estimate", "ScreeNOT rank of pos"), ("stable_rank", "stable rank of pos"),
           ("relative_norm", "relative norm of pos"), ("incoherence_max", "incoherence (max |cos|)"),
           ("intra_similarity", "ctx similarity (intra: solid, inter: dashed)"))


def layer_measurements_figure(table: pd.DataFrame, paper: Mapping[str, Mapping[str, Sequence[float]]]
                              | None = None, *, title: str | None = None) -> go.Figure:
    """Table 1's measurements per layer (ours: lines), with the paper's per-layer values (Tables 3-4)
    or layer means (Table 1, dotted lines) for the models in ``paper``: ``{model: {column: values}}``
    where ``values`` has one entry per layer or a single mean."""
    fig = make_subplots(rows=1, cols=len(_PANELS), subplot_titles=[t for _, t in _PANELS])
    colors = ["#888", "#D1615D", "#6A9F58"]
    for j, (col, _) in enumerate(_PANELS):
        fig.add_trace(go.Scatter(x=table["layer"], y=table[col], mode="lines+markers", name="ours",
                                 legendgroup="ours", showlegend=j == 0, line=dict(color="royalblue")),
                      row=1, col=j + 1)
        if col == "intra_similarity":
            fig.add_trace(go.Scatter(x=table["layer"], y=table["inter_similarity"], mode="lines+markers",
                                     name="ours (inter)", showlegend=False,
                                     line=dict(color="royalblue", dash="dash")), row=1, col=j + 1)
        for i, (model, values) in enumerate((paper or {}).items()):
            v = values.get(col)
            if v is None:
                continue
            v = list(v)
            x = list(range(len(v))) if len(v) > 1 else [table["layer"].min(), table["layer"].max()]
            y = v if len(v) > 1 else v * 2
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{model} (paper)",
                                     legendgroup=model, showlegend=j == 0 or col == "rank_estimate",
                                     line=dict(color=colors[i % 3], dash="dot")), row=1, col=j + 1)
        fig.update_xaxes(title_text="layer", row=1, col=j + 1)
    fig.update_layout(title=title or "Table 1 per layer: ours (blue) and the paper's (dotted)",
                      height=340, width=260 * len(_PANELS))
    return fig


def label_similarity_figure(matrices: Mapping[str, Tensor], names: Sequence[str], *,
                            title: str | None = None) -> go.Figure:
    """Heatmaps of mean cosine between documents' context vectors, one panel per layer."""
    fig = make_subplots(rows=1, cols=len(matrices), subplot_titles=list(matrices))
    for j, m in enumerate(matrices.values()):
        fig.add_trace(go.Heatmap(z=m.numpy(), x=list(names), y=list(names), zmin=-1, zmax=1,
                                 colorscale="RdBu_r", showscale=j == 0), row=1, col=j + 1)
        fig.update_yaxes(autorange="reversed", showticklabels=j == 0, row=1, col=j + 1)
    fig.update_layout(title=title or "Context similarity by document (mean cosine of ctx)",
                      height=360, width=max(420, 260 * len(matrices)))
    return fig


def rotated_wqk_figure(rotated: Sequence, *, K: int = 40, layer: int | None = None,
                       title: str | None = None) -> go.Figure:
    """Per head: ``diag(W)`` (red) and the denoised rotated off-diagonal ``W`` (top-left ``K x K``, Fig. 5)."""
    n = len(rotated)
    fig = make_subplots(rows=2, cols=n, subplot_titles=[f"head {h}" for h in range(n)],
                        vertical_spacing=0.08)
    for h, r in enumerate(rotated):
        k = min(K, r.denoised.shape[0])
        fig.add_trace(go.Scatter(y=r.diagonal.cpu().numpy(), mode="lines", showlegend=False,
                                 line=dict(color="crimson", width=1)), row=1, col=h + 1)
        fig.add_trace(go.Heatmap(z=r.denoised[:k, :k].abs().cpu().numpy(), colorscale="Blues",
                                 showscale=False), row=2, col=h + 1)
        fig.update_yaxes(autorange="reversed", row=2, col=h + 1)
    where = f" of layer {layer} (0-based)" if layer is not None else ""
    fig.update_layout(title=title or f"W_QK{where}: diagonal (red) and |rotated off-diagonal| in the "
                      "positional basis after denoising (blue)", height=480, width=max(500, 170 * n))
    return fig


def theorem1_figure(tables: Mapping[str, pd.DataFrame], *, title: str | None = None) -> go.Figure:
    """Theorem 1: measured low-frequency error against ``k`` per layer, with the m = 1, 2 bounds."""
    fig = go.Figure()
    for name, df in tables.items():
        fig.add_trace(go.Scatter(x=df["k"], y=df["error"], mode="lines+markers", name=f"{name} error"))
        for m, dash in ((1, "dot"), (2, "dash")):
            if f"bound_m{m}" in df:
                fig.add_trace(go.Scatter(x=df["k"], y=df[f"bound_m{m}"], mode="lines",
                                         name=f"{name} bound m={m}", line=dict(dash=dash, width=1),
                                         visible="legendonly" if m == 2 else True))
    fig.update_layout(title=title or "Theorem 1: (1/T)||G - low-frequency part||_op vs k, and the bound",
                      xaxis_title="k (low frequencies kept)", yaxis_title="error", yaxis_type="log",
                      height=420, width=820)
    return fig


def theorem2_figure(table: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Theorem 2: relative kernel-factorization error per layer beside the incoherence."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=table["layer"], y=table["relative"], mode="lines+markers",
                             name="mean |error| / mean |logit|"))
    fig.add_trace(go.Scatter(x=table["layer"], y=table["incoherence_max"], mode="lines+markers",
                             name="incoherence (max)", line=dict(dash="dot")))
    fig.update_layout(title=title or "Theorem 2: kernel factorization error and incoherence per layer",
                      xaxis_title="layer (attention input of block)", height=380, width=720)
    return fig


def induction_figure(table: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Song & Zhong Section 4.1: the three head-type scores (self-token, neighbour, copy) of every
    (layer, head), from :func:`~tfmatcomp.geometry.induction.induction_study`'s table."""
    types = (("self_token", "attention to self-tokens"), ("neighbor", "to neighbouring tokens"),
             ("copy", "to the token being copied"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in types], horizontal_spacing=0.06)
    for j, (col, _) in enumerate(types):
        grid = table.pivot(index="layer", columns="head", values=col)
        fig.add_trace(go.Heatmap(z=grid.values, x=list(grid.columns), y=list(grid.index), zmin=0,
                                 zmax=1, colorscale="Viridis", showscale=j == 2), row=1, col=j + 1)
        fig.update_xaxes(title_text="head", row=1, col=j + 1)
        fig.update_yaxes(title_text="layer" if j == 0 else None, row=1, col=j + 1)
    fig.update_layout(title=title or "Head types on repeated random tokens (mean attention)",
                      height=320, width=900)
    return fig
