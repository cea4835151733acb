"""What differs between an encoder and a decoder run: one objective per model kind, registered once.

An :class:`Objective` says, for one model kind, which config and model classes it has, what the
model reads for a matrix batch (:meth:`~Objective.model_tokens`), how many positions that takes
(:meth:`~Objective.positions_needed`), the loss an update differentiates
(:meth:`~Objective.loss`) and the losses a run logs (:meth:`~Objective.metrics`,
:meth:`~Objective.evaluation_metrics`). :data:`OBJECTIVES` registers the two kinds under the names
that ``run.json`` and a checkpoint's ``config.json`` record (``"kind"``); the trainer
(:mod:`tfmatcomp.training.trainer`), the checkpoint loader (:mod:`tfmatcomp.runs.checkpoint`) and
the run directory (:mod:`tfmatcomp.runs.rundir`) all look kinds up here.

* ``"encoder"``: a :class:`~tfmatcomp.HookedEncoder` reads the batch's tokens and is trained on the
  MSE over all entries (:func:`tfmatcomp.mse`); it logs :func:`tfmatcomp.losses`.
* ``"decoder"``: a :class:`~tfmatcomp.HookedDecoder` reads the GPT sequence
  (:func:`tfmatcomp.task.gpt.encode_sequence`) and is trained on next-token cross-entropy on the
  value tokens (:func:`~tfmatcomp.task.gpt.value_token_loss`); it logs
  :func:`~tfmatcomp.task.gpt.gpt_losses` and, at evaluation, the greedy completion's
  :func:`~tfmatcomp.task.gpt.generation_metrics`.

Example:
    >>> import tfmatcomp as tm
    >>> objective = objective_for(tm.get_preset("gpt-tiny").model)
    >>> objective.kind, objective.model_class.__name__, objective.positions_needed(16)
    ('decoder', 'HookedDecoder', 33)
    >>> objective_named("encoder").positions_needed(16)
    16
"""

from __future__ import annotations

from typing import Any

from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.config import DecoderConfig, EncoderConfig
from tfmatcomp.models.decoder import HookedDecoder
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.task import gpt as gpt_task
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.metrics import losses, mse

__all__ = ["Objective", "EncoderObjective", "DecoderObjective", "OBJECTIVES", "DEFAULT_KIND",
           "objective_for", "objective_named", "objective_of_class", "as_model", "model_kind",
           "config_kind"]


class Objective:
    """The training objective of one model kind (see the module docstring)."""

    #: the name ``run.json`` and ``config.json`` record
    kind: str
    #: the model config class of this kind
    config_class: type
    #: the model class this kind's config builds
    model_class: type
    #: the fast training step (:mod:`tfmatcomp.training.fast_step`) can train this kind
    fast_step: bool = False

    def parameter_count(self, cfg: Any) -> int:
        """Parameters of the model ``cfg`` describes, from the sizes alone (nothing allocated)."""
        d, h, dh, m = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp
        attn = 3 * (h * d * dh + h * dh) + h * dh * d + d
        return cfg.n_layers * (attn + 2 * d + (d * m + m + m * d + d) + 2 * d)

    def positions_needed(self, n_positions: int) -> int:
        """Positions the model reads for matrices of ``n_positions`` entries."""
        raise NotImplementedError

    def model_tokens(self, batch: MatrixBatch) -> Int[Tensor, "batch seq"]:
        """What the model reads for ``batch``."""
        raise NotImplementedError

    def loss(self, predictions: Tensor, batch: MatrixBatch,
             tokens: Int[Tensor, "batch seq"]) -> Float[Tensor, ""]:
        """The loss an update differentiates, from the model's output on ``tokens``."""
        raise NotImplementedError

    def metrics(self, output: Tensor, batch: MatrixBatch,
                tokens: Int[Tensor, "batch seq"] | None = None) -> dict[str, Tensor]:
        """The logged losses (``L``, ``L_obs``, ``L_mask``, ...) of the model's ``output``."""
        raise NotImplementedError

    def evaluation_metrics(self, model: Any, batch: MatrixBatch) -> dict[str, float]:
        """Metrics measured at evaluation only, besides :meth:`metrics` (none by default)."""
        return {}

    def forward_loss(self, model: Any, batch: MatrixBatch) -> tuple[Tensor, Float[Tensor, ""]]:
        """``(predictions, loss)``: the update's forward pass on ``batch`` and its loss."""
        tokens = self.model_tokens(batch)
        predictions = model(tokens)
        return predictions, self.loss(predictions, batch, tokens)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class EncoderObjective(Objective):
    """A :class:`~tfmatcomp.HookedEncoder` on masked matrix completion: MSE over all entries.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> batch = tm.MatrixCompletionTask(4, rank=1).sample(2, torch.Generator().manual_seed(0))
        >>> sorted(EncoderObjective().metrics(batch.values, batch))[:3]
        ['L', 'L_mask', 'L_obs']
    """

    kind = "encoder"
    config_class = EncoderConfig
    model_class = HookedEncoder
    fast_step = True

    def parameter_count(self, cfg: EncoderConfig) -> int:
        d = cfg.d_model
        embed = (cfg.d_vocab + cfg.n_ctx + cfg.n_token_types) * d + 2 * d
        head = {"regression": d * cfg.d_out + cfg.d_out,            # readout W, b
                "masked_lm": d * d + 3 * d + (d + 1) * cfg.d_vocab,  # mlm_head W, b, ln; unembed
                "none": 0}[cfg.head]
        return embed + super().parameter_count(cfg) + head

    def positions_needed(self, n_positions: int) -> int:
        return int(n_positions)

    def model_tokens(self, batch: MatrixBatch) -> Int[Tensor, "batch pos"]:
        return batch.tokens

    def loss(self, predictions: Float[Tensor, "batch pos"], batch: MatrixBatch,
             tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, ""]:
        return mse(predictions, batch.values)

    def metrics(self, output: Float[Tensor, "batch pos"], batch: MatrixBatch,
                tokens: Int[Tensor, "batch pos"] | None = None) -> dict[str, Tensor]:
        return losses(output, batch)


class DecoderObjective(Objective):
    """A :class:`~tfmatcomp.HookedDecoder` on the GPT variant: cross-entropy on the value tokens.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> batch = tm.MatrixCompletionTask(4, rank=1).sample(2, torch.Generator().manual_seed(0))
        >>> DecoderObjective().model_tokens(batch).shape
        torch.Size([2, 33])
    """

    kind = "decoder"
    config_class = DecoderConfig
    model_class = HookedDecoder

    def parameter_count(self, cfg: DecoderConfig) -> int:
        # no embedding LN; final LN and unembedding W_U, b_U
        d = cfg.d_model
        return ((cfg.d_vocab + cfg.n_ctx) * d + super().parameter_count(cfg) + 2 * d
                + (d + 1) * cfg.d_vocab)

    def positions_needed(self, n_positions: int) -> int:
        return gpt_task.sequence_length(n_positions)

    def model_tokens(self, batch: MatrixBatch) -> Int[Tensor, "batch seq"]:
        return gpt_task.encode_sequence(batch)

    def loss(self, predictions: Float[Tensor, "batch seq d_vocab"], batch: MatrixBatch,
             tokens: Int[Tensor, "batch seq"]) -> Float[Tensor, ""]:
        return gpt_task.value_token_loss(predictions, tokens)

    def metrics(self, output: Float[Tensor, "batch seq d_vocab"], batch: MatrixBatch,
                tokens: Int[Tensor, "batch seq"] | None = None) -> dict[str, Tensor]:
        return gpt_task.gpt_losses(output, batch, tokens)

    def evaluation_metrics(self, model: Any, batch: MatrixBatch) -> dict[str, float]:
        return gpt_task.generation_metrics(model, batch)


#: Every model kind, by the name ``run.json`` and ``config.json`` record.
OBJECTIVES: dict[str, Objective] = {o.kind: o for o in (EncoderObjective(), DecoderObjective())}
#: The kind of a checkpoint or run record that names none (written before the decoder existed).
DEFAULT_KIND = "encoder"


def objective_named(kind: Any) -> Objective:
    """The objective registered as ``kind``.

    Raises:
        ValueError: ``kind`` is not one of :data:`OBJECTIVES`.
    """
    if not isinstance(kind, str) or kind not in OBJECTIVES:
        raise ValueError(f"kind: expected one of {sorted(OBJECTIVES)}, got {kind!r}")
    return OBJECTIVES[kind]


def objective_for(what: Any) -> Objective:
    """The objective of a model config or a model (its exact class decides).

    Raises:
        TypeError: ``what`` is neither a registered config nor a registered model.

    Example:
        >>> import tfmatcomp as tm
        >>> objective_for(tm.HookedEncoder(tm.get_preset("tiny").model)).kind
        'encoder'
        >>> objective_for(3)
        Traceback (most recent call last):
        ...
        TypeError: model_cfg: expected an EncoderConfig or a DecoderConfig (or their models), got int
    """
    for objective in OBJECTIVES.values():
        if isinstance(what, (objective.config_class, objective.model_class)):
            return objective
    raise TypeError(f"model_cfg: expected an EncoderConfig or a DecoderConfig (or their models), "
                    f"got {type(what).__name__}")


def objective_of_class(model_class: type) -> Objective | None:
    """The objective whose model class ``model_class`` is (or subclasses), or None.

    Example:
        >>> import tfmatcomp as tm
        >>> objective_of_class(tm.HookedDecoder).kind, objective_of_class(int)
        ('decoder', None)
    """
    return next((o for o in OBJECTIVES.values() if issubclass(model_class, o.model_class)), None)


def as_model(what: Any, kind: str, seed: int = 0) -> Any:
    """``what`` if it is a model of ``kind``, a fresh one (seeded ``seed``) if it is its config.

    Raises:
        ValueError: ``what`` is neither (the message names the expected classes).
    """
    objective = objective_named(kind)
    if isinstance(what, objective.model_class):
        return what
    if isinstance(what, objective.config_class):
        return objective.model_class(what, seed=seed)
    raise ValueError(f"model: expected a {objective.model_class.__name__} or a "
                     f"{objective.config_class.__name__}, got {type(what).__name__}")


def model_kind(what: Any) -> str | None:
    """The kind of a model (``"encoder"``, ``"decoder"``, ...), None when ``what`` is no registered
    model (a config, a path, anything else). Code outside ``models/`` asks this instead of testing
    model classes, so a new kind is registered in :data:`OBJECTIVES` alone.

    Example:
        >>> import tfmatcomp as tm
        >>> model_kind(tm.HookedEncoder(tm.get_preset("tiny").model)), model_kind(tm.get_preset("tiny").model)
        ('encoder', None)
    """
    for objective in OBJECTIVES.values():
        if isinstance(what, objective.model_class):
            return objective.kind
    return None


def config_kind(what: Any) -> str | None:
    """The kind of a model config, None when ``what`` is no registered config.

    Example:
        >>> import tfmatcomp as tm
        >>> config_kind(tm.get_preset("tiny").model), config_kind("tiny")
        ('encoder', None)
    """
    for objective in OBJECTIVES.values():
        if isinstance(what, objective.config_class):
            return objective.kind
    return None
