"""The papers' comparisons: model vs nuclear-norm minimization across ``p_mask``
(:func:`compare_with_model`; the workshop paper Fig. 5, the NeurIPS paper Fig. 3) and the regularized table
(:func:`lambda_table`; the workshop paper Appendix D).

Example:
    >>> PAPER_P_MASKS[:3], PAPER_LAMBDAS[0]
    ((0.1, 0.15, 0.2), 0.0005)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp._progress import check_progress, tracked
from tfmatcomp.analyses.baselines.complete import Method, complete_nuclear_norm
from tfmatcomp.analyses.baselines.solution import batch_losses, nuclear_norm
from tfmatcomp.task.data import MatrixBatch, MatrixCompletionTask
from tfmatcomp.datapath import resolve_task, sample_batch
from tfmatcomp.validation import check_positive_int

__all__ = [
    "compare_with_model", "lambda_table", "model_predictions", "comparison_row",
    "PAPER_LAMBDA_TABLE", "PAPER_P_MASKS", "PAPER_LAMBDAS",
]

#: The regularized nuclear-norm results of the workshop paper, Appendix D (256 samples, 7x7, rank 2,
#: p_mask 0.3): ``lam -> (L_obs, L_mask, L)``.
PAPER_LAMBDA_TABLE: dict[float, tuple[float, float, float]] = {
    5e-4: (1.015e-5, 0.040728, 0.012173),
    1e-3: (3.686e-5, 0.040456, 0.01211),
    1.5e-3: (7.959e-5, 0.040505, 0.012155),
    2e-3: (0.00013769, 0.040734, 0.012264),
    5e-3: (0.00078591, 0.043402, 0.013516),
}
#: The lambdas of that table.
PAPER_LAMBDAS: tuple[float, ...] = tuple(PAPER_LAMBDA_TABLE)
#: The p_mask grid of the papers' model-vs-nuclear-norm figure (0.1, 0.15, ..., 0.6).
PAPER_P_MASKS: tuple[float, ...] = tuple(round(0.1 + 0.05 * i, 2) for i in range(11))


@torch.no_grad()
def model_predictions(model, batch: MatrixBatch) -> Float[Tensor, "batch pos"]:
    """``model(batch.tokens)`` in eval mode on the model's device (the normal forward path), returned
    on the batch's device. Any ``nn.Module`` mapping tokens to ``[batch, pos]`` predictions will do
    (:func:`tfmatcomp.datapath.predict` is the chunked one for a :class:`~tfmatcomp.HookedEncoder`).

    Example:
        >>> import torch, tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
        >>> b = tm.MatrixCompletionTask(4, rank=1).sample(2, generator=torch.Generator().manual_seed(0))
        >>> model_predictions(m, b).shape
        torch.Size([2, 16])
    """
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        return model(batch.tokens.to(device)).to(batch.device)
    finally:
        model.train(was_training)


def comparison_row(
    kind: str,
    preds: Float[Tensor, "batch pos"],
    batch: MatrixBatch,
    keep: Bool[Tensor, "batch"] | None,
    **extra: Any,
) -> dict[str, Any]:
    """One row of a model-vs-baseline table: ``extra``, ``method=kind``, the losses of ``preds`` on
    ``batch`` (matrices where ``keep`` is True; see :func:`~tfmatcomp.analyses.baselines.batch_losses`), the
    mean nuclear norm of the predicted matrices and ``n_samples``.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> b = tm.MatrixCompletionTask(3, rank=1).sample(2, generator=torch.Generator().manual_seed(0))
        >>> row = comparison_row("truth", b.values, b, None, p_mask=0.3)
        >>> row["method"], row["L"], row["n_samples"]
        ('truth', 0.0, 2)
    """
    row = dict(extra)
    row["method"] = kind
    row.update(batch_losses(preds, batch, keep))
    mats = preds.to(torch.float64).reshape(-1, batch.n_rows, batch.n_cols)
    norms = nuclear_norm(mats)
    if keep is not None:
        norms = norms[keep.to(norms.device)]
    row["nuclear_norm"] = float(norms.mean()) if norms.numel() else float("nan")
    row["n_samples"] = batch.batch_size
    return row


def compare_with_model(
    model,
    p_masks: Sequence[float] = PAPER_P_MASKS,
    *,
    task: Any = None,
    n_samples: int = 256,
    seed: int = 0,
    lam: float | None = None,
    method: Method = "torch",
    progress: bool | None = None,
    **solver_options: Any,
) -> pd.DataFrame:
    """Model vs nuclear-norm minimization across ``p_mask`` (the workshop paper Fig. 5, the NeurIPS paper Fig. 3).

    For each ``p_mask`` a fresh batch is drawn from ``task`` with that masking probability (one
    generator seeded with ``seed``, batches drawn in order), the model predicts via
    ``model(batch.tokens)``, and the same batch is completed by nuclear-norm minimization.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder` (or anything mapping tokens to ``[batch, pos]``).
        p_masks: masking probabilities (default: 0.1, 0.15, ..., 0.6 as in the papers' code).
        task: the matrix distribution (MatrixCompletionTask, TaskConfig or preset name; see
            :func:`tfmatcomp.datapath.resolve_task`); its ``p_mask`` is replaced. Default: 7x7 rank 2.
        n_samples: matrices per ``p_mask``.
        lam: None compares with Eq. 1 (the papers' figure), a number with Eq. 2.
        method: nuclear-norm solver (``"torch"`` or ``"cvxpy"``).
        progress: a bar over ``p_masks`` (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        One row per (p_mask, method) with columns ``p_mask, method ("model" or "nuclear_norm"),
        L, L_obs, L_mask, mean_abs_pred_mask, n_failed, nuclear_norm`` (mean ``||X||_*`` of the
        solutions; for the model, of its raw output matrix) ``, true_nuclear_norm`` (of the targets)
        ``, n_samples``.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
        >>> df = compare_with_model(model, [0.2, 0.4], task=tm.MatrixCompletionTask(4, rank=1), n_samples=4)
        >>> df[["p_mask", "method"]].values.tolist()
        [[0.2, 'model'], [0.2, 'nuclear_norm'], [0.4, 'model'], [0.4, 'nuclear_norm']]
    """
    base = resolve_task(task) if task is not None else MatrixCompletionTask(n_rows=7, rank=2)
    check_positive_int("n_samples", n_samples)
    check_progress(progress)
    gen = torch.Generator().manual_seed(seed)   # one generator: the batches are drawn in order
    rows = []
    for p in tracked(list(p_masks), "model vs nuclear norm", progress):
        t = MatrixCompletionTask(n_rows=base.n_rows, n_cols=base.n_cols, rank=base.rank,
                                 p_mask=float(p), distribution=base.distribution,
                                 tokenizer=base.tokenizer)
        batch = sample_batch(t, n_samples, generator=gen)
        true_norm = float(nuclear_norm(batch.matrices.to(torch.float64)).mean())
        preds = model_predictions(model, batch)
        meta = dict(p_mask=float(p), true_nuclear_norm=true_norm)
        rows.append(comparison_row("model", preds, batch, None, **meta))
        sol = complete_nuclear_norm(batch, lam, method=method, **solver_options)
        rows.append(comparison_row("nuclear_norm", sol.predictions, batch, sol.converged, **meta))
    cols = ["p_mask", "method", "L", "L_obs", "L_mask", "mean_abs_pred_mask", "n_failed",
            "nuclear_norm", "true_nuclear_norm", "n_samples"]
    return pd.DataFrame(rows)[cols]


def lambda_table(
    lams: Sequence[float] = PAPER_LAMBDAS,
    *,
    task: Any = None,
    n_samples: int = 256,
    seed: int = 0,
    method: Method = "torch",
    model=None,
    include_constrained: bool = False,
    progress: bool | None = None,
    **solver_options: Any,
) -> pd.DataFrame:
    """The regularized nuclear-norm table of the workshop paper, Appendix D: ``L_obs, L_mask, L`` per lambda.

    All lambdas are solved on the same ``n_samples`` matrices from ``task`` (a MatrixCompletionTask,
    TaskConfig or preset name; default 7x7, rank 2, p_mask 0.3), drawn with a generator seeded by
    ``seed`` (:func:`tfmatcomp.datapath.sample_batch`).

    Args:
        lams: regularization weights (default: the paper's 5e-4, 1e-3, 1.5e-3, 2e-3, 5e-3).
        model: optionally a trained model, evaluated on the same batch (a row with method "model").
        include_constrained: also add the constrained problem (a row with ``lam`` NaN).
        method, solver_options: the solver (see :func:`complete_nuclear_norm`).
        progress: a bar over the lambdas (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        Columns ``method, lam, L_obs, L_mask, L, mean_abs_pred_mask, n_failed, nuclear_norm,
        paper_L_obs, paper_L_mask, paper_L`` (the paper's values where it has that lambda, else NaN).

    Example:
        >>> import tfmatcomp as tm
        >>> df = lambda_table([1e-3, 5e-3], task=tm.MatrixCompletionTask(4, rank=1), n_samples=4)
        >>> df["lam"].tolist()
        [0.001, 0.005]
    """
    base = resolve_task(task) if task is not None else MatrixCompletionTask(n_rows=7, rank=2, p_mask=0.3)
    check_progress(progress)
    batch = sample_batch(base, n_samples, seed=seed)
    rows = []
    nan = float("nan")
    todo: list[float | None] = [float(lam) for lam in lams] + ([None] if include_constrained else [])
    for lam in tracked(todo, "nuclear norm per lambda", progress):
        sol = complete_nuclear_norm(batch, lam, method=method, **solver_options)
        row = comparison_row("nuclear_norm", sol.predictions, batch, sol.converged,
                             lam=nan if lam is None else lam)
        paper = PAPER_LAMBDA_TABLE.get(lam) if lam is not None else None
        row.update(zip(("paper_L_obs", "paper_L_mask", "paper_L"), paper or (nan, nan, nan)))
        rows.append(row)
    if model is not None:
        row = comparison_row("model", model_predictions(model, batch), batch, None, lam=nan)
        row.update(paper_L_obs=nan, paper_L_mask=nan, paper_L=nan)
        rows.append(row)
    cols = ["method", "lam", "L_obs", "L_mask", "L", "mean_abs_pred_mask", "n_failed",
            "nuclear_norm", "paper_L_obs", "paper_L_mask", "paper_L", "n_samples"]
    return pd.DataFrame(rows)[cols]
