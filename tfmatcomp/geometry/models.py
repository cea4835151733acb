"""Local transformers models seen the way seed 003 measures them: residual stream, attention input, QK.

:func:`load_geometry_model` reads a local transformers directory (``config.json`` + weights +
tokenizer; nothing downloads) and returns a :class:`GeometryModel`, one small adapter per family:

* **BERT family** (``model_type == "bert"``): converted to a :class:`~tfmatcomp.HookedEncoder`
  (:func:`tfmatcomp.convert.from_hf`); the residual stream is ``blocks.{l}.hook_resid_pre`` plus
  the last block's output. BERT is post-LN, so block ``l``'s attention reads ``h^(l)`` itself and
  the QK split is taken there (:func:`~tfmatcomp.geometry.qk_decomposition`). Bidirectional.
* **GPT-2 family** (``model_type == "gpt2"``): transformers' ``GPT2Model`` with plain forward hooks.
  The residual stream is transformers' ``hidden_states`` (the embedding dropout's output, each
  block's output, and ``ln_f``'s output for the last). GPT-2 is pre-LN: block ``l``'s attention reads
  ``ln_1(h^(l))``, not ``h^(l)``, so the QK split is taken at the output of ``h[l].ln_1`` (the
  LayerNorm-normalized input, scale and shift applied), decomposed over the same contexts. Causal.

A HookedDecoder adapter can replace :class:`GPT2Geometry` later: the report only uses the
:class:`GeometryModel` interface.

Example:
    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> gm = GPT2Geometry(GPT2Model(GPT2Config(n_layer=2, n_head=2, n_embd=8, vocab_size=20, n_positions=16)))
    >>> gm.stream_keys, gm.attention_input_keys
    (['hidden_states.0', 'hidden_states.1', 'hidden_states.2'], ['blocks.0.ln_1', 'blocks.1.ln_1'])
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from tfmatcomp.decomposition import Decomposition, DecompositionAccumulator, accumulate
from tfmatcomp.geometry.qk import QKComponents, _full_pos, qk_components, qk_decomposition
from tfmatcomp.validation import check_int_in_range

__all__ = ["GeometryModel", "EncoderGeometry", "GPT2Geometry", "load_geometry_model"]


class GeometryModel:
    """What the geometry report needs from a model; one subclass per family.

    Attributes:
        module: the underlying ``nn.Module``.
        causal: whether attention is causal (decoders).
        stream_keys: accumulator keys of ``h^(0..L)`` (the paper's Layer 0..L).
        attention_input_keys: accumulator keys of each block's attention input (the QK split site).
        family: ``"bert"`` or ``"gpt2"``.
        site: one sentence naming the QK split site, for the report.
    """

    module: nn.Module
    causal: bool
    family: str
    site: str
    stream_keys: list[str]
    attention_input_keys: list[str]

    @property
    def n_layers(self) -> int:
        return len(self.attention_input_keys)

    @property
    def n_heads(self) -> int:
        raise NotImplementedError

    def accumulate(self, batches: Iterable[Tensor], *, drop_first: int, progress: bool,
                   total: int | None) -> DecompositionAccumulator:
        """Stream ``batches`` into one accumulator holding stream and attention-input keys."""
        raise NotImplementedError

    def residuals(self, acc: DecompositionAccumulator, tokens: Tensor) -> dict[str, Decomposition]:
        """Second pass on ``tokens``: full decompositions of every accumulated key."""
        raise NotImplementedError

    def qk_weights(self, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``W_Q, W_K [head, d_model, d_head]`` and ``b_Q, b_K [head, d_head]`` of block ``layer``."""
        raise NotImplementedError

    def qk(self, tokens: Int[Tensor, "batch pos"], layer: int,
           decomposition: Decomposition) -> QKComponents:
        """The four QK components of every head of block ``layer`` on ``tokens`` (eq. 7)."""
        raise NotImplementedError


class EncoderGeometry(GeometryModel):
    """A :class:`~tfmatcomp.HookedEncoder` (e.g. a converted BERT)."""

    family = "bert"
    causal = False
    site = ("BERT is post-LN: block l's attention reads the residual stream h^(l) "
            "(blocks.l.hook_resid_pre) directly, so the QK split is taken there.")

    def __init__(self, model):
        from tfmatcomp.decomposition import residual_stream_names

        self.module = model
        self.stream_keys = residual_stream_names(model)
        self.attention_input_keys = [f"blocks.{l}.hook_resid_pre" for l in range(len(model.blocks))]

    @property
    def n_heads(self) -> int:
        return self.module.cfg.n_heads

    def accumulate(self, batches, *, drop_first, progress, total):
        return accumulate(self.module, batches, self.stream_keys, drop_first=drop_first,
                          progress=progress, total=total)

    def residuals(self, acc, tokens):
        from tfmatcomp.decomposition import residual_pass

        return residual_pass(self.module, acc, tokens, self.stream_keys)

    def qk_weights(self, layer):
        check_int_in_range("layer", layer, 0, self.n_layers - 1)
        a = self.module.blocks[layer].attn
        return a.W_Q, a.W_K, a.b_Q, a.b_K

    def qk(self, tokens, layer, decomposition):
        return qk_decomposition(self.module, tokens.to(self.module.device), layer, decomposition)


def _causal_additive(T: int, device) -> Tensor:
    upper = torch.ones(T, T, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(T, T, dtype=torch.float64, device=device).masked_fill(
        upper, torch.finfo(torch.float32).min)[None, None]


class GPT2Geometry(GeometryModel):
    """A transformers ``GPT2Model`` (or ``GPT2LMHeadModel``), read through plain forward hooks."""

    family = "gpt2"
    causal = True
    site = ("GPT-2 is pre-LN: block l's attention reads ln_1(h^(l)), so the QK split is taken at "
            "the output of h[l].ln_1 (normalized, scale and shift applied), decomposed over the same "
            "contexts; W_Q, W_K are c_attn's query and key columns.")

    def __init__(self, model: nn.Module):
        self.module = model
        self.gpt = getattr(model, "transformer", model)
        if not hasattr(self.gpt, "h") or not hasattr(self.gpt, "ln_f"):
            raise ValueError(f"model: {type(model).__name__} is not a GPT-2 (no .h / .ln_f)")
        L = len(self.gpt.h)
        self.stream_keys = [f"hidden_states.{i}" for i in range(L + 1)]
        self.attention_input_keys = [f"blocks.{l}.ln_1" for l in range(L)]

    @property
    def n_heads(self) -> int:
        return self.gpt.config.n_head

    def _modules(self) -> dict[str, nn.Module]:
        g = self.gpt
        L = len(g.h)
        mods = {"hidden_states.0": g.drop}
        mods.update({f"hidden_states.{i + 1}": g.h[i] for i in range(L - 1)})
        mods[f"hidden_states.{L}"] = g.ln_f  # transformers' last hidden state is after ln_f
        mods.update({f"blocks.{l}.ln_1": g.h[l].ln_1 for l in range(L)})
        return mods

    def accumulate(self, batches, *, drop_first, progress, total):
        return accumulate(self.gpt, batches, modules=self._modules(), drop_first=drop_first,
                          progress=progress, total=total)

    def residuals(self, acc, tokens):
        from tfmatcomp.decomposition import residual_pass

        return residual_pass(self.gpt, acc, tokens, modules=self._modules())

    def qk_weights(self, layer):
        check_int_in_range("layer", layer, 0, self.n_layers - 1)
        c = self.gpt.h[layer].attn.c_attn  # Conv1D: y = x W + b, W [d, 3d]
        d, H = self.gpt.config.n_embd, self.n_heads
        dh = d // H

        def heads(w):  # [d, d] -> [head, d, d_head]
            return w.reshape(w.shape[0], H, dh).permute(1, 0, 2)

        W, b = c.weight, c.bias
        return heads(W[:, :d]), heads(W[:, d:2 * d]), b[:d].reshape(H, dh), b[d:2 * d].reshape(H, dh)

    def qk(self, tokens, layer, decomposition):
        check_int_in_range("layer", layer, 0, self.n_layers - 1)
        block = self.gpt.h[layer]
        seen: dict[str, Tensor] = {}
        hooks = [block.ln_1.register_forward_hook(lambda m, a, o: seen.__setitem__("x", o)),
                 block.attn.c_attn.register_forward_hook(lambda m, a, o: seen.__setitem__("qkv", o))]
        device = next(self.gpt.parameters()).device
        try:
            with torch.no_grad():
                self.gpt(tokens.to(device))
        finally:
            for h in hooks:
                h.remove()
        x = seen["x"].to(torch.float64)
        T = x.shape[1]
        pos = _full_pos(decomposition, T).to(device=x.device, dtype=torch.float64)
        x_pos = (pos + decomposition.mu.to(x.device, torch.float64)).expand_as(x)
        W_Q, W_K, b_Q, b_K = self.qk_weights(layer)
        comps = qk_components(x_pos, x - x_pos, W_Q, W_K, b_Q, b_K)
        d, H = self.gpt.config.n_embd, self.n_heads
        q, k = seen["qkv"].to(torch.float64)[..., :2 * d].split(d, dim=-1)
        q = q.reshape(*q.shape[:2], H, d // H).transpose(1, 2)
        k = k.reshape(*k.shape[:2], H, d // H).transpose(1, 2)
        causal = _causal_additive(T, x.device)
        scores = q @ k.transpose(-1, -2) * (d // H) ** -0.5 + causal
        return QKComponents(pos_pos=comps.pos_pos, pos_cvec=comps.pos_cvec, cvec_pos=comps.cvec_pos,
                            cvec_cvec=comps.cvec_cvec, scores=scores, pattern=scores.softmax(-1),
                            additive_mask=causal, heads=tuple(range(H)), layer=layer)


def load_geometry_model(model_dir: str | os.PathLike, device: str | torch.device | None = None
                        ) -> tuple[GeometryModel, Any]:
    """``(GeometryModel, tokenizer)`` from a local transformers directory (nothing downloads).

    Supports ``model_type`` ``"bert"`` (via :class:`~tfmatcomp.HookedEncoder`) and ``"gpt2"``.
    """
    p = Path(model_dir)
    if not (p / "config.json").is_file():
        raise ValueError(f"model_dir: {str(p)!r} has no config.json (a local transformers model "
                         "directory is expected; nothing is downloaded)")
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(p, local_files_only=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    except Exception as err:  # transformers raises OSError / ValueError / others for missing files
        raise ValueError(f"model_dir: no usable tokenizer in {str(p)!r} ({err})") from None
    if cfg.model_type == "bert":
        from transformers import BertModel

        from tfmatcomp.convert import from_hf

        bert = BertModel.from_pretrained(p, local_files_only=True, add_pooling_layer=False)
        gm: GeometryModel = EncoderGeometry(from_hf(bert.eval()))
    elif cfg.model_type == "gpt2":
        from transformers import GPT2Model

        gm = GPT2Geometry(GPT2Model.from_pretrained(p, local_files_only=True).eval())
    else:
        raise ValueError(f"model_dir: model_type {cfg.model_type!r} is not supported (bert, gpt2)")
    if device is not None:
        gm.module.to(device)
    return gm, tokenizer
