"""The report's sections for the NeurIPS paper's remaining figures: component-wise training (Sec. 4,
Fig. 8), positional-embedding norms per position, heads under row / column masks as pairs; and
training on Gaussian entries from the command line (``tfmatcomp train --distribution``)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pandas as pd
import plotly.graph_objects as go
import pytest

import tfmatcomp as tm
from tfmatcomp.cli import main
from tfmatcomp.analyses.dynamics import PAPER_COMPONENTS, component_training
from tfmatcomp.report import build_report

NEW = ["components", "positional", "structured_masks"]


@pytest.fixture(scope="module")
def gaps(tmp_path_factory):
    out = tmp_path_factory.mktemp("gaps") / "report.html"
    return build_report("tiny", out, n_samples=16, sections=NEW, progress=False)


def _section(report, key):
    (s,) = [s for s in report.sections if s.key == key]
    assert s.error is None, s.error
    return s


def test_new_sections_render_without_failure(gaps):
    assert gaps.failed == []
    text = gaps.path.read_text()
    for key in NEW:
        assert f'id="{key}"' in text


def test_component_training_section_says_how_to_compute_it(gaps):
    # The report never starts five training runs by itself (they take as long as the run).
    s = _section(gaps, "components")
    assert s.items == []
    assert "Not computed for this run" in s.text and "component_training" in s.text
    assert "a copy of this bundled run" in s.text  # never a path inside the installed package
    assert "Fig. 8" in s.text


def test_component_section_reads_saved_runs(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tm.pretrained.run_dir("tiny"), run)
    post = tm.list_checkpoints(run)[max(tm.list_checkpoints(run))]
    component_training(post, n_steps=10, batch_size=8, log_every=1, checkpoint_every=0,
                       checkpoint_steps=(), out_dir=run / "components", device="cpu")
    report = build_report(run, tmp_path / "r.html", n_samples=16, sections=["components"],
                          progress=False)
    s = _section(report, "components")
    assert f"read from {run / 'components'}" in s.text
    fig, table = s.items
    assert [t.name for t in fig.data if t.mode == "lines"] == [*PAPER_COMPONENTS, "all"]
    assert sorted(table["component"]) == sorted([*PAPER_COMPONENTS, "all"])
    assert len(fig.data[0].x) == 10


def test_positional_section_shows_norms_per_position(gaps):
    s = _section(gaps, "positional")
    figures = [i for i in s.items if isinstance(i, go.Figure)]
    (table,) = [i for i in s.items if isinstance(i, pd.DataFrame)]
    n = tm.get_preset("tiny").task.n_positions
    assert len(figures) == 2 and all(len(f.data[0].y) == n for f in figures)
    assert list(table["model"]) == ["pre-shift", "post-shift"]
    assert {"mean norm", "same_row", "same_col", "other"} <= set(table.columns)
    post = tm.load_pretrained("tiny", step="post")
    assert figures[1].data[0].y[3] == pytest.approx(float(post.W_pos[3].detach().norm()), rel=1e-5)


def test_structured_mask_section_pairs_row_and_column_masks(gaps):
    s = _section(gaps, "structured_masks")
    fig, table = s.items
    cfg = tm.get_preset("tiny").model
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:2] == ["row mask", "column mask"]
    assert titles[2].startswith("(1,1) R") and titles[3].startswith("(1,1) C")
    assert len(fig.data) == 2 + 2 * cfg.n_layers * cfg.n_heads
    assert len(table) == cfg.n_layers * cfg.n_heads
    assert {"type (row mask)", "type (column mask)"} <= set(table.columns)
    # the two masks differ: one masks a row, the other a column
    row, col = fig.data[0].z, fig.data[1].z
    assert (row == 0).sum() == (col == 0).sum() == 3 and (row != col).any()


def test_pairs_figure_refuses_random_mask_analyses(tiny_model, task4):
    from tfmatcomp.analyses.heads import analyse_heads
    from tfmatcomp.plotting.heads import structured_mask_pairs_figure

    a = analyse_heads(tiny_model, task4, 4)
    with pytest.raises(ValueError, match="row"):
        structured_mask_pairs_figure(a, a)


@pytest.mark.parametrize("seeds", [None, "0-1"])
def test_cli_train_distribution(tmp_path, seeds):
    out = tmp_path / "gauss"
    argv = ["train", "--run-dir", str(out), "--steps", "4", "--batch-size", "8", "--log-every", "2",
            "--distribution", "gaussian", "--no-progress"] + (["--seeds", seeds] if seeds else [])
    assert main(argv) == 0
    runs = [out] if seeds is None else [out / "seed-0", out / "seed-1"]
    for run in runs:
        assert json.loads((run / "run.json").read_text())["task"]["distribution"] == "gaussian"
        _, info = tm.runs.checkpoint.load_checkpoint_info(tm.runs.checkpoint.latest_checkpoint(run))
        assert info.task_cfg == dataclasses.replace(tm.get_preset("tiny").task, distribution="gaussian")
    # the task really draws Gaussian factors: entries beyond [-1, 1] occur
    import torch

    batch = info.task_cfg.build().sample(64, generator=torch.Generator().manual_seed(0))
    assert batch.values.abs().max() > 1


def test_cli_train_refuses_an_unknown_distribution(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--run-dir", str(tmp_path / "x"), "--distribution", "cauchy"])
    assert "gaussian" in capsys.readouterr().err
