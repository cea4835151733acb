"""Head groups from a model's own head labels, and their ablation: the workshop paper's
"uninterpretable heads" test (Sec. 3.2.2) for a model of any shape.

The paper ablates together the heads of its 4-layer 8-head model that are neither row, column nor
identity heads, and finds ``L_mask`` barely moves. Its group names heads of that model; for another
model the same test needs that model's own labels. :func:`label_head_groups` reads them from a
head table (:func:`~tfmatcomp.analyses.heads.analyse_heads`, one ``type`` per head) and
:func:`label_group_ablation` labels each model on the experiment's own seeded batch, then ablates
each group together with :func:`tfmatcomp.experiments.head_group_ablation`. The groups:

* ``LABEL_GROUPS[0]``: the heads whose ``type`` is not in ``interpretable`` (default
  :data:`INTERPRETABLE_TYPES`: row, column, identity), the paper's "uninterpretable" heads;
* ``LABEL_GROUPS[1]``: the row and column heads together.

A group may be empty (a random model has no row head); ablating it is a no-op.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.analyses.heads import label_group_ablation
    >>> df = label_group_ablation(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=8)
    >>> df["group"].tolist()
    ['not row / column / identity (own labels)', 'row + column (own labels)']
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from tfmatcomp._progress import check_progress, tracked
from tfmatcomp.analyses.heads.analysis import analyse_heads
from tfmatcomp.analyses.heads.classify import HEAD_TYPES
from tfmatcomp.datapath import ModelsLike, TaskLike, resolve_models, sample_batch
from tfmatcomp.interventions.sites import Head, paper_label

__all__ = ["INTERPRETABLE_TYPES", "LABEL_GROUPS", "label_head_groups", "label_group_ablation"]

#: The head types the workshop paper calls interpretable (Sec. 3.2.2): row, column and identity
#: heads; every other head is in its "uninterpretable" group.
INTERPRETABLE_TYPES: tuple[str, ...] = ("row", "column", "identity")
#: The names of the groups :func:`label_head_groups` builds, in order: (a) the heads that are
#: neither row, column nor identity heads, (b) the row and column heads.
LABEL_GROUPS: tuple[str, str] = ("not row / column / identity (own labels)",
                                 "row + column (own labels)")


def _check_interpretable(interpretable: Iterable[str]) -> list[str]:
    if isinstance(interpretable, str) or not hasattr(interpretable, "__iter__"):
        raise ValueError(f"interpretable: expected a sequence of head types from {HEAD_TYPES}, got "
                         f"{interpretable!r}")
    kinds = list(interpretable)
    unknown = [k for k in kinds if k not in HEAD_TYPES]
    if unknown:
        raise ValueError(f"interpretable: unknown head types {unknown}; choose from {HEAD_TYPES}")
    return kinds


def label_head_groups(
    labels: pd.DataFrame,
    *,
    interpretable: Iterable[str] = INTERPRETABLE_TYPES,
) -> dict[str, list[Head]]:
    """The two label groups of a head table.

    Args:
        labels: a head table with 0-based ``layer``, ``head`` and ``type`` columns, one row per
            head: ``analyse_heads(...).table`` (or a
            :func:`~tfmatcomp.analyses.heads.classify_heads` table).
        interpretable: the head types that count as interpretable (names of
            :data:`~tfmatcomp.analyses.heads.HEAD_TYPES`; default :data:`INTERPRETABLE_TYPES`).

    Returns:
        ``{LABEL_GROUPS[0]: heads whose type is not interpretable, LABEL_GROUPS[1]: heads whose
        type is row or column}``, 0-based ``(layer, head)`` pairs in layer-then-head order. Pass
        it as ``groups=`` to :func:`tfmatcomp.experiments.head_group_ablation`, e.g. to ablate
        the post-shift model's groups in the pre-shift model.

    Raises:
        ValueError: ``labels`` is not a head table, or ``interpretable`` names an unknown type.

    Example:
        >>> import pandas as pd
        >>> labels = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
        ...                        "type": ["column", "other", "row", "mask_ignore"]})
        >>> label_head_groups(labels)
        {'not row / column / identity (own labels)': [(0, 1), (1, 1)], 'row + column (own labels)': [(0, 0), (1, 0)]}
    """
    if not isinstance(labels, pd.DataFrame):
        raise ValueError(f"labels: expected a head table (analyse_heads(...).table), got "
                         f"{type(labels).__name__}")
    missing = [c for c in ("layer", "head", "type") if c not in labels]
    if missing:
        raise ValueError(f"labels: missing columns {missing}; pass analyse_heads(...).table")
    kinds = _check_interpretable(interpretable)
    rows = labels.sort_values(["layer", "head"])
    pairs = [((int(l), int(h)), str(t)) for l, h, t in zip(rows["layer"], rows["head"], rows["type"])]
    return {LABEL_GROUPS[0]: [p for p, t in pairs if t not in kinds],
            LABEL_GROUPS[1]: [p for p, t in pairs if t in ("row", "column")]}


def label_group_ablation(
    models: ModelsLike,
    task: TaskLike = None,
    *,
    interpretable: Iterable[str] = INTERPRETABLE_TYPES,
    variant: str = "uniform",
    n_samples: int = 256,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Label each model's heads and ablate its two label groups, each together.

    Each model is labelled with :func:`~tfmatcomp.analyses.heads.analyse_heads` (random masks,
    default thresholds) on the seeded batch the ablation runs on (``sample_batch(task,
    n_samples, seed)``, the same matrices as the report's attention section), so the groups are
    the model's own: for ``{"pre-shift": ..., "post-shift": ...}`` each is ablated by its own
    labels (pass ``groups=label_head_groups(post_table)`` to
    :func:`~tfmatcomp.experiments.head_group_ablation` for the post-shift groups in both).

    Args:
        models, task, n_samples, seed, batch_size, progress: the experiments' common arguments
            (:mod:`tfmatcomp.experiments`).
        interpretable: see :func:`label_head_groups`.
        variant: ``"uniform"`` (the papers' 1/n^2) or ``"mean"``.

    Returns:
        The :func:`~tfmatcomp.experiments.head_group_ablation` table, one row per (model,
        :data:`LABEL_GROUPS` group), with ``head_types``: each head of the group with its label,
        ``"(1,2) other; (2,4) mask_ignore"`` (1-based); ``attrs["groups"] == "labels"``.

    Raises:
        ValueError: as :func:`label_head_groups` and the experiments' common arguments.

    Example:
        >>> import tfmatcomp as tm
        >>> df = label_group_ablation(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=8)
        >>> list(df.columns[:5])
        ['model', 'group', 'heads_paper', 'heads', 'head_types']
    """
    from tfmatcomp.experiments import head_group_ablation

    kinds = _check_interpretable(interpretable)
    if variant not in ("uniform", "mean"):
        raise ValueError(f"variant: must be 'uniform' (the papers' 1/n^2) or 'mean' (batch mean, the "
                         f"papers' code), got {variant!r}")
    check_progress(progress)
    named, task = resolve_models(models, task)
    tables = []
    for label, model in tracked(named.items(), "label-group ablation", progress, total=len(named),
                                unit="model"):
        batch = sample_batch(task, n_samples, seed, model.device)  # head_group_ablation's batch
        own = analyse_heads(model, None, batch=batch).table
        types = {(int(l), int(h)): str(t) for l, h, t in zip(own["layer"], own["head"], own["type"])}
        df = head_group_ablation({label: model}, task, groups=label_head_groups(own, interpretable=kinds),
                                 variant=variant, n_samples=n_samples, seed=seed, batch_size=batch_size)
        df.insert(4, "head_types", ["; ".join(f"{paper_label(p)} {types[p]}" for p in heads)
                                    for heads in df["heads"]])
        tables.append(df)
    records = [t.attrs["interventions"][i] for t in tables for i in t.index]
    out = pd.concat(tables, ignore_index=True)
    out.attrs.update(tables[0].attrs, groups="labels", interpretable=kinds,
                     labels="analyse_heads on the ablation's batch (random masks)")
    out.attrs["interventions"] = dict(zip(out.index.tolist(), records))
    return out
