"""Building blocks of :class:`tfmatcomp.HookedEncoder` and :class:`tfmatcomp.HookedDecoder`, one
idea per module (TransformerLens style)."""

from tfmatcomp.models.components.attention import Attention
from tfmatcomp.models.components.block import BertBlock
from tfmatcomp.models.components.decoder_embed import Embed, PosEmbed
from tfmatcomp.models.components.embed import BertEmbed
from tfmatcomp.models.components.layer_norm import LayerNorm
from tfmatcomp.models.components.mlm_head import BertMLMHead, MLMUnembed
from tfmatcomp.models.components.mlp import MLP
from tfmatcomp.models.components.pre_ln_block import PreLNBlock
from tfmatcomp.models.components.readout import Readout, Unembed

__all__ = ["Attention", "BertBlock", "BertMLMHead", "MLMUnembed", "BertEmbed", "Embed", "LayerNorm", "MLP", "PosEmbed",
           "PreLNBlock", "Readout", "Unembed"]
