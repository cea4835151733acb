"""The induction-head study of Song & Zhong Section 4.1: QK components on repeated random tokens.

A sequence of ``n_tokens`` random tokens is repeated (``n_copies`` copies in a row) and run through
the model; every head's scores are split into the four QK components of eq. 7 (pos-pos, pos-cvec,
cvec-pos, cvec-cvec; :meth:`~tfmatcomp.geometry.models.GeometryModel.qk`, with ``pos`` and ``mu``
from a decomposition of that layer's attention input over real text). The paper names three head
types that make up induction, each read off the attention pattern at queries in the repeats
(``i >= period``):

* ``self_token``: attention to the previous occurrence of the same token (key ``i - period``);
  the paper finds cvec-cvec dominant (diagonal lines between identical tokens);
* ``neighbor``: attention to the previous few tokens (keys ``i - window .. i - 1``); pos-pos
  dominant, smooth in the positions;
* ``copy``: attention to the token after the previous occurrence (key ``i - period + 1``), the
  induction head proper: the shifted diagonal of the first two combined.

:func:`induction_study` returns, per layer and head, these three scores, the component whose
row-wise spread over keys is largest (the "winning" one, since softmax ignores a constant per
row) and a type (the best score if above ``threshold``, else ``"other"``).

Example:
    >>> import torch
    >>> repeated_random_tokens(10, n_tokens=3, n_copies=2, generator=torch.Generator().manual_seed(0))
    tensor([[4, 9, 3, 4, 9, 3]])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.decomposition import Decomposition
from tfmatcomp.geometry.qk import COMPONENTS, QKComponents
from tfmatcomp.validation import check_int_in_range, check_positive_int

__all__ = ["HEAD_TYPES", "repeated_random_tokens", "induction_scores", "InductionStudy",
           "induction_study"]

HEAD_TYPES = ("self_token", "neighbor", "copy")


def repeated_random_tokens(
    token_ids: int | Int[Tensor, "vocab"],
    *,
    n_tokens: int = 8,
    n_copies: int = 3,
    n_sequences: int = 1,
    prefix: list[int] | None = None,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "seq pos"]:
    """``n_sequences`` rows of ``prefix`` then ``n_tokens`` random tokens repeated ``n_copies`` times.

    Args:
        token_ids: the vocabulary size (draw from ``0..n-1``) or the allowed ids (e.g. without
            special tokens).
        n_tokens: the period (the paper: 8).
        n_copies: copies in a row (the paper: the sequence and its repeats).
        prefix: ids put before every row (e.g. BERT's ``[CLS]``), not part of the period.
        generator: the random draw (seeded by the caller).
    """
    pool = (torch.arange(check_positive_int("token_ids", token_ids)) if isinstance(token_ids, int)
            else torch.as_tensor(token_ids).flatten())
    check_positive_int("n_tokens", n_tokens)
    check_int_in_range("n_copies", n_copies, 2, 1000)
    check_positive_int("n_sequences", n_sequences)
    if pool.numel() == 0:
        raise ValueError("token_ids: no ids to draw from")
    draw = pool[torch.randint(pool.numel(), (n_sequences, n_tokens), generator=generator)]
    rows = draw.repeat(1, n_copies)
    if prefix:
        rows = torch.cat([torch.tensor(prefix, dtype=rows.dtype).expand(n_sequences, -1), rows], 1)
    return rows


def induction_scores(
    pattern: Float[Tensor, "batch head query key"],
    period: int,
    *,
    start: int = 0,
    window: int = 3,
) -> dict[str, Float[Tensor, "head"]]:
    """The three head-type scores of every head: mean attention, over queries in the repeats, to
    the previous identical token, to the previous ``window`` tokens, and to the token after the
    previous occurrence (see the module docstring). ``start`` is the length of a prefix. With
    ``window >= period - 1`` the neighbour keys include the copy key (the paper: period 8, a few).

    Example:
        >>> T, period = 10, 5
        >>> copy = torch.zeros(1, 1, T, T)
        >>> for i in range(T):
        ...     copy[0, 0, i, i - period + 1 if i >= period else 0] = 1
        >>> {k: round(float(v[0]), 2) for k, v in induction_scores(copy, period).items()}
        {'self_token': 0.0, 'neighbor': 0.0, 'copy': 1.0}
    """
    if pattern.ndim != 4 or pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(f"pattern: expected [batch, head, T, T], got {tuple(pattern.shape)}")
    T = pattern.shape[-1]
    check_int_in_range("period", period, 1, max(1, T - start - 1))
    check_positive_int("window", window)
    p = pattern.detach().to(torch.float64)
    queries = torch.arange(start + period, T, device=p.device)
    if queries.numel() == 0:
        raise ValueError(f"period: {period} leaves no query in a repeat of a {T}-token input")

    def at(offset: int) -> Tensor:  # attention of query i to key i - offset, mean over queries
        return p[..., queries, queries - offset].mean((0, -1))

    neighbor = sum(at(o) for o in range(1, window + 1))
    return {"self_token": at(period), "neighbor": neighbor, "copy": at(period - 1)}


def _spread(components: QKComponents, causal: bool, queries: Tensor) -> dict[str, Tensor]:
    """Per head: the mean over queries of each component's std over the keys it can see."""
    out = {}
    for name in COMPONENTS:
        c = getattr(components, name)[:, :, queries]  # [batch, head, q, key]
        if causal:
            keys = torch.arange(c.shape[-1], device=c.device)
            seen = keys[None, :] <= queries[:, None]  # [q, key]
            n = seen.sum(-1)
            mean = (c * seen).sum(-1) / n
            var = (((c - mean[..., None]) * seen) ** 2).sum(-1) / n
            out[name] = var.sqrt().mean((0, -1))
        else:
            out[name] = c.std(-1, unbiased=False).mean((0, -1))
    return out


@dataclass(frozen=True)
class InductionStudy:
    """What :func:`induction_study` found.

    Attributes:
        tokens: the inputs ``[seq, pos]`` (prefix, then the repeated random tokens).
        period: ``n_tokens``; start: the prefix length.
        components: the four QK components of every head, per layer.
        table: one row per (layer, head): the three scores, each component's spread, the
            dominant component and the head type.
    """

    tokens: Tensor
    period: int
    start: int
    components: dict[int, QKComponents]
    table: pd.DataFrame

    def best(self, head_type: str) -> tuple[int, int]:
        """``(layer, head)`` with the highest score of ``head_type``."""
        if head_type not in HEAD_TYPES:
            raise ValueError(f"head_type: {head_type!r} is not one of {HEAD_TYPES}")
        row = self.table.loc[self.table[head_type].idxmax()]
        return int(row["layer"]), int(row["head"])


def induction_study(
    model,
    attention_inputs: Mapping[int, Decomposition],
    *,
    n_tokens: int = 8,
    n_copies: int = 3,
    n_sequences: int = 4,
    token_ids: int | Tensor | None = None,
    prefix: list[int] | None = None,
    window: int = 3,
    threshold: float = 0.3,
    generator: torch.Generator | None = None,
) -> InductionStudy:
    """Song & Zhong Section 4.1 on ``model``: QK components and head types on repeated random tokens.

    Args:
        model: a :class:`~tfmatcomp.geometry.models.GeometryModel` (BERT or GPT-2 family).
        attention_inputs: ``{layer: Decomposition}`` of each block's attention input over real
            text (``pos`` and ``mu``; e.g. the geometry command's first pass). Layers missing
            here are skipped.
        n_tokens, n_copies, n_sequences, prefix: see :func:`repeated_random_tokens`.
        token_ids: the vocabulary size or the allowed ids (default: the model's vocabulary).
        window: how many previous tokens count as neighbours.
        threshold: the score a head needs to get a type (else ``"other"``).
        generator: the random tokens (default seed 0).

    The test suite runs this on a random GPT-2 and checks that the components sum to the scores.
    """
    if token_ids is None:
        token_ids = _vocab_size(model)
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    tokens = repeated_random_tokens(token_ids, n_tokens=n_tokens, n_copies=n_copies,
                                    n_sequences=n_sequences, prefix=prefix, generator=generator)
    start = len(prefix or [])
    rows, comps = [], {}
    for layer in sorted(attention_inputs):
        qk = model.qk(tokens, layer, attention_inputs[layer])
        comps[layer] = qk
        pattern = qk.pattern  # the model's own hook_pattern
        if pattern is None:
            raise ValueError(f"model: {type(model).__name__}.qk gave no attention pattern (a "
                             "GeometryModel's qk returns the model's hook_pattern)")
        scores = induction_scores(pattern, n_tokens, start=start, window=window)
        queries = torch.arange(start + n_tokens, tokens.shape[1], device=qk.pos_pos.device)
        spread = _spread(qk, model.causal, queries)
        for h, head in enumerate(qk.heads or range(pattern.shape[1])):
            row = {"layer": layer, "head": head, **{k: float(v[h]) for k, v in scores.items()},
                   **{f"spread_{k}": float(v[h]) for k, v in spread.items()}}
            row["dominant"] = max(COMPONENTS, key=lambda k: row[f"spread_{k}"])
            best = max(HEAD_TYPES, key=lambda k: row[k])
            row["type"] = best if row[best] >= threshold else "other"
            rows.append(row)
    return InductionStudy(tokens=tokens, period=n_tokens, start=start, components=comps,
                          table=pd.DataFrame(rows))


def _vocab_size(model) -> int:
    module = getattr(model, "module", model)
    cfg = getattr(module, "cfg", None)
    if cfg is not None and getattr(cfg, "d_vocab", None):
        return int(cfg.d_vocab)
    config = getattr(module, "config", None)
    if config is not None and getattr(config, "vocab_size", None):
        return int(config.vocab_size)
    raise ValueError("token_ids: cannot read the model's vocabulary size; pass token_ids")
