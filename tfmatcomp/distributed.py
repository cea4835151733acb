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

What is exact and what holds up to float rounding: docs/scaling-out.md.

Example:
    >>> from tfmatcomp.distributed import shard_range, world_size
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
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tfmatcomp import multiseed, rundir, training
from tfmatcomp.checkpoint import checkpoint_dir_name
from tfmatcomp.config import Preset
from tfmatcomp.data import MatrixBatch
from tfmatcomp.decomposition.accumulator import DecompositionAccumulator
from tfmatcomp.decomposition.drivers import accumulate as _accumulate
from tfmatcomp.metrics import masked_mse
from tfmatcomp.multiseed import MultiSeedResult, MultiSeedTrainer, parse_seeds
from tfmatcomp.training import Trainer, TrainResult, _check_n_steps, _check_resume_overwrite
from tfmatcomp.validation import check_positive_int

__all__ = ["init", "shutdown", "under_torchrun", "rank", "world_size", "rank_device",
           "shard_range", "DistributedTrainer", "train", "train_many", "shard",
           "all_reduce_accumulator", "accumulate", "torchrun_command", "launch"]

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
    device = torch.device(device) if device is not None else training.default_device()
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


# ------------------------------------------------------------------- data-parallel training
class DistributedTrainer(Trainer):
    """A :class:`~tfmatcomp.Trainer` whose ranks train one model on shares of one batch.

    Same arguments as :class:`~tfmatcomp.Trainer`; needs a process group (:func:`init`). Every
    rank samples the full training batch from the same seeded stream and runs its slice
    (:func:`shard_range` of the batch) through DistributedDataParallel; each rank's loss is its
    slice's mean weighted by its share of the batch, so the averaged gradient is the gradient of
    the global batch's mean. ``train_*`` losses come from every rank's predictions gathered;
    ``eval_*`` from rank 0, which alone locks the run directory, writes the metrics log and
    checkpoints. A resume loads on rank 0 and hands its state to every rank.

    Raises:
        ValueError: no process group, or a batch smaller than the number of ranks.
    """

    def __init__(self, preset: str | Preset = "tiny", *, device: torch.device | str | None = None,
                 progress: bool = True, **kwargs: Any):
        if not _active():
            raise ValueError("DistributedTrainer: no process group; run under torchrun and call "
                             "tfmatcomp.distributed.init() (or use tfmatcomp.Trainer)")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        super().__init__(preset, device=rank_device(device), progress=progress and self.rank == 0,
                         **kwargs)
        n = self.train_cfg.batch_size
        if n < self.world_size:
            raise ValueError(f"batch_size: {n} matrices cannot be shared by {self.world_size} "
                             "ranks; give at least one per rank")
        self.rows = shard_range(n, self.rank, self.world_size)
        if self.rank != 0:
            self._lock = None  # rank 0 alone touches the run directory
        self._ddp: DistributedDataParallel | None = None

    def _data_parallel(self) -> DistributedDataParallel:
        if self._ddp is None:  # a collective: every rank builds it at the same point
            ids = [self.device.index] if self.device.type == "cuda" else None
            self._ddp = DistributedDataParallel(self.model, device_ids=ids)
        return self._ddp

    def _forward_loss(self, batch: MatrixBatch) -> tuple[Tensor, Tensor]:
        rows = self.rows
        predictions = self._data_parallel()(batch.tokens[rows])
        share = (rows.stop - rows.start) / self.train_cfg.batch_size
        loss = masked_mse(predictions, batch.values[rows]) * (share * self.world_size)
        total = (loss.detach() / self.world_size).to(_comm_device())
        dist.all_reduce(total)  # the global batch's loss: every rank sees a divergence together
        if not torch.isfinite(total):
            raise FloatingPointError(f"training diverged at step {self.step + 1}: loss is "
                                     f"{total.item()}; try a lower lr (now {self.train_cfg.lr})")
        return predictions, loss

    def _train_losses(self, predictions: Tensor, batch: MatrixBatch) -> dict[str, Tensor]:
        return super()._train_losses(_gather_rows(predictions.detach()), batch)

    def evaluate(self, batch_size: int | None = None) -> dict[str, float]:
        """Losses on a fresh evaluation batch, measured on rank 0 and given to every rank."""
        evaluate = super().evaluate
        return _on_main(lambda: evaluate(batch_size))

    def _run_info(self) -> dict[str, Any]:
        return {**super()._run_info(), "world_size": self.world_size,
                "backend": dist.get_backend()}

    def open_log(self):
        return super().open_log() if self.rank == 0 else None

    def save(self, strip_older: bool = True) -> Path:
        if self.rank == 0:
            return super().save(strip_older)
        return self.out_dir / "checkpoints" / checkpoint_dir_name(self.step)

    def resume(self) -> bool:
        """:meth:`Trainer.resume` on rank 0, whose weights, optimizer state, generators and log
        every rank then takes (the checkpoint need not be readable from other machines)."""
        if self.out_dir is None:
            raise ValueError("out_dir: resume needs a run directory")
        found = _on_main(super().resume)
        self._share_state()
        return found

    def _share_state(self) -> None:
        def state():
            tensors, json_state = self.training_state()
            return {k: v.cpu() for k, v in tensors.items()}, json_state, self.records

        tensors, json_state, records = _on_main(state)
        if self.rank != 0:
            self.load_training_state(tensors, json_state)
            self.records = list(records)
        with torch.no_grad():
            for p in self.model.parameters():
                buf = p.detach().to(_comm_device())
                dist.broadcast(buf, src=0)
                p.copy_(buf)

    def run(self, n_steps: int | None = None) -> TrainResult:
        _check_n_steps(self.train_cfg.n_steps if n_steps is None else n_steps, self.step,
                       self.out_dir)
        self._data_parallel()
        _on_main(lambda: self._claim(resuming=False))  # a refused directory stops every rank
        return super().run(n_steps)


def train(preset: str | Preset = "tiny", *, device: torch.device | str | None = None,
          resume: bool = False, overwrite: bool = False, **kwargs: Any) -> TrainResult:
    """:func:`tfmatcomp.train` on every rank of a process group (:class:`DistributedTrainer`);
    the plain :func:`tfmatcomp.train` in a single process. Same arguments; every rank returns
    the same metrics and (up to float rounding) the same model.

    Example:
        >>> r = train("tiny", n_steps=4, batch_size=8, log_every=2, progress=False)  # one process
        >>> list(r.metrics["step"])
        [2, 4]
    """
    if not init(device):
        return training.train(preset, device=device, resume=resume, overwrite=overwrite, **kwargs)
    _check_resume_overwrite(resume, overwrite)
    trainer = DistributedTrainer(preset, device=device, overwrite=overwrite, **kwargs)
    return training._resume_and_run(trainer, resume)


# -------------------------------------------------------------------------- seeds across ranks
class _SeedShard(MultiSeedTrainer):
    """One rank's block of a multi-seed group whose directory rank 0 claims."""

    def _claim(self, resuming: bool) -> None:
        try:
            for t in self.trainers:
                t._claim(resuming)
        except BaseException:
            self.close()
            raise

    def _write_group_file(self) -> None:
        pass  # rank 0 wrote the whole group's


def train_many(preset: str | Preset = "tiny", *, seeds: str | int | Sequence[int],
               out_dir: str | os.PathLike | None = None, device: torch.device | str | None = None,
               resume: bool = False, overwrite: bool = False, progress: bool = True,
               **kwargs: Any) -> MultiSeedResult:
    """:func:`tfmatcomp.train_many` with the seeds spread over the ranks in contiguous blocks
    (:func:`shard_range`); each rank trains its block as one batched program and returns its
    seeds' results. Seed ``s`` writes ``out_dir/seed-{s}`` as in one process; rank 0 locks and
    checks the group directory and writes its ``seeds.json``. A failure on any rank raises on
    every rank. Without a process group, the plain :func:`tfmatcomp.train_many`.

    Example:
        >>> runs = train_many("tiny", seeds="0-1", n_steps=2, batch_size=4, log_every=2,
        ...                   progress=False)
        >>> runs.seeds
        [0, 1]
    """
    if not init(device):
        return multiseed.train_many(preset, seeds=seeds, out_dir=out_dir, device=device,
                                    resume=resume, overwrite=overwrite, progress=progress, **kwargs)
    _check_resume_overwrite(resume, overwrite)
    every = parse_seeds(seeds)
    mine = every[shard_range(len(every), rank(), world_size())]
    out = Path(out_dir) if out_dir is not None else None
    lock = rundir.RunDirLock(out) if out is not None and rank() == 0 else None

    def claim_group() -> None:
        lock.acquire()
        multiseed._claim_group(out, every, resume, overwrite)
        if resume:
            multiseed._check_resumable(out, every)
        multiseed._write_group_file(out, every)

    def work() -> MultiSeedResult:
        if not mine:
            return MultiSeedResult(seeds=[], results={}, out_dir=out, step=0)
        trainer = _SeedShard(preset, seeds=mine, out_dir=out, device=rank_device(device),
                             progress=progress and rank() == 0, overwrite=overwrite, **kwargs)
        return training._resume_and_run(trainer, resume)

    try:
        if out is not None:
            _on_main(claim_group)
        return _together(work)  # rank 0 keeps the group's lock until every rank is done
    finally:
        if lock is not None:
            lock.release()


# --------------------------------------------------------------------- sharded decomposition
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
