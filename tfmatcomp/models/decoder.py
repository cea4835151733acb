"""HookedDecoder: a pre-LN GPT-2-style decoder with TransformerLens's HookedTransformer hook names.

The whole forward pass, readable in one sitting::

    x = hook_embed(W_E[tokens]) + hook_pos_embed(W_pos[:pos])
    for block in blocks:                   # pre-LN blocks, causal attention
        x = block(x)                       # x + attn(ln1(x)), then x + mlp(ln2(x))
    logits = unembed(ln_final(x))          # [batch, pos, d_vocab]

It is built from the encoder's components (``Attention`` with ``causal=True``, ``LayerNorm``,
``MLP``, ``Readout`` as the unembedding) and shares its hook plumbing
(:class:`~tfmatcomp.models.hooked_base.HookedBase`): ``run_with_cache``, ``run_with_hooks``, ``hooks``,
``unfused`` behave exactly as on :class:`~tfmatcomp.HookedEncoder`.

Example:
    >>> import torch
    >>> from tfmatcomp import DecoderConfig, HookedDecoder
    >>> model = HookedDecoder(DecoderConfig(n_layers=2, n_heads=2, d_model=32, d_mlp=64, n_ctx=12,
    ...                                     d_vocab=20), seed=0)
    >>> tokens = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    >>> logits, cache = model.run_with_cache(tokens)
    >>> logits.shape, cache["blocks.1.attn.hook_pattern"].shape
    (torch.Size([3, 12, 20]), torch.Size([3, 2, 12, 12]))
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from tfmatcomp.models.components.hook_point import HookPoint

from tfmatcomp.models.components import Embed, LayerNorm, PosEmbed, PreLNBlock, Readout
from tfmatcomp.config import DecoderConfig
from tfmatcomp.models.conversion.gpt2_mapping import build_from_gpt2, to_gpt2
from tfmatcomp.models.hooked_base import HookedBase
from tfmatcomp.validation import check_choice

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
            projections ``W_O`` and ``W_out``, zero biases, unit LayerNorm; the unembedding starts
            as ``W_E.T``, tied as in GPT-2, but is trained as a separate parameter).

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
        self.unembed = Readout(cfg.d_model, cfg.d_vocab)
        self.init_weights(torch.Generator().manual_seed(seed))
        self.setup()

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """Re-initialize every parameter from ``generator`` (CPU), as HuggingFace GPT-2 does."""
        std = self.cfg.init_range
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "w":  # LayerNorm weight
                p.fill_(1.0)
            elif leaf.startswith("b"):  # biases, LayerNorm bias, b_U
                p.zero_()
            elif leaf in ("W_O", "W_out"):  # the residual-path projections (GPT-2's c_proj)
                p.copy_(torch.randn(p.shape, generator=generator) * std
                        / math.sqrt(2 * self.cfg.n_layers))
            elif name != "unembed.W":
                p.copy_(torch.randn(p.shape, generator=generator) * std)
        self.unembed.W.copy_(self.embed.W_E.T)

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
        return self.unembed.W

    @property
    def b_U(self) -> Float[Tensor, "d_vocab"]:
        return self.unembed.b

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
        shape = tuple(weights.shape) if torch.is_tensor(weights) else type(weights).__name__
        raise ValueError(f"weights: expected shape {tuple(tokens.shape)} (as tokens), got {shape}")
    w = weights[:, 1:].flatten()
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("weights: must be finite and >= 0")
    if not bool((w > 0).any()):
        raise ValueError("weights: are zero at every target (weights[:, 1:]); nothing to average")
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    w = w.to(ce.dtype)
    return (ce * w).sum() / w.sum()
