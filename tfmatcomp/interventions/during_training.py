"""Interventions during training: :class:`~tfmatcomp.interventions.Intervention` subclasses that
say what they do at a training step.

They are written in :attr:`tfmatcomp.TrainConfig.interventions` as objects or as their JSON form,
in the one ``kind`` registry of :mod:`tfmatcomp.interventions.serialize` (``from_dict`` rebuilds
any of them, as it does the inference-time interventions), recorded in ``run.json`` and every
checkpoint, and a resume must match them. Each acts on the updates ``start_step <= s < end_step``
(the update that takes the run from step ``s`` to ``s + 1``; ``end_step`` None: to the end).

What one does at a step is its own (:mod:`tfmatcomp.training.interventions` only collects it):

* :meth:`DuringTraining.step_hooks`: forward hooks on the update's (and the logged evaluation's)
  forward pass (attention scaling);
* :meth:`DuringTraining.penalty_hooks`: hooks that collect loss terms (the attention penalty);
* :meth:`DuringTraining.frozen`: parameters whose gradients are dropped (freezing);
* :meth:`DuringTraining.reinitializes`: parameters drawn afresh before the update;

and what carries it, as class attributes: :attr:`~DuringTraining.fast_cpu` (the CPU fast step,
whose forward runs the components' hooks), :attr:`~DuringTraining.batched` (the batched
multi-seed program) and :attr:`~DuringTraining.data_parallel`; none runs on the compiled CUDA
step. A new kind is one class here, or in any module: subclassing registers it.

Example:
    >>> Freeze("mlp", end_step=1000).to_dict()
    {'kind': 'freeze', 'groups': ['mlp'], 'except_groups': [], 'start_step': 0, 'end_step': 1000}
    >>> during_training_from_dict({"kind": "freeze", "groups": ["mlp"]})
    Freeze(groups=('mlp',), except_groups=(), start_step=0, end_step=None)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from tfmatcomp.interventions.base import Intervention
from tfmatcomp.interventions.serialize import KINDS, from_dict
from tfmatcomp.validation import (check_int_in_range, check_int_list, check_positive_float,
                                  check_seed)

__all__ = ["DuringTraining", "AttentionLogitScale", "RowColumnAttentionScale",
           "RowColumnAttentionPenalty", "Freeze", "Reinitialize", "during_training_from_dict",
           "during_training_kinds"]


def _check_window(spec: DuringTraining) -> None:
    check_int_in_range("start_step", spec.start_step, 0, 10**12)
    if spec.end_step is not None:
        check_int_in_range("end_step", spec.end_step, spec.start_step + 1, 10**12)


def _check_groups(groups: Any) -> tuple[str, ...]:
    if isinstance(groups, str):
        groups = (groups,)
    if (not isinstance(groups, (list, tuple)) or not groups
            or not all(isinstance(g, str) and g for g in groups)):
        raise ValueError(f"groups: must be a non-empty list of parameter group names "
                         f"(tfmatcomp.models.param_groups.GROUPS), got {groups!r}")
    return tuple(groups)


def _check_layers_and_window(spec: DuringTraining) -> None:
    """Check an attention intervention's ``layers`` (stored as a tuple) and its window."""
    if spec.layers is not None:
        object.__setattr__(spec, "layers", tuple(check_int_list("layers", spec.layers, lo=0)))
    _check_window(spec)


class _FieldNames:
    """``cls._required`` / ``cls._optional`` of a dataclass kind: read from its fields."""

    def __init__(self, which: int):
        self.which = which

    def __get__(self, obj: Any, cls: type) -> tuple[str, ...]:
        return cls._fields()[self.which]


@dataclass(frozen=True, eq=False)
class DuringTraining(Intervention):
    """An intervention during training (see the module docstring). Subclasses are frozen
    dataclasses that set ``kind`` and override what they do at a step."""

    #: the CPU fast step can carry it (its forward runs the components, hooks included)
    fast_cpu: ClassVar[bool] = True
    #: the batched multi-seed program (``vmap``) can carry it
    batched: ClassVar[bool] = True
    #: data-parallel ranks can carry it (each sees only its rows of the batch)
    data_parallel: ClassVar[bool] = True
    #: it reads the encoder's sequence as a matrix's rows and columns
    encoder_only: ClassVar[bool] = False

    _required = _FieldNames(0)
    _optional = _FieldNames(1)

    # ------------------------------------------------------------------- as data
    @classmethod
    def _fields(cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
        fs = dataclasses.fields(cls)
        required = tuple(f.name for f in fs if f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
        return required, tuple(f.name for f in fs if f.name not in required)

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def _to_data(self) -> dict[str, Any]:
        return {k: v for k, v in self.to_dict().items() if k != "kind"}

    @classmethod
    def _from_data(cls, fields: dict[str, Any], where: str) -> DuringTraining:
        return cls(**fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash((self.kind, repr(self.to_dict())))

    # ------------------------------------------------------------------- when
    def active(self, step: int) -> bool:
        """True when the update from ``step`` is intervened on."""
        start = getattr(self, "start_step", 0)
        end = getattr(self, "end_step", None)
        return start <= step and (end is None or step < end)

    def describe(self) -> str:
        return f"{self.kind} during training ({self._to_data()})"

    def acts_on(self, model) -> list[str]:
        layers = getattr(self, "layers", None)
        n_layers = model.cfg.n_layers
        return [f"blocks.{l}.attn.hook_attn_scores"
                for l in (range(n_layers) if layers is None else layers)]

    # ----------------------------------------------------------- what it does at a step
    def layer_range(self, n_layers: int) -> list[int]:
        layers = getattr(self, "layers", None)
        return list(range(n_layers) if layers is None else layers)

    def step_hooks(self, plan: Any, step: int) -> list[tuple[str, Any]]:
        """Forward hooks on the forward pass of the update from ``step`` (when :meth:`active`)."""
        return []

    def penalty_hooks(self, plan: Any, batch: Any, terms: list[Tensor]) -> list[tuple[str, Any]]:
        """Hooks that append this update's loss terms on ``batch`` to ``terms``."""
        return []

    def frozen(self, selected: list[str]) -> list[str]:
        """The parameters (of ``selected``, its groups' names) the update leaves unchanged."""
        return []

    def reinitializes(self) -> bool:
        """True when its groups' parameters are drawn afresh before the update."""
        return False


@dataclass(frozen=True, eq=False)
class AttentionLogitScale(DuringTraining):
    """Multiply every attention logit (``blocks.{l}.attn.hook_attn_scores``) of ``layers`` (None:
    all) by ``scale`` during the training updates of its window, and in the evaluations logged
    then: a temperature on attention.

    Example:
        >>> AttentionLogitScale(2.5, start_step=100).to_dict()
        {'kind': 'attention_logit_scale', 'scale': 2.5, 'layers': None, 'start_step': 100, 'end_step': None}
    """

    kind: ClassVar[str] = "attention_logit_scale"
    scale: float
    layers: tuple[int, ...] | None = None
    start_step: int = 0
    end_step: int | None = None

    def __post_init__(self) -> None:
        check_positive_float("scale", self.scale)
        _check_layers_and_window(self)

    def step_hooks(self, plan: Any, step: int) -> list[tuple[str, Any]]:
        scale = self.scale

        def hook(scores: Tensor, hook: Any) -> Tensor:
            return scores * scale

        return [(f"blocks.{l}.attn.hook_attn_scores", hook) for l in self.layer_range(plan.n_layers)]


@dataclass(frozen=True, eq=False)
class RowColumnAttentionScale(DuringTraining):
    """Multiply the attention every query pays to the *other entries of its own row and column*
    by ``factor`` (softmax weights, renormalized: ``log(factor)`` is added to those logits of
    ``hook_attn_scores``) in ``layers`` (None: all), during its window. Gopalani and Hu (NeurIPS
    2025) scale their linear attention at the positions the solved task reads; in matrix
    completion those are the row and the column (what the post-shift row and column heads read).
    ``factor < 1`` pushes attention away from them.

    Example:
        >>> RowColumnAttentionScale(10.0, start_step=500).active(499)
        False
    """

    kind: ClassVar[str] = "row_column_attention_scale"
    encoder_only: ClassVar[bool] = True
    factor: float
    layers: tuple[int, ...] | None = None
    start_step: int = 0
    end_step: int | None = None

    def __post_init__(self) -> None:
        check_positive_float("factor", self.factor)
        _check_layers_and_window(self)

    def step_hooks(self, plan: Any, step: int) -> list[tuple[str, Any]]:
        factor = self.factor

        def hook(scores: Tensor, hook: Any) -> Tensor:
            bias = plan.row_column_bias(scores.shape[-1], factor, scores.device)
            return scores + bias.to(scores.dtype)  # the fast step's scores are bf16

        return [(f"blocks.{l}.attn.hook_attn_scores", hook) for l in self.layer_range(plan.n_layers)]


@dataclass(frozen=True, eq=False)
class RowColumnAttentionPenalty(DuringTraining):
    """Add ``weight`` times the row/column attention mass to the training loss during its window:
    the mass masked entries' queries put on the observed entries of their own row and column
    (:func:`tfmatcomp.task.masks.row_column_mass`, the progress measure's definition), averaged
    over the heads and the ``layers`` (None: all). Chen et al. (ICLR 2024) suppress the attention
    structure that appears with the drop by such a regularizer to show that it is needed;
    ``weight > 0`` suppresses the row and column heads, ``weight < 0`` rewards them. The logged
    losses stay the plain losses. ``train_many`` trains such seeds one at a time (the batched
    program cannot collect the penalty inside ``vmap``); data-parallel training refuses it.

    Example:
        >>> RowColumnAttentionPenalty(1.0).to_dict()["kind"]
        'row_column_attention_penalty'
    """

    kind: ClassVar[str] = "row_column_attention_penalty"
    encoder_only: ClassVar[bool] = True
    fast_cpu: ClassVar[bool] = False
    batched: ClassVar[bool] = False
    data_parallel: ClassVar[bool] = False
    weight: float
    layers: tuple[int, ...] | None = None
    start_step: int = 0
    end_step: int | None = None

    def __post_init__(self) -> None:
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w != w or w in (
                float("inf"), float("-inf")) or w == 0:
            raise ValueError(f"weight: must be a finite non-zero number (> 0 suppresses, < 0 "
                             f"rewards the row/column attention), got {w!r}")
        _check_layers_and_window(self)

    def penalty_hooks(self, plan: Any, batch: Any, terms: list[Tensor]) -> list[tuple[str, Any]]:
        from tfmatcomp.task.masks import row_column_mass

        layers = self.layer_range(plan.n_layers)
        scale = self.weight / len(layers)

        def hook(pattern: Tensor, hook: Any) -> Tensor:
            mass = row_column_mass(pattern, batch.observed, batch.n_rows, batch.n_cols)
            if not torch.isnan(mass).any():  # nothing masked in the batch: no term
                terms.append(scale * mass.mean().to(pattern.dtype))
            return pattern

        return [(f"blocks.{l}.attn.hook_pattern", hook) for l in layers]


@dataclass(frozen=True, eq=False)
class Freeze(DuringTraining):
    """Leave the parameters of ``groups`` (names of :data:`tfmatcomp.models.param_groups.GROUPS`:
    ``"attention"``, ``"mlp"``, ``"token_embed"``, ``"pos_embed"``, ``"all"``, ...) but those of
    ``except_groups`` unchanged by the updates of its window (their gradients are dropped, so Adam
    skips them, its moments kept). ``Freeze("all", except_groups=["mlp"])`` trains the MLPs alone.

    Example:
        >>> Freeze("mlp", end_step=1000).groups
        ('mlp',)
    """

    kind: ClassVar[str] = "freeze"
    groups: tuple[str, ...]
    except_groups: tuple[str, ...] = ()
    start_step: int = 0
    end_step: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", _check_groups(self.groups))
        object.__setattr__(self, "except_groups",
                           _check_groups(self.except_groups) if self.except_groups else ())
        _check_window(self)
        if "all" in self.groups and not self.except_groups and self.start_step == 0 \
                and self.end_step is None:
            raise ValueError("groups: Freeze('all') for the whole run would train nothing; give "
                             "end_step (a pause), start_step, or except_groups (what still trains)")

    def frozen(self, selected: list[str]) -> list[str]:
        return selected


@dataclass(frozen=True, eq=False)
class Reinitialize(DuringTraining):
    """Before the update from ``step``, draw the parameters of ``groups`` afresh from the model's
    own initialization and clear their Adam state. The fresh model is seeded by ``seed``, or, when
    None, by the run's seed and ``step`` (each seed of a group then draws its own).

    Example:
        >>> Reinitialize(["attention"], step=2000).active(2000)
        True
    """

    kind: ClassVar[str] = "reinitialize"
    groups: tuple[str, ...]
    step: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", _check_groups(self.groups))
        check_int_in_range("step", self.step, 0, 10**12)
        check_seed("seed", self.seed, allow_none=True)

    def active(self, step: int) -> bool:
        return step == self.step

    def reinitializes(self) -> bool:
        return True


def during_training_kinds() -> list[str]:
    """The kinds of the registry that are interventions during training."""
    return sorted(k for k, c in KINDS.items() if issubclass(c, DuringTraining))


def during_training_from_dict(data: Any) -> DuringTraining:
    """The :class:`DuringTraining` that ``data`` (its :meth:`~DuringTraining.to_dict`, or the
    object itself) describes, through the one ``kind`` registry.

    Example:
        >>> during_training_from_dict({"kind": "reinitialize", "groups": "mlp", "step": 5})
        Reinitialize(groups=('mlp',), step=5, seed=None)
    """
    if isinstance(data, DuringTraining):
        return data
    kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
    if not isinstance(data, dict) or kind not in during_training_kinds():
        raise ValueError(f"interventions: each must be an intervention during training or its "
                         f"dict with 'kind' one of {during_training_kinds()}, got {kind!r}")
    return from_dict(data, "interventions")

