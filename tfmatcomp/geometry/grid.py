"""Matrix-completion view of the positional basis: does ``pos_t`` encode the row and column of t?

A sequence is an ``n_rows x n_cols`` matrix flattened row-major (``t = n_cols * row + col``). Writing
``pos`` as a grid ``P[row, col]`` and centring it, the two-way ANOVA split

    P[i, j] - m = (R_i) + (C_j) + (interaction_ij),   R_i = mean_j P[i, j] - m,  C_j = mean_i P[i, j] - m

is orthogonal (balanced grid), so the three shares of ``sum ||P - m||^2`` add up to 1:
``row`` is the R^2 of projecting each ``pos_t`` on the row-indicator means (the part of the
positional basis that only knows the row), ``col`` the same for columns.

Example:
    >>> import torch
    >>> row_part = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])      # 2 rows
    >>> col_part = torch.tensor([[0.0, 2.0], [0.0, -2.0]])      # 2 cols
    >>> pos = (row_part[:, None] + col_part[None, :]).reshape(4, 2)
    >>> share = row_column_r2(pos, 2, 2)
    >>> round(share.row, 6), round(share.col, 6), round(share.interaction, 6)
    (0.2, 0.8, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp.geometry.pca import pca
from tfmatcomp.validation import check_positive_int, shape_text

__all__ = ["GridShares", "row_column_r2", "pos_pca"]


@dataclass(frozen=True)
class GridShares:
    """Shares of the positional variance explained by row means, column means, and the rest."""

    row: float
    col: float
    interaction: float


def _grid(pos: Tensor, n_rows: int, n_cols: int) -> Tensor:
    check_positive_int("n_rows", n_rows)
    check_positive_int("n_cols", n_cols)
    if not torch.is_tensor(pos) or pos.ndim != 2 or pos.shape[0] != n_rows * n_cols:
        raise ValueError(f"pos: expected [{n_rows * n_cols}, d] (one row per matrix entry, no "
                         f"position dropped), got {shape_text(pos)}")
    return pos.detach().to(torch.float64).reshape(n_rows, n_cols, -1)


def row_column_r2(pos: Float[Tensor, "pos d"], n_rows: int, n_cols: int | None = None) -> GridShares:
    """R^2 of the positional basis explained by row means and by column means of the grid.

    Args:
        pos: ``[n_rows * n_cols, d]``, row-major positions (decompose with ``drop_first=0``).
        n_rows, n_cols: the matrix shape (``n_cols`` defaults to ``n_rows``).
    """
    n_cols = n_rows if n_cols is None else n_cols
    P = _grid(pos, n_rows, n_cols)
    P = P - P.mean((0, 1))
    total = float((P ** 2).sum())
    if total == 0:
        return GridShares(float("nan"), float("nan"), float("nan"))
    R = P.mean(1)  # [n_rows, d]
    C = P.mean(0)  # [n_cols, d]
    row = n_cols * float((R ** 2).sum()) / total
    col = n_rows * float((C ** 2).sum()) / total
    return GridShares(row=row, col=col, interaction=1.0 - row - col)


def pos_pca(
    pos: Float[Tensor, "pos d"],
    n_components: int = 2,
    *,
    n_rows: int | None = None,
    n_cols: int | None = None,
    start: int = 0,
) -> pd.DataFrame:
    """PCA coordinates of ``pos_t``, one row per position, labelled by (row, col) of the matrix.

    Columns: ``t`` (absolute 0-based position, ``start + i``), ``row`` and ``col`` (0-based, when
    ``n_rows`` is given: ``row = t // n_cols``, ``col = t % n_cols``), ``pc1 .. pcK``.
    ``df.attrs["explained_variance_ratio"]`` holds the variance shares of the components.

    Example:
        >>> import torch
        >>> df = pos_pca(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)), n_rows=4)
        >>> list(df.columns), df.shape
        (['t', 'row', 'col', 'pc1', 'pc2'], (16, 5))
    """
    result = pca(pos, n_components)
    coords, ratio = result.scores, result.explained_variance_ratio
    t = torch.arange(start, start + pos.shape[0])
    data: dict[str, object] = {"t": t.numpy()}
    if n_rows is not None:
        n_cols = check_positive_int("n_cols", n_rows if n_cols is None else n_cols)
        data["row"] = (t // n_cols).numpy()
        data["col"] = (t % n_cols).numpy()
    for i in range(n_components):
        data[f"pc{i + 1}"] = coords[:, i].cpu().numpy()
    df = pd.DataFrame(data)
    df.attrs["explained_variance_ratio"] = ratio.cpu().tolist()
    return df
