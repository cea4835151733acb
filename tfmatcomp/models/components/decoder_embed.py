"""GPT-2 embeddings as two modules (TransformerLens's ``embed`` and ``pos_embed``): no LayerNorm.

The decoder's residual stream starts as their sum.

Example:
    >>> import torch
    >>> from tfmatcomp.config import DecoderConfig
    >>> cfg = DecoderConfig(d_model=8, n_heads=2, d_vocab=10, n_ctx=5)
    >>> tokens = torch.zeros(2, 3, dtype=torch.long)
    >>> (Embed(cfg)(tokens) + PosEmbed(cfg)(tokens)).shape
    torch.Size([2, 3, 8])
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from tfmatcomp.config import DecoderConfig


class Embed(nn.Module):
    """Token embedding ``W_E[tokens]``, ``W_E [d_vocab, d_model]``."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    """Learned absolute positions ``W_pos[:pos]`` broadcast over the batch, ``W_pos [n_ctx, d_model]``."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        batch, n_pos = tokens.shape
        return self.W_pos[:n_pos].unsqueeze(0).expand(batch, -1, -1)
