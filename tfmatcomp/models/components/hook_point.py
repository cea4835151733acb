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


def is_hooked(hook_point: HookPoint) -> bool:
    """True when something may read or edit ``hook_point``: a TransformerLens hook, a plain PyTorch
    hook (pyvene registers those), or a ``forward`` replaced on the instance (nnsight's tracing).
    The components take their fused kernels only where nothing is hooked, and the fast training
    step runs only on a model with no hook point hooked.

    Example:
        >>> hp = HookPoint()
        >>> before = is_hooked(hp)
        >>> _ = hp.add_hook(lambda act, hook: act)
        >>> before, is_hooked(hp)
        (False, True)
    """
    return bool(hook_point.fwd_hooks or hook_point.bwd_hooks or hook_point._forward_hooks
                or hook_point._forward_pre_hooks or "forward" in vars(hook_point))
