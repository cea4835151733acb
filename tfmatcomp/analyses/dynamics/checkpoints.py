"""Any measure over a run's checkpoints and seeds, as one call: :func:`over_checkpoints`.

A *measure* is one of:

* a function ``f(model, batch) -> float`` (a number or a 0-d tensor): one row, named by its key;
* a function returning a dict ``{key: float}``: one row per key, named ``name.key`` (the progress
  measures of :mod:`.progress` return per-layer dicts);
* a function returning a table (a pandas DataFrame), or an **experiment**: a function whose first
  parameter is named ``models``, or whose first two are ``model, task`` (the functions of
  :mod:`tfmatcomp.experiments` that take one model or a mapping of them), which is called
  as ``f(model, task, n_samples=n_samples, seed=seed, batch_size=batch_size)``, so it draws the
  same matrices as the fixed batch (its own extra inputs, e.g. the copying check's random
  matrices, from its own seeds, also the same at every checkpoint). A table becomes one row per
  (table row, value column): the value columns are its float columns except the papers' numbers
  (``paper_*``); the other columns except ``model`` and ``intervention`` name the row, so the
  measure is ``name.column[key=value,...]`` (``name.column`` for a one-row table);
* an :class:`~tfmatcomp.interventions.Intervention`: the ``L_mask`` of the model with the
  intervention applied (:func:`tfmatcomp.datapath.predict`, then
  :func:`tfmatcomp.losses`).

Example:
    >>> from tfmatcomp.analyses.dynamics import over_checkpoints
    >>> from tfmatcomp.analyses.dynamics.progress import L_mask
    >>> df = over_checkpoints("tiny", {"L_mask": L_mask}, n_samples=32)
    >>> list(df.columns), df["step"].tolist()
    (['seed', 'step', 'measure', 'value'], [2000, 4000, 5000, 6000, 7000, 10000])
"""

from __future__ import annotations

import inspect
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import pandas as pd
import torch

from tfmatcomp._progress import bar, check_progress
from tfmatcomp import pretrained
from tfmatcomp.datapath import predict, sample_batch
from tfmatcomp.task.metrics import losses
from tfmatcomp.interventions import Intervention
from tfmatcomp.runs.checkpoint import load_checkpoint_info
from tfmatcomp.runs.layout import GROUP_FILE, RUN_FILE, SEED_DIR, list_checkpoints, seed_dir
from tfmatcomp.runs.rundir import run_configs
from tfmatcomp.runs.group import read_seeds
from tfmatcomp.validation import check_positive_int, read_json_bounded

__all__ = ["over_checkpoints", "run_seeds", "COLUMNS"]

#: The columns of :func:`over_checkpoints`' table.
COLUMNS = ("seed", "step", "measure", "value")

MeasureLike = Union[Callable[..., Any], Intervention]


def run_seeds(run: str | os.PathLike) -> dict[int, Path]:
    """``{seed: run directory}`` of a run directory, a multi-seed group directory (``seeds.json``
    and ``seed-N/``) or a bundled run's name.

    A run's seed is the one ``run.json`` records (its ``seed``, else its training config's), else
    the ``N`` of a ``seed-N`` directory.

    Example:
        >>> {s: p.name for s, p in run_seeds("tiny").items()}
        {0: 'tiny'}
    """
    if isinstance(run, str) and not Path(run).exists() and run in pretrained.available():
        run = pretrained.run_dir(run)
    if not isinstance(run, (str, os.PathLike)):
        raise ValueError(f"run: expected a run directory, a multi-seed group directory or a "
                         f"bundled run name, got {type(run).__name__}")
    path = Path(run)
    if path.is_dir() and (path / GROUP_FILE).exists():
        seeds = read_seeds(path)
        runs = {s: seed_dir(path, s) for s in seeds if list_checkpoints(seed_dir(path, s))}
        if not runs:
            raise ValueError(f"run: no seed of the group {path} (seeds {seeds}) has checkpoints")
        return dict(sorted(runs.items()))
    if path.is_dir() and list_checkpoints(path):
        return {_seed_of(path): path}
    raise ValueError(f"run: {str(run)!r} is neither a run directory with checkpoints/, a multi-seed "
                     f"group directory ({GROUP_FILE}) nor a bundled run name (bundled: "
                     f"{sorted(pretrained.available())})")


def _seed_of(run_dir: Path) -> int:
    if (run_dir / RUN_FILE).exists():
        info = read_json_bounded(RUN_FILE, run_dir / RUN_FILE)
        if isinstance(info.get("seed"), int):
            return info["seed"]
        configs = run_configs(run_dir)
        if configs is not None:
            return int(configs[2].seed)
    if SEED_DIR.fullmatch(run_dir.name):
        return int(run_dir.name.split("-")[1])
    raise ValueError(f"run: {run_dir} records no seed (no {RUN_FILE} and not a seed-N directory)")


def _check_measures(measures: Any) -> dict[str, MeasureLike]:
    if not isinstance(measures, Mapping) or not measures:
        raise ValueError("measures: expected a non-empty mapping name -> f(model, batch), "
                         f"experiment or Intervention, got {measures!r:.80}")
    for name, f in measures.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"measures: every name must be a non-empty string, got {name!r}")
        if not (isinstance(f, Intervention) or callable(f)):
            raise ValueError(f"measures[{name!r}]: expected a function f(model, batch), an "
                             f"experiment or an Intervention, got {type(f).__name__}")
    return dict(measures)


def _is_experiment(f: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(f).parameters)
    except (TypeError, ValueError):
        return False
    return params[:1] == ["models"] or params[:2] == ["model", "task"]


def _number(name: str, value: Any) -> float:
    if torch.is_tensor(value) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, numbers.Real):
        return float(value)
    raise ValueError(f"measures[{name!r}]: returned {type(value).__name__}; a measure returns a "
                     "number, a dict of numbers or a table")


def _table_rows(name: str, table: pd.DataFrame) -> list[tuple[str, float]]:
    values = [c for c in table.columns if pd.api.types.is_float_dtype(table[c])
              and not str(c).startswith("paper_")]
    keys = [c for c in table.columns if c not in values and c not in ("model", "intervention")
            and not str(c).startswith("paper_")]
    out = []
    for row in table.to_dict("records"):   # per-column types (iterrows would make ints floats)
        label = ",".join(f"{k}={row[k]}" for k in keys)
        suffix = f"[{label}]" if len(table) > 1 and label else ""
        out.extend((f"{name}.{c}{suffix}", float(row[c])) for c in values)
    return out


def _measure(name: str, f: MeasureLike, model, batch, task, n_samples: int, seed: int,
             batch_size: int) -> list[tuple[str, float]]:
    if isinstance(f, Intervention):
        return [(name, losses(predict(model, batch, f, batch_size), batch, as_floats=True)["L_mask"])]
    if _is_experiment(f):
        value = f(model, task, n_samples=n_samples, seed=seed, batch_size=batch_size)
    else:
        value = f(model, batch)
    if isinstance(value, pd.DataFrame):
        return _table_rows(name, value)
    if isinstance(value, Mapping):
        return [(f"{name}.{k}", _number(f"{name}.{k}", v)) for k, v in value.items()]
    return [(name, _number(name, value))]


def over_checkpoints(
    run: str | os.PathLike,
    measures: Mapping[str, MeasureLike],
    *,
    n_samples: int = 256,
    seed: int = 0,
    steps: Sequence[int] | None = None,
    batch_size: int = 256,
    device: torch.device | str | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Apply ``measures`` at every checkpoint of a run, or of every seed of a multi-seed group.

    **The batch is fixed.** Each run's task (from its checkpoints) gives one batch of ``n_samples``
    matrices drawn from ``seed`` (:func:`tfmatcomp.datapath.sample_batch`), and every measure sees
    that same batch at every checkpoint; the seeds of a group share one task, hence the same
    matrices too. So a change over steps is a change of the model, never of the data.

    Args:
        run: a run directory, a multi-seed group directory (``seeds.json`` and ``seed-N/``), or a
            bundled run's name (``"tiny"``); see :func:`run_seeds`.
        measures: ``{name: measure}``; a measure is ``f(model, batch)`` returning a number, a dict
            or a table, an experiment of :mod:`tfmatcomp.experiments`, or an Intervention (the
            module docstring states how each becomes rows).
        n_samples: matrices in the batch.
        seed: seeds the batch (not the training seed).
        steps: only these checkpoint steps (default: all); each must be a checkpoint of every run.
        batch_size: matrices per forward pass (for interventions and experiments; a function
            measure chunks as it likes).
        device: where the models and the batch go (default: CPU).
        progress: a bar over the checkpoints (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        A DataFrame with the columns ``seed`` (the run's training seed), ``step``, ``measure``,
        ``value`` (float), sorted by seed, step and measure.

    Raises:
        ValueError: naming the argument, for a run that is none of the above, empty or malformed
            measures, a step that is not a checkpoint, or a measure returning something else.

    Example:
        >>> from tfmatcomp.analyses.dynamics.progress import copying
        >>> df = over_checkpoints("tiny", {"copying": copying}, n_samples=32, steps=[2000, 10000])
        >>> df["measure"].unique().tolist()
        ['copying.L_mask_prime', 'copying.L_obs']
    """
    named = _check_measures(measures)
    check_progress(progress)
    check_positive_int("n_samples", n_samples)
    check_positive_int("batch_size", batch_size)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    runs = run_seeds(run)
    wanted: list[int] | None = None
    if steps is not None:
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence) or not steps or any(
                isinstance(s, bool) or not isinstance(s, int) for s in steps):
            raise ValueError(f"steps: expected a non-empty list of integer steps, got {steps!r}")
        wanted = sorted(set(steps))
    rows: list[tuple[int, int, str, float]] = []
    chosen = {}
    for run_seed, run_dir in runs.items():
        checkpoints = list_checkpoints(run_dir)
        if wanted is not None:
            missing = [s for s in wanted if s not in checkpoints]
            if missing:
                raise ValueError(f"steps: {missing} are not checkpoints of {run_dir}; its steps "
                                 f"are {list(checkpoints)}")
            checkpoints = {s: checkpoints[s] for s in wanted}
        chosen[run_seed] = checkpoints
    with bar(sum(map(len, chosen.values())), "over checkpoints", progress, unit="checkpoint") as b:
        for run_seed, checkpoints in chosen.items():
            _checkpoint_rows(rows, run_seed, checkpoints, named, n_samples, seed, batch_size,
                             device, b)
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["value"] = df["value"].astype(float)
    return df.sort_values(["seed", "step", "measure"], kind="stable").reset_index(drop=True)


def _checkpoint_rows(rows, run_seed, checkpoints, named, n_samples, seed, batch_size, device, b):
    """Append the rows of one run's ``checkpoints`` to ``rows``, one bar step per checkpoint."""
    batch = task = None
    for step, path in checkpoints.items():
        model, info = load_checkpoint_info(path, device=device)
        if batch is None:
            if info.task_cfg is None:
                raise ValueError(f"run: checkpoint {path} records no task")
            task = info.task_cfg.build()
            batch = sample_batch(task, n_samples, seed=seed, device=model.device)
        for name, f in named.items():
            for measure, value in _measure(name, f, model, batch, task, n_samples, seed,
                                           batch_size):
                rows.append((run_seed, int(info.step if info.step is not None else step),
                             measure, value))
        b.update()
