"""Head types from head scores: thresholds and a priority order.

:func:`classify_heads` assigns one ``type`` per head by checking, in order: ``uniform``
(entropy >= threshold), ``identity`` / ``observed_copy`` (the larger passing one), ``masked_row``,
``longest_contiguous_column``, ``row`` / ``column`` (the larger passing one), ``mask_ignore``,
``mask_sink``, ``input_processing`` (``static`` above threshold, not uniform, in the configured
layers), else ``other``. The ``types`` column lists every type whose criterion passes. A type is
decided by one score (:data:`TYPE_SCORE`) against one threshold of :class:`HeadThresholds`.

Example:
    >>> import torch
    >>> from tfmatcomp.analyses.heads import classify_heads, head_scores
    >>> classify_heads(head_scores(torch.eye(4)[None, None], None, 2))["type"].tolist()
    ['identity']
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

__all__ = ["HEAD_TYPES", "TYPE_SCORE", "HeadThresholds", "classify_heads"]

#: Groups in priority order; within a group the type with the larger score wins.
_PRIORITY = (("uniform",), ("identity", "observed_copy"), ("masked_row",),
             ("longest_contiguous_column",), ("row", "column"), ("mask_ignore",), ("mask_sink",),
             ("input_processing",))

HEAD_TYPES = tuple(t for group in _PRIORITY for t in group) + ("other",)

#: The score column that decides each type (the type's own name unless listed here).
TYPE_SCORE = {t: {"uniform": "entropy", "input_processing": "static"}.get(t, t) for t in HEAD_TYPES[:-1]}

# the HeadThresholds field of each type (the type's own name unless listed here)
_THRESHOLD = {"uniform": "uniform_entropy", "input_processing": "input_processing_static"}


@dataclass(frozen=True)
class HeadThresholds:
    """Thresholds of :func:`classify_heads` (a head passes a type when its score is >= the value).

    ``input_processing_layers``: 0-based layers where input-processing heads are looked for (the
    papers find them in the first layer); None allows any layer.
    """

    uniform_entropy: float = 0.95
    identity: float = 0.6
    observed_copy: float = 0.6
    masked_row: float = 0.5
    longest_contiguous_column: float = 0.4
    row: float = 0.5
    column: float = 0.5
    mask_ignore: float = 0.8
    mask_sink: float = 0.6
    input_processing_static: float = 0.9
    input_processing_layers: tuple[int, ...] | None = (0,)


def _passes(row: pd.Series, th: HeadThresholds) -> dict[str, bool]:
    ok = {}
    for t, score in TYPE_SCORE.items():
        v = row[score]
        ok[t] = bool(v == v and v >= getattr(th, _THRESHOLD.get(t, t)))
    ok["input_processing"] = ok["input_processing"] and not ok["uniform"] and (
        th.input_processing_layers is None or int(row["layer"]) in th.input_processing_layers)
    return ok


def classify_heads(scores: pd.DataFrame, thresholds: HeadThresholds | None = None) -> pd.DataFrame:
    """Add ``type`` (one per head, by the priority order in the module docstring) and ``types``
    (every passing type, comma-separated, ``""`` if none) to a :func:`~tfmatcomp.analyses.heads.head_scores`
    table.

    Example:
        >>> import torch
        >>> from tfmatcomp.analyses.heads import head_scores
        >>> t = classify_heads(head_scores(torch.eye(4)[None, None], None, 2))
        >>> t["type"].tolist()
        ['identity']
    """
    th = thresholds or HeadThresholds()
    missing = [c for c in ("layer",) + tuple(TYPE_SCORE.values()) if c not in scores]
    if missing:
        raise ValueError(f"scores: missing columns {sorted(set(missing))}; pass a head_scores() table")
    out = scores.copy()
    types, all_types = [], []
    for _, row in out.iterrows():
        ok = _passes(row, th)
        chosen = "other"
        for group in _PRIORITY:
            cand = [t for t in group if ok[t]]
            if cand:
                chosen = max(cand, key=lambda t: row[TYPE_SCORE[t]])
                break
        types.append(chosen)
        all_types.append(",".join(t for t in HEAD_TYPES[:-1] if ok[t]))
    out["type"] = types
    out["types"] = all_types
    return out
