"""Song & Zhong Section 5 ("why training format matters") on small decoders that train on a CPU.

Three experiments, each a function that trains :class:`~tfmatcomp.HookedDecoder` models with
:func:`~tfmatcomp.training.lm.train_lm` and measures their positional basis with the geometry
command's machinery (:class:`~tfmatcomp.geometry.models.DecoderGeometry`, the streaming
decomposition, :func:`~tfmatcomp.geometry.summary.summary_table`):

* **Addition** (Section 5.2, Appendix E): strings ``a+b=c$`` with ``c`` written reversed (Lee et al.),
  operand lengths drawn from ``{min_digits..max_digits}``, with carries (digits independent) or
  without (examples with a carry removed; :class:`AdditionTask`). Trained on those lengths and
  evaluated by exact match of the greedy answer at every operand length
  (:func:`addition_accuracy`), the paper's length generalization; the positional basis is measured
  on training-distribution inputs. The paper (8 layers, d 512, 100K steps, lengths 5-10): 100 %
  (no carry) and 72 % (carry) in distribution, 5.02 % and 0 % on lengths 1-4, and "fractured"
  positional Gram matrices.
* **Token randomization** (Section 5.1): character-level models trained on text, on text whose
  latter half is replaced by uniform random tokens, and on random tokens only
  (:func:`randomized_sampler`), each measured on the three kinds of input. The paper: randomization
  destroys the positional basis's structure exactly where it takes place.
* **NanoGPT** (Table 1's first row): a character-level GPT trained on the offline pydoc corpus
  (:func:`~tfmatcomp.training.lm.pydoc_documents`), measured as the geometry command measures any
  model (:func:`tfmatcomp.report.geometry.nanogpt_experiment`, beside the command).

Smoothness of a positional basis is read by
:func:`~tfmatcomp.geometry.positional.positional_profile` (the measurements live in
:mod:`tfmatcomp.geometry.positional`).

``scripts/section5.py`` runs all three at the sizes docs/geometry.md reports.

Example:
    >>> import torch
    >>> task = AdditionTask(max_digits=3, carry=False)
    >>> tokens, weights = task.sample(2, torch.Generator().manual_seed(0))
    >>> [ADDITION_TOKENIZER.decode(t).rstrip("#") for t in tokens]
    ['403+451=458$', '3+1=4$']
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp._progress import wanted
from tfmatcomp.config import DecoderConfig
from tfmatcomp.models.decoder import HookedDecoder
from tfmatcomp.training.lm import (CharTokenizer, Sampler, encode_documents, pydoc_documents,
                                   text_sampler, train_lm)
from tfmatcomp.geometry.positional import positional_table
from tfmatcomp.validation import check_in_range, check_int_in_range, check_positive_int

__all__ = ["ADDITION_TOKENIZER", "AdditionTask", "answer_accuracy", "addition_accuracy",
           "randomize_tokens", "randomized_sampler", "addition_experiment",
           "randomization_experiment", "small_gpt_config", "pydoc_data", "RANDOMIZATION_SETTINGS"]

#: Digits, ``+``, ``=``, ``$`` (end of the answer) and ``#`` (padding after it).
ADDITION_TOKENIZER = CharTokenizer("0123456789+=$#")
_PAD = ADDITION_TOKENIZER.chars.index("#")

#: Token randomization settings: the fraction of each sequence kept as text (the rest random).
RANDOMIZATION_SETTINGS = {"regular": 1.0, "half_random": 0.5, "all_random": 0.0}


# ---------------------------------------------------------------------------------- addition
@dataclass(frozen=True)
class AdditionTask:
    """Additions ``a+b=c$`` with the answer reversed (least significant digit first), padded
    with ``#`` to :attr:`n_positions` tokens.

    Attributes:
        max_digits: ``L``, the longest operand (the paper: 10).
        min_digits: the shortest training operand (default ``L // 2``, the paper's ``L/2``).
        carry: False removes every example with a carry (then each digit pair sums to at most 9).

    Operands have no leading zero (a one-digit operand may be 0); their lengths are drawn
    independently and uniformly from ``min_digits..max_digits`` (or as given to :meth:`sample`).

    Example:
        >>> AdditionTask(max_digits=10).n_positions, AdditionTask(max_digits=10).min_digits
        (34, 5)
    """

    max_digits: int = 6
    min_digits: int | None = None
    carry: bool = True

    def __post_init__(self) -> None:
        check_int_in_range("max_digits", self.max_digits, 1, 18)
        if self.min_digits is None:
            object.__setattr__(self, "min_digits", max(1, self.max_digits // 2))
        check_int_in_range("min_digits", self.min_digits, 1, self.max_digits)

    @property
    def n_positions(self) -> int:
        """``L + 1 + L + 1 + (L + 1) + 1``: the longest sequence."""
        return 3 * self.max_digits + 4

    def operands(self, n: int, generator: torch.Generator, digits: tuple[int, int] | None = None
                 ) -> tuple[list[int], list[int]]:
        """``n`` pairs of operands, lengths uniform in ``digits`` (default the training range)."""
        check_positive_int("n", n)
        lo, hi = digits if digits is not None else (self.min_digits, self.max_digits)
        check_int_in_range("digits", lo, 1, self.max_digits)
        check_int_in_range("digits", hi, lo, self.max_digits)
        L = self.max_digits
        lengths = torch.randint(lo, hi + 1, (2, n), generator=generator)
        place = torch.arange(L)
        inside = place[None, None, :] < lengths[..., None]  # [2, n, L], least significant first
        leading = (place[None, None, :] == lengths[..., None] - 1) & (lengths[..., None] > 1)
        d = torch.zeros(2, n, L, dtype=torch.long)
        todo = inside.clone()
        while todo.any():  # draw, then redraw every digit pair that breaks a rule: rejection
            d = torch.where(todo, torch.randint(0, 10, d.shape, generator=generator), d)
            bad = (leading & (d == 0)).any(0)  # [n, L], per position: positions are independent
            if not self.carry:
                bad = bad | (d.sum(0) > 9)
            todo = bad[None] & inside
        powers = 10 ** place
        a, b = (d * powers).sum(-1).tolist()
        return a, b

    def format(self, a: int, b: int) -> str:
        """``"a+b=" + reversed(a + b) + "$"``."""
        return f"{a}+{b}={str(a + b)[::-1]}$"

    def sample(self, batch_size: int, generator: torch.Generator,
               digits: tuple[int, int] | None = None
               ) -> tuple[Int[Tensor, "batch pos"], Float[Tensor, "batch pos"]]:
        """``(tokens, weights)``: padded sequences and 1.0 at the answer's tokens and ``$`` (the
        targets of the loss and of :func:`addition_accuracy`)."""
        a, b = self.operands(batch_size, generator, digits)
        T = self.n_positions
        tokens = torch.full((batch_size, T), _PAD, dtype=torch.long)
        weights = torch.zeros(batch_size, T)
        for i, (x, y) in enumerate(zip(a, b)):
            text = self.format(x, y)
            tokens[i, :len(text)] = torch.tensor(ADDITION_TOKENIZER.encode(text))
            weights[i, text.index("=") + 1:len(text)] = 1.0
        return tokens, weights

    def sampler(self) -> Sampler:
        """The training distribution as a :data:`~tfmatcomp.training.lm.Sampler`."""
        return lambda batch_size, generator: self.sample(batch_size, generator)


def answer_accuracy(logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"],
                    weights: Float[Tensor, "batch pos"]) -> Float[Tensor, "batch"]:
    """1.0 where every weighted token is the arg-max prediction from the tokens before it.

    With teacher forcing this is exactly the exact match of greedy decoding: greedy decoding
    reproduces the answer if and only if each of its tokens is the arg-max given the true prefix.

    Example:
        >>> tokens = torch.tensor([[0, 1, 2]])
        >>> logits = torch.nn.functional.one_hot(torch.tensor([[1, 2, 0]]), 3).float()
        >>> answer_accuracy(logits, tokens, torch.tensor([[0., 1., 1.]])).tolist()
        [1.0]
    """
    hit = logits[:, :-1].argmax(-1) == tokens[:, 1:]
    counted = weights[:, 1:] > 0
    return (hit | ~counted).all(-1).to(torch.float64)


@torch.no_grad()
def addition_accuracy(model: HookedDecoder, task: AdditionTask, *, n: int = 256,
                      lengths: Sequence[int] | None = None, seed: int = 0) -> pd.DataFrame:
    """Exact-match accuracy (:func:`answer_accuracy`) with both operands of each length.

    Args:
        model: a decoder trained on ``task``.
        task: the addition format.
        n: examples per length.
        lengths: operand lengths (default ``1..max_digits``).
        seed: the examples' generator.

    Returns:
        one row per length: ``digits``, ``accuracy``, ``in_training`` (length within the training
        range).

    Example:
        >>> import tfmatcomp as tm
        >>> task = AdditionTask(max_digits=2)
        >>> model = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32,
        ...                                           n_ctx=task.n_positions, d_vocab=14))
        >>> addition_accuracy(model, task, n=8).columns.tolist()
        ['digits', 'accuracy', 'in_training']
    """
    check_positive_int("n", n)
    lengths = list(range(1, task.max_digits + 1)) if lengths is None else list(lengths)
    g = torch.Generator().manual_seed(seed)
    rows = []
    model.eval()
    for k in lengths:
        tokens, weights = task.sample(n, g, digits=(k, k))
        logits = model(tokens.to(model.device))
        acc = float(answer_accuracy(logits.cpu(), tokens, weights).mean())
        rows.append({"digits": k, "accuracy": acc,
                     "in_training": task.min_digits <= k <= task.max_digits})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------- token randomization
def randomize_tokens(tokens: Int[Tensor, "batch pos"], keep: float, vocab_size: int,
                     generator: torch.Generator) -> Int[Tensor, "batch pos"]:
    """``tokens`` with every position from ``round(keep * T)`` on replaced by a uniform random id.

    Example:
        >>> randomize_tokens(torch.zeros(1, 6, dtype=torch.long), 0.5, 9,
        ...                  torch.Generator().manual_seed(0)).tolist()
        [[0, 0, 0, 8, 0, 2]]
    """
    check_in_range("keep", keep, 0.0, 1.0)
    check_positive_int("vocab_size", vocab_size)
    start = round(keep * tokens.shape[1])
    out = tokens.clone()
    out[:, start:] = torch.randint(0, vocab_size, out[:, start:].shape, generator=generator)
    return out


def randomized_sampler(sampler: Sampler, keep: float, vocab_size: int) -> Sampler:
    """``sampler``'s windows passed through :func:`randomize_tokens` (same generator).

    Example:
        >>> from tfmatcomp.training.lm import text_sampler
        >>> s = randomized_sampler(text_sampler(torch.zeros(20, dtype=torch.long), 4), 0.5, 9)
        >>> s(2, torch.Generator().manual_seed(0))[:, :2].tolist()   # the first half is the text
        [[0, 0], [0, 0]]
    """
    check_in_range("keep", keep, 0.0, 1.0)
    if keep == 1.0:
        return sampler
    return lambda batch_size, generator: randomize_tokens(sampler(batch_size, generator), keep,
                                                          vocab_size, generator)


# ------------------------------------------------------------------------------ experiments
def small_gpt_config(n_layers: int, d_model: int, n_heads: int, n_ctx: int,
                     d_vocab: int) -> DecoderConfig:
    """The experiments' decoder: ``d_mlp = 4 d_model``, the rest as given."""
    return DecoderConfig(n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_mlp=4 * d_model,
                         n_ctx=n_ctx, d_vocab=d_vocab)


def _batches(sampler: Sampler, n: int, batch_size: int, seed: int) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        b = sampler(batch_size, g)
        out.append(b[0] if isinstance(b, tuple) else b)
    return out


def _out(out_dir: str | os.PathLike | None, name: str) -> Path | None:
    return Path(out_dir) / name if out_dir is not None else None


def addition_experiment(
    *,
    max_digits: int = 6,
    n_layers: int = 3,
    d_model: int = 128,
    n_heads: int = 4,
    n_steps: int = 3000,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    n_eval: int = 256,
    n_measure: int = 256,
    settings: Sequence[str] = ("no_carry", "carry"),
    out_dir: str | os.PathLike | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Section 5.2: one model trained with carries and one without (``settings``: either or both
    of ``"no_carry"``, ``"carry"``), on operand lengths ``max_digits // 2 .. max_digits``.

    Returns:
        ``{"accuracy": DataFrame (setting, digits, accuracy, in_training), "positional":
        DataFrame (setting, layer, rank_estimate, stable_rank, relative_norm, adjacent_cos,
        low_freq_energy), "seconds": {setting: training seconds}, "models": {setting: model}}``;
        with ``out_dir``, each run is saved in ``out_dir/addition_{setting}``. ``progress``:
        each run's training bar (None: when watched; :mod:`tfmatcomp._progress`).

    Example:
        >>> r = addition_experiment(max_digits=2, n_layers=1, d_model=16, n_heads=2, n_steps=2,
        ...                         batch_size=4, n_eval=4, n_measure=8)
        >>> sorted(r["accuracy"]["setting"].unique())
        ['carry', 'no_carry']
    """
    known = {"no_carry": False, "carry": True}
    if not settings or any(x not in known for x in settings):
        raise ValueError(f"settings: choose one or both of {tuple(known)}, got {tuple(settings)}")
    acc_frames, pos_frames, seconds, models = [], [], {}, {}
    for setting in settings:
        carry = known[setting]
        task = AdditionTask(max_digits=max_digits, carry=carry)
        cfg = small_gpt_config(n_layers, d_model, n_heads, task.n_positions, ADDITION_TOKENIZER.vocab_size)
        t0 = time.perf_counter()
        run = train_lm(cfg, task.sampler(), tokenizer=ADDITION_TOKENIZER, n_steps=n_steps,
                       batch_size=batch_size, lr=lr, seed=seed, log_every=max(1, n_steps // 10),
                       out_dir=_out(out_dir, f"addition_{setting}"), progress=wanted(progress),
                       metadata={"family": f"addition-{setting.replace('_', '-')}"})
        seconds[setting] = time.perf_counter() - t0
        models[setting] = run.model
        acc_frames.append(addition_accuracy(run.model, task, n=n_eval, seed=seed + 10)
                          .assign(setting=setting))
        measure = _batches(task.sampler(), 1, n_measure, seed + 20)
        pos_frames.append(positional_table(run.model, measure).assign(setting=setting))
    first = lambda df: df[["setting"] + [c for c in df if c != "setting"]]  # noqa: E731
    return {"accuracy": first(pd.concat(acc_frames, ignore_index=True)),
            "positional": first(pd.concat(pos_frames, ignore_index=True)),
            "seconds": seconds, "models": models}


def pydoc_data(max_documents: int | None) -> tuple[CharTokenizer, Tensor, list]:
    """The pydoc corpus's tokenizer, token stream and documents."""
    docs = pydoc_documents(max_documents)
    tok = CharTokenizer.from_documents(docs)
    return tok, encode_documents(docs, tok), docs


def randomization_experiment(
    *,
    n_positions: int = 64,
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_steps: int = 800,
    batch_size: int = 32,
    lr: float = 2e-3,
    seed: int = 0,
    n_measure: int = 256,
    max_documents: int | None = None,
    out_dir: str | os.PathLike | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Section 5.1: character-level models trained on pydoc text with each of
    :data:`RANDOMIZATION_SETTINGS`, each measured on the three kinds of input (the paper's 3 x 3
    figures 42-50).

    Returns:
        ``{"positional": DataFrame (train, inference, layer, rank_estimate, stable_rank,
        relative_norm, adjacent_cos, low_freq_energy and both halves' profile), "seconds",
        "models"}``; with ``out_dir``, each run is saved in ``out_dir/random_{train}``.
        ``progress``: each run's training bar (None: when watched; :mod:`tfmatcomp._progress`).

    Example:
        >>> r = randomization_experiment(n_positions=8, n_layers=1, d_model=16, n_heads=2,
        ...                              n_steps=2, batch_size=4, n_measure=8, max_documents=2)
        >>> r["positional"].groupby(["train", "inference"]).ngroups
        9
    """
    tok, stream, _ = pydoc_data(max_documents)
    base = text_sampler(stream, n_positions)
    frames, seconds, models = [], {}, {}
    for train_name, keep in RANDOMIZATION_SETTINGS.items():
        cfg = small_gpt_config(n_layers, d_model, n_heads, n_positions, tok.vocab_size)
        t0 = time.perf_counter()
        run = train_lm(cfg, randomized_sampler(base, keep, tok.vocab_size), tokenizer=tok,
                       eval_sampler=randomized_sampler(base, keep, tok.vocab_size),
                       n_steps=n_steps, batch_size=batch_size, lr=lr, seed=seed,
                       log_every=max(1, n_steps // 10), out_dir=_out(out_dir, f"random_{train_name}"),
                       progress=wanted(progress),
                       metadata={"family": f"char-gpt-{train_name.replace('_', '-')}"})
        seconds[train_name] = time.perf_counter() - t0
        models[train_name] = run.model
        for inf_name, inf_keep in RANDOMIZATION_SETTINGS.items():
            measure = _batches(randomized_sampler(base, inf_keep, tok.vocab_size), 1, n_measure,
                               seed + 20)
            frames.append(positional_table(run.model, measure, halves=True)
                          .assign(train=train_name, inference=inf_name))
    df = pd.concat(frames, ignore_index=True)
    df = df[["train", "inference"] + [c for c in df if c not in ("train", "inference")]]
    return {"positional": df, "seconds": seconds, "models": models}
