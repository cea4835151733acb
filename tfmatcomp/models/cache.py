"""EncoderActivationCache: TransformerLens's ActivationCache, honest about a post-LN encoder.

``HookedEncoder.run_with_cache`` returns this subclass of ``transformer_lens.ActivationCache``.
Everything TransformerLens's cache does that holds for this model works unchanged (tested against
a recomputation): short names (``cache["pattern", 1]``, ``cache["scale", 0, "ln1"]``,
``cache["embed"]``), ``stack_activation``, ``compute_head_results``, ``stack_head_results``,
``get_neuron_results``, ``stack_neuron_results``, batch slicing and the dict interface.

The helpers that decompose one residual stream into a *sum* of every earlier component assume a
pre-LN decoder, where each sub-layer adds into one stream that is normalized only on the way into
the next sub-layer. In this post-LN BERT encoder each block re-normalizes the stream twice
(``LN1`` after the attention, ``LN2`` after the MLP), so earlier components are not summands of
later streams. Those helpers (``accumulated_resid``, ``decompose_resid``,
``get_full_resid_decomposition``, ``logit_attrs``, ``logit_lens``, and ``incl_remainder`` /
``apply_ln`` of the stacking helpers) raise :class:`PostLNError` naming the method, the reason and
what to use instead. ``apply_ln_to_stack`` works where a LayerNorm normalizes the stack's sum:
the MLP input of a block (``mlp_input=True``, ``ln1``) and the read-out input (``layer=n_layers``,
the last block's ``ln2``).

The pre-LN :class:`~tfmatcomp.HookedDecoder` needs no subclass: its ``run_with_cache`` returns
TransformerLens's own ``ActivationCache``, on which all of those helpers hold and run unchanged.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.models.cache import PostLNError
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> _, cache = model.run_with_cache(torch.ones(2, 16, dtype=torch.long))
    >>> cache["pattern", 1].shape, cache.stack_activation("resid_pre").shape[0]
    (torch.Size([2, 4, 16, 16]), 2)
    >>> try:
    ...     cache.accumulated_resid()
    ... except PostLNError as err:
    ...     print(str(err)[:49])
    accumulated_resid: not defined for this post-LN e
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from transformer_lens import ActivationCache
from transformer_lens.utilities import Slice, get_act_name

__all__ = ["EncoderActivationCache", "PostLNError"]

# TransformerLens's names for the embedding hooks (decoders hook them at the top level).
_ALIASES = {
    "hook_embed": "embed.hook_embed",
    "hook_pos_embed": "embed.hook_pos_embed",
    "hook_token_type_embed": "embed.hook_token_type_embed",
}

_POST_LN = ("each block re-normalizes the residual stream twice (LN1 after the attention, LN2 "
            "after the MLP), so the outputs of earlier sub-layers are not summands of later streams")


class PostLNError(NotImplementedError):
    """An ActivationCache helper (or option) whose pre-LN arithmetic does not hold for this encoder."""


def _refuse(method: str, why: str, instead: str) -> PostLNError:
    return PostLNError(f"{method}: not defined for this post-LN encoder: {why}. {instead}")


class EncoderActivationCache(ActivationCache):
    """``transformer_lens.ActivationCache`` for :class:`~tfmatcomp.models.encoder.HookedEncoder`.

    Args:
        cache_dict: ``{hook name: tensor}`` from a forward pass.
        model: the HookedEncoder that produced it.
        has_batch_dim: whether the tensors keep their batch axis.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
        >>> _, cache = model.run_with_cache(torch.ones(2, 16, dtype=torch.long))
        >>> type(cache).__name__, torch.equal(cache["q", 0], cache["blocks.0.attn.hook_q"])
        ('EncoderActivationCache', True)
    """

    def __init__(self, cache_dict: dict[str, torch.Tensor], model: Any, has_batch_dim: bool = True):
        super().__init__(cache_dict, model, has_batch_dim=has_batch_dim)
        self.has_embed = _ALIASES["hook_embed"] in cache_dict
        self.has_pos_embed = _ALIASES["hook_pos_embed"] in cache_dict

    # ------------------------------------------------------------ access
    def __getitem__(self, key: Any) -> torch.Tensor:
        """A cached tensor by full hook name or TransformerLens short name (TransformerLens's ``get_act_name``):
        ``cache["resid_pre", 1]``, ``cache["scale", 0, "ln2"]``, ``cache["pattern", -1]``; ``"embed"``
        and ``"pos_embed"`` name ``embed.hook_embed`` / ``embed.hook_pos_embed``."""
        if isinstance(key, str):
            name = key if key in self.cache_dict else get_act_name(key)
        else:
            key = tuple(key)
            if len(key) > 1 and key[1] is not None and key[1] < 0:
                key = (key[0], self.model.cfg.n_layers + key[1], *key[2:])
            name = get_act_name(*key)
        name = _ALIASES.get(name, name)
        if name not in self.cache_dict:
            hint = (" (this encoder has no ln_final: its last LayerNorm is blocks.{L-1}.ln2)"
                    if name.startswith("ln_final.") else
                    " (per-head results are computed after model.set_use_attn_result(True); "
                    "cache.stack_head_results() computes them from hook_z without it)"
                    if name.endswith("attn.hook_result") else "")
            raise KeyError(f"{key!r} -> {name!r} is not in this cache{hint}; cached names: "
                           f"cache.keys(), every hook: model.hook_dict")
        return self.cache_dict[name]

    def apply_slice_to_batch_dim(self, batch_slice: Any) -> "EncoderActivationCache":
        """TransformerLens's batch slicing, returning this class (so the checks below still apply)."""
        sliced = super().apply_slice_to_batch_dim(batch_slice)
        return type(self)(sliced.cache_dict, self.model, has_batch_dim=sliced.has_batch_dim)

    # ------------------------------------------- stacks of sub-layer outputs
    def stack_head_results(self, layer: int = -1, return_labels: bool = False,
                           incl_remainder: bool = False, pos_slice: Any = None,
                           apply_ln: bool = False):
        """Each head's output into its own layer's ``resid_mid`` (``z @ W_O``, without ``b_O``),
        stacked over the layers before ``layer``: ``[layer * n_heads, batch, pos, d_model]``.

        ``incl_remainder`` and ``apply_ln`` raise :class:`PostLNError`: heads of different layers
        write into different, separately normalized streams, so there is no one stream they sum to.
        """
        if incl_remainder or apply_ln:
            option = "incl_remainder" if incl_remainder else "apply_ln"
            raise _refuse(f"stack_head_results({option}=True)", _POST_LN,
                          "The per-head outputs (without that option) are exact; use "
                          "apply_ln_to_stack(stack, layer=l, mlp_input=True) on the components "
                          "of one layer's resid_mid.")
        return super().stack_head_results(layer, return_labels=return_labels, pos_slice=pos_slice)

    def stack_neuron_results(self, layer: int, pos_slice: Any = None, neuron_slice: Any = None,
                             return_labels: bool = False, incl_remainder: bool = False,
                             apply_ln: bool = False, project_output_onto: torch.Tensor | None = None,
                             mlp_input: bool = False):
        """Each neuron's output into its own layer's ``resid_post`` (``post * W_out``, without
        ``b_out``), stacked over the layers before ``layer``. ``incl_remainder`` and ``apply_ln``
        raise :class:`PostLNError` (as for :meth:`stack_head_results`)."""
        if incl_remainder or apply_ln:
            option = "incl_remainder" if incl_remainder else "apply_ln"
            raise _refuse(f"stack_neuron_results({option}=True)", _POST_LN,
                          "The per-neuron outputs (without that option) are exact.")
        return super().stack_neuron_results(layer, pos_slice=pos_slice, neuron_slice=neuron_slice,
                                            return_labels=return_labels,
                                            project_output_onto=project_output_onto)

    # --------------------------------------------------------- LayerNorm
    def apply_ln_to_stack(
        self,
        residual_stack: Float[torch.Tensor, "num_components *batch_and_pos_dims d_model"],
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: Any = None,
        batch_slice: Any = None,
        has_batch_dim: bool = True,
        recompute_ln: bool = False,
    ) -> Float[torch.Tensor, "num_components *batch_and_pos_dims d_model"]:
        """Center each component and divide it by the cached scale of the LayerNorm its sum goes
        through, so the components add up to that LayerNorm's ``(x - mean) / scale`` (before its
        ``w`` and ``b``), as TransformerLens's ``apply_ln_to_stack`` does.

        In this post-LN block the MLP reads ``ln1(resid_mid)``: ``layer=l, mlp_input=True`` uses
        ``blocks.{l}.ln1.hook_scale`` (a stack summing to ``resid_mid``). The read-out reads the last
        block's ``ln2(resid_post)``: ``layer=n_layers`` (or None, -1) uses
        ``blocks.{n_layers-1}.ln2.hook_scale``. The attention of block ``l`` reads ``resid_pre``,
        which no LayerNorm of that block normalizes, so ``mlp_input=False`` with ``layer < n_layers``
        raises :class:`PostLNError`, as does ``recompute_ln`` (there is no ``ln_final``).
        """
        n_layers = self.model.cfg.n_layers
        layer = n_layers if layer is None or layer == -1 else layer
        if recompute_ln:
            raise _refuse("apply_ln_to_stack(recompute_ln=True)", "there is no ln_final to "
                          "recompute (the last LayerNorm is blocks.{L-1}.ln2, inside the block)",
                          "Use the cached scale (recompute_ln=False).")
        if not (isinstance(layer, int) and 0 <= layer <= n_layers):
            raise ValueError(f"layer: expected an int in [0, {n_layers}] (or None / -1 for the "
                             f"read-out input), got {layer!r}")
        if layer == n_layers:
            if mlp_input:
                raise ValueError(f"mlp_input: must be False for layer={n_layers} (the read-out input)")
            key = f"blocks.{n_layers - 1}.ln2.hook_scale"
        elif mlp_input:
            key = f"blocks.{layer}.ln1.hook_scale"
        else:
            raise _refuse(f"apply_ln_to_stack(layer={layer}, mlp_input=False)",
                          "the attention of a post-LN block reads resid_pre, the previous "
                          "LayerNorm's output, and no LayerNorm sits between them",
                          "Use mlp_input=True (ln1 normalizes resid_mid for the MLP) or "
                          f"layer={n_layers} (the last ln2, before the read-out).")
        pos_slice = pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)
        batch_slice = batch_slice if isinstance(batch_slice, Slice) else Slice(batch_slice)
        if has_batch_dim:
            residual_stack = batch_slice.apply(residual_stack, dim=1)
        scale = pos_slice.apply(self[key], dim=-2)
        if self.has_batch_dim:
            scale = batch_slice.apply(scale)
        return (residual_stack - residual_stack.mean(dim=-1, keepdim=True)) / scale

    # ----------------------------------------- pre-LN decompositions: refused
    def accumulated_resid(self, *args: Any, **kwargs: Any):
        """Raises :class:`PostLNError`: the streams of a post-LN encoder are not accumulated sums."""
        raise _refuse("accumulated_resid", _POST_LN + "; the stream each block reads is already "
                      "normalized, and the read-out reads blocks.{L-1}.hook_normalized_resid_post, "
                      "not the last resid_post", "Use cache.stack_activation('resid_pre') (the input "
                      "of every block) or tfmatcomp.models.hook_names.resid_name for h^(l).")

    def decompose_resid(self, *args: Any, **kwargs: Any):
        """Raises :class:`PostLNError`: embeddings and earlier sub-layer outputs do not sum to a
        later stream here."""
        raise _refuse("decompose_resid", _POST_LN + "; embed + attn_out + mlp_out is therefore "
                      "not any later stream", "Decompose one step at a time: resid_mid = resid_pre + "
                      "attn_out, resid_post = ln1(resid_mid) + mlp_out; or use "
                      "tfmatcomp.decomposition (mean / position / context / residual).")

    def get_full_resid_decomposition(self, *args: Any, **kwargs: Any):
        """Raises :class:`PostLNError` (a sum over every head, neuron, embedding and bias)."""
        raise _refuse("get_full_resid_decomposition", _POST_LN + "; heads, neurons, embeddings and "
                      "accumulated biases therefore do not sum to the stream", "Use stack_head_results / "
                      "stack_neuron_results for one layer's own sub-layer outputs.")

    def logit_attrs(self, *args: Any, **kwargs: Any):
        """Raises :class:`PostLNError`: no vocabulary read-out and no pre-LN decomposition."""
        raise _refuse("logit_attrs", "the read-out is a real-valued linear head (model.readout, no "
                      "W_U over a vocabulary), and " + _POST_LN, "Project a stack onto "
                      "model.readout.W after apply_ln_to_stack(stack, layer=n_layers) (times the "
                      "last ln2's w) for direct attributions within the last block.")

    def logit_lens(self, *args: Any, **kwargs: Any):
        """Raises :class:`PostLNError`: no ln_final, no unembedding."""
        raise _refuse("logit_lens", "there is no ln_final and no W_U (the read-out is a "
                      "real-valued linear head), and " + _POST_LN, "Every block's input is already "
                      "normalized: model.readout(cache['resid_pre', l]) reads it out directly.")
