"""Which run a report describes: the run directory, its seed group, the drop, and the pre- and
post-shift checkpoints.

A report takes a run directory (``metrics.jsonl`` + ``checkpoints/``), the directory of a
multi-seed run (``seeds.json`` + ``seed-{s}/``, as :func:`tfmatcomp.train_many` writes it), one seed
of such a group, or the name of a bundled run. For a group it reads every seed's metrics log,
detects each seed's drop, and reports on the seed whose drop onset is the median among the seeds
that dropped (the typical seed, not the luckiest).

Pre- and post-shift checkpoints (unless the caller or a bundled run's ``pretrained.json`` names
them): post-shift is the last checkpoint. Pre-shift sits on the plateau, as the papers' step-4,000
checkpoint of a drop near 15,000 does: the last checkpoint at or before half the drop's onset, else
the last one before the onset. When no drop was detected, the checkpoint nearest half-way to where
the loss starts to decline (half-way through the run if it never does); never the first checkpoint,
which may still be in the copying transient.

Example:
    >>> from tfmatcomp.report.run import load_context
    >>> ctx = load_context("tiny", n_samples=32)
    >>> ctx.drop.has_drop, ctx.pre_step < ctx.drop.drop_start < ctx.post_step
    (True, True)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from tfmatcomp.runs.group import read_seeds
from tfmatcomp.validation import read_json_bounded
from tfmatcomp import pretrained
from tfmatcomp.runs.checkpoint import list_checkpoints, load_checkpoint_info
from tfmatcomp.analyses.dynamics import DropResult, detect_drop
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.runs.layout import GROUP_FILE, METRICS_FILE, PRETRAINED_FILE, SEED_DIR, seed_dir
from tfmatcomp.training.trainer import read_metrics

__all__ = ["RunContext", "SeedGroup", "resolve_run", "find_group", "choose_steps", "load_context"]


@dataclass
class SeedGroup:
    """Every seed of a multi-seed run: metrics logs, detected drops, and the seed reported on."""

    path: Path
    metrics: dict[int, pd.DataFrame]
    drops: dict[int, DropResult]

    @property
    def seeds(self) -> list[int]:
        return sorted(self.metrics)

    @property
    def dropped(self) -> list[int]:
        return [s for s in self.seeds if self.drops[s].has_drop]

    def typical_seed(self, candidates: list[int] | None = None) -> int | None:
        """The seed (among ``candidates``, default all) whose drop onset is the median of the seeds
        that dropped; None when none dropped."""
        pool = [s for s in (candidates or self.seeds) if self.drops[s].has_drop]
        if not pool:
            return None
        pool.sort(key=lambda s: (self.drops[s].drop_start, s))
        return pool[(len(pool) - 1) // 2]

    def table(self) -> pd.DataFrame:
        """One row per seed: its drop (onset, step, end), levels and fall factor."""
        rows = []
        for s in self.seeds:
            d = self.drops[s]
            rows.append({"seed": s, "has_drop": d.has_drop, "onset": d.drop_start,
                         "drop_step": d.drop_step, "end": d.drop_end,
                         "plateau_L_mask": d.plateau_level, "final_L_mask": d.final_level,
                         "fall_factor": d.drop_factor,
                         "last_step": int(self.metrics[s]["step"].max())})
        return pd.DataFrame(rows)

    @classmethod
    def load(cls, path: str | os.PathLike, column: str = "eval_L_mask") -> "SeedGroup":
        path = Path(path)
        seeds = read_seeds(path)
        metrics = {int(s): read_metrics(seed_dir(path, s)) for s in seeds
                   if (seed_dir(path, s) / METRICS_FILE).exists()}
        if not metrics:
            raise ValueError(f"run: the seed group {path} has no metrics logs")
        return cls(path=path, metrics=metrics,
                   drops={s: _drop(m, column) or _too_short(m, column) for s, m in metrics.items()})


def _too_short(metrics: pd.DataFrame, column: str) -> DropResult:
    """A no-drop result for a log too short to look for a drop in."""
    level = float(metrics[column].median()) if column in metrics and len(metrics) else float("nan")
    return DropResult(False, None, None, None, None, level, level, 1.0, 0.0,
                      f"no drop: only {len(metrics)} logged points", column)


def _drop(metrics: pd.DataFrame | None, column: str = "eval_L_mask") -> DropResult | None:
    if metrics is None or len(metrics) <= 10 or column not in metrics:
        return None
    return detect_drop(metrics, column=column)


@dataclass
class RunContext:
    """What every section works from: the run, its checkpoints and the pre / post-shift models."""

    run_dir: Path
    checkpoints: dict[int, Path]
    metrics: pd.DataFrame | None
    pre_step: int
    post_step: int
    pre: HookedEncoder
    post: HookedEncoder
    task: Any
    n_samples: int
    seed: int
    step_note: str = ""
    drop: DropResult | None = None
    group: SeedGroup | None = None
    run_seed: int | None = None
    _models: dict[int, HookedEncoder] = field(default_factory=dict)

    @property
    def models(self) -> dict[str, HookedEncoder]:
        """``{"pre-shift": ..., "post-shift": ...}``: the labels experiments know the papers' values for."""
        return {"pre-shift": self.pre, "post-shift": self.post}

    @property
    def has_drop(self) -> bool:
        return self.drop is not None and self.drop.has_drop

    def model_at(self, step: int) -> HookedEncoder:
        if step not in self._models:
            self._models[step] = load_checkpoint_info(self.checkpoints[step],
                                                      device=self.post.device)[0]
        return self._models[step]

    def steps_around_drop(self, k: int = 5) -> list[int]:
        """Up to ``k`` checkpoint steps: pre-shift, those nearest the drop's onset, middle and end
        (evenly spaced ones when no drop was detected), and post-shift."""
        inner = [s for s in self.checkpoints if self.pre_step < s < self.post_step]
        if self.has_drop:
            targets = np.linspace(self.drop.drop_start, self.drop.drop_end, max(k - 2, 1))
        else:
            targets = np.linspace(self.pre_step, self.post_step, k)[1:-1]
        chosen = {min(inner, key=lambda s: abs(s - t)) for t in targets} if inner else set()
        return [self.pre_step, *sorted(chosen), self.post_step]


def find_group(run_dir: Path) -> Path | None:
    """The seed group a run directory belongs to: itself (``seeds.json``), its parent (a
    ``seed-{s}`` directory), or the group a bundled run names in ``pretrained.json``."""
    if (run_dir / GROUP_FILE).exists():
        return run_dir
    if SEED_DIR.fullmatch(run_dir.name) and (run_dir.parent / GROUP_FILE).exists():
        return run_dir.parent
    info = run_dir / PRETRAINED_FILE
    if info.exists():
        group = read_json_bounded(PRETRAINED_FILE, info).get("group")
        if group and (run_dir / group / GROUP_FILE).exists():
            return run_dir / group
    return None


def resolve_run(run: str | os.PathLike) -> Path:
    """A run directory (with checkpoints) from a path, a seed group or a bundled run's name.

    Raises:
        ValueError: if ``run`` is none of these.
    """
    path = Path(run)
    if path.is_dir() and list_checkpoints(path):
        return path
    if path.is_dir() and (path / GROUP_FILE).exists():
        group = SeedGroup.load(path)
        with_ckpt = [s for s in group.seeds if list_checkpoints(seed_dir(path, s))]
        if not with_ckpt:
            raise ValueError(f"run: no seed of the group {path} has checkpoints")
        seed = group.typical_seed(with_ckpt)
        return seed_dir(path, seed if seed is not None else with_ckpt[0])
    if isinstance(run, str) and run in pretrained.available():
        return pretrained.run_dir(run)
    raise ValueError(f"run: {run!r} is neither a run directory with checkpoints/, a multi-seed run "
                     f"directory (seeds.json) nor a bundled run (bundled: "
                     f"{sorted(pretrained.available())})")


def choose_steps(checkpoints: dict[int, Path], drop: DropResult | None,
                 pre_step: int | None = None, post_step: int | None = None,
                 info: dict[str, Any] | None = None) -> tuple[int, int, str]:
    """``(pre_step, post_step, note)`` as the module docstring describes; ``info`` is a bundled
    run's ``pretrained.json``.

    Example:
        >>> from pathlib import Path
        >>> ckpts = {s: Path(str(s)) for s in (500, 1000, 2000, 3000, 6000)}
        >>> choose_steps(ckpts, None)[:2]
        (3000, 6000)
    """
    steps = sorted(checkpoints)
    if not steps:
        raise ValueError("run: it has no checkpoints")
    chosen = pre_step is not None or post_step is not None  # by the caller: never contradictory
    note = ""
    if info and (pre_step is None or post_step is None):
        pre_step = pre_step if pre_step is not None else info.get("pre_shift_step")
        post_step = post_step if post_step is not None else info.get("post_shift_step")
        note = "pre/post-shift steps from the bundled run's pretrained.json"
    if post_step is None:
        post_step = steps[-1]
    if pre_step is None:
        before = [s for s in steps if s < post_step] or steps
        if drop is not None and drop.has_drop:
            onset = drop.drop_start
            half = [s for s in before if s <= 0.5 * onset]
            plateau = [s for s in before if s < onset]
            pre_step = (half or plateau or before)[-1]
            where = ("half-way to" if half else "before") if (half or plateau) else "(none lies before)"
            note = (f"pre-shift = last checkpoint {where} the drop's onset at step {onset:,.0f}, "
                    "on the plateau")
        else:
            onset = drop.params.get("start") if drop is not None else None
            declining = (onset is not None and drop.drop_factor > 1.2
                         and steps[0] < onset < steps[-1])
            target = 0.5 * onset if declining else 0.5 * (steps[0] + post_step)
            later = [s for s in before if s > steps[0]] or before
            pre_step = min(later, key=lambda s: abs(s - target))
            note = ("no drop was detected: pre-shift = the checkpoint nearest half-way to where "
                    "L_mask starts to decline" if declining else
                    "no drop was detected: pre-shift = the checkpoint half-way through the run")
    for name, s in (("pre_step", pre_step), ("post_step", post_step)):
        if s not in checkpoints:
            raise ValueError(f"{name}: no checkpoint at step {s}; the run has {steps}")
    if chosen and pre_step >= post_step:
        raise ValueError(f"pre_step, post_step: the pre-shift step ({pre_step:,}) must come "
                         f"before the post-shift step ({post_step:,})")
    return pre_step, post_step, note


def load_context(run: str | os.PathLike = "tiny", *, pre_step: int | None = None,
                 post_step: int | None = None, n_samples: int = 256, seed: int = 0,
                 device: torch.device | str | None = None) -> RunContext:
    """Resolve ``run``, detect its drop(s), choose and load the pre- and post-shift models."""
    run_dir = resolve_run(run)
    checkpoints = list_checkpoints(run_dir)
    metrics = read_metrics(run_dir) if (run_dir / METRICS_FILE).exists() else None
    drop = _drop(metrics)
    group_dir = find_group(run_dir)
    group = SeedGroup.load(group_dir) if group_dir is not None else None
    info_file = run_dir / PRETRAINED_FILE
    info = read_json_bounded(PRETRAINED_FILE, info_file) if info_file.exists() else None
    pre_step, post_step, note = choose_steps(checkpoints, drop, pre_step, post_step, info)
    if isinstance(run, str) and run in pretrained.available() and run_dir.name == run:
        note = "; ".join(filter(None, [note, pretrained.partial_note(run, checkpoints)]))
    pre, _ = load_checkpoint_info(checkpoints[pre_step], device=device)
    post, ckpt = load_checkpoint_info(checkpoints[post_step], device=device)
    if ckpt.task_cfg is None:
        raise ValueError(f"run: checkpoint {checkpoints[post_step]} records no task config")
    run_seed = ckpt.train_cfg.seed if ckpt.train_cfg is not None else None
    ctx = RunContext(run_dir=run_dir, checkpoints=checkpoints, metrics=metrics, pre_step=pre_step,
                     post_step=post_step, pre=pre, post=post, task=ckpt.task_cfg.build(),
                     n_samples=n_samples, seed=seed, step_note=note, drop=drop, group=group,
                     run_seed=run_seed)
    ctx._models.update({pre_step: pre, post_step: post})
    return ctx
