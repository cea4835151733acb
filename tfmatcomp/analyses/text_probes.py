"""Probes and the position / context / residual decomposition on text, for real encoders.

The papers probe each layer's hidden states with affine least squares and split them into
``mean + pos + ctx + resid``; here the same tools (:func:`~tfmatcomp.analyses.probes.fit_linear_probe`,
:func:`~tfmatcomp.geometry.summary.summary_table`) run on a
:class:`~tfmatcomp.experiments.masked_lm.TextBatch` (one data path, :func:`~tfmatcomp.experiments.masked_lm.mask_text`).

Layer convention as everywhere in the library: layer 0 is ``hook_full_embed``, layer ``l`` the
output of block ``l - 1`` (``blocks.{l-1}.hook_normalized_resid_post``).

* :func:`text_hidden_states`: every layer's hidden states of a batch.
* :func:`probe_text`: per layer, R² of an affine probe for the token's **position** (its index
  in the text) at the real tokens, and for the **hidden token** at the masked ones (its input
  embedding ``W_E[original id]``, which is also the unembedding column of a tied masked-LM
  head). Train / test split by text.
* :func:`decomposition_text`: per layer, :func:`~tfmatcomp.geometry.summary.summary_table` of
  the hidden states over the positions every text covers, ``[CLS]`` dropped (the positional
  component's rank estimate, stable rank and relative norm, ...).

Example:
    >>> import tfmatcomp as tm
    >>> from transformers import BertTokenizerFast
    >>> from tfmatcomp.experiments.masked_lm import mask_text
    >>> words = "[PAD] [UNK] [CLS] [SEP] [MASK] the cat sat on a mat".split()
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32,
    ...                          n_ctx=16, d_vocab=len(words), head="masked_lm"))
    >>> model.tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})
    >>> batch = mask_text(model, ["the cat sat on a mat"] * 8, fraction=0.3, seed=0)
    >>> probe_text(model, batch)["layer"].tolist()
    [0, 1, 2]
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp.analyses.probes import fit_linear_probe, probe_metrics, split_matrices
from tfmatcomp.experiments.masked_lm import TextBatch
from tfmatcomp.models.hook_names import resid_name

__all__ = ["text_hidden_states", "probe_text", "decomposition_text"]


def text_hidden_states(model: Any, batch: TextBatch) -> list[Float[Tensor, "batch pos d_model"]]:
    """Hidden states after ``0..n_layers`` layers (float64, CPU), one ``[batch, pos, d_model]``
    tensor per layer."""
    names = [resid_name(l, model.cfg.n_layers, at="layer_output") for l in range(model.cfg.n_layers + 1)]
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens, **batch.model_kwargs(),
                                        return_type=None, names_filter=lambda n: n in names)
    return [cache[n].detach().to("cpu", torch.float64) for n in names]


def probe_text(model: Any, batch: TextBatch, ridge: float = 1e-3, test_fraction: float = 0.25,
               seed: int = 0) -> pd.DataFrame:
    """Per layer: ``r2_position`` (affine probe for the token's index, real tokens) and
    ``r2_hidden_token`` (affine probe for ``W_E[original id]`` at the masked tokens; NaN with
    too few masked tokens), each fitted on the training texts and scored on the held-out texts
    (split from ``torch.Generator().manual_seed(seed)``)."""
    train, test = split_matrices(batch.tokens.shape[0], test_fraction,
                                 torch.Generator().manual_seed(seed))
    is_train = torch.zeros(batch.tokens.shape[0], dtype=torch.bool)
    is_train[train] = True
    rows_train = is_train[:, None].expand_as(batch.tokens)
    real = (batch.labels != -100).cpu()
    index = torch.arange(batch.tokens.shape[1], dtype=torch.float64).expand(batch.tokens.shape)
    target_token = model.W_E.detach().to("cpu", torch.float64)[batch.labels.clamp_min(0).cpu()]
    rows = []
    for layer, h in enumerate(text_hidden_states(model, batch)):
        row: dict[str, Any] = {"layer": layer}
        row["r2_position"] = _r2(h, index[..., None], real, rows_train, ridge)
        row["r2_hidden_token"] = _r2(h, target_token, batch.masked.cpu(), rows_train, ridge)
        rows.append(row)
    return pd.DataFrame(rows)


def _r2(h: Tensor, target: Tensor, where: Tensor, rows_train: Tensor, ridge: float) -> float:
    fit, score = where & rows_train, where & ~rows_train
    if fit.sum() < 2 or score.sum() < 2:
        return float("nan")
    probe = fit_linear_probe(h[fit], target[fit], ridge=ridge)
    return probe_metrics(probe.predict(h[score]), target[score])["r2"]


def decomposition_text(model: Any, batch: TextBatch, drop_first: int = 1) -> pd.DataFrame:
    """:func:`~tfmatcomp.geometry.summary.summary_table` of every layer's hidden states over the
    positions every text of the batch covers (the shortest text's length: no padding inside, so
    each position's mean is over all texts and the relative norm lies in ``[0, 1]``), the first
    ``drop_first`` tokens dropped (1: ``[CLS]``): one row per layer, 0 = the embeddings."""
    from tfmatcomp.geometry.summary import summary_table

    common = int(batch.attention_mask.sum(1).min())
    if common <= drop_first:
        raise ValueError(f"batch: its shortest text has {common} tokens, not more than "
                         f"drop_first={drop_first}")
    states = [h[:, :common] for h in text_hidden_states(model, batch)]
    return summary_table(states, drop_first=drop_first)
