"""The character LM is a model kind ("lm", its objective in models/objectives) trained by the one
Trainer host: train_lm is tm.train of a TextTask, with the trainers' divergence error, run-directory
lock and rules, checkpoints and resume."""

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint import ConfigMismatchError
from tfmatcomp.runs.layout import METRICS_FILE, has_training_state, list_checkpoints
from tfmatcomp.runs.rundir import RunDirError, RunDirLock, RunDirLockedError
from tfmatcomp.models.objectives import OBJECTIVES
from tfmatcomp.runs.checkpoint import load_checkpoint_info
from tfmatcomp.training import lm
from tfmatcomp.training.lm import TextTask, text_sampler, train_lm

CFG = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=8, d_vocab=5)
SAMPLER = text_sampler(torch.arange(40) % 5, 8)
KW = dict(n_steps=4, batch_size=4, log_every=2)


def losses(frame):
    """A metrics frame without its wall-clock column."""
    return frame.drop(columns="elapsed_s")


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
    assert losses(again.metrics).equals(losses(first.metrics))
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
    assert losses(resumed.metrics).equals(losses(straight.metrics))
    assert losses(tm.read_metrics(tmp_path / "run")).equals(losses(straight.metrics))
    assert [s for s, p in list_checkpoints(tmp_path / "run").items()
            if has_training_state(p)] == [6]


def test_resume_refuses_another_recipe_and_starts_an_empty_directory(tmp_path):
    kw = dict(KW, checkpoint_every=2)
    train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", **kw)
    with pytest.raises(ConfigMismatchError, match=r"\['lr'\] differ"):
        train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", resume=True, **dict(kw, lr=5e-4))
    with pytest.raises(ConfigMismatchError, match="'warmup_steps': 1"):
        train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", resume=True, **dict(kw, warmup_steps=1))
    fresh = train_lm(CFG, SAMPLER, out_dir=tmp_path / "empty", resume=True, **kw)
    assert fresh.metrics["step"].tolist() == [2, 4]
    with pytest.raises(ValueError, match="resume, overwrite"):
        train_lm(CFG, SAMPLER, out_dir=tmp_path / "run", resume=True, overwrite=True, **kw)


def test_train_lm_is_tm_train_of_a_text_task_through_the_one_host(tmp_path):
    """The same run through tm.train's RunSetup keywords (model_cfg, task_cfg, out_dir, TrainConfig
    fields): the same weights and losses; the Trainer's objective is the "lm" kind's."""
    via_lm = train_lm(CFG, SAMPLER, out_dir=tmp_path / "a", checkpoint_every=2, **KW)
    task = TextTask(SAMPLER, n_steps=4)
    via_train = tm.train(model_cfg=CFG, task_cfg=task, n_steps=4, batch_size=4,
                         eval_batch_size=4, log_every=2, checkpoint_every=2, checkpoint_steps=(),
                         device="cpu", out_dir=tmp_path / "b", progress=False)
    assert all(torch.equal(p, q) for p, q in zip(via_lm.model.parameters(),
                                                 via_train.model.parameters()))
    assert losses(via_train.metrics).equals(losses(via_lm.metrics))
    assert list(via_lm.metrics.columns) == ["step", "lr", "train_loss", "eval_loss", "elapsed_s"]
    trainer = tm.Trainer(model_cfg=CFG, task_cfg=task, device="cpu", progress=False)
    assert trainer.objective is OBJECTIVES["lm"] and trainer.objective.kind == "lm"
    assert type(trainer.optimizer).__name__ == "AdamW" and not trainer.fast
    # a checkpoint of the run: a decoder with the tokenizer and the recipe in its metadata
    _, info = load_checkpoint_info(via_lm.path)
    assert info.metadata["train_lm"] == task.recipe and info.task_cfg is None
    # no second host: the module keeps no run or step class of its own
    assert not any(hasattr(lm, name) for name in ("LMRun", "LMStep"))


def test_the_lm_task_is_refused_with_an_encoder_and_a_too_small_vocabulary():
    task = TextTask(SAMPLER, n_steps=4, tokenizer=lm.CharTokenizer("abcdef"))
    with pytest.raises(ValueError, match="tokenizer: 6 characters"):
        tm.Trainer(model_cfg=CFG, task_cfg=task, device="cpu")
    with pytest.raises(TypeError, match="'lm' task trains a HookedDecoder"):
        tm.Trainer(model_cfg=tm.get_preset("tiny").model, task_cfg=TextTask(SAMPLER, n_steps=4),
                   device="cpu")
