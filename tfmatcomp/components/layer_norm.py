"""LayerNorm with hooks on its scale and normalized output (TransformerLens names)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint


class LayerNorm(nn.Module):
    """``LN(x) = (x - mean) / sqrt(var + eps) * w + b`` over the last axis.

    Hooks:
        hook_scale: ``[batch, pos, 1]``, the ``sqrt(var + eps)`` divisor.
        hook_normalized: ``[batch, pos, d_model]``, the output (after ``w`` and ``b``).
    """

    def __init__(self, d_model: int, eps: float = 1e-12):
        super().__init__()
        self.eps = eps
        self.fused = True  # use F.layer_norm when no hook here is active (see HookedEncoder.unfused)
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.fused and not (_hooked(self.hook_scale) or _hooked(self.hook_normalized)):
            # Same function, fused kernel: nobody is looking at the intermediates.
            return F.layer_norm(x, self.w.shape, self.w, self.b, self.eps)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w + self.b)


def _hooked(hook_point: HookPoint) -> bool:
    """True when something may read or edit ``hook_point``: a TransformerLens hook, a plain PyTorch
    hook (pyvene registers those), or a ``forward`` replaced on the instance (nnsight's tracing)."""
    return bool(hook_point.fwd_hooks or hook_point.bwd_hooks or hook_point._forward_hooks
                or hook_point._forward_pre_hooks or "forward" in vars(hook_point))
