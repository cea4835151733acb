"""Hook names in one place: the hidden state after ``l`` layers, attention patterns, name resolution.

**The hidden-state convention.** ``h^(l)`` is the hidden state *after* ``l`` layers, ``l = 0..L``:
``h^(0)`` is the embedding output, ``h^(l)`` the output of block ``l - 1`` (0-based), which is also
the input of block ``l``; ``h^(L)`` is the model's final hidden state. So ``l`` is the papers'
1-based "layer l", and a table's ``layer`` column means this ``l`` throughout the library.

In this post-LN encoder every ``h^(l)`` with ``l < L`` passes through two hook points that carry the
same tensor: the one where it is *written* (``hook_full_embed`` for ``l = 0``, else
``blocks.{l-1}.hook_normalized_resid_post``) and the one where block ``l`` *reads* it
(``blocks.{l}.hook_resid_pre``). :func:`resid_name` names either:

* ``at="block_input"`` (the default; the TransformerLens-style name that also exists in HF bridges):
  ``blocks.{l}.hook_resid_pre`` for ``l < L``, ``blocks.{L-1}.hook_normalized_resid_post`` for ``L``.
  Used by :mod:`tfmatcomp.decomposition` (:func:`residual_stream_names`) and for patching.
* ``at="layer_output"``: where layer ``l`` writes it (``hook_full_embed``, then
  ``blocks.{l-1}.hook_normalized_resid_post``). Used in :mod:`tfmatcomp.analyses.probes`' tables.

Both give bit-identical activations (tested). Other hooks: :func:`pattern_hook_names` for the
attention probabilities, :func:`block_hook_name` for one hook of one block, and
:func:`resolve_hook_names` for full or block-relative names chosen by the user.

**Both model kinds.** The encoder and the decoder share TransformerLens's block names; where they
differ (the token-embedding hook, the hook after the read-out, the positional table), the
interventions ask :func:`embed_hook_name`, :func:`readout_hook_name`, :func:`pos_embed_param_name`
and :func:`is_causal` instead of spelling a name.

Example:
    >>> from tfmatcomp.models.hook_names import resid_name
    >>> [resid_name(l, 2) for l in range(3)]
    ['blocks.0.hook_resid_pre', 'blocks.1.hook_resid_pre', 'blocks.1.hook_normalized_resid_post']
    >>> [resid_name(l, 2, at="layer_output") for l in range(3)]
    ['hook_full_embed', 'blocks.0.hook_normalized_resid_post', 'blocks.1.hook_normalized_resid_post']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

from torch import nn

from tfmatcomp.validation import is_int

__all__ = [
    "ResidAt",
    "resid_name",
    "residual_stream_names",
    "check_layers",
    "pattern_hook_names",
    "block_hook_name",
    "resolve_hook_names",
    "embed_hook_name",
    "readout_hook_name",
    "pos_embed_param_name",
    "is_causal",
]

ResidAt = Literal["block_input", "layer_output"]


def resid_name(layer: int, n_layers: int, *, at: ResidAt = "block_input", arg: str = "layer") -> str:
    """Hook name of ``h^(layer)``, the hidden state after ``layer`` layers (module docstring).

    Args:
        layer: ``0..n_layers`` (0 = embedding output, ``l`` = output of block ``l - 1``).
        n_layers: the model's number of blocks ``L``.
        at: ``"block_input"`` (``blocks.{l}.hook_resid_pre``) or ``"layer_output"``
            (``hook_full_embed`` / ``blocks.{l-1}.hook_normalized_resid_post``); the same tensor.
        arg: the argument name used in error messages.

    Example:
        >>> resid_name(0, 4, at="layer_output"), resid_name(4, 4)
        ('hook_full_embed', 'blocks.3.hook_normalized_resid_post')
    """
    if not is_int(layer) or not 0 <= layer <= n_layers:
        raise ValueError(f"{arg}: each layer must be an integer in [0, {n_layers}] (0 = embedding "
                         f"output, l = output of block l-1), got {layer!r}")
    if at not in ("block_input", "layer_output"):
        raise ValueError(f"at: must be 'block_input' or 'layer_output', got {at!r}")
    if layer == n_layers:
        return f"blocks.{layer - 1}.hook_normalized_resid_post" if layer else "hook_full_embed"
    if at == "block_input":
        return f"blocks.{layer}.hook_resid_pre"
    return "hook_full_embed" if layer == 0 else f"blocks.{layer - 1}.hook_normalized_resid_post"


def residual_stream_names(model: nn.Module) -> list[str]:
    """Hook names of the residual stream between blocks, ``h^(0), ..., h^(L)`` in the paper's terms.

    ``blocks.{l}.hook_resid_pre`` for every block (``h^(l)``, the input of block ``l``; ``l = 0`` is
    the embedding output), then the last block's output (``hook_normalized_resid_post`` in a post-LN
    model, else ``hook_resid_post``): ``L + 1`` names, matching the paper's "Layer 0..L" columns. Read
    from the model's ``hook_dict``, so it also serves TransformerLens models and bridges; for a
    :class:`~tfmatcomp.HookedEncoder` it equals ``[resid_name(l, L) for l in range(L + 1)]``.

    Example:
        >>> import tfmatcomp as tm
        >>> residual_stream_names(tm.HookedEncoder(tm.get_preset("tiny").model))
        ['blocks.0.hook_resid_pre', 'blocks.1.hook_resid_pre', 'blocks.1.hook_normalized_resid_post']
    """
    hook_dict = getattr(model, "hook_dict", None)
    if not hook_dict:
        raise ValueError(f"model: {type(model).__name__} has no TransformerLens hook_dict; pass "
                         "names= or modules= explicitly")
    pat = re.compile(r"^blocks\.(\d+)\.hook_resid_pre$")
    layers = sorted(int(m.group(1)) for n in hook_dict if (m := pat.match(n)))
    if not layers:
        raise ValueError("model: no blocks.{l}.hook_resid_pre hooks found; pass names= explicitly")
    names = [f"blocks.{l}.hook_resid_pre" for l in layers]
    last = layers[-1]
    for suffix in ("hook_normalized_resid_post", "hook_resid_post"):
        if f"blocks.{last}.{suffix}" in hook_dict:
            names.append(f"blocks.{last}.{suffix}")
            break
    return names


def check_layers(layers: Iterable[int] | None, n_layers: int) -> list[int]:
    """0-based block indices (all ``0..n_layers-1`` when None), each checked to be in range.

    Example:
        >>> check_layers(None, 3), check_layers([2], 3)
        ([0, 1, 2], [2])
    """
    if layers is None:
        return list(range(n_layers))
    out = [int(l) for l in layers]
    bad = [l for l in out if not 0 <= l < n_layers]
    if bad:
        raise ValueError(f"layers: 0-based layer indices must lie in [0, {n_layers - 1}], got {bad}")
    return out


def pattern_hook_names(model, layers: Sequence[int] | None = None) -> list[str]:
    """``blocks.{l}.attn.hook_pattern`` for the given 0-based layers (all when None).

    Example:
        >>> import tfmatcomp as tm
        >>> pattern_hook_names(tm.HookedEncoder(tm.get_preset("tiny").model), [1])
        ['blocks.1.attn.hook_pattern']
    """
    return [block_hook_name("attn.hook_pattern", l) for l in check_layers(layers, model.cfg.n_layers)]


def block_hook_name(name: str, layer: int | None = None) -> str:
    """A full hook name: ``name`` itself when ``layer`` is None, else ``blocks.{layer}.{name}``.

    A bare name without a dot gets the ``hook_`` prefix (``"resid_pre"`` -> ``"hook_resid_pre"``).

    Example:
        >>> block_hook_name("resid_pre", 1), block_hook_name("attn.hook_z", 0), block_hook_name("hook_readout")
        ('blocks.1.hook_resid_pre', 'blocks.0.attn.hook_z', 'hook_readout')
    """
    if layer is None:
        return name
    if not is_int(layer) or layer < 0:
        raise ValueError(f"layer: must be a non-negative integer, got {layer!r}")
    if name.startswith("blocks."):
        raise ValueError(f"name: give either a full hook name or a per-block name with layer=, "
                         f"got {name!r} and layer={layer}")
    if "." not in name and not name.startswith("hook_"):
        name = "hook_" + name
    return f"blocks.{layer}.{name}"


def resolve_hook_names(model, hooks: str | Iterable[str], layers: Iterable[int] | None = None) -> list[str]:
    """Full hook names of ``model`` for full or block-relative names.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder` (anything with ``hook_dict`` and ``cfg.n_layers``).
        hooks: one name or several; ``"attn.hook_z"`` expands to ``blocks.{l}.attn.hook_z``.
        layers: 0-based layers for block-relative names (default: all).

    Raises:
        ValueError: unknown names or layers out of range.

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_mlp=8, n_ctx=4))
        >>> resolve_hook_names(m, "attn.hook_z", layers=[1])
        ['blocks.1.attn.hook_z']
    """
    names = [hooks] if isinstance(hooks, str) else list(hooks)
    if not names:
        raise ValueError("hooks: give at least one hook name")
    layer_list = check_layers(layers, model.cfg.n_layers)
    out: list[str] = []
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"hooks: expected hook names (str), got {name!r}")
        if name in model.hook_dict:
            full = [name]
        elif f"blocks.0.{name}" in model.hook_dict:
            full = [f"blocks.{l}.{name}" for l in layer_list]
        else:
            raise ValueError(f"hooks: {name!r} is not a hook of this model, neither full "
                             f"(e.g. 'blocks.0.attn.hook_z') nor block-relative (e.g. 'attn.hook_z');"
                             " see model.hook_dict")
        out.extend(n for n in full if n not in out)
    return out


def embed_hook_name(model) -> str:
    """The token-embedding hook, the first hook point of a forward pass: ``embed.hook_embed``
    (encoder) or ``hook_embed`` (decoder, TransformerLens's HookedTransformer).

    Example:
        >>> import tfmatcomp as tm
        >>> embed_hook_name(tm.HookedEncoder(tm.get_preset("tiny").model))
        'embed.hook_embed'
        >>> embed_hook_name(tm.HookedDecoder(tm.get_preset("gpt-tiny").model))
        'hook_embed'
    """
    return "embed.hook_embed" if "embed.hook_embed" in model.hook_dict else "hook_embed"


def readout_hook_name(model) -> str | None:
    """The hook after the read-out, the last hook point (``hook_readout``), or None when the model
    has none (the decoder: nothing is hooked after its unembedding).

    Example:
        >>> import tfmatcomp as tm
        >>> readout_hook_name(tm.HookedDecoder(tm.get_preset("gpt-tiny").model)) is None
        True
    """
    return "hook_readout" if "hook_readout" in model.hook_dict else None


def pos_embed_param_name(model) -> str:
    """The positional-embedding table: ``embed.W_pos`` (encoder) or ``pos_embed.W_pos`` (decoder).

    Example:
        >>> import tfmatcomp as tm
        >>> pos_embed_param_name(tm.HookedDecoder(tm.get_preset("gpt-tiny").model))
        'pos_embed.W_pos'
    """
    names = dict(model.named_parameters())
    return "embed.W_pos" if "embed.W_pos" in names else "pos_embed.W_pos"


def is_causal(model) -> bool:
    """True when the model's attention is causal (a decoder): its patterns are zero above the
    diagonal.

    Example:
        >>> import tfmatcomp as tm
        >>> is_causal(tm.HookedEncoder(tm.get_preset("tiny").model))
        False
    """
    return any(getattr(b.attn, "causal", False) for b in model.blocks)
