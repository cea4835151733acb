"""Linear read-outs: the encoder's ``Readout`` (the papers' ``Linear(d_model, 1)``, one real value
per position) and the decoder's ``Unembed`` (TransformerLens's, ``d_model`` to ``d_vocab`` logits)."""

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


class Unembed(nn.Module):
    """TransformerLens's ``Unembed``: logits ``x @ W_U + b_U`` with ``W_U [d_model, d_vocab]`` and
    ``b_U [d_vocab]`` (the parameter names and layout of TransformerLens's HookedTransformer, so
    ``model.unembed.W_U`` and the state-dict keys ``unembed.W_U``, ``unembed.b_U`` mean what they
    mean there).

    Example:
        >>> import torch
        >>> unembed = Unembed(4, 10)
        >>> unembed.W_U.shape, unembed.b_U.shape, unembed(torch.zeros(2, 3, 4)).shape
        (torch.Size([4, 10]), torch.Size([10]), torch.Size([2, 3, 10]))
    """

    def __init__(self, d_model: int, d_vocab: int):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(d_model, d_vocab))
        self.b_U = nn.Parameter(torch.zeros(d_vocab))

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        return x @ self.W_U + self.b_U
