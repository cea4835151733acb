"""Shared plumbing of the experiments: models or checkpoints in, one seeded batch, chunked runs, losses.

Every experiment walks the library's one data path: ``task.sample`` (with an explicit generator) ->
``model(tokens)`` (inside an intervention's ``applied`` context) -> :func:`tfmatcomp.losses` /
:func:`tfmatcomp.L_mask_prime`. Batches are drawn on the CPU from ``torch.Generator().manual_seed(seed)``
and moved to the model's device, so a seed gives the same matrices on every device. Conditions of one
experiment are compared on the same batch.

Models are given as a :class:`~tfmatcomp.HookedEncoder`, a checkpoint / run directory (loaded with
:func:`tfmatcomp.checkpoint.load_checkpoint_info`; its task config is used when ``task`` is None), or
a mapping ``{label: model or path}``. The labels ``"pre-shift"`` and ``"post-shift"`` tell the
experiments which of the papers' reference numbers belong to a model.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments.common import resolve_models, sample_batch
    >>> models, task = resolve_models(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny")
    >>> list(models), task.n_rows
    (['model'], 4)
    >>> sample_batch(task, 3, seed=0).tokens.shape
    torch.Size([3, 16])
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Union

import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp.config import TaskConfig, get_preset
from tfmatcomp.data import MatrixBatch, MatrixCompletionTask
from tfmatcomp.metrics import losses
from tfmatcomp.model import HookedEncoder

__all__ = ["ModelLike", "ModelsLike", "TaskLike", "resolve_models", "resolve_task", "sample_batch",
           "predict", "loss_values", "check_positive"]

ModelLike = Union[HookedEncoder, str, os.PathLike]
ModelsLike = Union[ModelLike, Mapping[str, ModelLike]]
TaskLike = Union[MatrixCompletionTask, TaskConfig, str, None]


def check_positive(name: str, value: int) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a positive integer."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: must be a positive integer, got {value!r}")


def _load(model: ModelLike, device: torch.device | str | None) -> tuple[HookedEncoder, TaskConfig | None, str]:
    if isinstance(model, HookedEncoder):
        return (model if device is None else model.to(device)), None, "model"
    if isinstance(model, (str, os.PathLike)):
        from tfmatcomp.checkpoint import load_checkpoint_info

        m, info = load_checkpoint_info(model, device=device)
        label = f"step {info.step}" if info.step is not None else str(model)
        return m, info.task_cfg, label
    raise TypeError(f"models: expected a HookedEncoder, a checkpoint path, or a mapping of them, "
                    f"got {type(model).__name__}")


def resolve_task(task: TaskLike, found: list[TaskConfig | None] | None = None) -> MatrixCompletionTask:
    """A :class:`~tfmatcomp.MatrixCompletionTask` from a task, a task config, a preset name, or (when
    None) the first task config found in the checkpoints."""
    if isinstance(task, MatrixCompletionTask):
        return task
    if isinstance(task, TaskConfig):
        return task.build()
    if isinstance(task, str):
        return get_preset(task).task.build()
    if task is None:
        for cfg in found or []:
            if cfg is not None:
                return cfg.build()
        raise ValueError("task: give a MatrixCompletionTask, a TaskConfig or a preset name (the "
                         "models carry no task config)")
    raise TypeError(f"task: expected a MatrixCompletionTask, TaskConfig or preset name, got "
                    f"{type(task).__name__}")


def resolve_models(
    models: ModelsLike,
    task: TaskLike = None,
    device: torch.device | str | None = None,
) -> tuple[dict[str, HookedEncoder], MatrixCompletionTask]:
    """``({label: model}, task)`` from the experiments' ``models`` and ``task`` arguments.

    A single model is labelled ``"model"``, a single checkpoint ``"step N"``.

    Raises:
        ValueError: no task could be found, or the task needs more positions than a model has.
    """
    items = models.items() if isinstance(models, Mapping) else [(None, models)]
    out: dict[str, HookedEncoder] = {}
    found: list[TaskConfig | None] = []
    for label, m in items:
        model, task_cfg, default = _load(m, device)
        out[str(label) if label is not None else default] = model
        found.append(task_cfg)
    if not out:
        raise ValueError("models: give at least one model")
    task = resolve_task(task, found)
    for label, model in out.items():
        if task.n_positions > model.cfg.n_ctx:
            raise ValueError(f"task: {task.n_rows}x{task.n_cols} matrices need {task.n_positions} "
                             f"positions but model {label!r} has n_ctx {model.cfg.n_ctx}")
    return out, task


def sample_batch(task: MatrixCompletionTask, n_samples: int, seed: int,
                 device: torch.device | str | None = None) -> MatrixBatch:
    """``n_samples`` matrices from ``torch.Generator().manual_seed(seed)`` (CPU), moved to ``device``."""
    check_positive("n_samples", n_samples)
    batch = task.sample(n_samples, generator=torch.Generator().manual_seed(int(seed)))
    return batch if device is None else batch.to(device)


@torch.no_grad()
def predict(
    model: HookedEncoder,
    batch: MatrixBatch,
    intervention: Any = None,
    chunk_size: int = 256,
) -> Float[Tensor, "batch pos"]:
    """Predictions on ``batch``, ``chunk_size`` matrices at a time, with ``intervention`` applied.

    Args:
        intervention: None, an :class:`~tfmatcomp.interventions.Intervention`, or a function of the
            chunk (a :class:`~tfmatcomp.MatrixBatch`) returning one (e.g. a patch from that chunk).
    """
    check_positive("chunk_size", chunk_size)
    batch = batch.to(model.device)
    out = []
    for start in range(0, batch.batch_size, chunk_size):
        chunk = batch[start:start + chunk_size]
        iv = intervention(chunk) if callable(intervention) and not hasattr(intervention, "applied") \
            else intervention
        if iv is None:
            out.append(model(chunk.tokens))
        else:
            with iv.applied(model):
                out.append(model(chunk.tokens))
    return torch.cat(out)


def loss_values(predictions: Tensor, batch: MatrixBatch) -> dict[str, float]:
    """``L``, ``L_obs``, ``L_mask`` as floats (from :func:`tfmatcomp.losses`)."""
    out = losses(predictions, batch.to(predictions.device))
    return {k: float(out[k]) for k in ("L", "L_obs", "L_mask")}
