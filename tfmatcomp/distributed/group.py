"""The process group: joining it, this rank and its device, the collectives the rest of
:mod:`tfmatcomp.distributed` uses, how work is shared, and launching ``torchrun``.

Example:
    >>> from tfmatcomp.distributed.group import shard_range, world_size
    >>> world_size()                        # no process group: one process
    1
    >>> [shard_range(10, r, 3) for r in range(3)]
    [slice(0, 3, None), slice(3, 6, None), slice(6, 10, None)]
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from tfmatcomp.training.plan import default_device
from tfmatcomp.validation import check_positive_int

__all__ = ["init", "shutdown", "under_torchrun", "rank", "world_size", "rank_device",
           "shard_range", "shard", "torchrun_command", "launch"]

T = TypeVar("T")


# ------------------------------------------------------------------------ the process group
def under_torchrun() -> bool:
    """True inside a process that ``torchrun`` started (``WORLD_SIZE`` and ``LOCAL_RANK`` set)."""
    return "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if _active() else 0


def world_size() -> int:
    """The number of ranks (1 without a process group)."""
    return dist.get_world_size() if _active() else 1


def rank_device(device: torch.device | str | None = None) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` for ``None`` or ``"cuda"`` on a machine with GPUs
    when several ranks run, else ``device`` (default: CUDA when present, else CPU).

    Raises:
        ValueError: ``device`` names another GPU than the rank's own while several ranks run.
    """
    device = torch.device(device) if device is not None else default_device()
    n = world_size() if _active() else int(os.environ.get("WORLD_SIZE", "1"))
    if device.type != "cuda" or n <= 1:
        return device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.index is not None and device.index != local:
        raise ValueError(f"device: {device} under {n} ranks; each rank uses its own GPU "
                         f"(cuda:LOCAL_RANK, here cuda:{local}): give 'cuda' or 'cpu'")
    return torch.device("cuda", local)


def init(device: torch.device | str | None = None, timeout_s: float = 1800.0) -> bool:
    """Join the process group that ``torchrun`` describes in the environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): NCCL when this rank's device
    (:func:`rank_device`) is a GPU, gloo otherwise. True when this process is one of several
    ranks; False (and nothing done) for a single process. Calling it again is harmless.

    Example:
        >>> init()          # not under torchrun
        False
    """
    if _active():
        return world_size() > 1
    if not dist.is_available() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    device = rank_device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=timedelta(seconds=timeout_s))
    return True


def shutdown() -> None:
    """Leave the process group (at the end of a script; nothing without one)."""
    if _active():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- collectives
def _comm_device() -> torch.device:
    """Where collectives take their tensors: the rank's GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError carrying its message."""
    try:
        return pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _on_main(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 alone; every rank returns its value, or raises its error (so a
    refusal on rank 0 stops every rank instead of leaving them waiting in a collective)."""
    box: list[Any] = [None]
    error = None
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except BaseException as e:
            error, box[0] = e, ("error", _portable(e))
    dist.broadcast_object_list(box, src=0, device=_comm_device())
    kind, value = box[0]
    if kind == "error":
        raise error if error is not None else value
    return value


def _together(fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it fails on any rank, raise on every rank."""
    error, message = None, None
    try:
        value = fn()
    except BaseException as e:
        error, message = e, f"{type(e).__name__}: {e}"
    messages: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(messages, message)
    if error is not None:
        raise error
    failed = [(r, m) for r, m in enumerate(messages) if m is not None]
    if failed:
        raise RuntimeError(f"rank {failed[0][0]} failed: {failed[0][1]}")
    return value


def _sum_padded(t: Tensor) -> Tensor:
    """Sum of every rank's ``t``, each zero-padded along the first axis to the longest."""
    x = t.to(_comm_device())
    length = torch.tensor([x.shape[0]], device=x.device)
    dist.all_reduce(length, op=dist.ReduceOp.MAX)
    if int(length) > x.shape[0]:
        x = torch.cat([x, x.new_zeros(int(length) - x.shape[0], *x.shape[1:])])
    else:
        x = x.clone()
    dist.all_reduce(x)
    return x.to(t.device)


def _gather_rows(t: Tensor) -> Tensor:
    """Every rank's rows of ``t`` (any number each), concatenated in rank order."""
    x = t.to(_comm_device()).contiguous()
    sizes = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(world_size())]
    dist.all_gather(sizes, torch.tensor([x.shape[0]], device=x.device))
    sizes = [int(s) for s in sizes]
    longest = max(sizes)
    padded = torch.cat([x, x.new_zeros(longest - x.shape[0], *x.shape[1:])])
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)]).to(t.device)


def shard_range(n: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` items: sizes differ by at most one.

    Example:
        >>> shard_range(8, 1, 2), shard_range(3, 0, 4)       # 3 items, 4 ranks: one gets none
        (slice(4, 8, None), slice(0, 0, None))
    """
    return slice(rank * n // world_size, (rank + 1) * n // world_size)


def shard(items: Iterable[T]) -> Iterator[T]:
    """This rank's share of ``items``: item ``i`` goes to rank ``i mod world_size()`` (every item
    without a process group). Every rank iterates over all of ``items``, so a seeded stream stays
    in step on every rank.

    Example:
        >>> list(shard(range(5)))
        [0, 1, 2, 3, 4]
    """
    r, n = rank(), world_size()
    for i, item in enumerate(items):
        if i % n == r:
            yield item


# ------------------------------------------------------------------------------- launching
def torchrun_command(nproc: int, args: Sequence[str]) -> list[str]:
    """The command that runs ``args`` (``["-m", "tfmatcomp", "train", ...]`` or a script and its
    arguments) on ``nproc`` processes of this machine with ``torchrun`` (``--standalone``: a
    rendezvous on a free local port).

    Example:
        >>> torchrun_command(2, ["-m", "tfmatcomp", "presets"])[2:]
        ['torch.distributed.run', '--standalone', '--nproc_per_node=2', '-m', 'tfmatcomp', 'presets']
    """
    check_positive_int("nproc", nproc)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *args]


def launch(nproc: int, args: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run :func:`torchrun_command` and return its exit status (torchrun stops every rank when
    one fails)."""
    return subprocess.call(torchrun_command(nproc, args), env=env)
