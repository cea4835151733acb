"""Sweeps: train a grid of configurations and compare final L_mask and the drop step across it.

A grid maps field names to the values to try: any field of :class:`~tfmatcomp.EncoderConfig`,
:class:`~tfmatcomp.TaskConfig` or :class:`~tfmatcomp.TrainConfig` (``seed`` excepted: seeds are
given with ``seeds=``), plus the aliases ``width`` (``d_model``), ``depth`` (``n_layers``) and
``heads`` (``n_heads``). The grid's product is trained configuration by configuration; the seeds of
one configuration train together as one batched program (:func:`tfmatcomp.train_many`), so
configurations of different shapes simply run one after another. Configuration ``c`` writes the
multi-seed run directory ``OUT/<c>/`` (``OUT/d_model=32,n_layers=2/seed-0/``, ...), and a sweep
run again resumes every unfinished run and skips the finished ones without touching them.

Derived fields follow a swept one, as in the papers' width and depth figures (the NeurIPS paper, Figs. 13
and 14): sweeping ``d_model`` keeps the preset's ``d_mlp / d_model`` ratio (the papers' ``4d``) and
``d_head = d_model / n_heads`` (also when ``n_heads`` is swept), and sweeping the matrix size sets
``n_ctx`` to ``n_rows * n_cols``, unless those fields are swept themselves.

Example:
    >>> import tfmatcomp as tm
    >>> result = tm.sweep({"d_model": [16, 32]}, seeds=[0, 1], n_steps=4, batch_size=8,
    ...                   log_every=2, progress=False)
    >>> result.table[["d_model", "seed", "steps"]].values.tolist()
    [[16, 0, 4], [16, 1, 4], [32, 0, 4], [32, 1, 4]]
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tfmatcomp.runs.files import replace_file
from tfmatcomp.validation import read_json_bounded
from tfmatcomp.runs.checkpoint import list_checkpoints
from tfmatcomp.config import EncoderConfig, Preset, TaskConfig, TrainConfig
from tfmatcomp.runs.layout import METRICS_FILE, SWEEP_FILE, seed_dir
from tfmatcomp.training.multiseed import run_group
from tfmatcomp.training.loop import check_resume_overwrite
from tfmatcomp.training.plan import RunSetup, parse_seeds, plan_configs
from tfmatcomp.training.trainer import read_metrics

__all__ = ["SweepConfig", "SweepResult", "ALIASES", "DEFAULT_GRID", "PAPER_GRIDS", "expand_grid",
           "sweep", "read_sweep", "sweep_table"]

#: Short names of the fields the papers sweep.
ALIASES: dict[str, str] = {"width": "d_model", "depth": "n_layers", "heads": "n_heads"}
#: The CLI's default: widths around the tiny preset's 64 (a CPU grid; see docs/sweeps.md).
DEFAULT_GRID: dict[str, tuple] = {"d_model": (32, 64, 128)}
#: The papers' grids on the ``paper-4l8h`` preset (7x7 rank 2; the NeurIPS paper Figs. 13 and 14): GPU-sized.
PAPER_GRIDS: dict[str, dict[str, tuple]] = {
    "width": {"d_model": (64, 128, 256, 512, 768, 1024)},
    "depth": {"n_layers": (4, 6, 8, 12)},
}

_CLASSES = {"model": EncoderConfig, "task": TaskConfig, "train": TrainConfig}
_OWNER = {f.name: part for part, cls in _CLASSES.items() for f in dataclasses.fields(cls)}
_NAME_OK = re.compile(r"^[A-Za-z0-9_.=,+-]+$")


@dataclass(frozen=True)
class SweepConfig:
    """One point of the grid: its swept values, its three configs, and its directory name."""

    values: dict[str, Any]
    model_cfg: EncoderConfig
    task_cfg: TaskConfig
    train_cfg: TrainConfig

    @property
    def name(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.values.items())


def _canonical(grid: Mapping[str, Any]) -> dict[str, list]:
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError(f"grid: expected a non-empty dict {{field: [values]}}, got {grid!r}")
    out: dict[str, list] = {}
    for key, values in grid.items():
        field = ALIASES.get(key, key)
        if field == "seed":
            raise ValueError("grid['seed']: give the seeds with seeds=..., not in the grid")
        if field not in _OWNER:
            raise ValueError(f"grid: unknown field {key!r}; allowed are {sorted(ALIASES)} and the "
                             f"fields of EncoderConfig, TaskConfig and TrainConfig: "
                             f"{sorted(set(_OWNER) - {'seed'})}")
        if field in out:
            raise ValueError(f"grid[{key!r}]: {field!r} is given twice (an alias and its name)")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise ValueError(f"grid[{key!r}]: expected a non-empty list of values, got {values!r}")
        if len(set(map(repr, values))) != len(values):
            raise ValueError(f"grid[{key!r}]: repeated values in {list(values)}")
        for v in values:
            if not _NAME_OK.match(str(v)):
                raise ValueError(f"grid[{key!r}]: value {v!r} cannot name a run directory")
        out[field] = list(values)
    return out


def _derived(base: EncoderConfig, task: TaskConfig, values: dict[str, Any]) -> dict[str, Any]:
    """Model fields that follow the swept ones (see the module docstring)."""
    extra: dict[str, Any] = {}
    if "d_model" in values and "d_mlp" not in values:
        extra["d_mlp"] = max(1, round(base.d_mlp * values["d_model"] / base.d_model))
    if ({"d_model", "n_heads"} & set(values) and "d_head" not in values
            and base.d_head == base.d_model // base.n_heads):
        extra["d_head"] = None
    if {"n_rows", "n_cols"} & set(values) and "n_ctx" not in values:
        extra["n_ctx"] = task.n_positions
    return extra


def expand_grid(
    grid: Mapping[str, Sequence[Any]],
    preset: str | Preset = "tiny",
    *,
    model_cfg: EncoderConfig | None = None,
    task_cfg: TaskConfig | None = None,
    train_cfg: TrainConfig | None = None,
    **train_overrides: Any,
) -> list[SweepConfig]:
    """Every configuration of ``grid`` (its product, in order), each checked before any training.

    Raises:
        ValueError: naming the grid's field: an unknown field, an empty or repeated list, or a
            configuration the configs refuse (``d_model`` not divisible by ``n_heads``, a rank
            above the matrix size, ...).

    Example:
        >>> [c.name for c in expand_grid({"width": [32, 64], "depth": [1, 2]})]
        ['d_model=32,n_layers=1', 'd_model=32,n_layers=2', 'd_model=64,n_layers=1', 'd_model=64,n_layers=2']
        >>> expand_grid({"d_model": [32]})[0].model_cfg.d_mlp  # the tiny preset's 4 d
        128
    """
    base = dict(zip(("model", "task", "train"), RunSetup(
        preset, model_cfg, task_cfg, train_cfg, train_overrides=train_overrides).configs()))
    canon = _canonical(grid)
    configs = []
    for combo in itertools.product(*canon.values()):
        values = dict(zip(canon, combo))
        try:
            parts = {part: {k: v for k, v in values.items() if _OWNER[k] == part} for part in _CLASSES}
            task = dataclasses.replace(base["task"], **parts["task"])
            model = dataclasses.replace(base["model"], **{
                **_derived(base["model"], task, values), **parts["model"]})
            train = dataclasses.replace(base["train"], **parts["train"])
            if task.n_positions > model.n_ctx:
                raise ValueError(f"n_ctx: {task.n_rows}x{task.n_cols or task.n_rows} matrices need "
                                 f"{task.n_positions} positions, n_ctx is {model.n_ctx}")
        except (ValueError, TypeError) as e:
            raise ValueError(f"grid: the configuration {values} is invalid: {e}") from None
        configs.append(SweepConfig(values, model, task, train))
    return configs


@dataclass
class SweepResult:
    """What :func:`sweep` returns: :attr:`table` (one row per configuration and seed, see
    :func:`sweep_table`), every run's :attr:`metrics` log (the swept fields and ``seed`` added),
    the swept :attr:`fields` and the sweep directory."""

    table: pd.DataFrame
    metrics: pd.DataFrame
    fields: list[str]
    out_dir: Path | None

    def figure(self, x: str | None = None, *, color: str | None = None):
        """:func:`tfmatcomp.plotting.sweeps.sweep_figure` of :attr:`table` (default: the first
        swept field on the axis, the second, if any, as colour)."""
        from tfmatcomp.plotting.sweeps import sweep_figure

        x = x or self.fields[0]
        if color is None:
            color = next((f for f in self.fields if f != x), None)
        return sweep_figure(self.table, x=x, color=color)


def _tail_median(values: pd.Series) -> float:
    """Median of the last 10% of a log (at least 3 points): the final level, as the detector's."""
    values = values.dropna()
    if values.empty:
        return math.nan
    return float(values.iloc[-max(3, math.ceil(0.1 * len(values))):].median())


def sweep_table(metrics: pd.DataFrame, fields: Sequence[str], column: str = "eval_L_mask") -> pd.DataFrame:
    """One row per configuration and seed of a sweep's metrics: the swept ``fields``, ``seed``,
    ``steps`` (the last logged step), ``final_L_mask`` and ``final_L_obs`` (medians over the last
    10% of the log), and the drop of ``column`` found by :func:`tfmatcomp.analyses.dynamics.detect_drop`
    (``has_drop``, ``drop_step``, ``drop_start``, ``drop_end``, ``plateau_L_mask``,
    ``drop_reason``; steps NaN without a drop, and for logs under the detector's 8 points).

    Example:
        >>> import pandas as pd
        >>> m = pd.DataFrame({"width": [8, 8], "seed": [0, 0], "step": [1, 2],
        ...                   "eval_L_mask": [0.2, 0.1], "eval_L_obs": [0.1, 0.01]})
        >>> sweep_table(m, ["width"])[["width", "seed", "steps", "has_drop"]].values.tolist()
        [[8, 0, 2, False]]
    """
    from tfmatcomp.analyses.dynamics import detect_drop

    rows = []
    keys = [*fields, "seed"]
    for key, part in metrics.groupby(keys, sort=False, dropna=False):
        part = part.sort_values("step")
        row = dict(zip(keys, key))
        row.update(steps=int(part["step"].iloc[-1]), final_L_mask=_tail_median(part[column]),
                   final_L_obs=_tail_median(part["eval_L_obs"]))
        drop = None
        if len(part) >= 8:
            drop = detect_drop(part, column=column)
        row.update(has_drop=bool(drop and drop.has_drop),
                   drop_step=drop.drop_step if drop and drop.has_drop else math.nan,
                   drop_start=drop.drop_start if drop and drop.has_drop else math.nan,
                   drop_end=drop.drop_end if drop and drop.has_drop else math.nan,
                   plateau_L_mask=drop.plateau_level if drop else math.nan,
                   drop_reason=drop.reason if drop else "too few logged points (< 8)")
        if "run_dir" in part:
            row["run_dir"] = part["run_dir"].iloc[0]
        rows.append(row)
    return pd.DataFrame(rows)


def _finished(run: Path, seeds: list[int], n_steps: int) -> bool:
    return all(n_steps in list_checkpoints(seed_dir(run, s))
               and (seed_dir(run, s) / METRICS_FILE).exists() for s in seeds)


def _write_sweep_file(out_dir: Path, preset: str, seeds: list[int], configs: list[SweepConfig]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / SWEEP_FILE
    old = read_json_bounded(SWEEP_FILE, path) if path.exists() else {}
    if not (isinstance(old, dict) and all(isinstance(old.get(k, t()), t) for k, t in (
            ("runs", dict), ("fields", list), ("seeds", list)))):
        raise ValueError(f"out_dir: {path} is not a sweep record (expected a JSON object with "
                         "'runs', 'seeds' and 'fields'); move it away or choose another out_dir")
    runs = {**old.get("runs", {}), **{c.name: c.values for c in configs}}
    fields = list(dict.fromkeys([*old.get("fields", []), *configs[0].values]))  # every grid's
    seeds = sorted(set(old.get("seeds", [])) | set(seeds))
    replace_file(path, json.dumps({"preset": preset, "seeds": seeds, "fields": fields,
                                   "runs": runs}, indent=2))


def sweep(grid: Mapping[str, Sequence[Any]], preset: str | Preset = "tiny", *,
          seeds: str | int | Sequence[int] = 0, resume: bool = True, **keywords: Any) -> SweepResult:
    """Train every configuration of ``grid`` for every seed and tabulate the outcome.

    Args:
        grid: ``{field: [values]}`` (see the module docstring); every configuration is checked
            before the first is trained.
        preset: the base configuration's preset, as in :func:`tfmatcomp.train`.
        seeds: the seeds of every configuration, trained together (``"0-3"``, ``[0, 1]``, 2).
        resume: continue unfinished runs in ``out_dir`` and skip finished ones (default). With
            ``resume=False`` a configuration whose directory holds a run is refused.
        keywords: the fields of :class:`~tfmatcomp.training.plan.RunSetup` and
            :class:`~tfmatcomp.TrainConfig` fields (``n_steps=``, ``lr=``, ...), as
            :func:`tfmatcomp.train_many` takes them (the preset is read once, and each configuration
            trained from its plan: :mod:`tfmatcomp.training.plan`), except that ``out_dir`` is the sweep
            directory: configuration ``c`` writes ``out_dir/<c.name>/seed-{s}`` (None trains in
            memory); ``overwrite`` trains every configuration again from step 0.

    Returns:
        A :class:`SweepResult`; ``result.table`` has one row per configuration and seed.
    """
    setup = RunSetup.from_keywords(preset, keywords)
    check_resume_overwrite(resume, setup.overwrite)
    if "seed" in setup.train_overrides:
        raise ValueError("seed: give the seeds with seeds=..., not seed=")
    model_cfg, task_cfg, train_cfg = setup.configs()  # the one reading of the preset
    configs = expand_grid(grid, model_cfg=model_cfg, task_cfg=task_cfg, train_cfg=train_cfg)
    seed_list = parse_seeds(seeds)
    root = Path(setup.out_dir) if setup.out_dir is not None else None
    name = preset if isinstance(preset, str) else preset.name
    if root is not None:
        _write_sweep_file(root, name, seed_list, configs)
    frames = []
    for i, c in enumerate(configs):
        run = root / c.name if root is not None else None
        if setup.progress:
            print(f"[{i + 1}/{len(configs)}] {c.name}")
        if run is not None and resume and _finished(run, seed_list, c.train_cfg.n_steps):
            logs = {s: read_metrics(seed_dir(run, s)) for s in seed_list}
        else:
            plan = plan_configs(c.model_cfg, c.task_cfg, c.train_cfg, device=setup.device,
                                seeds=seed_list, out_dir=run, resume=resume and run is not None,
                                overwrite=setup.overwrite, progress=setup.progress)
            logs = {s: r.metrics for s, r in run_group(plan)}
        for s, log in logs.items():
            frames.append(log.assign(**c.values, seed=s,
                                     run_dir=str(seed_dir(run, s)) if run is not None else None))
    fields = list(configs[0].values)
    metrics = pd.concat(frames, ignore_index=True)
    return SweepResult(sweep_table(metrics, fields), metrics, fields, root)


def read_sweep(out_dir: str | os.PathLike) -> SweepResult:
    """The :class:`SweepResult` of a sweep directory, from its logs (nothing is trained; runs not
    started yet are left out).

    Raises:
        ValueError: ``out_dir`` holds no ``sweep.json``.
    """
    root = Path(out_dir)
    path = root / SWEEP_FILE
    if not path.exists():
        raise ValueError(f"out_dir: {root} is not a sweep directory (no {SWEEP_FILE})")
    info = read_json_bounded(SWEEP_FILE, path)
    if not (isinstance(info, dict) and isinstance(info.get("runs"), dict)
            and isinstance(info.get("seeds"), list) and isinstance(info.get("fields"), list)):
        raise ValueError(f"out_dir: {path} is not a sweep record (expected a JSON object with "
                         "'runs', 'seeds' and 'fields', as tfmatcomp.sweep writes)")
    frames = []
    for run_name, values in info["runs"].items():
        for s in info["seeds"]:
            log = seed_dir(root / run_name, s) / METRICS_FILE
            if log.exists():
                frames.append(read_metrics(log).assign(**values, seed=s, run_dir=str(log.parent)))
    if not frames:
        raise ValueError(f"out_dir: no run of {root} has logged a step yet")
    metrics = pd.concat(frames, ignore_index=True)
    fields = info["fields"]
    return SweepResult(sweep_table(metrics, fields), metrics, fields, root)
