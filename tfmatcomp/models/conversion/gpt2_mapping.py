"""The one table between HuggingFace ``transformers.GPT2LMHeadModel`` and
:class:`~tfmatcomp.HookedDecoder`, and the conversions in both directions.

GPT-2 keeps Q, K and V in one ``Conv1D`` (``c_attn``, weights stored ``[in, out]``); each of our
per-head matrices is a slice of it, so :func:`parameter_table` gives, for every parameter, the
HuggingFace tensor it lives in, the column slice, and the re-layout. The mapping is a pure
re-layout of the same numbers: round trips are bit-identical, and logits agree with
``GPT2LMHeadModel`` (eager attention) to float rounding.

This module knows the decoder only through its config and state dict (it does not import
:mod:`tfmatcomp.models.decoder`, which imports it for ``from_hf`` / ``to_hf``), so the two form no
import cycle.

GPT-2's language-model head has no bias: :func:`to_gpt2` refuses a model whose ``b_U`` is not
zero. An unembedding equal to ``W_E.T`` is written tied (GPT-2's default); any other is written
untied (``tie_word_embeddings=False``).

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> import tfmatcomp as tm
    >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_positions=8, n_embd=16, n_layer=1,
    ...                                   n_head=2, bos_token_id=None, eos_token_id=None))
    >>> model = tm.HookedDecoder.from_hf(gpt2)
    >>> model.cfg.d_head, type(model.to_hf()).__name__
    (8, 'GPT2LMHeadModel')
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from tfmatcomp.config import DecoderConfig
from tfmatcomp.models.hooked_base import HookedBase

__all__ = ["parameter_table", "CONFIG_FIELDS", "config_from_gpt2", "config_to_gpt2",
           "build_from_gpt2", "to_gpt2"]

Relayout = Callable[[Tensor], Tensor]

#: DecoderConfig field -> GPT2Config field, for the fields that map one to one.
CONFIG_FIELDS: dict[str, str] = {
    "n_layers": "n_layer", "n_heads": "n_head", "d_model": "n_embd", "n_ctx": "n_positions",
    "d_vocab": "vocab_size", "layer_norm_eps": "layer_norm_epsilon",
    "init_range": "initializer_range", "act_fn": "activation_function",
}


def parameter_table(cfg: DecoderConfig) -> list[tuple[str, str, slice | None, Relayout, Relayout]]:
    """``(our name, HuggingFace name, column slice of the HF tensor or None, HF -> ours,
    ours -> HF)`` for every parameter of :class:`~tfmatcomp.HookedDecoder`.

    Example:
        >>> rows = parameter_table(DecoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16))
        >>> [(ours, theirs, cols) for ours, theirs, cols, _, _ in rows][4]
        ('blocks.0.attn.W_Q', 'transformer.h.0.attn.c_attn.weight', slice(0, 8, None))
    """
    h, e, d = cfg.n_heads, cfg.d_head, cfg.d_model
    same: Relayout = lambda t: t  # noqa: E731
    T: Relayout = lambda t: t.T  # noqa: E731
    rows = [("embed.W_E", "transformer.wte.weight", None, same, same),
            ("pos_embed.W_pos", "transformer.wpe.weight", None, same, same)]
    layer = [("ln1.w", "ln_1.weight", None, same, same), ("ln1.b", "ln_1.bias", None, same, same)]
    for i, x in enumerate("QKV"):
        cols = slice(i * d, (i + 1) * d)
        layer += [  # Conv1D [d, h*e] (in, out) <-> ours [h, d, e]; bias [h*e] <-> [h, e]
            (f"attn.W_{x}", "attn.c_attn.weight", cols,
             lambda w: w.reshape(d, h, e).transpose(0, 1), lambda w: w.transpose(0, 1).reshape(d, h * e)),
            (f"attn.b_{x}", "attn.c_attn.bias", cols,
             lambda b: b.reshape(h, e), lambda b: b.reshape(h * e))]
    layer += [("attn.W_O", "attn.c_proj.weight", None,        # [h*e, d] <-> ours [h, e, d]
               lambda w: w.reshape(h, e, d), lambda w: w.reshape(h * e, d)),
              ("attn.b_O", "attn.c_proj.bias", None, same, same),
              ("ln2.w", "ln_2.weight", None, same, same), ("ln2.b", "ln_2.bias", None, same, same),
              ("mlp.W_in", "mlp.c_fc.weight", None, same, same),  # Conv1D is already [in, out]
              ("mlp.b_in", "mlp.c_fc.bias", None, same, same),
              ("mlp.W_out", "mlp.c_proj.weight", None, same, same),
              ("mlp.b_out", "mlp.c_proj.bias", None, same, same)]
    rows += [(f"blocks.{l}.{ours}", f"transformer.h.{l}.{theirs}", cols, to_ours, to_hf)
             for l in range(cfg.n_layers) for ours, theirs, cols, to_ours, to_hf in layer]
    rows += [("ln_final.w", "transformer.ln_f.weight", None, same, same),
             ("ln_final.b", "transformer.ln_f.bias", None, same, same),
             ("unembed.W_U", "lm_head.weight", None, T, T)]
    return rows


def config_from_gpt2(hf_cfg: Any, **overrides: Any) -> DecoderConfig:
    """The :class:`DecoderConfig` matching a ``transformers.GPT2Config``.

    Raises:
        ValueError: for GPT-2 options this decoder does not implement (an activation other than
            gelu / gelu_new / relu, scaled-by-layer or unscaled attention).
    """
    if getattr(hf_cfg, "activation_function", "gelu_new") not in ("gelu", "gelu_new", "relu"):
        raise ValueError(f"gpt2: activation_function {hf_cfg.activation_function!r} is not "
                         "supported (allowed: gelu, gelu_new, relu)")
    if not getattr(hf_cfg, "scale_attn_weights", True) or getattr(
            hf_cfg, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("gpt2: only attention scaled by 1/sqrt(d_head) is supported "
                         "(scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False)")
    kwargs: dict[str, Any] = {ours: getattr(hf_cfg, theirs) for ours, theirs in CONFIG_FIELDS.items()}
    kwargs["d_mlp"] = hf_cfg.n_inner or 4 * hf_cfg.n_embd
    kwargs.update(overrides)
    return DecoderConfig(**kwargs)


def config_to_gpt2(cfg: DecoderConfig, tied: bool = True):
    """The ``transformers.GPT2Config`` matching ``cfg`` (no dropout, eager attention).

    Raises:
        ValueError: when ``d_head * n_heads != d_model`` (GPT-2 derives ``d_head``).
    """
    from transformers import GPT2Config

    if cfg.d_head * cfg.n_heads != cfg.d_model:
        raise ValueError(f"model: d_head {cfg.d_head} x n_heads {cfg.n_heads} != d_model "
                         f"{cfg.d_model}; GPT-2 needs d_head = d_model / n_heads")
    hf_cfg = GPT2Config(**{theirs: getattr(cfg, ours) for ours, theirs in CONFIG_FIELDS.items()},
                        n_inner=cfg.d_mlp, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=None, eos_token_id=None, tie_word_embeddings=tied)
    hf_cfg._attn_implementation = "eager"
    return hf_cfg


def _unwrap(gpt2: nn.Module) -> tuple[nn.Module, Tensor | None]:
    """``(GPT2Model, lm_head weight or None)`` of a GPT2LMHeadModel or a GPT2Model."""
    from transformers import GPT2LMHeadModel, GPT2Model

    if isinstance(gpt2, GPT2LMHeadModel):
        return gpt2.transformer, gpt2.lm_head.weight
    if isinstance(gpt2, GPT2Model):
        return gpt2, None
    raise TypeError(f"gpt2: expected a transformers GPT2LMHeadModel or GPT2Model, got "
                    f"{type(gpt2).__name__}")


def build_from_gpt2(cls: type[HookedBase], gpt2: nn.Module, **overrides: Any) -> HookedBase:
    """A ``cls`` holding the weights of ``gpt2``.

    Args:
        cls: the model class to build, :class:`~tfmatcomp.HookedDecoder` (a class whose config is a
            :class:`DecoderConfig` and whose parameters are those of :func:`parameter_table`).
        gpt2: a ``GPT2LMHeadModel``, or a ``GPT2Model`` (then the unembedding is ``W_E.T``, tied).
        overrides: :class:`DecoderConfig` fields to override.
    """
    body, head = _unwrap(gpt2)
    sd = {f"transformer.{k}": v.detach() for k, v in body.state_dict().items()}
    sd["lm_head.weight"] = (head if head is not None else sd["transformer.wte.weight"]).detach()
    cfg = config_from_gpt2(body.config, **overrides)
    model = cls(cfg)
    ours = {}
    for name, theirs, cols, to_ours, _ in parameter_table(cfg):
        t = sd[theirs]
        ours[name] = to_ours(t[..., cols] if cols is not None else t).contiguous()
    ours["unembed.b_U"] = torch.zeros(cfg.d_vocab, dtype=ours["unembed.W_U"].dtype)
    model.load_state_dict(ours, strict=True)
    return model.to(device=sd["lm_head.weight"].device, dtype=sd["lm_head.weight"].dtype)


def to_gpt2(model: HookedBase):
    """The equivalent ``transformers.GPT2LMHeadModel`` (eager attention, no dropout, eval mode).

    Raises:
        ValueError: when the model's ``b_U`` is not zero (GPT-2's head has no bias).
    """
    from transformers import GPT2LMHeadModel

    sd = {k: v.detach() for k, v in model.state_dict().items()}
    if sd["unembed.b_U"].any():
        raise ValueError("model: b_U is not zero; GPT2LMHeadModel's lm_head has no bias, so this "
                         "model has no exact GPT-2 equivalent")
    tied = torch.equal(sd["unembed.W_U"], sd["embed.W_E"].T)
    out: dict[str, Tensor] = {}
    for name, theirs, cols, _, to_hf in parameter_table(model.cfg):
        t = to_hf(sd[name])
        if cols is None:
            out[theirs] = t.contiguous()
        else:  # Q, K, V slices of c_attn, in column order
            out[theirs] = t if theirs not in out else torch.cat([out[theirs], t], dim=-1)
    gpt2 = GPT2LMHeadModel(config_to_gpt2(model.cfg, tied=tied))
    gpt2.load_state_dict({k: v.contiguous() for k, v in out.items()}, strict=True)
    return gpt2.to(model.device, model.dtype).eval()
