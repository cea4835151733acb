"""Every dynamics figure function builds from small data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics import component_training, detect_drop
from tfmatcomp.plotting.dynamics import component_training_figure, loss_curve_figure


def _log(t0=2500.0):
    t = np.arange(0, 5000, 25.0)
    mask = 10 ** (-2 + 1 / (1 + np.exp((t - t0) / 40)))
    return pd.DataFrame({"step": t, "eval_L": 0.3 * mask, "eval_L_obs": 1e-4 + 0 * t, "eval_L_mask": mask})


def test_loss_curve_marks_detected_drop():
    df = _log()
    fig = loss_curve_figure(df)
    assert isinstance(fig, go.Figure)
    assert [t.name for t in fig.data] == ["L", "L_obs", "L_mask", "fit (eval_L_mask)"]
    vlines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(vlines) == 1 and vlines[0].x0 == pytest.approx(2500, rel=0.01)
    assert fig.layout.yaxis.type == "log"
    flat = loss_curve_figure(df.assign(eval_L_mask=0.1), drop=True)
    assert len(flat.layout.shapes) == 0 and "no sudden drop" in flat.layout.title.text
    given = loss_curve_figure(df, drop=detect_drop(df))
    assert len(given.layout.shapes) == 2            # band and line
    with pytest.raises(ValueError, match="metrics"):
        loss_curve_figure(df, prefix="train")


def test_component_training_figure_from_real_runs(tiny_model):
    df = component_training(tiny_model, ["pos_embed"], task_cfg=tm.TaskConfig(n_rows=4, rank=1),
                            n_steps=3, batch_size=4, eval_batch_size=4, log_every=1, device="cpu")
    fig = component_training_figure(df)
    assert [t.name for t in fig.data] == ["pos_embed", "all"]
    assert list(fig.data[0].y) == list(df[df.component == "pos_embed"]["eval_L_mask"])


def test_component_training_figure_marks_drops():
    a, b = _log(2000.0), _log(3500.0)
    df = pd.concat([a.assign(component="attention"), b.assign(component="pos_embed")])
    fig = component_training_figure(df, "eval_L_mask")
    xs = sorted(s.x0 for s in fig.layout.shapes)
    assert xs == [pytest.approx(2000, rel=0.01), pytest.approx(3500, rel=0.01)]
