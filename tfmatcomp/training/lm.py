"""A small character-level GPT (NanoGPT-like) trained on a text the package reaches offline.

Song & Zhong's Table 1 has a NanoGPT row: a 6-layer character-level GPT trained on Shakespeare
(Appendix A.2: AdamW, weight decay 0.1, cosine schedule with warm-up). Nothing may download here,
so the text is one that ships with Python itself: the help texts of the standard library's
``pydoc_data.topics`` (79 topics, about 465K characters; :func:`pydoc_documents`), each topic a
document, so the context basis has cluster labels too.

* :class:`CharTokenizer`: one id per character, saved into a checkpoint's JSON metadata
  (:meth:`CharTokenizer.to_dict`, :func:`tokenizer_from_metadata`), so that ``tfmatcomp geometry``
  can read a trained checkpoint back with its tokenizer;
* :func:`encode_documents`, :func:`text_sampler`: the token stream and seeded random windows of it;
* :class:`TextTask`: the task of a language-model run (its batches, its evaluation batches, the
  recipe: warm-up and cosine decay, weight decay, gradient clipping; the tokenizer). It names the
  ``"lm"`` model kind, whose objective (:class:`~tfmatcomp.models.objectives.LanguageModelObjective`)
  holds the loss, the optimizer (AdamW), the schedule's application and the logged metrics;
* :func:`train_lm`: nanoGPT's recipe in one call. It is :func:`tfmatcomp.train` with
  ``model_cfg=``, ``task_cfg=TextTask(...)`` and a :class:`~tfmatcomp.TrainConfig`: the same
  :class:`~tfmatcomp.training.plan.RunSetup` keywords, the same host (:class:`~tfmatcomp.Trainer`)
  and loop, so the run directory's lock and rules (:mod:`tfmatcomp.runs.rundir`), the checkpoints
  (``RUN_DIR/checkpoints/step_XXXXXXX/``, with the tokenizer and the recipe in their metadata), the
  metrics log (``RUN_DIR/metrics.jsonl``, read by :func:`tfmatcomp.read_metrics`), resume and the
  divergence check are the trainers'. A language-model run writes no ``run.json`` (its task is not
  a :class:`~tfmatcomp.TaskConfig`; the checkpoints record it).

Example:
    >>> import torch, tfmatcomp as tm
    >>> docs = pydoc_documents(max_documents=3)
    >>> tok = CharTokenizer.from_documents(docs)
    >>> stream = encode_documents(docs, tok)
    >>> cfg = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16,
    ...                        d_vocab=tok.vocab_size)
    >>> result = train_lm(cfg, text_sampler(stream, 16), tokenizer=tok, n_steps=4, batch_size=4,
    ...                   log_every=2)
    >>> list(result.metrics["step"]), tok.decode(tok.encode("abc"))
    ([2, 4], 'abc')
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.config import DecoderConfig, TrainConfig
from tfmatcomp.models.decoder import HookedDecoder
from tfmatcomp.runs.layout import checkpoint_path
from tfmatcomp.task.corpus import Document
from tfmatcomp.training.trainer import train
from tfmatcomp.validation import (check_in_range, check_int_in_range, check_non_negative,
                                  check_positive_float, check_positive_int)

__all__ = ["CharTokenizer", "tokenizer_from_metadata", "pydoc_documents", "encode_documents",
           "text_sampler", "Sampler", "TextTask", "LMResult", "train_lm", "cosine_lr"]

#: A batch source: ``sampler(batch_size, generator)`` returns tokens ``[batch, T]`` or
#: ``(tokens, weights)`` with ``weights [batch, T]`` saying which next-token targets count
#: (``weights[:, t]`` weighs the prediction of ``tokens[:, t]`` from the tokens before it).
Sampler = Callable[[int, torch.Generator], "Tensor | tuple[Tensor, Tensor]"]


@dataclass(frozen=True)
class CharTokenizer:
    """One token per character: id ``i`` is ``chars[i]``.

    Attributes:
        chars: the vocabulary, in id order, without repeats.

    Example:
        >>> tok = CharTokenizer("ab c")
        >>> tok.encode("a cab"), tok.decode([3, 0]), tok.vocab_size
        ([0, 2, 3, 0, 1], 'ca', 4)
        >>> tok.encode("ax")
        Traceback (most recent call last):
        ...
        ValueError: text: characters not in the tokenizer's vocabulary: ['x']
    """

    chars: str

    def __post_init__(self) -> None:
        if not isinstance(self.chars, str) or not self.chars:
            raise ValueError(f"chars: expected a non-empty string, got {self.chars!r}")
        if len(set(self.chars)) != len(self.chars):
            raise ValueError("chars: every character must appear once")

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        """The sorted set of the characters of ``text``.

        Example:
            >>> CharTokenizer.from_text("banana").chars
            'abn'
        """
        return cls("".join(sorted(set(text))))

    @classmethod
    def from_documents(cls, documents: Sequence[Document], separator: str = "\n\n") -> "CharTokenizer":
        """The sorted set of the characters of every document (and of the separator)."""
        return cls.from_text(separator + "".join(d.text for d in documents))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def _index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text`` (a character outside the vocabulary is an error). There are no special
        tokens; the argument is accepted so that it reads like a transformers tokenizer."""
        index = self._index
        unknown = sorted({c for c in text if c not in index})
        if unknown:
            raise ValueError(f"text: characters not in the tokenizer's vocabulary: {unknown[:10]}")
        return [index[c] for c in text]

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """The text of ``ids``."""
        ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids: must lie in [0, {self.vocab_size - 1}], got {bad[:5]}")
        return "".join(self.chars[i] for i in ids)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for a checkpoint's metadata."""
        return {"kind": "char", "chars": self.chars}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CharTokenizer":
        if not isinstance(data, dict) or data.get("kind") != "char" or "chars" not in data:
            raise ValueError(f"data: not a character tokenizer's dict: {data!r:.80}")
        return cls(data["chars"])


def tokenizer_from_metadata(metadata: dict[str, Any]) -> CharTokenizer | None:
    """The :class:`CharTokenizer` a checkpoint's metadata records under ``"tokenizer"``, or None.

    Example:
        >>> tokenizer_from_metadata({"tokenizer": CharTokenizer("ab").to_dict()})
        CharTokenizer(chars='ab')
    """
    data = (metadata or {}).get("tokenizer")
    return None if data is None else CharTokenizer.from_dict(data)


def pydoc_documents(max_documents: int | None = None) -> list[Document]:
    """The standard library's help topics (``pydoc_data.topics``), one document per topic, sorted
    by name: an English technical text that every Python installation has (its exact content
    follows the Python version).

    Example:
        >>> docs = pydoc_documents()
        >>> len(docs) > 50, sum(len(d.text) for d in docs) > 100_000
        (True, True)
    """
    from pydoc_data.topics import topics

    check_positive_int("max_documents", max_documents, allow_none=True)
    docs = [Document(name, topics[name].strip()) for name in sorted(topics) if topics[name].strip()]
    return docs[:max_documents] if max_documents is not None else docs


def encode_documents(documents: Sequence[Document], tokenizer: CharTokenizer,
                     separator: str = "\n\n") -> Int[Tensor, "n_tokens"]:
    """All documents as one token stream, joined by ``separator``.

    Example:
        >>> encode_documents([Document("a", "ab"), Document("b", "b")], CharTokenizer("ab\\n"))
        tensor([0, 1, 2, 2, 1])
    """
    if not documents:
        raise ValueError("documents: empty")
    return torch.tensor(tokenizer.encode(separator.join(d.text for d in documents)), dtype=torch.long)


def text_sampler(stream: Int[Tensor, "n_tokens"], n_positions: int) -> Sampler:
    """Random windows of ``n_positions`` consecutive tokens of ``stream`` (every target counts).

    Example:
        >>> s = text_sampler(torch.arange(10), 4)
        >>> s(2, torch.Generator().manual_seed(0)).tolist()
        [[4, 5, 6, 7], [3, 4, 5, 6]]
    """
    check_positive_int("n_positions", n_positions)
    if stream.ndim != 1 or stream.numel() < n_positions:
        raise ValueError(f"stream: expected a 1-D token stream of at least {n_positions} tokens, "
                         f"got shape {tuple(stream.shape)}")
    offsets = torch.arange(n_positions)

    def sample(batch_size: int, generator: torch.Generator) -> Tensor:
        starts = torch.randint(0, stream.numel() - n_positions + 1, (batch_size,), generator=generator)
        return stream[starts[:, None] + offsets]

    return sample


def cosine_lr(step: int, n_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """The learning-rate factor at ``step`` (0-based update index): linear warm-up to 1 over
    ``warmup_steps``, then cosine decay to ``min_ratio`` at ``n_steps`` (nanoGPT's schedule).

    Example:
        >>> [round(cosine_lr(s, 10, 2, 0.1), 3) for s in (0, 1, 2, 6, 10)]
        [0.5, 1.0, 1.0, 0.55, 0.1]
    """
    check_positive_int("n_steps", n_steps)
    check_int_in_range("warmup_steps", warmup_steps, 0, n_steps)
    check_in_range("min_ratio", min_ratio, 0.0, 1.0)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, n_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True, eq=False)
class TextTask:
    """The task of a language-model run: next-token prediction on a sampler's batches, trained on
    nanoGPT's recipe. Pass it as ``task_cfg`` to :func:`tfmatcomp.train` (with a
    :class:`~tfmatcomp.DecoderConfig` or a :class:`~tfmatcomp.HookedDecoder`); it names the
    ``"lm"`` objective (:data:`~tfmatcomp.models.objectives.OBJECTIVES`).

    Attributes:
        sampler: the training batches (:data:`Sampler`, e.g. :func:`text_sampler`); it is called
            with the run's training generator, a CPU one (the batch then moves to the model).
        n_steps: the length of the learning-rate schedule (the run's ``n_steps``).
        tokenizer: recorded in the checkpoints' metadata (``tfmatcomp geometry`` reads it back).
        eval_sampler: the evaluation batches (default: ``sampler``), ``eval_batches`` of them
            drawn once from the evaluation stream when the run is built, the same at every
            evaluation.
        warmup_steps: linear warm-up updates (default ``n_steps // 20``), in ``[0, n_steps]``.
        min_lr_ratio: the final learning rate as a fraction of the peak, in ``[0, 1]``.
        weight_decay: AdamW's decoupled weight decay (``>= 0``) on matrices and embeddings.
        grad_clip: maximum gradient norm (None: no clipping).
        eval_batches: evaluation batches.
        metadata: more JSON-ready entries for the checkpoints' metadata (e.g. ``family``).

    Example:
        >>> task = TextTask(text_sampler(torch.arange(40) % 5, 8), n_steps=100)
        >>> task.objective, task.warmup_steps, round(task.lr_factor(99), 3)
        ('lm', 5, 0.1)
    """

    objective: ClassVar[str] = "lm"

    sampler: Sampler
    n_steps: int
    tokenizer: CharTokenizer | None = None
    eval_sampler: Sampler | None = None
    warmup_steps: int | None = None
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0
    eval_batches: int = 4
    metadata: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not callable(self.sampler):
            raise ValueError(f"sampler: expected a callable (batch_size, generator), got "
                             f"{type(self.sampler).__name__}")
        check_positive_int("n_steps", self.n_steps)
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", self.n_steps // 20)
        check_int_in_range("warmup_steps", self.warmup_steps, 0, self.n_steps)
        check_in_range("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_non_negative("weight_decay", self.weight_decay)
        if self.grad_clip is not None:
            check_positive_float("grad_clip", self.grad_clip)
        check_positive_int("eval_batches", self.eval_batches)
        json.dumps(self.checkpoint_metadata())  # refuse what a checkpoint could not record

    def build(self) -> "TextTask":
        """The task itself (a :class:`~tfmatcomp.TaskConfig` builds its task; this one is one)."""
        return self

    def sample(self, batch_size: int, generator: torch.Generator,
               device: torch.device | str | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """A training batch (the objective moves it to the model's device)."""
        return self.sampler(batch_size, generator)

    def sample_eval(self, batch_size: int, generator: torch.Generator) -> Tensor | tuple[Tensor, Tensor]:
        """An evaluation batch."""
        return (self.eval_sampler or self.sampler)(batch_size, generator)

    def lr_factor(self, step: int) -> float:
        """The learning-rate factor of the update from ``step`` (:func:`cosine_lr`)."""
        return cosine_lr(step, self.n_steps, self.warmup_steps, self.min_lr_ratio)

    @property
    def recipe(self) -> dict[str, Any]:
        """What a resume must find unchanged (the checkpoints' ``train_lm`` metadata)."""
        return {"n_steps": self.n_steps, "min_lr_ratio": self.min_lr_ratio,
                "warmup_steps": self.warmup_steps, "weight_decay": self.weight_decay,
                "grad_clip": self.grad_clip, "eval_batches": self.eval_batches}

    def checkpoint_metadata(self) -> dict[str, Any]:
        """The checkpoints' metadata: the tokenizer, the recipe, :attr:`metadata`."""
        return {"tokenizer": self.tokenizer.to_dict() if self.tokenizer is not None else None,
                "train_lm": self.recipe, **(self.metadata or {})}


@dataclass
class LMResult:
    """What :func:`train_lm` returns.

    Attributes:
        model: the trained decoder (eval mode).
        tokenizer: the tokenizer recorded with it (or None).
        metrics: one row per logged step: ``step``, ``lr``, ``train_loss`` (the update's batch,
            before the update), ``eval_loss`` (fixed evaluation batches, after the update),
            ``elapsed_s``.
        path: the last checkpoint (None without ``out_dir``).
    """

    model: HookedDecoder
    tokenizer: CharTokenizer | None
    metrics: pd.DataFrame
    path: Path | None


def train_lm(
    model: HookedDecoder | DecoderConfig,
    sampler: Sampler,
    *,
    tokenizer: CharTokenizer | None = None,
    eval_sampler: Sampler | None = None,
    n_steps: int = 1000,
    batch_size: int = 32,
    lr: float = 1e-3,
    min_lr_ratio: float = 0.1,
    warmup_steps: int | None = None,
    weight_decay: float = 0.1,
    grad_clip: float | None = 1.0,
    seed: int = 0,
    log_every: int = 100,
    eval_batches: int = 4,
    out_dir: str | os.PathLike | None = None,
    resume: bool = False,
    overwrite: bool = False,
    checkpoint_every: int = 0,
    metadata: dict[str, Any] | None = None,
    progress: bool = False,
) -> LMResult:
    """Train a :class:`~tfmatcomp.HookedDecoder` on next-token prediction (nanoGPT's recipe):
    :func:`tfmatcomp.train` of a :class:`TextTask`, nothing else.

    AdamW (``betas = (0.9, 0.95)``; weight decay on matrices and embeddings, none on biases and
    LayerNorms), linear warm-up then cosine decay to ``min_lr_ratio * lr`` (:func:`cosine_lr`),
    gradient clipping. The model is initialized from ``seed``; training batches come from a
    generator seeded ``seed + 1``, evaluation batches (drawn once, the same at every logging step)
    from one seeded ``seed + 2``. No dropout (the decoder has none). It trains where a given
    ``model`` is, and on the CPU for a config.

    Args:
        model: a decoder to continue training, or the config of a fresh one.
        sampler: the training batches (:class:`TextTask`'s, as are ``tokenizer``,
            ``eval_sampler``, ``min_lr_ratio``, ``warmup_steps``, ``weight_decay``, ``grad_clip``,
            ``eval_batches`` and ``metadata``).
        tokenizer: recorded in the checkpoints' metadata.
        eval_sampler: the evaluation batches (default: ``sampler``).
        n_steps: optimizer updates (the :class:`~tfmatcomp.TrainConfig`'s, as are ``batch_size``,
            also the evaluation batches' size, ``lr``, the peak rate, ``seed``, ``log_every`` and
            ``checkpoint_every``, 0: only the last step).
        out_dir: the run directory, locked while training writes it; it must be empty unless
            ``resume`` or ``overwrite`` (as for :func:`tfmatcomp.train`, as are ``progress``).
        resume: continue from the latest checkpoint with training state, exactly as the
            uninterrupted run at the same thread count (the same recipe is required).

    Raises:
        ValueError: an argument out of range (the message names it), or a sampler whose tokens do
            not fit the model.
        FloatingPointError: a non-finite loss (training stops before that update).
        RunDirError: ``out_dir`` holds a run (without ``resume`` or ``overwrite``), another
            trainer holds it, or it has checkpoints but none with training state.
        ConfigMismatchError: resuming a run of another model config or recipe.

    Example:
        >>> import tfmatcomp as tm
        >>> cfg = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=8, d_vocab=5)
        >>> r = train_lm(cfg, text_sampler(torch.arange(40) % 5, 8), n_steps=30, batch_size=8,
        ...              lr=1e-2, log_every=30)
        >>> bool(r.metrics["eval_loss"].iloc[-1] < 1.0)    # the cycle 0 1 2 3 4 is learned
        True
    """
    check_positive_float("lr", lr)
    check_positive_int("log_every", log_every)
    if not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every: must be an integer >= 0, got {checkpoint_every!r}")
    task = TextTask(sampler, n_steps, tokenizer=tokenizer, eval_sampler=eval_sampler,
                    warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
                    weight_decay=weight_decay, grad_clip=grad_clip, eval_batches=eval_batches,
                    metadata=metadata)
    train_cfg = TrainConfig(n_steps=n_steps, batch_size=batch_size, eval_batch_size=batch_size,
                            lr=lr, seed=seed, log_every=log_every, checkpoint_steps=(),
                            checkpoint_every=checkpoint_every)
    given = model if isinstance(model, torch.nn.Module) else None
    result = train(model=given, model_cfg=model.cfg if given is not None else model,
                   task_cfg=task, train_cfg=train_cfg,
                   device=given.device if given is not None else "cpu", out_dir=out_dir,
                   resume=resume, overwrite=overwrite, progress=progress)
    last = checkpoint_path(out_dir, result.step) if out_dir is not None else None
    return LMResult(model=result.model, tokenizer=tokenizer, metrics=result.metrics,
                    path=last if last is not None and last.exists() else None)
