"""Models seen the way Song & Zhong measures them: residual stream, attention input, QK.

:func:`load_geometry_model` reads a local model (nothing downloads) and returns a
:class:`GeometryModel`, one per architecture; each is a tfmatcomp hooked model, so the geometry is
read at TransformerLens's hook names and computed by the models' own components:

* **BERT family** (a transformers directory, ``model_type == "bert"``): converted to a
  :class:`~tfmatcomp.HookedEncoder` (:func:`tfmatcomp.models.conversion.bert.from_hf`); the residual stream is
  ``blocks.{l}.hook_resid_pre`` plus the last block's output. BERT is post-LN, so block ``l``'s
  attention reads ``h^(l)`` itself and the QK split is taken there
  (:func:`~tfmatcomp.geometry.qk_decomposition`). Bidirectional.
* **GPT-2 family** (a transformers directory, ``model_type == "gpt2"``): converted to a
  :class:`~tfmatcomp.HookedDecoder` (:meth:`~tfmatcomp.HookedDecoder.from_hf`) and read as a
  :class:`DecoderGeometry` labelled ``"gpt2"``. Causal.
* **A tfmatcomp HookedDecoder checkpoint** (a checkpoint directory, its ``model.safetensors``, or a
  run directory, as :func:`~tfmatcomp.save_checkpoint` and the trainers write them): a
  :class:`DecoderGeometry`. Its tokenizer comes from the checkpoint's metadata (a
  :class:`~tfmatcomp.training.lm.CharTokenizer` saved by :func:`~tfmatcomp.training.lm.train_lm`).

:class:`DecoderGeometry` reads a pre-LN decoder as the paper did: the stream is
``blocks.{l}.hook_resid_pre`` for ``l < L`` and the output of ``ln_final`` for ``L`` (transformers'
``hidden_states``), and the QK split is taken at the
output of ``blocks.{l}.ln1`` (the LayerNorm-normalized attention input, scale and shift applied;
TransformerLens's ``blocks.{l}.ln1.hook_normalized`` is the value *before* the scale and shift).

Example:
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
from jaxtyping import Int
from torch import Tensor, nn

from tfmatcomp.decomposition import Decomposition, DecompositionAccumulator, accumulate
from tfmatcomp.geometry.qk import QKComponents, full_pos, qk_components, qk_decomposition
from tfmatcomp.models.components.attention import future_mask
from tfmatcomp.models.objectives import model_kind
from tfmatcomp.validation import MAX_JSON_BYTES, check_int_in_range, read_json_bounded

__all__ = ["GeometryModel", "EncoderGeometry", "DecoderGeometry", "load_geometry_model"]


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


class DecoderGeometry(_HookedWeights, GeometryModel):
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
        >>> bool(torch.allclose(qk.total(), qk.scores, atol=1e-5))
        True
    """

    causal = True
    site = ("The decoder is pre-LN: block l's attention reads ln1(h^(l)), so the QK split is taken "
            "at the output of blocks.l.ln1 (normalized, scale and shift applied; TransformerLens's "
            "blocks.l.ln1.hook_normalized is the value before them), decomposed over the same "
            "contexts; W_Q, W_K, b_Q, b_K are the block's own.")

    def __init__(self, model: nn.Module, family: str = "decoder"):
        if model_kind(model) != "decoder":
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

    def accumulate(self, batches, *, drop_first, progress, total):
        return accumulate(self.module, batches, modules=self._modules(), drop_first=drop_first,
                          progress=progress, total=total)

    def residuals(self, acc, tokens):
        from tfmatcomp.decomposition import residual_pass

        return residual_pass(self.module, acc, tokens, modules=self._modules())

    def qk(self, tokens, layer, decomposition):
        """The four components of every head of block ``layer`` from its attention input ``x =
        ln1(h^(l))``, with ``x_pos = mu + pos_t`` from ``decomposition`` and the biases with pos;
        ``scores`` and ``pattern`` are the model's own, and the causal mask (a large negative
        number above the diagonal, :func:`~tfmatcomp.models.components.attention.future_mask`) is
        the ``additive_mask`` so that ``total()`` equals ``scores``."""
        from tfmatcomp.datapath import run_chunked

        check_int_in_range("layer", layer, 0, self.n_layers - 1)
        names = [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_attn_scores",
                 f"blocks.{layer}.attn.hook_pattern"]
        tokens = tokens.to(self.module.device)
        _, cache = run_chunked(self.module, tokens, batch_size=max(1, tokens.shape[0]), names=names,
                               return_predictions=False)
        with torch.no_grad():  # the block's own LayerNorm: the attention input W_Q and W_K read
            x = self.module.blocks[layer].ln1(cache[names[0]]).to(torch.float64)
        T = x.shape[1]
        future = future_mask(T, device=x.device)
        masked = torch.finfo(torch.float32).min
        additive = torch.zeros(T, T, dtype=torch.float64, device=x.device).masked_fill(future, masked)
        scores = cache[names[1]].to(torch.float64).masked_fill(future, masked)  # was -inf there
        pos = full_pos(decomposition, T).to(device=x.device, dtype=torch.float64)
        x_pos = (pos + decomposition.mu.to(x.device, torch.float64)).expand_as(x)
        comps = qk_components(x_pos, x - x_pos, *self.qk_weights(layer))
        return QKComponents(pos_pos=comps.pos_pos, pos_cvec=comps.pos_cvec, cvec_pos=comps.cvec_pos,
                            cvec_cvec=comps.cvec_cvec, scores=scores,
                            pattern=cache[names[2]].to(torch.float64), additive_mask=additive[None, None],
                            heads=tuple(range(scores.shape[1])), layer=layer)


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
        return read_json_bounded("model_dir", cfg).get("format") == FORMAT
    except (ValueError, AttributeError):
        return False


#: Largest weights file of a transformers directory read by :func:`load_geometry_model`.
MAX_WEIGHTS_BYTES = 16 << 30
#: Files of a transformers directory that hold weights (the rest it reads are JSON / text).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".model")


def check_model_files(path: Path) -> None:
    """Refuse a transformers directory whose files could block or exhaust memory when read: every
    entry transformers may open (all files directly in ``path``) must be a regular file after
    following symlinks, weights of at most :data:`MAX_WEIGHTS_BYTES`, any other file of at most
    ``MAX_JSON_BYTES``. ``ValueError`` names the file.

    Example:
        >>> import tempfile, pathlib, os
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> os.symlink("/dev/zero", d / "config.json")
        >>> check_model_files(d)
        Traceback (most recent call last):
        ...
        ValueError: model_dir: .../config.json is not a regular file (a fifo, device or socket); refused
    """
    import stat as stat_module

    for entry in sorted(path.iterdir()):
        try:
            st = os.stat(entry)
        except OSError as e:
            raise ValueError(f"model_dir: {entry} cannot be read ({e.strerror})") from None
        if stat_module.S_ISDIR(st.st_mode):
            continue
        if not stat_module.S_ISREG(st.st_mode):
            raise ValueError(f"model_dir: {entry} is not a regular file (a fifo, device or socket); "
                             "refused")
        limit = MAX_WEIGHTS_BYTES if entry.suffix in _WEIGHT_SUFFIXES else MAX_JSON_BYTES
        if st.st_size > limit:
            raise ValueError(f"model_dir: {entry} holds {st.st_size:,} bytes, more than the "
                             f"{limit:,} read at most; refused")


def _load_checkpoint_model(p: Path) -> tuple[GeometryModel, Any]:
    from tfmatcomp.runs.checkpoint import load_checkpoint_info
    from tfmatcomp.training.lm import tokenizer_from_metadata

    model, info = load_checkpoint_info(p)
    if model_kind(model) != "decoder":
        raise ValueError(f"model_dir: {str(p)!r} holds a HookedEncoder checkpoint (a matrix-completion "
                         "model: see `tfmatcomp report`); the geometry command reads HookedDecoder "
                         "checkpoints and transformers directories")
    tokenizer = tokenizer_from_metadata(info.metadata)
    if tokenizer is None:
        raise ValueError(f"model_dir: the checkpoint {str(info.path)!r} records no tokenizer in its "
                         "metadata (train it with tfmatcomp.training.lm.train_lm, or save it with "
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


def load_geometry_model(model_dir: str | os.PathLike,
                        device: str | torch.device | None = None) -> tuple[GeometryModel, Any]:
    """``(GeometryModel, tokenizer)`` from a local model (nothing downloads).

    Args:
        model_dir: a transformers directory (``model_type`` ``"bert"`` or ``"gpt2"``, with its
            tokenizer), or a tfmatcomp HookedDecoder checkpoint (directory, ``model.safetensors``
            or run directory; its tokenizer is read from the checkpoint's metadata).
        device: where to put the model.

    BERT is converted to a :class:`~tfmatcomp.HookedEncoder` (:class:`EncoderGeometry`), GPT-2
    to a :class:`~tfmatcomp.HookedDecoder` (:class:`DecoderGeometry`).

    Example:
        >>> load_geometry_model("no/such/dir")
        Traceback (most recent call last):
        ...
        ValueError: model_dir: 'no/such/dir' has no config.json (a local transformers model directory or a tfmatcomp checkpoint is expected; nothing is downloaded)
    """
    p = Path(model_dir)
    if _is_tfmatcomp_checkpoint(p):
        gm, tokenizer = _load_checkpoint_model(p)
        if device is not None:
            gm.module.to(device)
        return gm, tokenizer
    if not (p / "config.json").is_file():
        raise ValueError(f"model_dir: {str(p)!r} has no config.json (a local transformers model "
                         "directory or a tfmatcomp checkpoint is expected; nothing is downloaded)")
    check_model_files(p)
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(p, local_files_only=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
    except Exception as err:  # transformers raises OSError / ValueError / others for missing files
        raise ValueError(f"model_dir: no usable tokenizer in {str(p)!r} ({err})") from None
    if cfg.model_type == "bert":
        from transformers import BertModel

        from tfmatcomp.models.conversion.bert import from_hf

        bert = _from_pretrained(BertModel, p, add_pooling_layer=False)
        gm: GeometryModel = EncoderGeometry(from_hf(bert.eval()))
    elif cfg.model_type == "gpt2":
        from transformers import GPT2Model

        from tfmatcomp.models.decoder import HookedDecoder

        gpt2 = _from_pretrained(GPT2Model, p).eval()
        gm = DecoderGeometry(HookedDecoder.from_hf(gpt2).eval(), family="gpt2")
    else:
        raise ValueError(f"model_dir: model_type {cfg.model_type!r} is not supported (bert, gpt2)")
    if device is not None:
        gm.module.to(device)
    return gm, tokenizer
