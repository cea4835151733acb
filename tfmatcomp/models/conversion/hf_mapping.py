"""The one table between HuggingFace ``transformers.BertModel`` and :class:`~tfmatcomp.HookedEncoder`.

Each parameter appears once in :func:`parameter_table`, with its HuggingFace name and the re-layout
in both directions, and each config field once in :data:`CONFIG_FIELDS`; the conversions in both
directions (:func:`config_from_hf`, :func:`config_to_hf`, :func:`build_from_hf`, :func:`to_hf`)
read them.
This module does not import the model, not even for type annotations (the model's ``from_hf`` /
``to_hf`` use it, and :mod:`tfmatcomp.models.conversion.bert` gives the public functions), so there
is no import cycle: the model is any ``nn.Module`` built from an :class:`~tfmatcomp.EncoderConfig`.

Example:
    >>> import tfmatcomp as tm
    >>> rows = parameter_table(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
    >>> [(ours, theirs) for ours, theirs, _, _ in rows][4]
    ('blocks.0.attn.W_Q', 'encoder.layer.0.attention.self.query.weight')
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch
from torch import Tensor, nn

from tfmatcomp.config import EncoderConfig

#: The model class built by :func:`build_from_hf` (a :class:`~tfmatcomp.HookedEncoder`).
Model = TypeVar("Model", bound=nn.Module)

__all__ = ["parameter_table", "CONFIG_FIELDS", "config_from_hf", "config_to_hf", "build_from_hf", "to_hf"]

Relayout = Callable[[Tensor], Tensor]
_same: Relayout = lambda t: t  # noqa: E731
_T: Relayout = lambda t: t.T  # noqa: E731


def parameter_table(cfg: EncoderConfig) -> list[tuple[str, str, Relayout, Relayout]]:
    """``(our name, HuggingFace name, HF -> ours, ours -> HF)`` for every parameter but the
    read-out (which lives outside ``BertModel``); ``embed.W_token_type`` only when ``cfg`` has
    token types."""
    h, e, d = cfg.n_heads, cfg.d_head, cfg.d_model
    rows = [("embed.W_E", "embeddings.word_embeddings.weight", _same, _same),
            ("embed.W_pos", "embeddings.position_embeddings.weight", _same, _same),
            ("embed.ln.w", "embeddings.LayerNorm.weight", _same, _same),
            ("embed.ln.b", "embeddings.LayerNorm.bias", _same, _same)]
    if cfg.n_token_types:
        rows.append(("embed.W_token_type", "embeddings.token_type_embeddings.weight", _same, _same))
    layer = [(f"attn.{W}_{x}", f"attention.self.{name}.{kind}", to_ours, to_hf)
             for W, kind, to_ours, to_hf in (
                 # weights: HF [h*e, d] (out, in) <-> ours [h, d, e]; biases [h*e] <-> [h, e]
                 ("W", "weight", lambda w: w.reshape(h, e, d).transpose(1, 2),
                  lambda w: w.transpose(1, 2).reshape(h * e, d)),
                 ("b", "bias", lambda b: b.reshape(h, e), lambda b: b.reshape(h * e)))
             for x, name in (("Q", "query"), ("K", "key"), ("V", "value"))]
    layer += [("attn.W_O", "attention.output.dense.weight",       # HF [d, h*e] <-> ours [h, e, d]
               lambda w: w.T.reshape(h, e, d), lambda w: w.reshape(h * e, d).T),
              ("attn.b_O", "attention.output.dense.bias", _same, _same),
              ("ln1.w", "attention.output.LayerNorm.weight", _same, _same),
              ("ln1.b", "attention.output.LayerNorm.bias", _same, _same),
              ("mlp.W_in", "intermediate.dense.weight", _T, _T),
              ("mlp.b_in", "intermediate.dense.bias", _same, _same),
              ("mlp.W_out", "output.dense.weight", _T, _T),
              ("mlp.b_out", "output.dense.bias", _same, _same),
              ("ln2.w", "output.LayerNorm.weight", _same, _same),
              ("ln2.b", "output.LayerNorm.bias", _same, _same)]
    rows += [(f"blocks.{l}.{ours}", f"encoder.layer.{l}.{theirs}", to_ours, to_hf)
             for l in range(cfg.n_layers) for ours, theirs, to_ours, to_hf in layer]
    return rows


def _unwrap(bert: nn.Module) -> nn.Module:
    from transformers import BertModel

    if isinstance(bert, BertModel):
        return bert
    inner = getattr(bert, "bert", None)
    if isinstance(inner, BertModel):
        return inner
    raise TypeError(f"bert: expected a transformers BertModel or a model with a .bert BertModel, "
                    f"got {type(bert).__name__}")


#: EncoderConfig field -> BertConfig field, for the fields that map one to one.
CONFIG_FIELDS: dict[str, str] = {
    "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "d_model": "hidden_size",
    "d_mlp": "intermediate_size", "n_ctx": "max_position_embeddings", "d_vocab": "vocab_size",
    "layer_norm_eps": "layer_norm_eps", "init_range": "initializer_range", "act_fn": "hidden_act",
}


def config_from_hf(hf_cfg: Any, token_types_used: bool = True, **overrides: Any) -> EncoderConfig:
    """The :class:`EncoderConfig` matching a ``transformers.BertConfig``."""
    if getattr(hf_cfg, "hidden_act", "gelu") not in ("gelu", "gelu_new", "relu"):
        raise ValueError(f"bert: hidden_act {hf_cfg.hidden_act!r} is not supported "
                         "(allowed: gelu, gelu_new, relu)")
    pad = hf_cfg.pad_token_id
    kwargs: dict[str, Any] = {ours: getattr(hf_cfg, theirs) for ours, theirs in CONFIG_FIELDS.items()}
    kwargs.update(n_token_types=hf_cfg.type_vocab_size if token_types_used else 0,
                  learned_mask_embedding=pad is None, mask_token_id=0 if pad is None else pad)
    kwargs.update(overrides)
    return EncoderConfig(**kwargs)


def config_to_hf(cfg: EncoderConfig):
    """The ``transformers.BertConfig`` matching ``cfg`` (no dropout, eager attention)."""
    from transformers import BertConfig

    hf_cfg = BertConfig(
        **{theirs: getattr(cfg, ours) for ours, theirs in CONFIG_FIELDS.items()},
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        type_vocab_size=max(cfg.n_token_types, 1),
        pad_token_id=None if cfg.learned_mask_embedding else cfg.mask_token_id,
    )
    hf_cfg._attn_implementation = "eager"
    return hf_cfg


def _hf_state_dict_to_ours(sd: dict[str, Tensor], cfg: EncoderConfig) -> dict[str, Tensor]:
    return {ours: to_ours(sd[theirs]).contiguous()
            for ours, theirs, to_ours, _ in parameter_table(cfg)}


def _our_state_dict_to_hf(model: nn.Module) -> dict[str, Tensor]:
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {theirs: to_hf(sd[ours]).contiguous()
           for ours, theirs, _, to_hf in parameter_table(model.cfg)}
    out.setdefault("embeddings.token_type_embeddings.weight",   # BertModel always has one type
                   torch.zeros(1, model.cfg.d_model, dtype=sd["embed.W_E"].dtype))
    return out


def build_from_hf(cls: Callable[[EncoderConfig], Model], bert: nn.Module,
                  readout: nn.Linear | None = None, **overrides: Any) -> Model:
    """:func:`tfmatcomp.models.conversion.bert.from_hf`, building a ``cls`` (:class:`~tfmatcomp.HookedEncoder`).

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
    model = cls(cfg).to(dtype=tt.dtype)  # load float64 weights without rounding them to float32
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


def to_hf(model: nn.Module):
    """``model`` (a :class:`~tfmatcomp.HookedEncoder`): the equivalent ``(transformers.BertModel, nn.Linear)`` pair, eager attention, no dropout."""
    from transformers import BertModel

    hf_cfg = config_to_hf(model.cfg)
    bert = BertModel(hf_cfg, add_pooling_layer=False)
    bert.load_state_dict(_our_state_dict_to_hf(model), strict=True)
    readout = nn.Linear(model.cfg.d_model, model.cfg.d_out)
    with torch.no_grad():
        readout.weight.copy_(model.readout.W.detach().T)
        readout.bias.copy_(model.readout.b.detach())
    return bert.to(model.device, model.dtype).eval(), readout.to(model.device, model.dtype)
