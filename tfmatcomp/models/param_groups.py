"""Named groups of parameters, shared by weight transplants and component-wise training.

One registry (:data:`PARAM_GROUPS`) says which parameters of a :class:`~tfmatcomp.HookedEncoder`
(names as in ``model.named_parameters()``, ``l`` a layer) belong to which group:

==================  ======================================================================  =====
group               parameters                                                              alias
==================  ======================================================================  =====
``"attention"``     ``blocks.l.attn.*`` (``W_Q, W_K, W_V, W_O`` and biases) and             ``"attn"``
                    ``blocks.l.ln1.*``
``"qkv"``           ``blocks.l.attn.W_Q, W_K, W_V, b_Q, b_K, b_V``
``"attn_out"``      ``blocks.l.attn.W_O, b_O`` (the output projection)
``"mlp"``           ``blocks.l.mlp.*`` and ``blocks.l.ln2.*``
``"embed"``         every ``embed.*`` parameter: ``W_E``, ``W_pos`` (``W_token_type``) and
                    ``embed.ln.*``
``"token_embed"``   ``embed.W_E``
``"pos_embed"``     ``embed.W_pos``
``"ln"``            every LayerNorm: ``embed.ln.*``, ``blocks.l.ln1.*``, ``blocks.l.ln2.*``
``"readout"``       ``readout.W, readout.b``
``"all_but_attn"``  every parameter outside ``"attention"``
``"all"``           every parameter
==================  ======================================================================  =====

Membership follows HuggingFace BERT's modules, which the papers' code selects parameters by:
``BertAttention`` holds the LayerNorm after attention (so ``ln1`` is part of ``"attention"``),
``BertOutput`` the one after the MLP (``ln2`` is part of ``"mlp"``), and ``BertEmbeddings`` its
LayerNorm (``embed.ln`` is part of ``"embed"``). Before this registry, the transplant groups
``"attn"``, ``"mlp"`` and ``"embed"`` left their LayerNorms out (and ``"all_but_attn"`` kept
``ln1``); they now agree with component-wise training (the NeurIPS paper Sec. 4), whose membership was
already this one. The papers' transplant itself (``"qkv"``) is unchanged.

The decoder (:class:`~tfmatcomp.HookedDecoder`, pre-LN) has the same block names; its positional
table ``pos_embed.W_pos`` is in ``"embed"`` and ``"pos_embed"``, ``ln_final.*`` in ``"ln"`` and
``"readout"`` (with ``unembed.W_U, unembed.b_U``); ``ln1`` feeds its attention and ``ln2`` its MLP, so
``"attention"`` and ``"mlp"`` hold them as for the encoder.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.models.param_groups import group_parameter_names
    >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
    >>> group_parameter_names(m, "attn") == group_parameter_names(m, "attention")
    True
    >>> group_parameter_names(m, ["mlp", "pos_embed"])
    ['embed.W_pos', 'blocks.0.mlp.W_in', 'blocks.0.mlp.b_in', 'blocks.0.mlp.W_out', 'blocks.0.mlp.b_out', 'blocks.0.ln2.w', 'blocks.0.ln2.b']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

__all__ = ["PARAM_GROUPS", "GROUP_ALIASES", "GROUPS", "canonical_group", "group_predicate",
           "group_parameter_names"]

Predicate = Callable[[str], bool]


def _matches(pattern: str) -> Predicate:
    rx = re.compile(pattern + "$")
    return lambda name: rx.match(name) is not None


_BLOCK = r"blocks\.\d+\."
_attention = _matches(_BLOCK + r"(attn|ln1)\..+")

#: The groups, canonical names only: name -> predicate on parameter names (see the module table).
PARAM_GROUPS: Mapping[str, Predicate] = MappingProxyType({
    "attention": _attention,
    "qkv": _matches(_BLOCK + r"attn\.[Wb]_[QKV]"),
    "attn_out": _matches(_BLOCK + r"attn\.[Wb]_O"),
    "mlp": _matches(_BLOCK + r"(mlp|ln2)\..+"),
    "embed": _matches(r"(pos_)?embed\..+"),
    "token_embed": _matches(r"embed\.W_E"),
    "pos_embed": _matches(r"(pos_)?embed\.W_pos"),
    "ln": _matches(r"(embed\.ln|ln_final|" + _BLOCK + r"ln[12])\.[wb]"),
    "readout": _matches(r"(readout|unembed|ln_final)\..+"),
    "all_but_attn": lambda name: not _attention(name),
    "all": lambda name: True,
})

#: Other spellings accepted for a group: alias -> canonical name.
GROUP_ALIASES: Mapping[str, str] = MappingProxyType({"attn": "attention"})

#: Every accepted name (canonical names and aliases) -> predicate.
GROUPS: Mapping[str, Predicate] = MappingProxyType(
    {**PARAM_GROUPS, **{a: PARAM_GROUPS[c] for a, c in GROUP_ALIASES.items()}})


def canonical_group(name: str) -> str:
    """The canonical name of a group or alias.

    Raises:
        ValueError: ``name`` is neither a group nor an alias.

    Example:
        >>> canonical_group("attn"), canonical_group("mlp")
        ('attention', 'mlp')
    """
    if name in PARAM_GROUPS:
        return name
    if name in GROUP_ALIASES:
        return GROUP_ALIASES[name]
    raise ValueError(f"group: unknown parameter group {name!r}; choose from {sorted(GROUPS)}")


def group_predicate(groups: str | Iterable[str]) -> Predicate:
    """A predicate on parameter names selecting one group or the union of several.

    Raises:
        ValueError: an unknown group name, or no group.

    Example:
        >>> pred = group_predicate("attention")
        >>> pred("blocks.0.attn.W_Q"), pred("blocks.0.ln1.w"), pred("blocks.0.mlp.W_in")
        (True, True, False)
    """
    names = [groups] if isinstance(groups, str) else list(groups)
    if not names:
        raise ValueError(f"group: give at least one parameter group; choose from {sorted(GROUPS)}")
    preds = [PARAM_GROUPS[canonical_group(g)] for g in names]
    return lambda name: any(p(name) for p in preds)


def group_parameter_names(model, groups: str | Iterable[str]) -> list[str]:
    """Names of ``model``'s parameters in ``groups``, in the model's order.

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> group_parameter_names(m, "readout")
        ['readout.W', 'readout.b']
    """
    pred = group_predicate(groups)
    return [n for n, _ in model.named_parameters() if pred(n)]
