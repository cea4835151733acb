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
* ``"lm"``: a :class:`~tfmatcomp.HookedDecoder` on next-token prediction over a text (the
  character-level language model, :mod:`tfmatcomp.training.lm`): its task is a
  :class:`~tfmatcomp.training.lm.TextTask` (which names this objective), trained with AdamW, the
  task's warm-up and cosine schedule and gradient clipping, evaluated on fixed batches drawn once;
  it logs ``lr``, ``train_loss`` and ``eval_loss``. A model config alone never selects it: the
  decoder's config and model classes are the ``"decoder"`` kind's, and the task decides.

Everything the trainer does that differs between kinds is asked of the objective: the optimizer
(:meth:`~Objective.make_optimizer`), the update's last stage (:meth:`~Objective.apply_update`),
fixed evaluation batches (:meth:`~Objective.evaluation_batches`), the names of the logged columns
(:meth:`~Objective.record`), what a checkpoint records of the task
(:meth:`~Objective.checkpoint_fields`) and what a resume compares (:meth:`~Objective.task_record`).

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

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.config import DecoderConfig, EncoderConfig
from tfmatcomp.models.decoder import HookedDecoder, next_token_loss
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.task import gpt as gpt_task
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.metrics import losses, mse

__all__ = ["Objective", "EncoderObjective", "DecoderObjective", "LanguageModelObjective",
           "OBJECTIVES", "DEFAULT_KIND",
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
    #: the run's task is a :class:`~tfmatcomp.TaskConfig`, recorded in ``run.json``, in the
    #: checkpoints and on the model (``model.task_cfg``)
    task_recorded: bool = True
    #: logged training values written without the ``train_`` prefix (e.g. the learning rate)
    unprefixed: tuple[str, ...] = ()

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

    # ------------------------------------------------------------ how a run trains this kind
    def check_task(self, task: Any, model_cfg: Any) -> None:
        """Refuse a task the model cannot read (a matrix needing more positions than ``n_ctx``).

        Raises:
            ValueError: naming ``task_cfg``.
        """
        needed = self.positions_needed(task.n_positions)
        if needed > model_cfg.n_ctx:
            raise ValueError(f"task_cfg: {task.n_rows}x{task.n_cols} matrices need "
                             f"{needed} positions but model_cfg.n_ctx is {model_cfg.n_ctx}")

    def generator_device(self, device: torch.device) -> torch.device:
        """Where the run's training and evaluation streams draw (the run's device: the matrix
        task samples there)."""
        return device

    def make_optimizer(self, model: Any, lr: float, task: Any,
                       fused: bool = False) -> torch.optim.Optimizer:
        """The run's optimizer: Adam at the constant rate ``lr`` (fused for the fast step)."""
        return torch.optim.Adam(list(model.parameters()), lr=lr, **({"fused": True} if fused else {}))

    def apply_update(self, model: Any, optimizer: torch.optim.Optimizer, step: int,
                     task: Any) -> dict[str, float]:
        """The update from ``step`` once its gradients are in: the optimizer's step. Returns the
        values the update logs besides its losses (none here)."""
        optimizer.step()
        return {}

    def evaluation_batches(self, task: Any, generator: torch.Generator,
                           batch_size: int) -> list | None:
        """Fixed evaluation batches, drawn once when the run is built (None: a fresh batch of the
        evaluation stream at every evaluation)."""
        return None

    def evaluate_batches(self, model: Any, batches: list) -> dict[str, float]:
        """The evaluation losses on the fixed ``batches`` of :meth:`evaluation_batches`."""
        raise NotImplementedError

    def record(self, step: int, train: dict[str, Any], evaluation: dict[str, Any]) -> dict[str, Any]:
        """One metrics row: ``step``, the training values as ``train_*`` (but :attr:`unprefixed`),
        the evaluation's as ``eval_*``."""
        row: dict[str, Any] = {"step": step}
        row.update({(k if k in self.unprefixed else f"train_{k}"): float(v) for k, v in train.items()})
        row.update({f"eval_{k}": float(v) for k, v in evaluation.items()})
        return row

    def postfix(self, row: dict[str, Any]) -> dict[str, str]:
        """The progress bar's losses after a logging step."""
        return {"L_obs": f"{row['train_L_obs']:.2e}", "L_mask": f"{row['train_L_mask']:.3f}"}

    def checkpoint_fields(self, task: Any) -> dict[str, Any]:
        """What a checkpoint records of the run's task (:func:`~tfmatcomp.save_checkpoint`'s
        keywords)."""
        return {"task_cfg": task}

    def task_record(self, task: Any) -> Any:
        """What a resume compares of the run's task with the checkpoint's."""
        return task

    def recorded_task(self, info: Any) -> Any:
        """:meth:`task_record` as a checkpoint (its loaded info) recorded it."""
        return info.task_cfg

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


def _text_batch(batch: Any) -> tuple[Tensor, Tensor | None]:
    """``(tokens, weights)`` of a text batch (tokens alone, or a pair)."""
    return (batch[0], batch[1]) if isinstance(batch, tuple) else (batch, None)


class LanguageModelObjective(DecoderObjective):
    """A :class:`~tfmatcomp.HookedDecoder` on next-token prediction over a text: the objective of
    a :class:`~tfmatcomp.training.lm.TextTask` (nanoGPT's recipe; see the module docstring).

    The task gives the batches (``task.sample``: tokens ``[batch, T]``, or ``(tokens, weights)``
    with ``weights`` selecting the targets that count), the schedule (``task.lr_factor(step)``),
    ``task.weight_decay``, ``task.grad_clip``, ``task.eval_batches`` and what a checkpoint records
    (``task.checkpoint_metadata()``, ``task.recipe``).

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=1, d_model=8, d_mlp=8,
        ...                                           n_ctx=4, d_vocab=3))
        >>> logits, loss = OBJECTIVES["lm"].forward_loss(model, torch.tensor([[0, 1, 2, 0]]))
        >>> logits.shape, bool(loss > 0)
        (torch.Size([1, 4, 3]), True)
    """

    kind = "lm"
    task_recorded = False
    unprefixed = ("lr",)

    def check_task(self, task: Any, model_cfg: DecoderConfig) -> None:
        tokenizer = getattr(task, "tokenizer", None)
        if tokenizer is not None and tokenizer.vocab_size > model_cfg.d_vocab:
            raise ValueError(f"tokenizer: {tokenizer.vocab_size} characters, but the model's "
                             f"d_vocab is {model_cfg.d_vocab}")

    def positions_needed(self, n_positions: int) -> int:
        return int(n_positions)

    def model_tokens(self, batch: Any) -> Int[Tensor, "batch seq"]:
        return _text_batch(batch)[0]

    def forward_loss(self, model: Any, batch: Any) -> tuple[Tensor, Float[Tensor, ""]]:
        tokens, weights = _text_batch(batch)
        model.check_tokens(tokens)
        tokens = tokens.to(model.device)
        logits = model(tokens)
        return logits, next_token_loss(logits, tokens,
                                       None if weights is None else weights.to(model.device))

    def loss(self, predictions: Float[Tensor, "batch seq d_vocab"], batch: Any,
             tokens: Int[Tensor, "batch seq"] | None = None) -> Float[Tensor, ""]:
        tokens, weights = _text_batch(batch)
        device = predictions.device
        return next_token_loss(predictions, tokens.to(device),
                               None if weights is None else weights.to(device))

    def metrics(self, output: Float[Tensor, "batch seq d_vocab"], batch: Any,
                tokens: Int[Tensor, "batch seq"] | None = None) -> dict[str, Tensor]:
        return {"loss": self.loss(output, batch)}

    def evaluation_metrics(self, model: Any, batch: Any) -> dict[str, float]:
        return {}

    def generator_device(self, device: torch.device) -> torch.device:
        """The CPU: a text sampler draws there (its token stream is on the CPU); the objective
        moves each batch to the model."""
        return torch.device("cpu")

    def make_optimizer(self, model: Any, lr: float, task: Any,
                       fused: bool = False) -> torch.optim.Optimizer:
        """AdamW, ``betas = (0.9, 0.95)``, the task's weight decay on matrices and embeddings and
        none on biases and LayerNorms."""
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": task.weight_decay},
                                  {"params": no_decay, "weight_decay": 0.0}],
                                 lr=lr, betas=(0.9, 0.95))

    def apply_update(self, model: Any, optimizer: torch.optim.Optimizer, step: int,
                     task: Any) -> dict[str, float]:
        """Clip the gradients (``task.grad_clip``), step at the scheduled rate
        (``lr * task.lr_factor(step)``); between updates the groups keep the peak rate, so the
        optimizer state a checkpoint records does not depend on where the schedule stands."""
        if task.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), task.grad_clip)
        factor = task.lr_factor(step)
        peaks = [group["lr"] for group in optimizer.param_groups]
        for group, peak in zip(optimizer.param_groups, peaks):
            group["lr"] = peak * factor
        current = optimizer.param_groups[0]["lr"]
        try:
            optimizer.step()
        finally:
            for group, peak in zip(optimizer.param_groups, peaks):
                group["lr"] = peak
        return {"lr": current}

    def evaluation_batches(self, task: Any, generator: torch.Generator,
                           batch_size: int) -> list:
        return [_text_batch(task.sample_eval(batch_size, generator))
                for _ in range(task.eval_batches)]

    @torch.no_grad()
    def evaluate_batches(self, model: Any, batches: list) -> dict[str, float]:
        was_training = model.training
        model.eval()
        losses = []
        for tokens, weights in batches:
            tokens = tokens.to(model.device)
            losses.append(next_token_loss(model(tokens), tokens,
                                          None if weights is None else weights.to(model.device)).item())
        model.train(was_training)
        return {"loss": sum(losses) / len(losses)}

    def postfix(self, row: dict[str, Any]) -> dict[str, str]:
        return {"loss": f"{row['train_loss']:.3f}"}

    def checkpoint_fields(self, task: Any) -> dict[str, Any]:
        return {"metadata": task.checkpoint_metadata()}

    def task_record(self, task: Any) -> Any:
        return task.recipe

    def recorded_task(self, info: Any) -> Any:
        return (info.metadata or {}).get("train_lm")


#: Every model kind, by the name ``run.json`` and ``config.json`` record. A kind selected by its
#: task alone (``"lm"``) comes after the kind its classes select (``"decoder"``).
OBJECTIVES: dict[str, Objective] = {o.kind: o for o in (EncoderObjective(), DecoderObjective(),
                                                        LanguageModelObjective())}
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


def objective_for(what: Any, task: Any = None) -> Objective:
    """The objective of a model config or a model (its class decides), or of the run's ``task``
    when the task names one (``task.objective``, e.g. a
    :class:`~tfmatcomp.training.lm.TextTask`'s ``"lm"``).

    Raises:
        TypeError: ``what`` is neither a registered config nor a registered model, or not of the
            classes of the objective its task names.

    Example:
        >>> import tfmatcomp as tm
        >>> objective_for(tm.HookedEncoder(tm.get_preset("tiny").model)).kind
        'encoder'
        >>> objective_for(3)
        Traceback (most recent call last):
        ...
        TypeError: model_cfg: expected an EncoderConfig or a DecoderConfig (or their models), got int
    """
    named = getattr(task, "objective", None)
    if isinstance(named, str):
        objective = objective_named(named)
        if not isinstance(what, (objective.config_class, objective.model_class)):
            raise TypeError(f"model_cfg: a {named!r} task trains a "
                            f"{objective.model_class.__name__}, got {type(what).__name__}")
        return objective
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
