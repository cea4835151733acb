"""Every baselines / OOD figure function builds from small real data."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

import tfmatcomp as tm
from tfmatcomp.analyses.baselines import compare_with_model, lambda_table
from tfmatcomp.analyses.ood import evaluate_ood, ood_conditions
from tfmatcomp.plotting.baselines import lambda_table_figure, model_vs_nuclear_norm_figure, ood_figure


def test_model_vs_nuclear_norm_figure(tiny_model, task4):
    df = compare_with_model(tiny_model, [0.2, 0.4], task=task4, n_samples=4)
    fig = model_vs_nuclear_norm_figure(df)
    assert isinstance(fig, go.Figure)
    names = [t.name for t in fig.data]
    assert names == ["model", "model", "nuclear-norm min.", "nuclear-norm min.", "ground truth"]
    assert list(fig.data[0].y) == list(df[df.method == "model"]["L"])
    assert fig.layout.yaxis.type == "log"
    with pytest.raises(ValueError, match="df"):
        model_vs_nuclear_norm_figure(df.drop(columns="nuclear_norm"))


def test_lambda_table_figure(tiny_model, task4):
    df = lambda_table([5e-4, 5e-3], task=task4, n_samples=4, model=tiny_model)
    fig = lambda_table_figure(df)
    assert isinstance(fig, go.Figure)
    # per panel: ours, the paper's markers (both lambdas are in the paper's table), the model line
    assert len(fig.data) == 9
    paper = [t for t in fig.data if t.name and t.name.startswith("paper")]
    assert list(paper[1].y) == list(df["paper_L_mask"].dropna())


def test_ood_figure(tiny_model, task4):
    conds = ood_conditions(task4, 16, ranks=[2], n_rows=[], n_cols=[3], distributions=["gaussian"])
    df = evaluate_ood(tiny_model, conditions=conds, n_samples=4)
    fig = ood_figure(df, "L_mask")
    assert isinstance(fig, go.Figure)
    groups = ["distribution", "rank", "n_cols", "full_rank"]
    assert [a.text for a in fig.layout.annotations] == groups
    assert len(fig.data) == 2 * len(groups)
    assert list(fig.data[0].x) == ["train", "distribution=gaussian"]
