"""The barrier-smoothed nuclear norm ``f_mu(X) = sum_i h_mu(sigma_i)`` that the batched solver
follows to ``mu = 0``: its value and the derivatives its Newton steps need.

``h_mu(s) = r - mu log(mu + r)`` with ``r = sqrt(s^2 + mu^2)``; at ``mu = 0`` the plain nuclear norm.

Example:
    >>> import torch
    >>> S, mu = torch.tensor([[3.0, 1.0]], dtype=torch.float64), torch.tensor([1e-9], dtype=torch.float64)
    >>> round(float(_smoothed(S, mu)), 6)
    4.0
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__: list[str] = []


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


def _smoothed(S: Tensor, mu: Tensor) -> Tensor:
    """``sum_i h(s_i)`` (up to a constant in ``mu``); the plain nuclear norm at ``mu = 0``."""
    mu_ = mu[:, None]
    r = torch.sqrt(S * S + mu_ * mu_)
    return (r - mu_ * torch.log((mu_ + r).clamp_min(torch.finfo(S.dtype).tiny))).sum(1)
