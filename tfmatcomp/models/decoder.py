"""HookedDecoder: a pre-LN GPT-2-style decoder with TransformerLens's HookedTransformer hook names.

The whole forward pass, readable in one sitting::

    x = hook_embed(W_E[tokens]) + hook_pos_embed(W_pos[:pos])
    for block in blocks:                   # pre-LN blocks, causal attention
        x = block(x)                       # x + attn(ln1(x)), then x + mlp(ln2(x))
    logits = unembed(ln_final(x))          # [batch, pos, d_vocab]

It is built from the encoder's components (``Attention`` with ``causal=True``, ``LayerNorm``,
``MLP``) plus ``Embed``, ``PosEmbed``, ``PreLNBlock`` and ``Unembed`` (TransformerLens's ``W_U``,
``b_U``), and shares the encoder's hook plumbing
(:class:`~tfmatcomp.models.hooked_base.HookedBase`): ``run_with_hooks``, ``hooks``, ``unfused`` and
the checked hook names behave as on :class:`~tfmatcomp.HookedEncoder`.

The cache differs. ``run_with_cache`` returns TransformerLens's own ``ActivationCache``, and since
this model is pre-LN (every sub-layer adds into one residual stream, normalized only on the way
into the next sub-layer and into ``ln_final``), its residual helpers hold here and run unchanged:
``decompose_resid``, ``accumulated_resid`` (with ``apply_ln``), ``get_full_resid_decomposition``,
``apply_ln_to_stack``, ``logit_attrs`` and ``logit_lens``. For that the config carries
TransformerLens's flags (``cfg.normalization_type == "LN"``, ``cfg.attn_only == False``) and the
model TransformerLens's ``W_U``, ``b_U``, ``ln_final``, ``accumulated_bias`` and
``tokens_to_residual_directions``. (The post-LN encoder's cache refuses those helpers instead.)

Example:
    >>> import torch
    >>> from tfmatcomp import DecoderConfig, HookedDecoder
    >>> model = HookedDecoder(DecoderConfig(n_layers=2, n_heads=2, d_model=32, d_mlp=64, n_ctx=12,
    ...                                     d_vocab=20), seed=0)
    >>> tokens = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    >>> logits, cache = model.run_with_cache(tokens)
    >>> logits.shape, cache["blocks.1.attn.hook_pattern"].shape
    (torch.Size([3, 12, 20]), torch.Size([3, 2, 12, 12]))
    >>> parts, labels = cache.decompose_resid(return_labels=True)   # embeddings + every sub-layer
    >>> labels
    ['embed', 'pos_embed', '0_attn_out', '0_mlp_out', '1_attn_out', '1_mlp_out']
    >>> torch.allclose(parts.sum(0), cache["blocks.1.hook_resid_post"], atol=1e-6)
    True
    >>> lens = cache.accumulated_resid(apply_ln=True) @ model.W_U + model.b_U   # logit lens
    >>> lens.shape, torch.allclose(lens[-1], logits, atol=1e-5)
    (torch.Size([3, 3, 12, 20]), True)
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from tfmatcomp.models.components.hook_point import HookPoint

from tfmatcomp.models.components import Embed, LayerNorm, PosEmbed, PreLNBlock, Unembed
from tfmatcomp.config import DecoderConfig
from tfmatcomp.models.conversion.gpt2_mapping import build_from_gpt2, to_gpt2
from tfmatcomp.models.hooked_base import HookedBase
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.gpt import encode_sequence, gpt_vocab_size, sep_token_id, sequence_length
from tfmatcomp.task.tokenizer import ValueTokenizer
from tfmatcomp.validation import check_bool, check_choice, shape_text

__all__ = ["HookedDecoder", "RETURN_TYPES", "next_token_loss"]

#: What :meth:`HookedDecoder.forward` can return.
RETURN_TYPES = ("logits", "loss", "both", "hidden", None)


class HookedDecoder(HookedBase):
    """GPT-2-style decoder (pre-LN, causal, learned absolute positions, GELU, final LayerNorm,
    unembedding), with hooks at every activation.

    Args:
        cfg: the model's shape (see :class:`~tfmatcomp.config.DecoderConfig`).
        seed: seeds the weight initialization (HuggingFace GPT-2's: normal(0, init_range) for
            matrices and embeddings, normal(0, init_range / sqrt(2 n_layers)) for the two output
            projections ``W_O`` and ``W_out``, zero biases, unit LayerNorm; the unembedding
            ``W_U`` starts as ``W_E.T``, tied as in GPT-2, but is trained as a separate parameter).

    Hook names and shapes are TransformerLens's HookedTransformer's: ``hook_embed``,
    ``hook_pos_embed`` ``[batch, pos, d_model]``; per block ``blocks.{l}.hook_resid_pre``,
    ``blocks.{l}.ln1.hook_scale`` ``[batch, pos, 1]``, ``blocks.{l}.ln1.hook_normalized``,
    ``blocks.{l}.attn.hook_q|hook_k|hook_v|hook_z`` ``[batch, pos, head, d_head]``,
    ``blocks.{l}.attn.hook_attn_scores|hook_pattern`` ``[batch, head, query, key]`` (scores hold
    ``-inf`` at future keys), ``blocks.{l}.hook_attn_out``, ``blocks.{l}.hook_resid_mid``,
    ``blocks.{l}.ln2.*``, ``blocks.{l}.mlp.hook_pre|hook_post`` ``[batch, pos, d_mlp]``,
    ``blocks.{l}.hook_mlp_out``, ``blocks.{l}.hook_resid_post``; and ``ln_final.hook_scale|
    hook_normalized``.
    """

    cfg_class = DecoderConfig

    def __init__(self, cfg: DecoderConfig, seed: int = 0):
        super().__init__(cfg, seed)
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.pos_embed = PosEmbed(cfg)
        self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([PreLNBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.unembed = Unembed(cfg.d_model, cfg.d_vocab)
        self.init_weights(torch.Generator().manual_seed(seed))
        self.setup()

    # :meth:`init_weights` as HuggingFace GPT-2 does
    def init_divisor(self, name: str) -> float | None:
        """``sqrt(2 * n_layers)`` for the residual-path projections ``W_O``, ``W_out`` (GPT-2's
        ``c_proj``), None for the tied ``unembed.W_U`` (:meth:`init_own_weights`), else 1."""
        if name == "unembed.W_U":
            return None
        if name.rsplit(".", 1)[-1] in ("W_O", "W_out"):
            return math.sqrt(2 * self.cfg.n_layers)
        return 1.0

    @torch.no_grad()
    def init_own_weights(self, generator: torch.Generator) -> None:
        """Tie the unembedding to the token embedding: ``W_U = W_E.T``."""
        self.unembed.W_U.copy_(self.embed.W_E.T)

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        return_type: Literal["logits", "loss", "both", "hidden", None] = "logits",
    ) -> Float[Tensor, "batch pos d_vocab"] | Float[Tensor, ""] | tuple | None:
        """Run the decoder.

        Args:
            tokens: token ids ``[batch, pos]`` with ``pos <= n_ctx``.
            return_type: ``"logits"`` (``[batch, pos, d_vocab]``), ``"loss"`` (mean next-token
                cross-entropy, a scalar), ``"both"`` (``(logits, loss)``), ``"hidden"`` (the last
                block's output before ``ln_final``, ``[batch, pos, d_model]``) or None.
        """
        self.check_tokens(tokens)
        check_choice("return_type", return_type, RETURN_TYPES)
        x = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(self.pos_embed(tokens))
        for block in self.blocks:
            x = block(x)
        if return_type == "hidden":
            return x
        logits = self.unembed(self.ln_final(x))
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        loss = next_token_loss(logits, tokens)
        return loss if return_type == "loss" else (logits, loss)

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.pos_embed.W_pos

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """The unembedding matrix, ``unembed.W_U`` (the parameter itself, as in TransformerLens)."""
        return self.unembed.W_U

    @property
    def b_U(self) -> Float[Tensor, "d_vocab"]:
        """The unembedding bias, ``unembed.b_U`` (the parameter itself)."""
        return self.unembed.b_U

    # ------------------------------------------- TransformerLens's model surface
    def accumulated_bias(self, layer: int, mlp_input: bool = False,
                         include_mlp_biases: bool = True) -> Float[Tensor, "d_model"]:
        """TransformerLens's ``accumulated_bias``: the sum of the output biases that the residual
        stream holds at the input of block ``layer``: ``b_O`` and (with ``include_mlp_biases``)
        ``b_out`` of every block before it, plus ``b_O`` of block ``layer`` itself with
        ``mlp_input`` (the MLP's input). ``layer = n_layers`` is the input of ``ln_final``.
        ``get_full_resid_decomposition`` adds it as its ``"bias"`` component.

        Raises:
            ValueError: ``layer`` outside ``[0, n_layers]``, or ``n_layers`` with ``mlp_input``.

        Example:
            >>> import torch, tfmatcomp as tm
            >>> m = tm.HookedDecoder(tm.DecoderConfig(n_layers=2, n_heads=2, d_model=8, d_mlp=16,
            ...                                       n_ctx=4, d_vocab=10))
            >>> with torch.no_grad():
            ...     _ = m.blocks[0].attn.b_O.fill_(1.0), m.blocks[0].mlp.b_out.fill_(2.0)
            >>> m.accumulated_bias(1)[0].item(), m.accumulated_bias(1, include_mlp_biases=False)[0].item()
            (3.0, 1.0)
        """
        n_layers = self.cfg.n_layers
        check_bool("mlp_input", mlp_input)
        check_bool("include_mlp_biases", include_mlp_biases)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n_layers:
            raise ValueError(f"layer: expected an int in [0, {n_layers}] (n_layers is the input of "
                             f"ln_final), got {layer!r}")
        if mlp_input and layer == n_layers:
            raise ValueError(f"mlp_input: must be False for layer={n_layers} (there is no block "
                             f"{n_layers}; that layer is the input of ln_final)")
        bias = torch.zeros(self.cfg.d_model, device=self.device, dtype=self.dtype)
        for block in self.blocks[:layer]:
            bias = bias + block.attn.b_O
            if include_mlp_biases:
                bias = bias + block.mlp.b_out
        if mlp_input:
            bias = bias + self.blocks[layer].attn.b_O
        return bias

    def tokens_to_residual_directions(
        self, tokens: str | int | Int[Tensor, "*tokens"],
    ) -> Float[Tensor, "*tokens d_model"]:
        """TransformerLens's ``tokens_to_residual_directions``: the unembedding direction
        ``W_U[:, t]`` of each token (what ``logit_attrs`` projects onto). A string, an int or a
        one-element tensor gives ``[d_model]``; a tensor of several ids gives its shape plus
        ``d_model``. As in TransformerLens, ``ln_final``'s gain and bias are not folded in.

        Raises:
            ValueError: a token id outside ``[0, d_vocab)``, a non-integer tensor, a string that is
                not one token (see :meth:`to_single_token`).

        Example:
            >>> import torch, tfmatcomp as tm
            >>> m = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16,
            ...                                       n_ctx=4, d_vocab=10))
            >>> m.tokens_to_residual_directions(3).shape, m.tokens_to_residual_directions(torch.tensor([[1, 2]])).shape
            (torch.Size([8]), torch.Size([1, 2, 8]))
        """
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            tokens = torch.tensor(tokens)
        if not torch.is_tensor(tokens) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            what = tokens.dtype if torch.is_tensor(tokens) else type(tokens).__name__
            raise ValueError(f"tokens: expected a token string, an int or an integer tensor, got {what}")
        d_vocab = self.cfg.d_vocab
        if tokens.numel() == 0 or tokens.min() < 0 or tokens.max() >= d_vocab:
            raise ValueError(f"tokens: ids must lie in [0, {d_vocab - 1}] (and be at least one), "
                             f"got {tokens.tolist()!r:.80}")
        if tokens.numel() == 1:
            return self.W_U[:, int(tokens.item())]
        return self.W_U[:, tokens.to(self.W_U.device)].movedim(0, -1)

    # ----------------------------------------------- matrices <-> tokens <-> text
    def _check_matrix_vocabulary(self, method: str) -> ValueTokenizer:
        """The papers' tokenizer, after checking that this decoder's vocabulary is its GPT one."""
        tokenizer = ValueTokenizer()
        if self.cfg.d_vocab != gpt_vocab_size(tokenizer):
            raise ValueError(
                f"{method}: this decoder's d_vocab is {self.cfg.d_vocab}; {method} uses the "
                f"matrix-completion vocabulary (MASK 0, values 1..{tokenizer.vocab_size - 1}, "
                f"[SEP] {sep_token_id(tokenizer)}: d_vocab {gpt_vocab_size(tokenizer)})")
        return tokenizer

    def to_tokens(self, matrices: Float[Tensor, "*batch n_rows n_cols"],
                  observed: Bool[Tensor, "*batch n_rows n_cols"] | None = None
                  ) -> Int[Tensor, "batch seq"]:
        """TransformerLens's ``to_tokens`` for this decoder: the token ids that it reads for
        ``matrices`` (``[batch, n_rows, n_cols]`` or one ``[n_rows, n_cols]``), the papers' GPT
        sequence of :func:`tfmatcomp.task.gpt.encode_sequence`: the matrix row-major with MASK
        where ``observed`` is False (default: everything observed), ``[SEP]``, then every entry,
        ``[batch, 2 n_rows n_cols + 1]``, on the model's device.

        Raises:
            ValueError: ``matrices`` not 2-d or 3-d or with values outside ``[-10, 10]``;
                ``observed`` not a bool tensor of the same shape; a sequence longer than ``n_ctx``;
                a decoder whose ``d_vocab`` is not the matrix vocabulary's 2003.

        Example:
            >>> import torch, tfmatcomp as tm
            >>> model = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16,
            ...                                           d_mlp=32, n_ctx=9))
            >>> x = torch.tensor([[0.5, -0.25], [0.0, 1.0]])
            >>> tokens = model.to_tokens(x, observed=torch.tensor([[1, 1], [0, 1]]).bool())
            >>> tokens.tolist()
            [[1051, 976, 0, 1101, 2002, 1051, 976, 1001, 1101]]
            >>> print(model.to_string(tokens))
             0.50 -0.25
                ?  1.00
            [SEP]
             0.50 -0.25
             0.00  1.00
        """
        self._check_matrix_vocabulary("to_tokens")
        matrices, observed = self._with_batch_axis(matrices, observed)
        b, n_rows, n_cols = matrices.shape
        length = sequence_length(n_rows * n_cols)
        if length > self.cfg.n_ctx:
            raise ValueError(f"matrices: {n_rows}x{n_cols} needs a sequence of {length} tokens "
                             f"(2 n_rows n_cols + 1), the model has n_ctx {self.cfg.n_ctx}")
        observed = (torch.ones(b, n_rows, n_cols, dtype=torch.bool, device=matrices.device)
                    if observed is None else torch.as_tensor(observed))
        if observed.dtype != torch.bool or observed.shape != matrices.shape:
            raise ValueError(f"observed: expected a bool tensor of shape {tuple(matrices.shape)}, "
                             f"got {observed.dtype} {tuple(observed.shape)}")
        batch = MatrixBatch.from_values(matrices.reshape(b, -1).float(),
                                        observed.reshape(b, -1).to(matrices.device), n_rows, n_cols)
        return encode_sequence(batch).to(self.device)

    def to_string(self, tokens: Int[Tensor, "*batch pos"], n_cols: int | None = None
                  ) -> str | list[str]:
        """TransformerLens's ``to_string`` for this decoder: each sequence of token ids as text, the
        part before the first ``[SEP]`` as a matrix (``?`` for MASK), a ``[SEP]`` line, then the
        entries after it in rows of the same width (the last row may be partial, as in a greedy
        completion under way). Values print with two decimals, as the tokenizer's grid;
        :meth:`to_single_token` reads each cell back. ``n_cols`` defaults to the square side of the
        part before ``[SEP]``. One string for ``[pos]`` (or a batch of one), a list for a batch.

        Raises:
            ValueError: tokens that are not ``[pos]`` or ``[batch, pos]`` valid ids of this model; a
                part before ``[SEP]`` that does not split into rows of ``n_cols``; a decoder whose
                ``d_vocab`` is not the matrix vocabulary's.

        Example:
            >>> import torch, tfmatcomp as tm
            >>> model = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16,
            ...                                           d_mlp=32, n_ctx=9))
            >>> print(model.to_string(torch.tensor([1051, 0, 0, 1101, 2002, 1051, 976])))
            0.50    ?
               ?  1.00
            [SEP]
            0.50 -0.25
        """
        tok = self._check_matrix_vocabulary("to_string")
        tokens = torch.as_tensor(tokens)
        single = tokens.ndim == 1
        tokens = tokens[None] if single else tokens
        self.check_tokens(tokens)
        sep = sep_token_id(tok)
        texts = []
        for row in tokens.cpu():
            ids = row.tolist()
            n_prompt = ids.index(sep) if sep in ids else len(ids)
            cols = n_cols if n_cols is not None else int(round(n_prompt ** 0.5))
            if isinstance(cols, bool) or not isinstance(cols, int) or cols < 1 or n_prompt % cols:
                raise ValueError(f"n_cols: the {n_prompt} tokens before [SEP] do not split into rows "
                                 f"of {cols!r}; pass n_cols, a positive int dividing {n_prompt}")
            cells = [self._token_text(i, tok) for i in ids]
            prompt, rest = cells[:n_prompt], cells[n_prompt + 1:]
            width = max((len(c) for c in prompt + rest), default=0)

            def rows(part: list[str]) -> list[str]:
                return [" ".join(c.rjust(width) for c in part[i:i + cols])
                        for i in range(0, len(part), cols)]

            lines = rows(prompt) + (["[SEP]"] + rows(rest) if n_prompt < len(ids) else [])
            texts.append("\n".join(lines))
        return texts[0] if single or len(texts) == 1 else texts

    @staticmethod
    def _token_text(token_id: int, tok: ValueTokenizer) -> str:
        """One token as :meth:`to_string` prints it: ``?`` (MASK), ``[SEP]`` or the value."""
        if token_id == tok.mask_token_id:
            return "?"
        if token_id == sep_token_id(tok):
            return "[SEP]"
        return f"{(token_id - 1) / tok.scale + tok.v_min:.2f}"

    def to_single_token(self, string: str) -> int:
        """TransformerLens's ``to_single_token``: the id of the one token that ``string`` is, as
        :meth:`to_string` prints tokens: ``"?"`` (MASK, 0), ``"[SEP]"`` (2002) or a value on the
        tokenizer's grid (``"-10.00"`` .. ``"10.00"`` in steps of 0.01, e.g. ``"0.44"``). Used by
        ``logit_attrs`` and the logit lens when given tokens as strings.

        Raises:
            ValueError: a string that is none of these (not a number, off the grid, out of range);
                a decoder whose ``d_vocab`` is not the matrix vocabulary's.

        Example:
            >>> import tfmatcomp as tm
            >>> model = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16,
            ...                                           d_mlp=32, n_ctx=9))
            >>> model.to_single_token("0.44"), model.to_single_token("?"), model.to_single_token("[SEP]")
            (1045, 0, 2002)
        """
        tok = self._check_matrix_vocabulary("to_single_token")
        if not isinstance(string, str):
            raise ValueError(f"string: expected a str, got {type(string).__name__}")
        if string == "?":
            return tok.mask_token_id
        if string == "[SEP]":
            return sep_token_id(tok)
        try:
            value = float(string)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not tok.v_min <= value <= tok.v_max:
            raise ValueError(f"string: {string!r} is not one token: expected '?', '[SEP]' or a value "
                             f"in [{tok.v_min:.2f}, {tok.v_max:.2f}]")
        token_id = int(tok.encode(torch.tensor(value, dtype=torch.float64)))
        if abs((token_id - 1) / tok.scale + tok.v_min - value) > 1e-9:
            raise ValueError(f"string: {string!r} is not one token: the value is off the grid "
                             f"(steps of {1 / tok.scale:g}; nearest {self._token_text(token_id, tok)})")
        return token_id

    # --------------------------------------------------------- conversion
    @classmethod
    def from_hf(cls, gpt2: nn.Module, **overrides: Any) -> "HookedDecoder":
        """Build from a transformers ``GPT2LMHeadModel`` (or ``GPT2Model``).

        See :func:`tfmatcomp.models.conversion.gpt2_mapping.build_from_gpt2`.
        """
        return build_from_gpt2(cls, gpt2, **overrides)

    def to_hf(self):
        """The equivalent ``transformers.GPT2LMHeadModel`` (eager attention, no dropout).

        See :func:`tfmatcomp.models.conversion.gpt2_mapping.to_gpt2`.
        """
        return to_gpt2(self)


def next_token_loss(logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"],
                    weights: Float[Tensor, "batch pos"] | None = None) -> Float[Tensor, ""]:
    """Mean cross-entropy of predicting ``tokens[:, 1:]`` from ``logits[:, :-1]``; with
    ``weights``, the mean over the targets they select (``weights[:, t]`` weighs the prediction of
    ``tokens[:, t]``; ``weights[:, 0]`` is unused).

    Example:
        >>> import torch
        >>> round(next_token_loss(torch.zeros(1, 3, 4), torch.tensor([[0, 1, 2]])).item(), 4)
        1.3863
        >>> round(next_token_loss(torch.zeros(1, 3, 4), torch.tensor([[0, 1, 2]]),
        ...                       torch.tensor([[0., 0., 1.]])).item(), 4)
        1.3863

    Raises:
        ValueError: a sequence shorter than 2 tokens (nothing to predict); ``weights`` of another
            shape than ``tokens``, negative or not finite, or zero at every target.
    """
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens: need [batch, pos] with pos >= 2 (a next token to predict), got "
                         f"shape {tuple(tokens.shape)}")
    if weights is None:
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    if not torch.is_tensor(weights) or weights.shape != tokens.shape:
        raise ValueError(f"weights: expected shape {tuple(tokens.shape)} (as tokens), got "
                         f"{shape_text(weights)}")
    w = weights[:, 1:].flatten()
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("weights: must be finite and >= 0")
    if not bool((w > 0).any()):
        raise ValueError("weights: are zero at every target (weights[:, 1:]); nothing to average")
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    w = w.to(ce.dtype)
    return (ce * w).sum() / w.sum()
