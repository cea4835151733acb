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
  unique). Each step is one batched SVD, a Hessian built from it and a batched Cholesky solve, with
  a backtracking line search; ``mu`` shrinks geometrically to ``tol * scale`` and a last
  first-order extrapolation to ``mu = 0`` removes the ``O(mu)`` smoothing bias. See
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
def _spectral(U: Tensor, S: Tensor, V: Tensor, mu: Tensor):
    """Gradient, its mu-derivative and Hessian coefficients of the barrier-smoothed nuclear norm.

    ``f_mu(X) = sum_i h(s_i)`` with ``h(s) = r - mu log(mu + r)``, ``r = sqrt(s^2 + mu^2)``: the
    partial minimum over ``P, Q`` of ``tr(P + Q) / 2 - mu log det [[P, X], [X^T, Q]]``, i.e. the
    SDP's log-det barrier. So ``argmin f_mu`` is the central path of the standard SDP formulation
    of ``||X||_*`` (the one cvxpy hands to interior-point solvers) and its limit as ``mu -> 0`` is
    the same optimal point, also when the optimum is not unique. ``h'(s) = s / (mu + r)``.

    In the SVD basis ``T = U^T dX V`` the Hessian's quadratic form is
    ``sum_ij c1_ij T_ij^2 + c2_ij T_ij T_ji`` with, for ``i != j``, ``c1 +- c2`` equal to the divided
    differences ``(h'(s_i) -+ h'(s_j)) / (s_i -+ s_j)``, and ``c1_ii = h''(s_i)``, ``c2_ii = 0``.
    """
    n = S.shape[-1]
    mu_ = mu[:, None]
    r = torch.sqrt(S * S + mu_ * mu_)
    mr = mu_ + r
    d1 = S / mr                                             # h'(s)
    G = (U * d1[:, None, :]) @ V.mT                         # grad f_mu
    Gmu = (U * (-S / (r * mr))[:, None, :]) @ V.mT          # d grad / d mu
    a, b = S[:, :, None], S[:, None, :]
    ra, rb = r[:, :, None], r[:, None, :]
    m3 = mu_[:, :, None]
    ssum = a + b
    pos = ssum > 0
    tiny = torch.finfo(S.dtype).tiny
    # (a + b) / (a rb + b ra), -> 1 / mu when a = b = 0; makes the divided difference cancellation-free
    rho = torch.where(pos, ssum / (a * rb + b * ra).clamp_min(tiny), 1 / m3)
    alpha = (m3 + m3 * m3 * rho) / ((m3 + ra) * (m3 + rb))                 # (h'(a) - h'(b)) / (a - b)
    beta = torch.where(pos, (d1[:, :, None] + d1[:, None, :]) / ssum.clamp_min(tiny), 1 / (2 * m3))
    eye = torch.eye(n, dtype=torch.bool, device=S.device)
    c1 = torch.where(eye, torch.diag_embed(mu_ / (r * mr)), (alpha + beta) / 2)
    c2 = torch.where(eye, torch.zeros_like(c1), (alpha - beta) / 2)
    return G, Gmu, c1, c2


def _smoothed(S: Tensor, mu: Tensor) -> Tensor:
    """``sum_i h(s_i)`` (up to a constant in ``mu``); the plain nuclear norm at ``mu = 0``."""
    mu_ = mu[:, None]
    r = torch.sqrt(S * S + mu_ * mu_)
    pos = mu_ > 0
    return (r - torch.where(pos, mu_ * torch.log(torch.where(pos, mu_ + r, torch.ones_like(r))),
                            torch.zeros_like(r))).sum(1)


class _Problem:
    """Variables, data term and bookkeeping of one batched (padded-square) problem."""

    def __init__(self, values, observed, n_rows, n_cols, lam, dtype):
        B = values.shape[0]
        N = max(n_rows, n_cols)
        dev = values.device
        self.B, self.N, self.n_rows, self.n_cols = B, N, n_rows, n_cols
        A = torch.zeros(B, N, N, dtype=dtype, device=dev)
        obs = torch.zeros(B, N, N, dtype=torch.bool, device=dev)
        vals = torch.where(observed, values.to(dtype), torch.zeros((), dtype=dtype, device=dev))
        A[:, :n_rows, :n_cols] = vals.reshape(B, n_rows, n_cols)
        obs[:, :n_rows, :n_cols] = observed.reshape(B, n_rows, n_cols)
        real = torch.zeros(N, N, dtype=torch.bool, device=dev)
        real[:n_rows, :n_cols] = True
        real = real.expand(B, N, N)
        n_obs = observed.sum(1)
        if lam is None:   # constrained: the missing entries are free, the observed ones fixed
            free = real & ~obs
            w = torch.zeros(B, dtype=dtype, device=dev)
            self.lam = torch.ones(B, dtype=dtype, device=dev)
        else:             # regularized: every real entry is free; data term on the observed ones
            free = real
            w = torch.where(n_obs > 0, 1 / n_obs.clamp_min(1).to(dtype), torch.zeros((), dtype=dtype, device=dev))
            self.lam = torch.full((B,), float(lam), dtype=dtype, device=dev)
        free = free.reshape(B, N * N)
        self.m = int(free.sum(1).max()) if B else 0
        # free positions first (stable), padded with fixed ones that are masked out by vm
        order = torch.argsort((~free).to(torch.int8), dim=1, stable=True)[:, : self.m]
        self.order = order
        self.vm = torch.gather(free, 1, order).to(dtype)
        self.rows, self.cols = order // N, order % N
        obs_v = torch.gather(obs.reshape(B, -1), 1, order).to(dtype) * self.vm
        self.wv = w[:, None] * obs_v                            # data weight per variable
        self.av = torch.gather(A.reshape(B, -1), 1, order)      # data target per variable
        self.A = A
        rms = torch.sqrt((vals * vals).sum(1) / n_obs.clamp_min(1).to(dtype))
        self.scale = torch.where(rms > 0, rms, torch.ones_like(rms))

    def variables(self, X: Tensor) -> Tensor:
        return torch.gather(X.reshape(X.shape[0], -1), 1, self.order[: X.shape[0]])

    def objective(self, X: Tensor, S: Tensor, mu: Tensor, idx: Tensor | None = None) -> Tensor:
        sl = slice(None) if idx is None else idx
        xv = torch.gather(X.reshape(X.shape[0], -1), 1, self.order[sl])
        data = (self.wv[sl] * (xv - self.av[sl]) ** 2).sum(1)
        return data + self.lam[sl] * _smoothed(S, mu)

    def newton_system(self, U, S, V, mu):
        B, N, m = U.shape[0], self.N, self.m
        G, Gmu, c1, c2 = _spectral(U, S, V, mu)
        Ur = torch.gather(U, 1, self.rows[:, :, None].expand(-1, -1, N))   # U[row_k, :]
        Vr = torch.gather(V, 1, self.cols[:, :, None].expand(-1, -1, N))   # V[col_k, :]
        T = (Ur[:, :, :, None] * Vr[:, :, None, :]).reshape(B, m, N * N)   # U^T E_k V
        Tt = (Vr[:, :, :, None] * Ur[:, :, None, :]).reshape(B, m, N * N)  # its transpose
        H = T @ (T * c1.reshape(B, 1, -1) + Tt * c2.reshape(B, 1, -1)).mT
        lam = self.lam[:, None]
        vm = self.vm
        H = lam[:, :, None] * H * vm[:, :, None] * vm[:, None, :]
        H = H + torch.diag_embed(2 * self.wv + (1 - vm))
        g = lam * torch.gather(G.reshape(B, -1), 1, self.order) * vm
        g_mu = lam * torch.gather(Gmu.reshape(B, -1), 1, self.order) * vm
        return H, g, g_mu


def _cholesky_solve(H: Tensor, rhs: Tensor) -> Tensor:
    """Solve ``H x = rhs`` for SPD ``H`` (batched), adding a tiny ridge where Cholesky fails."""
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
    x = torch.cholesky_solve(rhs[:, :, None], L)[:, :, 0]
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


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
    buckets: int | None = None,
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
        buckets: split the batch into this many groups of similar numbers of free entries, solved
            one after the other (smaller padded systems). Default: ``min(4, batch // 256)``.

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
    if buckets is not None and (not isinstance(buckets, int) or buckets < 1):
        raise ValueError(f"buckets: must be a positive integer or None, got {buckets!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype: must be a floating dtype, got {dtype}")

    B = values.shape[0]
    n_buckets = min(4, B // 256) if buckets is None else buckets
    if n_buckets > 1:
        # group matrices with similar numbers of free entries: smaller padded Newton systems
        order = torch.argsort((~observed).sum(1), stable=True)
        parts = [solve_nuclear_norm_torch(values[ix], observed[ix], n_rows, n_cols, lam, tol=tol,
                                          max_iter=max_iter, shrink=shrink, dtype=dtype, buckets=1)
                 for ix in order.chunk(n_buckets)]
        inv = torch.argsort(order)
        mats = torch.cat([p.matrices for p in parts])[inv]
        conv = torch.cat([p.converged for p in parts])[inv]
        status = sum((p.status for p in parts), ())
        status = tuple(status[i] for i in inv.tolist())
        return NuclearNormSolution(mats, conv, status, lam, "torch", max(p.n_iter or 0 for p in parts),
                                   info={"tol": tol, "shrink": shrink, "buckets": n_buckets})

    prob = _Problem(values, observed, n_rows, n_cols, lam, dtype)
    B, N = prob.B, prob.N
    X = prob.A.clone()
    method = "torch"
    if B == 0 or prob.m == 0:   # nothing to complete
        mats = X[:, :n_rows, :n_cols]
        return NuclearNormSolution(mats, torch.ones(B, dtype=torch.bool, device=X.device),
                                   ("optimal",) * B, lam, method, 0)

    mu = prob.scale.clone()
    mu_min = tol * prob.scale
    U, S, Vh = torch.linalg.svd(X)
    V = Vh.mT
    done = torch.zeros(B, dtype=torch.bool, device=X.device)
    last_full = torch.ones_like(done)
    it = 0
    for it in range(1, max_iter + 1):
        H, g, g_mu = prob.newton_system(U, S, V, mu)
        xv = prob.variables(X)
        g = g + 2 * prob.wv * (xv - prob.av)
        target = torch.where(last_full, torch.maximum(mu * shrink, mu_min), mu)
        # Newton step towards the minimizer at ``target`` (predictor-corrector in one solve)
        rhs = -(g + (target - mu)[:, None] * g_mu)
        dz = _cholesky_solve(H, rhs) * prob.vm
        dz = torch.where(done[:, None], torch.zeros_like(dz), dz)
        decrement = (rhs * dz).sum(1)
        f0 = prob.objective(X, S, target)
        step = torch.ones(B, dtype=dtype, device=X.device)
        full = torch.zeros_like(done)
        pending = ~done
        Xn, Un, Sn, Vn = X.clone(), U.clone(), S.clone(), V.clone()
        late = torch.zeros_like(done)   # accepted after backtracking: SVD still to be done
        for ls in range(40):   # backtracking (Armijo) on the smoothed objective at ``target``
            idx = pending.nonzero()[:, 0]
            if idx.numel() == 0:
                break
            Xt = X[idx].reshape(len(idx), -1).scatter_add(
                1, prob.order[idx], step[idx, None] * dz[idx]).reshape(-1, N, N)
            if ls == 0:   # the full step: its SVD is the next iteration's when accepted
                Ut, St, Vht = torch.linalg.svd(Xt)
            else:
                St = torch.linalg.svdvals(Xt)
            ft = prob.objective(Xt, St, target[idx], idx)
            ok = ft <= f0[idx] - 0.1 * step[idx] * decrement[idx] + 1e-12 * f0[idx].abs()
            acc = idx[ok]
            Xn[acc] = Xt[ok]
            if ls == 0:
                full[idx] = ok
                Un[acc], Sn[acc], Vn[acc] = Ut[ok], St[ok], Vht[ok].mT
            else:
                late[acc] = True
            pending[acc] = False
            step = torch.where(pending, step * 0.5, step)
        if late.any():
            Ul, Sl, Vhl = torch.linalg.svd(Xn[late])
            Un[late], Sn[late], Vn[late] = Ul, Sl, Vhl.mT
        X, U, S, V = Xn, Un, Sn, Vn
        done = done | (full & (mu <= mu_min) & (target <= mu_min))
        mu = torch.where(done, mu, target)
        last_full = full
        if bool(done.all()):
            break

    # first-order extrapolation along the smoothing path to mu = 0 (removes the O(mu) bias)
    H, g, g_mu = prob.newton_system(U, S, V, mu)
    g = g + 2 * prob.wv * (prob.variables(X) - prob.av)
    dz = _cholesky_solve(H, -(g - mu[:, None] * g_mu)) * prob.vm
    Xe = X.reshape(B, -1).scatter_add(1, prob.order, dz).reshape(B, N, N)
    zero = torch.zeros_like(mu)
    f_now = prob.objective(X, torch.linalg.svdvals(X), zero)
    f_ext = prob.objective(Xe, torch.linalg.svdvals(Xe), zero)
    take = done & torch.isfinite(f_ext) & (f_ext <= f_now + 1e-12 * f_now.abs())
    X = torch.where(take[:, None, None], Xe, X)

    mats = X[:, :n_rows, :n_cols]
    status = tuple("optimal" if d else "max_iter" for d in done.tolist())
    return NuclearNormSolution(mats, done, status, lam, method, it,
                               info={"tol": tol, "shrink": shrink, "extrapolated": int(take.sum())})


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
