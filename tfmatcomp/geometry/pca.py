"""Principal component analysis, shared by the embedding and decomposition analyses.

Example:
    >>> import torch
    >>> from tfmatcomp.geometry import pca
    >>> pca(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.5], [0.0, -0.5]]), 1).components.tolist()
    [[1.0, 0.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp.validation import check_int_in_range

__all__ = ["PCAResult", "pca"]


@dataclass(frozen=True)
class PCAResult:
    """Principal components of a set of vectors (float64).

    Attributes:
        scores: ``[n, k]`` coordinates of the centred vectors on the components.
        components: ``[k, d]`` orthonormal principal directions.
        mean: ``[d]`` the centre.
        explained_variance_ratio: ``[k]`` share of the total variance of each component.
    """

    scores: Float[Tensor, "n k"]
    components: Float[Tensor, "k d"]
    mean: Float[Tensor, "d"]
    explained_variance_ratio: Float[Tensor, "k"]

    def project(self, vectors: Float[Tensor, "m d"]) -> Float[Tensor, "m k"]:
        """Coordinates of other vectors on these components (centred by this PCA's mean)."""
        return (vectors.to(self.components) - self.mean) @ self.components.T


def pca(vectors: Float[Tensor, "n d"], n_components: int = 2) -> PCAResult:
    """PCA by SVD of the centred vectors, in float64, signs fixed (largest loading positive).

    Example:
        >>> import torch
        >>> x = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.5], [0.0, -0.5]])
        >>> r = pca(x, 1)
        >>> r.components.tolist(), round(r.explained_variance_ratio.item(), 3)
        ([[1.0, 0.0]], 0.8)
    """
    if vectors.ndim != 2 or vectors.shape[0] < 2:
        raise ValueError(f"vectors: expected [n >= 2, d], got shape {tuple(vectors.shape)}")
    k_max = min(vectors.shape)
    check_int_in_range("n_components", n_components, 1, k_max)
    x = vectors.detach().to(torch.float64)
    mean = x.mean(0)
    xc = x - mean
    _, s, vh = torch.linalg.svd(xc, full_matrices=False)
    comps = vh[:n_components]
    idx = comps.abs().argmax(-1, keepdim=True)
    sign = torch.sign(comps.gather(-1, idx))
    comps = comps * torch.where(sign == 0, torch.ones_like(sign), sign)
    total = s.pow(2).sum()
    ratio = s[:n_components].pow(2) / total if total > 0 else torch.zeros(n_components, dtype=x.dtype)
    return PCAResult(scores=xc @ comps.T, components=comps, mean=mean, explained_variance_ratio=ratio)
