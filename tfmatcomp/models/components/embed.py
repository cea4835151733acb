"""BERT embeddings: token + learned absolute position (+ optional token type), then LayerNorm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from tfmatcomp.models.components.hook_point import HookPoint

from tfmatcomp.models.components.layer_norm import LayerNorm
from tfmatcomp.config import EncoderConfig


class BertEmbed(nn.Module):
    """``LN(W_E[tokens] + W_pos[positions] (+ W_token_type[token_type_ids]))``.

    With ``cfg.learned_mask_embedding=False`` (the papers' setting) the MASK row of ``W_E`` starts
    at zero and gets no gradient (as ``nn.Embedding(padding_idx=MASK)`` in HuggingFace BERT), so a
    masked position carries only its positional embedding.

    Hooks:
        hook_embed: ``[batch, pos, d_model]`` token embeddings.
        hook_pos_embed: ``[batch, pos, d_model]`` positional embeddings.
        hook_token_type_embed: ``[batch, pos, d_model]`` (only when ``n_token_types > 0``).
        ln.hook_scale / ln.hook_normalized: the embedding LayerNorm's divisor and its normalized
            value before the gain and bias (TransformerLens's meaning); the LayerNorm's output,
            after them, is the model's ``hook_full_embed``.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
        self.W_token_type = (nn.Parameter(torch.empty(cfg.n_token_types, cfg.d_model))
                             if cfg.n_token_types else None)
        self.padding_idx = None if cfg.learned_mask_embedding else cfg.mask_token_id
        self.ln = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_token_type_embed = HookPoint()  # [batch, pos, d_model]

    def token_embed(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """``W_E[tokens]``, the value of ``hook_embed`` (also used by weight edits in hook form to
        embed recovered token ids with a substituted ``W_E``)."""
        return F.embedding(tokens, self.W_E, padding_idx=self.padding_idx)

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        token_type_ids: Int[Tensor, "batch pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        n_pos = tokens.shape[1]
        x = self.hook_embed(self.token_embed(tokens))
        pos = self.hook_pos_embed(self.W_pos[:n_pos].unsqueeze(0).expand(tokens.shape[0], -1, -1))
        x = x + pos
        if self.W_token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(tokens)
            x = x + self.hook_token_type_embed(F.embedding(token_type_ids, self.W_token_type))
        return self.ln(x)
