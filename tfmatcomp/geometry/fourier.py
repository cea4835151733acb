"""Fourier view of the positional Gram matrix: 2-D orthonormal DCT-II and low-frequency energy.

Song & Zhong (Section 2.2, Fig. 3 right) applies the 2-D discrete cosine transform to the normalized
Gram matrix ``P_bar^T P_bar`` of the positional basis and finds the energy in low frequencies: the
signature of a smooth Gram matrix, hence of a low-dimensional, curving positional basis.

Example:
    >>> import math, torch
    >>> t = torch.arange(32, dtype=torch.float64)
    >>> pos = torch.stack([torch.cos(math.pi * (t + 0.5) / 32), torch.sin(math.pi * (t + 0.5) / 32)], 1)
    >>> low_frequency_energy(gram_dct(pos), 4) > 0.95
    True
"""

from __future__ import annotations

import numpy as np
import scipy.fft
import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp.geometry.similarity import cosine_matrix
from tfmatcomp.validation import check_int_in_range

__all__ = ["gram_dct", "low_frequency_energy"]


def gram_dct(pos: Float[Tensor, "pos d"], *, normalize: bool = True) -> Float[Tensor, "pos pos"]:
    """2-D orthonormal DCT-II of the Gram matrix of ``pos`` (``scipy.fft.dctn(type=2, norm="ortho")``).

    Args:
        pos: positional basis ``[T, d]``.
        normalize: use the normalized Gram matrix (cosines, the paper's choice) rather than
            ``P^T P``.

    Returns:
        coefficients ``[T, T]`` (float64, on ``pos``'s device); entry ``(i, j)`` is the frequency
        pair ``(i, j)``, ``(0, 0)`` the constant component. The transform is orthonormal, so the
        squared coefficients sum to the squared Frobenius norm of the Gram matrix.

    Example:
        >>> import torch
        >>> gram_dct(torch.randn(6, 3, generator=torch.Generator().manual_seed(0))).shape
        torch.Size([6, 6])
    """
    if not torch.is_tensor(pos) or pos.ndim != 2:
        raise ValueError("pos: expected a 2-D tensor [T, d]")
    p = pos.detach().to(torch.float64)
    gram = cosine_matrix(p, p) if normalize else p @ p.T
    coeffs = scipy.fft.dctn(gram.cpu().numpy(), type=2, norm="ortho")
    return torch.from_numpy(np.ascontiguousarray(coeffs)).to(pos.device)


def low_frequency_energy(coefficients: Float[Tensor, "n n"], k: int, *, include_dc: bool = True) -> float:
    """Fraction of the energy (sum of squared coefficients) in the lowest ``k x k`` frequencies.

    With ``include_dc=False`` the constant ``(0, 0)`` coefficient is left out of both numerator and
    denominator (the paper notes it is often uninformative).

    Example:
        >>> import torch
        >>> low_frequency_energy(torch.eye(4), 2)
        0.5
    """
    if not torch.is_tensor(coefficients) or coefficients.ndim != 2:
        raise ValueError("coefficients: expected a 2-D tensor")
    n = min(coefficients.shape)
    check_int_in_range("k", k, 1, n)
    e = coefficients.detach().to(torch.float64) ** 2
    if not include_dc:
        e = e.clone()
        e[0, 0] = 0
    total = float(e.sum())
    return float(e[:k, :k].sum()) / total if total > 0 else float("nan")
