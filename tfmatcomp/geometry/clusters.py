"""Context clusters by document (Song & Zhong Section 3, Appendix C): similarity by label and compactness.

* :func:`label_similarity_matrix`: mean cosine between the context vectors of every pair of labels
  (the block structure of the Fig. 2 ctx-ctx corner, one number per block);
* :func:`compactness_table`: cluster compactness ``Tr(Sigma_B Sigma_W^{-1})``
  (:func:`~tfmatcomp.geometry.cluster_separation`) of token vectors labelled by document, with the
  positional effect removed (``cvec``) and without (raw ``h - mu``), per layer.

Example:
    >>> import torch
    >>> x = torch.tensor([[1.0, 0.1], [1.0, -0.1], [0.1, 1.0], [-0.1, 1.0]])
    >>> label_similarity_matrix(x, torch.tensor([0, 0, 1, 1])).round(decimals=2).tolist()
    [[0.98, 0.0], [0.0, 0.98]]
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.decomposition import Decomposition
from tfmatcomp.geometry.similarity import cluster_separation, cosine_matrix

__all__ = ["label_similarity_matrix", "compactness_table"]


def label_similarity_matrix(vectors: Float[Tensor, "n d"], labels: Int[Tensor, "n"]
                            ) -> Float[Tensor, "k k"]:
    """Mean cosine between vectors of label ``a`` and of label ``b`` (self-pairs left out).

    Labels are ``0..k-1`` in order of :func:`torch.unique`.
    """
    cos = cosine_matrix(vectors, vectors)
    labels = torch.as_tensor(labels).to(cos.device)
    if labels.shape != (cos.shape[0],):
        raise ValueError(f"labels: expected one label per vector ({cos.shape[0]}), got "
                         f"{tuple(labels.shape)}")
    _, inverse = torch.unique(labels, return_inverse=True)
    onehot = torch.nn.functional.one_hot(inverse).to(cos.dtype)  # [n, k]
    off = 1 - torch.eye(cos.shape[0], dtype=cos.dtype, device=cos.device)
    sums = onehot.T @ (cos * off) @ onehot  # one pass over the n x n cosines, not k^2 masks
    counts = onehot.T @ off @ onehot
    out = sums / counts  # 0 / 0 = NaN where a pair of labels has no pair of vectors
    return out.to(torch.float64).cpu()


def compactness_table(residuals: Mapping[str, Decomposition], labels: Int[Tensor, "ctx"], *,
                      n_components: int = 20) -> pd.DataFrame:
    """Per layer: compactness of ``cvec`` tokens and of raw ``h - mu`` tokens, labelled by document.

    Args:
        residuals: second-pass decompositions (with ``resid``), one per layer.
        labels: document label of each of their contexts.
        n_components: principal directions kept before the trace (see
            :func:`~tfmatcomp.geometry.cluster_separation`; capped by the number of tokens).
    """
    rows = []
    labels = torch.as_tensor(labels)
    for name, dec in residuals.items():
        cvec = dec.cvec
        C, T, d = cvec.shape
        valid = (torch.ones(C, T, dtype=torch.bool) if dec.mask is None else dec.mask.cpu()).reshape(-1)
        tok_labels = labels[:C, None].expand(C, T).reshape(-1)[valid]
        raw = (dec.pos[None] + cvec).reshape(-1, d)[valid.to(cvec.device)]
        cv = cvec.reshape(-1, d)[valid.to(cvec.device)]
        k = max(1, min(n_components, d, cv.shape[0] - 1))
        rows.append({"name": name, "cvec": cluster_separation(cv, tok_labels, n_components=k),
                     "raw": cluster_separation(raw, tok_labels, n_components=k),
                     "n_components": k})
    return pd.DataFrame(rows)
