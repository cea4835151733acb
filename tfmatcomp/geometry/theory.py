"""Song & Zhong's two theorems, measured on a decomposition.

**Theorem 1 (smoothness -> low rank, Section 2.3).** With ``G = P P^T`` the ``T x T`` Gram matrix of
the positional basis (rows ``pos_t``), ``G~`` its ``2T x 2T`` reflection (eq. 4) and ``Delta^(m,m)``
the ``m``-th mixed finite difference with step ``1/T`` (eq. 5, periodic), there is ``B`` with
``(1/T) ||G - F B B^T F^T||_op <= 6 / (8k)^m * ||Delta^(m,m) G~||_max`` where ``F = F_{<=k}``
holds low-frequency vectors. The paper prints ``f_s[j] = cos((s - 1/2) j pi / T)``; we use the
DCT-II vectors ``f_s[j] = cos((s - 1) (j + 1/2) pi / T)`` (``s = 1`` is the constant), the basis
whose 2-D transform Fig. 3 shows and the one that matches eq. 4's even reflection at both ends (the
printed vectors are odd at ``j = T`` and leave a smooth circle with a slowly decaying error).
:func:`low_frequency_error` measures the left side with ``F B B^T F^T = Pi G Pi`` (``Pi`` the
projection on span ``F``: the Frobenius-best such ``B``, so an upper bound on the minimum) and
:func:`theorem1_table` puts it beside the bound for ``k = 1..K`` and ``m = 1..M``.

**Theorem 2 (incoherence -> kernel factorization, Section 4.3).** Split an attention input
``x = t + c`` into its positional part ``t = pos`` and ``c = cvec``, and ``W = W_Q W_K^T / sqrt(d_head)``
into four blocks ``W_ab = Pi_a W Pi_b`` with ``Pi_pos`` the projection on the top-``K`` right singular
vectors of ``P`` and ``Pi_ctx = I - Pi_pos`` (so the blocks sum to ``W``). The factorization
``log K_W(x^q, x^k) = c^q W_cc c^k + c^q W_cp t^k + t^q W_pc c^k + t^q W_pp t^k + error`` holds with
an error made of the twelve mismatched terms (e.g. ``c^q W_pp t^k``), each carrying a component
of ``c`` inside the positional subspace: small when the bases are incoherent.
:func:`kernel_factorization_error` measures it.

Example:
    >>> import torch
    >>> t = torch.arange(32, dtype=torch.float64)
    >>> pos = torch.stack([torch.cos(torch.pi * (t + 0.5) / 32), torch.sin(torch.pi * (t + 0.5) / 32)], 1)
    >>> low_frequency_error(pos, 1) > 0.4 > 0.02 > low_frequency_error(pos, 8)
    True
"""

from __future__ import annotations

import math

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp.validation import check_int_in_range, check_positive_int, shape_text

__all__ = ["extended_gram", "finite_difference", "smoothness", "low_frequency_basis",
           "low_frequency_error", "theorem1_table", "positional_projection",
           "kernel_factorization_error", "matched_inputs", "factorization_errors"]


def _pos(pos: Tensor) -> Tensor:
    if not torch.is_tensor(pos) or pos.ndim != 2 or pos.shape[0] < 2:
        raise ValueError(f"pos: expected a [T >= 2, d] tensor, got "
                         f"{shape_text(pos)}")
    return pos.detach().to(torch.float64)


def extended_gram(G: Float[Tensor, "T T"]) -> Float[Tensor, "2T 2T"]:
    """The reflected ``[[G, G(:, rev)], [G(rev, :), G(rev, rev)]]`` of eq. 4.

    Example:
        >>> extended_gram(torch.tensor([[1.0, 2.0], [3.0, 4.0]])).tolist()[0]
        [1.0, 2.0, 2.0, 1.0]
    """
    top = torch.cat([G, G.flip(1)], 1)
    return torch.cat([top, top.flip(0)], 0)


def finite_difference(G: Float[Tensor, "n n"], m: int = 1) -> Float[Tensor, "n n"]:
    """``Delta^(m,m)`` of eq. 5 with periodic extension and step ``1/T`` (``T = n / 2``).

    Example:
        >>> G = torch.ones(4, 4)
        >>> float(finite_difference(G, 2).abs().max())
        0.0
    """
    check_positive_int("m", m)
    T = G.shape[0] / 2
    out = G
    for _ in range(m):
        out = T ** 2 * (out - out.roll(1, 0) - out.roll(1, 1) + out.roll((1, 1), (0, 1)))
    return out


def smoothness(pos: Float[Tensor, "T d"], m: int = 1) -> float:
    """``||Delta^(m,m) G~||_max`` of the positional Gram matrix ``G = P P^T`` (Theorem 1)."""
    p = _pos(pos)
    return float(finite_difference(extended_gram(p @ p.T), m).abs().max())


def low_frequency_basis(T: int, k: int) -> Float[Tensor, "T k"]:
    """``F_{<=k}``: DCT-II columns ``f_s[j] = cos((s - 1) (j + 1/2) pi / T)``, ``j < T``, ``s = 1..k``.

    Example:
        >>> low_frequency_basis(4, 2).shape
        torch.Size([4, 2])
    """
    check_positive_int("T", T)
    check_int_in_range("k", k, 1, T)
    j = torch.arange(T, dtype=torch.float64)[:, None]
    s = torch.arange(1, k + 1, dtype=torch.float64)[None, :]
    return torch.cos((s - 1) * (j + 0.5) * math.pi / T)


def low_frequency_error(pos: Float[Tensor, "T d"], k: int) -> float:
    """``(1/T) ||G - Pi G Pi||_op`` with ``Pi`` the projection on the span of ``F_{<=k}``."""
    p = _pos(pos)
    T = p.shape[0]
    G = p @ p.T
    Q, _ = torch.linalg.qr(low_frequency_basis(T, k).to(p.device))
    Pi = Q @ Q.T
    return float(torch.linalg.matrix_norm(G - Pi @ G @ Pi, ord=2)) / T


def theorem1_table(pos: Float[Tensor, "T d"], ks=(1, 2, 4, 8, 16), ms=(1, 2, 3)) -> pd.DataFrame:
    """Measured low-frequency error and Theorem 1's bound ``6 / (8k)^m ||Delta^(m,m) G~||_max``.

    One row per ``k`` (those ``<= T``): ``error`` and ``bound_m{m}`` for each ``m``, and
    ``smoothness_m{m}`` (the max finite difference).

    Example:
        >>> import torch
        >>> df = theorem1_table(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), ks=(1, 4))
        >>> bool((df["error"] <= df[["bound_m1", "bound_m2", "bound_m3"]].min(axis=1)).all())
        True
    """
    p = _pos(pos)
    T = p.shape[0]
    smooth = {m: smoothness(p, m) for m in ms}
    rows = []
    for k in ks:
        if k > T:
            continue
        row = {"k": k, "error": low_frequency_error(p, k)}
        for m in ms:
            row[f"bound_m{m}"] = 6 / (8 * k) ** m * smooth[m]
            row[f"smoothness_m{m}"] = smooth[m]
        rows.append(row)
    return pd.DataFrame(rows)


def positional_projection(pos: Float[Tensor, "T d"], K: int) -> Float[Tensor, "d d"]:
    """Projection on the top-``K`` right singular vectors of ``P`` (the positional subspace)."""
    p = _pos(pos)
    check_int_in_range("K", K, 1, min(p.shape))
    _, _, vh = torch.linalg.svd(p, full_matrices=False)
    V = vh[:K].T
    return V @ V.T


def kernel_factorization_error(
    x_pos: Float[Tensor, "n d"],
    x_cvec: Float[Tensor, "n d"],
    W: Float[Tensor, "d d"] | tuple[Tensor, Tensor],
    projection: Float[Tensor, "d d"],
) -> dict[str, float]:
    """Theorem 2's factorization error over all query-key pairs of ``n`` vectors.

    ``W`` is the ``d x d`` bilinear form, or a pair ``(A, B)`` with ``W = A B^T`` (e.g.
    ``(W_Q / sqrt(d_head), W_K)``: ``d x d_head`` factors, far cheaper for a low-rank ``W_QK``).
    Returns ``{"error_mean", "error_max", "logit_mean", "relative"}``: mean / max ``|error|`` of
    ``log K_W`` over pairs, the mean ``|x^q W x^k|``, and their ratio.

    The four matched terms are ``u W u^T`` with ``u = c Pi_ctx + t Pi_pos`` (each part projected on
    its own subspace), so the error is ``x W x^T - u W u^T``.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> Pi = torch.diag(torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64))
        >>> t = torch.randn(5, 4, generator=g, dtype=torch.float64) @ Pi    # in the subspace
        >>> c = torch.randn(5, 4, generator=g, dtype=torch.float64) @ (torch.eye(4) - Pi)
        >>> kernel_factorization_error(t, c, torch.randn(4, 4, generator=g, dtype=torch.float64), Pi)["error_max"] < 1e-12
        True
    """
    x, u = matched_inputs(x_pos, x_cvec, projection)
    return factorization_errors(x, u, [W])[0]


def matched_inputs(x_pos: Float[Tensor, "n d"], x_cvec: Float[Tensor, "n d"],
                   projection: Float[Tensor, "d d"]) -> tuple[Float[Tensor, "n d"], Float[Tensor, "n d"]]:
    """Theorem 2's inputs, in float64: ``x = t + c`` and ``u = c Pi_ctx + t Pi_pos``, with
    ``t = x_pos``, ``c = x_cvec``, ``Pi_pos = projection`` and ``Pi_ctx = I - Pi_pos``.

    Computed once per layer and shared by every head (:func:`factorization_errors`).

    Example:
        >>> import torch
        >>> Pi = torch.diag(torch.tensor([1.0, 0.0]))
        >>> x, u = matched_inputs(torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0]]), Pi)
        >>> x.tolist(), u.tolist()
        ([[4.0, 6.0]], [[1.0, 4.0]])
    """
    f64 = torch.float64
    t, c, Pp = (v.detach().to(f64) for v in (x_pos, x_cvec, projection))
    return t + c, c + (t - c) @ Pp  # c (I - Pp) + t Pp


def factorization_errors(x: Float[Tensor, "n d"], u: Float[Tensor, "n d"],
                         forms: list[Tensor | tuple[Tensor, Tensor]]) -> list[dict[str, float]]:
    """:func:`kernel_factorization_error` for several forms ``W`` (e.g. every head of a layer) on
    the same inputs ``x = t + c`` and ``u = c Pi_ctx + t Pi_pos`` (from :func:`matched_inputs`).

    Each form is a ``d x d`` tensor or a pair ``(A, B)`` with ``W = A B^T``; one dict per form.

    Example:
        >>> import torch
        >>> x = torch.eye(2, dtype=torch.float64)
        >>> [e["error_max"] for e in factorization_errors(x, x, [torch.eye(2), (torch.eye(2), torch.eye(2))])]
        [0.0, 0.0]
    """
    out = []
    for W in forms:
        A, B = (W, None) if torch.is_tensor(W) else W
        A = A.detach().to(x)
        if B is None:
            full, matched = (x @ A) @ x.T, (u @ A) @ u.T
        else:
            B = B.detach().to(x)
            full, matched = (x @ A) @ (x @ B).T, (u @ A) @ (u @ B).T
        err = (full - matched).abs()
        logit = float(full.abs().mean())
        out.append({"error_mean": float(err.mean()), "error_max": float(err.max()),
                    "logit_mean": logit,
                    "relative": float(err.mean()) / logit if logit > 0 else float("nan")})
    return out
