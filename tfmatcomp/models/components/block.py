"""One post-LN BERT block (attention, residual, LN1, MLP, residual, LN2)."""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor, nn
from tfmatcomp.models.components.hook_point import HookPoint

from tfmatcomp.models.components.attention import Attention
from tfmatcomp.models.components.layer_norm import LayerNorm
from tfmatcomp.models.components.mlp import MLP
from tfmatcomp.config import EncoderConfig


class BertBlock(nn.Module):
    """Post-LN block, exactly HuggingFace BERT's order::

        resid_mid  = resid_pre + attn(resid_pre)
        x          = ln1(resid_mid)           # hook_normalized_resid_mid, the MLP input
        resid_post = x + mlp(x)
        out        = ln2(resid_post)          # hook_normalized_resid_post, the next resid_pre

    Hooks (all ``[batch, pos, d_model]``): hook_resid_pre, hook_attn_out, hook_resid_mid,
    hook_normalized_resid_mid, hook_mlp_out, hook_resid_post, hook_normalized_resid_post; plus
    those of ``attn``, ``ln1``, ``mlp`` and ``ln2``. ``ln1.hook_normalized`` and
    ``ln2.hook_normalized`` are the LayerNorms' values *before* their gain and bias (as in
    TransformerLens); ``hook_normalized_resid_mid`` / ``hook_normalized_resid_post`` are the full
    LayerNorm outputs, after them.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.attn = Attention(cfg)
        self.ln1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_normalized_resid_mid = HookPoint()  # [batch, pos, d_model], ln1's output
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]
        self.hook_normalized_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        additive_mask: Float[Tensor, "batch 1 1 key_pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(resid_pre, additive_mask))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        x = self.hook_normalized_resid_mid(self.ln1(resid_mid))
        mlp_out = self.hook_mlp_out(self.mlp(x))
        resid_post = self.hook_resid_post(x + mlp_out)
        return self.hook_normalized_resid_post(self.ln2(resid_post))
