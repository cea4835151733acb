"""Cosine geometry of the two bases: incoherence, cluster similarity / compactness, normalized Gram.

Example:
    >>> import torch
    >>> pos = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    >>> ctx = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, -2.0]])
    >>> incoherence(pos, ctx).max
    0.0
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.validation import check_non_negative, check_positive_int, shape_text

__all__ = [
    "cosine_matrix",
    "Incoherence",
    "incoherence",
    "ClusterSimilarity",
    "cluster_similarity",
    "cluster_separation",
    "normalized_gram",
]


def _rows(x: Tensor, name: str) -> Tensor:
    if not torch.is_tensor(x) or x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D tensor [n, d], got {shape_text(x)}")
    return x.detach().to(torch.float64)


def _normalize(x: Tensor) -> Tensor:
    # Zero rows stay zero (cosine 0 with everything) instead of NaN.
    norm = x.norm(dim=-1, keepdim=True)
    return x / torch.where(norm > 0, norm, torch.ones_like(norm))


def cosine_matrix(a: Float[Tensor, "n d"], b: Float[Tensor, "m d"]) -> Float[Tensor, "n m"]:
    """Cosine similarities ``cos(a_i, b_j)`` (float64; a zero vector has cosine 0 with anything).

    Example:
        >>> cosine_matrix(torch.eye(2), torch.tensor([[1.0, 1.0]])).squeeze().tolist()
        [0.7071067811865475, 0.7071067811865475]
    """
    a, b = _rows(a, "a"), _rows(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a, b: feature sizes differ ({a.shape[1]} vs {b.shape[1]})")
    return _normalize(a) @ _normalize(b).T


@dataclass(frozen=True)
class Incoherence:
    """``max`` and ``mean`` over all pairs ``(t, c)`` of ``|cos(pos_t, ctx_c)|``."""

    max: float
    mean: float


def incoherence(pos: Float[Tensor, "pos d"], ctx: Float[Tensor, "ctx d"]) -> Incoherence:
    """Mutual incoherence of the positional and context bases (Song & Zhong Section 4).

    ``max_{t,c} |<pos_t/||pos_t||, ctx_c/||ctx_c||>|`` (the paper's definition) and the mean of the
    same quantity over all ``T C`` pairs.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> inc = incoherence(torch.randn(8, 512, generator=g), torch.randn(16, 512, generator=g))
        >>> inc.mean < inc.max < 0.25
        True
    """
    cos = cosine_matrix(pos, ctx).abs()
    return Incoherence(max=float(cos.max()), mean=float(cos.mean()))


@dataclass(frozen=True)
class ClusterSimilarity:
    """Mean ``|cos|`` between vectors of the same cluster (``intra``) and of different ones (``inter``)."""

    intra: float
    inter: float


def _labels(labels, n: int) -> Tensor:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(f"labels: expected one label per vector ({n}), got shape {tuple(labels.shape)}")
    return labels


def cluster_similarity(
    vectors: Float[Tensor, "n d"],
    labels: Int[Tensor, "n"],
    *,
    absolute: bool = True,
    n_components: int | None = None,
) -> ClusterSimilarity:
    """Intra- and inter-cluster mean similarity of (context) vectors given cluster labels.

    Averages ``|cos(x_i, x_j)|`` (or the signed cosine with ``absolute=False``) over pairs
    ``i != j`` with the same label (intra) and with different labels (inter). Self-pairs are excluded
    (the reference code included them, which biases ``intra`` upward). ``n_components`` first projects
    the vectors on their top principal directions (uncentered SVD, as the reference's option with 20).

    Example:
        >>> x = torch.tensor([[1.0, 0.1], [1.0, -0.1], [0.1, 1.0], [-0.1, 1.0]])
        >>> s = cluster_similarity(x, torch.tensor([0, 0, 1, 1]))
        >>> s.intra > 0.9 > 0.2 > s.inter
        True
    """
    x = _rows(vectors, "vectors")
    labels = _labels(labels, x.shape[0]).to(x.device)
    if check_positive_int("n_components", n_components, allow_none=True) is not None:
        u, s, _ = torch.linalg.svd(x, full_matrices=False)
        x = u[:, :n_components] * s[:n_components]
    cos = cosine_matrix(x, x)
    if absolute:
        cos = cos.abs()
    same = labels[:, None] == labels[None, :]
    off = ~torch.eye(x.shape[0], dtype=torch.bool, device=x.device)
    intra_mask, inter_mask = same & off, ~same
    intra = float(cos[intra_mask].mean()) if intra_mask.any() else float("nan")
    inter = float(cos[inter_mask].mean()) if inter_mask.any() else float("nan")
    return ClusterSimilarity(intra=intra, inter=inter)


def cluster_separation(
    vectors: Float[Tensor, "n d"],
    labels: Int[Tensor, "n"],
    *,
    ridge: float = 1e-3,
    n_components: int | None = None,
) -> float:
    """Cluster compactness ``Tr(Sigma_B Sigma_W^{-1})`` (bigger = better separated; Song & Zhong App. C).

    ``Sigma_W = (1/N) sum_k sum_{i in k} (x_i - m_k)(x_i - m_k)^T`` (within-cluster) and
    ``Sigma_B = (1/N) sum_k n_k (m_k - m)(m_k - m)^T`` (between-cluster), ``m_k`` the cluster means
    and ``m`` the overall mean. ``Sigma_W`` is regularized as ``Sigma_W + ridge * (tr(Sigma_W)/d) I``
    (a ridge relative to its average eigenvalue, always applied so the value is continuous in the
    data); with ``ridge=0`` a singular ``Sigma_W`` raises. When ``d`` is comparable to or larger than
    ``N`` (e.g. 32 contexts of a 768-d model) ``Sigma_W`` is singular and the value is dominated by
    the ridge: pass ``n_components`` to first project on the top principal directions of the centered
    data, and compare values only at equal ``(N, d, ridge, n_components)``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> labels = torch.arange(40) % 2
        >>> x = torch.randn(40, 3, generator=g) + 4 * labels[:, None]
        >>> cluster_separation(x, labels) > cluster_separation(x, torch.randperm(40, generator=g) % 2)
        True
    """
    x = _rows(vectors, "vectors")
    labels = _labels(labels, x.shape[0]).to(x.device)
    check_non_negative("ridge", ridge)
    x = x - x.mean(0)
    if check_positive_int("n_components", n_components, allow_none=True) is not None:
        # top principal directions from the d x d covariance (eigh), not an SVD of the N x d data
        _, vecs = torch.linalg.eigh(x.T @ x)
        x = x @ vecs.flip(1)[:, :n_components]
    N, d = x.shape
    _, inverse = torch.unique(labels, return_inverse=True)
    onehot = torch.nn.functional.one_hot(inverse).to(x.dtype)  # [N, k]
    sizes = onehot.sum(0)
    means = (onehot.T @ x) / sizes[:, None]  # [k, d] cluster means (overall mean is 0)
    sb = (means.T * sizes) @ means / N  # (1/N) sum_k n_k m_k m_k^T
    dev = x - means[inverse]
    sw = dev.T @ dev / N
    if ridge > 0:
        sw = sw + ridge * (torch.trace(sw) / d) * torch.eye(d, dtype=x.dtype, device=x.device)
    try:
        return float(torch.trace(torch.linalg.solve(sw, sb)))
    except RuntimeError as err:  # singular
        raise ValueError(f"vectors: the within-cluster covariance is singular; use ridge > 0 or "
                         f"n_components ({err})") from None


def normalized_gram(
    pos: Float[Tensor, "pos d"],
    ctx: Float[Tensor, "ctx d"] | None = None,
) -> Float[Tensor, "n n"]:
    """Normalized Gram matrix ``[P_bar, C_bar]^T [P_bar, C_bar]`` of ``[pos; ctx]`` (Song & Zhong Fig. 2).

    Every vector is scaled to unit norm, so entries are cosines: the top-left ``T x T`` block is
    pos-pos (smoothness), the off-diagonal blocks pos-ctx (incoherence), the bottom-right ctx-ctx
    (clusters). With ``ctx=None`` just the positional ``T x T`` block.

    Example:
        >>> G = normalized_gram(torch.tensor([[2.0, 0.0]]), torch.tensor([[3.0, 3.0]]))
        >>> G.shape, round(float(G[0, 1]), 4)
        (torch.Size([2, 2]), 0.7071)
    """
    x = _rows(pos, "pos")
    if ctx is not None:
        c = _rows(ctx, "ctx")
        if c.shape[1] != x.shape[1]:
            raise ValueError(f"ctx: feature size {c.shape[1]} != pos's {x.shape[1]}")
        x = torch.cat([x, c])
    return cosine_matrix(x, x)
