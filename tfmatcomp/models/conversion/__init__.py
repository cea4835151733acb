"""Conversion between the hooked models and HuggingFace ``transformers`` models.

* :mod:`~tfmatcomp.models.conversion.bert`: :class:`HookedEncoder` <-> ``BertModel``;
* :mod:`~tfmatcomp.models.conversion.hf_mapping`: the BERT weight-name mapping;
* :mod:`~tfmatcomp.models.conversion.gpt2_mapping`: GPT-2 -> :class:`HookedDecoder`.
"""
