"""Training on every rank: :class:`DistributedTrainer` / :func:`train` (data-parallel, one
global batch) and :func:`train_many` (the seeds spread over the ranks).

Both run the one training loop (:mod:`tfmatcomp.training.loop`): data-parallel training plugs in
its :class:`DataParallelStep` (the explicit step on the rank's share of the batch, gradients
averaged by DistributedDataParallel); seed-parallel training gives each rank its block of seeds
as an ordinary batched group (:class:`~tfmatcomp.MultiSeedTrainer`).

Example:
    >>> from tfmatcomp.distributed.trainers import train
    >>> train("tiny", n_steps=2, batch_size=4, log_every=2, progress=False).step   # one process
    2
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from tfmatcomp.config import Preset
from tfmatcomp.distributed.group import (
    _active, _comm_device, _gather_rows, _on_main, _together, init, rank, rank_device,
    shard_range, world_size,
)
from tfmatcomp.runs import rundir
from tfmatcomp.runs.layout import checkpoint_path
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.metrics import mse
from tfmatcomp.training import multiseed
from tfmatcomp.training import trainer as training
from tfmatcomp.training.loop import check_n_steps, check_resume_overwrite, resume_and_run
from tfmatcomp.training.multiseed import MultiSeedResult, MultiSeedTrainer
from tfmatcomp.models.objectives import OBJECTIVES
from tfmatcomp.training.plan import plan_run
from tfmatcomp.training.steps import ExplicitStep
from tfmatcomp.training.trainer import Trainer, TrainResult

__all__ = ["DistributedTrainer", "DataParallelStep", "train", "train_many"]


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
        if self.objective is not OBJECTIVES["encoder"]:
            raise ValueError("DistributedTrainer: data-parallel training runs the encoder task "
                             "only; train a decoder preset (e.g. gpt-tiny) in one process")
        refused = self.plan.refused_by("data_parallel") if self.plan else None
        if refused is not None:
            raise ValueError(f"interventions: a {refused.kind} is collected on the whole batch; "
                             "data-parallel ranks see only their rows. Train it in one process")
        n = self.train_cfg.batch_size
        if n < self.world_size:
            raise ValueError(f"batch_size: {n} matrices cannot be shared by {self.world_size} "
                             "ranks; give at least one per rank")
        self.rows = shard_range(n, self.rank, self.world_size)
        if self.rank != 0:
            self.directory.shared()  # rank 0 alone touches the run directory
        self._ddp: DistributedDataParallel | None = None

    def _data_parallel(self) -> DistributedDataParallel:
        if self._ddp is None:  # a collective: every rank builds it at the same point
            ids = [self.device.index] if self.device.type == "cuda" else None
            self._ddp = DistributedDataParallel(self.model, device_ids=ids)
        return self._ddp

    def explicit_step(self) -> DataParallelStep:
        """The data-parallel step (:class:`DataParallelStep`)."""
        return DataParallelStep(self)

    def evaluate(self, batch_size: int | None = None) -> dict[str, float]:
        """Losses on a fresh evaluation batch, measured on rank 0 and given to every rank."""
        evaluate = super().evaluate
        return _on_main(lambda: evaluate(batch_size))

    def run_info(self) -> dict[str, Any]:
        """``run.json``'s record, with the number of ranks and the backend."""
        return {**super().run_info(), "world_size": self.world_size,
                "backend": dist.get_backend()}

    def open_log(self):
        """Rank 0's metrics log (None on the other ranks: rank 0 alone writes the run)."""
        return super().open_log() if self.rank == 0 else None

    def save(self, strip_older: bool = True) -> Path:
        """The checkpoint, written by rank 0 alone (every rank returns its path)."""
        if self.rank == 0:
            return super().save(strip_older)
        return checkpoint_path(self.out_dir, self.step)

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
        """:meth:`Trainer.run` on every rank; a directory that rank 0 refuses stops every rank."""
        check_n_steps(self.train_cfg.n_steps if n_steps is None else n_steps, self.step,
                      self.out_dir)
        self._data_parallel()
        _on_main(lambda: self.claim(resuming=False))  # a refused directory stops every rank
        return super().run(n_steps)


class DataParallelStep(ExplicitStep):
    """The explicit step of a :class:`DistributedTrainer`: every rank samples the full batch from
    the same seeded stream and runs its rows (:func:`shard_range`) through
    DistributedDataParallel. Each rank's loss is its rows' mean weighted by its share of the batch,
    so the averaged gradient is the global batch's; the global loss is all-reduced before the
    update, so every rank raises :class:`FloatingPointError` together. ``train_*`` losses come
    from every rank's predictions gathered."""

    def forward_loss(self, batch: MatrixBatch) -> tuple[Tensor, Tensor]:
        t = self.trainer
        rows = t.rows
        predictions = t._data_parallel()(batch.tokens[rows])
        share = (rows.stop - rows.start) / t.train_cfg.batch_size
        loss = mse(predictions, batch.values[rows]) * (share * t.world_size)
        total = (loss.detach() / t.world_size).to(_comm_device())
        dist.all_reduce(total)  # the global batch's loss: every rank sees a divergence together
        if not torch.isfinite(total):
            raise FloatingPointError(f"training diverged at step {t.step + 1}: loss is "
                                     f"{total.item()}; try a lower lr (now {t.train_cfg.lr})")
        return predictions, loss

    def train_metrics(self, update: tuple[Tensor, MatrixBatch]) -> list[dict[str, Tensor]]:
        predictions, batch = update
        return super().train_metrics((_gather_rows(predictions.detach()), batch))


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
    check_resume_overwrite(resume, overwrite)
    trainer = DistributedTrainer(preset, device=device, overwrite=overwrite, **kwargs)
    return resume_and_run(trainer, resume)


# -------------------------------------------------------------------------- seeds across ranks
class _SeedShard(MultiSeedTrainer):
    """One rank's block of a multi-seed group whose directory rank 0 claims."""

    def claim_group(self, resuming: bool) -> None:
        pass  # rank 0 holds the group directory

    def record_group(self) -> None:
        pass  # rank 0 wrote the whole group's


def train_many(preset: str | Preset = "tiny", *, seeds: str | int | Sequence[int],
               resume: bool = False, **keywords: Any) -> MultiSeedResult:
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
    device = keywords.get("device")
    if not init(device):
        return multiseed.train_many(preset, seeds=seeds, resume=resume, **keywords)
    plan = plan_run(preset, {**keywords, "device": rank_device(device)}, resume=resume, seeds=seeds,
                    batched=True)  # the entry point's one plan; each rank trains its block of it
    every = list(plan.seeds)
    mine = every[shard_range(len(every), rank(), world_size())]
    out = plan.out_dir
    lock = rundir.RunDirLock(out) if out is not None and rank() == 0 else None

    def claim_group() -> None:
        lock.acquire()
        rundir.check_group(out, every, resume, plan.overwrite)
        if resume:
            rundir.check_group_resumable(out, every)
        multiseed.write_group_file(out, every)

    def work() -> MultiSeedResult:
        if not mine:
            return MultiSeedResult(seeds=[], results={}, out_dir=out, step=0)
        trainer = _SeedShard.from_plan(replace(plan, seeds=tuple(mine),
                                               progress=plan.progress and rank() == 0))
        return resume_and_run(trainer, resume)

    try:
        if out is not None:
            _on_main(claim_group)
        return _together(work)  # rank 0 keeps the group's lock until every rank is done
    finally:
        if lock is not None:
            lock.release()
