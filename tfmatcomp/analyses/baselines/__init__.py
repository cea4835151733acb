"""Nuclear-norm minimization: the classical baseline the papers compare BERT against.

Two problems, for each masked matrix ``A`` with observed set ``Omega`` (the workshop paper, Appendix A):

* constrained (Eq. 1): ``min ||X||_*  s.t.  X_ij = A_ij  for (i, j) in Omega``;
* regularized (Eq. 2): ``min (1/|Omega|) sum_{(i,j) in Omega} (X_ij - A_ij)^2 + lam ||X||_*``.

``A`` is the batch's rounded target matrix (``batch.values``), as in the papers' code. Two solvers
give the same answers:

* :func:`solve_nuclear_norm_cvxpy`: one cvxpy problem per matrix, solver named explicitly
  (``"CLARABEL"`` by default; ``"SCS"`` is what the papers' code ran), status checked per matrix.
  A failed matrix is reported in :attr:`NuclearNormSolution.status` and left as NaN; the batch goes on.
* :func:`solve_nuclear_norm_torch`: the whole batch at once on any device (float64 by default), by
  Newton path following on the barrier-smoothed nuclear norm ``sum_i h_mu(sigma_i)``,
  ``h_mu(s) = r - mu log(mu + r)``, ``r = sqrt(s^2 + mu^2)`` (the SDP central path that
  interior-point solvers follow, so the two land on the same point even when the optimum is not
  unique). Variables are the free entries only. Each iteration is one batched SVD, the Hessian on
  the free entries as one ``bmm`` of factors built from the SVD rows (``Z Z^T``), and a batched
  Cholesky solve giving both the corrector and the path tangent; ``mu`` shrinks by ``shrink`` after
  every full step down to ``tol * scale``, a last first-order extrapolation to ``mu = 0`` removes
  the ``O(mu)`` smoothing bias, and finished matrices leave the batch. Matrices are sorted by their
  number of free entries and their Newton systems solved in small, cache-sized chunks. See
  docs/baselines.md.

:func:`complete_nuclear_norm` dispatches on ``method`` and takes a :class:`~tfmatcomp.MatrixBatch`.
The papers' comparisons are :func:`compare_with_model` (model vs nuclear norm across ``p_mask``,
the workshop paper Fig. 5 / the NeurIPS paper Fig. 3) and :func:`lambda_table` (the workshop paper Appendix D).

The package, solvers apart from the comparisons:

* :mod:`~tfmatcomp.analyses.baselines.solution`: the inputs' checks and :class:`NuclearNormSolution`;
* :mod:`~tfmatcomp.analyses.baselines.smoothing`: the barrier-smoothed nuclear norm and its derivatives;
* :mod:`~tfmatcomp.analyses.baselines.solver`: the batched torch solver;
* :mod:`~tfmatcomp.analyses.baselines.cvxpy_path`: the cvxpy reference;
* :mod:`~tfmatcomp.analyses.baselines.complete`: :func:`complete_nuclear_norm` on a batch;
* :mod:`~tfmatcomp.analyses.baselines.compare`: the model-vs-baseline tables.

Example:
    >>> import torch
    >>> from tfmatcomp import MatrixCompletionTask
    >>> batch = MatrixCompletionTask(n_rows=5, rank=1, p_mask=0.2).sample(
    ...     4, generator=torch.Generator().manual_seed(0))
    >>> sol = complete_nuclear_norm(batch)                      # constrained, batched torch solver
    >>> sol.predictions.shape, bool(sol.converged.all())
    (torch.Size([4, 25]), True)
    >>> bool((sol.predictions[batch.observed] - batch.values[batch.observed]).abs().max() < 1e-6)
    True
"""


from tfmatcomp.analyses.baselines.compare import (
    PAPER_LAMBDA_TABLE,
    PAPER_LAMBDAS,
    PAPER_P_MASKS,
    compare_with_model,
    comparison_row,
    lambda_table,
    model_predictions,
)
from tfmatcomp.analyses.baselines.complete import Method, complete_nuclear_norm  # noqa: F401  (Method: the solver names)
from tfmatcomp.analyses.baselines.cvxpy_path import solve_nuclear_norm_cvxpy
from tfmatcomp.analyses.baselines.solution import NuclearNormSolution, batch_losses, nuclear_norm
from tfmatcomp.analyses.baselines.solver import solve_nuclear_norm_torch

__all__ = [
    "NuclearNormSolution", "nuclear_norm", "solve_nuclear_norm_torch", "solve_nuclear_norm_cvxpy",
    "complete_nuclear_norm", "batch_losses", "model_predictions", "compare_with_model", "lambda_table",
    "comparison_row", "PAPER_LAMBDA_TABLE", "PAPER_P_MASKS", "PAPER_LAMBDAS",
]
