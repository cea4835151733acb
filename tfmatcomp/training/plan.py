"""A run plan, resolved once at the entry point.

Every way of training (:func:`tfmatcomp.train`, :func:`tfmatcomp.train_many`,
:func:`tfmatcomp.sweep`, ``tfmatcomp train`` / ``demo`` / ``sweep``, the data-parallel trainer)
turns its arguments into one immutable :class:`RunPlan`: the three configs, the device, the seeds,
the step to plug in and why, whether a group of seeds is batched or trained one at a time, the run
directory, resume or not. The preset is read here and nowhere below; the fast step is decided here
(:func:`~tfmatcomp.training.fast_step.decide`) and nowhere below; the trainers take the plan as it
is (:meth:`~tfmatcomp.Trainer.from_plan`, :meth:`~tfmatcomp.MultiSeedTrainer.from_plan`).

Example:
    >>> plan = plan_run("tiny", {"n_steps": 20, "progress": False, "device": "cpu"}, seeds="0-1")
    >>> plan.seeds, plan.batched, plan.train_cfg.n_steps
    ((0, 1), True, 20)
    >>> plan.for_seed(1).train_cfg.seed, plan.for_seed(1).step_reason == BATCHED_STEP
    (1, True)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from tfmatcomp.config import (DecoderConfig, EncoderConfig, Preset, TaskConfig, TrainConfig,
                              get_preset)
from tfmatcomp.models.objectives import objective_for
from tfmatcomp.runs.layout import seed_dir
from tfmatcomp.training import fast_step
from tfmatcomp.training.loop import check_resume_overwrite
from tfmatcomp.validation import check_device

__all__ = ["RunSetup", "RunPlan", "plan_run", "plan_configs", "default_device", "BATCHED_STEP",
           "parse_seeds", "MAX_SEEDS"]

#: What a seed's ``run.json`` says of the step that trained it in the batched program.
BATCHED_STEP = "float32 step: the batched multi-seed program (vmap over the seeds)"

#: The most seeds one group may train (each is a full training run).
MAX_SEEDS = 10_000


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_seeds(text: str | int | Sequence[int]) -> list[int]:
    """Seeds from ``"0-7"``, ``"0,3,5"``, ``"0-3,8"``, an int or a sequence; sorted, no repeats,
    at most :data:`MAX_SEEDS` of them (checked before any list is built).

    Example:
        >>> parse_seeds("0-3,8"), parse_seeds(5), parse_seeds([2, 1])
        ([0, 1, 2, 3, 8], [5], [1, 2])
    """
    if isinstance(text, int) and not isinstance(text, bool):
        seeds = [text]
    elif isinstance(text, str):
        seeds = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if m is None:
                raise ValueError(f"seeds: cannot read {part!r}; write e.g. '0-7' or '0,3,5'")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError(f"seeds: range {part!r} runs backwards")
            if hi - lo + 1 + len(seeds) > MAX_SEEDS:
                raise ValueError(f"seeds: at most {MAX_SEEDS:,} seeds, got {text!r}")
            seeds.extend(range(lo, hi + 1))
    else:
        seeds = [int(s) for s in text]
    if len(seeds) > MAX_SEEDS:
        raise ValueError(f"seeds: at most {MAX_SEEDS:,} seeds, got {len(seeds):,}")
    if not seeds or any(s < 0 for s in seeds):
        raise ValueError(f"seeds: give at least one non-negative seed, got {text!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: {text!r} repeats a seed")
    return sorted(seeds)


@dataclass(frozen=True)
class RunSetup:
    """The keywords every training entry point takes, stated once.

    :class:`~tfmatcomp.Trainer`, :func:`~tfmatcomp.train`, :class:`~tfmatcomp.MultiSeedTrainer`,
    :func:`~tfmatcomp.train_many`, :func:`~tfmatcomp.sweep`, their forms in
    :mod:`tfmatcomp.distributed` and ``tfmatcomp train`` all take ``preset`` and then these fields
    as keywords; any other keyword is a :class:`~tfmatcomp.TrainConfig` field (``n_steps=300,
    lr=1e-3, ...``) and lands in ``train_overrides``. Each entry point adds only its own keywords
    (``resume``; ``model`` for one run; ``seeds`` for a group).

    Attributes:
        preset: name or :class:`~tfmatcomp.Preset` supplying defaults for the three configs.
        model_cfg, task_cfg, train_cfg: override the preset's configs.
        out_dir: run directory for ``metrics.jsonl`` and ``checkpoints/``; None keeps everything
            in memory (no checkpoints, no resume). Training from step 0 refuses a directory that
            already holds a run (:class:`~tfmatcomp.runs.rundir.RunDirError`); resume continues
            it. A trainer locks the directory while it writes.
        device: training device (default: CUDA when present, else CPU).
        progress: show a tqdm progress bar with the current losses.
        overwrite: clear ``out_dir`` before training from step 0 (only a directory holding
            nothing but run files is cleared).
        train_overrides: :class:`~tfmatcomp.TrainConfig` fields replacing those of ``train_cfg``.

    Example:
        >>> setup = RunSetup.from_keywords("tiny", {"n_steps": 20, "progress": False})
        >>> setup.progress, setup.train_overrides
        (False, {'n_steps': 20})
        >>> model_cfg, task_cfg, train_cfg = setup.configs()
        >>> train_cfg.n_steps, task_cfg.n_rows
        (20, 4)
    """

    preset: str | Preset = "tiny"
    model_cfg: EncoderConfig | DecoderConfig | None = None
    task_cfg: TaskConfig | None = None
    train_cfg: TrainConfig | None = None
    out_dir: str | os.PathLike | None = None
    device: torch.device | str | None = None
    progress: bool = True
    overwrite: bool = False
    train_overrides: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_keywords(cls, preset: str | Preset, keywords: Mapping[str, Any]) -> RunSetup:
        """``preset`` and an entry point's keywords: this class's fields by name, every other
        keyword a train override."""
        own = {f.name for f in fields(cls)} - {"preset", "train_overrides"}
        return cls(preset, **{k: v for k, v in keywords.items() if k in own},
                   train_overrides={k: v for k, v in keywords.items() if k not in own})

    def configs(self) -> tuple[EncoderConfig | DecoderConfig, TaskConfig, TrainConfig]:
        """``(model_cfg, task_cfg, train_cfg)``: the preset's, where not given, with the train
        overrides applied (the preset is read only when a config is missing).

        Raises:
            TypeError: a train override is no :class:`~tfmatcomp.TrainConfig` field.
        """
        given = (self.model_cfg, self.task_cfg, self.train_cfg)
        preset = get_preset(self.preset) if any(c is None for c in given) else None
        return (self.model_cfg or preset.model, self.task_cfg or preset.task,
                replace(self.train_cfg or preset.train, **self.train_overrides))


@dataclass(frozen=True)
class RunPlan:
    """Everything an entry point decides about a run (or a group of seeds), decided once.

    Attributes:
        model_cfg, task_cfg, train_cfg: the run's configs (a group's ``train_cfg.seed`` is the
            first seed's; :meth:`for_seed` gives each seed's plan).
        device: where it trains.
        fast: whether the run takes the fast step (:mod:`~tfmatcomp.training.fast_step`).
        step_reason: which step trains it and why (``run.json``'s ``"step"``).
        seeds: a group's seeds (sorted), or None for one run.
        batched: a group trained as one batched program (``vmap``) rather than one seed after
            another (always False for one run).
        out_dir: the run directory (a group's: seed ``s`` writes ``out_dir/seed-{s}``), or None.
        resume: continue the run(s) in ``out_dir``.
        overwrite: clear ``out_dir`` before training from step 0.
        progress: show a progress bar.
    """

    model_cfg: EncoderConfig | DecoderConfig
    task_cfg: TaskConfig
    train_cfg: TrainConfig
    device: torch.device
    fast: bool
    step_reason: str
    seeds: tuple[int, ...] | None = None
    batched: bool = False
    out_dir: Path | None = None
    resume: bool = False
    overwrite: bool = False
    progress: bool = True

    def for_seed(self, seed: int) -> RunPlan:
        """Seed ``seed``'s own plan in a group: its seed, its directory ``out_dir/seed-{seed}``,
        no progress bar of its own when batched, and the batched program's step when batched."""
        if self.seeds is None or seed not in self.seeds:
            raise ValueError(f"seed: {seed} is not one of this plan's seeds {self.seeds}")
        out = seed_dir(self.out_dir, seed) if self.out_dir is not None else None
        step = dict(fast=False, step_reason=BATCHED_STEP) if self.batched else {}
        return replace(self, train_cfg=replace(self.train_cfg, seed=seed), seeds=None,
                       batched=False, out_dir=out,
                       progress=self.progress and not self.batched, **step)


def _step(model_cfg, task_cfg, train_cfg: TrainConfig, device: torch.device,
          own_step: bool) -> tuple[bool, str]:
    """The one fast-step decision: ``(fast, why)``."""
    objective = objective_for(model_cfg, task_cfg)
    blocked_by = fast_step.blocker(objective.model_class, own_step,
                                   train_cfg.interventions, device)
    return fast_step.decide(train_cfg.fast, device, blocked_by, getattr(model_cfg, "d_model", None))


def _batched(fast: bool, train_cfg: TrainConfig, device: torch.device) -> bool:
    """Whether a group of seeds is trained as the batched (float32, ``vmap``) program: not with an
    attention penalty (collected outside ``vmap``), nor when the fast step is taken on a CPU
    (where the batched program costs K single runs anyway, in float32) or asked for with
    ``fast=True``; on a GPU it is nearly free per seed, so it stays."""
    if not all(iv.batched for iv in train_cfg.interventions):
        return False
    return not (fast and (device.type == "cpu" or train_cfg.fast))


def plan_configs(model_cfg: EncoderConfig | DecoderConfig, task_cfg: TaskConfig,
                 train_cfg: TrainConfig, *, device: torch.device | str | None = None,
                 seeds: str | int | Sequence[int] | None = None,
                 out_dir: str | os.PathLike | None = None, resume: bool = False,
                 overwrite: bool = False, progress: bool = True, own_step: bool = False,
                 batched: bool | None = None) -> RunPlan:
    """The plan of a run (or, with ``seeds``, a group) of these configs: the device resolved, the
    step decided, a group batched or not (``batched`` forces it).

    Raises:
        ValueError: ``resume`` with ``overwrite``; an encoder whose head is not the regression
            read-out; ``fast=True`` for a run the fast step cannot train; bad ``seeds``.
    """
    check_resume_overwrite(resume, overwrite)
    if getattr(model_cfg, "head", "regression") != "regression":
        raise ValueError(f"model_cfg: head {model_cfg.head!r} cannot be trained on matrix "
                         "completion; training fits head 'regression' (the papers' read-out)")
    dev = check_device("device", device) if device is not None else default_device()
    fast, why = _step(model_cfg, task_cfg, train_cfg, dev, own_step)
    seed_list = tuple(parse_seeds(seeds)) if seeds is not None else None
    if seed_list is not None:
        batched = _batched(fast, train_cfg, dev) if batched is None else batched
        train_cfg = replace(train_cfg, seed=seed_list[0])
    else:
        batched = False
    return RunPlan(model_cfg, task_cfg, train_cfg, dev, fast, why, seed_list, batched,
                   Path(out_dir) if out_dir is not None else None, bool(resume), bool(overwrite),
                   bool(progress))


def plan_run(preset: str | Preset, keywords: Mapping[str, Any], *, resume: bool = False,
             seeds: str | int | Sequence[int] | None = None, own_step: bool = False,
             model_cfg: EncoderConfig | DecoderConfig | None = None,
             **fixed: Any) -> RunPlan:
    """The plan of an entry point's arguments: ``preset`` and ``keywords`` as :class:`RunSetup`
    reads them (the preset read once, here), ``resume``, and ``seeds`` for a group.
    ``model_cfg`` fills in the model config where ``keywords`` gives none (a run started from a
    given model); ``fixed`` are :func:`plan_configs` keywords (``batched``).

    Raises:
        ValueError: ``seed=`` given for a group (use ``seeds``); see :func:`plan_configs`.
    """
    setup = RunSetup.from_keywords(preset, keywords)
    check_resume_overwrite(resume, setup.overwrite)
    if seeds is not None and "seed" in setup.train_overrides:
        raise ValueError("seed: give the seeds with seeds=..., not seed=")
    if model_cfg is not None and setup.model_cfg is None:
        setup = replace(setup, model_cfg=model_cfg)
    m, t, tr = setup.configs()
    return plan_configs(m, t, tr, device=setup.device, seeds=seeds, out_dir=setup.out_dir,
                        resume=resume, overwrite=setup.overwrite, progress=setup.progress,
                        own_step=own_step, **fixed)
