"""The copying check (the workshop paper Section 3.1.1 and Table 1): does the model output the MASK value?

Masked entries are given the token of a real value ``m`` (via
:class:`~tfmatcomp.interventions.MaskSubstitution`); a copying model then predicts ``m`` there, so
``L'_mask = mean over masked entries of (prediction - m)^2`` is small. With MASK left in place
``m = 0`` (the zero MASK embedding reads as 0). ``L_obs`` is measured against the true values as
usual. The check runs on matrices from the task (low-rank) and on full-rank "random" matrices (the
same task with ``rank=None``: iid entries).

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments import copying_check
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> df = copying_check(model, "tiny", n_samples=8)
    >>> list(df["mask"])
    ['MASK', '0.44', '-0.24', 'MASK', '0.44', '-0.24']
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import pandas as pd

from tfmatcomp.datapath import ModelsLike, TaskLike, predict, resolve_models, sample_batch
from tfmatcomp.experiments.reference import PAPER_COPYING, PRE
from tfmatcomp.experiments.table import experiment_table, papers
from tfmatcomp._progress import bar, check_progress
from tfmatcomp.interventions import MaskSubstitution, to_json
from tfmatcomp.task.metrics import L_mask_prime, losses

__all__ = ["copying_check"]


def copying_check(
    models: ModelsLike,
    task: TaskLike = None,
    *,
    n_samples: int = 512,
    seed: int = 0,
    mask_values: Iterable[float | None] = (None, 0.44, -0.24),
    random_matrices: bool = True,
    batch_size: int = 256,
    progress: bool | None = None,
) -> pd.DataFrame:
    """``L'_mask`` and ``L_obs`` with MASK replaced by the token of ``m`` (Table 1 of the workshop paper).

    Args:
        models: a model, a checkpoint path, or ``{label: model or path}`` (see
            :mod:`tfmatcomp.datapath`).
        task: the matrix task (default: the checkpoints' own).
        n_samples: matrices per input kind (paper: 512).
        seed: seeds the low-rank batch (``seed``) and the random batch (``seed + 1``).
        mask_values: ``None`` keeps MASK (``m = 0``); numbers are substituted.
        random_matrices: also run on full-rank matrices with iid entries.
        batch_size: matrices per forward pass.
        progress: a bar over the conditions (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        One row per (model, inputs, mask): ``model``, ``inputs`` (``"rank-r"`` or ``"random"``),
        ``mask`` (``"MASK"`` or the value), ``m``, ``L_mask_prime``, ``L_obs``, ``L_mask`` (against
        the true values), and ``paper_4l8h_L_mask_prime``, ``paper_4l8h_L_obs`` (Table 1) for the
        papers' model labelled ``"pre-shift"``. ``df.attrs["interventions"]``: what each row ran
        as JSON (None for MASK left in place; :func:`tfmatcomp.interventions.from_dict` rebuilds
        it, :func:`~tfmatcomp.experiments.with_interventions` adds the column).

    Example:
        >>> import tfmatcomp as tm
        >>> df = copying_check({"pre-shift": tm.HookedEncoder(tm.get_preset("tiny").model)}, "tiny",
        ...                    n_samples=4, mask_values=[0.44], random_matrices=False)
        >>> df.loc[0, "inputs"], df.loc[0, "mask"]
        ('rank-1', '0.44')
    """
    named, task = resolve_models(models, task)
    kinds = [(f"rank-{task.rank}" if task.rank is not None else "random", "low-rank", task, seed)]
    if random_matrices and task.rank is not None:
        kinds.append(("random", "random", dataclasses.replace(task, rank=None), seed + 1))
    values = list(mask_values)
    check_progress(progress)
    rows = []
    with bar(len(named) * len(kinds) * len(values), "copying check", progress) as b:
        _copying_rows(rows, named, task, kinds, values, n_samples, batch_size, b)
    return experiment_table(rows, experiment="copying check", n_samples=n_samples, seed=seed,
                            paper_columns="Table 1 of the workshop paper (4L8H, 7x7 rank 2, pre-shift, "
                            "512 samples)")


def _copying_rows(rows, named, task, kinds, values, n_samples, batch_size, b) -> None:
    for label, model in named.items():
        for inputs, paper_kind, kind_task, kind_seed in kinds:
            batch = sample_batch(kind_task, n_samples, kind_seed, model.device)
            for value in values:
                iv = None if value is None else MaskSubstitution(value)
                m = 0.0 if value is None else float(value)
                mask = "MASK" if value is None else f"{float(value):g}"
                pred = predict(model, batch, iv, batch_size)
                got = losses(pred, batch, as_floats=True)
                paper = papers(PAPER_COPYING.get(paper_kind if task.rank is not None else "random", {}),
                               mask, model) if label == PRE else {}
                rows.append({
                    "model": label, "inputs": inputs, "mask": mask, "m": m,
                    "L_mask_prime": float(L_mask_prime(pred, batch, m)),
                    "L_obs": got["L_obs"], "L_mask": got["L_mask"],
                    "paper_4l8h_L_mask_prime": paper.get("L_mask_prime", float("nan")),
                    "paper_4l8h_L_obs": paper.get("L_obs", float("nan")),
                    "intervention": to_json(iv),
                })
                b.update()
