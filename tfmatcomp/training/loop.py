"""The one training loop: schedule, evaluation, logging, checkpoints, locking and divergence checks.

Every way of training runs :func:`run_loop`; they differ only in the :class:`TrainingStep` they
plug in and in how many runs they advance together:

* :func:`tfmatcomp.train`: a :class:`~tfmatcomp.Trainer` (one run) with
  :class:`~tfmatcomp.training.steps.ExplicitStep` (float32) or
  :class:`~tfmatcomp.training.steps.FastTrainerStep` (bf16, :mod:`~tfmatcomp.training.fast_step`);
* :func:`tfmatcomp.train_many`: a :class:`~tfmatcomp.MultiSeedTrainer` (one run per seed) with
  :class:`~tfmatcomp.training.multiseed.VmapStep` (the seeds batched with ``vmap``);
* :func:`tfmatcomp.distributed.train`: a ``DistributedTrainer`` (one run, written by rank 0) with
  ``DataParallelStep`` (DistributedDataParallel);
* :func:`tfmatcomp.training.lm.train_lm`: :func:`tfmatcomp.train` of a language-model task (the
  ``"lm"`` objective brings AdamW, warm-up and cosine decay, clipping).

What the loop does, in order, at each step: the step's update; every run's step counter; at a
logging step (every ``log_every`` and the last) or a checkpoint step
(:meth:`Schedule.checkpoint_due`) the step's deferred divergence check
(:meth:`TrainingStep.check_finite`, which raises :class:`FloatingPointError`); at a logging step
the training losses of that update, a fresh evaluation and one metrics row per run; at a
checkpoint step the host's checkpoints. The host's run directories are locked from the start of
:func:`run_loop` until it returns, however it ends. Resuming (:meth:`~tfmatcomp.Trainer.resume`)
happens before, through the same host.

Example:
    >>> Schedule(n_steps=100, log_every=30, checkpoint_every=40).checkpoint_due(80)
    True
    >>> [s for s in range(1, 101) if Schedule(100, 30).log_due(s, last=100)]
    [30, 60, 90, 100]
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager, Protocol, Sequence

from tqdm.auto import tqdm

__all__ = ["Schedule", "TrainingStep", "RunRecord", "LoopHost", "run_loop", "check_n_steps",
           "check_resume_overwrite", "resume_and_run"]


@dataclass(frozen=True)
class Schedule:
    """When a run logs and checkpoints.

    Attributes:
        n_steps: the configured length of the run (its last step always gets a checkpoint).
        log_every: log every this many steps (and at the last step of each :func:`run_loop`).
        checkpoint_steps: steps that always get a checkpoint.
        checkpoint_every: also a checkpoint every this many steps (0: never).
    """

    n_steps: int
    log_every: int
    checkpoint_steps: Sequence[int] = ()
    checkpoint_every: int = 0

    @classmethod
    def from_config(cls, cfg: Any) -> "Schedule":
        """The schedule a :class:`~tfmatcomp.TrainConfig` gives."""
        return cls(cfg.n_steps, cfg.log_every, tuple(cfg.checkpoint_steps), cfg.checkpoint_every)

    def log_due(self, step: int, last: int) -> bool:
        """True when ``step`` is logged in a loop that ends at ``last``."""
        return step % self.log_every == 0 or step == last

    def checkpoint_due(self, step: int) -> bool:
        """True when the schedule asks for a checkpoint at ``step``."""
        return (step in self.checkpoint_steps or step == self.n_steps
                or (self.checkpoint_every > 0 and step % self.checkpoint_every == 0))


class TrainingStep:
    """What a way of training plugs into :func:`run_loop`: one optimizer update, the losses it
    logs, and the checks it defers. Subclasses implement :meth:`update`, :meth:`train_metrics`
    and :meth:`evaluate`; the defaults of the others suit a step that checks every loss at once."""

    #: one line shown above the progress bar (which step runs and why), or None
    description: str | None = None

    def update(self) -> Any:
        """One optimizer update of every run; returns what :meth:`train_metrics` reads.

        Raises:
            FloatingPointError: a loss is not finite (a step that checks at once).
        """
        raise NotImplementedError

    def train_metrics(self, update: Any) -> list[dict[str, Any]]:
        """Each run's training losses of the update that returned ``update`` (one dict per run)."""
        raise NotImplementedError

    def evaluate(self) -> list[dict[str, float]]:
        """Each run's losses on a fresh evaluation batch (one dict per run)."""
        raise NotImplementedError

    def check_finite(self, step: int) -> None:
        """Raise :class:`FloatingPointError` if a loss since the last check was not finite; called
        at logging and checkpoint steps (a step that checks every loss at once does nothing)."""

    def numerics(self) -> ContextManager[None]:
        """The numerical settings the loop runs under (default: unchanged)."""
        return contextlib.nullcontext()


class RunRecord(Protocol):
    """One run's side of the loop: its step counter, clock and metrics log."""

    step: int
    elapsed_s: float

    def open_log(self) -> Any:
        """Open the run's metrics log for appending (None without a run directory)."""

    def log(self, train: dict[str, Any], evaluation: dict[str, Any], log_file: Any = None
            ) -> dict[str, Any]:
        """Append and return one metrics row for the current step."""


class LoopHost(Protocol):
    """What :func:`run_loop` trains: the runs it advances together and their directories."""

    out_dir: Path | None
    progress: bool
    schedule: Schedule

    @property
    def runs(self) -> Sequence[RunRecord]:
        """The runs advanced together (one per seed of a multi-seed group)."""

    def start(self) -> None:
        """Lock the run directories and check that the runs may write there."""

    def close(self) -> None:
        """Release the locks (the loop calls it however it ends)."""

    def save_checkpoints(self) -> None:
        """Write every run's checkpoint at the current step."""

    def postfix(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        """What the progress bar shows after a logging step."""


def run_loop(host: LoopHost, step: TrainingStep, n_steps: int, desc: str = "train") -> None:
    """Train ``host``'s runs with ``step`` until step ``n_steps``, logging and checkpointing on
    ``host.schedule`` (see the module docstring).

    Raises:
        ValueError: ``n_steps`` is not a positive integer, or is below the current step.
        FloatingPointError: a loss was not finite.
        RunDirError: a run directory cannot be used (see :mod:`tfmatcomp.runs.rundir`).
    """
    runs = list(host.runs)
    first = runs[0]
    n_steps = check_n_steps(n_steps, first.step, host.out_dir)
    logs: list[Any] = []
    try:
        host.start()
        logs = [r.open_log() for r in runs]
    except BaseException:
        for f in logs:
            if f is not None:
                f.close()
        host.close()
        raise
    bar = tqdm(total=n_steps, initial=first.step, disable=not host.progress, desc=desc,
               dynamic_ncols=True)
    if host.progress and step.description:
        bar.write(step.description)
    schedule = host.schedule
    try:
        with step.numerics():
            t0 = time.perf_counter() - first.elapsed_s
            while first.step < n_steps:
                update = step.update()
                for r in runs:
                    r.step += 1
                bar.update(1)
                logging = schedule.log_due(first.step, n_steps)
                saving = host.out_dir is not None and schedule.checkpoint_due(first.step)
                if logging or saving:
                    step.check_finite(first.step)
                if logging:
                    train = step.train_metrics(update)
                    elapsed = time.perf_counter() - t0
                    for r in runs:
                        r.elapsed_s = elapsed
                    evaluation = step.evaluate()
                    rows = [r.log(t, e, f) for r, t, e, f in zip(runs, train, evaluation, logs)]
                    bar.set_postfix(host.postfix(rows))
                if saving:
                    elapsed = time.perf_counter() - t0
                    for r in runs:
                        r.elapsed_s = elapsed
                    host.save_checkpoints()
    finally:
        bar.close()
        for f in logs:
            if f is not None:
                f.close()
        host.close()


def check_n_steps(n_steps: Any, step: int, out_dir: Path | None) -> int:
    """``n_steps`` if a run standing at ``step`` may train until it.

    Raises:
        ValueError: ``n_steps`` is not a positive integer, or is below ``step``.

    Example:
        >>> check_n_steps(0, 0, None)
        Traceback (most recent call last):
        ...
        ValueError: n_steps: must be a positive integer, got 0
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps: must be a positive integer, got {n_steps!r}")
    if n_steps < step:
        raise ValueError(f"n_steps: {n_steps} is below step {step}, where the run "
                         f"{'in ' + str(out_dir) + ' ' if out_dir else ''}stands; training never "
                         f"goes back: give n_steps >= {step}")
    return n_steps


def check_resume_overwrite(resume: bool, overwrite: bool) -> None:
    """Refuse ``resume`` and ``overwrite`` together (they ask for opposite things).

    Raises:
        ValueError: both are true.
    """
    if resume and overwrite:
        raise ValueError("resume, overwrite: give at most one of them (resume continues the run "
                         "in out_dir, overwrite deletes it)")


def resume_and_run(trainer: Any, resume: bool) -> Any:
    """``trainer.resume()`` when asked, then ``trainer.run()``; the trainer's locks are released
    however it ends (``trainer.close()``)."""
    try:
        if resume:
            trainer.resume()
        return trainer.run()
    finally:
        trainer.close()
