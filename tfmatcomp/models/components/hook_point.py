"""TransformerLens's ``HookPoint``, refusing a hook that changes the activation's shape."""

from __future__ import annotations

import torch
from torch import Tensor
from transformer_lens.hook_points import HookPoint as _TLHookPoint


class HookPoint(_TLHookPoint):
    """A TransformerLens ``HookPoint`` (every TransformerLens tool takes it as one) whose hooks may
    read or replace the activation but not reshape it: a hook returning a tensor of another shape
    raises ``ValueError`` naming the hook point, instead of silently changing the model's output.

    Example:
        >>> hp = HookPoint()
        >>> hp.name = "blocks.0.hook_resid_pre"
        >>> _ = hp.add_hook(lambda act, hook: act[:, :1])
        >>> hp(torch.zeros(2, 3))
        Traceback (most recent call last):
        ...
        ValueError: hook at blocks.0.hook_resid_pre: returned shape (2, 1); a hook must return None or a tensor of the activation's shape (2, 3)
    """

    def __call__(self, x: Tensor) -> Tensor:
        out = super().__call__(x)
        if out is not x and torch.is_tensor(out) and torch.is_tensor(x) and out.shape != x.shape:
            raise ValueError(f"hook at {self.name}: returned shape {tuple(out.shape)}; a hook must "
                             f"return None or a tensor of the activation's shape {tuple(x.shape)}")
        return out
