"""The cvxpy reference: :func:`solve_nuclear_norm_cvxpy`, one cvxpy problem per matrix.

The solver is named explicitly (``"CLARABEL"`` by default; ``"SCS"`` is what the papers' code ran)
and the status is checked per matrix: a failed matrix is reported in
:attr:`~tfmatcomp.analyses.baselines.NuclearNormSolution.status` and left as NaN, and the batch goes on.

Example:
    >>> import torch
    >>> from tfmatcomp import MatrixCompletionTask
    >>> b = MatrixCompletionTask(n_rows=3, rank=1).sample(1, generator=torch.Generator().manual_seed(0))
    >>> solve_nuclear_norm_cvxpy(b.values, b.observed, 3, 3, lam=1e-3).method
    'cvxpy:CLARABEL'
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.analyses.baselines.solution import NuclearNormSolution, check_problem

__all__ = ["solve_nuclear_norm_cvxpy"]


_CVXPY_OK = ("optimal",)


def _cvxpy_problem(n_rows: int, n_cols: int, regularized: bool):
    """A DPP-parametrized cvxpy problem, compiled once and reused across matrices."""
    import cvxpy as cp

    X = cp.Variable((n_rows, n_cols))
    if regularized:
        W = cp.Parameter((n_rows, n_cols), nonneg=True)   # sqrt(1/|Omega|) on observed entries
        Bp = cp.Parameter((n_rows, n_cols))                # W * A
        lam = cp.Parameter(nonneg=True)
        prob = cp.Problem(cp.Minimize(cp.sum_squares(cp.multiply(W, X) - Bp) + lam * cp.normNuc(X)))
        return prob, X, (W, Bp, lam)
    M = cp.Parameter((n_rows, n_cols), nonneg=True)        # 1 on observed entries
    Bp = cp.Parameter((n_rows, n_cols))                    # M * A
    prob = cp.Problem(cp.Minimize(cp.normNuc(X)), [cp.multiply(M, X) == Bp])
    return prob, X, (M, Bp)


def _cvxpy_fresh_problem(A, mask, lam):
    """The problem built from scratch for one matrix (the papers' code does this)."""
    import cvxpy as cp

    X = cp.Variable(A.shape)
    if lam is None:
        prob = cp.Problem(cp.Minimize(cp.normNuc(X)), [cp.multiply(mask, X) == mask * A])
    else:
        size = max(mask.sum(), 1.0)
        prob = cp.Problem(cp.Minimize(cp.sum_squares(cp.multiply(mask, X - A)) / size
                                      + lam * cp.normNuc(X)))
    return prob, X


def solve_nuclear_norm_cvxpy(
    values: Float[Tensor, "batch pos"],
    observed: Bool[Tensor, "batch pos"],
    n_rows: int,
    n_cols: int,
    lam: float | None = None,
    *,
    solver: str = "CLARABEL",
    reuse: bool = True,
    accept_inaccurate: bool = False,
    progress: bool | None = None,
    **solver_options: Any,
) -> NuclearNormSolution:
    """Solve each matrix's nuclear-norm problem with cvxpy, one matrix at a time.

    Args:
        values, observed, n_rows, n_cols, lam: as :func:`solve_nuclear_norm_torch`.
        solver: a cvxpy solver name that is installed (``"CLARABEL"``, ``"SCS"``, ...).
        reuse: compile one parametrized (DPP) problem and re-solve it for each matrix (faster);
            False builds a fresh problem per matrix, as the papers' code does.
        accept_inaccurate: count cvxpy's ``"optimal_inaccurate"`` as success.
        progress: a bar over the matrices (None: when watched; :mod:`tfmatcomp._progress`).
        solver_options: passed to ``problem.solve`` (e.g. ``eps=1e-6`` for SCS).

    A matrix whose solve raises or ends with another status keeps NaN entries and its status
    string (``failures`` lists them); the rest of the batch is still solved.

    Example:
        >>> import torch
        >>> from tfmatcomp import MatrixCompletionTask
        >>> b = MatrixCompletionTask(n_rows=4, rank=1).sample(2, generator=torch.Generator().manual_seed(0))
        >>> solve_nuclear_norm_cvxpy(b.values, b.observed, 4, 4).status
        ('optimal', 'optimal')
    """
    import cvxpy as cp
    import numpy as np

    from tfmatcomp._progress import check_progress, tracked

    check_problem(values, observed, n_rows, n_cols, lam)
    check_progress(progress)
    installed = cp.installed_solvers()
    if solver not in installed:
        raise ValueError(f"solver: {solver!r} is not an installed cvxpy solver; installed: {installed}")
    ok_status = _CVXPY_OK + (("optimal_inaccurate",) if accept_inaccurate else ())
    A_all = values.detach().to("cpu", torch.float64).reshape(-1, n_rows, n_cols).numpy()
    M_all = observed.detach().to("cpu").reshape(-1, n_rows, n_cols).numpy().astype(np.float64)
    B = A_all.shape[0]
    out = np.full((B, n_rows, n_cols), np.nan)
    status: list[str] = []
    cached = _cvxpy_problem(n_rows, n_cols, lam is not None) if reuse else None
    for i in tracked(range(B), "cvxpy nuclear norm", progress, unit="matrix"):
        A, M = A_all[i] * M_all[i], M_all[i]
        try:
            if cached is not None:
                prob, X, params = cached
                if lam is None:
                    params[0].value, params[1].value = M, A
                else:
                    w = math.sqrt(1.0 / max(M.sum(), 1.0))
                    params[0].value, params[1].value, params[2].value = w * M, w * A, float(lam)
            else:
                prob, X = _cvxpy_fresh_problem(A, M, lam)
            with warnings.catch_warnings():   # "inaccurate" warnings: reported via status
                warnings.simplefilter("ignore", UserWarning)
                prob.solve(solver=solver, **solver_options)
            st = str(prob.status)
            if st in ok_status and X.value is not None:
                out[i] = X.value
            status.append(st)
        except (cp.error.SolverError, ValueError, ArithmeticError) as exc:  # report, do not raise
            status.append(f"solver_error: {type(exc).__name__}: {exc}".splitlines()[0][:200])
    converged = torch.tensor([s in ok_status for s in status], dtype=torch.bool)
    mats = torch.from_numpy(out)
    return NuclearNormSolution(mats.to(values.device), converged.to(values.device), tuple(status),
                               lam, f"cvxpy:{solver}")
