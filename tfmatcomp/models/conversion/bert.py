"""Conversion between :class:`HookedEncoder` and HuggingFace ``transformers.BertModel``.

The mapping is exact (a pure re-layout of the same numbers, one table in
:mod:`tfmatcomp.models.conversion.hf_mapping`), so round trips are bit-identical and outputs agree with
``BertModel`` (eager attention) to float rounding.

Example:
    >>> import torch
    >>> from transformers import BertConfig, BertModel
    >>> from tfmatcomp import HookedEncoder
    >>> bert = BertModel(BertConfig(vocab_size=2002, hidden_size=32, num_hidden_layers=2,
    ...     num_attention_heads=4, intermediate_size=64, max_position_embeddings=16,
    ...     type_vocab_size=1, pad_token_id=0, hidden_dropout_prob=0.0,
    ...     attention_probs_dropout_prob=0.0), add_pooling_layer=False)
    >>> model = HookedEncoder.from_hf(bert)
    >>> bert2, readout = model.to_hf()
    >>> model.cfg.n_layers, type(bert2).__name__
    (2, 'BertModel')
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tfmatcomp.models.conversion.hf_mapping import build_from_hf, config_from_hf, config_to_hf, to_hf
from tfmatcomp.models.encoder import HookedEncoder

__all__ = ["from_hf", "to_hf", "config_from_hf", "config_to_hf"]


def from_hf(bert: nn.Module, readout: nn.Linear | None = None, **overrides: Any) -> HookedEncoder:
    """Build a :class:`HookedEncoder` holding the same weights as a transformers ``BertModel``
    (:func:`tfmatcomp.models.conversion.hf_mapping.build_from_hf`).

    Args:
        bert: a ``BertModel``, or a model with a ``.bert`` attribute (e.g. ``BertForMaskedLM``;
            its heads are ignored). The pooler, if any, is ignored.
        readout: an ``nn.Linear(d_model, d_out)`` read-out; when None the model gets a freshly
            initialized read-out (seeded, see :class:`HookedEncoder`).
        overrides: :class:`EncoderConfig` fields to override (e.g. ``d_out``).
    """
    return build_from_hf(HookedEncoder, bert, readout, **overrides)
