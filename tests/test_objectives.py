"""One objective per model kind, registered once: the trainer, checkpoints and run.json agree."""

import json

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.runs import rundir
from tfmatcomp.runs.layout import RUN_FILE
from tfmatcomp.models.objectives import OBJECTIVES, objective_for, objective_named

DECODER = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=33, d_vocab=2003)


@pytest.mark.parametrize("preset, kind", [("tiny", "encoder"), ("gpt-tiny", "decoder")])
def test_the_kind_a_run_records_is_its_objectives(tmp_path, preset, kind):
    overrides = {"model_cfg": DECODER} if kind == "decoder" else {}
    r = tm.train(preset, n_steps=2, batch_size=4, log_every=2, out_dir=tmp_path, progress=False,
                 **overrides)
    assert json.loads((tmp_path / RUN_FILE).read_text())["kind"] == kind
    assert objective_for(r.model) is OBJECTIVES[kind]
    assert isinstance(tm.load_checkpoint(tmp_path), OBJECTIVES[kind].model_class)
    assert isinstance(rundir.run_configs(tmp_path)[0], OBJECTIVES[kind].config_class)
    assert set(r.metrics.columns) >= {"train_L_mask", "eval_L_mask"}


def test_an_unknown_kind_is_refused_where_it_is_read(tmp_path):
    tm.train("tiny", n_steps=2, batch_size=4, log_every=2, out_dir=tmp_path, progress=False)
    run = json.loads((tmp_path / RUN_FILE).read_text())
    (tmp_path / RUN_FILE).write_text(json.dumps({**run, "kind": "mystery"}))
    with pytest.raises(rundir.RunDirError, match="mystery"):
        rundir.run_configs(tmp_path)
    with pytest.raises(ValueError, match="kind: expected one of"):
        objective_named("mystery")
    with pytest.raises(TypeError, match="model_cfg"):
        objective_for("tiny")


def test_the_decoder_objective_trains_on_the_value_tokens_only():
    objective = OBJECTIVES["decoder"]
    batch = tm.MatrixCompletionTask(4, rank=1).sample(3, torch.Generator().manual_seed(0))
    tokens = objective.model_tokens(batch)
    assert tokens.shape == (3, objective.positions_needed(16))
    logits = torch.zeros(3, tokens.shape[1], 2003, requires_grad=True)
    objective.loss(logits, batch, tokens).backward()
    touched = logits.grad.abs().sum(dim=(0, 2)) > 0
    assert touched[16:32].all() and not touched[:16].any()  # SEP and values predict; prompt not
