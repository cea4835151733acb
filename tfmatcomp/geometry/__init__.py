"""Geometry of the position / context decomposition (Song & Zhong 2023): plain functions of tensors.

* :mod:`~tfmatcomp.geometry.rank`: ScreeNOT rank estimate, stable rank, relative norm;
* :mod:`~tfmatcomp.geometry.similarity`: incoherence, cluster similarity and separation, normalized
  Gram matrix;
* :mod:`~tfmatcomp.geometry.fourier`: DCT of the positional Gram matrix, low-frequency energy;
* :mod:`~tfmatcomp.geometry.qk`: QK decomposition into pos / cvec components, rotated ``W_QK``;
* :mod:`~tfmatcomp.geometry.grid`: matrix-completion view (row / column shares, PCA by (row, col));
* :mod:`~tfmatcomp.geometry.summary`: the per-layer summary table.

All measurements run in float64 on the input's device (scipy's DCT on CPU).

Example:
    >>> import torch
    >>> from tfmatcomp.decomposition import decompose
    >>> from tfmatcomp.geometry import screenot, incoherence
    >>> h = torch.randn(64, 48, 48, generator=torch.Generator().manual_seed(0))
    >>> dec = decompose(h)
    >>> screenot(dec.pos).rank          # pure noise: no positional structure
    0
"""


from tfmatcomp._lazy import submodules_on_first_use
from tfmatcomp.geometry.fourier import gram_dct, low_frequency_energy
from tfmatcomp.geometry.grid import GridShares, pos_pca, row_column_r2
from tfmatcomp.geometry.pca import PCAResult, pca
from tfmatcomp.geometry.qk import (
    COMPONENTS,
    QKComponents,
    RotatedWQK,
    qk_components,
    qk_decomposition,
    rotated_wqk,
    rotated_wqk_head,
)
from tfmatcomp.geometry.rank import (
    ScreeNOTResult,
    max_screenot_k,
    pseudo_noise,
    relative_norm,
    screenot,
    screenot_singular_values,
    stable_rank,
)
from tfmatcomp.geometry.similarity import (
    ClusterSimilarity,
    Incoherence,
    cluster_separation,
    cluster_similarity,
    cosine_matrix,
    incoherence,
    normalized_gram,
)
from tfmatcomp.geometry.summary import SUMMARY_COLUMNS, layer_summary, model_summary_table, summary_table

__all__ = [
    "screenot", "screenot_singular_values", "pseudo_noise", "max_screenot_k", "ScreeNOTResult",
    "stable_rank", "relative_norm",
    "cosine_matrix", "incoherence", "Incoherence", "cluster_similarity", "ClusterSimilarity",
    "cluster_separation", "normalized_gram",
    "gram_dct", "low_frequency_energy",
    "qk_components", "qk_decomposition", "QKComponents", "COMPONENTS", "rotated_wqk",
    "rotated_wqk_head", "RotatedWQK",
    "row_column_r2", "GridShares", "pos_pca", "pca", "PCAResult",
    "layer_summary", "summary_table", "model_summary_table", "SUMMARY_COLUMNS",
]


__getattr__ = submodules_on_first_use(__name__)
