"""Out-of-distribution evaluation of a trained model, next to nuclear-norm minimization (the NeurIPS paper
Fig. 19, the NeurIPS paper Appendix J).

Each condition changes one thing about the training distribution: the law of the entries of ``U``
and ``V`` (Gaussian N(0, 1), Laplace(0, 1), and the same two laws scaled to the variance of
Uniform[-1, 1] factors, ``"gaussian_matched"`` / ``"laplace_matched"``), the rank, the number of
rows, the number of columns, or drops the low-rank structure altogether (``rank=None``: iid entries,
the papers' "random" matrices). For each condition a batch is sampled through :class:`~tfmatcomp.MatrixCompletionTask`,
the model predicts with ``model(batch.tokens)``, and the same batch is completed by nuclear-norm
minimization (:func:`tfmatcomp.analyses.baselines.complete_nuclear_norm`); both are scored with
:func:`tfmatcomp.task.metrics.losses`.

Shapes and positions. A matrix is fed row-major, position ``k = n_cols * row + col``, and the model
has ``n_ctx`` learned positions, so a shape is allowed only if ``n_rows * n_cols <= n_ctx``.
Changing ``n_rows`` keeps the meaning of every position (fewer rows just end the sequence early),
but changing ``n_cols`` moves entries to positions that meant another (row, column) in training:
with 7 columns position 8 is (row 1, col 1); with 6 columns it is (row 1, col 2). The papers find
the positional embeddings encode the column, which is why performance degrades when the number of
columns changes (Fig. 19c). Other ranks use the training shape; changed shapes keep the training
rank unless it exceeds the smaller side (then the rank is that side).

Values outside the training range. Uniform[-1, 1] factors give entries with ``|X_ij| <= rank``, so
a model trained on them has never seen a token beyond ``±rank``; N(0, 1) and Laplace(0, 1) factors
have three and six times the factors' variance and put many entries there. The ``*_matched``
conditions keep the law's shape but the training variance (factor variance 1/3, entry variance
``rank / 9``), which separates "another shape of law" from "values never seen". Every row says
which share of its batch's entries lies beyond the training range
(``frac_outside_train_range``, against ``train_max_abs``, the training task's
:attr:`~tfmatcomp.MatrixCompletionTask.max_abs_entry`). Heavy-tailed entries are clipped to the
tokenizer's range [-10, 10] by the sampler; tokenization is unchanged.

Example:
    >>> import tfmatcomp as tm
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
    >>> task = tm.MatrixCompletionTask(n_rows=4, rank=1)
    >>> df = evaluate_ood(model, task, n_samples=4)
    >>> sorted(set(df["group"]))
    ['distribution', 'full_rank', 'in_distribution', 'n_cols', 'n_rows', 'rank']
    >>> df[df.method == "model"].set_index("condition")["frac_outside_train_range"].loc[["train", "rank=2"]].gt(0).tolist()
    [False, True]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tfmatcomp._progress import check_progress, tracked
from tfmatcomp.analyses.baselines import comparison_row, complete_nuclear_norm, model_predictions, nuclear_norm
from tfmatcomp.task.data import DISTRIBUTIONS, MatrixBatch, MatrixCompletionTask
from tfmatcomp.datapath import resolve_task, sample_batch
from tfmatcomp.validation import check_positive_int

__all__ = ["OODCondition", "ood_conditions", "evaluate_ood", "OOD_GROUPS", "DEFAULT_OOD_DISTRIBUTIONS",
           "outside_fraction"]

#: Condition groups, in the order of :func:`ood_conditions`.
OOD_GROUPS: tuple[str, ...] = ("in_distribution", "distribution", "rank", "n_rows", "n_cols", "full_rank")
#: The entry laws :func:`ood_conditions` tries by default: the papers' N(0, 1) and Laplace(0, 1),
#: then the same laws with Uniform[-1, 1]'s variance (values in the training range, mostly).
DEFAULT_OOD_DISTRIBUTIONS: tuple[str, ...] = ("gaussian", "laplace", "gaussian_matched",
                                              "laplace_matched")


@dataclass(frozen=True)
class OODCondition:
    """One evaluation distribution.

    Attributes:
        group: what is changed (one of :data:`OOD_GROUPS`).
        value: the changed value (a distribution name, a rank, a row or column count, "random").
        task: the distribution to sample from.
    """

    group: str
    value: Any
    task: MatrixCompletionTask

    @property
    def label(self) -> str:
        return "train" if self.group == "in_distribution" else f"{self.group}={self.value}"


def _variant(task: MatrixCompletionTask, **changes) -> MatrixCompletionTask:
    kw = dict(n_rows=task.n_rows, n_cols=task.n_cols, rank=task.rank, p_mask=task.p_mask,
              distribution=task.distribution, tokenizer=task.tokenizer)
    kw.update(changes)
    return MatrixCompletionTask(**kw)


def ood_conditions(
    task,
    n_ctx: int,
    *,
    distributions: Sequence[str] = DEFAULT_OOD_DISTRIBUTIONS,
    ranks: Sequence[int] | None = None,
    n_rows: Sequence[int] | None = None,
    n_cols: Sequence[int] | None = None,
    full_rank: bool = True,
) -> list[OODCondition]:
    """The papers' OOD conditions around a training distribution.

    Args:
        task: the training distribution (MatrixCompletionTask or TaskConfig).
        n_ctx: the model's number of positions (shapes must fit).
        distributions: entry laws other than the training one (names of
            :data:`~tfmatcomp.task.data.DISTRIBUTIONS`; default :data:`DEFAULT_OOD_DISTRIBUTIONS`,
            the unit-variance laws and their variance-matched versions).
        ranks: ranks to try (default: every rank from 1 to the smaller side except the training one).
        n_rows, n_cols: row / column counts to try with the other side fixed (default: every count
            from 2 that fits in ``n_ctx``, up to ``n_ctx // other side``, except the training one).
        full_rank: add full-rank random matrices of the training shape.

    Raises:
        ValueError: a requested shape does not fit in ``n_ctx``, a rank exceeds the shape, or a
            distribution is unknown.

    Example:
        >>> import tfmatcomp as tm
        >>> conds = ood_conditions(tm.MatrixCompletionTask(n_rows=4, rank=1), n_ctx=16)
        >>> [c.label for c in conds]  # doctest: +NORMALIZE_WHITESPACE
        ['train', 'distribution=gaussian', 'distribution=laplace', 'distribution=gaussian_matched',
         'distribution=laplace_matched', 'rank=2', 'rank=3', 'rank=4', 'n_rows=2', 'n_rows=3',
         'n_cols=2', 'n_cols=3', 'full_rank=random']
    """
    task = resolve_task(task)
    check_positive_int("n_ctx", n_ctx)
    if task.n_positions > n_ctx:
        raise ValueError(f"task: {task.n_rows}x{task.n_cols} needs {task.n_positions} positions, "
                         f"more than n_ctx={n_ctx}")
    R, C = task.n_rows, task.n_cols
    if isinstance(distributions, str) or not all(isinstance(d, str) for d in distributions):
        raise ValueError(f"distributions: expected a sequence of names from {DISTRIBUTIONS}, got "
                         f"{distributions!r}")
    unknown = [d for d in distributions if d not in DISTRIBUTIONS]
    if unknown:
        raise ValueError(f"distributions: unknown {unknown}; choose from {DISTRIBUTIONS}")
    conds = [OODCondition("in_distribution", "train", task)]
    conds += [OODCondition("distribution", d, _variant(task, distribution=d))
              for d in dict.fromkeys(distributions) if d != task.distribution]
    if ranks is None:
        ranks = [r for r in range(1, min(R, C) + 1) if r != task.rank]
    conds += [OODCondition("rank", r, _variant(task, rank=r)) for r in ranks]

    def shape_ok(rows: int, cols: int, what: str) -> None:
        if rows * cols > n_ctx:
            raise ValueError(f"{what}: a {rows}x{cols} matrix needs {rows * cols} positions, more "
                             f"than the model's n_ctx={n_ctx}")

    def rank_for(rows: int, cols: int):
        return None if task.rank is None else min(task.rank, rows, cols)

    if n_rows is None:
        n_rows = [r for r in range(2, n_ctx // C + 1) if r != R]
    for r in n_rows:
        shape_ok(r, C, "n_rows")
        conds.append(OODCondition("n_rows", r, _variant(task, n_rows=r, rank=rank_for(r, C))))
    if n_cols is None:
        n_cols = [c for c in range(2, n_ctx // R + 1) if c != C]
    for c in n_cols:
        shape_ok(R, c, "n_cols")
        conds.append(OODCondition("n_cols", c, _variant(task, n_cols=c, rank=rank_for(R, c))))
    if full_rank and task.rank is not None:
        conds.append(OODCondition("full_rank", "random", _variant(task, rank=None)))
    return conds


def evaluate_ood(
    model,
    task=None,
    conditions: Sequence[OODCondition] | None = None,
    *,
    n_samples: int = 256,
    seed: int = 0,
    baseline: bool = True,
    lam: float | None = None,
    method: str = "torch",
    progress: bool | None = None,
    **solver_options: Any,
) -> pd.DataFrame:
    """Evaluate ``model`` on OOD conditions, each next to nuclear-norm minimization.

    Args:
        model: a trained :class:`~tfmatcomp.HookedEncoder`.
        task: the training distribution (MatrixCompletionTask or TaskConfig); used to build the
            default conditions with :func:`ood_conditions` (and ``model.cfg.n_ctx``).
        conditions: explicit conditions (then ``task`` may be None).
        n_samples: matrices per condition; each condition draws its batch from a generator seeded
            with ``seed``, so a condition's batch does not depend on the others.
            The training range (``train_max_abs``) is ``task``'s, else that of the condition of
            group ``"in_distribution"`` among ``conditions``; NaN when neither is given.
        baseline: also solve nuclear-norm minimization on the same batches.
        lam, method, solver_options: the nuclear-norm problem and solver
            (see :func:`tfmatcomp.analyses.baselines.complete_nuclear_norm`).
        progress: a bar over the conditions (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        One row per (condition, method) with columns ``group, condition, value, n_rows, n_cols,
        rank`` (None: full rank) ``, distribution, p_mask, method, L, L_obs, L_mask,
        mean_abs_pred_mask, n_failed, nuclear_norm, true_nuclear_norm, n_samples,
        factor_variance, train_max_abs, frac_outside_train_range`` (the share of the batch's
        entries, observed and masked, with ``|value| > train_max_abs``; see :func:`outside_fraction`).

    Example:
        >>> import tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
        >>> conds = ood_conditions(tm.TaskConfig(n_rows=4, rank=1), 16, ranks=[2], n_rows=[], n_cols=[])
        >>> evaluate_ood(model, conditions=conds, n_samples=4)["condition"].tolist()[::2]  # doctest: +NORMALIZE_WHITESPACE
        ['train', 'distribution=gaussian', 'distribution=laplace', 'distribution=gaussian_matched',
         'distribution=laplace_matched', 'rank=2', 'full_rank=random']
    """
    if conditions is None:
        if task is None:
            raise ValueError("task: required when no conditions are given")
        conditions = ood_conditions(task, model.cfg.n_ctx)
    check_positive_int("n_samples", n_samples)
    check_progress(progress)
    if task is not None:
        train = resolve_task(task)
    else:
        train = next((c.task for c in conditions if c.group == "in_distribution"), None)
    train_max = float("nan") if train is None else float(train.max_abs_entry)
    n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", None)
    rows = []
    conditions = list(conditions)
    for cond in tracked(conditions, "out-of-distribution", progress, unit="condition"):
        t = cond.task
        if n_ctx is not None and t.n_positions > n_ctx:
            raise ValueError(f"conditions: {cond.label} needs {t.n_positions} positions, more than "
                             f"the model's n_ctx={n_ctx}")
        batch = sample_batch(t, n_samples, seed=seed)
        meta = dict(group=cond.group, condition=cond.label, value=cond.value, n_rows=t.n_rows,
                    n_cols=t.n_cols, rank=t.rank, distribution=t.distribution, p_mask=t.p_mask,
                    true_nuclear_norm=float(nuclear_norm(batch.matrices.double()).mean()),
                    factor_variance=t.factor_variance, train_max_abs=train_max,
                    frac_outside_train_range=outside_fraction(batch, train_max))
        rows.append(comparison_row("model", model_predictions(model, batch), batch, None, **meta))
        if baseline:
            sol = complete_nuclear_norm(batch, lam, method=method, **solver_options)
            rows.append(comparison_row("nuclear_norm", sol.predictions, batch, sol.converged, **meta))
    cols = ["group", "condition", "value", "n_rows", "n_cols", "rank", "distribution", "p_mask",
            "method", "L", "L_obs", "L_mask", "mean_abs_pred_mask", "n_failed", "nuclear_norm",
            "true_nuclear_norm", "n_samples", "factor_variance", "train_max_abs",
            "frac_outside_train_range"]
    return pd.DataFrame(rows)[cols]


def outside_fraction(batch: MatrixBatch, max_abs: float) -> float:
    """The share of ``batch``'s entries (observed and masked) with ``|value| > max_abs``: for
    ``max_abs`` the training task's :attr:`~tfmatcomp.MatrixCompletionTask.max_abs_entry`, the
    entries whose values a model never saw in training (NaN when ``max_abs`` is NaN).

    Values are the batch's targets: rounded to the tokenizer's grid and clipped to its range, so
    an entry counts as outside when its token lies beyond the training tokens.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> b = tm.MatrixCompletionTask(n_rows=7, rank=2, distribution="gaussian").sample(
        ...     64, generator=torch.Generator().manual_seed(0))
        >>> 0.1 < outside_fraction(b, 2.0) < 0.3, outside_fraction(b, 10.0)
        (True, 0.0)
    """
    if not isinstance(batch, MatrixBatch):
        raise ValueError(f"batch: expected a MatrixBatch, got {type(batch).__name__}")
    if isinstance(max_abs, bool) or not isinstance(max_abs, (int, float)):
        raise ValueError(f"max_abs: expected a number (NaN: no training range), got {max_abs!r}")
    if max_abs != max_abs:
        return float("nan")
    return float((batch.values.abs() > max_abs).float().mean())
