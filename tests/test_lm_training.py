"""train_lm runs the trainers' loop: their divergence error, run-directory lock and rules, resume."""

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint import ConfigMismatchError
from tfmatcomp.runs.layout import METRICS_FILE, has_training_state, list_checkpoints
from tfmatcomp.runs.rundir import RunDirError, RunDirLock, RunDirLockedError
from tfmatcomp.training.lm import text_sampler, train_lm

CFG = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=8, d_vocab=5)
SAMPLER = text_sampler(torch.arange(40) % 5, 8)
KW = dict(n_steps=4, batch_size=4, log_every=2)


def test_a_non_finite_loss_raises_floating_point_error_like_every_trainer(tmp_path):
    model = tm.HookedDecoder(CFG, seed=0)
    with torch.no_grad():
        model.unembed.b_U.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="diverged at step 1"):
        train_lm(model, SAMPLER, out_dir=tmp_path / "run", **KW)
    assert list_checkpoints(tmp_path / "run") == {}


def test_the_run_directory_is_locked_and_must_be_empty(tmp_path):
    with RunDirLock(tmp_path / "run"):
        with pytest.raises(RunDirLockedError, match="in use by another trainer"):
            train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", **KW)
    first = train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", checkpoint_every=2, **KW)
    assert list(list_checkpoints(tmp_path / "run")) == [2, 4] and first.path.name.endswith("4")
    with pytest.raises(RunDirError, match="already holds a run"):
        train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", **KW)
    again = train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", overwrite=True, **KW)
    assert tm.read_metrics(tmp_path / "run")["step"].tolist() == [2, 4]
    assert again.metrics.equals(first.metrics)
    assert (tmp_path / "run" / METRICS_FILE).exists()


def test_resume_continues_an_interrupted_run_exactly(tmp_path):
    kw = dict(KW, n_steps=6, log_every=1, checkpoint_every=3, eval_sampler=SAMPLER)
    straight = train_lm(CFG, SAMPLER, **kw)
    calls = [0]

    def killed_at_step_5(batch_size, generator):
        calls[0] += 1
        if calls[0] == 5:
            raise KeyboardInterrupt
        return SAMPLER(batch_size, generator)

    with pytest.raises(KeyboardInterrupt):
        train_lm(CFG, killed_at_step_5, out_dir=tmp_path / "run", **kw)
    assert list(list_checkpoints(tmp_path / "run")) == [3]
    resumed = train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", resume=True, **kw)
    assert all(torch.equal(p, q) for p, q in zip(straight.model.parameters(),
                                                 resumed.model.parameters()))
    assert resumed.metrics.equals(straight.metrics)
    assert tm.read_metrics(tmp_path / "run").equals(straight.metrics)
    assert [s for s, p in list_checkpoints(tmp_path / "run").items()
            if has_training_state(p)] == [6]


def test_resume_refuses_another_recipe_and_starts_an_empty_directory(tmp_path):
    kw = dict(KW, checkpoint_every=2)
    train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", **kw)
    with pytest.raises(ConfigMismatchError, match="train_lm"):
        train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", resume=True, **dict(kw, lr=5e-4))
    fresh = train_lm(CFG, SAMPLER, out_dir=tmp_path / "empty", resume=True, **kw)
    assert fresh.metrics["step"].tolist() == [2, 4]
    with pytest.raises(ValueError, match="resume, overwrite"):
        train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", resume=True, overwrite=True, **kw)
