"""Progress measures of matrix completion: plain functions ``f(model, batch) -> float or dict``.

Each measure reads one model on one batch through the data path
(:func:`tfmatcomp.datapath.run_chunked` with cache names from :mod:`tfmatcomp.models.hook_names`),
so :func:`tfmatcomp.analyses.dynamics.over_checkpoints` can apply it at every checkpoint of a run.
A dict is one value per key (``over_checkpoints`` names them ``measure.key``); ``layer{l}`` keys
follow the library's layer conventions (below).

==================================  ===========================================================
measure                             definition
==================================  ===========================================================
:func:`L_mask`                      the masked-entry MSE (:func:`tfmatcomp.losses`)
:func:`row_column_attention_mass`   per block ``l`` (0-based, as the head tables' ``layer``):
                                    the attention mass from a masked query onto the *observed*
                                    keys in its own row or its own column, averaged over heads
                                    and pooled over all (matrix, masked query) pairs;
                                    ``max_head``: the largest single head's value;
                                    ``row.max_head`` / ``column.max_head``: the same for the
                                    row's (column's) observed keys only
:func:`representation_collapse`     per hidden state ``h^(l)``, ``l = 0..L``: the mean cosine
                                    similarity of ``h^(l)`` at two different masked positions of
                                    the same matrix, pooled over all such pairs of the batch
                                    (Gopalani and Hu, NeurIPS 2025: 1 = every masked position
                                    carries the same vector)
:func:`copying`                     ``L_mask_prime``: the MSE between the predictions at masked
                                    entries and 0, the value MASK reads as (the copying check,
                                    :func:`tfmatcomp.experiments.copying_check`, with MASK left in
                                    place), and ``L_obs``
:func:`positional_rank`             per hidden state ``h^(l)``: the ScreeNOT rank of the
                                    positional basis ``pos`` of the decomposition of ``h^(l)``
                                    over the batch (:func:`tfmatcomp.geometry.screenot`, default
                                    ``k``)
==================================  ===========================================================

:data:`PROGRESS_MEASURES` holds all five by name (what ``tfmatcomp dynamics`` measures by default).
The measures are defined for the encoder (:class:`~tfmatcomp.HookedEncoder`), whose sequence is
the matrix itself.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.datapath import sample_batch
    >>> model = tm.load_pretrained("tiny", step=10000)
    >>> batch = sample_batch("tiny", 32, seed=0)
    >>> sorted(row_column_attention_mass(model, batch))
    ['column.max_head', 'layer0', 'layer1', 'max_head', 'row.max_head']
    >>> sorted(representation_collapse(model, batch)), sorted(copying(model, batch))
    (['layer0', 'layer1', 'layer2'], ['L_mask_prime', 'L_obs'])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.datapath import run_chunked
from tfmatcomp.decomposition import decompose
from tfmatcomp.geometry import screenot
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.models.objectives import model_kind
from tfmatcomp.models.hook_names import pattern_hook_names, residual_stream_names
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.masks import row_column_mass
from tfmatcomp.task.metrics import L_mask_prime, losses

__all__ = [
    "L_mask", "row_column_attention_mass", "representation_collapse", "copying",
    "positional_rank", "row_column_mass", "masked_pair_cosine", "PROGRESS_MEASURES",
]

Measure = Callable[[HookedEncoder, MatrixBatch], "float | dict[str, float]"]


def _check_encoder(model) -> None:
    if model_kind(model) != "encoder":
        raise ValueError(f"model: the progress measures are defined for a HookedEncoder (the "
                         f"sequence is the matrix), got {type(model).__name__}")


def _check_batch(batch) -> None:
    if not isinstance(batch, MatrixBatch):
        raise ValueError(f"batch: expected a MatrixBatch (tfmatcomp.datapath.sample_batch), got "
                         f"{type(batch).__name__}")


# ---------------------------------------------------------------- definitions on tensors
def masked_pair_cosine(
    hidden: Float[Tensor, "batch pos d"], observed: Bool[Tensor, "batch pos"]
) -> float:
    """The mean cosine similarity between the hidden states of two different masked positions of
    the same matrix, pooled over every such (matrix, ordered pair) of the batch (NaN when no matrix
    has two masked positions).

    Example:
        >>> import torch
        >>> h = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
        >>> masked_pair_cosine(h, torch.tensor([[False, False, True]]))   # positions 0, 1 masked
        1.0
    """
    u = torch.nn.functional.normalize(hidden.double(), dim=-1)
    m = (~observed).double()                                              # [B, P]
    s = (u * m[..., None]).sum(1)                                         # [B, d]: sum of masked
    total = (s * s).sum() - (m * (u * u).sum(-1)).sum()                   # sum over i != j
    n_pairs = (m.sum(1) * (m.sum(1) - 1)).sum()
    return float(total / n_pairs) if n_pairs > 0 else float("nan")


# ---------------------------------------------------------------- measures of a model
def L_mask(model: HookedEncoder, batch: MatrixBatch, *, batch_size: int = 256) -> float:
    """``L_mask`` of ``model`` on ``batch`` (:func:`tfmatcomp.losses`).

    Example:
        >>> import tfmatcomp as tm
        >>> from tfmatcomp.datapath import sample_batch
        >>> round(L_mask(tm.load_pretrained("tiny", step=10000), sample_batch("tiny", 64)), 4)
        0.0254
    """
    _check_batch(batch)
    preds, _ = run_chunked(model, batch, batch_size=batch_size)
    return losses(preds, batch, as_floats=True)["L_mask"]


def _cache(model: HookedEncoder, batch: MatrixBatch, names: list[str],
           batch_size: int) -> tuple[dict[str, Tensor], Tensor]:
    """The activations ``names`` of ``model`` on ``batch`` (through the data path) and the
    batch's observed mask on the model's device, after checking both arguments."""
    _check_encoder(model)
    _check_batch(batch)
    _, cache = run_chunked(model, batch, batch_size=batch_size, names=names,
                           return_predictions=False)
    return cache, batch.observed.to(model.device)


def row_column_attention_mass(model: HookedEncoder, batch: MatrixBatch, *,
                              batch_size: int = 256) -> dict[str, float]:
    """``{"layer{l}": mass averaged over the heads of block l, "max_head": largest head's mass,
    "row.max_head", "column.max_head": the largest head's mass on its row's (column's) observed
    keys only}``, each mass :func:`row_column_mass` of the head's ``hook_pattern`` on ``batch``.

    Example:
        >>> import tfmatcomp as tm
        >>> from tfmatcomp.datapath import sample_batch
        >>> m = row_column_attention_mass(tm.load_pretrained("tiny", step=10000), sample_batch("tiny", 64))
        >>> all(0 <= v <= 1 for v in m.values())
        True
    """
    names = pattern_hook_names(model)
    cache, obs = _cache(model, batch, names, batch_size)
    heads = [row_column_mass(cache[name], obs, batch.n_rows, batch.n_cols) for name in names]
    out = {f"layer{l}": float(h.mean()) for l, h in enumerate(heads)}
    out["max_head"] = float(torch.stack(heads).max())
    for part in ("row", "column"):
        out[f"{part}.max_head"] = float(torch.stack(
            [row_column_mass(cache[name], obs, batch.n_rows, batch.n_cols, part) for name in names]
        ).max())
    return out


def representation_collapse(model: HookedEncoder, batch: MatrixBatch, *,
                            batch_size: int = 256) -> dict[str, float]:
    """``{"layer{l}": masked_pair_cosine(h^(l))}`` for ``l = 0..L`` (``h^(l)`` as in
    :mod:`tfmatcomp.models.hook_names`: 0 = embedding output, ``l`` = output of block ``l - 1``).

    Example:
        >>> import tfmatcomp as tm
        >>> from tfmatcomp.datapath import sample_batch
        >>> c = representation_collapse(tm.load_pretrained("tiny", step=10000), sample_batch("tiny", 64))
        >>> all(-1 <= v <= 1 for v in c.values())
        True
    """
    names = residual_stream_names(model)
    cache, obs = _cache(model, batch, names, batch_size)
    return {f"layer{l}": masked_pair_cosine(cache[name], obs) for l, name in enumerate(names)}


def copying(model: HookedEncoder, batch: MatrixBatch, *, batch_size: int = 256) -> dict[str, float]:
    """``{"L_mask_prime": MSE of the masked predictions against 0, "L_obs": ...}``: the copying
    check (:func:`tfmatcomp.experiments.copying_check`) with MASK left in place. A model that copies
    its input predicts MASK's value, 0, at masked entries: ``L_mask_prime`` near 0.

    Example:
        >>> import tfmatcomp as tm
        >>> from tfmatcomp.datapath import sample_batch
        >>> sorted(copying(tm.load_pretrained("tiny", step=2000), sample_batch("tiny", 8)))
        ['L_mask_prime', 'L_obs']
    """
    _check_batch(batch)
    preds, _ = run_chunked(model, batch, batch_size=batch_size)
    batch = batch.to(preds.device)
    return {"L_mask_prime": float(L_mask_prime(preds, batch, 0.0)),
            "L_obs": losses(preds, batch, as_floats=True)["L_obs"]}


def positional_rank(model: HookedEncoder, batch: MatrixBatch, *,
                    batch_size: int = 256) -> dict[str, float]:
    """``{"layer{l}": ScreeNOT rank of pos}`` for ``h^(l)``, ``l = 0..L``: ``pos`` of
    :func:`tfmatcomp.decomposition.decompose` over the batch's matrices (contexts) and positions,
    ranked by :func:`tfmatcomp.geometry.screenot` with its default ``k`` (7 for 16 positions).

    Example:
        >>> import tfmatcomp as tm
        >>> from tfmatcomp.datapath import sample_batch
        >>> sorted(positional_rank(tm.load_pretrained("tiny", step=10000), sample_batch("tiny", 64)))
        ['layer0', 'layer1', 'layer2']
    """
    _check_encoder(model)
    _check_batch(batch)
    names = residual_stream_names(model)
    _, cache = run_chunked(model, batch, batch_size=batch_size, names=names,
                           return_predictions=False)
    return {f"layer{l}": float(screenot(decompose(cache[name], gram=False).pos).rank)
            for l, name in enumerate(names)}


#: The progress measures by name, in the order of the table above.
PROGRESS_MEASURES: Mapping[str, Measure] = {
    "L_mask": L_mask,
    "row_column_attention_mass": row_column_attention_mass,
    "representation_collapse": representation_collapse,
    "copying": copying,
    "positional_rank": positional_rank,
}
