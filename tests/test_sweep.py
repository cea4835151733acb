"""Sweeps (tfmatcomp.sweep, ``tfmatcomp sweep``): a 2x2 grid trains, writes one multi-seed run
directory per configuration, resumes without retraining, and tabulates one row per run; bad grids
are refused before anything trains."""

from __future__ import annotations

import pandas as pd
import pytest

import tfmatcomp as tm
from tfmatcomp.training import sweeps
from tfmatcomp.cli import main
from tfmatcomp.runs.layout import CHECKPOINTS_DIR, METRICS_FILE, checkpoint_dir_name

FAST = dict(n_steps=16, batch_size=8, eval_batch_size=8, log_every=2, checkpoint_every=0,
            checkpoint_steps=(8,), progress=False)
GRID = {"width": [16, 32], "depth": [1, 2]}
NAMES = ["d_model=16,n_layers=1", "d_model=16,n_layers=2", "d_model=32,n_layers=1",
         "d_model=32,n_layers=2"]
COLUMNS = {"d_model", "n_layers", "seed", "steps", "final_L_mask", "final_L_obs", "has_drop",
           "drop_step", "drop_start", "drop_end", "plateau_L_mask", "drop_reason", "run_dir"}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    return tm.sweep(GRID, seeds=[0, 1], out_dir=out, **FAST)


def test_grid_trains_one_directory_per_config_and_one_row_per_seed(swept):
    out = swept.out_dir
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == NAMES
    for name in NAMES:
        for s in (0, 1):
            run = out / name / f"seed-{s}"
            assert set(tm.list_checkpoints(run)) == {8, 16}
            assert len(tm.read_metrics(run)) == 8
    t = swept.table
    assert len(t) == 4 * 2 and COLUMNS <= set(t.columns)
    assert sorted(map(tuple, t[["d_model", "n_layers", "seed"]].values.tolist())) == sorted(
        (w, d, s) for w in (16, 32) for d in (1, 2) for s in (0, 1))
    assert (t["steps"] == 16).all() and (t["final_L_mask"] > 0).all()
    assert swept.fields == ["d_model", "n_layers"]
    # each run is an ordinary run directory with the swept shape (d_mlp follows d_model: 4 d)
    model = tm.load_checkpoint(out / NAMES[3] / "seed-1" / CHECKPOINTS_DIR / checkpoint_dir_name(16))
    assert (model.cfg.d_model, model.cfg.n_layers, model.cfg.d_mlp, model.cfg.d_head) == (32, 2, 128, 8)


def test_rerun_resumes_without_retraining(swept, monkeypatch):
    logs = sorted(swept.out_dir.rglob(METRICS_FILE))
    before = {p: p.stat().st_mtime_ns for p in logs}

    def refuse(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(sweeps, "run_group", refuse)
    again = tm.sweep(GRID, seeds=[0, 1], out_dir=swept.out_dir, **FAST)
    assert {p: p.stat().st_mtime_ns for p in logs} == before
    pd.testing.assert_frame_equal(again.table, swept.table)
    pd.testing.assert_frame_equal(sweeps.read_sweep(swept.out_dir).table, swept.table)


def test_longer_sweep_continues_from_the_checkpoints(tmp_path):
    grid = {"p_mask": [0.2, 0.4]}
    tm.sweep(grid, seeds=0, out_dir=tmp_path, **FAST)
    longer = tm.sweep(grid, seeds=0, out_dir=tmp_path, **{**FAST, "n_steps": 20})
    assert (longer.table["steps"] == 20).all()
    log = tm.read_metrics(tmp_path / "p_mask=0.2" / "seed-0")
    assert log["step"].tolist() == list(range(2, 21, 2))


def test_figure_draws_both_panels(swept):
    fig = swept.figure()
    assert {t.name for t in fig.data} >= {"d_model=16", "median"} or len(fig.data) >= 4
    assert fig.layout.title.text.startswith("Sweep over d_model")
    fig = swept.figure("n_layers")
    assert fig.layout.xaxis.title.text == "n_layers"


@pytest.mark.parametrize("grid, field", [
    ({"widht": [16]}, "widht"),
    ({"d_model": []}, "d_model"),
    ({"d_model": 32}, "d_model"),
    ({"p_mask": "0.3"}, "p_mask"),
    ({"d_model": [16, 16]}, "d_model"),
    ({"seed": [0, 1]}, "seed"),
    ({"width": [16], "d_model": [32]}, "d_model"),
    ({"d_model": [30]}, "d_model"),          # not divisible by the 4 heads
    ({"rank": [5]}, "rank"),                  # above the 4x4 matrices' size
    ({"lr": [-1.0]}, "lr"),
    ({"distribution": ["cauchy"]}, "distribution"),
    ({"n_rows": [5], "n_ctx": [16]}, "n_ctx"),
])
def test_bad_grids_name_the_field(grid, field, tmp_path):
    with pytest.raises(ValueError, match=field):
        tm.sweep(grid, out_dir=tmp_path / "x", **FAST)
    assert not (tmp_path / "x").exists()  # refused before anything was written


def test_matrix_size_sets_n_ctx():
    (c,) = sweeps.expand_grid({"n_rows": [5]})
    assert c.task_cfg.n_rows == 5 and c.model_cfg.n_ctx == 25


def test_cli_sweep_writes_table_and_figure(tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["sweep", "--run-dir", str(out), "--grid", "heads=2,4", "--grid", "distribution=gaussian",
            "--seeds", "0-1", "--steps", "8", "--batch-size", "8", "--log-every", "2",
            "--checkpoint-every", "0", "--no-progress"]
    assert main(argv) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 4 and set(table["n_heads"]) == {2, 4}
    assert set(table["distribution"]) == {"gaussian"}
    assert (out / "sweep.html").stat().st_size > 10_000
    assert "table written to" in capsys.readouterr().out
    assert main(["sweep", "--run-dir", str(out), "--grid", "d_model"]) == 2
    assert "--grid" in capsys.readouterr().err


def test_two_grids_in_one_directory_read_back_apart(tmp_path):
    few = {**FAST, "n_steps": 4}
    tm.sweep({"p_mask": [0.2]}, out_dir=tmp_path, **few)
    tm.sweep({"lr": [3e-3]}, out_dir=tmp_path, **few)
    back = sweeps.read_sweep(tmp_path)
    assert back.fields == ["p_mask", "lr"] and len(back.table) == 2
    with pytest.raises(ValueError, match="seeds="):
        tm.sweep({"lr": [3e-3]}, seed=3, **few)
    with pytest.raises(ValueError, match="sweep.json"):
        sweeps.read_sweep(tmp_path / "p_mask=0.2")
