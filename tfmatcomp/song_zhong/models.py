"""Models seen the way Song & Zhong measures them: residual stream, attention input, QK.

:func:`load_geometry_model` reads a local model (nothing downloads) and returns a
:class:`GeometryModel`, one small adapter per kind:

* **BERT family** (a transformers directory, ``model_type == "bert"``): converted to a
  :class:`~tfmatcomp.HookedEncoder` (:func:`tfmatcomp.models.conversion.bert.from_hf`); the residual stream is
  ``blocks.{l}.hook_resid_pre`` plus the last block's output. BERT is post-LN, so block ``l``'s
  attention reads ``h^(l)`` itself and the QK split is taken there
  (:func:`~tfmatcomp.geometry.qk_decomposition`). Bidirectional.
* **GPT-2 family** (a transformers directory, ``model_type == "gpt2"``), two adapters that measure
  the same thing:

  - ``adapter="hooks"`` (the default): transformers' ``GPT2Model`` with plain forward hooks
    (:class:`GPT2Geometry`). The residual stream is transformers' ``hidden_states`` (the embedding
    dropout's output, each block's output, and ``ln_f``'s output for the last). GPT-2 is pre-LN:
    block ``l``'s attention reads ``ln_1(h^(l))``, not ``h^(l)``, so the QK split is taken at the
    output of ``h[l].ln_1`` (normalized, scale and shift applied). Causal.
  - ``adapter="hooked"``: converted to a :class:`~tfmatcomp.HookedDecoder`
    (:meth:`~tfmatcomp.HookedDecoder.from_hf`) and read as a :class:`DecoderGeometry`.

* **A tfmatcomp HookedDecoder checkpoint** (a checkpoint directory, its ``model.safetensors``, or a
  run directory, as :func:`~tfmatcomp.save_checkpoint` and the trainers write them): a
  :class:`DecoderGeometry`. Its tokenizer comes from the checkpoint's metadata (a
  :class:`~tfmatcomp.song_zhong.lm.CharTokenizer` saved by :func:`~tfmatcomp.song_zhong.lm.train_lm`).

:class:`DecoderGeometry` reads a pre-LN decoder as the paper did: the stream is
``blocks.{l}.hook_resid_pre`` for ``l < L`` and the output of ``ln_final`` for ``L`` (transformers'
``hidden_states``, so both GPT-2 adapters give the same table), and the QK split is taken at the
output of ``blocks.{l}.ln1`` (the LayerNorm-normalized attention input, scale and shift applied;
TransformerLens's ``blocks.{l}.ln1.hook_normalized`` is the value *before* the scale and shift).

Example:
    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> gm = GPT2Geometry(GPT2Model(GPT2Config(n_layer=2, n_head=2, n_embd=8, vocab_size=20, n_positions=16)))
    >>> gm.stream_keys, gm.attention_input_keys
    (['hidden_states.0', 'hidden_states.1', 'hidden_states.2'], ['blocks.0.ln_1', 'blocks.1.ln_1'])
    >>> import tfmatcomp as tm
    >>> dm = DecoderGeometry(tm.HookedDecoder(tm.DecoderConfig(n_layers=2, n_heads=2, d_model=8,
    ...                                                        d_mlp=16, n_ctx=16, d_vocab=20)))
    >>> dm.stream_keys, dm.attention_input_keys
    (['blocks.0.hook_resid_pre', 'blocks.1.hook_resid_pre', 'ln_final'], ['blocks.0.ln1', 'blocks.1.ln1'])
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

__all__ = ["GeometryModel", "EncoderGeometry", "GPT2Geometry", "DecoderGeometry", "ADAPTERS",
           "load_geometry_model"]

#: How a GPT-2 directory is read: ``"auto"`` (= ``"hooks"`` for GPT-2, the only way for the rest),
#: ``"hooks"`` (transformers' module with forward hooks) or ``"hooked"`` (converted to a
#: :class:`~tfmatcomp.HookedDecoder`).
ADAPTERS = ("auto", "hooks", "hooked")


class GeometryModel:
    """What the geometry report needs from a model; one subclass per family.

    Attributes:
        module: the underlying ``nn.Module``.
        causal: whether attention is causal (decoders).
        stream_keys: accumulator keys of ``h^(0..L)`` (the paper's Layer 0..L).
        attention_input_keys: accumulator keys of each block's attention input (the QK split site).
        family: the label the report shows: ``"bert"``, ``"gpt2"``, or a decoder checkpoint's ``family``
            metadata (default ``"decoder"``).
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


class _HookedWeights:
    """Heads and Q/K weights of a tfmatcomp model (HookedEncoder or HookedDecoder) in ``module``."""

    module: nn.Module
    n_layers: int

    @property
    def n_heads(self) -> int:
        return self.module.cfg.n_heads

    def qk_weights(self, layer):
        check_int_in_range("layer", layer, 0, self.n_layers - 1)
        a = self.module.blocks[layer].attn
        return a.W_Q, a.W_K, a.b_Q, a.b_K


class EncoderGeometry(_HookedWeights, GeometryModel):
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

    def accumulate(self, batches, *, drop_first, progress, total):
        return accumulate(self.module, batches, self.stream_keys, drop_first=drop_first,
                          progress=progress, total=total)

    def residuals(self, acc, tokens):
        from tfmatcomp.decomposition import residual_pass

        return residual_pass(self.module, acc, tokens, self.stream_keys)

    def qk(self, tokens, layer, decomposition):
        return qk_decomposition(self.module, tokens.to(self.module.device), layer, decomposition)


def _causal_additive(T: int, device) -> Tensor:
    upper = torch.ones(T, T, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(T, T, dtype=torch.float64, device=device).masked_fill(
        upper, torch.finfo(torch.float32).min)[None, None]


def _causal_split(x: Float[Tensor, "batch pos d_model"], decomposition: Decomposition,
                  weights: tuple[Tensor, Tensor, Tensor, Tensor],
                  scores: Float[Tensor, "batch head query key"], layer: int) -> QKComponents:
    """The four components of a causal head from its attention input ``x`` (the LayerNorm's
    output of a pre-LN block): ``x_pos = mu + pos_t`` from ``decomposition``, biases with pos."""
    x = x.to(torch.float64)
    T = x.shape[1]
    pos = _full_pos(decomposition, T).to(device=x.device, dtype=torch.float64)
    x_pos = (pos + decomposition.mu.to(x.device, torch.float64)).expand_as(x)
    comps = qk_components(x_pos, x - x_pos, *weights)
    causal = _causal_additive(T, x.device)
    scores = scores.to(torch.float64)
    return QKComponents(pos_pos=comps.pos_pos, pos_cvec=comps.pos_cvec, cvec_pos=comps.cvec_pos,
                        cvec_cvec=comps.cvec_cvec, scores=scores, pattern=scores.softmax(-1),
                        additive_mask=causal, heads=tuple(range(scores.shape[1])), layer=layer)


class _ForwardHookGeometry(GeometryModel):
    """A model streamed through plain forward hooks on the modules of :meth:`_modules`."""

    causal = True

    def _runner(self) -> nn.Module:
        return self.module

    def _modules(self) -> dict[str, nn.Module]:
        raise NotImplementedError

    def accumulate(self, batches, *, drop_first, progress, total):
        return accumulate(self._runner(), batches, modules=self._modules(), drop_first=drop_first,
                          progress=progress, total=total)

    def residuals(self, acc, tokens):
        from tfmatcomp.decomposition import residual_pass

        return residual_pass(self._runner(), acc, tokens, modules=self._modules())


class GPT2Geometry(_ForwardHookGeometry):
    """A transformers ``GPT2Model`` (or ``GPT2LMHeadModel``), read through plain forward hooks."""

    family = "gpt2"
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

    def _runner(self) -> nn.Module:
        return self.gpt

    def _modules(self) -> dict[str, nn.Module]:
        g = self.gpt
        L = len(g.h)
        mods = {"hidden_states.0": g.drop}
        mods.update({f"hidden_states.{i + 1}": g.h[i] for i in range(L - 1)})
        mods[f"hidden_states.{L}"] = g.ln_f  # transformers' last hidden state is after ln_f
        mods.update({f"blocks.{l}.ln_1": g.h[l].ln_1 for l in range(L)})
        return mods

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
        d, H = self.gpt.config.n_embd, self.n_heads
        q, k = seen["qkv"].to(torch.float64)[..., :2 * d].split(d, dim=-1)
        q = q.reshape(*q.shape[:2], H, d // H).transpose(1, 2)
        k = k.reshape(*k.shape[:2], H, d // H).transpose(1, 2)
        T = q.shape[2]
        scores = q @ k.transpose(-1, -2) * (d // H) ** -0.5 + _causal_additive(T, q.device)
        return _causal_split(seen["x"], decomposition, self.qk_weights(layer), scores, layer)


class DecoderGeometry(_HookedWeights, _ForwardHookGeometry):
    """A :class:`~tfmatcomp.HookedDecoder` (pre-LN, causal): a tfmatcomp checkpoint, or a GPT-2
    converted with :meth:`~tfmatcomp.HookedDecoder.from_hf`.

    The residual stream is ``blocks.{l}.hook_resid_pre`` (``l < L``) and the output of
    ``ln_final`` (``L``, transformers' last ``hidden_states``); the QK split is taken at the output
    of ``blocks.{l}.ln1``, the LayerNorm-normalized attention input with its scale and shift, which
    ``W_Q`` and ``W_K`` read. Forward hooks sit on those modules (HookPoints are modules too), so
    the fused attention and LayerNorm kernels stay in use while the stream is decomposed.

    Args:
        model: the decoder.
        family: the label the report shows (e.g. ``"gpt2"`` for a converted GPT-2).

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedDecoder(tm.DecoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32,
        ...                                           n_ctx=12, d_vocab=20), seed=0)
        >>> gm = DecoderGeometry(model)
        >>> tokens = torch.randint(0, 20, (8, 12), generator=torch.Generator().manual_seed(0))
        >>> acc = gm.accumulate([tokens], drop_first=1, progress=False, total=1)
        >>> qk = gm.qk(tokens[:2], 1, acc.result("blocks.1.ln1"))
        >>> causal = torch.ones(12, 12, dtype=torch.bool).tril()
        >>> bool(torch.allclose(qk.total()[..., causal], qk.scores[..., causal], atol=1e-5))
        True
    """

    site = ("The decoder is pre-LN: block l's attention reads ln1(h^(l)), so the QK split is taken "
            "at the output of blocks.l.ln1 (normalized, scale and shift applied; TransformerLens's "
            "blocks.l.ln1.hook_normalized is the value before them), decomposed over the same "
            "contexts; W_Q, W_K, b_Q, b_K are the block's own.")

    def __init__(self, model: nn.Module, family: str = "decoder"):
        from tfmatcomp.models.decoder import HookedDecoder

        if not isinstance(model, HookedDecoder):
            raise ValueError(f"model: expected a tfmatcomp HookedDecoder, got {type(model).__name__}")
        self.module = model
        self.family = family
        L = len(model.blocks)
        self.stream_keys = [f"blocks.{l}.hook_resid_pre" for l in range(L)] + ["ln_final"]
        self.attention_input_keys = [f"blocks.{l}.ln1" for l in range(L)]

    def _modules(self) -> dict[str, nn.Module]:
        m = self.module
        mods: dict[str, nn.Module] = {f"blocks.{l}.hook_resid_pre": b.hook_resid_pre
                                      for l, b in enumerate(m.blocks)}
        mods["ln_final"] = m.ln_final
        mods.update({f"blocks.{l}.ln1": b.ln1 for l, b in enumerate(m.blocks)})
        return mods

    def qk(self, tokens, layer, decomposition):
        from tfmatcomp.datapath import run_chunked

        check_int_in_range("layer", layer, 0, self.n_layers - 1)
        names = [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_attn_scores"]
        tokens = tokens.to(self.module.device)
        _, cache = run_chunked(self.module, tokens, batch_size=max(1, tokens.shape[0]), names=names,
                               return_predictions=False)
        with torch.no_grad():  # the block's own LayerNorm: the attention input W_Q and W_K read
            x = self.module.blocks[layer].ln1(cache[names[0]])
        scores = cache[names[1]].to(torch.float64)  # -inf above the diagonal
        scores = scores.masked_fill(torch.isinf(scores), torch.finfo(torch.float32).min)
        return _causal_split(x, decomposition, self.qk_weights(layer), scores, layer)


def _is_tfmatcomp_checkpoint(p: Path) -> bool:
    """A tfmatcomp checkpoint directory, one of its weight files, or a run directory."""
    import json

    from tfmatcomp.runs.checkpoint import FORMAT
    from tfmatcomp.runs.layout import CHECKPOINTS_DIR, CONFIG_FILE

    if p.is_file():
        return True
    if p.is_dir() and (p / CHECKPOINTS_DIR).is_dir() and not (p / CONFIG_FILE).exists():
        return True
    cfg = p / CONFIG_FILE
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text(encoding="utf-8")).get("format") == FORMAT
    except (ValueError, UnicodeDecodeError, AttributeError):
        return False


def _load_checkpoint_model(p: Path, adapter: str) -> tuple[GeometryModel, Any]:
    from tfmatcomp.runs.checkpoint import load_checkpoint_info
    from tfmatcomp.models.decoder import HookedDecoder
    from tfmatcomp.song_zhong.lm import tokenizer_from_metadata

    if adapter == "hooks":
        raise ValueError("adapter: a tfmatcomp checkpoint is read as a HookedDecoder; use 'auto' "
                         "or 'hooked' ('hooks' is for transformers GPT-2 directories)")
    model, info = load_checkpoint_info(p)
    if not isinstance(model, HookedDecoder):
        raise ValueError(f"model_dir: {str(p)!r} holds a HookedEncoder checkpoint (a matrix-completion "
                         "model: see `tfmatcomp report`); the geometry command reads HookedDecoder "
                         "checkpoints and transformers directories")
    tokenizer = tokenizer_from_metadata(info.metadata)
    if tokenizer is None:
        raise ValueError(f"model_dir: the checkpoint {str(info.path)!r} records no tokenizer in its "
                         "metadata (train it with tfmatcomp.song_zhong.lm.train_lm, or save it with "
                         "metadata={'tokenizer': CharTokenizer(...).to_dict()})")
    return DecoderGeometry(model.eval(), family=str(info.metadata.get("family", "decoder"))), tokenizer


def _from_pretrained(cls, path: Path, **kwargs):
    """``cls.from_pretrained(path)`` offline; weights that cannot be read safely (a pickled
    ``pytorch_model.bin`` that torch refuses, a missing or broken file) are a ``ValueError``
    naming the directory, not the loader's traceback."""
    try:
        return cls.from_pretrained(path, local_files_only=True, **kwargs)
    except Exception as err:  # transformers / torch raise OSError, UnpicklingError, ... here
        raise ValueError(f"model_dir: the weights in {str(path)!r} cannot be loaded "
                         f"({type(err).__name__}: {' '.join(str(err).split())[:300]}); give a "
                         "directory with model.safetensors") from None


def load_geometry_model(model_dir: str | os.PathLike, device: str | torch.device | None = None,
                        adapter: str = "auto") -> tuple[GeometryModel, Any]:
    """``(GeometryModel, tokenizer)`` from a local model (nothing downloads).

    Args:
        model_dir: a transformers directory (``model_type`` ``"bert"`` or ``"gpt2"``, with its
            tokenizer), or a tfmatcomp HookedDecoder checkpoint (directory, ``model.safetensors``
            or run directory; its tokenizer is read from the checkpoint's metadata).
        device: where to put the model.
        adapter: one of :data:`ADAPTERS`; for GPT-2, ``"hooks"`` (also ``"auto"``) reads
            transformers' module through forward hooks and ``"hooked"`` converts it to a
            :class:`~tfmatcomp.HookedDecoder`. BERT is always converted to a
            :class:`~tfmatcomp.HookedEncoder` (``"hooks"`` is refused for it).

    Example:
        >>> load_geometry_model("no/such/dir")
        Traceback (most recent call last):
        ...
        ValueError: model_dir: 'no/such/dir' has no config.json (a local transformers model directory or a tfmatcomp checkpoint is expected; nothing is downloaded)
    """
    from tfmatcomp.validation import check_choice

    check_choice("adapter", adapter, ADAPTERS)
    p = Path(model_dir)
    if _is_tfmatcomp_checkpoint(p):
        gm, tokenizer = _load_checkpoint_model(p, adapter)
        if device is not None:
            gm.module.to(device)
        return gm, tokenizer
    if not (p / "config.json").is_file():
        raise ValueError(f"model_dir: {str(p)!r} has no config.json (a local transformers model "
                         "directory or a tfmatcomp checkpoint is expected; nothing is downloaded)")
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(p, local_files_only=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    except Exception as err:  # transformers raises OSError / ValueError / others for missing files
        raise ValueError(f"model_dir: no usable tokenizer in {str(p)!r} ({err})") from None
    if cfg.model_type == "bert":
        from transformers import BertModel

        from tfmatcomp.models.conversion.bert import from_hf

        if adapter == "hooks":
            raise ValueError("adapter: BERT is always read as a converted HookedEncoder; use 'auto' "
                             "or 'hooked'")
        bert = _from_pretrained(BertModel, p, add_pooling_layer=False)
        gm: GeometryModel = EncoderGeometry(from_hf(bert.eval()))
    elif cfg.model_type == "gpt2":
        from transformers import GPT2Model

        gpt2 = _from_pretrained(GPT2Model, p).eval()
        if adapter == "hooked":
            from tfmatcomp.models.decoder import HookedDecoder

            gm = DecoderGeometry(HookedDecoder.from_hf(gpt2).eval(), family="gpt2")
        else:
            gm = GPT2Geometry(gpt2)
    else:
        raise ValueError(f"model_dir: model_type {cfg.model_type!r} is not supported (bert, gpt2)")
    if device is not None:
        gm.module.to(device)
    return gm, tokenizer
