"""BERT's masked-LM transform (TransformerLens 3's ``BertMLMHead``): dense, activation, LayerNorm.

The logits are then ``unembed`` (:class:`~tfmatcomp.models.components.readout.Unembed`) of its
output, as in TransformerLens 3's ``HookedEncoder``.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from tfmatcomp.config import EncoderConfig
from tfmatcomp.models.components.hook_point import HookPoint
from tfmatcomp.models.components.layer_norm import LayerNorm
from tfmatcomp.models.components.mlp import _ACTS
from tfmatcomp.models.components.readout import Unembed


class BertMLMHead(nn.Module):
    """``ln(act(x @ W + b))`` with ``W [d_model, d_model]``, ``b [d_model]`` (TransformerLens 3's
    names: ``mlm_head.W``, ``mlm_head.b``, ``mlm_head.ln.w``, ``mlm_head.ln.b``; hooks
    ``mlm_head.ln.hook_scale`` and ``mlm_head.ln.hook_normalized``). The activation is the
    config's ``act_fn`` (HuggingFace BERT's ``hidden_act``).

    Example:
        >>> import torch, tfmatcomp as tm
        >>> head = BertMLMHead(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> head(torch.zeros(2, 3, 8)).shape
        torch.Size([2, 3, 8])
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.W = nn.Parameter(torch.empty(cfg.d_model, cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))
        self.act = _ACTS[cfg.act_fn]
        self.ln = LayerNorm(cfg.d_model, cfg.layer_norm_eps)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return self.ln(self.act(x @ self.W + self.b))


class MLMUnembed(Unembed):
    """The masked-LM head's unembedding: :class:`~tfmatcomp.models.components.readout.Unembed`
    (``W_U [d_model, d_vocab]``, ``b_U``) with TransformerLens 3.9's two hooks on it,
    ``unembed.hook_in`` (``[batch, pos, d_model]``, the transformed residual) and
    ``unembed.hook_out`` (``[batch, pos, d_vocab]``, the logits).

    Example:
        >>> import torch
        >>> MLMUnembed(4, 10)(torch.zeros(2, 3, 4)).shape
        torch.Size([2, 3, 10])
    """

    def __init__(self, d_model: int, d_vocab: int):
        super().__init__(d_model, d_vocab)
        self.hook_in = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, d_vocab]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        return self.hook_out(super().forward(self.hook_in(x)))
