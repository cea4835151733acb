"""Ablations: uniform attention (the papers'), batch-mean attention (the reference code's), and zero /
mean ablation of any activation.

* :class:`UniformAttentionAblation`: at ``blocks.{l}.attn.hook_pattern`` (``[batch, head, query,
  key]``) the softmax probabilities of the chosen heads become ``1 / n_keys`` for every query and key
  (``1/n^2`` for an ``n x n`` matrix), "attend equally to all tokens" (the workshop paper, Appendix J).
* :class:`MeanAttentionAblation`: the chosen heads' patterns are replaced by their mean over the
  batch, which is what the papers' public code ran under the name "uniform ablation". A no-op at
  batch size 1, and it depends on the batch: report which one you use.
* :class:`ActivationAblation`: zero or mean ablation at any hook, optionally restricted to heads and
  positions.

Heads are 0-based ``(layer, head)`` pairs (or ``"all"``); convert the papers' 1-based labels with
:func:`~tfmatcomp.interventions.sites.paper_heads`. With a padding ``attention_mask`` the uniform
pattern still spreads over *all* keys (the papers' task has no padding).

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions import UniformAttentionAblation, paper_heads
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=4, n_heads=8, d_model=32, d_mlp=32, n_ctx=49))
    >>> abl = UniformAttentionAblation(paper_heads("(4,3)"))      # the papers' head (4,3)
    >>> abl.heads
    [(3, 2)]
    >>> tokens = tm.MatrixCompletionTask(7).sample(2, generator=torch.Generator().manual_seed(0)).tokens
    >>> _, cache = abl.run_with_cache(model, tokens)
    >>> bool((cache["blocks.3.attn.hook_pattern"][:, 2] == 1 / 49).all())
    True
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Literal, Mapping

import torch
from torch import Tensor

from tfmatcomp.interventions.base import FwdHook, HookFn, Intervention
from tfmatcomp.interventions.serialize import (positions_from_data, positions_to_data,
                                               tensor_from_data, tensor_to_data)
from tfmatcomp.interventions.sites import (HeadSpec, PositionSpec, check_head_spec, check_hook_list, check_positions,
                                           describe_site, paper_label, resolve_heads, resolve_hook_names, site_mask)
from tfmatcomp.models.components.attention import future_mask
from tfmatcomp.validation import check_choice, check_int_list

__all__ = ["UniformAttentionAblation", "MeanAttentionAblation", "ActivationAblation"]


class _PatternAblation(Intervention):
    stage: ClassVar[str] = "hooks"
    _what = ""
    _required = ("heads",)

    def __init__(self, heads: HeadSpec = "all"):
        self._heads: str | list[tuple[int, int]] = check_head_spec(heads)

    def _to_data(self) -> dict[str, Any]:
        return {"heads": self._heads if self._heads == "all" else [list(p) for p in self._heads]}

    @classmethod
    def from_paper_labels(cls, labels: str | Iterable[tuple[int, int | str]]):
        """Build from the papers' 1-based labels, e.g. ``"(3,3), (4,2), (4,5-7)"``.

        Example:
            >>> UniformAttentionAblation.from_paper_labels("(4,3)").heads
            [(3, 2)]
        """
        from tfmatcomp.interventions.sites import paper_heads

        return cls(paper_heads(labels))

    @property
    def heads(self) -> str | list[tuple[int, int]]:
        """The ablated heads, 0-based, as given (``"all"`` is resolved against a model)."""
        return self._heads

    def resolved_heads(self, model) -> list[tuple[int, int]]:
        """The ablated heads of ``model``, 0-based, validated."""
        return resolve_heads(model.cfg.n_layers, model.cfg.n_heads, self._heads)

    def _by_layer(self, model) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for l, h in self.resolved_heads(model):
            out.setdefault(l, []).append(h)
        return out

    def describe(self) -> str:
        which = "all heads" if self._heads == "all" else (
            f"heads {self._heads} (0-based; papers' {paper_label(self._heads)})" if self._heads
            else "no heads")
        return f"{self._what} of {which} at blocks.{{l}}.attn.hook_pattern"

    def acts_on(self, model) -> list[str]:
        return [f"blocks.{l}.attn.hook_pattern" for l in sorted(self._by_layer(model))]

    def _replace(self, pattern: Tensor, heads: list[int], causal: bool = False) -> Tensor:
        raise NotImplementedError

    def fwd_hooks(self, model) -> list[FwdHook]:
        from tfmatcomp.models.hook_names import is_causal

        hooks: list[FwdHook] = []
        causal = is_causal(model)
        for l, heads in sorted(self._by_layer(model).items()):
            def fn(pattern: Tensor, hook: Any = None, heads: list[int] = heads) -> Tensor:
                return self._replace(pattern, heads, causal)

            hooks.append((f"blocks.{l}.attn.hook_pattern",
                          HookFn(fn, "edit", f"{type(self).__name__} L{l} H{heads}")))
        return hooks


class UniformAttentionAblation(_PatternAblation):
    """The papers' uniform ablation: ablated heads attend to every key with probability ``1/n_keys``.

    Args:
        heads: 0-based ``(layer, head)`` pairs, or ``"all"`` (every head of the model). An empty
            list ablates nothing (a no-op).

    Acts at ``blocks.{l}.attn.hook_pattern`` ``[batch, head, query, key]``; the value written is
    exactly ``1 / n_keys`` in the pattern's dtype. On a causal model (a
    :class:`~tfmatcomp.HookedDecoder`) each query spreads over the keys it may see: ``1 / (q + 1)``
    for query ``q``, zero above the diagonal, so the run stays causal.

    Example:
        >>> UniformAttentionAblation([(0, 1), (1, 0)]).describe()
        "uniform attention ablation (pattern = 1/n_keys) of heads [(0, 1), (1, 0)] (0-based; papers' (1,2), (2,1)) at blocks.{l}.attn.hook_pattern"
    """

    kind: ClassVar[str] = "uniform_attention_ablation"
    _what = "uniform attention ablation (pattern = 1/n_keys)"

    def _replace(self, pattern: Tensor, heads: list[int], causal: bool = False) -> Tensor:
        out = pattern.clone()
        if not causal:
            out[:, heads] = 1.0 / pattern.shape[-1]
            return out
        # a causal model: each query attends equally to the keys it may see (1 / (query + 1))
        allowed = ~future_mask(*pattern.shape[-2:], device=pattern.device)
        out[:, heads] = (allowed / allowed.sum(-1, keepdim=True)).to(pattern.dtype)
        return out


class MeanAttentionAblation(_PatternAblation):
    """Mean attention ablation (what the papers' code ran): ablated heads' patterns become their
    mean over the batch (every matrix in the batch gets the same pattern).

    Args:
        heads: 0-based ``(layer, head)`` pairs, or ``"all"``.

    Example:
        >>> MeanAttentionAblation("all").heads
        'all'
    """

    kind: ClassVar[str] = "mean_attention_ablation"
    _what = "mean attention ablation (pattern = its batch mean)"

    def _replace(self, pattern: Tensor, heads: list[int], causal: bool = False) -> Tensor:
        out = pattern.clone()
        out[:, heads] = pattern[:, heads].mean(0, keepdim=True)
        return out


class ActivationAblation(Intervention):
    """Zero or mean ablation of the activation at one or more hooks.

    Args:
        hooks: hook name(s), full (``"blocks.1.hook_mlp_out"``) or block-relative (``"hook_mlp_out"``,
            expanded over ``layers``).
        mode: ``"zero"`` writes 0; ``"mean"`` writes the mean over the batch (per position and
            channel), or ``mean_value`` when given.
        layers: 0-based layers for block-relative names (default: all).
        heads: 0-based head indices, for hooks with a head axis (q, k, v, z, scores, pattern).
        positions: position indices or a bool mask ``[pos]`` / ``[batch, pos]``; query positions for
            scores / patterns.
        mean_value: a tensor broadcastable to the activation (e.g. a mean over a reference set), or a
            mapping from full hook name to such a tensor; only with ``mode="mean"``.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_mlp=8, n_ctx=4))
        >>> abl = ActivationAblation("attn.hook_z", mode="zero", layers=[1], heads=[0])
        >>> abl.acts_on(model)
        ['blocks.1.attn.hook_z']
        >>> _, cache = abl.run_with_cache(model, torch.tensor([[1, 2, 3, 0]]))
        >>> bool((cache["blocks.1.attn.hook_z"][:, :, 0] == 0).all())
        True
    """

    stage: ClassVar[str] = "hooks"
    kind: ClassVar[str] = "activation_ablation"
    _required = ("hooks",)
    _optional = ("mode", "layers", "heads", "positions", "mean_value")

    def __init__(
        self,
        hooks: str | Iterable[str],
        mode: Literal["zero", "mean"] = "zero",
        layers: Iterable[int] | None = None,
        heads: Iterable[int] | None = None,
        positions: PositionSpec = None,
        mean_value: Tensor | Mapping[str, Tensor] | None = None,
    ):
        check_choice("mode", mode, ("zero", "mean"))
        if mean_value is not None and mode != "mean":
            raise ValueError("mean_value: only allowed with mode='mean'")
        self.hooks = check_hook_list(hooks)
        self.mode = mode
        self.layers = None if layers is None else check_int_list("layers", layers, lo=0)
        self.heads = None if heads is None else check_int_list("heads", heads, lo=0)
        self.positions = check_positions(positions)
        self.mean_value = mean_value

    def _to_data(self) -> dict[str, Any]:
        mean = self.mean_value
        if isinstance(mean, Mapping):
            mean = {"by_hook": {str(k): tensor_to_data(v) for k, v in mean.items()}}
        elif mean is not None:
            mean = tensor_to_data(mean)
        return {"hooks": list(self.hooks), "mode": self.mode, "layers": self.layers,
                "heads": self.heads, "positions": positions_to_data(self.positions),
                "mean_value": mean}

    @classmethod
    def _from_data(cls, fields: dict[str, Any], where: str) -> "ActivationAblation":
        mean = fields.get("mean_value")
        if isinstance(mean, Mapping) and "by_hook" in mean:
            by_hook = mean["by_hook"]
            if not isinstance(by_hook, Mapping):
                raise ValueError(f"{where}.mean_value.by_hook: expected a dict hook name -> tensor")
            fields["mean_value"] = {k: tensor_from_data(v, f"{where}.mean_value.by_hook[{k!r}]")
                                    for k, v in by_hook.items()}
        elif mean is not None:
            fields["mean_value"] = tensor_from_data(mean, f"{where}.mean_value")
        fields["positions"] = positions_from_data(fields.get("positions"), f"{where}.positions")
        return cls(**fields)

    def describe(self) -> str:
        where = ", ".join(self.hooks)
        extra = describe_site(self.layers, self.heads, self.positions)
        return f"{self.mode} ablation at {where}{extra} (0-based)"

    def acts_on(self, model) -> list[str]:
        return resolve_hook_names(model, self.hooks, self.layers)

    def _mean_for(self, name: str) -> Tensor | None:
        if self.mean_value is None:
            return None
        if isinstance(self.mean_value, Mapping):
            if name not in self.mean_value:
                raise ValueError(f"mean_value: no entry for hook {name!r}")
            return torch.as_tensor(self.mean_value[name])
        return torch.as_tensor(self.mean_value)

    def fwd_hooks(self, model) -> list[FwdHook]:
        hooks: list[FwdHook] = []
        for name in self.acts_on(model):
            given = self._mean_for(name)

            def fn(act: Tensor, hook: Any = None, name: str = name, given: Tensor | None = given) -> Tensor:
                if self.mode == "zero":
                    new = torch.zeros_like(act)
                elif given is not None:
                    new = given.to(device=act.device, dtype=act.dtype).expand_as(act)
                else:
                    new = act.mean(0, keepdim=True).expand_as(act)
                mask = site_mask(act.shape, name, self.heads, self.positions, act.device)
                return new.clone() if mask is None else torch.where(mask, new, act)

            hooks.append((name, HookFn(fn, "edit", f"{self.mode} ablation {name}")))
        return hooks
