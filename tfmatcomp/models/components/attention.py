"""Multi-head self-attention (bidirectional, or causal for the decoder) with every intermediate
exposed as a HookPoint."""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Shaped
from torch import Tensor, nn
from tfmatcomp.models.components.hook_point import HookPoint, is_hooked

from tfmatcomp.config import DecoderConfig, EncoderConfig

__all__ = ["Attention", "future_mask", "padding_mask"]


def future_mask(n_query: int, n_key: int | None = None,
                device: torch.device | str | None = None) -> Bool[Tensor, "query_pos key_pos"]:
    """The causal mask: True where key ``j`` lies after query ``i``, the keys a causal head may
    not see (its scores there are ``-inf``, its pattern 0).

    The queries are the last ``n_query`` of ``n_key`` positions (``n_key`` defaults to
    ``n_query``), so key ``j`` is in the future of query ``i`` when ``j > i + n_key - n_query``.

    Example:
        >>> future_mask(3).int().tolist()
        [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
        >>> future_mask(1, 3).int().tolist()
        [[0, 0, 0]]
    """
    n_key = n_query if n_key is None else n_key
    return torch.ones(n_query, n_key, dtype=torch.bool, device=device).triu(n_key - n_query + 1)


def padding_mask(attention_mask: Shaped[Tensor, "batch key_pos"],
                 dtype: torch.dtype) -> Float[Tensor, "batch 1 1 key_pos"]:
    """The additive mask :class:`Attention` adds to its scores for a padding mask (1 = token,
    0 = padding): 0 at tokens, the most negative ``dtype`` number at padding (HuggingFace BERT's).

    Example:
        >>> padding_mask(torch.tensor([[1, 0]]), torch.float32).tolist() == [[[[0.0, torch.finfo(torch.float32).min]]]]
        True
    """
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class Attention(nn.Module):
    """Scaled dot-product attention, weights in TransformerLens layout.

    Parameters: ``W_Q, W_K, W_V [n_heads, d_model, d_head]``, ``b_Q, b_K, b_V [n_heads, d_head]``,
    ``W_O [n_heads, d_head, d_model]``, ``b_O [d_model]``.

    Hooks (an edit at any of them changes everything downstream, pattern edits included):
        hook_q, hook_k, hook_v: ``[batch, pos, n_heads, d_head]``.
        hook_attn_scores: ``[batch, n_heads, query_pos, key_pos]``, pre-softmax, after scaling by
            ``1/sqrt(d_head)`` and adding the (optional) padding mask; with ``causal=True`` the
            future keys (``key_pos > query_pos``) hold ``-inf`` (TransformerLens's convention).
        hook_pattern: ``[batch, n_heads, query_pos, key_pos]``, softmax probabilities.
        hook_z: ``[batch, pos, n_heads, d_head]``, ``pattern @ v`` per head, before ``W_O`` (the
            papers' "hidden state just after the attention head").
        hook_result: ``[batch, pos, n_heads, d_model]``, each head's ``z @ W_O`` (without
            ``b_O``; their sum plus ``b_O`` is the attention output). Computed, as in
            TransformerLens, only when ``use_attn_result`` is on (``model.set_use_attn_result``).
    """

    def __init__(self, cfg: EncoderConfig | DecoderConfig, causal: bool = False):
        super().__init__()
        self.causal = causal
        h, d, e = cfg.n_heads, cfg.d_model, cfg.d_head
        self.cfg = cfg
        self.W_Q = nn.Parameter(torch.empty(h, d, e))
        self.W_K = nn.Parameter(torch.empty(h, d, e))
        self.W_V = nn.Parameter(torch.empty(h, d, e))
        self.W_O = nn.Parameter(torch.empty(h, e, d))
        self.b_Q = nn.Parameter(torch.zeros(h, e))
        self.b_K = nn.Parameter(torch.zeros(h, e))
        self.b_V = nn.Parameter(torch.zeros(h, e))
        self.b_O = nn.Parameter(torch.zeros(d))
        self.scale = e ** -0.5
        self.fused = True  # use SDPA when no hook here is active (see HookedEncoder.unfused)
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model], with use_attn_result
        self.use_attn_result = False

    @staticmethod
    def _project(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
        # [batch, pos, d_model] @ [d_model, head * d_head] + bias as one flat row, then split heads
        # (the bias's gradient is then a sum over contiguous rows: 10-20 % of a bf16 CPU step).
        h, d, e = W.shape
        out = x @ W.permute(1, 0, 2).reshape(d, h * e) + b.reshape(h * e)
        return out.view(*x.shape[:-1], h, e)

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        additive_mask: Float[Tensor, "batch 1 1 key_pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        if self.fused and not self.use_attn_result and not any(is_hooked(hp) for hp in (
                self.hook_q, self.hook_k, self.hook_v, self.hook_attn_scores, self.hook_pattern,
                self.hook_z)):
            return self._fused(x, additive_mask)
        q = self.hook_q(self._project(x, self.W_Q, self.b_Q))
        k = self.hook_k(self._project(x, self.W_K, self.b_K))
        v = self.hook_v(self._project(x, self.W_V, self.b_V))
        scores = q.permute(0, 2, 1, 3) @ k.permute(0, 2, 3, 1) * self.scale
        if self.causal:
            scores = scores.masked_fill(self._future(x.shape[1], x.device), float("-inf"))
        if additive_mask is not None:
            scores = scores + additive_mask
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(torch.softmax(scores, dim=-1))
        z = self.hook_z((pattern @ v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3))
        h, e, d = self.W_O.shape
        if self.use_attn_result:  # per head: [batch, pos, head, d_head] x [head, d_head, d_model]
            result = self.hook_result(torch.einsum("bphe,hed->bphd", z, self.W_O))
            return result.sum(-2) + self.b_O
        return z.reshape(*z.shape[:2], h * e) @ self.W_O.reshape(h * e, d) + self.b_O

    def _fused(self, x: Tensor, additive_mask: Tensor | None) -> Tensor:
        """The same computation through ``scaled_dot_product_attention`` (used when no hook of this
        module is active, so no intermediate needs to be materialized)."""
        q, k, v = (self._project(x, W, b).transpose(1, 2) for W, b in (
            (self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V)))
        causal = self.causal and additive_mask is None  # SDPA takes a mask or is_causal, not both
        if self.causal and additive_mask is not None:
            additive_mask = additive_mask.masked_fill(self._future(x.shape[1], x.device),
                                                      float("-inf"))
        z = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask,
                                                             is_causal=causal, scale=self.scale)
        h, e, d = self.W_O.shape
        return z.transpose(1, 2).reshape(*x.shape[:2], h * e) @ self.W_O.reshape(h * e, d) + self.b_O

    @staticmethod
    def _future(n_pos: int, device: torch.device) -> Tensor:
        """``[query_pos, key_pos]`` boolean, True where the key lies after the query."""
        return future_mask(n_pos, device=device)
