"""One pre-LN GPT-2 block (LN1, causal attention, residual, LN2, MLP, residual)."""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor, nn
from tfmatcomp.models.components.hook_point import HookPoint

from tfmatcomp.models.components.attention import Attention
from tfmatcomp.models.components.layer_norm import LayerNorm
from tfmatcomp.models.components.mlp import MLP
from tfmatcomp.config import DecoderConfig


class PreLNBlock(nn.Module):
    """Pre-LN block, GPT-2's (and TransformerLens's HookedTransformer's) order::

        resid_mid  = resid_pre + attn(ln1(resid_pre))      # causal attention
        resid_post = resid_mid + mlp(ln2(resid_mid))

    Hooks (all ``[batch, pos, d_model]``): hook_resid_pre, hook_attn_out, hook_resid_mid,
    hook_mlp_out, hook_resid_post; plus those of ``ln1``, ``attn``, ``ln2`` and ``mlp``.

    Example:
        >>> import torch
        >>> from tfmatcomp.config import DecoderConfig
        >>> block = PreLNBlock(DecoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> block(torch.zeros(3, 4, 8)).shape
        torch.Size([3, 4, 8])
    """

    #: TransformerLens's flag (its logit lens refuses blocks without it): ``hook_resid_post`` is the
    #: one ``[batch, pos, d_model]`` residual stream that the next block (or ``ln_final``) reads.
    hook_out_is_single_residual_stream: bool = True

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.ln1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.attn = Attention(cfg, causal=True)
        self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, resid_pre: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid_pre)))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)
