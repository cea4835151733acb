"""Shared fixtures: small models and batches, built once per session."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings

import tfmatcomp as tm

torch.set_num_threads(1)

# Property tests draw the same examples on every run: a test must pass or fail for the code, not
# for the draw (a random draw once planted a drop the detector placed 2.0 % off in CI).
settings.register_profile("tfmatcomp", derandomize=True)
settings.load_profile("tfmatcomp")


@pytest.fixture(scope="session")
def tiny_cfg() -> tm.EncoderConfig:
    """A very small encoder for 4x4 matrices (fast on CPU)."""
    return tm.EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=16)


@pytest.fixture(scope="session")
def task4() -> tm.MatrixCompletionTask:
    return tm.MatrixCompletionTask(n_rows=4, rank=1, p_mask=0.3)


@pytest.fixture()
def tiny_model(tiny_cfg) -> tm.HookedEncoder:
    """A fresh randomly initialised model (function scope: tests may edit it)."""
    return tm.HookedEncoder(tiny_cfg, seed=0).eval()


@pytest.fixture()
def batch4(task4) -> tm.MatrixBatch:
    return task4.sample(8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory) -> tm.TrainResult:
    """The tiny preset trained for 300 steps (the copying phase: L_obs ~1e-3, L_mask on the plateau),
    with checkpoints at steps 100 and 300 under ``result.out_dir``. Shared by the whole session."""
    out = tmp_path_factory.mktemp("tiny_run")
    return tm.train("tiny", n_steps=300, batch_size=64, log_every=25, checkpoint_steps=(100,),
                    checkpoint_every=0, out_dir=out, device="cpu", progress=False, seed=0)


@pytest.fixture(scope="session")
def fresh_7x7() -> tm.MatrixBatch:
    """256 fresh matrices of the papers' task (7x7, rank 2, 30 % masked; sampling seed 2024), for
    the acceptance checks of the bundled paper runs."""
    from tfmatcomp.datapath import sample_batch
    return sample_batch(tm.get_preset("paper-4l8h").task, 256, seed=2024)


@pytest.fixture(scope="session")
def l_mask():
    """``l_mask(model, batch)``: the model's ``L_mask`` on ``batch`` (eval mode, no gradients)."""
    def measure(model: tm.HookedEncoder, batch: tm.MatrixBatch) -> float:
        with torch.no_grad():
            return float(tm.losses(model.eval()(batch.tokens), batch)["L_mask"])
    return measure
