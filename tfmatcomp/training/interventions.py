"""Interventions during training, applied: what the training steps do with
:attr:`tfmatcomp.config.TrainConfig.interventions`.

The interventions themselves (:class:`~tfmatcomp.interventions.during_training.DuringTraining`
and its kinds, in the one ``kind`` registry) say what they do at a step; a run records them in
``run.json`` and in every checkpoint, and a resume must match them. A :class:`TrainingPlan`
checks them against the model and collects what an update needs, asking each intervention:

* :meth:`TrainingPlan.applied`: the forward hooks of the attention interventions active at a step
  (``blocks.{l}.attn.hook_attn_scores``), attached for one forward pass;
* :meth:`TrainingPlan.drop_frozen_grads`: the gradients of frozen parameters removed between the
  backward pass and the optimizer step (Adam skips a parameter without a gradient);
* :meth:`TrainingPlan.reinitialize`: the parameters of a group drawn afresh from the model's own
  initialization before an update, their Adam state cleared.

The float32 step (:class:`~tfmatcomp.training.steps.ExplicitStep`), the multi-seed step
(:class:`~tfmatcomp.training.multiseed.VmapStep`) and, on a CPU, the fast bf16 step
(:class:`~tfmatcomp.training.steps.FastTrainerStep`, whose forward runs the components and so
their hooks) call these; the compiled CUDA step does not, and a run with the attention penalty
takes the float32 step (:func:`tfmatcomp.training.fast_step.blocker` says why). Evaluations logged
after an intervened update run with that update's hooks (the model as trained); checkpoints hold
the plain weights.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.interventions.during_training import RowColumnAttentionScale
    >>> scale = RowColumnAttentionScale(10.0, start_step=10)
    >>> r = tm.train("tiny", n_steps=20, batch_size=8, log_every=10, progress=False,
    ...              interventions=[scale])
    >>> plan = TrainingPlan([scale], r.model)
    >>> [name for name, _ in plan.fwd_hooks(9)], [name for name, _ in plan.fwd_hooks(10)]
    ([], ['blocks.0.attn.hook_attn_scores', 'blocks.1.attn.hook_attn_scores'])
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable

import torch
from jaxtyping import Float
from torch import Tensor, nn

from tfmatcomp.interventions.during_training import DuringTraining, Reinitialize
from tfmatcomp.models.objectives import objective_for
from tfmatcomp.models.param_groups import group_predicate
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.masks import positions_to_rows_cols

__all__ = ["TrainingPlan", "row_column_logit_bias", "fresh_seed"]

HookFn = Callable[[Tensor, Any], Tensor]


def row_column_logit_bias(n_rows: int, n_cols: int, factor: float,
                          device: torch.device | str | None = None
                          ) -> Float[Tensor, "query key"]:
    """``log(factor)`` where key ``k`` is another entry of query ``q``'s row or column, else 0:
    added to attention logits it multiplies those softmax weights by ``factor`` (renormalized).

    Example:
        >>> b = row_column_logit_bias(2, 2, math.e)
        >>> b.tolist()
        [[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]
    """
    rows, cols = positions_to_rows_cols(n_rows, n_cols, device=device)
    same = (rows[:, None] == rows[None, :]) | (cols[:, None] == cols[None, :])
    same &= ~torch.eye(len(rows), dtype=torch.bool, device=device)
    return same.float() * math.log(factor)


class TrainingPlan:
    """The interventions of a run, checked against its model and ready to apply.

    Args:
        interventions: :class:`~tfmatcomp.interventions.during_training.DuringTraining`
            objects, in order.
        model: the model trained (its layers and parameter names are checked here).
        n_cols: the task's columns (None: square matrices, the size read from each sequence).

    Raises:
        ValueError: a layer the model lacks, a parameter group that is unknown or selects no
            parameter of the model.
    """

    def __init__(self, interventions: Sequence[DuringTraining], model: nn.Module,
                 n_cols: int | None = None):
        self.interventions = tuple(interventions)
        self.n_cols = n_cols
        n_layers = model.cfg.n_layers
        names = [n for n, _ in model.named_parameters()]
        #: parameter names each group intervention selects, by its index
        self.selected: dict[int, list[str]] = {}
        for i, iv in enumerate(self.interventions):
            where = f"interventions[{i}] ({iv.kind})"
            layers = getattr(iv, "layers", None)
            if layers is not None and any(l >= n_layers for l in layers):
                raise ValueError(f"{where}: layers must lie in [0, {n_layers - 1}], got "
                                 f"{list(layers)}")
            if iv.encoder_only and objective_for(model.cfg).kind != "encoder":
                raise ValueError(f"{where}: rows and columns are the encoder's sequence; a "
                                 f"{type(model).__name__} reads another one")
            if hasattr(iv, "groups"):
                excepted = getattr(iv, "except_groups", ())
                try:
                    pred = group_predicate(iv.groups)
                    spared = group_predicate(excepted) if excepted else (lambda n: False)
                except ValueError as e:
                    raise ValueError(f"{where}: {e}") from None
                self.selected[i] = [n for n in names if pred(n) and not spared(n)]
                if not self.selected[i]:
                    raise ValueError(f"{where}: groups {list(iv.groups)}"
                                     + (f" except {list(excepted)}" if excepted else "")
                                     + " select no parameter of this model")
        self.n_layers = n_layers
        self._bias: dict[tuple[int, float, str], Tensor] = {}

    @classmethod
    def for_model(cls, model: nn.Module, interventions: Sequence[DuringTraining],
                  n_cols: int | None = None) -> "TrainingPlan | None":
        """The plan of ``interventions`` for ``model``; None when there are none."""
        return cls(interventions, model, n_cols) if interventions else None

    # ------------------------------------------------------------------ hooks
    def fwd_hooks(self, step: int) -> list[tuple[str, HookFn]]:
        """The forward hooks of the interventions active at the update from ``step``."""
        return [h for iv in self.interventions if iv.active(step) for h in iv.step_hooks(self, step)]

    @contextlib.contextmanager
    def applied(self, model: nn.Module, step: int) -> Iterator[None]:
        """Attach :meth:`fwd_hooks` at ``step`` to ``model`` for the body of the ``with``."""
        hooks = self.fwd_hooks(step)
        if not hooks:
            yield
            return
        with model.hooks(fwd_hooks=hooks):
            yield

    def row_column_bias(self, n_pos: int, factor: float, device: torch.device) -> Tensor:
        key = (n_pos, factor, str(device))
        if key not in self._bias:
            if self.n_cols is not None and n_pos % self.n_cols == 0:
                n_rows, n_cols = n_pos // self.n_cols, self.n_cols
            else:
                n_rows = n_cols = math.isqrt(n_pos)
                if n_rows * n_cols != n_pos:
                    raise ValueError(f"a sequence of {n_pos} positions is no square matrix; "
                                     "row/column attention scaling needs the matrix's shape")
            self._bias[key] = row_column_logit_bias(n_rows, n_cols, factor, device)
        return self._bias[key]

    def refused_by(self, carrier: str) -> DuringTraining | None:
        """The first intervention that ``carrier`` (``"batched"``, ``"data_parallel"``,
        ``"fast_cpu"``) cannot carry, or None."""
        return next((iv for iv in self.interventions if not getattr(iv, carrier)), None)

    @contextlib.contextmanager
    def penalty(self, model: nn.Module, step: int, batch: MatrixBatch) -> Iterator[list[Tensor]]:
        """For the body of a ``with``: hooks on ``hook_pattern`` that collect the penalty terms of
        the update from ``step`` on ``batch`` into the yielded list (add their sum to the loss)."""
        terms: list[Tensor] = []
        hooks = [h for iv in self.interventions if iv.active(step)
                 for h in iv.penalty_hooks(self, batch, terms)]
        if not hooks:
            yield terms
            return
        with model.hooks(fwd_hooks=hooks):
            yield terms

    # ----------------------------------------------------------------- parameters
    def frozen(self, step: int) -> set[str]:
        """Names of the parameters the update from ``step`` leaves unchanged."""
        return {n for i, iv in enumerate(self.interventions)
                if iv.active(step) for n in iv.frozen(self.selected.get(i, []))}

    def drop_frozen_grads(self, step: int, params: Mapping[str, Tensor]) -> None:
        """Remove the gradients of the frozen parameters (call between backward and the step)."""
        for name in self.frozen(step):
            params[name].grad = None

    @torch.no_grad()
    def reinitialize(self, step: int, params: Mapping[str, Tensor],
                     optimizer: torch.optim.Optimizer,
                     fresh: Callable[[Reinitialize], Sequence[Mapping[str, Tensor]]]) -> list[str]:
        """Before the update from ``step``: copy the :class:`~tfmatcomp.interventions.during_training.Reinitialize`
        groups' parameters from fresh models and clear their optimizer state; returns the names.

        Args:
            params: the trained parameters by name (stacked ``[seed, ...]`` for a multi-seed group).
            fresh: ``fresh(reinit)``, the fresh parameters by name that ``reinit`` copies, one
                mapping per run (one for a single run, one per seed of a group, in stacking order).
        """
        names: list[str] = []
        for i, iv in enumerate(self.interventions):
            if not (iv.reinitializes() and iv.active(step)):
                continue
            states = fresh(iv)
            for name in self.selected[i]:
                p = params[name]
                values = [s[name].to(p.device, p.dtype) for s in states]
                p.copy_(values[0] if len(values) == 1 and p.shape == values[0].shape
                        else torch.stack(values))
                optimizer.state.pop(p, None)
                names.append(name)
        return names


def fresh_seed(run_seed: int, step: int) -> int:
    """The seed of the fresh initialization a :class:`~tfmatcomp.interventions.during_training.Reinitialize` at ``step``
    draws for the run of ``run_seed`` (different per seed and per step).

    Example:
        >>> fresh_seed(0, 2000) != fresh_seed(1, 2000) != fresh_seed(0, 3000)
        True
    """
    return (run_seed * 1_000_003 + step * 7_919 + 12_345) % (2**63 - 1)
