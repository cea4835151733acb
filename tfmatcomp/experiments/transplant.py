"""Weight transplant in both directions ("model switching", the workshop paper Sections 3.1.2 and 3.2.1).

The pre-shift model computes with the post-shift model's query / key / value weights and biases
(``pre <- post``), and the other way round (``post <- pre``), through
:class:`~tfmatcomp.interventions.WeightTransplant`. Each recipient's own losses are given as baseline
rows on the same batch.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments import weight_transplant
    >>> cfg = tm.get_preset("tiny").model
    >>> df = weight_transplant(tm.HookedEncoder(cfg, seed=0), tm.HookedEncoder(cfg, seed=1), "tiny", n_samples=8)
    >>> df[["recipient", "donor"]].values.tolist()
    [['pre-shift', 'none'], ['post-shift', 'none'], ['pre-shift', 'post-shift'], ['post-shift', 'pre-shift']]
"""

from __future__ import annotations

import os
from typing import Iterable

import pandas as pd

from tfmatcomp.datapath import ModelLike, TaskLike, resolve_models, sample_batch
from tfmatcomp.experiments.reference import PAPER_ABLATION_ALL, PAPER_TRANSPLANT, POST, PRE
from tfmatcomp.experiments.table import experiment_table, is_papers_model, loss_row
from tfmatcomp._progress import bar, check_progress
from tfmatcomp.interventions import WeightTransplant

__all__ = ["weight_transplant"]


def weight_transplant(
    pre: ModelLike,
    post: ModelLike,
    task: TaskLike = None,
    *,
    params: str | Iterable[str] = "qkv",
    labels: tuple[str, str] = (PRE, POST),
    n_samples: int = 256,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Losses of each model with the other's ``params`` transplanted, both directions.

    Args:
        pre, post: the two models (or checkpoint paths: the ``intervention`` column then refers
            to the donor by path and step; a model held only in memory is written with the
            transplanted weights themselves).
        task: the matrix task (default: the checkpoints' own).
        labels: names of ``pre`` and ``post`` in the table; the papers' columns are filled only for
            the default ``("pre-shift", "post-shift")``.
        params: what is transplanted (see :class:`~tfmatcomp.interventions.WeightTransplant`):
            ``"qkv"`` (default, the papers'), ``"all_but_attn"`` (their second variant), other groups
            or parameter names.
        n_samples: matrices (paper: 256); seed: seeds the batch (the same for every row).
        progress: a bar over the conditions (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        Rows ``recipient``, ``donor`` and ``params`` (``"none"`` for the baselines), ``L``,
        ``L_obs``, ``L_mask``, and for the papers' model ``paper_4l8h_L_obs``, ``paper_4l8h_L_mask``
        (the papers' Q/K/V numbers; the baselines are their unablated losses).
        ``df.attrs["interventions"]``: each row's transplant as JSON (None for the baselines).
    """
    first, second = (str(x) for x in labels)
    if first == second:
        raise ValueError(f"labels: must differ, got {labels!r}")
    named, task = resolve_models({first: pre, second: post}, task)
    check_progress(progress)
    paper_labels = (first, second) == (PRE, POST) and all(map(is_papers_model, named.values()))
    what = params if isinstance(params, str) else ", ".join(params)
    batch = sample_batch(task, n_samples, seed)
    rows = []
    with bar(4, "weight transplant", progress) as b:
        _transplant_rows(rows, named, (first, second), {first: pre, second: post}, params, what,
                         batch, batch_size, paper_labels, b)
    return experiment_table(rows, experiment="weight transplant", n_samples=n_samples, seed=seed)


def _transplant_rows(rows, named, labels, given, params, what, batch, batch_size, paper_labels, b):
    first, second = labels
    for label in (first, second):
        ref = PAPER_ABLATION_ALL[label]["baseline"] if paper_labels else {}
        rows.append({"recipient": label, "donor": "none", "params": "none",
                     **loss_row(named[label], batch, None, batch_size, ref)})
        b.update()
    for recipient, donor in ((first, second), (second, first)):
        # a path is passed on, so that the record names the checkpoint instead of its weights
        iv = WeightTransplant(given[donor] if isinstance(given[donor], (str, os.PathLike))
                              else named[donor], params=params)
        ref = PAPER_TRANSPLANT.get((recipient, donor), {}) if (params == "qkv" and paper_labels) else {}
        rows.append({"recipient": recipient, "donor": donor, "params": what,
                     **loss_row(named[recipient], batch, iv, batch_size, ref)})
        b.update()
