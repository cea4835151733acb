"""How early a measure moves: its departure from the plateau against the loss's onset.

A measure's **departure** (:func:`departure_step`) is the first checkpoint from which on it stays
at least ``fraction`` (default 10 %) of the way from its plateau value to its final value:

* plateau value: the median of the measure at the checkpoints at or before half the loss's onset
  (the plateau the loss sits on, away from the drop; at least the first checkpoint);
* final value: the measure at the last checkpoint;
* "stays": at that checkpoint and every later one, ``(v - plateau) / (final - plateau) >=
  fraction``, so a measure that wanders and comes back does not depart early.

Its **lead** is the loss's onset (:func:`~tfmatcomp.analyses.dynamics.detect_drop`'s
``drop_start`` on the run's ``eval_L_mask``) minus its departure: positive when the measure moves
before the loss does. Both are read at checkpoint resolution (the lead is exact to the checkpoint
spacing). A measure that ends where it started (``|final - plateau|`` below ``min_change``) or a
seed without a detected drop has no lead (NaN).

Example:
    >>> import numpy as np
    >>> departure_step([0, 100, 200, 300, 400], [0.1, 0.1, 0.2, 0.8, 0.9], onset=300)
    200
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pandas as pd

from tfmatcomp.analyses.dynamics.checkpoints import run_seeds
from tfmatcomp.analyses.dynamics.drop import detect_drop
from tfmatcomp.training.trainer import read_metrics
from tfmatcomp.validation import check_in_range

__all__ = ["departure_step", "lead_times", "lead_time_summary", "LEAD_COLUMNS"]

#: The columns of :func:`lead_times`' table.
LEAD_COLUMNS = ("seed", "measure", "onset", "departure", "lead", "plateau_value", "final_value")


def departure_step(steps: Sequence[int], values: Sequence[float], onset: float, *,
                   fraction: float = 0.1, min_change: float = 1e-9) -> int | None:
    """The checkpoint step from which ``values`` stay at least ``fraction`` of the way from their
    plateau value to their final value (see the module docstring); None if they never leave it.

    Raises:
        ValueError: ``steps`` and ``values`` differ in length or are empty; ``fraction`` outside
            (0, 1].
    """
    check_in_range("fraction", fraction, 0.0, 1.0, closed=(False, True))
    t = np.asarray(steps, dtype=float)
    v = np.asarray(values, dtype=float)
    if t.ndim != 1 or t.shape != v.shape or not len(t):
        raise ValueError(f"steps, values: expected two equal non-empty 1-D sequences, got "
                         f"{t.shape} and {v.shape}")
    order = np.argsort(t)
    t, v = t[order], v[order]
    plateau = _plateau_value(t, v, onset)
    change = v[-1] - plateau
    if not np.isfinite(change) or abs(change) < min_change:
        return None
    moved = (v - plateau) / change >= fraction
    stays = np.logical_and.accumulate(moved[::-1])[::-1]
    return int(t[np.argmax(stays)]) if stays.any() else None


def _plateau_value(steps: np.ndarray, values: np.ndarray, onset: float) -> float:
    """The median of ``values`` (sorted by ``steps``) at or before half the onset; the first value
    when no checkpoint is that early."""
    early = steps <= onset / 2
    return float(np.median(values[early])) if early.any() else float(values[0])


def lead_times(measures: pd.DataFrame, run: str | os.PathLike, *, column: str = "eval_L_mask",
               fraction: float = 0.1) -> pd.DataFrame:
    """Each (seed, measure)'s departure and lead (:data:`LEAD_COLUMNS`).

    Args:
        measures: the table of :func:`~tfmatcomp.analyses.dynamics.over_checkpoints` (``seed,
            step, measure, value``) on ``run``.
        run: the run or multi-seed group those checkpoints belong to; each seed's onset comes from
            its metrics log (``column``).
        fraction: how far towards its final value a measure must stay to have departed.

    Example:
        >>> from tfmatcomp.analyses.dynamics import over_checkpoints, row_column_attention_mass
        >>> table = over_checkpoints("tiny", {"attn": row_column_attention_mass}, n_samples=32)
        >>> leads = lead_times(table, "tiny")
        >>> int(leads.set_index("measure").loc["attn.max_head", "lead"]) > 0
        True
    """
    missing = {"seed", "step", "measure", "value"} - set(measures.columns)
    if missing:
        raise ValueError(f"measures: expected over_checkpoints' table, missing {sorted(missing)}")
    rows = []
    for seed, run_dir in run_seeds(run).items():
        drop = detect_drop(read_metrics(run_dir), column=column)
        onset = drop.drop_start if drop.has_drop else None
        for name, group in measures[measures["seed"] == seed].groupby("measure", sort=False):
            dep = None if onset is None else departure_step(group["step"], group["value"], onset,
                                                            fraction=fraction)
            t = group.sort_values("step")
            steps, values = t["step"].to_numpy(dtype=float), t["value"].to_numpy(dtype=float)
            rows.append({
                "seed": seed, "measure": name, "onset": onset, "departure": dep,
                "lead": (onset - dep) if dep is not None else np.nan,
                "plateau_value": _plateau_value(steps, values, onset or 0),
                "final_value": float(values[-1])})
    return pd.DataFrame(rows, columns=list(LEAD_COLUMNS))


def lead_time_summary(leads: pd.DataFrame) -> pd.DataFrame:
    """Per measure over seeds: ``seeds`` (with a lead), ``median_lead``, the quartiles ``q25`` /
    ``q75``, ``min`` / ``max``, and ``before`` (seeds where it moved before the onset).

    Example:
        >>> leads = pd.DataFrame({"seed": [0, 1, 2], "measure": "m", "lead": [100.0, 300.0, np.nan]})
        >>> lead_time_summary(leads)[["measure", "seeds", "median_lead", "before"]].values.tolist()
        [['m', 2, 200.0, 2]]
    """
    out = []
    for name, group in leads.groupby("measure", sort=False):
        lead = group["lead"].dropna().to_numpy(dtype=float)
        out.append({"measure": name, "seeds": len(lead),
                    "median_lead": float(np.median(lead)) if len(lead) else np.nan,
                    "q25": float(np.quantile(lead, 0.25)) if len(lead) else np.nan,
                    "q75": float(np.quantile(lead, 0.75)) if len(lead) else np.nan,
                    "min": float(lead.min()) if len(lead) else np.nan,
                    "max": float(lead.max()) if len(lead) else np.nan,
                    "before": int((lead > 0).sum())})
    return pd.DataFrame(out)
