"""Tables and report pages for people: integer steps as integers, intervention JSON kept out of
the columns, the papers' columns only beside the papers' model (tests/test_experiments.py), and
report figures and tables that fit a 1,200-px page."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics import summarize_drops
from tfmatcomp.experiments import attention_ablation, positional_permutation, with_interventions
from tfmatcomp.report.render import MAX_FIGURE_WIDTH, fit_figure, number_text, page, table_html

TASK = tm.TaskConfig(n_rows=4, rank=1)


def test_drop_steps_are_whole_steps():
    t = np.arange(0, 20000, 10.0)
    df = pd.DataFrame({"step": t, "eval_L_mask": 10 ** (-2 + 1 / (1 + np.exp((t - 12450) / 50)))})
    table = summarize_drops(df)
    for c in ("drop_step", "drop_start", "drop_end", "drop_width"):
        assert str(table[c].dtype) == "Int64", c
    assert "e+0" not in table_html(table)
    assert number_text(12454.69) == "12,455" and number_text(0.0123456) == "0.01235"


def test_experiment_tables_keep_their_interventions_out_of_the_columns():
    model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=16,
                                              n_ctx=16), seed=0)
    df = attention_ablation(model, TASK, n_samples=4)
    assert "intervention" not in df and set(df.attrs["interventions"]) == set(df.index)
    ablated = df[df["condition"] == "ablated"]
    assert with_interventions(ablated)["intervention"].str.contains("uniform_attention").all()
    with pytest.raises(ValueError, match="df"):
        with_interventions(pd.DataFrame({"a": [1]}))
    perm = positional_permutation(model, TASK, n_samples=4, n_permutations=2)
    assert str(perm["permutation_seed"].dtype) == "Int64"


def test_list_cells_stay_on_one_line():
    html = table_html(pd.DataFrame({"heads": [[(0, 1), (1, 0), (1, 1), (2, 2), (3, 3)]]}))
    assert "(5 in all)" in html and "(3, 3)" not in html


def test_report_figures_fit_the_page(tmp_path):
    from tfmatcomp.report.build import compute_sections
    from tfmatcomp.report.run import load_context

    ctx = load_context("tiny", n_samples=8, seed=0)
    sections = compute_sections(ctx, ["training", "head_scan", "attention"])
    text = page("t", "", sections)
    figures = [i for s in sections for i in s.items if isinstance(i, go.Figure)]
    assert figures
    for fig in figures:
        assert fig.layout.width is None or fig.layout.width <= MAX_FIGURE_WIDTH
        legend = [t for t in fig.data if t.showlegend is not False and t.name]
        if len(legend) > 12:
            assert fig.layout.legend.orientation == "h"
    assert not re.search(r"<td>\d\.\d+e\+0\d</td>", text)     # no step written as 1.245e+04
    assert "#1 uniform_attention_ablation" not in text.split('id="head_scan"')[1].split("<h2")[0]


def test_fit_figure_wraps_a_cut_title():
    fig = fit_figure(go.Figure(go.Heatmap(z=[[1]])).update_layout(
        width=300, title="Per-head patching X -> -X, masked entries: mse_to_X minus unpatched"))
    assert "<br>" in fig.layout.title.text
    sub = fit_figure(go.Figure(go.Heatmap(z=[[1]])).update_layout(
        width=400, title="post-shift: change in L_mask when one head is ablated (layers x heads)"
        "<br><sup>layers and heads 1-based</sup>"))
    assert sub.layout.title.text.count("<br>") >= 2 and sub.layout.title.text.endswith("</sup>")
