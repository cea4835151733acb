"""Linear read-out: one real value per position (the papers' ``Linear(d_model, 1)``)."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn


class Readout(nn.Module):
    """``x @ W + b`` with ``W [d_model, d_out]``, ``b [d_out]``; squeezed when ``d_out == 1``."""

    def __init__(self, d_model: int, d_out: int = 1):
        super().__init__()
        self.W = nn.Parameter(torch.empty(d_model, d_out))
        self.b = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos *d_out"]:
        out = x @ self.W + self.b
        return out.squeeze(-1) if out.shape[-1] == 1 else out
