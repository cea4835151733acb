"""Real masked-language encoders (BERT, RoBERTa, DistilBERT) as :class:`~tfmatcomp.HookedEncoder`.

One declarative table per architecture (:data:`ARCHITECTURES`), beside
:mod:`~tfmatcomp.models.conversion.hf_mapping` (the papers' BERT with a regression read-out): each
row names one of our parameters, the transformers parameter it comes from and the re-layout
between them (a name in :data:`RELAYOUTS`); each config row one :class:`~tfmatcomp.EncoderConfig`
field and the transformers config attribute it comes from. :func:`from_hf_model` reads the tables;
:func:`from_pretrained` loads a checkpoint with transformers' own loaders (a local directory, or a
Hub name found in the Hub cache as transformers finds it, ``HF_HUB_OFFLINE`` included: nothing here
downloads) and converts it.

* BERT (``BertForMaskedLM``, ``BertModel``): token types as in the checkpoint.
* RoBERTa (``RobertaForMaskedLM``, ``RobertaModel``): positions start at ``pad_token_id + 1``, so
  ``W_pos`` is the position table from that row on (``n_ctx`` two less than
  ``max_position_embeddings``: RoBERTa's position of a right-padded batch's real tokens); its one
  token type is kept (ids must be zero, as RoBERTa's tokenizer gives).
* DistilBERT (``DistilBertForMaskedLM``, ``DistilBertModel``): no token types, its own names.

Safe by default: weights come from safetensors; a checkpoint with only pickled weights
(``pytorch_model.bin``) is refused unless ``trust_pickle=True``.

Example:
    >>> rows = ARCHITECTURES["distilbert"].layer
    >>> rows[0]
    ('blocks.{l}.attn.W_Q', 'transformer.layer.{l}.attention.q_lin.weight', 'qkv_weight')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from tfmatcomp.config import EncoderConfig
from tfmatcomp.validation import check_bool

__all__ = ["EncoderArchitecture", "ARCHITECTURES", "RELAYOUTS", "SUPPORTED", "architecture_of",
           "state_dict_from_hf", "from_hf_model", "from_pretrained", "UnsupportedArchitectureError",
           "PickledWeightsError"]


class UnsupportedArchitectureError(ValueError):
    """A checkpoint whose architecture has no table here."""


class PickledWeightsError(ValueError):
    """A checkpoint holding only pickled weights, refused without ``trust_pickle=True``."""


#: How a transformers tensor becomes ours, given ``(tensor, n_heads, d_head, d_model)``.
RELAYOUTS: dict[str, Callable[[Tensor, int, int, int], Tensor]] = {
    "same": lambda t, h, e, d: t,
    "transpose": lambda t, h, e, d: t.T,
    # nn.Linear [h*e, d] (out, in) -> [h, d, e]; its bias [h*e] -> [h, e]
    "qkv_weight": lambda t, h, e, d: t.reshape(h, e, d).transpose(1, 2),
    "qkv_bias": lambda t, h, e, d: t.reshape(h, e),
    # nn.Linear [d, h*e] -> [h, e, d]
    "out_weight": lambda t, h, e, d: t.T.reshape(h, e, d),
}


@dataclass(frozen=True)
class EncoderArchitecture:
    """One architecture's table.

    Attributes:
        model_type: transformers' ``config.model_type``.
        classes: transformers class per head (``"masked_lm"``, ``"none"``).
        config: ``(EncoderConfig field, transformers config attribute)`` rows.
        embed, layer: ``(ours, theirs, relayout)`` rows of the encoder body, names relative to the
            base model (``model.base_model``); ``{l}`` stands for the layer.
        mlm: the masked-LM head's rows, names relative to the masked-LM model.
        token_types: the transformers config attribute giving the number of token types, or None
            (no token-type embedding).
        position_offset: the first row of the position table that position 0 uses (RoBERTa's
            ``pad_token_id + 1``), from the transformers config.
        head_act: the transformers config attribute naming the masked-LM head's activation
            (which must equal the body's), or None where the head always uses exact GELU.
    """

    model_type: str
    classes: dict[str, str]
    config: tuple[tuple[str, str], ...]
    embed: tuple[tuple[str, str, str], ...]
    layer: tuple[tuple[str, str, str], ...]
    mlm: tuple[tuple[str, str, str], ...]
    token_types: str | None
    position_offset: Callable[[Any], int]
    act: str
    head_act: str | None


def _bert_layer(prefix: str) -> tuple[tuple[str, str, str], ...]:
    """BERT's (and RoBERTa's, which copies it) layer rows under ``prefix`` (``encoder.layer.{l}``)."""
    rows = []
    for x, name in (("Q", "query"), ("K", "key"), ("V", "value")):
        rows += [(f"blocks.{{l}}.attn.W_{x}", f"{prefix}.attention.self.{name}.weight", "qkv_weight"),
                 (f"blocks.{{l}}.attn.b_{x}", f"{prefix}.attention.self.{name}.bias", "qkv_bias")]
    rows += [("blocks.{l}.attn.W_O", f"{prefix}.attention.output.dense.weight", "out_weight"),
             ("blocks.{l}.attn.b_O", f"{prefix}.attention.output.dense.bias", "same"),
             ("blocks.{l}.ln1.w", f"{prefix}.attention.output.LayerNorm.weight", "same"),
             ("blocks.{l}.ln1.b", f"{prefix}.attention.output.LayerNorm.bias", "same"),
             ("blocks.{l}.mlp.W_in", f"{prefix}.intermediate.dense.weight", "transpose"),
             ("blocks.{l}.mlp.b_in", f"{prefix}.intermediate.dense.bias", "same"),
             ("blocks.{l}.mlp.W_out", f"{prefix}.output.dense.weight", "transpose"),
             ("blocks.{l}.mlp.b_out", f"{prefix}.output.dense.bias", "same"),
             ("blocks.{l}.ln2.w", f"{prefix}.output.LayerNorm.weight", "same"),
             ("blocks.{l}.ln2.b", f"{prefix}.output.LayerNorm.bias", "same")]
    return tuple(rows)


_BERT_EMBED = (("embed.W_E", "embeddings.word_embeddings.weight", "same"),
               ("embed.W_pos", "embeddings.position_embeddings.weight", "same"),
               ("embed.W_token_type", "embeddings.token_type_embeddings.weight", "same"),
               ("embed.ln.w", "embeddings.LayerNorm.weight", "same"),
               ("embed.ln.b", "embeddings.LayerNorm.bias", "same"))
_BERT_CONFIG = (("n_layers", "num_hidden_layers"), ("n_heads", "num_attention_heads"),
                ("d_model", "hidden_size"), ("d_mlp", "intermediate_size"),
                ("n_ctx", "max_position_embeddings"), ("d_vocab", "vocab_size"),
                ("layer_norm_eps", "layer_norm_eps"), ("init_range", "initializer_range"),
                ("act_fn", "hidden_act"))


def _head_rows(dense: str, ln: str, decoder: str, bias: str) -> tuple[tuple[str, str, str], ...]:
    return (("mlm_head.W", f"{dense}.weight", "transpose"), ("mlm_head.b", f"{dense}.bias", "same"),
            ("mlm_head.ln.w", f"{ln}.weight", "same"), ("mlm_head.ln.b", f"{ln}.bias", "same"),
            ("unembed.W_U", f"{decoder}.weight", "transpose"), ("unembed.b_U", bias, "same"))


#: Every supported architecture, by transformers' ``model_type``.
ARCHITECTURES: dict[str, EncoderArchitecture] = {a.model_type: a for a in (
    EncoderArchitecture(
        model_type="bert",
        classes={"masked_lm": "BertForMaskedLM", "none": "BertModel"},
        config=_BERT_CONFIG,
        embed=_BERT_EMBED,
        layer=_bert_layer("encoder.layer.{l}"),
        mlm=_head_rows("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                       "cls.predictions.decoder", "cls.predictions.bias"),
        token_types="type_vocab_size",
        position_offset=lambda hf_cfg: 0,
        act="hidden_act",
        head_act="hidden_act",
    ),
    EncoderArchitecture(
        model_type="roberta",
        classes={"masked_lm": "RobertaForMaskedLM", "none": "RobertaModel"},
        config=_BERT_CONFIG,
        embed=_BERT_EMBED,
        layer=_bert_layer("encoder.layer.{l}"),
        mlm=_head_rows("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
        token_types="type_vocab_size",
        position_offset=lambda hf_cfg: hf_cfg.pad_token_id + 1,
        act="hidden_act",
        head_act=None,
    ),
    EncoderArchitecture(
        model_type="distilbert",
        classes={"masked_lm": "DistilBertForMaskedLM", "none": "DistilBertModel"},
        config=(("n_layers", "n_layers"), ("n_heads", "n_heads"), ("d_model", "dim"),
                ("d_mlp", "hidden_dim"), ("n_ctx", "max_position_embeddings"),
                ("d_vocab", "vocab_size"), ("init_range", "initializer_range"),
                ("act_fn", "activation")),
        embed=tuple(r for r in _BERT_EMBED if r[0] != "embed.W_token_type"),
        layer=(("blocks.{l}.attn.W_Q", "transformer.layer.{l}.attention.q_lin.weight", "qkv_weight"),
               ("blocks.{l}.attn.b_Q", "transformer.layer.{l}.attention.q_lin.bias", "qkv_bias"),
               ("blocks.{l}.attn.W_K", "transformer.layer.{l}.attention.k_lin.weight", "qkv_weight"),
               ("blocks.{l}.attn.b_K", "transformer.layer.{l}.attention.k_lin.bias", "qkv_bias"),
               ("blocks.{l}.attn.W_V", "transformer.layer.{l}.attention.v_lin.weight", "qkv_weight"),
               ("blocks.{l}.attn.b_V", "transformer.layer.{l}.attention.v_lin.bias", "qkv_bias"),
               ("blocks.{l}.attn.W_O", "transformer.layer.{l}.attention.out_lin.weight", "out_weight"),
               ("blocks.{l}.attn.b_O", "transformer.layer.{l}.attention.out_lin.bias", "same"),
               ("blocks.{l}.ln1.w", "transformer.layer.{l}.sa_layer_norm.weight", "same"),
               ("blocks.{l}.ln1.b", "transformer.layer.{l}.sa_layer_norm.bias", "same"),
               ("blocks.{l}.mlp.W_in", "transformer.layer.{l}.ffn.lin1.weight", "transpose"),
               ("blocks.{l}.mlp.b_in", "transformer.layer.{l}.ffn.lin1.bias", "same"),
               ("blocks.{l}.mlp.W_out", "transformer.layer.{l}.ffn.lin2.weight", "transpose"),
               ("blocks.{l}.mlp.b_out", "transformer.layer.{l}.ffn.lin2.bias", "same"),
               ("blocks.{l}.ln2.w", "transformer.layer.{l}.output_layer_norm.weight", "same"),
               ("blocks.{l}.ln2.b", "transformer.layer.{l}.output_layer_norm.bias", "same")),
        mlm=_head_rows("vocab_transform", "vocab_layer_norm", "vocab_projector",
                       "vocab_projector.bias"),
        token_types=None,
        position_offset=lambda hf_cfg: 0,
        act="activation",
        head_act="activation",
    ),
)}

#: The one line that names what is supported (in every refusal).
SUPPORTED = "; ".join(f"{a.model_type} ({', '.join(a.classes.values())})"
                      for a in ARCHITECTURES.values())
#: DistilBERT's LayerNorms, fixed in its code (its config has no eps).
_DISTILBERT_EPS = 1e-12


def architecture_of(hf_config: Any) -> EncoderArchitecture:
    """The table for a transformers config, or :class:`UnsupportedArchitectureError` in one line
    naming the supported ones.

    Example:
        >>> from transformers import GPT2Config
        >>> architecture_of(GPT2Config())
        Traceback (most recent call last):
        ...
        tfmatcomp.models.conversion.encoders.UnsupportedArchitectureError: name_or_path: model_type 'gpt2' is not supported; supported: bert (BertForMaskedLM, BertModel); roberta (RobertaForMaskedLM, RobertaModel); distilbert (DistilBertForMaskedLM, DistilBertModel)
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitectureError(f"name_or_path: model_type {model_type!r} is not "
                                           f"supported; supported: {SUPPORTED}")
    return ARCHITECTURES[model_type]


def config_from_hf(arch: EncoderArchitecture, hf_cfg: Any, head: str,
                   mask_token_id: int | None = None) -> EncoderConfig:
    """The :class:`EncoderConfig` of a transformers config under ``arch``'s table."""
    if getattr(hf_cfg, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"name_or_path: position_embedding_type "
                         f"{hf_cfg.position_embedding_type!r} is not supported (absolute only)")
    act = getattr(hf_cfg, arch.act)
    if act not in ("gelu", "gelu_new", "relu"):
        raise ValueError(f"name_or_path: activation {act!r} is not supported (allowed: gelu, "
                         "gelu_new, relu)")
    if head == "masked_lm" and arch.head_act is None and act != "gelu":
        raise ValueError(f"name_or_path: a {arch.model_type} masked-LM head uses exact GELU, the "
                         f"body {act!r}; only a gelu body is supported")
    kwargs = {ours: getattr(hf_cfg, theirs) for ours, theirs in arch.config}
    kwargs["n_ctx"] -= arch.position_offset(hf_cfg)
    kwargs.setdefault("layer_norm_eps", _DISTILBERT_EPS)
    kwargs.update(n_token_types=getattr(hf_cfg, arch.token_types) if arch.token_types else 0,
                  learned_mask_embedding=True, head=head,
                  mask_token_id=0 if mask_token_id is None else int(mask_token_id))
    return EncoderConfig(**kwargs)


def state_dict_from_hf(arch: EncoderArchitecture, cfg: EncoderConfig, hf_model: nn.Module
                       ) -> dict[str, Tensor]:
    """Our state dict from a transformers model, through ``arch``'s table (every row must find
    its tensor: a head asked for but absent from the checkpoint raises ``ValueError``)."""
    base = {k: v.detach() for k, v in hf_model.base_model.state_dict().items()}
    full = {k: v.detach() for k, v in hf_model.state_dict().items()}
    h, e, d = cfg.n_heads, cfg.d_head, cfg.d_model
    rows = [r for r in arch.embed if cfg.n_token_types or r[0] != "embed.W_token_type"]
    rows += [(o.format(l=l), t.format(l=l), how) for l in range(cfg.n_layers)
             for o, t, how in arch.layer]
    out: dict[str, Tensor] = {}
    for ours, theirs, how in rows:
        out[ours] = RELAYOUTS[how](base[theirs], h, e, d).contiguous()
    offset = out["embed.W_pos"].shape[0] - cfg.n_ctx  # RoBERTa's first positions are unused
    out["embed.W_pos"] = out["embed.W_pos"][offset:].contiguous()
    if cfg.head == "masked_lm":
        missing = [theirs for _, theirs, _ in arch.mlm if theirs not in full]
        if missing:
            raise ValueError(f"head: 'masked_lm' asked for, but the {type(hf_model).__name__} has "
                             f"no masked-LM head ({missing[0]} missing); use head='none'")
        for ours, theirs, how in arch.mlm:
            out[ours] = RELAYOUTS[how](full[theirs], h, e, d).contiguous()
    return out


def from_hf_model(cls: type, hf_model: nn.Module, head: str | None = None,
                  tokenizer: Any = None) -> Any:
    """``cls`` (:class:`~tfmatcomp.HookedEncoder`) holding the weights of an in-memory transformers
    BERT, RoBERTa or DistilBERT (``head`` defaults to ``"masked_lm"`` for a ``...ForMaskedLM``,
    else ``"none"``), with ``tokenizer`` attached; same dtype and device as ``hf_model``."""
    arch = architecture_of(getattr(hf_model, "config", None))
    has_head = type(hf_model).__name__ == arch.classes["masked_lm"]
    head = head if head is not None else ("masked_lm" if has_head else "none")
    if head not in ("masked_lm", "none"):
        raise ValueError(f"head: must be 'masked_lm' or 'none' (or None: from the checkpoint) for a "
                         f"pretrained encoder, got {head!r}")
    mask_id = getattr(tokenizer, "mask_token_id", None)
    cfg = config_from_hf(arch, hf_model.config, head, mask_id)
    weights = state_dict_from_hf(arch, cfg, hf_model)
    some = weights["embed.W_E"]
    model = cls.uninitialized(cfg).to(dtype=some.dtype)
    model.load_state_dict(weights, strict=True)
    model.tokenizer = tokenizer
    return model.to(some.device).eval()


def _local_weights(path: Path) -> tuple[bool, bool]:
    """``(has safetensors, has pickled weights)`` of a local checkpoint directory."""
    names = {p.name for p in path.iterdir()}
    safe = any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names)
    pickled = any(n.endswith(".bin") or n.endswith(".bin.index.json") for n in names)
    return safe, pickled


def from_pretrained(cls: type, name_or_path: Any, *, head: str | None = None,
                    trust_pickle: bool = False, dtype: torch.dtype = torch.float32,
                    device: torch.device | str | None = None, tokenizer: Any = "auto",
                    **hf_kwargs: Any) -> Any:
    """:meth:`tfmatcomp.HookedEncoder.from_pretrained`: a BERT, RoBERTa or DistilBERT checkpoint
    as a :class:`~tfmatcomp.HookedEncoder`.

    Args:
        name_or_path: a checkpoint directory, a Hub name that transformers finds offline (its
            cache; ``HF_HUB_OFFLINE=1`` as transformers honours it), or a transformers model
            already in memory. Nothing here downloads; transformers may, as it is configured.
        head: ``"masked_lm"`` (needs a checkpoint with the head: ``...ForMaskedLM``), ``"none"``,
            or None: the head the checkpoint has.
        trust_pickle: load pickled ``pytorch_model.bin`` weights (code can run while unpickling:
            only for checkpoints you trust). False: safetensors only, and a directory with only
            pickled weights is refused.
        dtype, device: where the model's weights go (float32 on CPU by default).
        tokenizer: ``"auto"``: the checkpoint's own (``AutoTokenizer``; None when it has none);
            a tokenizer; or None.
        hf_kwargs: passed to transformers' ``from_pretrained`` (e.g. ``local_files_only=True``,
            ``revision``).

    Raises:
        UnsupportedArchitectureError: the checkpoint is not one of :data:`SUPPORTED`.
        PickledWeightsError: only pickled weights and ``trust_pickle`` False.
    """
    import transformers

    check_bool("trust_pickle", trust_pickle)
    if head is not None and head not in ("masked_lm", "none"):
        raise ValueError(f"head: must be 'masked_lm', 'none' or None, got {head!r}")
    if isinstance(name_or_path, nn.Module):
        model = from_hf_model(cls, name_or_path, head,
                              None if isinstance(tokenizer, str) else tokenizer)
        return model.to(device=device, dtype=dtype)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"name_or_path: expected a directory, a Hub name or a transformers "
                        f"model, got {type(name_or_path).__name__}")
    path = Path(name_or_path)
    if path.is_dir():
        safe, pickled = _local_weights(path)
        if not safe and pickled and not trust_pickle:
            raise PickledWeightsError(
                f"name_or_path: {path} holds only pickled weights (pytorch_model.bin), which can "
                "run code when loaded; pass trust_pickle=True if you trust it, or convert it to "
                "safetensors")
    hf_config = transformers.AutoConfig.from_pretrained(name_or_path, **hf_kwargs)
    arch = architecture_of(hf_config)
    if head is None:
        head = ("masked_lm" if arch.classes["masked_lm"] in (hf_config.architectures or [])
                else "none")
    hf_class = getattr(transformers, arch.classes[head])
    hf_model, info = hf_class.from_pretrained(
        name_or_path, config=hf_config, use_safetensors=None if trust_pickle else True,
        output_loading_info=True, attn_implementation="eager", **hf_kwargs)
    missing = [k for k in info.get("missing_keys", ()) if "pooler" not in k]
    if missing:
        raise ValueError(f"name_or_path: the checkpoint lacks weights the {arch.classes[head]} needs "
                         f"({sorted(missing)[:3]}...): for a checkpoint without a masked-LM head "
                         "use head='none'")
    if isinstance(tokenizer, str) and tokenizer == "auto":
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path, **hf_kwargs)
        except (OSError, ValueError, TypeError):
            tokenizer = None
    model = from_hf_model(cls, hf_model, head, tokenizer)
    return model.to(device=device, dtype=dtype)
