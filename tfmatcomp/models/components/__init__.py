"""Building blocks of :class:`tfmatcomp.HookedEncoder` and :class:`tfmatcomp.HookedDecoder`, one
idea per module (TransformerLens style)."""

from tfmatcomp.components.attention import Attention
from tfmatcomp.components.block import BertBlock
from tfmatcomp.components.decoder_embed import Embed, PosEmbed
from tfmatcomp.components.embed import BertEmbed
from tfmatcomp.components.layer_norm import LayerNorm
from tfmatcomp.components.mlp import MLP
from tfmatcomp.components.pre_ln_block import PreLNBlock
from tfmatcomp.components.readout import Readout

__all__ = ["Attention", "BertBlock", "BertEmbed", "Embed", "LayerNorm", "MLP", "PosEmbed",
           "PreLNBlock", "Readout"]
