"""Per-layer summary table of the decomposition's geometry (Song & Zhong Table 1, per layer).

Example:
    >>> import torch, tfmatcomp as tm
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    >>> task, g = tm.MatrixCompletionTask(4, rank=1), torch.Generator().manual_seed(0)
    >>> df = model_summary_table(model, [task.sample(64, generator=g)], progress=False)
    >>> list(df["name"])
    ['blocks.0.hook_resid_pre', 'blocks.1.hook_resid_pre', 'blocks.1.hook_normalized_resid_post']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor, nn

from tfmatcomp.decomposition import Decomposition, DecompositionAccumulator, accumulate, decompose
from tfmatcomp.geometry.rank import max_screenot_k, relative_norm, screenot, stable_rank
from tfmatcomp.geometry.similarity import cluster_similarity, incoherence

__all__ = ["layer_summary", "summary_table", "model_summary_table", "SUMMARY_COLUMNS"]

SUMMARY_COLUMNS = (
    "layer", "name", "rank_estimate", "screenot_threshold", "screenot_k", "stable_rank",
    "relative_norm", "inter_similarity", "intra_similarity", "incoherence_max", "incoherence_mean",
    "n_contexts", "n_positions", "rank_note",
)


def layer_summary(
    decomposition: Decomposition,
    labels: Tensor | Sequence[int] | None = None,
    *,
    k: int = 20,
    strategy: str = "impute",
) -> dict[str, Any]:
    """The Table-1 measurements of one layer's decomposition, as a dict.

    * ``rank_estimate``, ``screenot_threshold``: :func:`screenot` of ``pos`` ``[T, d]``, with
      ``screenot_k = min(k, max_screenot_k(min(T, d)))`` (small ``T`` cannot support ``k = 20``);
    * ``stable_rank`` of ``pos``;
    * ``relative_norm``: centered (:func:`relative_norm` from the decomposition's Gram matrix);
    * ``inter_similarity``, ``intra_similarity``: mean ``|cos|`` of ``ctx`` across / within the
      clusters given by ``labels`` (NaN without labels);
    * ``incoherence_max``, ``incoherence_mean``: ``|cos(pos_t, ctx_c)|``.

    Measurements that need something missing (no ``ctx``, no Gram) are NaN. ``rank_note`` says
    why a rank estimate is 0 or NaN (empty otherwise): 0 means no singular value of ``pos`` stands
    above ScreeNOT's noise bulk (no low-rank positional structure at that layer, e.g. random
    positional embeddings), not a failed measurement.
    """
    nan = float("nan")
    pos = decomposition.pos
    T, d = pos.shape
    row: dict[str, Any] = {"name": decomposition.name, "n_contexts": decomposition.n_contexts,
                           "n_positions": T}
    k_used = min(k, max_screenot_k(min(T, d), strategy))
    if k_used >= 1:
        sn = screenot(pos, k=k_used, strategy=strategy)
        row.update(rank_estimate=sn.rank, screenot_threshold=sn.threshold, screenot_k=k_used,
                   rank_note="" if sn.rank else (
                       f"no singular value of pos above ScreeNOT's threshold {sn.threshold:.3g} "
                       f"(k={k_used}): no low-rank positional structure here"))
    else:
        row.update(rank_estimate=nan, screenot_threshold=nan, screenot_k=0,
                   rank_note=f"{min(T, d)} singular values are too few for ScreeNOT")
    row["stable_rank"] = stable_rank(pos)
    row["relative_norm"] = (relative_norm(pos, gram=decomposition.centered_gram,
                                          n_rows=decomposition.n_tokens)
                            if decomposition.centered_gram is not None else nan)
    ctx = decomposition.ctx
    if ctx is not None and labels is not None:
        sim = cluster_similarity(ctx, labels)
        row.update(inter_similarity=sim.inter, intra_similarity=sim.intra)
    else:
        row.update(inter_similarity=nan, intra_similarity=nan)
    if ctx is not None:
        inc = incoherence(pos, ctx)
        row.update(incoherence_max=inc.max, incoherence_mean=inc.mean)
    else:
        row.update(incoherence_max=nan, incoherence_mean=nan)
    return row


def _decompositions(source: Any, mask: Tensor | None, drop_first: int) -> list[Decomposition]:
    if isinstance(source, DecompositionAccumulator):
        return list(source.results().values())
    if isinstance(source, Decomposition):
        return [source]
    if torch.is_tensor(source):
        if source.ndim == 3:
            return [decompose(source, mask, drop_first=drop_first, name=0)]
        if source.ndim == 4:
            return [decompose(h, mask, drop_first=drop_first, name=i) for i, h in enumerate(source)]
        raise ValueError(f"source: a tensor must be [C, T, d] or [L, C, T, d], got {tuple(source.shape)}")
    if isinstance(source, Mapping):
        items = list(source.items())
    elif isinstance(source, Sequence) and not isinstance(source, str):
        items = list(enumerate(source))
    else:
        raise ValueError(f"source: expected an accumulator, decompositions or tensors, got "
                         f"{type(source).__name__}")
    out = []
    for name, item in items:
        if isinstance(item, Decomposition):
            out.append(item)
        elif torch.is_tensor(item):
            out.append(decompose(item, mask, drop_first=drop_first, name=name))
        else:
            raise ValueError(f"source[{name!r}]: expected a Decomposition or a [C, T, d] tensor, got "
                             f"{type(item).__name__}")
    return out


def summary_table(
    source: Any,
    labels: Tensor | Sequence[int] | None = None,
    *,
    k: int = 20,
    strategy: str = "impute",
    mask: Tensor | None = None,
    drop_first: int = 0,
) -> pd.DataFrame:
    """One row of :func:`layer_summary` per layer.

    Args:
        source: a :class:`DecompositionAccumulator`, a mapping / list of :class:`Decomposition`
            objects or of activation tensors ``[C, T, d]`` per layer (e.g. a TransformerBridge's
            ``run_with_cache`` entries or ``output_hidden_states``), or one tensor ``[L, C, T, d]``.
        labels: cluster label of each context (for the similarity columns), or None.
        k, strategy: ScreeNOT settings.
        mask, drop_first: used when ``source`` holds raw tensors (see :func:`decompose`).

    Returns:
        a DataFrame with :data:`SUMMARY_COLUMNS`; ``layer`` is the 0-based index in ``source``
        (for :func:`model_summary_table`'s default names: 0 = embeddings, ``l`` = output of block
        ``l - 1``, i.e. the paper's "Layer l").

    Example:
        >>> import torch
        >>> h = torch.randn(3, 20, 24, 30, generator=torch.Generator().manual_seed(0))
        >>> summary_table(h).shape
        (3, 14)
    """
    decs = _decompositions(source, mask, drop_first)
    rows = []
    for i, dec in enumerate(decs):
        row = layer_summary(dec, labels, k=k, strategy=strategy)
        row["layer"] = i
        rows.append(row)
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def model_summary_table(
    model: nn.Module,
    batches: Iterable[Any],
    names: Sequence[str] | None = None,
    *,
    labels: Tensor | Sequence[int] | None = None,
    modules: Mapping[str, nn.Module] | None = None,
    k: int = 20,
    strategy: str = "impute",
    drop_first: int = 0,
    progress: bool | None = None,
    total: int | None = None,
) -> pd.DataFrame:
    """Stream ``model`` over ``batches`` (:func:`~tfmatcomp.decomposition.accumulate`) and tabulate.

    Works for a HookedEncoder (default names: the residual stream ``h^(0..L)``), anything with
    TransformerLens hooks (pass ``names``), or any module with ``modules=`` (e.g.
    :func:`~tfmatcomp.decomposition.hf_bert_modules` for a transformers BERT).
    """
    acc = accumulate(model, batches, names, modules=modules, drop_first=drop_first,
                     progress=progress, total=total)
    return summary_table(acc, labels, k=k, strategy=strategy)
