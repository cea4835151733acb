"""pyvene on a HookedEncoder: component names that pyvene's configs understand, mapped to our hooks.

pyvene finds a model's modules through a per-class table (component name -> module and hook kind)
and reads sizes from ``model.config``. :class:`PyveneEncoder` is that view of a
:class:`~tfmatcomp.HookedEncoder`: it holds the model under ``.model``, exposes ``cfg`` as
``.config`` and, per layer, a flat ``[batch, pos, n_heads * d_head]`` copy of ``attn.hook_z`` (the
layout pyvene's per-head components expect). :func:`intervenable` registers the table and builds
the ``pyvene.IntervenableModel``. pyvene is imported only inside these functions.

===============================  =================================================================
pyvene component                 our hook at layer ``l``, and the tensor pyvene sees
===============================  =================================================================
``block_input``                  ``blocks.{l}.hook_resid_pre`` ``[batch, pos, d_model]``
``block_output``                 ``blocks.{l}.hook_normalized_resid_post`` (what the block returns)
``resid_post``                   ``blocks.{l}.hook_resid_post`` (before the block's second LN)
``attention_output``             ``blocks.{l}.hook_attn_out``
``mlp_output``                   ``blocks.{l}.hook_mlp_out``
``mlp_activation``               ``blocks.{l}.mlp.hook_post`` ``[batch, pos, d_mlp]``
``attention_weight``             ``blocks.{l}.attn.hook_pattern`` ``[batch, head, query, key]``
``attention_value_output``       ``blocks.{l}.attn.hook_z``, heads flattened ``[batch, pos, h*d]``
``head_attention_value_output``  ``blocks.{l}.attn.hook_z`` per head ``[batch, head, pos, d_head]``
===============================  =================================================================

``block_output`` is what the block returns (pyvene's meaning; in this post-LN block, after its
second LayerNorm), the same tensor as block ``l + 1``'s ``hook_resid_pre``. For
``attention_weight``, pyvene's ``"pos"`` unit indexes axis 1, which here is the head. Any other
hook is reachable by its module path, e.g. ``component="model.blocks.0.attn.hook_q.output"``.

Things pyvene does to the model it wraps: it puts it in eval mode and turns off
``requires_grad`` of its parameters, and it removes *every* forward hook of the model's modules
before and after each call, TransformerLens hooks added with ``model.add_hook`` included. Two
details of pyvene's own: separate interventions each get their own source run, so give those that
share a source one ``group_key`` (one source run, as
:class:`~tfmatcomp.interventions.ActivationPatch` does; separate runs round differently, ~1e-7);
and pass explicit locations (:func:`locations`): with pyvene 0.1.8, the shorthand of a flat
position list patched a subset of positions differently from the explicit form.

Example:
    The papers' X -> -X patch of every head's output (``hook_z``) in every layer, through pyvene:

    >>> import pytest; pv = pytest.importorskip("pyvene")
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interop.pyvene import intervenable, locations
    >>> from tfmatcomp.interventions import negation_patch
    >>> model = tm.load_pretrained("tiny", step="post")
    >>> x = tm.get_preset("tiny").task.build().sample(4, generator=torch.Generator().manual_seed(0))
    >>> patch, neg = negation_patch(x)
    >>> L, H, (B, P) = model.cfg.n_layers, model.cfg.n_heads, x.tokens.shape
    >>> pv_model = intervenable(model, [{"layer": l, "component": "head_attention_value_output",
    ...                                  "unit": "h.pos", "group_key": 0} for l in range(L)])
    >>> _, f_p = pv_model(base={"tokens": neg.tokens}, sources=[{"tokens": x.tokens}],
    ...                   unit_locations=locations(B, range(P), heads=range(H), n=L))
    >>> torch.equal(f_p, patch.run(model, neg.tokens))
    True
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from jaxtyping import Float
from torch import Tensor, nn

from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.models.objectives import model_kind
from tfmatcomp.validation import check_int_list, check_positive_int

__all__ = ["PyveneEncoder", "MODULE_MAPPING", "DIMENSION_MAPPING", "register", "intervenable",
           "locations"]

_OUT = "register_forward_hook"  # pyvene's CONST_OUTPUT_HOOK, spelled out to avoid importing pyvene


def _split_heads(x: Float[Tensor, "batch pos hd"], n_heads: int) -> Float[Tensor, "batch h pos d"]:
    """``[batch, pos, n_heads * d_head] -> [batch, n_heads, pos, d_head]``, pyvene's head layout."""
    return x.reshape(*x.shape[:2], n_heads, x.shape[-1] // n_heads).permute(0, 2, 1, 3)


#: pyvene component -> (module path in a :class:`PyveneEncoder`, hook kind[, split of the output]).
MODULE_MAPPING: dict[str, tuple] = {
    "block_input": ("model.blocks[%s].hook_resid_pre", _OUT),
    "block_output": ("model.blocks[%s].hook_normalized_resid_post", _OUT),
    "resid_post": ("model.blocks[%s].hook_resid_post", _OUT),
    "attention_output": ("model.blocks[%s].hook_attn_out", _OUT),
    "mlp_output": ("model.blocks[%s].hook_mlp_out", _OUT),
    "mlp_activation": ("model.blocks[%s].mlp.hook_post", _OUT),
    "attention_weight": ("model.blocks[%s].attn.hook_pattern", _OUT),
    "attention_value_output": ("z[%s]", _OUT),
    "head_attention_value_output": ("z[%s]", _OUT, (_split_heads, "n_heads")),
}

#: pyvene component -> the ``EncoderConfig`` field(s) giving its size (pyvene's expression syntax).
DIMENSION_MAPPING: dict[str, tuple[str, ...]] = {
    "n_heads": ("n_heads",),
    "block_input": ("d_model",),
    "block_output": ("d_model",),
    "resid_post": ("d_model",),
    "attention_output": ("d_model",),
    "mlp_output": ("d_model",),
    "mlp_activation": ("d_mlp",),
    "attention_weight": ("n_ctx",),
    "attention_value_output": ("d_model",),
    "head_attention_value_output": ("d_head",),
}


class PyveneEncoder(nn.Module):
    """A :class:`~tfmatcomp.HookedEncoder` as pyvene addresses it (shares the model's weights).

    Args:
        model: the encoder; it is held, not copied, under ``.model``.

    Attributes:
        config: ``model.cfg`` (pyvene reads sizes from ``model.config``).
        z: one identity module per layer whose output is ``attn.hook_z`` flattened to
            ``[batch, pos, n_heads * d_head]``; while something is registered on ``z[l]``, the
            forward routes ``blocks.{l}.attn.hook_z`` through it, so an edit there is the edit
            of ``hook_z``.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> from tfmatcomp.interop.pyvene import PyveneEncoder
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
        >>> tokens = torch.ones(2, 16, dtype=torch.long)
        >>> view = PyveneEncoder(model)
        >>> torch.equal(view(tokens=tokens), model(tokens)), view.config is model.cfg
        (True, True)
    """

    def __init__(self, model: HookedEncoder):
        super().__init__()
        if model_kind(model) != "encoder":
            raise TypeError(f"model: expected a HookedEncoder, got {type(model).__name__}")
        self.model = model
        self.config = model.cfg
        self.z = nn.ModuleList(nn.Identity() for _ in range(model.cfg.n_layers))

    @property
    def device(self) -> torch.device:
        return self.model.device

    def forward(self, tokens: Tensor, **kwargs: Any) -> Tensor:
        """``model(tokens, **kwargs)``, with ``hook_z`` routed through ``z[l]`` where watched."""
        routes = [(f"blocks.{l}.attn.hook_z", _route(flat)) for l, flat in enumerate(self.z)
                  if flat._forward_hooks or flat._forward_pre_hooks]
        with self.model.hooks(fwd_hooks=routes):
            return self.model(tokens, **kwargs)


def _route(flat: nn.Module):
    def hook(z: Float[Tensor, "batch pos head d_head"], hook: Any = None) -> Tensor:
        return flat(z.reshape(*z.shape[:2], -1)).reshape(z.shape)
    return hook


def register() -> None:
    """Add :data:`MODULE_MAPPING` and :data:`DIMENSION_MAPPING` to pyvene's tables for
    :class:`PyveneEncoder` (idempotent; :func:`intervenable` calls it).

    Example:
        >>> import pytest; pv = pytest.importorskip("pyvene")
        >>> from tfmatcomp.interop.pyvene import PyveneEncoder, register
        >>> register()
        >>> pv.type_to_module_mapping[PyveneEncoder]["attention_weight"][0]
        'model.blocks[%s].attn.hook_pattern'
    """
    import pyvene

    pyvene.type_to_module_mapping[PyveneEncoder] = MODULE_MAPPING
    pyvene.type_to_dimension_mapping[PyveneEncoder] = DIMENSION_MAPPING


def intervenable(model: HookedEncoder | PyveneEncoder, representations: Any, **kwargs: Any):
    """``pyvene.IntervenableModel`` on ``model``, with our component names registered.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder` (wrapped in a :class:`PyveneEncoder`) or a view.
        representations: what ``pyvene.IntervenableConfig(representations=...)`` takes (a dict, a
            list of dicts, or pyvene's ``RepresentationConfig`` objects), or an
            ``IntervenableConfig``; ``layer`` is 0-based, ``component`` a name of the module table.
        **kwargs: passed to ``pyvene.IntervenableModel`` (e.g. ``use_fast``).

    Call the result with ``base={"tokens": ...}`` and ``sources=[{"tokens": ...}]``, as pyvene's
    models are called with keyword inputs.

    Example:
        >>> import pytest; pv = pytest.importorskip("pyvene")
        >>> import torch, tfmatcomp as tm
        >>> from tfmatcomp.interop.pyvene import intervenable
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
        >>> pv_model = intervenable(model, {"layer": 0, "component": "head_attention_value_output",
        ...                                 "unit": "h.pos"})
        >>> type(pv_model.model).__name__
        'PyveneEncoder'
    """
    import pyvene

    view = model if isinstance(model, PyveneEncoder) else PyveneEncoder(model)
    register()
    config = representations
    if not isinstance(config, pyvene.IntervenableConfig):
        config = pyvene.IntervenableConfig(representations=representations)
    return pyvene.IntervenableModel(config, view, **kwargs)


def locations(batch_size: int, positions: Iterable[int], heads: Iterable[int] | None = None,
              n: int = 1) -> dict[str, tuple[list, list]]:
    """pyvene's ``unit_locations`` in explicit form: the same sites in source and base, for every
    example of the batch and each of ``n`` interventions.

    Args:
        batch_size: examples in the batch (>= 1).
        positions: 0-based positions (for ``attention_weight``: heads, pyvene's axis 1).
        heads: 0-based heads, for the ``"h.pos"`` unit (None: unit ``"pos"``).
        n: number of interventions in the config (>= 1).

    Example:
        >>> locations(2, [3, 5])
        {'sources->base': ([[[3, 5], [3, 5]]], [[[3, 5], [3, 5]]])}
        >>> locations(1, [0], heads=[2])["sources->base"][0]
        [[[[2]], [[0]]]]
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("n", n)
    pos = check_int_list("positions", positions, lo=0)
    one = [pos] * batch_size
    if heads is not None:
        one = [[check_int_list("heads", heads, lo=0)] * batch_size, one]
    return {"sources->base": ([one] * n, [one] * n)}
