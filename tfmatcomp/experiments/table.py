"""The rows and tables the experiments return: one loss row per condition beside the papers'
numbers, and the DataFrame with its ``attrs``.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.datapath import sample_batch
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> row = loss_row(model, sample_batch("tiny", 4, seed=0), None, paper={"L_mask": 0.2})
    >>> sorted(row)
    ['L', 'L_mask', 'L_obs', 'intervention', 'paper_4l8h_L_mask', 'paper_4l8h_L_obs']
    >>> row["paper_4l8h_L_mask"], row["intervention"]
    (0.2, None)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from tfmatcomp.datapath import InterventionLike, predict
from tfmatcomp.interventions import to_json
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.metrics import losses

__all__ = ["loss_row", "experiment_table"]


def loss_row(model, batch: MatrixBatch, intervention: InterventionLike, batch_size: int = 256,
             paper: Mapping[str, float] | None = None) -> dict[str, Any]:
    """``L``, ``L_obs``, ``L_mask`` of ``model`` on ``batch`` with ``intervention`` applied (None:
    the model as it is), the papers' 4L8H ``L_obs`` / ``L_mask`` from ``paper`` (NaN where it has
    none) and the intervention as JSON (:func:`~tfmatcomp.interventions.to_json`, None for None).
    """
    paper = paper or {}
    values = losses(predict(model, batch, intervention, batch_size), batch, as_floats=True)
    return {**{k: values[k] for k in ("L", "L_obs", "L_mask")},
            "paper_4l8h_L_obs": paper.get("L_obs", float("nan")),
            "paper_4l8h_L_mask": paper.get("L_mask", float("nan")),
            "intervention": to_json(intervention)}


def experiment_table(rows: list[dict[str, Any]], **attrs: Any) -> pd.DataFrame:
    """``rows`` as a DataFrame whose ``attrs`` hold ``attrs`` (the experiment's name and settings).

    Example:
        >>> experiment_table([{"L": 0.1}], experiment="demo", seed=0).attrs
        {'experiment': 'demo', 'seed': 0}
    """
    df = pd.DataFrame(rows)
    df.attrs.update(attrs)
    return df
