"""The batch path: :func:`decompose` a tensor ``[C, T, d]`` or an ``ActivationCache`` entry at once.

Example:
    >>> import torch
    >>> h = torch.randn(8, 5, 3, generator=torch.Generator().manual_seed(0))
    >>> dec = decompose(h)
    >>> bool(torch.allclose(dec.reconstruct(), h.double()))
    True
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.decomposition.formula import (
    centered_means,
    check_activations,
    check_drop_first,
    check_finite_entries,
    check_mask,
    masked,
    split_contexts,
    valid_weights,
)
from tfmatcomp.decomposition.result import Decomposition
from tfmatcomp.models.hook_names import block_hook_name
from tfmatcomp.validation import check_sum_dtype

__all__ = ["decompose", "decompose_cache"]


def decompose(
    h: Float[Tensor, "ctx pos d"],
    mask: Bool[Tensor, "ctx pos"] | None = None,
    *,
    drop_first: int = 0,
    dtype: torch.dtype = torch.float64,
    gram: bool = True,
    name: str | int | None = None,
) -> Decomposition:
    """Decompose hidden states ``h[c, t]`` into ``mu + pos[t] + ctx[c] + resid[c, t]``.

    Args:
        h: activations ``[C, T, d]`` of one layer (contexts x positions x features).
        mask: valid entries ``[C, T]`` (True / 1 = a real token, False / 0 = padding), or None.
        drop_first: number of leading positions to drop first (e.g. 1 for BERT's ``[CLS]``; the
            paper drops the first token).
        dtype: precision of the statistics (float64 by default; the means are always summed in
            this dtype).
        gram: also compute ``M^T M`` of the centered activations (for :func:`relative_norm`).
        name: stored on the result.

    With a mask, every mean is over valid entries only: with ``n_t`` the number of valid contexts at
    position ``t``, ``m_c`` the number of valid positions of context ``c`` and ``N`` the number of
    valid entries, ``mu = (1/N) sum_valid h``, ``pos_t = (1/n_t) sum_{c valid at t} h[c, t] - mu``
    (0 if ``n_t = 0``), ``ctx_c = (1/m_c) sum_{t valid in c} h[c, t] - mu`` (0 if ``m_c = 0``),
    ``resid = h - mu - pos_t - ctx_c`` at valid entries and 0 elsewhere. The identity holds at every
    valid entry; the zero-sum constraints become weighted: ``sum_t n_t pos_t = 0`` and
    ``sum_c m_c ctx_c = 0`` (unweighted when nothing is masked).

    Example:
        >>> import torch
        >>> h = torch.randn(4, 6, 2, generator=torch.Generator().manual_seed(0))
        >>> dec = decompose(h, drop_first=1)
        >>> dec.pos.shape, round(float(dec.pos.sum(0).abs().max()), 12)
        (torch.Size([5, 2]), 0.0)
    """
    h = check_activations(h)
    check_sum_dtype("dtype", dtype)
    mask = check_mask(mask, h)
    check_finite_entries(h, mask)
    drop_first = check_drop_first(drop_first, h.shape[1])
    if h.shape[0] == 0 or h.shape[1] == 0:
        raise ValueError(f"h: needs at least one context and one position, got {tuple(h.shape)}")
    h = h[:, drop_first:].to(dtype)
    if mask is not None:
        mask = mask[:, drop_first:]
    C, T, d = h.shape
    hm = masked(h, mask)
    w = valid_weights(h, mask)
    n_tokens = float(w.sum())
    if n_tokens == 0:
        raise ValueError("mask: no valid entries (after drop_first)")
    pos_counts = w.sum(0)
    mu = hm.sum((0, 1)) / n_tokens
    pos = centered_means(hm.sum(0), pos_counts, mu)
    ctx, ctx_counts, resid = split_contexts(h, mask, mu, pos)
    cg = None
    if gram:
        centered = masked(h - mu, mask).reshape(-1, d)
        cg = centered.T @ centered
    return Decomposition(mu=mu, pos=pos, ctx=ctx, resid=resid, mask=mask, pos_counts=pos_counts,
                         ctx_counts=ctx_counts, n_tokens=int(n_tokens), n_contexts=C,
                         centered_gram=cg, start=drop_first, name=name)


def decompose_cache(
    cache: Mapping[str, Tensor],
    name: str,
    layer: int | None = None,
    *,
    mask: Bool[Tensor, "ctx pos"] | None = None,
    drop_first: int = 0,
    dtype: torch.dtype = torch.float64,
    gram: bool = True,
) -> Decomposition:
    """:func:`decompose` the activation ``name`` (of block ``layer``) from an ``ActivationCache``.

    Args:
        cache: a TransformerLens ``ActivationCache`` (or any mapping from hook names to tensors).
        name: a full hook name (``"blocks.1.hook_resid_pre"``) or, with ``layer``, a per-block one
            (``"hook_resid_pre"`` or ``"resid_pre"``).
        layer: 0-based block index, or None when ``name`` is a full hook name.
        mask, drop_first, dtype, gram: as in :func:`decompose`.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        >>> batch = tm.MatrixCompletionTask(4, rank=1).sample(8, generator=torch.Generator().manual_seed(0))
        >>> _, cache = model.run_with_cache(batch.tokens)
        >>> decompose_cache(cache, "resid_pre", 1).pos.shape
        torch.Size([16, 64])
    """
    full = block_hook_name(name, layer)
    try:
        h = cache[full]
    except KeyError:
        keys = list(cache.keys())
        raise ValueError(f"name: {full!r} is not in the cache; cached names include "
                         f"{keys[:8]}{' ...' if len(keys) > 8 else ''}") from None
    if h.ndim != 3:
        raise ValueError(f"name: {full!r} has shape {tuple(h.shape)}; the decomposition needs "
                         "[batch, pos, d] activations (select a head first for per-head hooks)")
    return decompose(h, mask, drop_first=drop_first, dtype=dtype, gram=gram, name=full)
