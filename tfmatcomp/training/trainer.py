"""Online training on matrix completion: a fresh batch every step, Adam at a constant rate, MSE.

The :class:`Trainer` holds one run (model, optimizer, generators, run directory) and trains it
through the one loop of :mod:`tfmatcomp.training.loop`, plugging in the float32 step or the fast
one (:mod:`tfmatcomp.training.steps`). The model kind follows the model config through its
objective (:func:`tfmatcomp.models.objectives.objective_for`): an
:class:`~tfmatcomp.EncoderConfig` trains a :class:`~tfmatcomp.HookedEncoder` on the masked-entry MSE;
a :class:`~tfmatcomp.DecoderConfig` trains a :class:`~tfmatcomp.HookedDecoder` on the GPT variant
(:mod:`tfmatcomp.task.gpt`: next-token cross-entropy on the value tokens). Both log ``L``,
``L_obs``, ``L_mask`` (the decoder's from its arg-max values); the decoder also logs ``CE*`` and
``acc*`` and, at evaluation, the papers' greedy completion (``gen_*``). With a
:class:`~tfmatcomp.training.lm.TextTask` as ``task_cfg``, a decoder is the character-level language
model (the ``"lm"`` objective: AdamW, warm-up and cosine decay, clipping; ``lr``, ``train_loss``,
``eval_loss``; :func:`~tfmatcomp.training.lm.train_lm` is that call).

Seeded and resumable: the model, the training stream and the evaluation stream each have their own
seeded generator, and a checkpoint stores the optimizer and both generators, so resuming continues
the exact trajectory of an uninterrupted run.

Conventions of the metrics log (``RUN_DIR/metrics.jsonl``, one JSON object per logged step):

* ``train_*``: losses of that step's training batch, measured in the forward pass that the update
  used (before the update).
* ``eval_*``: losses on a fresh evaluation batch, measured after the update.
* the checkpoint at step ``s`` holds the weights after ``s`` updates.

A run directory holds one run, written by one trainer at a time (see :mod:`tfmatcomp.runs.rundir`):
training from step 0 into a directory that holds a run is refused unless ``resume=True`` or
``overwrite=True``, and a trainer locks the directory while it writes.

Example:
    >>> import tfmatcomp as tm
    >>> result = tm.train("tiny", n_steps=20, batch_size=16, log_every=10, progress=False)
    >>> list(result.metrics["step"])
    [10, 20]
"""

from __future__ import annotations

import contextlib
import os
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from tfmatcomp.runs import rundir
from tfmatcomp.runs.checkpoint import (
    CheckpointError, ConfigMismatchError, load_checkpoint_info, load_training_state, save_checkpoint,
)
from tfmatcomp.runs.layout import METRICS_FILE, RUN_FILE
from tfmatcomp.runs.run_directory import RunDirectory
from tfmatcomp.config import Preset, TaskConfig, TrainConfig
from tfmatcomp.interventions.during_training import Reinitialize
from tfmatcomp.datapath import inference_bf16
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.models.decoder import HookedDecoder
from tfmatcomp.training import fast_step
from tfmatcomp.training.interventions import TrainingPlan, fresh_seed
from tfmatcomp.training.loop import Schedule, TrainingStep, check_n_steps, resume_and_run, run_loop
from tfmatcomp.training.plan import RunPlan, plan_run
from tfmatcomp.models.objectives import objective_for
from tfmatcomp.training.steps import ExplicitStep, FastTrainerStep
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.training.state import RunState

__all__ = ["Trainer", "TrainResult", "train", "read_metrics", "processor"]

#: TrainConfig fields that must match for a resumed run to continue the same trajectory.
_SAME_RUN_FIELDS = ("seed", "lr", "batch_size", "eval_batch_size", "interventions")


def processor(device: torch.device | str = "cpu") -> str:
    """The processor that runs ``device``'s kernels, as ``run.json`` records it.

    A CPU is named by its model name, family and model numbers (``/proc/cpuinfo``, where there is
    one) and the instruction set torch's kernels dispatch to: two CPU generations with the same
    instruction set can still split float reductions differently, so the same seed, torch version
    and thread count is guaranteed to give bit-identical metrics only on the same CPU model. A GPU
    is named by ``torch.cuda.get_device_name``, another device by its type.

    Example:
        >>> "torch kernels" in processor("cpu")
        True
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    info: dict[str, str] = {}
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    name = info.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    numbers = (f"family {info['cpu family']}, model {info['model']}; "
               if "cpu family" in info and "model" in info else "")
    return f"{name} ({numbers}torch kernels {torch.backends.cpu.get_cpu_capability()})"


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    model: HookedEncoder | HookedDecoder
    metrics: pd.DataFrame
    out_dir: Path | None
    step: int


class Trainer:
    """Online trainer. Prefer :func:`train` unless you need to drive it step by step.

    Args:
        preset: name or :class:`Preset` supplying defaults for the three configs.
        model: start from this model instead of a fresh one (its config must equal ``model_cfg``
            when both are given).
        plan: the run's :class:`~tfmatcomp.training.plan.RunPlan`, taken as it is (instead of
            ``preset`` and ``keywords``; see :meth:`from_plan`).
        keywords: the fields of :class:`~tfmatcomp.training.plan.RunSetup` (``model_cfg``,
            ``task_cfg``, ``train_cfg``, ``out_dir``, ``device``, ``progress``, ``overwrite``) and
            :class:`TrainConfig` fields (``n_steps=300, lr=1e-3, ...``). The trainer locks
            ``out_dir`` during :meth:`run`, and from :meth:`resume` until the end of the next run
            or :meth:`close`; call :meth:`resume` to continue a run there. Freezing or
            re-initializing parameter groups (component-wise training) are interventions during
            training: ``interventions=[Freeze(...), Reinitialize(...)]``
            (:mod:`tfmatcomp.interventions.during_training`).

    On CUDA, and on a CPU with bf16 matrix units for models with ``d_model >= 256``, a run that
    allows it takes the fast step of :mod:`tfmatcomp.training.fast_step` (bf16 matmuls, fused Adam);
    ``fast=False`` keeps the explicit float32 step. ``step_reason`` (also in ``run.json``) says
    which step runs and why. A run with a hook attached when :meth:`run` starts takes the
    explicit step.

    The trainer is the host of one run in :func:`~tfmatcomp.training.loop.run_loop`
    (:meth:`start`, :meth:`save_checkpoints`, :meth:`close`, :meth:`training_step`: the step it
    plugs in). The run's state (model, optimizer, generators, step, clock) is its :attr:`state`, a
    :class:`~tfmatcomp.training.state.RunState`; its files (lock, metrics record, checkpoints,
    resume) are its :attr:`directory`, a :class:`~tfmatcomp.runs.run_directory.RunDirectory`.
    Keywords are resolved into a plan once (:func:`~tfmatcomp.training.plan.plan_run`): the step
    is the plan's.
    """

    def __init__(
        self,
        preset: str | Preset = "tiny",
        *,
        model: HookedEncoder | HookedDecoder | None = None,
        plan: RunPlan | None = None,
        **keywords: Any,
    ):
        own_step = type(self).explicit_step is not Trainer.explicit_step
        if plan is None:
            plan = plan_run(preset, keywords, own_step=own_step,
                            model_cfg=model.cfg if model is not None else None)
        elif keywords:
            raise TypeError(f"plan: give a plan or keywords, not both (got {sorted(keywords)})")
        elif plan.seeds is not None:
            raise ValueError("plan: a group's plan; give one seed's (plan.for_seed(s))")
        elif plan.fast and own_step:
            raise ValueError(f"plan: {type(self).__name__} takes its own step, the plan the fast "
                             "one; plan it with own_step=True")
        #: the run's plan, decided at the entry point
        self.run_plan = plan
        self.model_cfg, self.task_cfg, self.train_cfg = plan.model_cfg, plan.task_cfg, plan.train_cfg
        self.task = self.task_cfg.build()
        #: what the model kind decides: tokens, loss, optimizer, logged metrics
        self.objective = objective_for(self.model_cfg, self.task_cfg)
        self.objective.check_task(self.task, self.model_cfg)
        self.device = plan.device
        #: the run directory: lock, metrics record, checkpoints, resume (:mod:`tfmatcomp.runs`)
        self.directory = RunDirectory(plan.out_dir, plan.overwrite)
        self.out_dir = plan.out_dir
        self.progress = plan.progress
        seed = self.train_cfg.seed
        if model is None:
            model = self.objective.model_class(self.model_cfg, seed=seed)
        elif model.cfg != self.model_cfg:
            raise ConfigMismatchError("model: its config differs from model_cfg")
        model = model.to(self.device).train()
        if self.objective.task_recorded:
            model.task_cfg = self.task_cfg
        #: whether the run takes the fast step, and why (``run.json``'s ``"step"``): the plan's
        self.fast, self.step_reason = plan.fast, plan.step_reason
        #: the model's parameters by name (the same objects for the whole run)
        self._named_parameters = dict(model.named_parameters())
        #: the run's interventions during training, ready to apply (None without any)
        self.plan = TrainingPlan.for_model(
            model, self.train_cfg.interventions,
            None if self.task_cfg.mixture else (self.task_cfg.n_cols or self.task_cfg.n_rows)
        ) if self.train_cfg.interventions else None
        self._fast_training_step: FastTrainerStep | None = None
        optimizer = self.objective.make_optimizer(model, self.train_cfg.lr, self.task, self.fast)
        #: the run's state: model, optimizer, generators, step, clock
        self.state = RunState.fresh(model, optimizer, seed,
                                    self.objective.generator_device(self.device))
        #: the objective's fixed evaluation batches, drawn now from the evaluation stream (None:
        #: a fresh batch at every evaluation)
        self.evaluation = self.objective.evaluation_batches(
            self.task, self.state.eval_gen, self.train_cfg.eval_batch_size)

    @classmethod
    def from_plan(cls, plan: RunPlan, model: HookedEncoder | HookedDecoder | None = None) -> Trainer:
        """The trainer of one run's ``plan`` (:mod:`tfmatcomp.training.plan`), taken as it is."""
        return cls(model=model, plan=plan)

    # ------------------------------------------------------------ state
    model = property(lambda self: self.state.model, doc="The model trained.")
    optimizer = property(lambda self: self.state.optimizer, doc="Its Adam.")
    train_gen = property(lambda self: self.state.train_gen, doc="The training stream's generator.")
    eval_gen = property(lambda self: self.state.eval_gen, doc="The evaluation stream's generator.")

    @property
    def step(self) -> int:
        """Optimizer updates so far."""
        return self.state.step

    @step.setter
    def step(self, value: int) -> None:
        self.state.step = value

    @property
    def elapsed_s(self) -> float:
        """Training seconds so far."""
        return self.state.elapsed_s

    @elapsed_s.setter
    def elapsed_s(self, value: float) -> None:
        self.state.elapsed_s = value

    @property
    def records(self) -> list[dict[str, Any]]:
        """The metrics rows so far (the run directory's record)."""
        return self.directory.records

    @records.setter
    def records(self, value: list[dict[str, Any]]) -> None:
        self.directory.records = value

    def training_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, json_state)``: everything besides the weights needed to resume exactly."""
        return self.state.training_state(with_weights=self.train_cfg.checkpoint_dtype != "float32")

    def load_training_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        self.state.load_training_state(tensors, state)

    # ------------------------------------------------------- run directory
    def claim(self, resuming: bool) -> None:
        """Lock the run directory (:meth:`RunDirectory.claim
        <tfmatcomp.runs.run_directory.RunDirectory.claim>`)."""
        self.directory.claim(resuming)

    def close(self) -> None:
        """Release the run directory's lock (done at the end of every :meth:`run`)."""
        self.directory.release()

    def save(self, strip_older: bool = True) -> Path:
        """Write a checkpoint for the current step (with training state). Older checkpoints keep
        their weights but drop their training state (now, or later through
        :meth:`strip_older_states` when ``strip_older=False``), so disk use stays bounded."""
        cfg = self.train_cfg
        path = self.directory.save(self.step, lambda path: save_checkpoint(
            self.model, path, train_cfg=cfg, step=self.step,
            training_state=self.training_state(), dtype=cfg.checkpoint_dtype,
            max_shard_mb=cfg.max_shard_mb, **self.objective.checkpoint_fields(self.task_cfg)))
        if strip_older:
            self.strip_older_states()
        return path

    def strip_older_states(self) -> None:
        """Drop the training state of every checkpoint but the current step's."""
        self.directory.strip_older_states(self.step)

    def resume(self) -> bool:
        """Continue from the latest checkpoint with usable training state.

        The run is cut back to that checkpoint: log rows and checkpoints after its step are
        removed (training writes them again, identically at the same thread count). Unreadable
        log lines are kept aside in ``metrics.jsonl.bad`` with a warning. Returns False when the
        directory holds no checkpoint at all (absent, empty, or a run killed before its first
        checkpoint): training then starts again from step 0.

        Raises:
            ConfigMismatchError: if that checkpoint (or ``run.json``) was written with other
                configs.
            RunDirError: if checkpoints exist but none has usable training state, or the
                directory holds something else than this run.
            RunDirLockedError: if another trainer is writing to the directory.
        """
        found = self.resume_latest()
        # a run killed between writing a checkpoint and stripping the one before holds two with
        # training state; it continues from the latest alone
        self.strip_older_states()
        return found

    def resume_latest(self) -> bool:
        """:meth:`resume` without dropping the training state of older checkpoints (a seed group
        resumes its seeds so, then moves them to their common step)."""
        return self.directory.resume_latest(self.restore, self._check_recorded)

    def restore(self, path: Path, step: int | None = None) -> None:
        """Load the checkpoint at ``path`` (named for ``step``) with its training state and cut the
        run back to it (the caller holds the run directory's lock: :meth:`claim`).

        Raises:
            CheckpointError: the checkpoint or its training state is unusable.
            ConfigMismatchError: it was written by a run of other configs.
        """
        model, info = load_checkpoint_info(path, config=self.model_cfg)
        tensors, state = load_training_state(path)
        self._check_same_run(self.objective.recorded_task(info), info.train_cfg,
                             f"checkpoint {path}")
        self.state.check_state(path, step if step is not None else info.step, state)
        missing = [k for k in ("rng.train", "rng.eval") if k not in tensors]
        if missing:
            raise CheckpointError(f"path: {path} has training state without {missing}; it cannot "
                                  "be resumed exactly")
        self.state.copy_weights(model)
        try:
            self.load_training_state(tensors, state)
        except (KeyError, TypeError, RuntimeError) as e:
            raise CheckpointError(f"path: {path} has unusable training state "
                                  f"({type(e).__name__}: {e})") from None
        self.directory.cut_back(self.step)

    def _check_recorded(self, recorded: tuple) -> None:
        """A directory without checkpoints holds at most the start of this very run."""
        model_cfg, task_cfg, train_cfg = recorded
        source = str(self.out_dir / RUN_FILE)
        if model_cfg != self.model_cfg:
            raise ConfigMismatchError(f"model_cfg: {source} records another model config "
                                      f"({model_cfg})")
        self._check_same_run(task_cfg, train_cfg, source)

    def _check_same_run(self, task: Any, train_cfg: TrainConfig | None, source: str) -> None:
        """``task``: what ``source`` records of its task (the objective's
        :meth:`~tfmatcomp.models.objectives.Objective.task_record`)."""
        ours = self.objective.task_record(self.task_cfg)
        if task != ours:
            raise ConfigMismatchError(f"task_cfg: {source} was trained on {task}, not {ours}")
        theirs = train_cfg.to_dict() if train_cfg else {}
        ours = self.train_cfg.to_dict()
        changed = [k for k in _SAME_RUN_FIELDS if theirs.get(k) != ours.get(k)]
        if changed:
            raise ConfigMismatchError(f"train_cfg: {changed} differ from {source}; resuming would "
                                      "not continue the same trajectory")

    # ------------------------------------------------------------- loop
    def open_log(self):
        """Create the run directory, write ``run.json`` and open the metrics log for appending
        (None without a run directory)."""
        return self.directory.open_log(self.run_info() if self.objective.task_recorded else None)

    def run_info(self) -> dict[str, Any]:
        """What ``run.json`` records about this run."""
        return {"kind": self.objective.kind,
                "model": self.model_cfg.to_dict(), "task": self.task_cfg.to_dict(),
                "train": self.train_cfg.to_dict(), "seed": self.train_cfg.seed,
                "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                "device": str(self.device), "processor": processor(self.device),
                "step": self.step_reason}

    def log(self, train: dict[str, Any], evaluation: dict[str, float], log_file=None) -> dict[str, Any]:
        """Append one metrics record for the current step (``train_*`` from the update's forward
        pass, ``eval_*`` from :meth:`evaluate`; the objective's
        :meth:`~tfmatcomp.models.objectives.Objective.record`) and write it to ``log_file``."""
        record = self.objective.record(self.step, train, evaluation)
        record["elapsed_s"] = round(self.elapsed_s, 3)
        return self.directory.append(record, log_file)

    def checkpoint_due(self, step: int) -> bool:
        """True when the schedule asks for a checkpoint at ``step``."""
        return self.schedule.checkpoint_due(step)

    @torch.no_grad()
    def evaluate(self, batch_size: int | None = None) -> dict[str, float]:
        """Losses on a fresh batch from the evaluation stream (float32; a fast run on a CPU runs
        the forward pass under bf16 autocast, as :mod:`tfmatcomp.datapath` does for wide models)."""
        if self.evaluation is not None:
            return self.objective.evaluate_batches(self.model, self.evaluation)
        was_training = self.model.training
        self.model.eval()
        batch = self.task.sample(batch_size or self.train_cfg.eval_batch_size,
                                 generator=self.eval_gen, device=self.device)
        tokens = self.objective.model_tokens(batch)
        bf16 = self.fast and inference_bf16(self.model)  # a CPU with bf16 units, d_model >= 256
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext(), \
                self.intervened(self.step - 1):
            output = self.model(tokens)
        out = {k: v.item() for k, v in self.objective.metrics(output.float(), batch, tokens).items()}
        out.update(self.objective.evaluation_metrics(self.model, batch))
        self.model.train(was_training)
        return out

    # ------------------------------------------------------------- the step
    def intervened(self, step: int):
        """The hooks of the interventions during training active at the update from ``step``,
        attached to the model for the body of a ``with`` (nothing without interventions)."""
        return self.plan.applied(self.model, step) if self.plan else contextlib.nullcontext()

    def reinitialize_due(self, step: int) -> None:
        """Before the update from ``step``: the re-initializations due then (nothing without)."""
        if self.plan:
            self.plan.reinitialize(step, self._named_parameters, self.optimizer,
                                   self.fresh_parameters)

    def drop_frozen_grads(self, step: int) -> None:
        """Between the backward pass and the optimizer step of the update from ``step``: drop the
        gradients of the parameters frozen then (nothing without interventions)."""
        if self.plan:
            self.plan.drop_frozen_grads(step, self._named_parameters)

    def penalty_terms(self, step: int, batch: MatrixBatch):
        """The loss terms of the attention penalties active at the update from ``step``, collected
        on ``batch`` for the body of a ``with`` (an empty list without any)."""
        return (self.plan.penalty(self.model, step, batch) if self.plan
                else contextlib.nullcontext([]))

    def fresh_parameters(self, reinit: Reinitialize) -> list[dict[str, torch.Tensor]]:
        """The freshly initialized weights ``reinit`` copies into this run (a one-item list): the
        model's own initialization from ``reinit.seed``, or from a seed of the run's seed and
        ``reinit.step`` (:func:`~tfmatcomp.training.interventions.fresh_seed`)."""
        seed = reinit.seed if reinit.seed is not None else fresh_seed(self.train_cfg.seed,
                                                                        reinit.step)
        return [dict(self.objective.model_class(self.model_cfg, seed=seed).named_parameters())]

    def explicit_step(self) -> TrainingStep:
        """The float32 step (:class:`~tfmatcomp.training.steps.ExplicitStep`; the data-parallel
        trainer of :mod:`tfmatcomp.distributed` plugs in its own)."""
        return ExplicitStep(self)

    def training_step(self) -> TrainingStep:
        """The step :meth:`run` plugs into the loop: the fast one
        (:class:`~tfmatcomp.training.steps.FastTrainerStep`) when chosen and no hook is attached,
        else :meth:`explicit_step`."""
        if not self.fast:
            return self.explicit_step()
        if fast_step.hooks_attached(self.model):
            if self.train_cfg.fast:
                warnings.warn("fast: hooks are attached to the model, so this run takes the "
                              "explicit step", stacklevel=3)
            return self.explicit_step()
        if self._fast_training_step is None:
            self._fast_training_step = FastTrainerStep(self)
        return self._fast_training_step

    def update(self) -> tuple[torch.Tensor, MatrixBatch]:
        """One update of :meth:`explicit_step` on a fresh batch of the training stream (the step
        counter is the caller's); returns the predictions (a decoder's logits) it used and the batch.
        :meth:`run` does not call it: it plugs :meth:`training_step` into the loop, so a subclass
        changes the training step by overriding :meth:`explicit_step`.

        Raises:
            FloatingPointError: if the loss is not finite.
        """
        return self.explicit_step().update()

    # ------------------------------------------------------------- the loop's host
    @property
    def schedule(self) -> Schedule:
        """When this run logs and checkpoints (from its :class:`~tfmatcomp.TrainConfig`)."""
        return Schedule.from_config(self.train_cfg)

    @property
    def runs(self) -> list["Trainer"]:
        """The runs the loop advances: this one."""
        return [self]

    def start(self) -> None:
        """Claim the run directory for a run (:meth:`claim`) and put the model in training mode."""
        self.claim(resuming=False)
        self.model.train()

    def save_checkpoints(self) -> None:
        """The loop's checkpoint: :meth:`save`."""
        self.save()

    def postfix(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        """The progress bar's losses after a logging step."""
        return self.objective.postfix(rows[0])

    def run(self, n_steps: int | None = None) -> TrainResult:
        """Train until step ``n_steps`` (default: the config's), logging and checkpointing
        (:func:`~tfmatcomp.training.loop.run_loop`).

        Raises:
            ValueError: ``n_steps`` is not a positive integer, or is below the current step.
            FloatingPointError: a loss was not finite.
            RunDirError: see ``out_dir`` in the class docstring.
        """
        n_steps = check_n_steps(self.train_cfg.n_steps if n_steps is None else n_steps,
                                self.step, self.out_dir)
        run_loop(self, self.training_step(), n_steps, desc="train")
        self.model.eval()
        return TrainResult(model=self.model, metrics=pd.DataFrame(self.records),
                           out_dir=self.out_dir, step=self.step)


def train(preset: str | Preset = "tiny", *, resume: bool = False, **keywords: Any) -> TrainResult:
    """Train a :class:`HookedEncoder` (or, with a :class:`DecoderConfig` / the ``gpt-tiny``
    preset, a :class:`HookedDecoder` on the GPT variant) on matrix completion (``keywords``: those
    of :class:`Trainer`, i.e. :class:`~tfmatcomp.training.plan.RunSetup`'s fields, ``model`` and
    :class:`TrainConfig` fields).

    With ``resume=True`` and an ``out_dir`` holding checkpoints, training continues from the latest
    one with training state and reproduces the uninterrupted run exactly (same seed and thread
    count -> same losses); an absent or empty ``out_dir`` starts fresh (see
    :meth:`Trainer.resume`). Without ``resume``, an ``out_dir`` that already holds a run is
    refused unless ``overwrite=True``, which clears it first.

    To train several seeds at once as one batched program, use :func:`tfmatcomp.train_many`.

    Example:
        >>> import tfmatcomp as tm
        >>> r = tm.train("tiny", n_steps=10, batch_size=8, log_every=5, progress=False)
        >>> r.step, sorted(c for c in r.metrics.columns if c.startswith("eval_"))[:2]
        (10, ['eval_L', 'eval_L_mask'])
    """
    model = keywords.pop("model", None)
    plan = plan_run(preset, keywords, resume=resume,
                    model_cfg=model.cfg if model is not None else None)
    return resume_and_run(Trainer.from_plan(plan, model), resume)


def read_metrics(path: str | os.PathLike) -> pd.DataFrame:
    """The metrics log of a run (``RUN_DIR`` or ``RUN_DIR/metrics.jsonl``) as a DataFrame.

    Every readable row is kept; unreadable lines (a line cut short by a crash, garbage) are
    skipped with a warning naming the file and their line numbers.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"path: no metrics log at {path}")
    return pd.DataFrame(rundir.read_log(path, stacklevel=3)[0])
