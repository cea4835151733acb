"""Mixtures of matrix sizes (the NeurIPS paper, Appendix I): sampling, configs, a short training run that
samples every size, per-size and out-of-distribution losses."""

from __future__ import annotations

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.task.data import MatrixMixtureTask
from tfmatcomp.datapath import per_size_losses

SMALL = tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=81)


def test_mixture_batches_have_one_size_each():
    task = MatrixMixtureTask(sizes=(5, 7, 9), rank=1, p_mask=0.3)
    g = torch.Generator().manual_seed(0)
    counts = {5: 0, 7: 0, 9: 0}
    for _ in range(60):
        batch = task.sample(3, generator=g)
        n = batch.n_rows
        assert batch.n_cols == n and batch.tokens.shape == (3, n * n)
        counts[n] += 1
    assert all(c >= 10 for c in counts.values()), counts  # uniform: ~20 each
    again = task.sample(3, generator=torch.Generator().manual_seed(0))
    first = task.sample(3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.tokens, first.tokens)  # seeded


def test_task_config_mixture_round_trip():
    cfg = tm.TaskConfig(mixture=[5, 7, 9], rank=1)
    assert cfg.mixture == (5, 7, 9) and cfg.n_rows == 9 and cfg.n_positions == 81
    assert tm.TaskConfig.from_dict(cfg.to_dict()) == cfg
    assert isinstance(cfg.build(), MatrixMixtureTask)
    assert "mixture" not in tm.TaskConfig().to_dict()  # single-size configs as before


@pytest.mark.parametrize("kwargs, match", [
    (dict(mixture=(5, "a")), "mixture"),
    (dict(mixture=(3, 5), n_cols=5), "n_cols"),
    (dict(mixture=(1, 5), rank=2), "rank"),
])
def test_bad_mixtures_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tm.TaskConfig(**kwargs)


def test_bad_mixture_task_is_named():
    with pytest.raises(ValueError, match="sizes"):
        MatrixMixtureTask(sizes=(5, 5))


def test_short_mixture_run_samples_every_size(monkeypatch):
    drawn = []
    original = MatrixMixtureTask.sample_size

    def recording(self, generator=None):
        drawn.append(original(self, generator))
        return drawn[-1]

    monkeypatch.setattr(MatrixMixtureTask, "sample_size", recording)
    trainer = tm.Trainer(model_cfg=SMALL, task_cfg=tm.TaskConfig(mixture=(5, 7, 9), rank=1),
                         n_steps=12, batch_size=8, eval_batch_size=8, log_every=4, lr=1e-3,
                         checkpoint_steps=(), checkpoint_every=0, progress=False, device="cpu")
    trainer.run()
    assert set(drawn) == {5, 7, 9}, drawn
    assert trainer.step == 12


def test_per_size_and_ood_losses():
    model = tm.HookedEncoder(SMALL, seed=0)
    task = tm.TaskConfig(mixture=(5, 7), rank=1)
    out = per_size_losses(model, task, n_samples=8)
    assert sorted(out) == [5, 7] and all(set(v) == {"L", "L_obs", "L_mask"} for v in out.values())
    ood = per_size_losses(model, task, sizes=(8, 9), n_samples=8)  # beyond 7x7: n_ctx 81 allows it
    assert sorted(ood) == [8, 9]
    assert per_size_losses(model, task, sizes=(5,), n_samples=8)[5] == out[5]  # same test set
    with pytest.raises(ValueError, match=r"sizes: \[10\] need more than the model's n_ctx 81"):
        per_size_losses(model, task, sizes=(9, 10))
