"""The rows and tables the experiments return: one loss row per condition beside the papers'
numbers, and the DataFrame with its ``attrs``.

Tables are for people: the intervention each row ran is kept as JSON in
``df.attrs["interventions"]`` (``{row index: JSON or None}``), not in a column of long strings;
:func:`with_interventions` adds it as a column when wanted. The papers' reference columns
(``paper_4l8h_*``) appear only when a row's model is the papers' 4-layer 8-head d_model-768
encoder (:func:`is_papers_model`) labelled ``"pre-shift"`` / ``"post-shift"``, and the papers
report a number for that row.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.datapath import sample_batch
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> row = loss_row(model, sample_batch("tiny", 4, seed=0), None, paper={"L_mask": 0.2})
    >>> sorted(row)
    ['L', 'L_mask', 'L_obs', 'intervention', 'paper_4l8h_L_mask', 'paper_4l8h_L_obs']
    >>> df = experiment_table([row], experiment="demo")
    >>> "intervention" in df.columns, "intervention" in with_interventions(df).columns
    (False, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from tfmatcomp.datapath import InterventionLike, predict
from tfmatcomp.interventions import to_json
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.metrics import losses

__all__ = ["loss_row", "experiment_table", "with_interventions", "is_papers_model", "papers"]

#: the papers' model: the shape their reference numbers were measured on
PAPERS_SHAPE = {"n_layers": 4, "n_heads": 8, "d_model": 768}


def is_papers_model(model) -> bool:
    """Whether ``model`` has the papers' shape (an encoder with 4 layers, 8 heads, d_model 768:
    the ``paper-4l8h`` preset), so that their reference numbers mean something beside it.

    Example:
        >>> import tfmatcomp as tm
        >>> is_papers_model(tm.HookedEncoder(tm.get_preset("tiny").model))
        False
    """
    from tfmatcomp.models.objectives import model_kind

    cfg = getattr(model, "cfg", None)
    return model_kind(model) == "encoder" and all(
        getattr(cfg, k, None) == v for k, v in PAPERS_SHAPE.items())


def papers(reference: Mapping, key: Any, model) -> dict:
    """``reference[key]`` (the papers' numbers for that label / condition) if ``model`` is the
    papers' model (:func:`is_papers_model`), else ``{}``."""
    return dict(reference.get(key, {}) or {}) if is_papers_model(model) else {}


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


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def experiment_table(rows: list[dict[str, Any]], **attrs: Any) -> pd.DataFrame:
    """``rows`` as a DataFrame whose ``attrs`` hold ``attrs`` (the experiment's name and settings).

    A row's ``"intervention"`` moves to ``df.attrs["interventions"]`` (by row index), and
    ``paper_4l8h_*`` columns without a single number are dropped.

    Example:
        >>> experiment_table([{"L": 0.1, "paper_4l8h_L": float("nan")}], experiment="demo", seed=0).attrs
        {'experiment': 'demo', 'seed': 0}
    """
    rows = [dict(r) for r in rows]
    has_record = any("intervention" in r for r in rows)
    records = [r.pop("intervention", None) for r in rows]
    df = pd.DataFrame(rows)
    empty = [c for c in df.columns if str(c).startswith("paper_4l8h_") and all(_missing(v) for v in df[c])]
    df = df.drop(columns=empty)
    df.attrs.update(attrs)
    if has_record:
        df.attrs["interventions"] = dict(zip(df.index.tolist(), records))
    return df


def with_interventions(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of an experiment table with its ``intervention`` column: each row's intervention as
    JSON (None for the model as it is), from ``df.attrs["interventions"]``;
    :func:`tfmatcomp.interventions.from_dict` rebuilds it. Rows keep their index, so this works on
    a filtered table too.

    Raises:
        ValueError: ``df`` records no interventions (not an experiment table, or a per-head scan,
            whose ``attrs["interventions"]`` is keyed by ``(layer, head)``).
    """
    records = df.attrs.get("interventions")
    if not isinstance(records, Mapping) or not set(df.index) <= set(records):
        raise ValueError("df: records no intervention per row (pass a table returned by a "
                         "tfmatcomp.experiments function, or a filtered copy of one)")
    return df.assign(intervention=[records[i] for i in df.index])
