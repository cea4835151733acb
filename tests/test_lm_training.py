"""train_lm runs the trainers' loop: their divergence error, their run-directory lock and rules."""

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.runs.layout import METRICS_FILE, list_checkpoints
from tfmatcomp.runs.rundir import RunDirError, RunDirLock, RunDirLockedError
from tfmatcomp.song_zhong.lm import text_sampler, train_lm

CFG = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=8, d_vocab=5)
SAMPLER = text_sampler(torch.arange(40) % 5, 8)
KW = dict(n_steps=4, batch_size=4, log_every=2)


def test_a_non_finite_loss_raises_floating_point_error_like_every_trainer(tmp_path):
    model = tm.HookedDecoder(CFG, seed=0)
    with torch.no_grad():
        model.unembed.b.fill_(float("nan"))
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
