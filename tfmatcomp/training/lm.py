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
* :func:`train_lm`: AdamW + linear warm-up + cosine decay on a :class:`~tfmatcomp.HookedDecoder`,
  every random draw from explicit generators, and checkpoints written with
  :func:`~tfmatcomp.save_checkpoint` (safetensors + JSON) into the trainers' run-directory layout
  (``RUN_DIR/checkpoints/step_XXXXXXX/``, ``RUN_DIR/metrics.jsonl``).

:func:`train_lm` runs the trainers' one loop (:func:`tfmatcomp.training.loop.run_loop`): its
:class:`LMStep` is the update (AdamW on next-token cross-entropy, the learning-rate schedule,
gradient clipping), its :class:`LMRun` the run it writes, so the schedule of logs and checkpoints,
the run directory's lock and rules (:mod:`tfmatcomp.runs.rundir`) and the divergence check
(:class:`FloatingPointError`) are those of :func:`tfmatcomp.train`. Its metrics log is read by
:func:`tfmatcomp.read_metrics`.

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
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.config import DecoderConfig
from tfmatcomp.models.decoder import HookedDecoder, next_token_loss
from tfmatcomp.models.objectives import as_model
from tfmatcomp.runs.run_directory import RunDirectory
from tfmatcomp.task.corpus import Document
from tfmatcomp.training.loop import Schedule, TrainingStep, check_resume_overwrite, run_loop
from tfmatcomp.validation import (check_in_range, check_int_in_range, check_non_negative,
                                  check_positive_float, check_positive_int, check_seed)

__all__ = ["CharTokenizer", "tokenizer_from_metadata", "pydoc_documents", "encode_documents",
           "text_sampler", "Sampler", "LMResult", "LMStep", "LMRun", "train_lm", "cosine_lr"]

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


@dataclass
class LMResult:
    """What :func:`train_lm` returns.

    Attributes:
        model: the trained decoder (eval mode).
        tokenizer: the tokenizer recorded with it (or None).
        metrics: one row per logged step: ``step``, ``lr``, ``train_loss`` (the update's batch,
            before the update), ``eval_loss`` (fixed evaluation batches, after the update).
        path: the last checkpoint written (None without ``out_dir``).
    """

    model: HookedDecoder
    tokenizer: CharTokenizer | None
    metrics: pd.DataFrame
    path: Path | None


def _split(batch: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor | None]:
    if isinstance(batch, tuple):
        return batch[0], batch[1]
    return batch, None


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
    """Train a :class:`~tfmatcomp.HookedDecoder` on next-token prediction (NanoGPT's recipe).

    AdamW (``betas = (0.9, 0.95)``; weight decay on matrices and embeddings, none on biases and
    LayerNorms), linear warm-up then cosine decay to ``min_lr_ratio * lr``
    (:func:`cosine_lr`), gradient clipping. The model is initialized from ``seed``; training
    batches come from a generator seeded ``seed + 1``, evaluation batches (drawn once, the same
    at every logging step) from one seeded ``seed + 2``. No dropout (the decoder has none).

    Args:
        model: a decoder to continue training, or the config of a fresh one.
        sampler: the training batches (:data:`Sampler`, e.g. :func:`text_sampler`).
        tokenizer: recorded in the checkpoints' metadata (``tfmatcomp geometry`` reads it back).
        eval_sampler: the evaluation batches (default: ``sampler``).
        n_steps: optimizer updates.
        batch_size: sequences per update.
        lr: the peak learning rate.
        min_lr_ratio: the final learning rate as a fraction of ``lr``, in ``[0, 1]``.
        warmup_steps: warm-up updates (default ``n_steps // 20``), in ``[0, n_steps]``.
        weight_decay: AdamW's decoupled weight decay (``>= 0``).
        grad_clip: maximum gradient norm (None: no clipping).
        seed: see above.
        log_every: log (and evaluate) every this many updates, and at the last one.
        eval_batches: evaluation batches of ``batch_size``.
        out_dir: a run directory: ``metrics.jsonl`` and ``checkpoints/step_XXXXXXX/`` (the last
            step always, and every ``checkpoint_every`` steps when positive; the latest one holds
            the training state). It must be empty unless ``resume`` or ``overwrite``, which
            clears a run directory first. It is locked while training writes it.
        resume: continue the run in ``out_dir`` from its latest checkpoint with training state
            (weights, AdamW moments, the schedule's position, the training stream), exactly as
            the uninterrupted run at the same thread count; the run is cut back to that step.
            The same recipe is required (``n_steps``, ``lr``, ... as recorded in the checkpoint's
            ``train_lm`` metadata). An empty ``out_dir`` starts from step 0.
        metadata: more JSON-ready entries for the checkpoints' metadata (e.g. ``family``, the
            label the geometry report shows).
        progress: a tqdm progress bar.

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
    check_positive_int("n_steps", n_steps)
    check_positive_int("batch_size", batch_size)
    check_positive_float("lr", lr)
    check_in_range("min_lr_ratio", min_lr_ratio, 0.0, 1.0)
    warmup = n_steps // 20 if warmup_steps is None else warmup_steps
    check_int_in_range("warmup_steps", warmup, 0, n_steps)
    check_non_negative("weight_decay", weight_decay)
    if grad_clip is not None:
        check_positive_float("grad_clip", grad_clip)
    check_seed("seed", seed)
    check_resume_overwrite(resume, overwrite)
    if resume and out_dir is None:
        raise ValueError("out_dir: resume needs a run directory")
    check_positive_int("log_every", log_every)
    check_positive_int("eval_batches", eval_batches)
    if not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every: must be an integer >= 0, got {checkpoint_every!r}")
    model = as_model(model, "decoder", seed=seed)
    if tokenizer is not None and tokenizer.vocab_size > model.cfg.d_vocab:
        raise ValueError(f"tokenizer: {tokenizer.vocab_size} characters, but the model's d_vocab is "
                         f"{model.cfg.d_vocab}")
    out = Path(out_dir) if out_dir is not None else None
    train_gen = torch.Generator().manual_seed(seed + 1)
    eval_gen = torch.Generator().manual_seed(seed + 2)
    evaluation = [_split((eval_sampler or sampler)(batch_size, eval_gen)) for _ in range(eval_batches)]
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: cosine_lr(s, n_steps, warmup, min_lr_ratio))
    meta = {"tokenizer": tokenizer.to_dict() if tokenizer is not None else None,
            "train_lm": {"n_steps": n_steps, "batch_size": batch_size, "lr": lr,
                         "min_lr_ratio": min_lr_ratio, "warmup_steps": warmup,
                         "weight_decay": weight_decay, "grad_clip": grad_clip, "seed": seed},
            **(metadata or {})}
    json.dumps(meta)  # refuse what the checkpoint could not record, before training
    run = LMRun(model, optimizer, schedule, train_gen, out,
                Schedule(n_steps, log_every, (), checkpoint_every), meta, overwrite=overwrite,
                progress=progress)
    step = LMStep(run, sampler, evaluation, batch_size, grad_clip)
    try:
        if resume:
            run.resume()
        run_loop(run, step, n_steps, desc="train_lm")
    finally:
        run.close()
        model.eval()
    return LMResult(model=model, tokenizer=tokenizer, metrics=pd.DataFrame(run.records),
                    path=run.path)


class LMStep(TrainingStep):
    """One update of :func:`train_lm`: a batch from ``sampler``, next-token cross-entropy (weighted
    when the sampler gives weights), AdamW with gradient clipping, one step of the learning-rate
    schedule. A non-finite loss raises :class:`FloatingPointError` before the update."""

    def __init__(self, run: LMRun, sampler: Sampler,
                 evaluation: list[tuple[Tensor, Tensor | None]], batch_size: int,
                 grad_clip: float | None):
        self.run, self.model, self.optimizer = run, run.model, run.optimizer
        self.sampler, self.evaluation = sampler, evaluation
        self.batch_size, self.grad_clip = batch_size, grad_clip

    def update(self) -> tuple[float, Tensor]:
        """One update; returns the learning rate it used and its (pre-update) loss."""
        model = self.model
        tokens, weights = _split(self.sampler(self.batch_size, self.run.train_gen))
        model.check_tokens(tokens)
        tokens = tokens.to(model.device)
        loss = next_token_loss(model(tokens), tokens,
                               None if weights is None else weights.to(model.device))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"training diverged at step {self.run.step + 1}: loss is "
                                     f"{loss.item()}; "
                                     f"try a lower lr (now {self.optimizer.defaults['lr']})")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip)
        current_lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.run.lr_schedule.step()
        return current_lr, loss

    def train_metrics(self, update: tuple[float, Tensor]) -> list[dict[str, Any]]:
        current_lr, loss = update
        return [{"lr": current_lr, "train_loss": loss.item()}]

    def evaluate(self) -> list[dict[str, float]]:
        return [{"eval_loss": _evaluate(self.model, self.evaluation)}]


class LMRun:
    """The run :func:`train_lm` writes (the loop's host and its one run record): the model and its
    training state (AdamW, the learning-rate schedule, the training stream), the metrics log
    (``step``, ``lr``, ``train_loss``, ``eval_loss`` per row) and the checkpoints, with the
    tokenizer and the recipe in their metadata. Its directory is locked while it trains and must
    be empty unless it is resumed or ``overwrite`` (:mod:`tfmatcomp.runs.rundir`)."""

    def __init__(self, model: HookedDecoder, optimizer: torch.optim.Optimizer,
                 lr_schedule: torch.optim.lr_scheduler.LRScheduler, train_gen: torch.Generator,
                 out_dir: Path | None, schedule: Schedule, metadata: dict[str, Any],
                 overwrite: bool = False, progress: bool = False):
        self.model, self.optimizer, self.lr_schedule = model, optimizer, lr_schedule
        self.train_gen = train_gen
        self.out_dir, self.schedule, self.metadata = out_dir, schedule, metadata
        self.progress = progress
        self.step, self.elapsed_s = 0, 0.0
        #: the run directory: lock, metrics record, checkpoints, resume (as a Trainer's)
        self.directory = RunDirectory(out_dir, overwrite)
        #: the last checkpoint written (None before the first)
        self.path: Path | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.directory.records

    @property
    def runs(self) -> list["LMRun"]:
        return [self]

    def start(self) -> None:
        """Lock the run directory; a run not resumed needs an empty one (or ``overwrite``)."""
        self.directory.claim(resuming=False)
        self.model.train()

    def close(self) -> None:
        self.directory.release()

    # ------------------------------------------------------------------- training state
    def training_state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """``(tensors, json_state)``: what besides the weights a resume needs."""
        opt = self.optimizer.state_dict()
        tensors = {"rng.train": self.train_gen.get_state()}
        for idx, st in opt["state"].items():
            for key, value in st.items():
                tensors[f"optimizer.{idx}.{key}"] = torch.as_tensor(value)
        schedule = {k: v for k, v in self.lr_schedule.state_dict().items() if k != "lr_lambdas"}
        return tensors, {"step": self.step, "param_groups": opt["param_groups"],
                         "lr_schedule": schedule}

    def resume(self) -> bool:
        """Continue from the latest checkpoint with usable training state (False: none, so the
        run starts at step 0 in an empty directory), as a Trainer resumes
        (:meth:`~tfmatcomp.runs.run_directory.RunDirectory.resume_latest`). The run is cut back to
        that checkpoint.

        Raises:
            RunDirError: checkpoints without training state, or another trainer holds the lock.
            ConfigMismatchError: the checkpoint is of another model config or recipe.
        """
        found = self.directory.resume_latest(self.restore, lambda recorded: None)
        self.directory.strip_older_states(self.step)
        return found

    def restore(self, path: Path, step: int) -> None:
        """Load the checkpoint at ``path`` with its training state and cut the run back to it."""
        from tfmatcomp.runs.checkpoint import (CheckpointError, ConfigMismatchError,
                                               load_checkpoint_info, load_training_state)

        model, info = load_checkpoint_info(path, config=self.model.cfg)
        theirs, ours = info.metadata.get("train_lm"), self.metadata["train_lm"]
        if theirs != ours:
            raise ConfigMismatchError(f"train_lm: {path} was trained with {theirs}, this call asks "
                                      f"for {ours}; resuming would not continue the same run")
        tensors, state = load_training_state(path)
        if "rng.train" not in tensors or "lr_schedule" not in state:
            raise CheckpointError(f"path: {path} has training state without the training stream "
                                  "or the schedule; it cannot be resumed exactly")
        with torch.no_grad():
            for p, q in zip(self.model.parameters(), model.parameters()):
                p.copy_(q)
        opt_state: dict[int, dict[str, Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, idx, name = key.split(".", 2)
                opt_state.setdefault(int(idx), {})[name] = value
        groups = [{**saved, **{k: ours_[k] for k in ("betas", "fused", "foreach") if k in ours_}}
                  for saved, ours_ in zip(state["param_groups"], self.optimizer.param_groups)]
        self.optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
        self.lr_schedule.load_state_dict({**self.lr_schedule.state_dict(), **state["lr_schedule"]})
        self.train_gen.set_state(tensors["rng.train"])
        self.step = int(state["step"])
        self.path = path
        self.directory.cut_back(self.step)

    # ------------------------------------------------------------------- the run's files
    def open_log(self):
        return self.directory.open_log(None)  # the recipe is in the checkpoints' metadata

    def log(self, train: dict[str, Any], evaluation: dict[str, Any], log_file=None) -> dict[str, Any]:
        return self.directory.append({"step": self.step, **train, **evaluation}, log_file)

    def save_checkpoints(self) -> None:
        """The checkpoint at this step, with the training state; older checkpoints keep their
        weights and drop their state."""
        from tfmatcomp.runs.checkpoint import save_checkpoint

        self.path = self.directory.save(self.step, lambda path: save_checkpoint(
            self.model, path, step=self.step, metadata=self.metadata,
            training_state=self.training_state()))
        self.directory.strip_older_states(self.step)

    def postfix(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        return {"loss": f"{rows[0]['train_loss']:.3f}"}


@torch.no_grad()
def _evaluate(model: HookedDecoder, batches: list[tuple[Tensor, Tensor | None]]) -> float:
    was_training = model.training
    model.eval()
    losses = []
    for tokens, weights in batches:
        tokens = tokens.to(model.device)
        losses.append(next_token_loss(model(tokens), tokens,
                              None if weights is None else weights.to(model.device)).item())
    model.train(was_training)
    return sum(losses) / len(losses)
