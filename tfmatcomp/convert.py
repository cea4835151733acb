"""Conversion between :class:`HookedEncoder` and HuggingFace ``transformers.BertModel``.

The mapping is exact (a pure re-layout of the same numbers), so round trips are bit-identical and
outputs agree with ``BertModel`` (eager attention) to float rounding.

Example:
    >>> import torch
    >>> from transformers import BertConfig, BertModel
    >>> from tfmatcomp import HookedEncoder
    >>> bert = BertModel(BertConfig(vocab_size=2002, hidden_size=32, num_hidden_layers=2,
    ...     num_attention_heads=4, intermediate_size=64, max_position_embeddings=16,
    ...     type_vocab_size=1, pad_token_id=0, hidden_dropout_prob=0.0,
    ...     attention_probs_dropout_prob=0.0), add_pooling_layer=False)
    >>> model = HookedEncoder.from_hf(bert)
    >>> bert2, readout = model.to_hf()
    >>> model.cfg.n_layers, type(bert2).__name__
    (2, 'BertModel')
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tfmatcomp.config import EncoderConfig
from tfmatcomp.model import HookedEncoder

__all__ = ["from_hf", "to_hf", "config_from_hf", "config_to_hf"]


def _unwrap(bert: nn.Module) -> nn.Module:
    from transformers import BertModel

    if isinstance(bert, BertModel):
        return bert
    inner = getattr(bert, "bert", None)
    if isinstance(inner, BertModel):
        return inner
    raise TypeError(f"bert: expected a transformers BertModel or a model with a .bert BertModel, "
                    f"got {type(bert).__name__}")


def config_from_hf(hf_cfg: Any, token_types_used: bool = True, **overrides: Any) -> EncoderConfig:
    """The :class:`EncoderConfig` matching a ``transformers.BertConfig``."""
    if getattr(hf_cfg, "hidden_act", "gelu") not in ("gelu", "gelu_new", "relu"):
        raise ValueError(f"bert: hidden_act {hf_cfg.hidden_act!r} is not supported "
                         "(allowed: gelu, gelu_new, relu)")
    pad = hf_cfg.pad_token_id
    kwargs: dict[str, Any] = dict(
        n_layers=hf_cfg.num_hidden_layers,
        n_heads=hf_cfg.num_attention_heads,
        d_model=hf_cfg.hidden_size,
        d_mlp=hf_cfg.intermediate_size,
        n_ctx=hf_cfg.max_position_embeddings,
        d_vocab=hf_cfg.vocab_size,
        n_token_types=hf_cfg.type_vocab_size if token_types_used else 0,
        learned_mask_embedding=pad is None,
        mask_token_id=0 if pad is None else pad,
        layer_norm_eps=hf_cfg.layer_norm_eps,
        init_range=hf_cfg.initializer_range,
        act_fn=hf_cfg.hidden_act,
    )
    kwargs.update(overrides)
    return EncoderConfig(**kwargs)


def config_to_hf(cfg: EncoderConfig):
    """The ``transformers.BertConfig`` matching ``cfg`` (no dropout, eager attention)."""
    from transformers import BertConfig

    hf_cfg = BertConfig(
        vocab_size=cfg.d_vocab,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_mlp,
        hidden_act=cfg.act_fn,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=cfg.n_ctx,
        type_vocab_size=max(cfg.n_token_types, 1),
        initializer_range=cfg.init_range,
        layer_norm_eps=cfg.layer_norm_eps,
        pad_token_id=None if cfg.learned_mask_embedding else cfg.mask_token_id,
    )
    hf_cfg._attn_implementation = "eager"
    return hf_cfg


def _hf_state_dict_to_ours(sd: dict[str, torch.Tensor], cfg: EncoderConfig) -> dict[str, torch.Tensor]:
    h, e, d = cfg.n_heads, cfg.d_head, cfg.d_model
    out = {
        "embed.W_E": sd["embeddings.word_embeddings.weight"],
        "embed.W_pos": sd["embeddings.position_embeddings.weight"],
        "embed.ln.w": sd["embeddings.LayerNorm.weight"],
        "embed.ln.b": sd["embeddings.LayerNorm.bias"],
    }
    if cfg.n_token_types:
        out["embed.W_token_type"] = sd["embeddings.token_type_embeddings.weight"]
    for l in range(cfg.n_layers):
        p = f"encoder.layer.{l}."
        for ours, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
            w = sd[p + f"attention.self.{theirs}.weight"]  # [h*e, d] (out, in)
            out[f"blocks.{l}.attn.W_{ours}"] = w.reshape(h, e, d).transpose(1, 2)
            out[f"blocks.{l}.attn.b_{ours}"] = sd[p + f"attention.self.{theirs}.bias"].reshape(h, e)
        w_o = sd[p + "attention.output.dense.weight"]  # [d, h*e]
        out[f"blocks.{l}.attn.W_O"] = w_o.T.reshape(h, e, d)
        out[f"blocks.{l}.attn.b_O"] = sd[p + "attention.output.dense.bias"]
        out[f"blocks.{l}.ln1.w"] = sd[p + "attention.output.LayerNorm.weight"]
        out[f"blocks.{l}.ln1.b"] = sd[p + "attention.output.LayerNorm.bias"]
        out[f"blocks.{l}.mlp.W_in"] = sd[p + "intermediate.dense.weight"].T
        out[f"blocks.{l}.mlp.b_in"] = sd[p + "intermediate.dense.bias"]
        out[f"blocks.{l}.mlp.W_out"] = sd[p + "output.dense.weight"].T
        out[f"blocks.{l}.mlp.b_out"] = sd[p + "output.dense.bias"]
        out[f"blocks.{l}.ln2.w"] = sd[p + "output.LayerNorm.weight"]
        out[f"blocks.{l}.ln2.b"] = sd[p + "output.LayerNorm.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def _our_state_dict_to_hf(model: HookedEncoder) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    h, e, d = cfg.n_heads, cfg.d_head, cfg.d_model
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {
        "embeddings.word_embeddings.weight": sd["embed.W_E"],
        "embeddings.position_embeddings.weight": sd["embed.W_pos"],
        "embeddings.LayerNorm.weight": sd["embed.ln.w"],
        "embeddings.LayerNorm.bias": sd["embed.ln.b"],
        "embeddings.token_type_embeddings.weight": sd.get(
            "embed.W_token_type", torch.zeros(1, d, dtype=sd["embed.W_E"].dtype)),
    }
    for l in range(cfg.n_layers):
        p = f"encoder.layer.{l}."
        for ours, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
            out[p + f"attention.self.{theirs}.weight"] = (
                sd[f"blocks.{l}.attn.W_{ours}"].transpose(1, 2).reshape(h * e, d))
            out[p + f"attention.self.{theirs}.bias"] = sd[f"blocks.{l}.attn.b_{ours}"].reshape(h * e)
        out[p + "attention.output.dense.weight"] = sd[f"blocks.{l}.attn.W_O"].reshape(h * e, d).T
        out[p + "attention.output.dense.bias"] = sd[f"blocks.{l}.attn.b_O"]
        out[p + "attention.output.LayerNorm.weight"] = sd[f"blocks.{l}.ln1.w"]
        out[p + "attention.output.LayerNorm.bias"] = sd[f"blocks.{l}.ln1.b"]
        out[p + "intermediate.dense.weight"] = sd[f"blocks.{l}.mlp.W_in"].T
        out[p + "intermediate.dense.bias"] = sd[f"blocks.{l}.mlp.b_in"]
        out[p + "output.dense.weight"] = sd[f"blocks.{l}.mlp.W_out"].T
        out[p + "output.dense.bias"] = sd[f"blocks.{l}.mlp.b_out"]
        out[p + "output.LayerNorm.weight"] = sd[f"blocks.{l}.ln2.w"]
        out[p + "output.LayerNorm.bias"] = sd[f"blocks.{l}.ln2.b"]
    return {k: v.contiguous() for k, v in out.items()}


def from_hf(bert: nn.Module, readout: nn.Linear | None = None, **overrides: Any) -> HookedEncoder:
    """Build a :class:`HookedEncoder` holding the same weights as a transformers ``BertModel``.

    Args:
        bert: a ``BertModel``, or a model with a ``.bert`` attribute (e.g. ``BertForMaskedLM``;
            its heads are ignored). The pooler, if any, is ignored.
        readout: an ``nn.Linear(d_model, d_out)`` read-out; when None the model gets a freshly
            initialized read-out (seeded, see :class:`HookedEncoder`).
        overrides: :class:`EncoderConfig` fields to override (e.g. ``d_out``).

    Token-type embeddings are kept when the BERT has more than one type, or one type with non-zero
    weights; a single all-zero type row (as :func:`to_hf` writes) is dropped.
    """
    bert = _unwrap(bert)
    sd = {k: v.detach() for k, v in bert.state_dict().items()}
    tt = sd["embeddings.token_type_embeddings.weight"]
    token_types_used = tt.shape[0] > 1 or bool(tt.abs().max() > 0)
    if readout is not None:
        if not isinstance(readout, nn.Linear) or readout.in_features != bert.config.hidden_size:
            raise ValueError(f"readout: expected nn.Linear({bert.config.hidden_size}, d_out), "
                             f"got {readout!r}")
        overrides.setdefault("d_out", readout.out_features)
    cfg = config_from_hf(bert.config, token_types_used=token_types_used, **overrides)
    model = HookedEncoder(cfg)
    ours = _hf_state_dict_to_ours(sd, cfg)
    if readout is not None:
        ours["readout.W"] = readout.weight.detach().T.contiguous()
        ours["readout.b"] = (readout.bias.detach() if readout.bias is not None
                             else torch.zeros(readout.out_features))
    else:
        ours["readout.W"] = model.readout.W.detach()
        ours["readout.b"] = model.readout.b.detach()
    model.load_state_dict(ours, strict=True)
    return model.to(device=tt.device, dtype=tt.dtype)


def to_hf(model: HookedEncoder):
    """The equivalent ``(transformers.BertModel, nn.Linear)`` pair, eager attention, no dropout."""
    from transformers import BertModel

    hf_cfg = config_to_hf(model.cfg)
    bert = BertModel(hf_cfg, add_pooling_layer=False)
    bert.load_state_dict(_our_state_dict_to_hf(model), strict=True)
    readout = nn.Linear(model.cfg.d_model, model.cfg.d_out)
    with torch.no_grad():
        readout.weight.copy_(model.readout.W.detach().T)
        readout.bias.copy_(model.readout.b.detach())
    return bert.to(model.device, model.dtype).eval(), readout.to(model.device, model.dtype)
