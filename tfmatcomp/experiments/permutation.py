"""Positional permutation (the workshop paper Section 3.2.1): shuffle which position each embedding encodes.

With :class:`~tfmatcomp.interventions.PositionalPermutation`, the embedding that encoded position ``i``
is used at position ``perm[i]``, ``perm`` uniformly random over the task's ``n_rows * n_cols``
positions. Copying needs no positions, so ``L_obs`` should stay small while ``L_mask`` of a
post-shift model rises.

One permutation is one draw: how much ``L_mask`` rises depends on which positions it swaps (a
permutation that keeps columns together hurts a column-reading model less). Run several
(``n_permutations``) and read their spread with :func:`permutation_summary`.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments import positional_permutation, permutation_summary
    >>> df = positional_permutation(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=8)
    >>> df["condition"].tolist()
    ['baseline', 'permuted']
    >>> df = positional_permutation(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=8,
    ...                             n_permutations=3)
    >>> permutation_summary(df)[["model", "n_permutations"]].values.tolist()
    [['model', 3]]
"""

from __future__ import annotations

import pandas as pd

from tfmatcomp.datapath import ModelsLike, TaskLike, resolve_models, sample_batch
from tfmatcomp.experiments.reference import PAPER_PERMUTATION
from tfmatcomp.experiments.table import experiment_table, loss_row, papers
from tfmatcomp._progress import bar, check_progress
from tfmatcomp.interventions import PositionalPermutation
from tfmatcomp.validation import check_positive_int

__all__ = ["positional_permutation", "permutation_summary"]

#: The losses :func:`permutation_summary` summarizes.
_METRICS = ("L", "L_obs", "L_mask")


def positional_permutation(
    models: ModelsLike,
    task: TaskLike = None,
    *,
    n_samples: int = 256,
    seed: int = 0,
    n_permutations: int = 1,
    batch_size: int = 256,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Losses with randomly permuted positional embeddings.

    Args:
        models, task, n_samples, seed, batch_size: the experiments' common arguments
            (:mod:`tfmatcomp.experiments`).
        n_permutations: how many random permutations; permutation ``k`` uses seed ``seed + k``.
        progress: a bar over the conditions (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        Rows per model: ``condition`` ``"baseline"``, then ``"permuted"`` per permutation, with
        ``permutation_seed``, ``L``, ``L_obs``, ``L_mask``, and for the papers' model
        ``paper_4l8h_L_obs``, ``paper_4l8h_L_mask`` (post-shift, permuted rows).
        ``df.attrs["interventions"]``: each row's permutation as JSON (None for the baseline).
    """
    check_positive_int("n_permutations", n_permutations)
    check_progress(progress)
    named, task = resolve_models(models, task)
    rows = []
    with bar(len(named) * (1 + n_permutations), "positional permutation", progress) as b:
        for label, model in named.items():
            batch = sample_batch(task, n_samples, seed, model.device)
            rows.append({"model": label, "condition": "baseline", "permutation_seed": None,
                         **loss_row(model, batch, None, batch_size)})
            b.update()
            for k in range(n_permutations):
                iv = PositionalPermutation(seed=seed + k, n_positions=task.n_positions)
                rows.append({"model": label, "condition": "permuted", "permutation_seed": seed + k,
                             **loss_row(model, batch, iv, batch_size,
                                        papers(PAPER_PERMUTATION, label, model))})
                b.update()
    df = experiment_table(rows, experiment="positional permutation", n_samples=n_samples, seed=seed)
    df["permutation_seed"] = df["permutation_seed"].astype("Int64")   # missing for the baseline
    return df


def permutation_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per model: the baseline losses and, over the permutations of a
    :func:`positional_permutation` table, their mean, standard deviation, min and max.

    Args:
        table: a :func:`positional_permutation` table (columns ``model``, ``condition``, ``L``,
            ``L_obs``, ``L_mask``; one ``"baseline"`` row and at least one ``"permuted"`` row
            per model).

    Returns:
        One row per model (in the table's order): ``model``, ``n_permutations``, then for each of
        ``L``, ``L_obs``, ``L_mask``: ``{k}_baseline``, ``{k}_mean``, ``{k}_std`` (sample standard
        deviation, NaN for one permutation), ``{k}_min``, ``{k}_max``; and
        ``paper_4l8h_L_obs`` / ``paper_4l8h_L_mask`` where the table has them.

    Raises:
        ValueError: ``table`` is not such a table (a missing column, or a model without a
            baseline or permuted row).

    Example:
        >>> import pandas as pd
        >>> t = pd.DataFrame({"model": "m", "condition": ["baseline", "permuted", "permuted"],
        ...                   "L": [0.1, 0.2, 0.4], "L_obs": [0.0, 0.1, 0.1], "L_mask": [0.3, 0.5, 0.9]})
        >>> permutation_summary(t)[["n_permutations", "L_mask_mean", "L_mask_min", "L_mask_max"]].values.tolist()
        [[2.0, 0.7, 0.5, 0.9]]
    """
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"table: expected a positional_permutation DataFrame, got {type(table).__name__}")
    missing = [c for c in ("model", "condition", *_METRICS) if c not in table]
    if missing:
        raise ValueError(f"table: missing columns {missing}; pass a positional_permutation() table")
    rows = []
    for model in dict.fromkeys(table["model"]):
        t = table[table["model"] == model]
        base, perm = t[t["condition"] == "baseline"], t[t["condition"] == "permuted"]
        if len(base) != 1 or perm.empty:
            raise ValueError(f"table: model {model!r} needs one 'baseline' row and at least one "
                             f"'permuted' row, has {len(base)} and {len(perm)}")
        row = {"model": model, "n_permutations": len(perm)}
        for k in _METRICS:
            values = perm[k].astype(float)
            row.update({f"{k}_baseline": float(base[k].iloc[0]), f"{k}_mean": float(values.mean()),
                        f"{k}_std": float(values.std(ddof=1)) if len(values) > 1 else float("nan"),
                        f"{k}_min": float(values.min()), f"{k}_max": float(values.max())})
        for k in ("paper_4l8h_L_obs", "paper_4l8h_L_mask"):
            if k in perm:
                row[k] = float(perm[k].iloc[0])
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs.update(table.attrs, summary="over permutations: mean, sample std, min, max")
    return out
