"""Interventions during training (TrainConfig.interventions): data, effects, resume, the group."""

from __future__ import annotations

import json
import math

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.cli import main as cli_main
from tfmatcomp.config import TrainConfig
from tfmatcomp.interventions.during_training import (AttentionLogitScale, Freeze, Reinitialize, RowColumnAttentionScale,
                                                      during_training_from_dict)
from tfmatcomp.models.param_groups import group_parameter_names
from tfmatcomp.runs.checkpoint import ConfigMismatchError, load_checkpoint_info
from tfmatcomp.training.interventions import TrainingPlan, fresh_seed, row_column_logit_bias

SMALL = dict(n_steps=6, batch_size=8, log_every=1, progress=False)


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ------------------------------------------------------------------ data
def test_json_round_trip_and_config_record():
    ivs = (AttentionLogitScale(2.5, layers=[1], start_step=3, end_step=9),
           RowColumnAttentionScale(10.0), Freeze("mlp"), Reinitialize(["attention", "readout"], 4))
    cfg = TrainConfig(interventions=[iv.to_dict() for iv in ivs])
    assert cfg.interventions == ivs
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert "interventions" not in TrainConfig().to_dict()  # old configs serialize unchanged
    assert during_training_from_dict(ivs[0].to_dict()) == ivs[0]


@pytest.mark.parametrize("bad, match", [
    ({"kind": "nope"}, "kind"),
    ({"kind": "freeze"}, "groups"),
    ({"kind": "freeze", "groups": []}, "groups"),
    ({"kind": "row_column_attention_scale", "factor": 0}, "factor"),
    ({"kind": "attention_logit_scale", "scale": float("nan")}, "scale"),
    ({"kind": "attention_logit_scale", "scale": 2, "start_step": 5, "end_step": 5}, "end_step"),
    ({"kind": "reinitialize", "groups": ["mlp"], "step": -1}, "step"),
    ({"kind": "freeze", "groups": ["mlp"], "colour": 1}, "unknown field"),  # the kind registry
    ("freeze", "interventions"),
])
def test_bad_interventions_name_the_argument(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(interventions=[bad] if not isinstance(bad, str) else bad)


@pytest.mark.parametrize("iv, match", [
    (Freeze("mlpx"), "unknown parameter group"),
    (AttentionLogitScale(2.0, layers=[2]), r"layers must lie in \[0, 1\]"),
])
def test_checked_against_the_model(iv, match):
    with pytest.raises(ValueError, match=match):
        tm.Trainer("tiny", interventions=[iv], progress=False)


def test_row_column_scaling_refuses_the_decoder():
    with pytest.raises(ValueError, match="encoder"):
        tm.Trainer("gpt-tiny", interventions=[RowColumnAttentionScale(2.0)], progress=False)


def test_which_step_takes_them():
    from tfmatcomp.interventions.during_training import RowColumnAttentionPenalty
    from tfmatcomp.training import fast_step

    model = tm.HookedEncoder(tm.get_preset("tiny").model)
    assert fast_step.blocker(type(model), False, [Freeze("mlp")], "cpu") is None
    assert "CUDA" in fast_step.blocker(type(model), False, [Freeze("mlp")], "cuda")
    with pytest.raises(ValueError, match="attention penalty"):
        tm.Trainer("tiny", interventions=[RowColumnAttentionPenalty(1.0)], fast=True,
                   progress=False)


def test_the_cpu_fast_step_applies_them():
    """The bf16 CPU step runs the components (their hooks with it): the interventions act there."""
    from tfmatcomp.training.steps import FastTrainerStep

    kw = dict(SMALL, fast=True, device="cpu")
    init = _params(tm.HookedEncoder(tm.get_preset("tiny").model, seed=0))
    trainer = tm.Trainer("tiny", interventions=[Freeze("mlp"), RowColumnAttentionScale(10.0)], **kw)
    assert isinstance(trainer.training_step(), FastTrainerStep)
    frozen = trainer.run().model
    assert all(torch.equal(_params(frozen)[n], init[n])
               for n in group_parameter_names(frozen, "mlp"))
    plain = tm.train("tiny", **kw).model
    assert not torch.equal(frozen.blocks[0].attn.W_Q, plain.blocks[0].attn.W_Q)
    # the first update's loss is the initial model's with the row/column scaling (to bf16)
    scaled = tm.train("tiny", interventions=[RowColumnAttentionScale(10.0)], **kw)
    preset = tm.get_preset("tiny")
    model = tm.HookedEncoder(preset.model, seed=0)
    batch = preset.task.build().sample(8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), TrainingPlan([RowColumnAttentionScale(10.0)], model, 4).applied(model, 0):
        hooked = tm.losses(model(batch.tokens), batch)["L"].item()
    with torch.no_grad():
        unhooked = tm.losses(model(batch.tokens), batch)["L"].item()
    first = scaled.metrics["train_L"].iloc[0]
    assert first == pytest.approx(hooked, rel=0.02)
    assert abs(first - hooked) < abs(first - unhooked)


# ------------------------------------------------------------------ effects
def test_row_column_bias_multiplies_those_softmax_weights():
    scores = torch.randn(3, 2, 9, 9, generator=torch.Generator().manual_seed(0))
    bias = row_column_logit_bias(3, 3, 10.0)
    plain, scaled = scores.softmax(-1), (scores + bias).softmax(-1)
    weight = torch.where(bias > 0, 10.0, 1.0)
    assert torch.allclose(scaled, plain * weight / (plain * weight).sum(-1, keepdim=True), atol=1e-6)
    assert bias[0].nonzero().flatten().tolist() == [1, 2, 3, 6]  # row 0 and column 0, not itself


@pytest.mark.parametrize("iv", [AttentionLogitScale(3.0, layers=[0]), RowColumnAttentionScale(5.0)])
def test_first_update_uses_the_hooks(iv):
    """The first update's logged loss is the initial model's under the intervention's hooks."""
    run = tm.train("tiny", interventions=[iv], **SMALL)
    preset = tm.get_preset("tiny")
    model = tm.HookedEncoder(preset.model, seed=0)
    batch = preset.task.build().sample(8, generator=torch.Generator().manual_seed(1))
    plan = TrainingPlan([iv], model, 4)
    with torch.no_grad():
        with plan.applied(model, 0):
            hooked = tm.losses(model(batch.tokens), batch)["L"].item()
        plain = tm.losses(model(batch.tokens), batch)["L"].item()
    assert run.metrics["train_L"].iloc[0] == pytest.approx(hooked, rel=1e-5)
    assert abs(hooked - plain) > 1e-4


def test_window_ends():
    """An intervention with end_step leaves the later updates as a plain run makes them."""
    plan = TrainingPlan([AttentionLogitScale(3.0, start_step=2, end_step=4)],
                        tm.HookedEncoder(tm.get_preset("tiny").model))
    assert [len(plan.fwd_hooks(s)) for s in range(6)] == [0, 0, 2, 2, 0, 0]


def test_freeze_keeps_the_group_and_trains_the_rest():
    init = _params(tm.HookedEncoder(tm.get_preset("tiny").model, seed=0))
    model = tm.train("tiny", interventions=[Freeze("mlp", end_step=3)], **SMALL).model
    held = tm.train("tiny", interventions=[Freeze("mlp")], **SMALL).model
    mlp = group_parameter_names(held, "mlp")
    after = _params(held)
    assert all(torch.equal(after[n], init[n]) for n in mlp)
    assert not torch.equal(after["blocks.0.attn.W_Q"], init["blocks.0.attn.W_Q"])
    assert not all(torch.equal(_params(model)[n], init[n]) for n in mlp)  # moved after step 3


def test_reinitialize_draws_the_models_own_init():
    run = tm.train("tiny", interventions=[Reinitialize("readout", step=3), Freeze("readout")],
                   **SMALL)
    fresh = _params(tm.HookedEncoder(tm.get_preset("tiny").model, seed=fresh_seed(0, 3)))
    init = _params(tm.HookedEncoder(tm.get_preset("tiny").model, seed=0))
    for name in group_parameter_names(run.model, "readout"):
        assert torch.equal(_params(run.model)[name], fresh[name])
        assert not torch.equal(fresh[name], init[name])


# ------------------------------------------------------------------ runs
IVS = [RowColumnAttentionScale(10.0, start_step=2), Freeze("mlp", end_step=4),
       Reinitialize("readout", step=3)]


def test_recorded_and_resume_must_match(tmp_path):
    out = tmp_path / "run"
    tm.train("tiny", interventions=IVS, out_dir=out, checkpoint_every=3, **{**SMALL, "n_steps": 3})
    recorded = json.loads((out / "run.json").read_text())["train"]["interventions"]
    assert recorded == [iv.to_dict() for iv in IVS]
    _, info = load_checkpoint_info(out / "checkpoints" / "step_0000003")
    assert info.train_cfg.interventions == tuple(IVS)
    with pytest.raises(ConfigMismatchError, match="interventions"):
        tm.train("tiny", out_dir=out, resume=True, **SMALL)
    resumed = tm.train("tiny", interventions=IVS, out_dir=out, resume=True, **SMALL)
    straight = tm.train("tiny", interventions=IVS, **SMALL)
    assert resumed.metrics["eval_L"].tolist() == straight.metrics["eval_L"].tolist()
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(),
                                                 straight.model.parameters()))


def test_seed_group_matches_single_runs():
    group = tm.train_many("tiny", seeds=[0, 1], interventions=IVS, **SMALL)
    for seed in (0, 1):
        single = tm.train("tiny", seed=seed, interventions=IVS, **SMALL)
        for (name, a), b in zip(group[seed].model.named_parameters(), single.model.parameters()):
            # b_K's gradient is zero up to rounding (softmax ignores a shift shared by all keys),
            # and Adam turns the rounding of the two programs into full-size steps
            if not name.endswith("b_K"):
                assert torch.allclose(a, b, atol=1e-5), name
        assert group[seed].metrics["eval_L"].tolist() == pytest.approx(
            single.metrics["eval_L"].tolist(), rel=1e-4)


def test_cli_takes_json(tmp_path, capsys):
    out = tmp_path / "cli"
    iv = {"kind": "attention_logit_scale", "scale": 2.5, "start_step": 1}
    assert cli_main(["train", "--preset", "tiny", "--steps", "2", "--batch-size", "4",
                     "--log-every", "1", "--run-dir", str(out), "--no-progress",
                     "--intervention", json.dumps(iv)]) == 0
    recorded = json.loads((out / "run.json").read_text())["train"]["interventions"]
    assert recorded == [{**iv, "layers": None, "end_step": None}]
    assert math.isfinite(json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["eval_L"])


# ------------------------------------------------------------------ the attention penalty
def test_penalty_adds_the_row_column_mass_to_the_first_loss():
    from tfmatcomp.interventions.during_training import RowColumnAttentionPenalty
    from tfmatcomp.task.masks import row_column_mass

    iv = RowColumnAttentionPenalty(5.0, layers=[1])
    preset = tm.get_preset("tiny")
    model = tm.HookedEncoder(preset.model, seed=0)
    batch = preset.task.build().sample(8, generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(batch.tokens)
    mass = row_column_mass(cache["blocks.1.attn.hook_pattern"], batch.observed, 4, 4).mean()
    plan = TrainingPlan([iv], model, 4)
    with plan.penalty(model, 0, batch) as terms:
        loss = tm.losses(model(batch.tokens), batch)["L"]
    assert len(terms) == 1 and terms[0].item() == pytest.approx(5.0 * mass.item(), rel=1e-6)
    terms[0].backward()  # differentiable: the gradient reaches the queries and keys
    assert model.blocks[1].attn.W_Q.grad.abs().sum() > 0
    # the logged losses are the plain ones, and the penalty changes the updates
    run = tm.train("tiny", interventions=[iv], **SMALL)
    plain = tm.train("tiny", **SMALL)
    assert run.metrics["train_L"].iloc[0] == pytest.approx(loss.item(), rel=1e-5)
    assert run.metrics["train_L"].iloc[-1] != plain.metrics["train_L"].iloc[-1]


def test_penalty_suppresses_the_row_column_mass():
    from tfmatcomp.analyses.dynamics import row_column_attention_mass
    from tfmatcomp.interventions.during_training import RowColumnAttentionPenalty
    from tfmatcomp.datapath import sample_batch

    kw = dict(SMALL, n_steps=30, log_every=30)
    pushed = tm.train("tiny", interventions=[RowColumnAttentionPenalty(10.0)], **kw).model
    pulled = tm.train("tiny", interventions=[RowColumnAttentionPenalty(-10.0)], **kw).model
    batch = sample_batch("tiny", 64, seed=0)
    assert (row_column_attention_mass(pushed, batch)["layer0"]
            < row_column_attention_mass(pulled, batch)["layer0"])


def test_penalty_refused_where_it_cannot_be_collected():
    from tfmatcomp.interventions.during_training import RowColumnAttentionPenalty

    with pytest.raises(ValueError, match="one at a time"):
        tm.MultiSeedTrainer("tiny", seeds=[0, 1], interventions=[RowColumnAttentionPenalty(1.0)],
                            progress=False)
    with pytest.raises(ValueError, match="weight"):
        RowColumnAttentionPenalty(0.0)


def test_train_many_trains_penalized_seeds_one_at_a_time(tmp_path):
    from tfmatcomp.interventions.during_training import RowColumnAttentionPenalty
    from tfmatcomp.runs.layout import GROUP_FILE

    ivs = [RowColumnAttentionPenalty(1.0)]
    group = tm.train_many("tiny", seeds=[0, 1], interventions=ivs, out_dir=tmp_path / "g", **SMALL)
    assert json.loads((tmp_path / "g" / GROUP_FILE).read_text())["seeds"] == [0, 1]
    single = tm.train("tiny", seed=1, interventions=ivs, **SMALL)
    assert group[1].metrics["eval_L"].tolist() == single.metrics["eval_L"].tolist()
    assert group.step == 6 and (tmp_path / "g" / "seed-1" / "run.json").exists()


# ------------------------------------------------------- one intervention system
def test_interventions_during_training_are_interventions_of_the_one_registry():
    """A training-time intervention is an Intervention subclass in the one kind registry: the
    generic from_dict rebuilds it, and a new kind is one class (no other file changes)."""
    from dataclasses import dataclass
    from typing import ClassVar

    from tfmatcomp.interventions import KINDS, Intervention, from_dict
    from tfmatcomp.interventions.during_training import DuringTraining

    iv = Freeze("mlp", start_step=2)
    assert isinstance(iv, Intervention) and KINDS["freeze"] is Freeze
    assert from_dict(json.loads(json.dumps(iv.to_dict()))) == iv
    assert Intervention.from_dict(AttentionLogitScale(2.0).to_dict()) == AttentionLogitScale(2.0)

    @dataclass(frozen=True, eq=False)
    class ZeroLogits(DuringTraining):  # a new kind: attention made uniform in its window
        kind: ClassVar[str] = "test_zero_logits"
        start_step: int = 0
        end_step: int | None = None

        def step_hooks(self, plan, step):
            return [(f"blocks.{l}.attn.hook_attn_scores", lambda scores, hook: scores * 0)
                    for l in self.layer_range(plan.n_layers)]

    try:
        cfg = TrainConfig(interventions=[{"kind": "test_zero_logits", "end_step": 3}])
        assert cfg.interventions == (ZeroLogits(end_step=3),)
        plan = TrainingPlan(cfg.interventions, tm.HookedEncoder(tm.get_preset("tiny").model))
        assert [n for n, _ in plan.fwd_hooks(2)] == [f"blocks.{l}.attn.hook_attn_scores"
                                                      for l in range(plan.n_layers)]
        assert plan.fwd_hooks(3) == []
        r = tm.train("tiny", interventions=[ZeroLogits(end_step=3)], **SMALL)
        assert r.step == 6
    finally:
        KINDS.pop("test_zero_logits", None)
