"""Building blocks of :class:`tfmatcomp.HookedEncoder`, one idea per module (TransformerLens style)."""

from tfmatcomp.components.attention import Attention
from tfmatcomp.components.block import BertBlock
from tfmatcomp.components.embed import BertEmbed
from tfmatcomp.components.layer_norm import LayerNorm
from tfmatcomp.components.mlp import MLP
from tfmatcomp.components.readout import Readout

__all__ = ["Attention", "BertBlock", "BertEmbed", "LayerNorm", "MLP", "Readout"]
