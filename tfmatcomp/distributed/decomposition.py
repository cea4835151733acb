"""Sharded decomposition: every rank streams its share of the batches into a
:class:`~tfmatcomp.decomposition.DecompositionAccumulator`; the ranks' statistics are then
combined so that every rank holds the accumulator of all the data.

Example:
    >>> import torch
    >>> from tfmatcomp.decomposition import DecompositionAccumulator
    >>> acc = DecompositionAccumulator()
    >>> acc.update(torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(0)))
    >>> all_reduce_accumulator(acc).n_contexts()       # one process: unchanged
    4
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tfmatcomp.decomposition.accumulator import DecompositionAccumulator
from tfmatcomp.decomposition.drivers import accumulate as _accumulate
from tfmatcomp.distributed.group import (
    _gather_rows, _sum_padded, init, rank, world_size,
)

__all__ = ["all_reduce_accumulator", "accumulate"]


def all_reduce_accumulator(acc: DecompositionAccumulator,
                           blocks: Sequence[tuple[int, int]] | None = None
                           ) -> DecompositionAccumulator:
    """Combine every rank's :class:`~tfmatcomp.decomposition.DecompositionAccumulator` in place
    (:meth:`~tfmatcomp.decomposition.DecompositionAccumulator.combine`): sums by ``all_reduce``,
    per-context rows gathered; every rank returns the accumulator of all ranks' contexts.

    Args:
        acc: this rank's accumulator (same ``drop_first``, ``keep_ctx``, ``second_moment`` and
            ``dtype`` on every rank; a rank that saw no data takes part with an empty one).
        blocks: ``[(global index, n_contexts), ...]``: this rank's contexts as consecutive blocks
            and each block's place in the global order (e.g. batch numbers); the context rows are
            put in that order. Default: rank order (rank 0's contexts first).

    Raises:
        ValueError: the ranks' settings or feature sizes differ, or ``blocks`` does not add up to
            this rank's contexts.

    Example:
        >>> import torch
        >>> acc = DecompositionAccumulator()
        >>> acc.update(torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(0)))
        >>> all_reduce_accumulator(acc) is acc            # one process: unchanged
        True
    """
    if world_size() <= 1:
        return acc
    count = acc.n_contexts() if acc.names else 0
    blocks = [(rank(), count)] if blocks is None else [(int(g), int(n)) for g, n in blocks]
    if acc.keep_ctx and sum(n for _, n in blocks) != count:
        raise ValueError(f"blocks: add up to {sum(n for _, n in blocks)} contexts, but this "
                         f"rank accumulated {count}")
    mine = ((acc.drop_first, acc.keep_ctx, acc.second_moment, str(acc.dtype)),
            acc.feature_sizes, blocks)
    every: list[Any] = [None] * world_size()
    dist.all_gather_object(every, mine)
    layers: dict[Any, int] = {}
    for r, (settings, sizes, _) in enumerate(every):
        if settings != every[0][0]:
            raise ValueError(f"acc: rank {r} has (drop_first, keep_ctx, second_moment, dtype) "
                             f"{settings}, rank 0 {every[0][0]}")
        for name, d in sizes.items():
            if layers.setdefault(name, d) != d:
                raise ValueError(f"acc: layer {name!r} has {d} features on rank {r}, "
                                 f"{layers[name]} on another")
    order, start = [], 0  # (global index, row in the gathered table, rows)
    for _, _, rank_blocks in every:
        for g, n in rank_blocks:
            order.append((g, start, n))
            start += n
    perm = torch.cat([torch.arange(s, s + n) for _, s, n in sorted(order)] or
                     [torch.zeros(0, dtype=torch.long)])

    def gather_rows(t: Tensor) -> Tensor:
        return _gather_rows(t)[perm.to(t.device)]

    acc.combine(_sum_padded, gather_rows, layers)
    return acc


def accumulate(model: nn.Module, batches: Iterable[Any], names: Sequence[str] | None = None, *,
               drop_first: int = 0, keep_ctx: bool = True, second_moment: bool = True,
               progress: bool = True, **kwargs: Any) -> DecompositionAccumulator:
    """:func:`tfmatcomp.decomposition.accumulate` over this rank's share of ``batches`` (batch
    ``i`` on rank ``i mod N``), combined over the ranks by :func:`all_reduce_accumulator` with
    the contexts in the batches' order: every rank returns the accumulator one process would
    build from all the batches (float64 sums: equal to about 1e-15). Other arguments as
    :func:`tfmatcomp.decomposition.accumulate`; the progress bar shows on rank 0.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        >>> g = torch.Generator().manual_seed(0)
        >>> batches = [tm.get_preset("tiny").task.build().sample(8, generator=g) for _ in range(3)]
        >>> accumulate(model, batches, progress=False).n_contexts()
        24
    """
    if "accumulator" in kwargs:
        raise ValueError("accumulator: the sharded accumulate builds its own")
    init(next(model.parameters()).device)
    acc = DecompositionAccumulator(drop_first=drop_first, keep_ctx=keep_ctx,
                                   second_moment=second_moment)
    starts: list[tuple[int, int]] = []

    def mine() -> Iterator[Any]:
        for i, batch in enumerate(batches):
            if i % world_size() == rank():
                starts.append((i, acc.n_contexts() if acc.names else 0))
                yield batch

    _accumulate(model, mine(), names, accumulator=acc, progress=progress and rank() == 0,
                **kwargs)
    ends = [s for _, s in starts[1:]] + [acc.n_contexts() if acc.names else 0]
    return all_reduce_accumulator(acc, [(i, e - s) for (i, s), e in zip(starts, ends)])
