"""Positional permutation (the workshop paper Section 3.2.1): shuffle which position each embedding encodes.

With :class:`~tfmatcomp.interventions.PositionalPermutation`, the embedding that encoded position ``i``
is used at position ``perm[i]``, ``perm`` uniformly random over the task's ``n_rows * n_cols``
positions. Copying needs no positions, so ``L_obs`` should stay small while ``L_mask`` of a
post-shift model rises.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments import positional_permutation
    >>> df = positional_permutation(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=8)
    >>> df["condition"].tolist()
    ['baseline', 'permuted']
"""

from __future__ import annotations

import pandas as pd

from tfmatcomp.datapath import ModelsLike, TaskLike, resolve_models, sample_batch
from tfmatcomp.experiments.reference import PAPER_PERMUTATION
from tfmatcomp.experiments.table import experiment_table, loss_row
from tfmatcomp.interventions import PositionalPermutation
from tfmatcomp.validation import check_positive_int

__all__ = ["positional_permutation"]


def positional_permutation(
    models: ModelsLike,
    task: TaskLike = None,
    *,
    n_samples: int = 256,
    seed: int = 0,
    n_permutations: int = 1,
    batch_size: int = 256,
) -> pd.DataFrame:
    """Losses with randomly permuted positional embeddings.

    Args:
        models, task, n_samples, seed, batch_size: the experiments' common arguments
            (:mod:`tfmatcomp.experiments`).
        n_permutations: how many random permutations; permutation ``k`` uses seed ``seed + k``.

    Returns:
        Rows per model: ``condition`` ``"baseline"``, then ``"permuted"`` per permutation, with
        ``permutation_seed``, ``L``, ``L_obs``, ``L_mask``, ``paper_4l8h_L_obs``,
        ``paper_4l8h_L_mask`` (post-shift, permuted rows), ``intervention`` (JSON of the
        permutation, None for the baseline).
    """
    check_positive_int("n_permutations", n_permutations)
    named, task = resolve_models(models, task)
    rows = []
    for label, model in named.items():
        batch = sample_batch(task, n_samples, seed, model.device)
        rows.append({"model": label, "condition": "baseline", "permutation_seed": None,
                     **loss_row(model, batch, None, batch_size)})
        for k in range(n_permutations):
            iv = PositionalPermutation(seed=seed + k, n_positions=task.n_positions)
            rows.append({"model": label, "condition": "permuted", "permutation_seed": seed + k,
                         **loss_row(model, batch, iv, batch_size, PAPER_PERMUTATION.get(label))})
    return experiment_table(rows, experiment="positional permutation", n_samples=n_samples,
                            seed=seed)
