"""The batch entry point: :func:`complete_nuclear_norm` completes a
:class:`~tfmatcomp.MatrixBatch` with either solver.

Example:
    >>> import torch
    >>> from tfmatcomp import MatrixCompletionTask
    >>> b = MatrixCompletionTask(n_rows=4, rank=1).sample(2, generator=torch.Generator().manual_seed(0))
    >>> complete_nuclear_norm(b).method
    'torch'
"""

from __future__ import annotations

from typing import Any, Literal

from tfmatcomp.analyses.baselines.cvxpy_path import solve_nuclear_norm_cvxpy
from tfmatcomp.analyses.baselines.solution import NuclearNormSolution
from tfmatcomp.analyses.baselines.solver import solve_nuclear_norm_torch
from tfmatcomp.task.data import MatrixBatch

__all__ = ["complete_nuclear_norm", "Method"]

#: The solver names :func:`complete_nuclear_norm` accepts.
Method = Literal["torch", "cvxpy"]


def complete_nuclear_norm(
    batch: MatrixBatch,
    lam: float | None = None,
    *,
    method: Method = "torch",
    progress: bool | None = None,
    **options: Any,
) -> NuclearNormSolution:
    """Complete every matrix of ``batch`` by nuclear-norm minimization.

    Args:
        batch: the masked matrices; ``batch.values`` at ``batch.observed`` entries are the data.
        lam: None for the constrained problem (Eq. 1), else the weight of Eq. 2.
        method: ``"torch"`` (batched, :func:`solve_nuclear_norm_torch`) or ``"cvxpy"``
            (:func:`solve_nuclear_norm_cvxpy`).
        progress: a bar over the matrices for ``"cvxpy"``, which solves one at a time (None:
            when watched; :mod:`tfmatcomp._progress`); the batched ``"torch"`` solver has none.
        options: passed to the solver function (``solver="SCS"``, ``tol=1e-6``, ...).

    Example:
        >>> import torch
        >>> from tfmatcomp import MatrixCompletionTask
        >>> b = MatrixCompletionTask(n_rows=4, rank=1).sample(8, generator=torch.Generator().manual_seed(0))
        >>> sol = complete_nuclear_norm(b, lam=1e-3)
        >>> sorted(sol.losses(b))
        ['L', 'L_mask', 'L_obs', 'mean_abs_pred_mask', 'n_failed']
    """
    if not isinstance(batch, MatrixBatch):
        raise ValueError(f"batch: expected a MatrixBatch, got {type(batch).__name__}")
    if method == "torch":
        return solve_nuclear_norm_torch(batch.values, batch.observed, batch.n_rows, batch.n_cols,
                                        lam, **options)
    if method == "cvxpy":
        return solve_nuclear_norm_cvxpy(batch.values, batch.observed, batch.n_rows, batch.n_cols,
                                        lam, progress=progress, **options)
    raise ValueError(f"method: must be 'torch' or 'cvxpy', got {method!r}")
