"""Shared fixtures: small models and batches, built once per session."""

from __future__ import annotations

import pytest
import torch

import tfmatcomp as tm

torch.set_num_threads(1)


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
