"""The nuclear-norm problems' inputs and their answer: :class:`NuclearNormSolution`, scored against a batch.

Both solvers (:mod:`~tfmatcomp.analyses.baselines.solver`, :mod:`~tfmatcomp.analyses.baselines.cvxpy_path`) check
their inputs with :func:`check_problem` and return a :class:`NuclearNormSolution`.

Example:
    >>> import torch
    >>> nuclear_norm(torch.diag(torch.tensor([3.0, -2.0]))[None]).tolist()
    [5.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.metrics import losses
from tfmatcomp.validation import check_positive_int, shape_text

__all__ = ["NuclearNormSolution", "nuclear_norm", "batch_losses", "check_problem"]


@dataclass(frozen=True)
class NuclearNormSolution:
    """Completed matrices of a batch, with per-matrix solver status.

    Attributes:
        matrices: the solutions ``[batch, n_rows, n_cols]`` (NaN where a matrix failed).
        converged: True where the solver reports success.
        status: one string per matrix: ``"optimal"``, or why it failed (``"max_iter"``, a cvxpy
            status such as ``"infeasible"``, ``"solver_error: ..."``).
        lam: the regularization weight (None: the constrained problem).
        method: ``"torch"`` or ``"cvxpy:<SOLVER>"``.
        n_iter: Newton iterations of the torch solver (None for cvxpy).
    """

    matrices: Float[Tensor, "batch n_rows n_cols"]
    converged: Bool[Tensor, "batch"]
    status: tuple[str, ...]
    lam: float | None
    method: str
    n_iter: int | None = None
    info: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n_rows(self) -> int:
        return self.matrices.shape[1]

    @property
    def n_cols(self) -> int:
        return self.matrices.shape[2]

    @property
    def predictions(self) -> Float[Tensor, "batch pos"]:
        """The solutions flattened row-major, like a model's predictions ``[batch, pos]``."""
        return self.matrices.reshape(self.matrices.shape[0], -1)

    @property
    def failures(self) -> list[tuple[int, str]]:
        """``(index, status)`` of every matrix that did not converge."""
        return [(i, s) for i, s in enumerate(self.status) if not bool(self.converged[i])]

    def nuclear_norms(self) -> Float[Tensor, "batch"]:
        """``||X||_*`` of each solution (NaN for failed matrices)."""
        return nuclear_norm(self.matrices)

    def losses(self, batch: MatrixBatch) -> dict[str, float]:
        """``L``, ``L_obs``, ``L_mask``, ``mean_abs_pred_mask`` of the converged solutions against
        ``batch`` (via :func:`tfmatcomp.task.metrics.losses`), plus ``n_failed``."""
        return batch_losses(self.predictions, batch, self.converged)


def nuclear_norm(matrices: Float[Tensor, "*batch n_rows n_cols"]) -> Float[Tensor, "*batch"]:
    """Sum of singular values of each matrix (NaN stays NaN).

    Example:
        >>> nuclear_norm(torch.eye(3)[None]).tolist()
        [3.0]
    """
    finite = torch.isfinite(matrices).flatten(-2).all(-1)
    safe = torch.where(finite[..., None, None], matrices, torch.zeros_like(matrices))
    out = torch.linalg.svdvals(safe).sum(-1)
    return torch.where(finite, out, torch.full_like(out, float("nan")))


def batch_losses(predictions: Float[Tensor, "batch pos"], batch: MatrixBatch,
                 keep: Bool[Tensor, "batch"] | None = None) -> dict[str, float]:
    """:func:`tfmatcomp.task.metrics.losses` of ``predictions`` on the matrices where ``keep`` is True,
    as floats, plus ``n_failed`` (the number left out).

    Example:
        >>> import torch
        >>> from tfmatcomp import MatrixCompletionTask
        >>> b = MatrixCompletionTask(n_rows=3, rank=1).sample(2, generator=torch.Generator().manual_seed(0))
        >>> batch_losses(b.values, b)["L"]
        0.0
    """
    if keep is None:
        keep = torch.ones(batch.batch_size, dtype=torch.bool)
    keep = keep.to(batch.device)
    n_failed = int((~keep).sum())
    if not keep.any():
        nan = float("nan")
        return {"L": nan, "L_obs": nan, "L_mask": nan, "mean_abs_pred_mask": nan, "n_failed": n_failed}
    sub = batch[keep]
    pred = predictions.to(batch.device)[keep].to(torch.float64)
    out = {k: float(v) for k, v in losses(pred, sub).items()}
    out["n_failed"] = n_failed
    return out


def check_problem(values: Tensor, observed: Tensor, n_rows: int, n_cols: int,
                  lam: float | None) -> None:
    """ValueError unless ``values`` / ``observed`` are ``[batch, n_rows * n_cols]`` (bool mask, finite
    observed values) and ``lam`` is None or a positive number: the inputs of both solvers.

    Example:
        >>> check_problem(torch.zeros(2, 4), torch.ones(2, 4, dtype=torch.bool), 2, 2, None)
        >>> check_problem(torch.zeros(2, 4), torch.ones(2, 4, dtype=torch.bool), 2, 2, -1.0)
        Traceback (most recent call last):
        ...
        ValueError: lam: must be a positive number (or None for the constrained problem), got -1.0
    """
    check_positive_int("n_rows", n_rows)
    check_positive_int("n_cols", n_cols)
    if not torch.is_tensor(values) or values.ndim != 2 or values.shape[1] != n_rows * n_cols:
        raise ValueError(f"values: expected shape [batch, {n_rows * n_cols}] for {n_rows}x{n_cols} "
                         f"matrices, got {shape_text(values)}")
    if not torch.is_tensor(observed) or observed.dtype != torch.bool or observed.shape != values.shape:
        raise ValueError(f"observed: expected a bool tensor of shape {tuple(values.shape)}, got "
                         f"{shape_text(observed)}")
    if not torch.isfinite(values[observed]).all():
        raise ValueError("values: observed entries must be finite")
    if lam is not None and (isinstance(lam, bool) or not (
            isinstance(lam, (int, float)) and math.isfinite(lam) and lam > 0)):
        raise ValueError(f"lam: must be a positive number (or None for the constrained problem), "
                         f"got {lam!r}")
