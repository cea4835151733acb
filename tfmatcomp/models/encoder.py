"""HookedEncoder: a post-LN BERT encoder with TransformerLens hook points and one of three heads.

The whole forward pass, readable in one sitting::

    x = embed(tokens)                      # LN(W_E[tokens] + W_pos), hook_full_embed
    for block in blocks:                   # post-LN BERT blocks
        x = block(x)                       # x is now encoder_output(tokens)
    predictions = readout(x)               # head "regression": [batch, pos], hook_readout
    logits = unembed(mlm_head(x))          # head "masked_lm": [batch, pos, d_vocab]
                                           # head "none": x itself

Real masked-language encoders (BERT, RoBERTa, DistilBERT) load with :meth:`HookedEncoder.from_pretrained`
and take text through their own tokenizer (:meth:`~HookedEncoder.to_tokens`).

Example:
    >>> import torch
    >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
    >>> cfg = EncoderConfig(n_layers=2, n_heads=4, d_model=64, d_mlp=256, n_ctx=16)
    >>> model = HookedEncoder(cfg, seed=0)
    >>> batch = MatrixCompletionTask(n_rows=4, rank=1).sample(8, generator=torch.Generator().manual_seed(0))
    >>> preds, cache = model.run_with_cache(batch.tokens)
    >>> preds.shape, cache["blocks.0.attn.hook_pattern"].shape
    (torch.Size([8, 16]), torch.Size([8, 4, 16, 16]))
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from tfmatcomp.models.components.hook_point import HookPoint

from tfmatcomp.models.components import BertBlock, BertEmbed, BertMLMHead, MLMUnembed, Readout
from tfmatcomp.models.components.attention import padding_mask
from tfmatcomp.models.cache import EncoderActivationCache
from tfmatcomp.config import EncoderConfig
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.models.hooked_base import HookedBase, UnknownHookError
from tfmatcomp.task.metrics import mse
from tfmatcomp.task.tokenizer import ValueTokenizer
from tfmatcomp.validation import check_choice, shape_text

__all__ = ["HookedEncoder", "UncheckedForward", "UnknownHookError"]

#: The return types each head allows; the first is the default (``return_type="default"``).
RETURN_TYPES: dict[str, tuple[str | None, ...]] = {
    "regression": ("predictions", "hidden", "loss", None),
    "masked_lm": ("logits", "predictions", "hidden", None),
    "none": ("hidden", None),
}


def _is_text(x: Any) -> bool:
    """A string or a non-empty list of strings: text for the model's tokenizer."""
    return isinstance(x, str) or (isinstance(x, list) and bool(x)
                                  and all(isinstance(t, str) for t in x))


class HookedEncoder(HookedBase):
    """BERT encoder for matrix completion, with hooks at every activation.

    Args:
        cfg: the model's shape (see :class:`~tfmatcomp.config.EncoderConfig`).
        seed: seeds the weight initialization (HuggingFace BERT's: normal(0, init_range) for matrices
            and embeddings, zero biases, unit LayerNorm; PyTorch's default for the read-out as in
            the papers' code).

    The config's ``head`` says what sits on the last block: the papers' regression read-out,
    BERT's masked-LM head (``mlm_head``, ``unembed``; TransformerLens 3's names) or nothing.

    Hook names and meanings follow TransformerLens's HookedEncoder (3.x): ``embed.hook_embed``,
    ``embed.hook_pos_embed``, ``embed.hook_token_type_embed``, ``embed.ln.hook_scale``,
    ``embed.ln.hook_normalized``, ``hook_full_embed``; per block ``blocks.{l}.hook_resid_pre``,
    ``blocks.{l}.attn.hook_q|hook_k|hook_v|hook_z`` ``[batch, pos, head, d_head]``,
    ``blocks.{l}.attn.hook_attn_scores|hook_pattern`` ``[batch, head, query, key]``,
    ``blocks.{l}.hook_attn_out``, ``blocks.{l}.hook_resid_mid``, ``blocks.{l}.ln1.hook_scale|
    hook_normalized``, ``blocks.{l}.hook_normalized_resid_mid``, ``blocks.{l}.mlp.hook_pre|
    hook_post``, ``blocks.{l}.hook_mlp_out``, ``blocks.{l}.hook_resid_post``,
    ``blocks.{l}.ln2.hook_scale|hook_normalized``, ``blocks.{l}.hook_normalized_resid_post``; and
    ``hook_readout`` ``[batch, pos]`` (regression head) or ``mlm_head.ln.hook_scale|
    hook_normalized``, ``unembed.hook_in|hook_out`` (masked-LM head). A LayerNorm's ``hook_scale`` (``[batch, pos, 1]``) and
    ``hook_normalized`` (``(x - mean) / scale``) come before its gain and bias, as in
    TransformerLens; its output after them is ``hook_full_embed`` (``embed.ln``),
    ``hook_normalized_resid_mid`` (``ln1``, the one hook TransformerLens lacks) or
    ``hook_normalized_resid_post`` (``ln2``). The table with every hook's shape and meaning is
    docs/concepts/model.md.
    """

    #: ``run_with_cache``'s cache: TransformerLens's, with its pre-LN helpers refusing to run.
    _cache_class = EncoderActivationCache
    cfg_class = EncoderConfig

    def __init__(self, cfg: EncoderConfig, seed: int = 0):
        super().__init__(cfg, seed)
        self.embed = BertEmbed(cfg)
        self.hook_full_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([BertBlock(cfg) for _ in range(cfg.n_layers)])
        if cfg.head == "regression":
            self.readout = Readout(cfg.d_model, cfg.d_out)
            self.hook_readout = HookPoint()  # [batch, pos] (or [batch, pos, d_out] when d_out > 1)
        elif cfg.head == "masked_lm":
            self.mlm_head = BertMLMHead(cfg)
            self.unembed = MLMUnembed(cfg.d_model, cfg.d_vocab)
        #: the checkpoint's HuggingFace tokenizer (set by :meth:`from_pretrained`); with one, the
        #: model speaks text: ``to_tokens`` / ``to_str_tokens`` / ``to_string`` go through it
        self.tokenizer = None
        self.init_weights(torch.Generator().manual_seed(seed))
        self.setup()

    # ------------------------------------------------------------------ init
    # :meth:`init_weights` as HuggingFace BERT does, the read-out as torch's nn.Linear
    def init_divisor(self, name: str) -> float | None:
        """None for the read-out (:meth:`init_own_weights`), else 1."""
        return None if name.startswith("readout.") else 1.0

    @torch.no_grad()
    def init_own_weights(self, generator: torch.Generator) -> None:
        """Zero the MASK row of the token embedding (without a learned MASK embedding) and draw
        the read-out uniformly in ``±1/sqrt(d_model)``."""
        if self.embed.padding_idx is not None:
            self.embed.W_E[self.embed.padding_idx].zero_()
        if self.cfg.head != "regression":
            return
        bound = 1 / math.sqrt(self.cfg.d_model)
        for p in self.readout.parameters():
            p.copy_(torch.rand(p.shape, generator=generator) * 2 * bound - bound)

    # --------------------------------------------------------------- forward
    def _check_token_types(self, token_type_ids: Any, tokens: Tensor) -> None:
        n_types = max(self.cfg.n_token_types, 1)  # no token types: only all-zero ids (HF's default)
        if not torch.is_tensor(token_type_ids) or token_type_ids.shape != tokens.shape:
            raise ValueError(f"token_type_ids: expected an integer tensor of shape "
                             f"{tuple(tokens.shape)} (as tokens), got {shape_text(token_type_ids)}")
        if token_type_ids.dtype.is_floating_point or token_type_ids.dtype == torch.bool:
            raise ValueError(f"token_type_ids: must be integers, got dtype {token_type_ids.dtype}")
        if token_type_ids.numel() and (token_type_ids.min() < 0 or token_type_ids.max() >= n_types):
            what = (f"the config has {self.cfg.n_token_types} token types" if self.cfg.n_token_types
                    else "the config has no token types (n_token_types=0), so only zeros")
            raise ValueError(f"token_type_ids: must lie in [0, {n_types - 1}] ({what}); got min "
                             f"{token_type_ids.min().item()}, max {token_type_ids.max().item()}")

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"] | str | list[str],
        token_type_ids: Int[Tensor, "batch pos"] | None = None,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        return_type: str | None = "default",
        values: Float[Tensor, "batch pos"] | None = None,
    ) -> Tensor | list[str] | None:
        """Run the encoder.

        Args:
            tokens: token ids ``[batch, pos]`` with ``pos <= n_ctx``; or, for a model with a
                tokenizer (:meth:`from_pretrained`), a string or a list of strings, tokenized by
                :meth:`to_tokens` (its token types and attention mask are used unless given).
            token_type_ids: segment ids (only when the config has token-type embeddings).
            attention_mask: 1 for real tokens, 0 for padding (keys at 0 get no attention;
                TransformerLens 3's ``one_zero_attention_mask``).
            return_type: ``"default"`` is the head's output: ``"predictions"`` for the regression
                head (read-out, ``[batch, pos]``), ``"logits"`` for the masked-LM head
                (``[batch, pos, d_vocab]``), ``"hidden"`` for none. Also: ``"hidden"`` (the last
                block's output ``[batch, pos, d_model]``, :meth:`encoder_output`), None;
                regression only: ``"loss"`` (the papers' MSE over all entries against
                ``values``, a scalar: what TransformerLens's ``run_with_cache(...,
                incl_bwd=True)`` differentiates); masked-LM only: ``"predictions"`` (as
                TransformerLens 3: the top-1 token at each MASK token, decoded, as a list of
                strings in batch order).
            values: the matrices' values ``[batch, pos]`` (``MatrixBatch.values``), needed by
                ``return_type="loss"``.

        Example:
            >>> import torch, tfmatcomp as tm
            >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
            >>> batch = tm.MatrixCompletionTask(4, rank=1).sample(2, torch.Generator().manual_seed(0))
            >>> loss, cache = model.run_with_cache(batch.tokens, return_type="loss",
            ...                                    values=batch.values, incl_bwd=True)
            >>> loss.shape, cache["blocks.0.hook_resid_pre_grad"].shape
            (torch.Size([]), torch.Size([2, 16, 64]))
        """
        if _is_text(tokens):  # text, as TransformerLens 3's HookedEncoder
            tokens, types, mask = self.to_tokens(tokens)
            token_type_ids = types if token_type_ids is None else token_type_ids
            attention_mask = mask if attention_mask is None else attention_mask
        allowed = RETURN_TYPES[self.cfg.head]
        if return_type == "default":
            return_type = allowed[0]
        if return_type not in allowed:
            raise ValueError(f"return_type: must be one of {allowed} (or 'default') for a model "
                             f"with head {self.cfg.head!r}, got {return_type!r}")
        self._check_inputs(tokens, token_type_ids, attention_mask)
        if (return_type == "loss") != (values is not None):
            raise ValueError("values: give the matrices' values [batch, pos] (MatrixBatch.values) "
                             "with return_type='loss', and only then")
        if values is not None and (not torch.is_tensor(values) or values.shape != tokens.shape):
            raise ValueError(f"values: expected shape {tuple(tokens.shape)} (as tokens), got "
                             f"{shape_text(values)}")
        if return_type == "loss":
            predictions = self._run(tokens, token_type_ids, attention_mask, "predictions")
            return mse(predictions, values.to(predictions.dtype))
        if return_type == "predictions" and self.cfg.head == "masked_lm":
            logits = self._run(tokens, token_type_ids, attention_mask, "logits")
            tokenizer = self._need_tokenizer("return_type='predictions'")
            at_mask = tokens == tokenizer.mask_token_id
            return [tokenizer.decode([i]) for i in logits[at_mask].argmax(-1).tolist()]
        return self._run(tokens, token_type_ids, attention_mask, return_type)

    def encoder_output(
        self,
        tokens: Int[Tensor, "batch pos"],
        token_type_ids: Int[Tensor, "batch pos"] | None = None,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """The last block's output ``[batch, pos, d_model]`` (the residual stream before any head),
        as TransformerLens 3's ``HookedEncoder.encoder_output`` (its third argument,
        ``one_zero_attention_mask`` there, is ``attention_mask`` here); the same as
        ``model(tokens, return_type="hidden")``."""
        self._check_inputs(tokens, token_type_ids, attention_mask)
        return self._run(tokens, token_type_ids, attention_mask, "hidden")

    def _check_inputs(self, tokens: Any, token_type_ids: Any, attention_mask: Any) -> None:
        self.check_tokens(tokens)
        if token_type_ids is not None:
            self._check_token_types(token_type_ids, tokens)
        if attention_mask is not None:
            if not torch.is_tensor(attention_mask) or attention_mask.shape != tokens.shape:
                raise ValueError(f"attention_mask: expected shape {tuple(tokens.shape)}, got "
                                 f"{shape_text(attention_mask)}")
            if attention_mask.dtype != torch.bool and bool(
                    ((attention_mask != 0) & (attention_mask != 1)).any()):
                raise ValueError("attention_mask: must hold only 0 (padding) and 1 (token), or be "
                                 "boolean")

    def _run(self, tokens, token_type_ids=None, attention_mask=None, return_type="predictions"):
        """The forward pass without the token-value checks (which read tensor values and so cannot
        run under ``torch.func.vmap``); callers validate first, as :meth:`forward` does.
        ``return_type`` "predictions" means the head's output (values or logits)."""
        additive_mask = None
        if attention_mask is not None:
            if attention_mask.shape != tokens.shape:
                raise ValueError(f"attention_mask: expected shape {tuple(tokens.shape)}, got "
                                 f"{tuple(attention_mask.shape)}")
            dtype = self.embed.W_E.dtype
            additive_mask = padding_mask(attention_mask, dtype)
        x = self.hook_full_embed(self.embed(tokens, token_type_ids))
        for block in self.blocks:
            x = block(x, additive_mask)
        if return_type == "hidden" or self.cfg.head == "none":
            return x if return_type is not None else None
        if self.cfg.head == "masked_lm":
            logits = self.unembed(self.mlm_head(x))
            return logits if return_type is not None else None
        predictions = self.hook_readout(self.readout(x))
        return predictions if return_type is not None else None

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.embed.W_pos

    # ------------------------------------------------------- matrices <-> tokens
    def to_tokens(self, matrices: Float[Tensor, "*batch n_rows n_cols"] | str | list[str],
                  observed: Bool[Tensor, "*batch n_rows n_cols"] | None = None,
                  move_to_device: bool = True, truncate: bool = True,
                  ) -> Int[Tensor, "batch pos"] | tuple[Tensor, Tensor, Tensor]:
        """TransformerLens's ``to_tokens``, for text or for matrices.

        Text (a string or a list of strings, for a model with a tokenizer, see
        :meth:`from_pretrained`): as TransformerLens 3's ``HookedEncoder.to_tokens``, the
        tokenizer's ``(tokens, token_type_ids, attention_mask)``, each ``[batch, pos]``, padded on
        the tokenizer's side to the longest text and (``truncate=True``) cut at ``n_ctx``; the
        token types are zeros where the tokenizer gives none (RoBERTa, DistilBERT).

        Matrices: the token ids ``[batch, n_rows * n_cols]``
        of ``matrices`` (``[batch, n_rows, n_cols]`` or one ``[n_rows, n_cols]``), MASK where
        ``observed`` is False (default: everything observed), with the papers' tokenizer.

        Example:
            >>> import torch, tfmatcomp as tm
            >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
            >>> x = torch.tensor([[0.5, -0.25], [0.0, 1.0]])
            >>> print(model.to_string(model.to_tokens(x, observed=torch.tensor([[1, 1], [0, 1]]).bool())))
             0.50 -0.25
                ?  1.00
        """
        if _is_text(matrices):
            return self._text_tokens(matrices, move_to_device, truncate)
        matrices, observed = self._with_batch_axis(matrices, observed)
        b, n_rows, n_cols = matrices.shape
        if n_rows * n_cols > self.cfg.n_ctx:
            raise ValueError(f"matrices: {n_rows}x{n_cols} needs {n_rows * n_cols} positions, the "
                             f"model has n_ctx {self.cfg.n_ctx}")
        if observed is None:
            observed = torch.ones(b, n_rows, n_cols, dtype=torch.bool)
        observed = torch.as_tensor(observed)
        if observed.dtype != torch.bool or observed.shape != matrices.shape:
            raise ValueError(f"observed: expected a bool tensor of shape {tuple(matrices.shape)}, "
                             f"got {observed.dtype} {tuple(observed.shape)}")
        batch = MatrixBatch.from_values(matrices.reshape(b, -1).float(), observed.reshape(b, -1),
                                        n_rows, n_cols)
        return batch.tokens.to(self.device)

    def to_string(self, tokens: Int[Tensor, "*batch pos"], n_cols: int | None = None
                  ) -> str | list[str]:
        """TransformerLens's ``to_string``. A model with a tokenizer decodes with it (one string for
        ``[pos]``, a list for ``[batch, pos]``). Otherwise, for matrices: each row of token ids as a
        matrix of values, ``?`` for MASK; ``n_cols`` defaults to the square side. One string for
        ``[pos]`` (or a batch of one), a list for a batch."""
        tokens = torch.as_tensor(tokens)
        if self.tokenizer is not None:
            if tokens.ndim not in (1, 2):
                raise ValueError(f"tokens: expected [pos] or [batch, pos], got {shape_text(tokens)}")
            if tokens.ndim == 1:
                return self.tokenizer.decode(tokens.tolist())
            return [self.tokenizer.decode(row) for row in tokens.tolist()]
        single = tokens.ndim == 1
        tokens = tokens[None] if single else tokens
        self.check_tokens(tokens)
        pos = tokens.shape[1]
        n_cols = n_cols or int(round(pos ** 0.5))
        if n_cols < 1 or pos % n_cols:
            raise ValueError(f"n_cols: {pos} positions do not split into rows of {n_cols}; pass n_cols")
        tok = ValueTokenizer()
        values = tok.decode(tokens.cpu())
        texts = []
        for row_tokens, row_values in zip(tokens.cpu(), values):
            cells = ["?" if t == tok.mask_token_id else f"{v:.2f}"
                     for t, v in zip(row_tokens.tolist(), row_values.tolist())]
            width = max(len(c) for c in cells)
            lines = [" ".join(c.rjust(width) for c in cells[i:i + n_cols])
                     for i in range(0, pos, n_cols)]
            texts.append("\n".join(lines))
        return texts[0] if single or len(texts) == 1 else texts

    # ------------------------------------------------------------------ text
    def _need_tokenizer(self, what: str) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"{what} needs the model's tokenizer, and this model has none (a "
                             "model from HookedEncoder.from_pretrained has its checkpoint's; or "
                             "set model.tokenizer to a transformers tokenizer)")
        return self.tokenizer

    def _text_tokens(self, text: str | list[str], move_to_device: bool = True,
                     truncate: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        tokenizer = self._need_tokenizer("text input")
        enc = tokenizer(text, return_tensors="pt", padding=True, truncation=truncate,
                        max_length=self.cfg.n_ctx if truncate else None)
        tokens, mask = enc["input_ids"], enc["attention_mask"]
        types = enc.get("token_type_ids")
        types = torch.zeros_like(tokens) if types is None else types
        if move_to_device:
            tokens, types, mask = (t.to(self.device) for t in (tokens, types, mask))
        return tokens, types, mask

    def to_str_tokens(self, input: str | list[str] | Int[Tensor, "*batch pos"]
                      ) -> list[str] | list[list[str]]:
        """Each token as its tokenizer string (TransformerLens's ``to_str_tokens``): a string or
        ``[pos]`` ids give a list of strings; a list of strings or ``[batch, pos]`` ids give one
        list per row (padding included, as ``to_tokens`` pads).

        Example:
            >>> import tfmatcomp as tm
            >>> from transformers import BertTokenizerFast
            >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8,
            ...     d_mlp=16, n_ctx=8, d_vocab=30, head="masked_lm"))
            >>> words = "[PAD] [UNK] [CLS] [SEP] [MASK] the cat sat".split()
            >>> model.tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})
            >>> model.to_str_tokens("the [MASK] sat")
            ['[CLS]', 'the', '[MASK]', 'sat', '[SEP]']
        """
        tokenizer = self._need_tokenizer("to_str_tokens")
        if _is_text(input):
            tokens = self._text_tokens(input, move_to_device=False)[0]
            single = isinstance(input, str)
        else:
            tokens = torch.as_tensor(input)
            if tokens.ndim not in (1, 2):
                raise ValueError(f"input: expected [pos] or [batch, pos] ids, got {shape_text(tokens)}")
            single = tokens.ndim == 1
            tokens = tokens[None] if single else tokens
        rows = [tokenizer.convert_ids_to_tokens(row) for row in tokens.tolist()]
        return rows[0] if single else rows

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """The unembedding (masked-LM head only), TransformerLens's ``W_U``."""
        return self.unembed.W_U

    @property
    def b_U(self) -> Float[Tensor, "d_vocab"]:
        return self.unembed.b_U

    # --------------------------------------------------------- conversion
    @classmethod
    def from_pretrained(cls, name_or_path: Any, *, head: str | None = None,
                        trust_pickle: bool = False, dtype: torch.dtype = torch.float32,
                        device: torch.device | str | None = None, tokenizer: Any = "auto",
                        **hf_kwargs: Any) -> "HookedEncoder":
        """A real BERT, RoBERTa or DistilBERT, loaded by transformers' own loaders.

        See :func:`tfmatcomp.models.conversion.encoders.from_pretrained`.
        """
        from tfmatcomp.models.conversion.encoders import from_pretrained

        return from_pretrained(cls, name_or_path, head=head, trust_pickle=trust_pickle,
                               dtype=dtype, device=device, tokenizer=tokenizer, **hf_kwargs)

    @classmethod
    def from_hf(cls, bert: nn.Module, readout: nn.Linear | None = None, **overrides: Any) -> "HookedEncoder":
        """Build from a transformers ``BertModel`` (or a model with a ``.bert`` attribute).

        See :func:`tfmatcomp.models.conversion.bert.from_hf`.
        """
        from tfmatcomp.models.conversion.hf_mapping import build_from_hf

        return build_from_hf(cls, bert, readout, **overrides)

    def to_hf(self):
        """The equivalent ``(transformers.BertModel, nn.Linear read-out)``.

        See :func:`tfmatcomp.models.conversion.bert.to_hf`.
        """
        from tfmatcomp.models.conversion.hf_mapping import to_hf

        return to_hf(self)



class UncheckedForward(nn.Module):
    """``model``'s predictions without the token-value checks (which read tensor values: no
    ``torch.func.vmap``, and a host sync per call), for ``torch.func.functional_call`` with
    weights named ``"model.<parameter name>"``. Callers check the tokens themselves.

    Example:
        >>> import torch
        >>> from tfmatcomp import EncoderConfig
        >>> model = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> weights = {f"model.{n}": p.to(torch.bfloat16) for n, p in model.named_parameters()}
        >>> tokens = torch.ones(2, 4, dtype=torch.long)
        >>> torch.func.functional_call(UncheckedForward(model), weights, (tokens,)).dtype
        torch.bfloat16
    """

    def __init__(self, model: HookedEncoder):
        super().__init__()
        self.model = model

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos"]:
        return self.model._run(tokens)
