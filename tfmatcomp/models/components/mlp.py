"""The feed-forward block: ``W_out act(W_in x + b_in) + b_out``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from tfmatcomp.models.components.hook_point import HookPoint

from tfmatcomp.config import DecoderConfig, EncoderConfig

_ACTS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class MLP(nn.Module):
    """Two-layer MLP. ``W_in [d_model, d_mlp]``, ``W_out [d_mlp, d_model]``.

    Hooks:
        hook_pre: ``[batch, pos, d_mlp]`` before the activation.
        hook_post: ``[batch, pos, d_mlp]`` after it.
    """

    def __init__(self, cfg: EncoderConfig | DecoderConfig):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act = _ACTS[cfg.act_fn]
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        post = self.hook_post(self.act(pre))
        return post @ self.W_out + self.b_out
