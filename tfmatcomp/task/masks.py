"""Structured masks: the papers' row and column masks, and geometry helpers for masks.

A mask here is a bool "observed" tensor, True where the entry is shown to the model, flattened
row-major like the task's sequences (position ``k = n_cols * row + col``). Shape ``[pos]`` (one mask
for every matrix in a batch) or ``[batch, pos]``. Either shape can be passed straight to
``MatrixCompletionTask.sample(observed=...)``.

The papers (the workshop paper Appendices E and H, the NeurIPS paper Section 3.2.2) study attention under *structured*
masks: a few rows fully masked except chosen entries ("row masks"), keeping the mask fixed while the
matrices vary. :func:`row_mask` and :func:`column_mask` build such masks; :func:`random_row_masks`
and :func:`random_column_masks` draw families of them from an explicit generator.

Example:
    >>> import torch
    >>> from tfmatcomp import MatrixCompletionTask
    >>> from tfmatcomp.task.masks import row_mask, format_mask
    >>> obs = row_mask(4, masked_rows=[1, 2], keep={1: 0, 2: 3})
    >>> print(format_mask(obs, 4, 4))
    # # # #
    # . . .
    . . . #
    # # # #
    >>> batch = MatrixCompletionTask(n_rows=4, rank=1).sample(
    ...     8, generator=torch.Generator().manual_seed(0), observed=obs)
    >>> int(batch.masked[0].sum())
    6
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tfmatcomp.validation import check_in_range, check_int_in_range, check_positive_int

__all__ = [
    "positions_to_rows_cols",
    "row_column_mass",
    "observed_from_matrix",
    "as_matrix",
    "row_mask",
    "column_mask",
    "random_row_masks",
    "random_column_masks",
    "contiguous_observed_run_lengths",
    "longest_contiguous_columns",
    "masked_rows",
    "format_mask",
]

Keep = Mapping[int, "int | Sequence[int]"] | int | Sequence[int] | None


def _check_dims(n_rows: int, n_cols: int | None) -> tuple[int, int]:
    if n_cols is None:
        n_cols = n_rows
    return check_positive_int("n_rows", n_rows), check_positive_int("n_cols", n_cols)


def positions_to_rows_cols(
    n_rows: int, n_cols: int | None = None, device: torch.device | str | None = None
) -> tuple[Int[Tensor, "pos"], Int[Tensor, "pos"]]:
    """Row and column index of every position of the row-major sequence (``k = n_cols*row + col``).

    Example:
        >>> rows, cols = positions_to_rows_cols(2, 3)
        >>> rows.tolist(), cols.tolist()
        ([0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2])
    """
    n_rows, n_cols = _check_dims(n_rows, n_cols)
    k = torch.arange(n_rows * n_cols, device=device)
    return k // n_cols, k % n_cols


def observed_from_matrix(pattern) -> Bool[Tensor, "pos"]:
    """Flatten a 2-D pattern (nested lists, numpy array or tensor; truthy = observed) row-major.

    Example:
        >>> observed_from_matrix([[1, 0], [1, 1]]).tolist()
        [True, False, True, True]
    """
    t = torch.as_tensor(pattern)
    if t.ndim != 2:
        raise ValueError(f"pattern: expected a 2-D [n_rows, n_cols] pattern, got shape {tuple(t.shape)}")
    return (t != 0).reshape(-1)


def as_matrix(observed: Bool[Tensor, "*batch pos"], n_rows: int,
              n_cols: int | None = None) -> Bool[Tensor, "*batch n_rows n_cols"]:
    """Reshape a flat mask ``[..., pos]`` to ``[..., n_rows, n_cols]``.

    Example:
        >>> as_matrix(torch.tensor([True, False, True, True]), 2).tolist()
        [[True, False], [True, True]]
    """
    n_rows, n_cols = _check_dims(n_rows, n_cols)
    observed = torch.as_tensor(observed)
    if observed.shape[-1] != n_rows * n_cols:
        raise ValueError(f"observed: last dimension must be n_rows * n_cols = {n_rows * n_cols}, "
                         f"got shape {tuple(observed.shape)}")
    return observed.reshape(*observed.shape[:-1], n_rows, n_cols)


def _keep_for(index: int, keep: Keep) -> list[int]:
    if keep is None:
        return []
    if isinstance(keep, Mapping):
        chosen = keep.get(index, [])
    else:
        chosen = keep
    if isinstance(chosen, int):
        return [chosen]
    return [int(c) for c in chosen]


def _line_mask(n_rows: int, n_cols: int, lines: Iterable[int], keep: Keep, axis: str,
               device) -> Bool[Tensor, "pos"]:
    n_lines, n_other = (n_rows, n_cols) if axis == "row" else (n_cols, n_rows)
    name = "masked_rows" if axis == "row" else "masked_cols"
    other = "col" if axis == "row" else "row"
    lines = [int(i) for i in lines]
    if any(not 0 <= i < n_lines for i in lines):
        raise ValueError(f"{name}: indices must lie in [0, {n_lines - 1}] (0-based), got {lines}")
    if isinstance(keep, Mapping) and any(k not in lines for k in keep):
        raise ValueError(f"keep: keys must be among {name} {lines}, got {sorted(keep)}")
    m = torch.ones(n_lines, n_other, dtype=torch.bool, device=device)
    for i in lines:
        m[i] = False
        kept = _keep_for(i, keep)
        if any(not 0 <= j < n_other for j in kept):
            raise ValueError(f"keep: {other} indices must lie in [0, {n_other - 1}] (0-based), "
                             f"got {kept} for {axis} {i}")
        m[i, kept] = True
    if axis == "col":
        m = m.T
    return m.reshape(-1).contiguous()


def row_mask(n_rows: int, n_cols: int | None = None, masked_rows: Iterable[int] = (),
             keep: Keep = None, device: torch.device | str | None = None) -> Bool[Tensor, "pos"]:
    """A row mask: the rows in ``masked_rows`` are fully masked except the entries in ``keep``.

    Args:
        n_rows, n_cols: matrix shape (``n_cols`` defaults to ``n_rows``).
        masked_rows: 0-based indices of the rows to mask.
        keep: columns left observed in the masked rows: a dict ``row -> column(s)``, or one column /
            a list of columns used for every masked row, or None (rows fully masked).
        device: where the mask lives.

    Returns:
        ``[n_rows * n_cols]`` bool, True = observed.

    Example:
        >>> row_mask(3, masked_rows=[1], keep=2).reshape(3, 3).int().tolist()
        [[1, 1, 1], [0, 0, 1], [1, 1, 1]]
    """
    n_rows, n_cols = _check_dims(n_rows, n_cols)
    return _line_mask(n_rows, n_cols, masked_rows, keep, "row", device)


def column_mask(n_rows: int, n_cols: int | None = None, masked_cols: Iterable[int] = (),
                keep: Keep = None, device: torch.device | str | None = None) -> Bool[Tensor, "pos"]:
    """A column mask: columns in ``masked_cols`` fully masked except the rows in ``keep``.

    ``keep`` is a dict ``column -> row(s)``, one row / a list of rows for every masked column, or None.

    Example:
        >>> column_mask(3, masked_cols=[0], keep=1).reshape(3, 3).int().tolist()
        [[0, 1, 1], [1, 1, 1], [0, 1, 1]]
    """
    n_rows, n_cols = _check_dims(n_rows, n_cols)
    return _line_mask(n_rows, n_cols, masked_cols, keep, "col", device)


def _random_line_masks(n_rows, n_cols, n_lines_masked, batch_size, n_keep, generator, axis):
    n_lines, n_other = (n_rows, n_cols) if axis == "row" else (n_cols, n_rows)
    name = "n_masked_rows" if axis == "row" else "n_masked_cols"
    check_int_in_range(name, n_lines_masked, 0, n_lines)
    check_int_in_range("n_keep", n_keep, 0, n_other)
    check_positive_int("batch_size", batch_size)
    device = generator.device if generator is not None else torch.device("cpu")
    # Choose lines (and kept entries) by ranking iid uniforms: a uniform random subset per sample.
    line_rank = torch.rand(batch_size, n_lines, generator=generator, device=device).argsort(-1).argsort(-1)
    masked_line = line_rank < n_lines_masked                                  # [batch, n_lines]
    keep_rank = torch.rand(batch_size, n_lines, n_other, generator=generator,
                           device=device).argsort(-1).argsort(-1)
    kept = keep_rank < n_keep                                                 # [batch, n_lines, n_other]
    m = ~masked_line[..., None] | kept
    if axis == "col":
        m = m.transpose(1, 2)
    return m.reshape(batch_size, -1).contiguous()


def random_row_masks(n_rows: int, n_cols: int | None = None, n_masked_rows: int = 1,
                     batch_size: int = 1, n_keep: int = 1,
                     generator: torch.Generator | None = None) -> Bool[Tensor, "batch pos"]:
    """Random row masks: per sample, ``n_masked_rows`` random rows, each masked except ``n_keep``
    random entries. Randomness comes only from ``generator`` (its device is used).

    Example:
        >>> obs = random_row_masks(4, n_masked_rows=2, batch_size=3, generator=torch.Generator().manual_seed(0))
        >>> obs.shape, (~obs).sum(-1).tolist()
        (torch.Size([3, 16]), [6, 6, 6])
    """
    n_rows, n_cols = _check_dims(n_rows, n_cols)
    return _random_line_masks(n_rows, n_cols, n_masked_rows, batch_size, n_keep, generator, "row")


def random_column_masks(n_rows: int, n_cols: int | None = None, n_masked_cols: int = 1,
                        batch_size: int = 1, n_keep: int = 1,
                        generator: torch.Generator | None = None) -> Bool[Tensor, "batch pos"]:
    """Random column masks: per sample, ``n_masked_cols`` random columns, each masked except
    ``n_keep`` random entries.

    Example:
        >>> obs = random_column_masks(4, n_masked_cols=1, batch_size=2, generator=torch.Generator().manual_seed(0))
        >>> (~obs).sum(-1).tolist()
        [3, 3]
    """
    n_rows, n_cols = _check_dims(n_rows, n_cols)
    return _random_line_masks(n_rows, n_cols, n_masked_cols, batch_size, n_keep, generator, "col")


def contiguous_observed_run_lengths(observed: Bool[Tensor, "*batch pos"], n_rows: int,
                                    n_cols: int | None = None) -> Int[Tensor, "*batch n_cols"]:
    """Per column, the length of the longest run of vertically consecutive observed entries.

    Example:
        >>> obs = observed_from_matrix([[1, 0, 1], [1, 1, 0], [0, 1, 1]])
        >>> contiguous_observed_run_lengths(obs, 3).tolist()
        [2, 2, 1]
    """
    m = as_matrix(observed, n_rows, n_cols).to(torch.long)   # [..., n_rows, n_cols]
    run = torch.zeros_like(m[..., 0, :])
    best = torch.zeros_like(run)
    for r in range(m.shape[-2]):
        run = (run + 1) * m[..., r, :]
        best = torch.maximum(best, run)
    return best


def longest_contiguous_columns(observed: Bool[Tensor, "*batch pos"], n_rows: int,
                               n_cols: int | None = None) -> Bool[Tensor, "*batch n_cols"]:
    """The papers' "longest contiguous unmasked column": True at every column whose longest run of
    vertically consecutive observed entries is the longest in the matrix (ties: all of them; a
    matrix with no observed entry has none).

    Example:
        >>> obs = observed_from_matrix([[1, 0, 1], [1, 1, 0], [0, 1, 1]])
        >>> longest_contiguous_columns(obs, 3).tolist()
        [True, True, False]
    """
    runs = contiguous_observed_run_lengths(observed, n_rows, n_cols)
    best = runs.max(dim=-1, keepdim=True).values
    return (runs == best) & (best > 0)


def masked_rows(observed: Bool[Tensor, "*batch pos"], n_rows: int, n_cols: int | None = None,
                min_masked_fraction: float = 0.5) -> Bool[Tensor, "*batch n_rows"]:
    """Rows counted as "masked rows": at least ``min_masked_fraction`` of their entries masked.

    With the papers' row masks (a row masked except one entry) every masked row qualifies at the
    default 0.5; under Bernoulli masks it picks the rows that are mostly hidden.

    Example:
        >>> masked_rows(row_mask(3, masked_rows=[2], keep=0), 3).tolist()
        [False, False, True]
    """
    check_in_range("min_masked_fraction", min_masked_fraction, 0.0, 1.0, closed=(False, True))
    m = as_matrix(observed, n_rows, n_cols)
    return (~m).float().mean(-1) >= min_masked_fraction - 1e-9


def format_mask(observed: Bool[Tensor, "pos"], n_rows: int, n_cols: int | None = None,
                observed_char: str = "#", masked_char: str = ".") -> str:
    """A text picture of one mask, one line per row (``#`` observed, ``.`` masked).

    Example:
        >>> print(format_mask(torch.tensor([True, False, False, True]), 2))
        # .
        . #
    """
    m = as_matrix(observed, n_rows, n_cols)
    if m.ndim != 2:
        raise ValueError(f"observed: expected a single mask [pos], got shape {tuple(observed.shape)}")
    return "\n".join(" ".join(observed_char if v else masked_char for v in row) for row in m.tolist())


def row_column_mass(
    pattern: Float[Tensor, "batch head query key"],
    observed: Bool[Tensor, "batch pos"],
    n_rows: int,
    n_cols: int,
    part: Literal["row_or_column", "row", "column"] = "row_or_column",
) -> Float[Tensor, "head"]:
    """Per head: the attention mass a masked query puts on the observed keys of its own row or
    column, pooled over all (matrix, masked query) pairs (NaN when nothing is masked); what the
    progress measure :func:`tfmatcomp.analyses.dynamics.row_column_attention_mass` reports and
    the penalty :class:`tfmatcomp.interventions.during_training.RowColumnAttentionPenalty` trains against
    (differentiable in ``pattern``).

    A key ``k`` counts for query ``q`` when ``k`` is observed and ``row(k) = row(q)`` or
    ``col(k) = col(q)`` (``part="row"``: the row only; ``"column"``: the column only; a masked
    ``q`` never counts itself), rows and columns as in
    :func:`tfmatcomp.task.masks.positions_to_rows_cols`.

    Example:
        >>> import torch
        >>> a = torch.zeros(1, 1, 4, 4); a[0, 0, 0, 1] = 0.75; a[0, 0, 0, 3] = 0.25   # 2x2 matrix
        >>> obs = torch.tensor([[False, True, True, True]])   # query 0 masked: row key 1, column key 2
        >>> row_column_mass(a, obs, 2, 2).tolist()
        [0.75]
    """
    if part not in ("row_or_column", "row", "column"):
        raise ValueError(f"part: expected 'row_or_column', 'row' or 'column', got {part!r}")
    rows, cols = positions_to_rows_cols(n_rows, n_cols, device=pattern.device)
    same_row, same_col = rows[:, None] == rows[None, :], cols[:, None] == cols[None, :]
    same = {"row": same_row, "column": same_col, "row_or_column": same_row | same_col}[part]
    keys = same[None] & observed[:, None, :]                                          # [B, Q, K]
    mass = (pattern.double() * keys[:, None].double()).sum(-1)                        # [B, H, Q]
    queries = (~observed).double()                                                    # [B, Q]
    n = queries.sum()
    if n == 0:
        return torch.full((pattern.shape[1],), float("nan"), dtype=torch.float64)
    return (mass * queries[:, None]).sum((0, 2)) / n
