"""Figures for the nuclear-norm comparisons and OOD evaluation.

* :func:`model_vs_nuclear_norm_figure`: MSE and nuclear norm of the solutions across ``p_mask``
  (the workshop paper Fig. 5 / the NeurIPS paper Fig. 3), from :func:`tfmatcomp.analyses.baselines.compare_with_model`;
* :func:`lambda_table_figure`: ``L_obs, L_mask, L`` of regularized nuclear-norm minimization against
  lambda, with the paper's values (the workshop paper Appendix D), from :func:`tfmatcomp.analyses.baselines.lambda_table`;
* :func:`ood_figure`: model vs nuclear norm per OOD condition (the NeurIPS paper Fig. 19), from
  :func:`tfmatcomp.analyses.ood.evaluate_ood`.

Example:
    >>> import pandas as pd
    >>> df = pd.DataFrame({"p_mask": [0.2, 0.2, 0.4, 0.4], "method": ["model", "nuclear_norm"] * 2,
    ...                    "L": [1e-3, 2e-3, 3e-3, 9e-3], "nuclear_norm": [3.1, 2.9, 3.2, 2.7]})
    >>> len(model_vs_nuclear_norm_figure(df).data)
    4
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["model_vs_nuclear_norm_figure", "lambda_table_figure", "ood_figure"]

_COLORS = {"model": "#5778A4", "nuclear_norm": "#D1615D"}
_NAMES = {"model": "model", "nuclear_norm": "nuclear-norm min."}
_METRICS = ("L_obs", "L_mask", "L")  # the column order of the workshop paper, Appendix D


def _need(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: expected a pandas DataFrame from {what}, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"df: missing columns {missing} (expected the output of {what})")


def model_vs_nuclear_norm_figure(df: pd.DataFrame, metric: str = "L", *,
                                 show_true_norm: bool = True, title: str | None = None) -> go.Figure:
    """Two panels against ``p_mask``: ``metric`` (log scale) and the mean nuclear norm.

    Args:
        df: :func:`tfmatcomp.analyses.baselines.compare_with_model` output.
        metric: ``"L"`` (the papers' panel), ``"L_mask"`` or ``"L_obs"``.
        show_true_norm: draw the targets' mean nuclear norm (dashed) when the column is present.

    Example:
        >>> import pandas as pd
        >>> df = pd.DataFrame({"p_mask": [0.3, 0.3], "method": ["model", "nuclear_norm"],
        ...                    "L_mask": [0.01, 0.03], "nuclear_norm": [3.0, 2.8]})
        >>> model_vs_nuclear_norm_figure(df, "L_mask").layout.yaxis.type
        'log'
    """
    _need(df, ["p_mask", "method", metric, "nuclear_norm"], "compare_with_model")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"MSE ({metric})", "nuclear norm of the solution"))
    for method, part in df.groupby("method", sort=False):
        part = part.sort_values("p_mask")
        style = dict(color=_COLORS.get(method), width=2)
        name = _NAMES.get(method, str(method))
        fig.add_trace(go.Scatter(x=part["p_mask"], y=part[metric], mode="lines+markers", name=name,
                                 line=style, legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=part["p_mask"], y=part["nuclear_norm"], mode="lines+markers",
                                 name=name, line=style, legendgroup=name, showlegend=False), row=1, col=2)
    if show_true_norm and "true_nuclear_norm" in df.columns:
        truth = df.drop_duplicates("p_mask").sort_values("p_mask")
        fig.add_trace(go.Scatter(x=truth["p_mask"], y=truth["true_nuclear_norm"], mode="lines",
                                 name="ground truth", line=dict(color="gray", dash="dash")), row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_xaxes(title_text="p_mask")
    fig.update_layout(title=title or "Model vs nuclear-norm minimization", template="plotly_white")
    return fig


def lambda_table_figure(df: pd.DataFrame, metrics: Sequence[str] = _METRICS, *,
                        show_paper: bool = True, title: str | None = None) -> go.Figure:
    """One panel per metric against lambda (log-log); the paper's values as open markers and, if
    the table has a model row, the model's value as a horizontal line.

    Args:
        df: :func:`tfmatcomp.analyses.baselines.lambda_table` output.
        metrics: which of ``L_obs, L_mask, L`` to show.

    Example:
        >>> import pandas as pd
        >>> df = pd.DataFrame({"method": ["nuclear_norm"] * 2, "lam": [1e-3, 5e-3], "L_obs": [1e-5, 1e-4],
        ...                    "L_mask": [0.04, 0.043], "L": [0.012, 0.013]})
        >>> len(lambda_table_figure(df, show_paper=False).data)
        3
    """
    _need(df, ["method", "lam", *metrics], "lambda_table")
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=list(metrics))
    nn = df[(df["method"] == "nuclear_norm") & df["lam"].notna()].sort_values("lam")
    model = df[df["method"] == "model"]
    for j, m in enumerate(metrics, start=1):
        first = j == 1
        fig.add_trace(go.Scatter(x=nn["lam"], y=nn[m], mode="lines+markers", name="nuclear-norm min. (ours)",
                                 line=dict(color=_COLORS["nuclear_norm"]), legendgroup="ours",
                                 showlegend=first), row=1, col=j)
        paper_col = f"paper_{m}"
        if show_paper and paper_col in nn.columns and nn[paper_col].notna().any():
            fig.add_trace(go.Scatter(x=nn["lam"], y=nn[paper_col], mode="markers", name="paper (the workshop paper App. D)",
                                     marker=dict(symbol="circle-open", size=10, color="black"),
                                     legendgroup="paper", showlegend=first), row=1, col=j)
        if len(model) and np.isfinite(model[m].iloc[0]) and len(nn):
            fig.add_trace(go.Scatter(x=[nn["lam"].min(), nn["lam"].max()], y=[model[m].iloc[0]] * 2,
                                     mode="lines", name="model", line=dict(color=_COLORS["model"], dash="dot"),
                                     legendgroup="model", showlegend=first), row=1, col=j)
    fig.update_xaxes(type="log", title_text="lambda")
    fig.update_yaxes(type="log")
    fig.update_layout(title=title or "Regularized nuclear-norm minimization", template="plotly_white")
    return fig


def ood_figure(df: pd.DataFrame, metric: str = "L", *, groups: Sequence[str] | None = None,
               log_y: bool = True, title: str | None = None) -> go.Figure:
    """Grouped bars of ``metric`` per OOD condition, model next to nuclear-norm minimization; one
    panel per condition group (the in-distribution bar is repeated in each panel for reference).

    Args:
        df: :func:`tfmatcomp.analyses.ood.evaluate_ood` output.
        metric: ``"L"``, ``"L_mask"``, ``"L_obs"`` or ``"nuclear_norm"``.
        groups: which condition groups to show (default: all present except in_distribution).

    Example:
        >>> import pandas as pd
        >>> df = pd.DataFrame({"group": ["in_distribution"] * 2 + ["rank"] * 2,
        ...                    "condition": ["train"] * 2 + ["rank=2"] * 2,
        ...                    "method": ["model", "nuclear_norm"] * 2, "L": [1e-3, 2e-3, 5e-3, 4e-3]})
        >>> len(ood_figure(df).data)
        2
    """
    _need(df, ["group", "condition", "method", metric], "evaluate_ood")
    reference = df[df["group"] == "in_distribution"]
    if groups is None:
        groups = [g for g in dict.fromkeys(df["group"]) if g != "in_distribution"] or ["in_distribution"]
    fig = make_subplots(rows=1, cols=len(groups), subplot_titles=list(groups), shared_yaxes=True)
    for j, g in enumerate(groups, start=1):
        part = df[df["group"] == g]
        if g != "in_distribution":
            part = pd.concat([reference, part])
        for method in dict.fromkeys(df["method"]):
            sub = part[part["method"] == method]
            fig.add_trace(go.Bar(x=sub["condition"], y=sub[metric], name=_NAMES.get(method, str(method)),
                                 marker_color=_COLORS.get(method), legendgroup=str(method),
                                 showlegend=j == 1), row=1, col=j)
    fig.update_layout(barmode="group", template="plotly_white",
                      title=title or f"Out-of-distribution {metric}: model vs nuclear-norm minimization")
    if log_y:
        fig.update_yaxes(type="log")
    return fig
