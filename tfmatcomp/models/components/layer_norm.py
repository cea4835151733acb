"""LayerNorm with hooks on its scale and normalized value (TransformerLens names and meanings)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from tfmatcomp.models.components.hook_point import HookPoint, is_hooked


class LayerNorm(nn.Module):
    """``LN(x) = (x - mean) / sqrt(var + eps) * w + b`` over the last axis.

    Hooks (TransformerLens's LayerNorm: both come *before* the gain ``w`` and bias ``b``, so an
    edit at either one flows through ``w`` and ``b``):
        hook_scale: ``[batch, pos, 1]``, the ``sqrt(var + eps)`` divisor.
        hook_normalized: ``[batch, pos, d_model]``, ``(x - mean) / scale``, before ``w`` and ``b``.

    The module's output (after ``w`` and ``b``) has no hook of its own here; the module that uses
    the LayerNorm hooks it (``hook_full_embed``, ``blocks.{l}.hook_normalized_resid_mid``,
    ``blocks.{l}.hook_normalized_resid_post``).

    Example:
        >>> import torch
        >>> ln = LayerNorm(4)
        >>> with torch.no_grad():
        ...     _ = ln.w.fill_(2.0), ln.b.fill_(1.0)
        >>> x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
        >>> _ = ln.hook_normalized.add_hook(lambda act, hook: torch.zeros_like(act))
        >>> ln(x).detach()  # the edited normalized value still goes through w and b
        tensor([[[1., 1., 1., 1.]]])
    """

    def __init__(self, d_model: int, eps: float = 1e-12):
        super().__init__()
        self.eps = eps
        self.fused = True  # use F.layer_norm when no hook here is active (see HookedEncoder.unfused)
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model], before w and b

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.fused and not (is_hooked(self.hook_scale) or is_hooked(self.hook_normalized)):
            # Same function, fused kernel: nobody is looking at the intermediates.
            return F.layer_norm(x, self.w.shape, self.w, self.b, self.eps)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.w + self.b
