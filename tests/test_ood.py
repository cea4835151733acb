"""OOD evaluation: conditions, shapes within n_ctx, position alignment, baseline next to the model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tfmatcomp as tm
from tfmatcomp.analyses.ood import OOD_GROUPS, OODCondition, evaluate_ood, ood_conditions


class CopyModel(nn.Module):
    """Decodes its input tokens: copies observed entries exactly, predicts 0 at MASK."""

    def __init__(self, n_ctx: int):
        super().__init__()
        self.cfg = tm.EncoderConfig(n_layers=1, n_heads=1, d_model=4, d_mlp=4, n_ctx=n_ctx)
        self.dummy = nn.Parameter(torch.zeros(()))
        self.tokenizer = tm.ValueTokenizer()
        self.seen_lengths: list[int] = []

    def forward(self, tokens):
        self.seen_lengths.append(tokens.shape[1])
        return self.tokenizer.decode(tokens) + 0 * self.dummy


def test_default_conditions_for_the_paper_shape():
    conds = ood_conditions(tm.TaskConfig(n_rows=7, rank=2), n_ctx=49)
    labels = [c.label for c in conds]
    assert labels[:3] == ["train", "distribution=gaussian", "distribution=laplace"]
    assert [c.value for c in conds if c.group == "rank"] == [1, 3, 4, 5, 6, 7]
    assert [c.value for c in conds if c.group == "n_rows"] == [2, 3, 4, 5, 6]
    assert [c.value for c in conds if c.group == "n_cols"] == [2, 3, 4, 5, 6]
    for c in conds:
        assert c.task.n_positions <= 49 and c.group in OOD_GROUPS
        if c.group in ("n_rows", "n_cols"):
            assert c.task.rank == min(2, c.task.n_rows, c.task.n_cols)
    assert conds[-1].group == "full_rank" and conds[-1].task.rank is None


def test_shapes_must_fit_n_ctx():
    with pytest.raises(ValueError, match="n_cols"):
        ood_conditions(tm.TaskConfig(n_rows=4, rank=1), n_ctx=16, n_cols=[5])
    with pytest.raises(ValueError, match="task"):
        ood_conditions(tm.TaskConfig(n_rows=5, rank=1), n_ctx=16)
    model = CopyModel(n_ctx=16)
    too_big = OODCondition("n_rows", 5, tm.MatrixCompletionTask(n_rows=5, n_cols=4, rank=1))
    with pytest.raises(ValueError, match="n_ctx"):
        evaluate_ood(model, conditions=[too_big], n_samples=2)
    with pytest.raises(ValueError, match="task"):
        evaluate_ood(model, n_samples=2)


def test_copy_model_scores_and_position_alignment():
    """A model that copies its input has L_obs = 0 and L_mask = mean x^2 at masked entries in
    every condition: predictions line up with the row-major positions for every shape."""
    model = CopyModel(n_ctx=16)
    task = tm.MatrixCompletionTask(n_rows=4, rank=1, p_mask=0.3)
    df = evaluate_ood(model, task, n_samples=16, seed=4)
    mrows = df[df.method == "model"]
    assert list(mrows["condition"]) == [c.label for c in ood_conditions(task, 16)]
    assert (mrows["L_obs"] == 0).all()
    for cond in ood_conditions(task, 16):
        batch = cond.task.sample(16, generator=torch.Generator().manual_seed(4))
        row = mrows[mrows["condition"] == cond.label].iloc[0]
        expected = batch.values[batch.masked].pow(2).mean().item()
        assert row["L_mask"] == pytest.approx(expected, rel=1e-5)
        assert (row["n_rows"], row["n_cols"]) == (cond.task.n_rows, cond.task.n_cols)
    assert sorted(set(model.seen_lengths)) == [8, 12, 16]   # 2x4 / 4x2, 3x4 / 4x3, 4x4


def test_model_next_to_baseline(tiny_model, task4):
    conds = ood_conditions(task4, 16, ranks=[2], n_rows=[3], n_cols=[3], distributions=["laplace"])
    df = evaluate_ood(tiny_model, conditions=conds, n_samples=6, seed=1)
    assert len(df) == 2 * len(conds)
    assert list(df["method"]) == ["model", "nuclear_norm"] * len(conds)
    nn_rows = df[df.method == "nuclear_norm"]
    assert (nn_rows["L_obs"] < 1e-10).all() and (nn_rows["n_failed"] == 0).all()
    # the nuclear-norm solution never has a larger nuclear norm than the true matrix (feasible)
    assert (nn_rows["nuclear_norm"] <= nn_rows["true_nuclear_norm"] + 1e-8).all()
    # the model row is model(batch.tokens) on the condition's seeded batch
    batch = conds[2].task.sample(6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exp = tm.losses(tiny_model(batch.tokens), batch)["L"].item()
    assert df[(df.condition == "rank=2") & (df.method == "model")]["L"].item() == pytest.approx(exp, rel=1e-6)
    alone = evaluate_ood(tiny_model, conditions=conds[:1], n_samples=6, seed=1, baseline=False)
    assert list(alone["method"]) == ["model"]
    assert alone["L"].item() == pytest.approx(df["L"].iloc[0], rel=1e-7)
