"""The papers' causal experiments on real masked-language encoders, over text batches.

The papers measure ``L_mask`` (the loss at masked entries) and ``L_obs`` (at observed ones) under
uniform attention ablation, positional permutation and activation patching. Here the same
interventions run on a masked-LM :class:`~tfmatcomp.HookedEncoder` (BERT, RoBERTa, DistilBERT from
:meth:`~tfmatcomp.HookedEncoder.from_pretrained`) over text, with the masked-LM analogue of the
papers' metric: cross-entropy and top-1 accuracy at the masked tokens (``L_mask``,
``acc_mask``) and at the other real tokens, which the model should reproduce (``L_obs``,
``acc_obs``).

One data path: :func:`mask_text` tokenizes the texts with the model's tokenizer (padding and token
types as :meth:`~tfmatcomp.HookedEncoder.to_tokens`), hides a seeded random choice of real,
non-special tokens behind the tokenizer's MASK token, and returns a :class:`TextBatch`; every
function here and in :mod:`tfmatcomp.analyses.text_probes` takes that batch.

Padding: the papers' uniform ablation spreads a head's attention over all keys (their task has no
padding). On a padded text batch :func:`uniform_attention_hooks` spreads it over the row's real
tokens only (``1 / n_real`` on each), which equals
:class:`~tfmatcomp.interventions.UniformAttentionAblation` when nothing is padded.

* :func:`masked_lm_metrics`: L_mask, acc_mask, L_obs, acc_obs of logits;
* :func:`evaluate`: the metrics of one run, with hooks or an intervention;
* :func:`hidden_change`: ``||h' - h|| / ||h||`` of the last layer (for a model without MLM head);
* :func:`attention_ablation_text`: uniform ablation of all heads, of each layer, or of chosen heads;
* :func:`head_scan_text`: every head ablated alone, the change in L_mask;
* :func:`positional_permutation_text`: permuted positional embeddings, one row per seed;
* :func:`patch_texts`: activation patching from one text into another.

Example:
    >>> import tfmatcomp as tm
    >>> from transformers import BertTokenizerFast
    >>> words = "[PAD] [UNK] [CLS] [SEP] [MASK] the cat sat on a mat".split()
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32,
    ...                          n_ctx=16, d_vocab=len(words), head="masked_lm"))
    >>> model.tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})
    >>> batch = mask_text(model, ["the cat sat on a mat", "a cat sat"], fraction=0.3, seed=0)
    >>> batch.tokens.shape, int(batch.masked.sum())
    (torch.Size([2, 8]), 3)
    >>> sorted(evaluate(model, batch))
    ['L_mask', 'L_obs', 'acc_mask', 'acc_obs']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tfmatcomp.interventions import ActivationPatch, PositionalPermutation
from tfmatcomp.interventions.sites import resolve_heads
from tfmatcomp.validation import check_in_range, check_seed

__all__ = ["TextBatch", "mask_text", "masked_lm_metrics", "evaluate", "uniform_attention_hooks",
           "hidden_change", "attention_ablation_text", "head_scan_text", "positional_permutation_text",
           "patch_texts", "IGNORE"]

#: The label of a position that is not scored (as transformers' ``-100``).
IGNORE = -100


@dataclass(frozen=True)
class TextBatch:
    """A tokenized, partly masked text batch.

    Attributes:
        tokens: ``[batch, pos]`` ids with MASK at the hidden tokens.
        token_type_ids, attention_mask: ``[batch, pos]``, as the tokenizer gave them.
        labels: ``[batch, pos]`` the original id at every real token (hidden or not), ``IGNORE``
            at padding and special tokens.
        masked: ``[batch, pos]`` True at the hidden tokens.
        texts: the texts.
    """

    tokens: Int[Tensor, "batch pos"]
    token_type_ids: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    labels: Int[Tensor, "batch pos"]
    masked: Bool[Tensor, "batch pos"]
    texts: tuple[str, ...]

    def model_kwargs(self) -> dict[str, Tensor]:
        """``token_type_ids`` and ``attention_mask``, for ``model(batch.tokens, **kwargs)``."""
        return {"token_type_ids": self.token_type_ids, "attention_mask": self.attention_mask}

    @property
    def observed(self) -> Bool[Tensor, "batch pos"]:
        """True at the real, non-special tokens that are not hidden."""
        return (self.labels != IGNORE) & ~self.masked


def mask_text(model: Any, texts: str | Sequence[str], fraction: float = 0.15, seed: int = 0,
              ) -> TextBatch:
    """Tokenize ``texts`` with ``model``'s tokenizer and hide a random ``fraction`` of each text's
    real, non-special tokens behind MASK (at least one per text), drawn from
    ``torch.Generator().manual_seed(seed)``.

    Raises:
        ValueError: no tokenizer or no MASK token, ``fraction`` outside ``(0, 1]``, or a text
            without a maskable token.
    """
    check_in_range("fraction", fraction, 0.0, 1.0, closed=(False, True))
    check_seed("seed", seed)
    texts = (texts,) if isinstance(texts, str) else tuple(texts)
    tokens, types, attn = model.to_tokens(list(texts))
    tokenizer = model.tokenizer
    if tokenizer.mask_token_id is None:
        raise ValueError("model: its tokenizer has no MASK token")
    special = torch.tensor(sorted(tokenizer.all_special_ids), device=tokens.device)
    real = attn.bool() & ~torch.isin(tokens, special)
    empty = [t for t, r in zip(texts, real) if not r.any()]
    if empty:
        raise ValueError(f"texts: {empty[0]!r} has no token to mask")
    g = torch.Generator().manual_seed(seed)
    draw = torch.rand(tokens.shape, generator=g).to(tokens.device)
    masked = real & (draw < fraction)
    # at least one hidden token per text: its real token with the smallest draw
    first = torch.where(real, draw, torch.full_like(draw, 2.0)).argmin(1)
    masked[torch.arange(len(texts)), first] = True
    labels = torch.where(real, tokens, torch.full_like(tokens, IGNORE))
    hidden = torch.where(masked, torch.full_like(tokens, tokenizer.mask_token_id), tokens)
    return TextBatch(hidden, types, attn, labels, masked, texts)


def masked_lm_metrics(logits: Float[Tensor, "batch pos d_vocab"], batch: TextBatch
                      ) -> dict[str, float]:
    """``L_mask`` / ``acc_mask``: mean cross-entropy and top-1 accuracy at the hidden tokens;
    ``L_obs`` / ``acc_obs``: the same at the other real tokens (NaN when there are none)."""
    logits = logits.float()
    out: dict[str, float] = {}
    for name, where in (("mask", batch.masked), ("obs", batch.observed)):
        if not where.any():
            out[f"L_{name}"] = out[f"acc_{name}"] = float("nan")
            continue
        chosen, labels = logits[where], batch.labels[where]
        out[f"L_{name}"] = F.cross_entropy(chosen, labels).item()
        out[f"acc_{name}"] = (chosen.argmax(-1) == labels).float().mean().item()
    return out


def evaluate(model: Any, batch: TextBatch, fwd_hooks: Iterable = (), intervention: Any = None
             ) -> dict[str, float]:
    """:func:`masked_lm_metrics` of one forward pass, with ``fwd_hooks`` (``(name, fn)`` pairs)
    and/or an :class:`~tfmatcomp.interventions.Intervention` in effect."""
    if model.cfg.head != "masked_lm":
        raise ValueError(f"model: needs the masked-LM head, this one has head {model.cfg.head!r}")
    with torch.no_grad(), model.hooks(fwd_hooks=list(fwd_hooks)):
        if intervention is not None:
            logits = intervention.run(model, batch.tokens, **batch.model_kwargs())
        else:
            logits = model(batch.tokens, **batch.model_kwargs())
    return masked_lm_metrics(logits, batch)


def uniform_attention_hooks(model: Any, heads: Any, attention_mask: Tensor | None = None
                            ) -> list[tuple[str, Any]]:
    """Forward hooks that make each chosen head attend uniformly to the row's real tokens
    (``attention_mask`` 1; all keys without a mask): the papers' uniform ablation, padding-aware.

    Args:
        heads: 0-based ``(layer, head)`` pairs or ``"all"``.
    """
    by_layer: dict[int, list[int]] = {}
    for layer, head in resolve_heads(model.cfg.n_layers, model.cfg.n_heads, heads):
        by_layer.setdefault(layer, []).append(head)
    hooks = []
    for layer, chosen in sorted(by_layer.items()):
        def fn(pattern: Tensor, hook: Any = None, chosen: list[int] = chosen) -> Tensor:
            if attention_mask is None:
                keys = torch.ones(pattern.shape[0], pattern.shape[-1], device=pattern.device)
            else:
                keys = attention_mask.to(device=pattern.device, dtype=pattern.dtype)
            uniform = (keys / keys.sum(-1, keepdim=True))[:, None, :]       # [batch, 1, key]
            out = pattern.clone()
            out[:, chosen] = uniform[:, None].expand(-1, len(chosen), pattern.shape[2], -1)
            return out

        hooks.append((f"blocks.{layer}.attn.hook_pattern", fn))
    return hooks


def hidden_change(model: Any, batch: TextBatch, fwd_hooks: Iterable = ()) -> float:
    """How far ``fwd_hooks`` move the last layer's hidden states: ``||h' - h|| / ||h||`` over
    the batch's real tokens (for an encoder without a masked-LM head, where no loss exists)."""
    with torch.no_grad():
        clean = model.encoder_output(batch.tokens, **batch.model_kwargs())
        with model.hooks(fwd_hooks=list(fwd_hooks)):
            edited = model.encoder_output(batch.tokens, **batch.model_kwargs())
    real = batch.attention_mask.bool()
    return ((edited - clean)[real].norm() / clean[real].norm()).item()


def attention_ablation_text(model: Any, batch: TextBatch, heads: Any = None) -> pd.DataFrame:
    """Metrics without ablation, with every head ablated, and with each layer's heads ablated
    (or, with ``heads``, with those heads): columns ``ablated``, ``L_mask``, ``acc_mask``,
    ``L_obs``, ``acc_obs``, ``dL_mask`` (change from the clean run). A model without the
    masked-LM head gets one column instead, ``hidden_change`` (:func:`hidden_change`)."""
    conditions: list[tuple[str, Any]] = [("none", None)]
    if heads is not None:
        conditions.append((str(heads), heads))
    else:
        conditions.append(("all", "all"))
        conditions += [(f"layer {l}", [(l, h) for h in range(model.cfg.n_heads)])
                       for l in range(model.cfg.n_layers)]
    rows = []
    for label, spec in conditions:
        hooks = [] if spec is None else uniform_attention_hooks(model, spec, batch.attention_mask)
        if model.cfg.head != "masked_lm":
            rows.append({"ablated": label, "hidden_change": hidden_change(model, batch, hooks)})
        else:
            rows.append({"ablated": label, **evaluate(model, batch, hooks)})
    df = pd.DataFrame(rows)
    if model.cfg.head != "masked_lm":
        return df
    df["dL_mask"] = df["L_mask"] - df["L_mask"].iloc[0]
    return df


def head_scan_text(model: Any, batch: TextBatch) -> pd.DataFrame:
    """Each head ablated alone (uniform attention over the real tokens): one row per
    ``(layer, head)`` with the metrics and ``dL_mask``, the change in ``L_mask``."""
    clean = evaluate(model, batch)["L_mask"]
    rows = []
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            hooks = uniform_attention_hooks(model, [(layer, head)], batch.attention_mask)
            m = evaluate(model, batch, hooks)
            rows.append({"layer": layer, "head": head, **m, "dL_mask": m["L_mask"] - clean})
    return pd.DataFrame(rows)


def positional_permutation_text(model: Any, batch: TextBatch, seeds: Sequence[int] = (0, 1, 2)
                                ) -> pd.DataFrame:
    """The metrics with the first ``pos`` positional embeddings permuted
    (:class:`~tfmatcomp.interventions.PositionalPermutation`, one seeded permutation per row;
    ``seed`` None is the clean run)."""
    n = batch.tokens.shape[1]
    rows = [{"seed": None, **evaluate(model, batch)}]
    for seed in seeds:
        rows.append({"seed": seed, **evaluate(
            model, batch, intervention=PositionalPermutation(seed=seed, n_positions=n))})
    return pd.DataFrame(rows)


def patch_texts(model: Any, target: str, source: str, answer: str,
                hook: str = "hook_resid_pre") -> Float[Tensor, "n_layers pos"]:
    """Activation patching from ``source`` into ``target``: the log-probability of ``answer`` at
    ``target``'s MASK token when ``blocks.{l}.{hook}`` at one position ``p`` comes from the
    ``source`` run (:class:`~tfmatcomp.interventions.ActivationPatch`), for every layer and
    position; both texts are tokenized together, so they share one padded length.

    Raises:
        ValueError: ``target`` has not exactly one MASK token, or ``answer`` is not one token.
    """
    tokenizer = model._need_tokenizer("patch_texts")
    tokens, types, attn = model.to_tokens([target, source])
    where = (tokens[0] == tokenizer.mask_token_id).nonzero().flatten()
    if where.numel() != 1:
        raise ValueError(f"target: needs exactly one MASK token ({tokenizer.mask_token}), found "
                         f"{where.numel()}")
    ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(answer))
    if len(ids) != 1:
        raise ValueError(f"answer: {answer!r} is {len(ids)} tokens; give one token")
    mask_pos, answer_id = int(where), ids[0]
    kwargs = {"token_type_ids": types[:1], "attention_mask": attn[:1]}
    names = [f"blocks.{l}.{hook}" for l in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[1:], token_type_ids=types[1:],
                                        attention_mask=attn[1:], names_filter=lambda n: n in names)
    out = torch.empty(model.cfg.n_layers, tokens.shape[1])
    for layer in range(model.cfg.n_layers):
        for p in range(tokens.shape[1]):
            patch = ActivationPatch({names[layer]: cache[names[layer]]}, hooks=names[layer],
                                    positions=[p])
            with torch.no_grad():
                logits = patch.run(model, tokens[:1], **kwargs)
            out[layer, p] = logits[0, mask_pos].float().log_softmax(-1)[answer_id]
    return out
