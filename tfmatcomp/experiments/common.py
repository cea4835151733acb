"""Compatibility re-exports: the experiments' plumbing now lives in :mod:`tfmatcomp.datapath`.

Example:
    >>> from tfmatcomp.experiments.common import sample_batch
    >>> sample_batch("tiny", 3, seed=0).tokens.shape
    torch.Size([3, 16])
"""

from __future__ import annotations

from tfmatcomp.datapath import (ModelLike, ModelsLike, TaskLike, loss_values, predict, resolve_models,
                                resolve_task, sample_batch)
from tfmatcomp.validation import check_positive_int as check_positive

__all__ = ["ModelLike", "ModelsLike", "TaskLike", "resolve_models", "resolve_task", "sample_batch",
           "predict", "loss_values", "check_positive"]
