"""The single-seed training steps that a :class:`~tfmatcomp.Trainer` plugs into the loop.

* :class:`ExplicitStep`: the float32 step. A fresh batch from the training stream, the model's own
  forward pass (every hook runs), the loss of the run's objective
  (:mod:`~tfmatcomp.models.objectives`), one optimizer update; a non-finite loss raises
  :class:`FloatingPointError` before the update.
* :class:`FastTrainerStep`: the bf16 step of :mod:`tfmatcomp.training.fast_step` (an encoder only):
  no host sync between logging steps, so a non-finite loss is reported at the next logging or
  checkpoint step.

Both log the objective's losses of the update's own forward pass (``train_*``) and the trainer's
:meth:`~tfmatcomp.Trainer.evaluate` (``eval_*``).

Example:
    >>> import tfmatcomp as tm
    >>> trainer = tm.Trainer("tiny", batch_size=8, progress=False)
    >>> step = trainer.training_step()
    >>> type(step).__name__, sorted(step.train_metrics(step.update())[0])[:2]
    ('ExplicitStep', ['L', 'L_mask'])
"""

from __future__ import annotations

from typing import Any, ContextManager

import torch
from torch import Tensor

from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.training import fast_step
from tfmatcomp.training.loop import TrainingStep

__all__ = ["ExplicitStep", "FastTrainerStep"]


class ExplicitStep(TrainingStep):
    """The float32 training step of ``trainer`` (see the module docstring)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.description = (trainer.step_reason if not trainer.fast
                            else "float32 step: hooks are attached to the model")

    def forward_loss(self, batch: MatrixBatch) -> tuple[Tensor, Tensor]:
        """The update's forward pass on ``batch`` and the loss it differentiates."""
        return self.trainer.objective.forward_loss(self.trainer.model, batch)

    def update(self) -> tuple[Tensor, MatrixBatch]:
        """One optimizer update on a fresh batch; returns the predictions (a decoder's logits) the
        update used and the batch.

        Raises:
            FloatingPointError: the loss is not finite (nothing is updated).
        """
        t = self.trainer
        t.reinitialize_due(t.step)
        batch = t.task.sample(t.train_cfg.batch_size, generator=t.train_gen, device=t.device)
        with t.intervened(t.step), t.penalty_terms(t.step, batch) as penalty:
            predictions, loss = self.forward_loss(batch)
        if penalty:
            loss = loss + torch.stack(penalty).sum()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"training diverged at step {t.step + 1}: loss is "
                                     f"{loss.item()}; try a lower lr (now {t.train_cfg.lr})")
        t.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t.drop_frozen_grads(t.step)
        #: what the last update logs besides its losses (the objective's; e.g. a scheduled rate)
        self.logged = t.objective.apply_update(t.model, t.optimizer, t.step, t.task)
        return predictions, batch

    def train_metrics(self, update: tuple[Tensor, MatrixBatch]) -> list[dict[str, Tensor]]:
        predictions, batch = update
        with torch.no_grad():
            return [{**getattr(self, "logged", {}),
                     **self.trainer.objective.metrics(predictions.detach(), batch)}]

    def evaluate(self) -> list[dict[str, float]]:
        return [self.trainer.evaluate()]


class FastTrainerStep(ExplicitStep):
    """The fast step of ``trainer`` through :class:`~tfmatcomp.training.fast_step.FastStep`: the
    same batches (drawn on the device without host reads), bf16 matmuls, fused Adam."""

    def __init__(self, trainer: Any):
        super().__init__(trainer)
        self.description = trainer.step_reason
        #: the bf16 update (its non-finite flag persists across runs of the same trainer)
        self.fast = fast_step.FastStep(trainer.model, trainer.optimizer)

    def update(self) -> tuple[Tensor, MatrixBatch]:
        """One optimizer update; never reads a tensor back (see :meth:`check_finite`). The
        interventions during training it may take (on a CPU: attention scaling, freezing,
        re-initializing) act as in :class:`ExplicitStep`."""
        t, step = self.trainer, self.trainer.step
        t.reinitialize_due(step)
        batch = fast_step.sample_batch(t.task, t.train_cfg.batch_size, t.train_gen, t.device)
        with t.intervened(step):
            predictions = self.fast.update(batch, before_step=lambda: t.drop_frozen_grads(step))
        return predictions, batch

    def check_finite(self, step: int) -> None:
        self.fast.check_finite(step)

    def numerics(self) -> ContextManager[None]:
        return fast_step.numerics(self.trainer.device)
