"""The decomposition formula, written once (Song & Zhong 2023, eqs. 2-3).

For hidden states ``h[c, t]`` with valid entries given by a mask (all valid without one)::

    mu      = (1/N) sum over valid (c, t) of h[c, t]
    pos[t]  = (1/n_t) sum over valid c of h[c, t] - mu        (0 if n_t = 0)
    ctx[c]  = (1/m_c) sum over valid t of h[c, t] - mu        (0 if m_c = 0)
    resid   = h - mu - pos[t] - ctx[c]                        (0 at invalid entries)

:func:`centered_means` is the ``pos`` / ``ctx`` line (a group's mean minus ``mu``) and
:func:`split_contexts` the ``ctx`` and ``resid`` lines given ``mu`` and ``pos``. The batch path
(:func:`~tfmatcomp.decomposition.decompose`) and the streaming path
(:class:`~tfmatcomp.decomposition.DecompositionAccumulator`) both call these; they differ only in
where the sums come from. The argument checks shared by both paths live here too.

Example:
    >>> import torch
    >>> h = torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    >>> mu = h.sum((0, 1)) / 12
    >>> pos = centered_means(h.sum(0), torch.full((3,), 4.0, dtype=torch.float64), mu)
    >>> ctx, ctx_counts, resid = split_contexts(h, None, mu, pos)
    >>> bool(torch.allclose(mu + pos[None] + ctx[:, None] + resid, h))
    True
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.validation import check_finite, check_int_in_range, shape_text

__all__ = ["centered_means", "split_contexts", "masked", "valid_weights"]


# --------------------------------------------------------------------------- argument checks


def check_activations(h: Any, name: str = "h") -> Tensor:
    """``h`` if it is a floating-point ``[contexts, positions, d]`` tensor, else a ValueError."""
    if not torch.is_tensor(h) or h.ndim != 3:
        raise ValueError(f"{name}: expected a float tensor [contexts, positions, d], got "
                         f"{shape_text(h)}")
    if not h.dtype.is_floating_point:
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {h.dtype}")
    return h


def check_mask(mask: Any, h: Tensor, name: str = "mask") -> Tensor | None:
    """``mask`` as a bool ``[contexts, positions]`` tensor on ``h``'s device (None stays None)."""
    if mask is None:
        return None
    mask = torch.as_tensor(mask, device=h.device)
    if tuple(mask.shape) != tuple(h.shape[:2]):
        raise ValueError(f"{name}: expected shape {tuple(h.shape[:2])} (contexts, positions), got "
                         f"{tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"{name}: must be bool or 0/1 integers (1 = valid), got {mask.dtype}")
        mask = mask.bool()
    return mask


def check_finite_entries(h: Tensor, mask: Tensor | None, name: str = "h") -> None:
    """ValueError unless every valid entry of ``h`` is finite (NaN / inf would spread through every
    mean silently); padding outside ``mask`` may hold anything."""
    check_finite(name, h if mask is None else masked(h, mask))


def check_drop_first(drop_first: Any, T: int) -> int:
    """``drop_first`` if it is an integer in ``[0, T - 1]`` (it must leave a position)."""
    return check_int_in_range("drop_first", drop_first, 0, max(T - 1, 0))


# --------------------------------------------------------------------------- the formula


def masked(h: Float[Tensor, "ctx pos d"], mask: Bool[Tensor, "ctx pos"] | None) -> Float[Tensor, "ctx pos d"]:
    """``h`` with invalid entries set to zero (``torch.where``, so NaN padding cannot leak in).

    Example:
        >>> masked(torch.full((1, 2, 1), float("nan")), torch.tensor([[True, False]])).flatten().tolist()
        [nan, 0.0]
    """
    if mask is None:
        return h
    return torch.where(mask[..., None], h, torch.zeros((), dtype=h.dtype, device=h.device))


def valid_weights(h: Float[Tensor, "ctx pos d"], mask: Bool[Tensor, "ctx pos"] | None) -> Float[Tensor, "ctx pos"]:
    """1 at valid entries and 0 elsewhere, in ``h``'s dtype and device: summed, the counts.

    Example:
        >>> valid_weights(torch.zeros(2, 3, 1), torch.tensor([[1, 1, 0], [1, 0, 0]]).bool()).sum(1).tolist()
        [2.0, 1.0]
    """
    C, T = h.shape[:2]
    if mask is None:
        return torch.ones(C, T, dtype=h.dtype, device=h.device)
    return mask.to(device=h.device, dtype=h.dtype)


def centered_means(
    total: Float[Tensor, "group d"],
    count: Float[Tensor, "group"],
    mu: Float[Tensor, "d"],
) -> Float[Tensor, "group d"]:
    """Each group's mean ``total / count`` minus ``mu``, and 0 for an empty group.

    With groups = positions this is ``pos``, with groups = contexts ``ctx``.

    Example:
        >>> centered_means(torch.tensor([[4.0], [0.0]]), torch.tensor([2.0, 0.0]), torch.tensor([1.0])).tolist()
        [[1.0], [0.0]]
    """
    return total / count.clamp(min=1)[:, None] - mu * (count > 0)[:, None]


def split_contexts(
    h: Float[Tensor, "ctx pos d"],
    mask: Bool[Tensor, "ctx pos"] | None,
    mu: Float[Tensor, "d"],
    pos: Float[Tensor, "pos d"],
) -> tuple[Float[Tensor, "ctx d"], Float[Tensor, "ctx"], Float[Tensor, "ctx pos d"]]:
    """``ctx``, its counts and ``resid`` of the contexts ``h`` against the means ``mu`` and ``pos``.

    ``ctx[c]`` is context ``c``'s mean over its valid positions minus ``mu``, and
    ``resid = h - mu - pos - ctx`` at valid entries (0 elsewhere), so ``h = mu + pos + ctx + resid``
    holds exactly there, whatever ``mu`` and ``pos`` are.

    Example:
        >>> h = torch.arange(6.0).reshape(2, 3, 1)
        >>> ctx, counts, resid = split_contexts(h, None, h.mean((0, 1)), h.mean(0) - h.mean((0, 1)))
        >>> ctx.flatten().tolist(), counts.tolist()
        ([-1.5, 1.5], [3.0, 3.0])
    """
    counts = valid_weights(h, mask).sum(1)
    ctx = centered_means(masked(h, mask).sum(1), counts, mu)
    resid = masked(h - mu - pos[None] - ctx[:, None], mask)
    return ctx, counts, resid
