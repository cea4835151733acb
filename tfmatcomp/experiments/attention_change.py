"""Attention before and after the drop: where each head's queries look, for both model kinds.

For every head and every matrix entry ``(i, j)`` as a query, the attention mass on keys that hold
entries of the same row, of the same column, the entry itself, and (decoder only) the separator,
averaged over entries and matrices. The papers read the change at the drop off such maps (seed
001 Figure 12: the decoder's heads go from the separator to the corresponding input positions;
the NeurIPS paper Section 3.1: the encoder's row and column heads).

Where a query sits and what a key holds follows :mod:`tfmatcomp.task.gpt` for a decoder: entry
``k`` is predicted at position ``P + k``; keys ``0..P-1`` are the prompt's entries, ``P`` the
separator, ``P + 1 + m`` the generated entry ``m`` (visible for ``m < k``). Same-row and same-column
keys are counted in both parts; ``self`` is the prompt position of the entry (for an encoder, the
entry's own position).

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments import attention_change
    >>> cfg = tm.get_preset("gpt-tiny").model
    >>> df = attention_change(tm.HookedDecoder(cfg, seed=0), tm.HookedDecoder(cfg, seed=1),
    ...                       "gpt-tiny", n_samples=4)
    >>> list(df.columns)[:6]
    ['layer', 'head', 'target', 'before', 'after', 'change']
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from tfmatcomp.datapath import (ModelLike, TaskLike, iter_chunks, resolve_models, sample_batch)
from tfmatcomp.models.objectives import model_kind
from tfmatcomp._progress import bar, check_progress
from tfmatcomp.models.hook_names import pattern_hook_names

__all__ = ["attention_targets", "attention_change"]

TARGETS = ("same_row", "same_col", "self", "sep")


def _key_sets(n_rows: int, n_cols: int, decoder: bool, seq_len: int) -> tuple[Tensor, dict[str, Tensor]]:
    """Query positions ``[P]`` and, per target, a bool ``[P, seq_len]`` of the keys it counts."""
    P = n_rows * n_cols
    k = torch.arange(P)
    row, col = k // n_cols, k % n_cols
    same_row = (row[:, None] == row[None, :]) & (k[:, None] != k[None, :])
    same_col = (col[:, None] == col[None, :]) & (k[:, None] != k[None, :])
    ident = torch.eye(P, dtype=torch.bool)
    if not decoder:
        return k, {"same_row": same_row, "same_col": same_col, "self": ident,
                   "sep": torch.zeros(P, P, dtype=torch.bool)}
    pad = torch.zeros(P, seq_len - P, dtype=torch.bool)
    sets = {}
    for name, m in (("same_row", same_row), ("same_col", same_col)):  # prompt and generated part
        sets[name] = torch.cat([m, torch.zeros(P, 1, dtype=torch.bool), m], dim=1)
    sets["self"] = torch.cat([ident, pad], dim=1)
    sep = torch.zeros(P, seq_len, dtype=torch.bool)
    sep[:, P] = True
    sets["sep"] = sep
    return P + k, sets


@torch.no_grad()
def attention_targets(model, task: TaskLike = None, *, n_samples: int = 256, seed: int = 0,
                      batch_size: int = 256, progress: bool | None = None) -> pd.DataFrame:
    """Per head, the mean attention mass of the entries' queries on each target (module docs).

    ``progress``: a bar over the forward passes (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        Rows ``layer``, ``head`` (0-based), ``same_row``, ``same_col``, ``self``, ``sep``
        (always 0 for an encoder).

    Example:
        >>> import tfmatcomp as tm
        >>> df = attention_targets(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=4)
        >>> df.shape
        (8, 6)
    """
    check_progress(progress)
    named, task = resolve_models(model, task)
    (model,) = named.values()
    batch = sample_batch(task, n_samples, seed)
    names = pattern_hook_names(model)
    total: Tensor | None = None
    with bar(-(-n_samples // batch_size), "attention targets", progress, unit="batch") as b:
        for chunk in iter_chunks(model, batch, batch_size=batch_size, names=names,
                                 return_predictions=False):
            pat = torch.stack([chunk.cache[n] for n in names], dim=1).float()  # [b, layer, head, q, k]
            s = pat.sum(0).cpu()
            total = s if total is None else total + s
            b.update()
    mean = total / n_samples
    decoder = model_kind(model) == "decoder"
    queries, sets = _key_sets(batch.n_rows, batch.n_cols, decoder, mean.shape[-1])
    at_q = mean[:, :, queries]  # [layer, head, P, seq]
    rows = []
    for l in range(mean.shape[0]):
        for h in range(mean.shape[1]):
            rows.append({"layer": l, "head": h, **{
                t: float((at_q[l, h] * sets[t]).sum(-1).mean()) for t in TARGETS}})
    return pd.DataFrame(rows)


def attention_change(before: ModelLike, after: ModelLike, task: TaskLike = None, *,
                     n_samples: int = 256, seed: int = 0, batch_size: int = 256,
                     progress: bool | None = None) -> pd.DataFrame:
    """How each head's attention targets change between two checkpoints (e.g. either side of the
    drop), on the same seeded batch; works on encoders and decoders.

    Args:
        before, after: models or checkpoint paths of the same kind and shape.
        task: the matrix task (default: the checkpoints' own).
        progress: a bar over the two checkpoints (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        Rows per (layer, head, target): ``before``, ``after``, ``change`` (after - before), and
        ``target`` one of ``same_row``, ``same_col``, ``self``, ``sep``.
    """
    check_progress(progress)
    named, task = resolve_models({"before": before, "after": after}, task)
    tables = {}
    with bar(2, "attention change", progress) as b:
        for label, m in named.items():
            with b.step(label):
                tables[label] = attention_targets(m, task, n_samples=n_samples, seed=seed,
                                                  batch_size=batch_size)
    long = {label: t.melt(id_vars=["layer", "head"], var_name="target", value_name=label)
            for label, t in tables.items()}
    df = long["before"].merge(long["after"], on=["layer", "head", "target"])
    df["change"] = df["after"] - df["before"]
    df.attrs.update(experiment="attention change", n_samples=n_samples, seed=seed)
    return df
