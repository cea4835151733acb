"""Nuclear-norm minimization: the classical baseline the papers compare BERT against.

Two problems, for each masked matrix ``A`` with observed set ``Omega`` (seed 000, Appendix A):

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
seed 000 Fig. 5 / seed 002 Fig. 3) and :func:`lambda_table` (seed 000 Appendix D).

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

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.data import MatrixBatch, MatrixCompletionTask
from tfmatcomp.metrics import losses

__all__ = [
    "NuclearNormSolution", "nuclear_norm", "solve_nuclear_norm_torch", "solve_nuclear_norm_cvxpy",
    "complete_nuclear_norm", "batch_losses", "model_predictions", "compare_with_model", "lambda_table",
    "PAPER_LAMBDA_TABLE", "PAPER_P_MASKS", "PAPER_LAMBDAS",
]

Method = Literal["torch", "cvxpy"]

#: The regularized nuclear-norm results of seed 000, Appendix D (256 samples, 7x7, rank 2,
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


# --------------------------------------------------------------------------------- results
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
        ``batch`` (via :func:`tfmatcomp.metrics.losses`), plus ``n_failed``."""
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
    """:func:`tfmatcomp.metrics.losses` of ``predictions`` on the matrices where ``keep`` is True,
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


# ------------------------------------------------------------------------- argument checks
def _check_problem(values: Tensor, observed: Tensor, n_rows: int, n_cols: int,
                   lam: float | None) -> None:
    for name, v in (("n_rows", n_rows), ("n_cols", n_cols)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: must be a positive integer, got {v!r}")
    if not torch.is_tensor(values) or values.ndim != 2 or values.shape[1] != n_rows * n_cols:
        shape = tuple(values.shape) if torch.is_tensor(values) else type(values).__name__
        raise ValueError(f"values: expected shape [batch, {n_rows * n_cols}] for {n_rows}x{n_cols} "
                         f"matrices, got {shape}")
    if not torch.is_tensor(observed) or observed.dtype != torch.bool or observed.shape != values.shape:
        shape = tuple(observed.shape) if torch.is_tensor(observed) else type(observed).__name__
        raise ValueError(f"observed: expected a bool tensor of shape {tuple(values.shape)}, got {shape}")
    if not torch.isfinite(values[observed]).all():
        raise ValueError("values: observed entries must be finite")
    if lam is not None and not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam: must be a positive number (or None for the constrained problem), "
                         f"got {lam!r}")


# ---------------------------------------------------------------------- batched torch solver
def _barrier_coefficients(S: Tensor, mu: Tensor, mu_h: Tensor):
    """Derivatives of the barrier-smoothed nuclear norm at the singular values ``S [batch, n]``.

    ``f_mu(X) = sum_i h(s_i)`` with ``h(s) = r - mu log(mu + r)``, ``r = sqrt(s^2 + mu^2)``: the
    partial minimum over ``P, Q`` of ``tr(P + Q) / 2 - mu log det [[P, X], [X^T, Q]]``, i.e. the
    SDP's log-det barrier. So ``argmin f_mu`` is the central path of the standard SDP formulation
    of ``||X||_*`` (the one cvxpy hands to interior-point solvers) and its limit as ``mu -> 0`` is
    the same optimal point, also when the optimum is not unique.

    Returns, at ``mu``, ``h'(s) = s / (mu + r)`` and ``d h'(s) / d mu`` (``[batch, n]``: the
    gradient and its path derivative) and, at ``mu_h``, the divided differences
    ``alpha_ij = (h'(s_i) - h'(s_j)) / (s_i - s_j)`` and ``beta_ij = (h'(s_i) + h'(s_j)) / (s_i + s_j)``
    (``[batch, n, n]``, written without cancellation; ``alpha_ii = h''(s_i)``). In the SVD basis
    ``T = U^T dX V`` the Hessian's quadratic form is ``sum_i alpha_ii T_ii^2 + sum_{i<j}
    alpha_ij (T_ij + T_ji)^2 / 2 + beta_ij (T_ij - T_ji)^2 / 2``.
    """
    S2 = S * S
    mu_ = mu[:, None]
    r = torch.sqrt(S2 + mu_ * mu_)
    d1 = S / (mu_ + r)
    d1_mu = -d1 / r
    mu_ = mu_h[:, None]
    r = torch.sqrt(S2 + mu_ * mu_)
    h1 = S / (mu_ + r)
    a, b = S[:, :, None], S[:, None, :]
    ra, rb = r[:, :, None], r[:, None, :]
    m3 = mu_[:, :, None]
    ssum = a + b
    pos = ssum > 0
    tiny = torch.finfo(S.dtype).tiny
    # (a + b) / (a rb + b ra), -> 1 / mu when a = b = 0; makes the divided difference cancellation-free
    rho = torch.where(pos, ssum / (a * rb + b * ra).clamp_min(tiny), 1 / m3)
    alpha = (m3 + m3 * m3 * rho) / ((m3 + ra) * (m3 + rb))
    beta = torch.where(pos, (h1[:, :, None] + h1[:, None, :]) / ssum.clamp_min(tiny), 0.5 / m3)
    return d1, d1_mu, alpha, beta


def _svd(X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``U, S, V`` of a batch of small matrices (``X = U diag(S) V^T``), ``U`` and ``V`` contiguous
    (rows of ``U`` and ``V`` are what :func:`_newton_directions` reads). On CPU this calls numpy's
    LAPACK (OpenBLAS), measured 5-20% faster than torch's for batches of 7x7 float64 matrices."""
    if X.device.type == "cpu" and X.dtype in (torch.float32, torch.float64) and not X.requires_grad:
        import numpy as np

        U, S, Vh = np.linalg.svd(X.numpy())
        return torch.from_numpy(U), torch.from_numpy(S), torch.from_numpy(Vh).mT.contiguous()
    U, S, Vh = torch.linalg.svd(X)
    return U.contiguous(), S, Vh.mT.contiguous()


def _smoothed(S: Tensor, mu: Tensor) -> Tensor:
    """``sum_i h(s_i)`` (up to a constant in ``mu``); the plain nuclear norm at ``mu = 0``."""
    mu_ = mu[:, None]
    r = torch.sqrt(S * S + mu_ * mu_)
    return (r - mu_ * torch.log((mu_ + r).clamp_min(torch.finfo(S.dtype).tiny))).sum(1)


def _cholesky_solve(H: Tensor, rhs: Tensor) -> Tensor:
    """Solve ``H x = rhs`` (``rhs [batch, m, k]``) for SPD ``H``, adding a tiny ridge where
    Cholesky fails."""
    L, info = torch.linalg.cholesky_ex(H)
    bad = info != 0
    if bad.any():
        diag = H.diagonal(dim1=-2, dim2=-1).abs().amax(-1).clamp_min(1e-300)
        eye = torch.eye(H.shape[-1], dtype=H.dtype, device=H.device)
        for ridge in (1e-12, 1e-9, 1e-6):
            Hb = H[bad] + ridge * diag[bad, None, None] * eye
            Lb, infob = torch.linalg.cholesky_ex(Hb)
            L[bad] = Lb
            still = bad.clone()
            still[bad] = infob != 0
            bad = still
            if not bad.any():
                break
    y = torch.linalg.solve_triangular(L, rhs, upper=False)
    return torch.linalg.solve_triangular(L.mT, y, upper=True)


class _PathState:
    """Row-aligned state of the matrices still on the path, sorted by number of free entries.

    Matrix ``b``'s free entries are ``flat[b, :n_free[b]]`` (index ``N * row + col`` into the
    padded-square matrix); the rest of its row is padding (``vm = 0``; it reads a zero row in
    :func:`_newton_directions`). :meth:`plan` cuts the batch into chunks whose Newton systems are
    solved together; :meth:`keep` drops finished matrices.
    """

    FIELDS = ("X", "U", "S", "V", "mu", "mu_min", "lam", "last_full", "final", "index", "n_free",
              "row", "col", "flat", "vm", "wv", "av")
    PER_VARIABLE = ("row", "col", "flat", "vm", "wv", "av")

    def __init__(self, budget: int, **fields: Tensor):
        for k in self.FIELDS:
            setattr(self, k, fields[k])
        self.budget = budget
        self.has_data = bool((self.wv != 0).any() or (self.lam != 1).any())   # else: Eq. 1
        self.plan()

    def keep(self, idx: Tensor) -> None:
        for k in self.FIELDS:
            setattr(self, k, getattr(self, k)[idx])
        m = int(self.n_free.max()) if self.n_free.numel() else 0
        if m < self.row.shape[1]:          # padded width follows the largest remaining problem
            for k in self.PER_VARIABLE:
                setattr(self, k, getattr(self, k)[:, :m].contiguous())
        self.plan()

    def plan(self) -> None:
        """Row indices into ``U`` / ``V`` (flattened to ``[batch * N, N]``, plus a zero row for
        padding) of every free entry, and chunks ``[c0, c1)`` with ``(c1 - c0) * n_free[c1 - 1] <=
        budget`` (at least one matrix each): padded systems of about ``budget`` variables, small
        enough to stay in cache."""
        Ba, N = self.X.shape[0], self.X.shape[-1]
        base = N * torch.arange(Ba, device=self.X.device)[:, None]
        pad = self.vm == 0
        self.ri = torch.where(pad, Ba * N, self.row + base).reshape(-1)
        self.ci = torch.where(pad, Ba * N, self.col + base).reshape(-1)
        n_free = self.n_free.tolist()
        self.chunks = []
        start = 0
        for i in range(1, len(n_free) + 1):
            if i == len(n_free) or (i + 1 - start) * max(n_free[i], 1) > self.budget:
                self.chunks.append((start, i, max(1, n_free[i - 1])))
                start = i
        self.h_diag = 2 * self.wv + (1 - self.vm)     # data term; 1 on padding (a decoupled 0)


def _newton_directions(st: _PathState, mu_h: Tensor):
    """``H^{-1} g`` and ``H^{-1} dg/dmu`` on the free entries of every matrix on the path.

    Objective ``sum_Omega w (x - a)^2 + lam f_mu(X)``; gradient ``g`` at ``st.mu``, Hessian ``H``
    at ``mu_h``. For the free entry ``k = (r, c)`` let ``T_k = u v^T`` (``u = U[r]``, ``v = V[c]``),
    the entry's direction in the SVD basis. The Hessian's quadratic form (see
    :func:`_barrier_coefficients`) is ``|C^{1/2} T|^2`` with ``C^{1/2} T = a * T + b * T^T``,
    ``a, b = (sqrt(alpha) +- sqrt(beta)) / 2`` (symmetric in ``i, j``; on the diagonal
    ``a + b = sqrt(h'')``). So with ``Z_k = vec(a * T_k + b * T_k^T)`` the Hessian on
    the free entries is ``lam Z Z^T``: per chunk an outer product, one fused multiply-add, a
    ``bmm`` and a batched Cholesky solve.

    Returns ``(sol [batch, m, 2], g [batch, m], g_mu [batch, m], x [batch, m])``: the two solves,
    the gradient and its ``mu``-derivative, the current free entries.
    """
    X = st.X
    Ba, N, m = X.shape[0], X.shape[-1], st.row.shape[1]
    d1, d1_mu, alpha, beta = _barrier_coefficients(st.S, st.mu, mu_h)
    lam = st.lam[:, None]
    sa, sb = torch.sqrt(alpha * lam[:, :, None]), torch.sqrt(beta * lam[:, :, None])
    a, b = (0.5 * (sa + sb))[:, None], (0.5 * (sa - sb))[:, None]        # a_ii + b_ii = sqrt(h'')
    x = torch.gather(X.reshape(Ba, -1), 1, st.flat)
    # rows U[r], V[c] of every free entry (zero rows for padding), and the gradient
    u = torch.cat((st.U.reshape(-1, N), X.new_zeros(1, N))).index_select(0, st.ri).view(Ba, m, N)
    v = torch.cat((st.V.reshape(-1, N), X.new_zeros(1, N))).index_select(0, st.ci).view(Ba, m, N)
    grads = (u * v) @ torch.stack((d1, d1_mu), 2)                    # u.v h'(s) and its mu-derivative
    if st.has_data:
        grads *= lam[:, :, None]
        grads[:, :, 0] += 2 * st.wv * (x - st.av)
    sol = X.new_zeros(Ba, m, 2)
    for c0, c1, mc in st.chunks:
        T = u[c0:c1, :mc, :, None] * v[c0:c1, :mc, None, :]           # [chunk, m, N, N]
        Z = torch.addcmul(T * a[c0:c1], T.transpose(2, 3), b[c0:c1]).view(c1 - c0, mc, N * N)
        H = Z @ Z.mT
        H.diagonal(dim1=1, dim2=2).add_(st.h_diag[c0:c1, :mc])
        sol[c0:c1, :mc] = _cholesky_solve(H, grads[c0:c1, :mc])
    return sol, grads[:, :, 0], grads[:, :, 1], x


def _objective(st: _PathState, x: Tensor, S: Tensor, mu: Tensor, idx: Tensor | None = None) -> Tensor:
    """``sum_Omega w (x - a)^2 + lam f_mu`` of the matrices ``idx`` (all if None)."""
    if not st.has_data:              # lam = 1 and no data term (the constrained problem)
        return _smoothed(S, mu)
    wv, av, lam = (st.wv, st.av, st.lam) if idx is None else (st.wv[idx], st.av[idx], st.lam[idx])
    return (wv * (x - av) ** 2).sum(1) + lam * _smoothed(S, mu)


def _follow_path(st: _PathState, out: Tensor, done: Tensor, *, shrink: float,
                 max_iter: int) -> tuple[int, int]:
    """Newton path following on ``mu`` for every matrix in ``st``; writes finished matrices into
    ``out`` and flags them in ``done``. Returns (iterations, matrices extrapolated to mu = 0).

    Each iteration, per matrix: aim at ``target`` (``shrink * mu`` after a full step, the same
    ``mu`` after a shortened one, 0 for the final extrapolation); step ``-H^{-1} (g + (target -
    mu) dg/dmu)`` (corrector and tangent predictor in one solve, Hessian at ``sqrt(mu * target)``),
    shortened to ``2 / lambda`` when its Newton decrement ``lambda`` (in the local norm of the
    self-concordant ``f_target / (lam target)``) exceeds 2; accept by Armijo on the objective at
    ``target``, else backtrack (:func:`_backtrack`). The SVD of the trial point is the next
    iteration's. After a full step at ``mu_min`` (a centering step there), the next step is the
    extrapolation to ``mu = 0`` (kept only where it lowers the true objective), after which the
    matrix retires.
    """
    N = st.X.shape[-1]
    it = extrapolated = 0
    for it in range(1, max_iter + 1):
        X, S, mu = st.X, st.S, st.mu
        Ba = X.shape[0]
        target = torch.where(st.last_full, torch.maximum(mu * shrink, st.mu_min), mu)
        target = torch.where(st.final, torch.zeros_like(mu), target)
        mu_h = torch.where(st.final, mu, torch.sqrt(mu * target))
        sol, g, g_mu, x = _newton_directions(st, mu_h)
        delta = (target - mu)[:, None]
        dz = torch.nan_to_num(-(sol[:, :, 0] + delta * sol[:, :, 1]) * st.vm, nan=0.0, posinf=0.0,
                              neginf=0.0)
        decrement = ((g + delta * g_mu) * -dz).sum(1)
        newton = torch.sqrt(decrement.clamp_min(0) / (st.lam * torch.where(st.final, mu, target)))
        short = ~st.final & (newton > 2)
        step = torch.where(short, 2 / newton, torch.ones_like(newton))
        dz = dz * step[:, None]
        decrement = decrement * step
        f0 = _objective(st, x, S, target)
        slack = 1e-12 * f0.abs()
        Xt = X.reshape(Ba, -1).scatter_add(1, st.flat, dz).view(Ba, N, N)
        Ut, St, Vt = _svd(Xt)
        ft = _objective(st, x + dz, St, target)
        # Armijo on the smoothed objective; the extrapolation only where it lowers ||X||_* + data
        ok = torch.where(st.final, ft <= f0 + slack, ft <= f0 - 0.1 * decrement + slack)
        ok &= torch.isfinite(ft)
        keep = ok[:, None, None]
        Xn, Un = torch.where(keep, Xt, X), torch.where(keep, Ut, st.U)
        Sn, Vn = torch.where(ok[:, None], St, S), torch.where(keep, Vt, st.V)
        bad = (~ok & ~st.final).nonzero()[:, 0]
        if bad.numel():
            _backtrack(st, bad, x, dz, target, f0, decrement, slack, Xn, Un, Sn, Vn)
        retire = st.final.clone()
        extrapolated += int((retire & ok).sum())
        full = ok & ~short
        st.final = full & ~st.final & (mu <= st.mu_min) & (target <= st.mu_min)
        st.X, st.U, st.S, st.V = Xn, Un, Sn, Vn
        st.mu = torch.where(retire, mu, target)
        st.last_full = full
        if bool(retire.any()):
            idx = retire.nonzero()[:, 0]
            out[st.index[idx]] = st.X[idx]
            done[st.index[idx]] = True
            st.keep((~retire).nonzero()[:, 0])
            if st.X.shape[0] == 0:
                break
    if st.X.shape[0]:
        out[st.index] = st.X
    return it, extrapolated


def _backtrack(st, bad, x, dz, target, f0, decrement, slack, Xn, Un, Sn, Vn) -> None:
    """Armijo backtracking (in place on ``Xn, Un, Sn, Vn``) for the matrices ``bad`` whose step
    failed: half the step first (with its SVD, which the next iteration reuses; enough ~85% of the
    time), then 1/4 ... 1/32 at once (singular values only). A matrix for which all fail stays
    where it is (its next step aims at the same mu)."""
    N = st.X.shape[-1]
    Xb, flat, db = st.X[bad], st.flat[bad], dz[bad]
    xh = x[bad] + 0.5 * db
    Xh = Xb.reshape(len(bad), -1).scatter_add(1, flat, 0.5 * db).view(-1, N, N)
    Uh, Sh, Vh = _svd(Xh)
    fh = _objective(st, xh, Sh, target[bad], bad)
    okh = fh <= f0[bad] - 0.05 * decrement[bad] + slack[bad]
    acc = bad[okh]
    Xn[acc], Un[acc], Sn[acc], Vn[acc] = Xh[okh], Uh[okh], Sh[okh], Vh[okh]
    rest = bad[~okh]
    if rest.numel():
        steps = 0.5 ** torch.arange(2, 6, dtype=x.dtype, device=x.device)       # 1/4 ... 1/32
        k, nr = steps.numel(), rest.numel()
        trial = steps[:, None, None] * dz[rest][None]                          # [k, nr, m]
        Xr = st.X[rest].reshape(1, nr, -1).expand(k, -1, -1).scatter_add(
            2, st.flat[rest][None].expand(k, -1, -1), trial).reshape(k * nr, N, N)
        fr = _objective(st, (x[rest][None] + trial).reshape(k * nr, -1),
                        torch.linalg.svdvals(Xr), target[rest].repeat(k), rest.repeat(k)).view(k, nr)
        okr = fr <= f0[rest][None] - 0.1 * steps[:, None] * decrement[rest][None] + slack[rest][None]
        found = okr.any(0)
        if bool(found.any()):
            first = torch.argmax(okr.to(torch.int8), 0)[found]
            Xa = Xr.view(k, nr, N, N)[first, found.nonzero()[:, 0]]
            Ua, Sa, Va = _svd(Xa)
            sel = rest[found]
            Xn[sel], Un[sel], Sn[sel], Vn[sel] = Xa, Ua, Sa, Va


def solve_nuclear_norm_torch(
    values: Float[Tensor, "batch pos"],
    observed: Bool[Tensor, "batch pos"],
    n_rows: int,
    n_cols: int,
    lam: float | None = None,
    *,
    tol: float = 1e-6,
    max_iter: int = 100,
    shrink: float = 0.3,
    dtype: torch.dtype = torch.float64,
    chunk_entries: int | None = None,
) -> NuclearNormSolution:
    """Solve the constrained (``lam=None``) or regularized nuclear-norm problem for a whole batch.

    Batched smoothing Newton path following (see the module docstring and docs/baselines.md). Runs
    on the device of ``values``; works in ``dtype`` (float64 by default).

    Args:
        values: targets ``[batch, n_rows * n_cols]`` (row-major; only observed entries are read).
        observed: True at observed entries.
        n_rows, n_cols: the matrix shape (rectangular matrices are padded to square with fixed
            zeros, which changes neither the nuclear norm nor the solution).
        lam: regularization weight of Eq. 2; None solves Eq. 1.
        tol: final smoothing ``mu`` relative to the RMS of the observed entries. The smoothing
            bias is ``O(mu)`` and the last extrapolation step removes its first-order part; with
            the default the objective is within about ``1e-6`` of an interior-point solver's.
        max_iter: Newton iterations; matrices not converged by then get status ``"max_iter"``.
        shrink: factor by which ``mu`` shrinks after each full Newton step, in ``(0, 1)``.
        dtype: working precision (float64 by default; float32 loses the small-mu Newton steps).
        chunk_entries: the batch, sorted by number of free entries, is cut into chunks whose
            Newton systems are built and solved together, each padded only to its own largest
            count, with ``matrices x padded free entries <= chunk_entries`` (at least one matrix).
            Default: 1024 on CPU (small systems that stay in cache), the whole batch elsewhere.

    Example:
        >>> import torch
        >>> from tfmatcomp import MatrixCompletionTask
        >>> b = MatrixCompletionTask(n_rows=6, rank=1, p_mask=0.3).sample(3, generator=torch.Generator().manual_seed(1))
        >>> sol = solve_nuclear_norm_torch(b.values, b.observed, 6, 6, lam=1e-3)
        >>> sol.status
        ('optimal', 'optimal', 'optimal')
    """
    _check_problem(values, observed, n_rows, n_cols, lam)
    for name, v, lo, hi in (("tol", tol, 0.0, 1.0), ("shrink", shrink, 0.0, 1.0)):
        if not (isinstance(v, (int, float)) and lo < v < hi):
            raise ValueError(f"{name}: must lie in ({lo}, {hi}), got {v!r}")
    if not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter: must be a positive integer, got {max_iter!r}")
    if chunk_entries is not None and (not isinstance(chunk_entries, int)
                                      or isinstance(chunk_entries, bool) or chunk_entries < 1):
        raise ValueError(f"chunk_entries: must be a positive integer or None, got {chunk_entries!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype: must be a floating dtype, got {dtype}")

    B, N, dev = values.shape[0], max(n_rows, n_cols), values.device
    zero = torch.zeros((), dtype=dtype, device=dev)
    vals = torch.where(observed, values.to(dtype), zero)
    A = torch.zeros(B, N, N, dtype=dtype, device=dev)
    A[:, :n_rows, :n_cols] = vals.reshape(B, n_rows, n_cols)
    obs = torch.zeros(B, N, N, dtype=torch.bool, device=dev)
    obs[:, :n_rows, :n_cols] = observed.reshape(B, n_rows, n_cols)
    obs = obs.reshape(B, N * N)
    real = torch.zeros(N, N, dtype=torch.bool, device=dev)
    real[:n_rows, :n_cols] = True
    real = real.reshape(1, N * N).expand(B, -1)
    n_obs = observed.sum(1)
    if lam is None:   # constrained: the missing entries are free, the observed ones fixed
        free = real & ~obs
        w = torch.zeros(B, dtype=dtype, device=dev)
        lam_b = torch.ones(B, dtype=dtype, device=dev)
    else:             # regularized: every real entry is free; data term on the observed ones
        free = real
        w = torch.where(n_obs > 0, 1 / n_obs.clamp_min(1).to(dtype), zero)
        lam_b = torch.full((B,), float(lam), dtype=dtype, device=dev)
    n_free = free.sum(1)
    rms = torch.sqrt((vals * vals).sum(1) / n_obs.clamp_min(1).to(dtype))
    scale = torch.where(rms > 0, rms, torch.ones_like(rms))

    out = A.clone()
    done = n_free == 0                      # nothing to complete: the data is the answer
    todo = (~done).nonzero()[:, 0]
    it = extrapolated = 0
    if todo.numel():
        todo = todo[torch.argsort(n_free[todo], stable=True)]
        m = int(n_free[todo].max())
        free_t = free[todo]
        order = torch.argsort((~free_t).to(torch.int8), dim=1, stable=True)[:, :m]   # free first
        vm = torch.gather(free_t, 1, order)
        X = A[todo].clone()
        U, S, V = _svd(X)
        if chunk_entries is None:
            chunk_entries = 1024 if dev.type == "cpu" else max(1, B * N * N)
        ones = torch.ones(len(todo), dtype=torch.bool, device=dev)
        st = _PathState(
            chunk_entries, X=X, U=U, S=S, V=V, mu=scale[todo].clone(), mu_min=tol * scale[todo],
            lam=lam_b[todo], last_full=ones, final=~ones, index=todo, n_free=n_free[todo],
            row=order // N, col=order % N, flat=order, vm=vm.to(dtype),
            wv=w[todo, None] * (torch.gather(obs[todo], 1, order) & vm).to(dtype),
            av=torch.gather(A[todo].reshape(len(todo), -1), 1, order))
        it, extrapolated = _follow_path(st, out, done, shrink=shrink, max_iter=max_iter)
    mats = out[:, :n_rows, :n_cols]
    status = tuple("optimal" if d else "max_iter" for d in done.tolist())
    return NuclearNormSolution(mats, done, status, lam, "torch", it,
                               info={"tol": tol, "shrink": shrink, "extrapolated": extrapolated})


# ----------------------------------------------------------------------------- cvxpy solver
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
    **solver_options: Any,
) -> NuclearNormSolution:
    """Solve each matrix's nuclear-norm problem with cvxpy, one matrix at a time.

    Args:
        values, observed, n_rows, n_cols, lam: as :func:`solve_nuclear_norm_torch`.
        solver: a cvxpy solver name that is installed (``"CLARABEL"``, ``"SCS"``, ...).
        reuse: compile one parametrized (DPP) problem and re-solve it for each matrix (faster);
            False builds a fresh problem per matrix, as the papers' code does.
        accept_inaccurate: count cvxpy's ``"optimal_inaccurate"`` as success.
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

    _check_problem(values, observed, n_rows, n_cols, lam)
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
    for i in range(B):
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


# ------------------------------------------------------------------------ batch entry point
def complete_nuclear_norm(
    batch: MatrixBatch,
    lam: float | None = None,
    *,
    method: Method = "torch",
    **options: Any,
) -> NuclearNormSolution:
    """Complete every matrix of ``batch`` by nuclear-norm minimization.

    Args:
        batch: the masked matrices; ``batch.values`` at ``batch.observed`` entries are the data.
        lam: None for the constrained problem (Eq. 1), else the weight of Eq. 2.
        method: ``"torch"`` (batched, :func:`solve_nuclear_norm_torch`) or ``"cvxpy"``
            (:func:`solve_nuclear_norm_cvxpy`).
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
                                        lam, **options)
    raise ValueError(f"method: must be 'torch' or 'cvxpy', got {method!r}")


# ------------------------------------------------------------------- the papers' comparisons
def _as_task(task) -> MatrixCompletionTask:
    if isinstance(task, MatrixCompletionTask):
        return task
    build = getattr(task, "build", None)
    if callable(build):
        return build()
    raise ValueError(f"task: expected a MatrixCompletionTask or a TaskConfig, got {type(task).__name__}")


@torch.no_grad()
def model_predictions(model, batch: MatrixBatch) -> Float[Tensor, "batch pos"]:
    """``model(batch.tokens)`` in eval mode on the model's device (the normal forward path), returned
    on the batch's device.

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


def _row(kind: str, preds: Tensor, batch: MatrixBatch, keep: Tensor | None, **extra) -> dict:
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
    task=None,
    n_samples: int = 256,
    seed: int = 0,
    lam: float | None = None,
    method: Method = "torch",
    **solver_options: Any,
) -> pd.DataFrame:
    """Model vs nuclear-norm minimization across ``p_mask`` (seed 000 Fig. 5, seed 002 Fig. 3).

    For each ``p_mask`` a fresh batch is drawn from ``task`` with that masking probability (one
    generator seeded with ``seed``, batches drawn in order), the model predicts via
    ``model(batch.tokens)``, and the same batch is completed by nuclear-norm minimization.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder` (or anything mapping tokens to ``[batch, pos]``).
        p_masks: masking probabilities (default: 0.1, 0.15, ..., 0.6 as in the papers' code).
        task: the matrix distribution (MatrixCompletionTask or TaskConfig); its ``p_mask`` is
            replaced. Default: 7x7 rank 2.
        n_samples: matrices per ``p_mask``.
        lam: None compares with Eq. 1 (the papers' figure), a number with Eq. 2.
        method: nuclear-norm solver (``"torch"`` or ``"cvxpy"``).

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
    base = _as_task(task) if task is not None else MatrixCompletionTask(n_rows=7, rank=2)
    if not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples: must be a positive integer, got {n_samples!r}")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for p in p_masks:
        t = MatrixCompletionTask(n_rows=base.n_rows, n_cols=base.n_cols, rank=base.rank,
                                 p_mask=float(p), distribution=base.distribution,
                                 tokenizer=base.tokenizer)
        batch = t.sample(n_samples, generator=gen)
        true_norm = float(nuclear_norm(batch.matrices.to(torch.float64)).mean())
        preds = model_predictions(model, batch)
        rows.append(_row("model", preds, batch, None, p_mask=float(p), true_nuclear_norm=true_norm))
        sol = complete_nuclear_norm(batch, lam, method=method, **solver_options)
        rows.append(_row("nuclear_norm", sol.predictions, batch, sol.converged, p_mask=float(p),
                         true_nuclear_norm=true_norm))
    cols = ["p_mask", "method", "L", "L_obs", "L_mask", "mean_abs_pred_mask", "n_failed",
            "nuclear_norm", "true_nuclear_norm", "n_samples"]
    return pd.DataFrame(rows)[cols]


def lambda_table(
    lams: Sequence[float] = PAPER_LAMBDAS,
    *,
    task=None,
    n_samples: int = 256,
    seed: int = 0,
    method: Method = "torch",
    model=None,
    include_constrained: bool = False,
    **solver_options: Any,
) -> pd.DataFrame:
    """The regularized nuclear-norm table of seed 000, Appendix D: ``L_obs, L_mask, L`` per lambda.

    All lambdas are solved on the same ``n_samples`` matrices from ``task`` (default 7x7, rank 2,
    p_mask 0.3), drawn with a generator seeded by ``seed``.

    Args:
        lams: regularization weights (default: the paper's 5e-4, 1e-3, 1.5e-3, 2e-3, 5e-3).
        model: optionally a trained model, evaluated on the same batch (a row with method "model").
        include_constrained: also add the constrained problem (a row with ``lam`` NaN).
        method, solver_options: the solver (see :func:`complete_nuclear_norm`).

    Returns:
        Columns ``method, lam, L_obs, L_mask, L, mean_abs_pred_mask, n_failed, nuclear_norm,
        paper_L_obs, paper_L_mask, paper_L`` (the paper's values where it has that lambda, else NaN).

    Example:
        >>> import tfmatcomp as tm
        >>> df = lambda_table([1e-3, 5e-3], task=tm.MatrixCompletionTask(4, rank=1), n_samples=4)
        >>> df["lam"].tolist()
        [0.001, 0.005]
    """
    base = _as_task(task) if task is not None else MatrixCompletionTask(n_rows=7, rank=2, p_mask=0.3)
    if not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples: must be a positive integer, got {n_samples!r}")
    batch = base.sample(n_samples, generator=torch.Generator().manual_seed(seed))
    rows = []
    nan = float("nan")
    todo: list[float | None] = [float(lam) for lam in lams] + ([None] if include_constrained else [])
    for lam in todo:
        sol = complete_nuclear_norm(batch, lam, method=method, **solver_options)
        row = _row("nuclear_norm", sol.predictions, batch, sol.converged, lam=nan if lam is None else lam)
        paper = PAPER_LAMBDA_TABLE.get(lam) if lam is not None else None
        row.update(zip(("paper_L_obs", "paper_L_mask", "paper_L"), paper or (nan, nan, nan)))
        rows.append(row)
    if model is not None:
        row = _row("model", model_predictions(model, batch), batch, None, lam=nan)
        row.update(paper_L_obs=nan, paper_L_mask=nan, paper_L=nan)
        rows.append(row)
    cols = ["method", "lam", "L_obs", "L_mask", "L", "mean_abs_pred_mask", "n_failed",
            "nuclear_norm", "paper_L_obs", "paper_L_mask", "paper_L", "n_samples"]
    return pd.DataFrame(rows)[cols]
