"""Token intervention: every MASK token replaced by the token of a real value ``m``.

The papers' copying check (the workshop paper, Section 3.1.1) feeds the pre-shift model inputs whose masked
entries carry the token of ``m`` (0.44, -0.24) and measures ``L'_mask``, the MSE between the output
at masked entries and ``m``.

How it fits the hook model: the token embedding is a lookup, so substituting the *embedding* at
``embed.hook_embed`` (``[batch, pos, d_model]``) by the row of the value's token wherever the row of
MASK appears gives exactly the activations (and predictions) of feeding the substituted tokens
(``MatrixBatch.with_mask_value(m)``); the tests check this bit for bit. Masked positions are found
as the positions whose embedding equals the MASK row of the model's ``W_E`` (read when the hook
runs); this is exact as long as no other token shares that row, which the hook checks.
:meth:`MaskSubstitution.transform_tokens` edits token tensors directly when you prefer to feed them.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions import MaskSubstitution
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=8, n_ctx=16))
    >>> batch = tm.MatrixCompletionTask(4, rank=1).sample(4, generator=torch.Generator().manual_seed(0))
    >>> sub = MaskSubstitution(0.44)
    >>> torch.equal(sub.run(model, batch.tokens), model(batch.with_mask_value(0.44)))
    True
    >>> torch.equal(sub.transform_tokens(batch.tokens), batch.with_mask_value(0.44))
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from jaxtyping import Int
from torch import Tensor

from tfmatcomp.interventions.base import FwdHook, HookFn, Intervention
from tfmatcomp.interventions.serialize import check_fields
from tfmatcomp.task.tokenizer import ValueTokenizer

__all__ = ["MaskSubstitution"]


class MaskSubstitution(Intervention):
    """MASK tokens replaced by the token of the real value ``value``.

    Args:
        value: a value on the tokenizer's range (rounded to its grid, e.g. 0.44).
        tokenizer: the value tokenizer (default: the papers').

    Stage ``"tokens"``: as hooks, one edit at ``embed.hook_embed``.

    Example:
        >>> MaskSubstitution(-0.24).token_id
        977
    """

    stage: ClassVar[str] = "tokens"
    kind: ClassVar[str] = "mask_substitution"
    _required = ("value",)
    _optional = ("tokenizer",)

    def __init__(self, value: float, tokenizer: ValueTokenizer | None = None):
        self.tokenizer = tokenizer or ValueTokenizer()
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"value: expected a real number, got {value!r}") from None
        lo, hi, half = self.tokenizer.v_min, self.tokenizer.v_max, 0.5 / self.tokenizer.scale
        if not lo - half <= value <= hi + half:  # NaN fails too
            raise ValueError(f"value: must be a real number in [{lo}, {hi}] (the tokenizer's "
                             f"range), got {value!r}")
        self.value = value
        self.token_id = int(self.tokenizer.encode(torch.tensor(value)))  # validates the range

    def _to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"value": self.value}
        if self.tokenizer != ValueTokenizer():
            data["tokenizer"] = dataclasses.asdict(self.tokenizer)
        return data

    @classmethod
    def _from_data(cls, fields: dict[str, Any], where: str) -> "MaskSubstitution":
        if "tokenizer" in fields:
            names = tuple(f.name for f in dataclasses.fields(ValueTokenizer))
            fields["tokenizer"] = ValueTokenizer(**check_fields(fields["tokenizer"],
                                                                f"{where}.tokenizer", (), names))
        return cls(**fields)

    @property
    def mask_token_id(self) -> int:
        return self.tokenizer.mask_token_id

    def describe(self) -> str:
        return (f"MASK tokens replaced by the token of {self.value:g} (id {self.token_id}) at "
                "embed.hook_embed")

    def acts_on(self, model) -> list[str]:
        from tfmatcomp.models.hook_names import embed_hook_name

        return [embed_hook_name(model)]

    def transform_tokens(self, tokens: Int[Tensor, "batch pos"], model=None) -> Int[Tensor, "batch pos"]:
        """``tokens`` with every MASK id replaced by the value's id."""
        mask_id = getattr(model.cfg, "mask_token_id", self.mask_token_id) if model is not None \
            else self.mask_token_id
        return torch.where(tokens == mask_id, torch.full_like(tokens, self.token_id), tokens)

    def fwd_hooks(self, model) -> list[FwdHook]:
        if self.token_id >= model.cfg.d_vocab:
            raise ValueError(f"value: token id {self.token_id} is outside the model's vocabulary "
                             f"(d_vocab {model.cfg.d_vocab})")
        mask_id = getattr(model.cfg, "mask_token_id", self.mask_token_id)  # the decoder's: 0
        W_E = model.embed.W_E

        def fn(emb: Tensor, hook: Any = None) -> Tensor:
            table = W_E.detach()
            mask_row = table[mask_id]
            if int((table == mask_row).all(-1).sum()) != 1:
                raise ValueError("MaskSubstitution: another token shares the MASK embedding row, so "
                                 "masked positions cannot be told from the embedding; feed "
                                 "transform_tokens(tokens) instead")
            is_mask = (emb == mask_row).all(-1, keepdim=True)
            return torch.where(is_mask, table[self.token_id].to(emb.dtype), emb)

        return [(self.acts_on(model)[0], HookFn(fn, "edit", f"MASK -> {self.value:g}"))]
