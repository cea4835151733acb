"""Activation patching: write activations recorded on a source run into the target run.

The papers' causal intervention (seed 000 Appendix J, seed 002 Appendix F): run the model on ``X``,
store the attention heads' outputs before the output projection (``blocks.{l}.attn.hook_z``,
``[batch, pos, head, d_head]``) of all layers, then run on ``-X`` with the same mask while writing the
stored values in; measure the output against ``X`` and ``-X``. The papers' text patches all layers;
their code patched only the last one. Here any hooks, layers, heads and positions can be chosen; the
defaults are the papers' text (``hook_z`` of every layer, all heads, all positions), and
:func:`negation_patch` builds the whole recipe from one batch.

The source is either recorded activations (an ``ActivationCache`` from ``model.run_with_cache`` or a
``{hook name: tensor}`` dict) or inputs (a :class:`~tfmatcomp.MatrixBatch` or token ids) that are run
once, without gradients, when the hooks are built. Source and target must have the same batch size
and sequence length.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions import negation_patch
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=16, n_ctx=16))
    >>> x = tm.MatrixCompletionTask(4, rank=1).sample(8, generator=torch.Generator().manual_seed(0))
    >>> patch, target = negation_patch(x)              # source X, target -X, hook_z of all layers
    >>> patch.acts_on(model)
    ['blocks.0.attn.hook_z', 'blocks.1.attn.hook_z']
    >>> f_p = patch.run(model, target.tokens)          # f_p(-X, X) in the papers' notation
    >>> f_p.shape
    torch.Size([8, 16])
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Mapping

import torch
from torch import Tensor

from tfmatcomp.data import MatrixBatch
from tfmatcomp.interventions.base import FwdHook, HookFn, Intervention
from tfmatcomp.interventions.sites import (PositionSpec, check_hook_list, describe_site,
                                           resolve_hook_names, site_mask)
from tfmatcomp.validation import check_int_list

__all__ = ["ActivationPatch", "negation_patch"]


class ActivationPatch(Intervention):
    """Replace activations of the target run by those of a source run at chosen sites.

    Args:
        source: an ``ActivationCache`` / ``{hook name: tensor}`` mapping holding every patched hook,
            or a :class:`~tfmatcomp.MatrixBatch` / token ids ``[batch, pos]`` to run as the source.
        hooks: hook name(s), full or block-relative (default ``"attn.hook_z"``).
        layers: 0-based layers for block-relative names (default: all).
        heads: 0-based head indices (hooks with a head axis only; default: all).
        positions: position indices or a bool mask ``[pos]`` / ``[batch, pos]`` (query positions for
            scores / patterns; default: all).

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_mlp=8, n_ctx=4))
        >>> a, b = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5, 6, 7, 8]])
        >>> patch = ActivationPatch(b, hooks="blocks.1.hook_resid_pre")
        >>> torch.equal(patch.run(model, a), model(b))
        True
    """

    stage: ClassVar[str] = "hooks"

    def __init__(
        self,
        source: Any,
        hooks: str | Iterable[str] = "attn.hook_z",
        layers: Iterable[int] | None = None,
        heads: Iterable[int] | None = None,
        positions: PositionSpec = None,
    ):
        if isinstance(source, MatrixBatch):
            source = source.tokens
        if not (torch.is_tensor(source) or hasattr(source, "__getitem__")):
            raise TypeError(f"source: expected an ActivationCache, a dict, a MatrixBatch or token ids, "
                            f"got {type(source).__name__}")
        self.source = source
        self.hooks = check_hook_list(hooks)
        self.layers = None if layers is None else check_int_list("layers", layers, lo=0)
        self.heads = None if heads is None else check_int_list("heads", heads, lo=0)
        self.positions = positions

    def describe(self) -> str:
        src = "a source run" if torch.is_tensor(self.source) else "recorded activations"
        extra = describe_site(self.layers, self.heads, self.positions, all_layers=" all layers")
        return f"activation patch from {src} at {', '.join(self.hooks)}{extra} (0-based)"

    def acts_on(self, model) -> list[str]:
        return resolve_hook_names(model, self.hooks, self.layers)

    def source_activations(self, model) -> dict[str, Tensor]:
        """``{hook name: source activation}`` for every patched hook (runs the source if needed)."""
        names = self.acts_on(model)
        if torch.is_tensor(self.source):
            with torch.no_grad():
                _, cache = model.run_with_cache(self.source.to(model.device),
                                                names_filter=lambda n: n in names)
            return {n: cache[n].detach() for n in names}
        out: dict[str, Tensor] = {}
        for n in names:
            try:
                out[n] = self.source[n].detach()
            except KeyError:
                raise ValueError(f"source: has no activation for hook {n!r}; record it with "
                                 "model.run_with_cache(tokens, names_filter=...)") from None
        return out

    def fwd_hooks(self, model) -> list[FwdHook]:
        hooks: list[FwdHook] = []
        for name, src in self.source_activations(model).items():
            def fn(act: Tensor, hook: Any = None, name: str = name, src: Tensor = src) -> Tensor:
                if src.shape != act.shape:
                    raise ValueError(f"source: activation at {name} has shape {tuple(src.shape)}, "
                                     f"the target run's has {tuple(act.shape)} (same batch size and "
                                     "length needed)")
                new = src.to(device=act.device, dtype=act.dtype)
                mask = site_mask(act.shape, name, self.heads, self.positions, act.device)
                return new.clone() if mask is None else torch.where(mask, new, act)

            hooks.append((name, HookFn(fn, "edit", f"patch {name}")))
        return hooks


def negation_patch(
    batch: MatrixBatch,
    hooks: str | Iterable[str] = "attn.hook_z",
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    positions: PositionSpec = None,
) -> tuple[ActivationPatch, MatrixBatch]:
    """The papers' X -> -X recipe: ``(patch with source X, target batch -X with the same mask)``.

    Run the target under the patch to get ``f_p(-X, X)``; compare it with ``batch.values`` (X) and
    ``target.values`` (-X) at masked / observed entries.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> x = tm.MatrixCompletionTask(4, rank=1).sample(2, generator=torch.Generator().manual_seed(0))
        >>> patch, target = negation_patch(x, layers=[1])
        >>> torch.equal(target.values, -x.values), torch.equal(target.observed, x.observed)
        (True, True)
    """
    if not isinstance(batch, MatrixBatch):
        raise TypeError(f"batch: expected a MatrixBatch, got {type(batch).__name__}")
    return ActivationPatch(batch, hooks=hooks, layers=layers, heads=heads, positions=positions), batch.negated()
