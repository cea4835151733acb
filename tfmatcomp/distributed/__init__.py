"""Scale out on ``torch.distributed``: data-parallel training, seeds across ranks, sharded
decomposition.

Start one process per device with ``torchrun`` (``torchrun --nproc_per_node 4 -m tfmatcomp
train ...``, or ``tfmatcomp train --nproc 4``, which launches it). Each process is a *rank*; the
functions here join the process group that ``torchrun`` describes in the environment
(:func:`init`: NCCL when the rank's device is a GPU, gloo on CPU) and fall back to their
single-process versions when there is none, so the same script runs under ``python`` and under
``torchrun``.

* :func:`train` (:class:`DistributedTrainer`): DistributedDataParallel. Every rank draws the *same*
  global batch from the same seeded generator and runs its contiguous slice of it
  (:func:`shard_range`), so the global batch is the one a single process draws, bit for bit, and
  the generators' state does not depend on the world size. The loss is weighted so that the
  all-reduced gradient is the gradient of the global batch's mean. Rank 0 alone touches the run
  directory; a checkpoint holds the single-process state, so a run resumes at any world size.
* :func:`train_many`: the seeds of :func:`tfmatcomp.train_many` spread over the ranks in
  contiguous blocks; each rank trains its block as one batched program, one run directory per seed.
* :func:`accumulate` / :func:`all_reduce_accumulator`: batch ``i`` goes to rank ``i mod N``; the
  ranks' sufficient statistics are summed (``all_reduce``) and their per-context rows gathered in
  the batches' order, so every rank holds the accumulator of all the data.

One idea per module: :mod:`~tfmatcomp.distributed.group` (the process group, collectives,
sharing, launching), :mod:`~tfmatcomp.distributed.trainers` (training),
:mod:`~tfmatcomp.distributed.decomposition` (the sharded decomposition).

What is exact and what holds up to float rounding: docs/scaling-out.md.

Example:
    >>> from tfmatcomp.distributed import shard_range, world_size
    >>> world_size()                        # no process group: one process
    1
    >>> [shard_range(10, r, 3) for r in range(3)]
    [slice(0, 3, None), slice(3, 6, None), slice(6, 10, None)]
"""

from tfmatcomp.distributed.decomposition import accumulate, all_reduce_accumulator
from tfmatcomp.distributed.group import (
    init, launch, rank, rank_device, shard, shard_range, shutdown, torchrun_command,
    under_torchrun, world_size,
)
from tfmatcomp.distributed.trainers import DistributedTrainer, train, train_many

__all__ = ["init", "shutdown", "under_torchrun", "rank", "world_size", "rank_device",
           "shard_range", "DistributedTrainer", "train", "train_many", "shard",
           "all_reduce_accumulator", "accumulate", "torchrun_command", "launch"]
