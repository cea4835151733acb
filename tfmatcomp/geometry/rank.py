"""Low-rank measurements of the positional basis: ScreeNOT rank estimate, stable rank, relative norm.

ScreeNOT (Donoho, Gavish & Romanov, Ann. Statist. 2023) picks the hard threshold for singular values
that is MSE-optimal under an unknown noise spectrum, estimated from the observed singular values
themselves. Song & Zhong applies it to the ``T x d`` matrix of ``pos_t`` with ``k = 20`` and the
imputation strategy; :func:`screenot` follows the algorithm exactly (see ``docs/decomposition.md``),
except that the bisection tolerance is relative to the scale of the singular values, so the result
is invariant to transposition and scales linearly with the input.

Example:
    >>> import torch
    >>> y = torch.tensor([10, 9, 5, 4, 3, 2, 1, 0.5, 0.25, 0.1], dtype=torch.float64)
    >>> res = screenot_singular_values(y, gamma=1.0, k=2)
    >>> round(res.threshold, 5), res.rank
    (10.51849, 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp.validation import check_finite, check_in_range, shape_text

__all__ = [
    "ScreeNOTResult",
    "screenot",
    "screenot_singular_values",
    "pseudo_noise",
    "max_screenot_k",
    "stable_rank",
    "relative_norm",
]

Strategy = Literal["impute", "winsorize", "zero"]
_STRATEGIES = {"impute": "impute", "i": "impute", "winsorize": "winsorize", "w": "winsorize",
               "zero": "zero", "0": "zero"}


@dataclass(frozen=True)
class ScreeNOTResult:
    """Output of :func:`screenot`.

    Attributes:
        threshold: the optimal hard threshold for the singular values.
        rank: number of singular values strictly above it (the rank estimate).
        singular_values: the singular values, descending (float64, CPU).
        k: the upper bound on the signal rank that was used.
        gamma: the aspect ratio ``min(m/n, n/m)``.
        strategy: how the top ``k`` pseudo-noise values were replaced.
    """

    threshold: float
    rank: int
    singular_values: Float[Tensor, "m"]
    k: int
    gamma: float
    strategy: str


def max_screenot_k(m: int, strategy: Strategy = "impute") -> int:
    """Largest valid ``k`` for ``m`` singular values (imputation needs ``k < (m - 1) / 2``)."""
    strategy = _check_strategy(strategy)
    if strategy == "impute":
        return max((m - 2) // 2, 0)
    return max(m - 1, 0)


def _check_strategy(strategy: str) -> str:
    try:
        return _STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise ValueError(f"strategy: must be one of 'impute', 'winsorize', 'zero' (or 'i', 'w', "
                         f"'0'), got {strategy!r}") from None


def pseudo_noise(
    singular_values: Float[Tensor, "m"] | np.ndarray,
    k: int = 20,
    strategy: Strategy = "impute",
) -> np.ndarray:
    """ScreeNOT's pseudo-noise: the singular values in ascending order with the top ``k`` replaced.

    * ``"impute"``: with ``z`` ascending and ``diff = z[-k-1] - z[-2k-1]``, for ``l = 1..k``
      ``z[-l] = z[-k-1] + diff * (1 - ((l-1)/k)^(2/3)) / (2^(2/3) - 1)`` (requires
      ``k < (m - 1) / 2``);
    * ``"winsorize"``: ``z[-l] = z[-k-1]``;
    * ``"zero"``: ``z[-l] = 0``.

    Example:
        >>> z = pseudo_noise(torch.tensor([10, 9, 5, 4, 3, 2, 1, 0.5, 0.25, 0.1]), k=2)
        >>> [round(float(v), 8) for v in z[-2:][::-1]]
        [8.40482877, 6.25992105]
    """
    strategy = _check_strategy(strategy)
    z = np.sort(np.asarray(torch.as_tensor(singular_values).detach().cpu(), dtype=np.float64).ravel())
    m = z.size
    kmax = max_screenot_k(m, strategy)
    if kmax < 1:
        need = 4 if strategy == "impute" else 2
        raise ValueError(f"singular_values: ScreeNOT with strategy {strategy!r} needs at least "
                         f"{need} singular values (a matrix with min(m, n) >= {need}), got {m}")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= kmax:
        raise ValueError(f"k: must be an integer in [1, {kmax}] for {m} singular values with "
                         f"strategy {strategy!r}, got {k!r}")
    if strategy == "impute":
        base = z[-k - 1]
        diff = base - z[-2 * k - 1]
        for l in range(1, k + 1):
            z[-l] = base + diff * (1 - ((l - 1) / k) ** (2 / 3)) / (2 ** (2 / 3) - 1)
    elif strategy == "winsorize":
        z[-k:] = z[-k - 1]
    else:
        z[-k:] = 0.0
    return z


def _F(y: float, z: np.ndarray, gamma: float) -> float:
    """``y D'(y) / D(y)`` for the empirical D-transform of the pseudo-noise ``z``."""
    y2, z2 = y * y, z * z
    denom = y2 - z2
    phi = np.mean(y / denom)
    dphi = np.mean(-(y2 + z2) / denom ** 2)
    inner = gamma * phi + (1 - gamma) / y
    dinner = gamma * dphi - (1 - gamma) / y2
    D = phi * inner
    dD = dphi * inner + phi * dinner
    return y * dD / D


def screenot_singular_values(
    singular_values: Float[Tensor, "m"] | np.ndarray,
    gamma: float,
    k: int = 20,
    *,
    strategy: Strategy = "impute",
    rtol: float = 1e-10,
) -> ScreeNOTResult:
    """ScreeNOT from singular values and the aspect ratio ``gamma = min(m/n, n/m)`` in ``(0, 1]``.

    The threshold solves ``F(y) = y D'(y) / D(y) = -4`` for ``y > max(pseudo-noise)``, with the
    D-transform ``D(y) = Phi(y) (gamma Phi(y) + (1 - gamma) / y)``, ``Phi(y) = mean(y / (y^2 - z^2))``
    over the pseudo-noise ``z`` (:func:`pseudo_noise`). The root is bracketed by doubling and found
    by bisection until the bracket is narrower than ``rtol * max(z)``.

    Example:
        >>> import torch
        >>> y = torch.tensor([10, 9, 5, 4, 3, 2, 1, 0.5, 0.25, 0.1], dtype=torch.float64)
        >>> round(screenot_singular_values(3 * y, gamma=1.0, k=2).threshold / 3, 5)
        10.51849
    """
    check_in_range("gamma", gamma, 0.0, 1.0, closed=(False, True))
    check_in_range("rtol", rtol, 0.0, 1.0, closed=False)
    y = np.sort(np.asarray(torch.as_tensor(singular_values).detach().cpu(),
                           dtype=np.float64).ravel())[::-1].copy()
    if y.size == 0 or not np.all(np.isfinite(y)) or np.any(y < 0):
        raise ValueError("singular_values: must be a non-empty vector of finite, non-negative values")
    strategy_name = _check_strategy(strategy)
    z = pseudo_noise(y, k, strategy_name)
    zmax = float(z.max())
    sv = torch.from_numpy(y.copy())
    if zmax <= 0:
        return ScreeNOTResult(0.0, int((y > 0).sum()), sv, int(k), float(gamma), strategy_name)
    lo = zmax * (1 + 1e-12)
    while _F(lo, z, gamma) >= -4:  # F -> -inf as y -> max(z); move closer if not yet below -4
        lo = zmax + (lo - zmax) / 16
        if lo <= zmax:
            break
    hi = 2 * zmax
    while _F(hi, z, gamma) < -4:  # F -> -2 as y -> inf
        lo, hi = hi, 2 * hi
    tol = rtol * zmax
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if _F(mid, z, gamma) < -4:
            lo = mid
        else:
            hi = mid
    threshold = 0.5 * (lo + hi)
    return ScreeNOTResult(threshold, int((y > threshold).sum()), sv, int(k), float(gamma),
                          strategy_name)


def screenot(
    matrix: Float[Tensor, "m n"],
    k: int | None = None,
    *,
    strategy: Strategy = "impute",
    rtol: float = 1e-10,
) -> ScreeNOTResult:
    """ScreeNOT rank estimate of a matrix (e.g. ``pos`` ``[T, d]``).

    Args:
        matrix: a 2-D tensor; its singular values are computed in float64.
        k: upper bound on the signal rank; must satisfy ``k < (min(m, n) - 1) / 2`` for
            imputation (see :func:`max_screenot_k`). None (default): 20, as Song and Zhong use, or
            the largest valid ``k`` for a matrix too small for 20 (a 16-position model: 7).
        strategy: ``"impute"`` (default, the paper's), ``"winsorize"`` or ``"zero"``.
        rtol: bisection tolerance relative to the largest pseudo-noise value.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> signal = torch.randn(60, 3, generator=g) @ torch.randn(3, 50, generator=g)
        >>> screenot(signal + 0.1 * torch.randn(60, 50, generator=g), k=10).rank
        3
    """
    if not torch.is_tensor(matrix) or matrix.ndim != 2 or min(matrix.shape) < 1:
        raise ValueError(f"matrix: expected a non-empty 2-D tensor, got {shape_text(matrix)}")
    check_finite("matrix", matrix)
    m, n = matrix.shape
    need = 4 if _check_strategy(strategy) == "impute" else 2
    if min(m, n) < need:
        raise ValueError(f"matrix: ScreeNOT with strategy {strategy!r} needs min(m, n) >= {need}, "
                         f"got shape {(m, n)}")
    sv = torch.linalg.svdvals(matrix.detach().to(torch.float64))
    if k is None:
        k = min(20, max_screenot_k(min(m, n), strategy))
    return screenot_singular_values(sv, gamma=min(m / n, n / m), k=k, strategy=strategy, rtol=rtol)


def stable_rank(matrix: Float[Tensor, "m n"]) -> float:
    """``||P||_F^2 / ||P||_op^2`` (Rudelson & Vershynin), in ``[1, rank]``.

    Example:
        >>> stable_rank(torch.eye(5))
        5.0
    """
    if not torch.is_tensor(matrix) or matrix.ndim != 2:
        raise ValueError(f"matrix: expected a 2-D tensor, got {shape_text(matrix)}")
    check_finite("matrix", matrix)
    sv = torch.linalg.svdvals(matrix.detach().to(torch.float64))
    if sv.numel() == 0 or float(sv[0]) == 0:
        return float("nan")
    return float((sv ** 2).sum() / sv[0] ** 2)


def relative_norm(
    pos: Float[Tensor, "pos d"],
    activations: Float[Tensor, "... d"] | None = None,
    *,
    gram: Float[Tensor, "d d"] | None = None,
    n_rows: int | None = None,
    centered: bool = True,
) -> float:
    """Size of the positional basis relative to the embeddings: ``(||P||_op/sqrt(T)) / (||M||_op/sqrt(N))``.

    ``P`` is ``pos`` (``T`` rows), ``M`` the ``N`` activation rows ``h[c, t]`` (centered by their
    mean when ``centered=True``, the paper's definition; ``centered=False`` reproduces the branch of
    the reference code that forgot to center). Without padding ``N = C T`` and this equals the
    reference's ``||P repeated C times||_op / ||M||_op = sqrt(C) ||P||_op / ||M||_op``, which lies in
    ``[0, 1]`` because ``M`` splits into ``pos`` repeated over contexts plus ``cvec``, orthogonal to it.

    Args:
        pos: ``[T, d]``.
        activations: the activations ``[..., d]`` (flattened to rows; pass only valid entries).
        gram: instead of ``activations``, ``M^T M`` ``[d, d]`` (already centered or not, as
            ``centered`` says, e.g. :meth:`Decomposition.gram`), together with ``n_rows = N``.

    Example:
        >>> from tfmatcomp.decomposition import decompose
        >>> h = torch.randn(50, 8, 6, generator=torch.Generator().manual_seed(0))
        >>> h = h + 3 * torch.randn(8, 6, generator=torch.Generator().manual_seed(1))  # strong pos
        >>> dec = decompose(h)
        >>> r = relative_norm(dec.pos, h)
        >>> 0.8 < r <= 1, abs(r - relative_norm(dec.pos, gram=dec.gram(), n_rows=dec.n_tokens)) < 1e-12
        (True, True)
    """
    if not torch.is_tensor(pos) or pos.ndim != 2:
        raise ValueError("pos: expected a 2-D tensor [T, d]")
    if (activations is None) == (gram is None):
        raise ValueError("activations / gram: give exactly one of them")
    T, d = pos.shape
    p_op = float(torch.linalg.matrix_norm(pos.detach().to(torch.float64), ord=2))
    if activations is not None:
        if activations.shape[-1] != d:
            raise ValueError(f"activations: last axis {activations.shape[-1]} != pos's d {d}")
        M = activations.detach().reshape(-1, d).to(torch.float64)
        if centered:
            M = M - M.mean(0)
        N = M.shape[0]
        m_op = float(torch.linalg.matrix_norm(M, ord=2))
    else:
        if gram.shape != (d, d):
            raise ValueError(f"gram: expected shape {(d, d)}, got {tuple(gram.shape)}")
        if not isinstance(n_rows, int) or n_rows < 1:
            raise ValueError(f"n_rows: the number of rows of M (a positive integer) is needed with "
                             f"gram, got {n_rows!r}")
        N = n_rows
        eig = torch.linalg.eigvalsh(gram.detach().to(torch.float64))
        m_op = math.sqrt(max(float(eig[-1]), 0.0))
    if m_op == 0:
        return float("nan")
    return (p_op / math.sqrt(T)) / (m_op / math.sqrt(N))
