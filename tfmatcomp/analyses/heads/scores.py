"""The registry of head scores: each score's name, definition and computation, written once.

A score is a :class:`HeadScore`. Most are *pooled* masses: the attention mass that a query puts on
some keys (a :class:`Pooled` statistic: a key weighting and a query weighting), averaged over all
(sample, query) pairs the query weighting selects, so samples with more such queries weigh more (as
the papers' losses pool entries). The others are *derived* from pooled statistics or from the
moments of the maps (``static``, ``entropy``). ``A[q, k]`` is one query's attention distribution.

:data:`SCORES` lists them in the order of the score columns (:data:`SCORE_COLUMNS`);
:func:`score_table` writes the definitions as a table (the docs' table is generated from it);
:class:`HeadScoreAccumulator` streams per-sample patterns into every score.

Example:
    >>> from tfmatcomp.analyses.heads.scores import SCORES, score_table
    >>> SCORES[0].name, SCORES[0].definition
    ('row', "pooled mass on the *other* keys of the query's row")
    >>> print(score_table().splitlines()[3])
    | `column` | pooled mass on the other keys of the query's column | uniform over own column: `(n_rows-1)/n_rows` |
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.interventions.sites import paper_label
from tfmatcomp.task.masks import longest_contiguous_columns, masked_rows, positions_to_rows_cols

__all__ = ["Pooled", "HeadScore", "SCORES", "SCORE_COLUMNS", "score_table", "HeadScoreAccumulator",
           "head_scores"]


# ------------------------------------------------------------------------- one chunk's geometry
class _Chunk:
    """What the statistics of one chunk of patterns read: the patterns and the mask geometry."""

    def __init__(self, a: Tensor, obs: Tensor, n_rows: int, n_cols: int, masked_row_fraction: float):
        self.a, self.obs, self.n_rows, self.n_cols = a, obs, n_rows, n_cols   # a [B, L, H, Q, K]
        self.masked_row_fraction = masked_row_fraction
        self.n_pos = n_rows * n_cols
        dev = a.device
        self.rows, self.cols = positions_to_rows_cols(n_rows, n_cols, device=dev)
        self.same_row = (self.rows[:, None] == self.rows[None, :]).to(torch.float64)   # [Q, K]
        self.same_col = (self.cols[:, None] == self.cols[None, :]).to(torch.float64)
        self.eye = torch.eye(self.n_pos, dtype=torch.float64, device=dev)
        self.observed = obs.to(torch.float64)                                # [B, P]
        self.masked = 1.0 - self.observed
        self.all = torch.ones(a.shape[0], self.n_pos, dtype=torch.float64, device=dev)

    def mass(self, w: Tensor) -> Float[Tensor, "batch layer head query"]:
        """Attention mass on the keys weighted by ``w`` ``[Q, K]`` or ``[B, Q, K]``."""
        if w.ndim == 2:
            return torch.einsum("blhqk,qk->blhq", self.a, w)
        return torch.einsum("blhqk,bqk->blhq", self.a, w)

    @cached_property
    def observed_keys(self) -> Tensor:                                       # [B, Q, K]
        return self.observed[:, None, :].expand(-1, self.n_pos, -1)

    @cached_property
    def self_mass(self) -> Tensor:                                           # [B, L, H, Q]
        return torch.diagonal(self.a, dim1=-2, dim2=-1)

    @cached_property
    def row_observed(self) -> Tensor:                                        # [B, Q, K]
        return self.same_row * self.observed[:, None, :]

    @cached_property
    def row_observed_mass(self) -> Tensor:
        return self.mass(self.row_observed)

    @cached_property
    def query_in_masked_row(self) -> Tensor:                                 # [B, Q]
        rows = masked_rows(self.obs, self.n_rows, self.n_cols, self.masked_row_fraction)
        return rows[:, self.rows].to(torch.float64)

    @cached_property
    def longest_columns(self) -> Tensor:                                     # [B, C]
        return longest_contiguous_columns(self.obs, self.n_rows, self.n_cols).to(torch.float64)

    @cached_property
    def observed_fraction(self) -> Tensor:                                   # [B, Q]
        return self.observed.mean(-1, keepdim=True).expand(-1, self.n_pos)


@dataclass(frozen=True)
class Pooled:
    """A pooled statistic: ``sum mass * weight / sum weight`` over (sample, query) pairs.

    Attributes:
        mass: ``[B, L, H, Q]`` per-head values of a chunk (``chance=False``), or ``[B, Q]`` values
            that do not depend on the head (``chance=True``: a chance level such as the observed
            fraction of keys).
        weight: ``[B, Q]`` query weights of a chunk.
    """

    mass: Callable[[_Chunk], Tensor]
    weight: Callable[[_Chunk], Tensor]
    chance: bool = False


class _Stats:
    """What the derived scores read: the pooled statistics and the moments of the maps."""

    def __init__(self, acc: "HeadScoreAccumulator"):
        self.acc = acc

    def __getitem__(self, name: str) -> Tensor:
        """The pooled value (NaN when nothing was pooled)."""
        num, den = self.acc._num[name], self.acc._den[name]
        return torch.full_like(num, float("nan")) if den == 0 else num / den


def _pooled(name: str) -> Callable[[_Stats], Tensor]:
    return lambda s: s[name]


@dataclass(frozen=True)
class HeadScore:
    """One head score: its name (the table column), its definition, and how it is computed.

    Attributes:
        name: column name.
        definition: the operational definition, one line of the score table.
        pure: the value on a pure pattern, for the table ("" if none is telling).
        pooled: a :class:`Pooled` statistic of the same name, when the score is one.
        derive: otherwise a function of the accumulated statistics (``s[name]`` is a pooled value).
    """

    name: str
    definition: str
    pure: str = ""
    pooled: Pooled | None = None
    derive: Callable[[_Stats], Tensor] | None = None

    def compute(self, stats: _Stats) -> Tensor:
        return (self.derive or _pooled(self.name))(stats)


def _all(c: _Chunk) -> Tensor:
    return c.all


def _mask_ignore(s: _Stats) -> Tensor:
    f = s.acc._num["observed_fraction"] / s.acc._den["observed_fraction"]
    m = s["observed_mass"]
    return (m - f) / (1 - f) if f < 1 else torch.full_like(m, float("nan"))


def _mask_sink(s: _Stats) -> Tensor:
    den = s.acc._den["masked_fraction_observed_queries"]
    c = s.acc._num["masked_fraction_observed_queries"] / den if den > 0 else None
    m = s["masked_mass_observed_queries"]
    return (m - c) / (1 - c) if c is not None and c > 0 else torch.full_like(m, float("nan"))


def _static(s: _Stats) -> Tensor:
    acc = s.acc
    if acc.n_samples < 2:
        return torch.full(acc._sum.shape[:2], float("nan"), dtype=torch.float64)
    mean = acc._sum / acc.n_samples
    var = (acc._sum_sq / acc.n_samples - mean.pow(2)).clamp_min(0).sum((-2, -1))
    return 1.0 - var / (acc._sum_sq / acc.n_samples).sum((-2, -1))


def _entropy(s: _Stats) -> Tensor:
    acc = s.acc
    if acc.n_pos <= 1:
        return torch.zeros(acc._sum.shape[:2], dtype=torch.float64)
    return acc._entropy / (acc.n_samples * acc.n_pos * math.log(acc.n_pos))


def _lcc_lift(c: _Chunk) -> Tensor:
    n_lcc = c.longest_columns.sum(-1)                                         # [B]
    return c.mass(c.same_row * (c.longest_columns[:, c.cols][:, None, :]
                                - (n_lcc / c.n_cols)[:, None, None]))


#: Pooled statistics that are not scores themselves (read by derived scores).
_AUXILIARY: dict[str, Pooled] = {
    "row_obs_in_masked_rows": Pooled(lambda c: c.row_observed_mass, lambda c: c.query_in_masked_row),
    "row_obs_in_other_rows": Pooled(lambda c: c.row_observed_mass, lambda c: 1.0 - c.query_in_masked_row),
    "observed_fraction": Pooled(lambda c: c.observed_fraction, _all, chance=True),
    "masked_mass_observed_queries": Pooled(lambda c: c.mass(1.0 - c.observed_keys), lambda c: c.observed),
    "masked_fraction_observed_queries": Pooled(lambda c: 1.0 - c.observed_fraction, lambda c: c.observed,
                                               chance=True),
}

#: Every head score, in the order of :data:`SCORE_COLUMNS`.
SCORES: tuple[HeadScore, ...] = (
    HeadScore("row", "pooled mass on the *other* keys of the query's row",
              "uniform over own row (self included): `(n_cols-1)/n_cols`",
              pooled=Pooled(lambda c: c.mass(c.same_row - c.eye), _all)),
    HeadScore("column", "pooled mass on the other keys of the query's column",
              "uniform over own column: `(n_rows-1)/n_rows`",
              pooled=Pooled(lambda c: c.mass(c.same_col - c.eye), _all)),
    HeadScore("identity", "`min(self_observed, self_masked)` (the available one if a kind is absent)",
              "diagonal: 1", derive=lambda s: torch.fmin(s["self_observed"], s["self_masked"])),
    HeadScore("observed_copy", "`min(self_observed, row_observed_masked)`",
              "self when observed, own row's observed keys when masked: 1",
              derive=lambda s: torch.fmin(s["self_observed"], s["row_observed_masked"])),
    HeadScore("masked_row", "mass on observed keys of the own row (self included) for queries in "
              "*masked rows*, minus the same for queries in the other rows (0 when there are none). A "
              "masked row has >= `masked_row_fraction` (0.5) of its entries masked. Range [-1, 1]",
              "masked rows -> their observed entry, other rows diffuse: `1 - n_cols/N`-ish; a row head: ~0",
              derive=lambda s: s["row_obs_in_masked_rows"] - torch.nan_to_num(s["row_obs_in_other_rows"],
                                                                              nan=0.0)),
    HeadScore("longest_contiguous_column", "pooled lift `m_lcc - m_row * c / n_cols`: `m_lcc` = mass on "
              "the keys of the query's row lying in the longest contiguous column(s) (`c` of them, see "
              "`masks.longest_contiguous_columns`), `m_row` = mass on the whole row. Samples without "
              "any observed entry are skipped",
              "attends to `(row(q), lcc)`: `1 - 1/n_cols`; row-uniform: 0",
              pooled=Pooled(_lcc_lift, lambda c: (c.longest_columns.sum(-1) > 0).to(torch.float64)[:, None]
                            .expand(-1, c.n_pos))),
    HeadScore("mask_ignore", "`(observed_mass - F) / (1 - F)`, `F` = pooled observed fraction of keys; "
              "NaN when nothing is masked", "observed keys only: 1; mask-blind: 0", derive=_mask_ignore),
    HeadScore("mask_sink", "`(m - c) / (1 - c)`: `m` = pooled mass on *masked* keys over *observed* "
              "queries, `c` = pooled masked fraction of keys over those queries; NaN when nothing is "
              "masked. **Not a paper type** (found in the tiny models; see the Heads guide)",
              "observed queries -> masked keys only: 1; chance: 0", derive=_mask_sink),
    HeadScore("static", "`1 - sum_qk Var_samples(A) / sum_qk E_samples(A^2)`; NaN with one sample",
              "same map for every input and mask: 1", derive=_static),
    HeadScore("entropy", "mean over queries of the attention entropy / `log(N)`",
              "uniform: 1, one-hot: 0", derive=_entropy),
    HeadScore("self_observed", "pooled `A[q, q]` over observed queries",
              pooled=Pooled(lambda c: c.self_mass, lambda c: c.observed)),
    HeadScore("self_masked", "pooled `A[q, q]` over masked queries",
              pooled=Pooled(lambda c: c.self_mass, lambda c: c.masked)),
    HeadScore("row_observed_masked", "pooled mass, over masked queries, on observed keys of their row",
              pooled=Pooled(lambda c: c.mass(c.row_observed * (1 - c.eye)), lambda c: c.masked)),
    HeadScore("observed_mass", "pooled mass on observed keys",
              pooled=Pooled(lambda c: c.mass(c.observed_keys), _all)),
    HeadScore("middle_row", "pooled mass on keys in row `n_rows // 2` (descriptive; the papers' layer-1 "
              "heads \"focus on the middle row\")",
              pooled=Pooled(lambda c: c.mass((c.rows == c.n_rows // 2).to(torch.float64)[None, :]
                                             .expand(c.n_pos, -1)), _all)),
)

SCORE_COLUMNS: tuple[str, ...] = tuple(s.name for s in SCORES)

_STATISTICS: dict[str, Pooled] = {**{s.name: s.pooled for s in SCORES if s.pooled is not None}, **_AUXILIARY}


def score_table() -> str:
    """The definitions of :data:`SCORES` as a Markdown table (score, definition, value on a pure
    pattern); the Heads guide shows it.

    Example:
        >>> print(score_table().splitlines()[0])
        | score | definition | pure pattern -> value |
    """
    lines = ["| score | definition | pure pattern -> value |", "| --- | --- | --- |"]
    lines += [f"| `{s.name}` | {s.definition} | {s.pure} |" for s in SCORES]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ accumulating
class HeadScoreAccumulator:
    """Streams per-sample attention patterns and masks into the head scores (:data:`SCORES`).

    Args:
        n_rows, n_cols: matrix shape (``n_rows * n_cols`` query / key positions).
        masked_row_fraction: a row is a masked row when at least this fraction of it is masked.

    Example:
        >>> import torch
        >>> acc = HeadScoreAccumulator(2, 2)
        >>> acc.update(torch.eye(4).expand(1, 1, 1, 4, 4), torch.ones(1, 4, dtype=torch.bool))
        >>> float(acc.scores()["self_observed"].iloc[0])
        1.0
    """

    def __init__(self, n_rows: int, n_cols: int | None = None, masked_row_fraction: float = 0.5):
        self.n_rows = n_rows
        self.n_cols = n_rows if n_cols is None else n_cols
        self.masked_row_fraction = masked_row_fraction
        self.n_pos = self.n_rows * self.n_cols
        self.n_samples = 0
        self._num: dict[str, Tensor] = {}
        self._den: dict[str, Tensor] = {}
        self._sum = None
        self._sum_sq = None
        self._entropy = None

    def _add(self, name: str, stat: Pooled, chunk: _Chunk) -> None:
        value, qweight = stat.mass(chunk), stat.weight(chunk)
        if stat.chance:                      # value, qweight [B, Q]: no layer / head dependence
            self._num[name] = self._num.get(name, 0) + (value * qweight).sum()
            self._den[name] = self._den.get(name, 0) + qweight.sum()
            return
        num = torch.einsum("blhq,bq->lh", value, qweight)
        den = qweight.sum()
        if name in self._num:
            self._num[name] += num
            self._den[name] += den
        else:
            self._num[name], self._den[name] = num, den

    def update(self, patterns: Float[Tensor, "batch layer head query key"],
               observed: Bool[Tensor, "batch pos"] | Bool[Tensor, "pos"] | None = None) -> None:
        """Add a chunk of per-sample patterns ``[batch, layer, head, q, k]`` with their masks
        (``[batch, pos]``, ``[pos]`` for one shared mask, or None for fully observed)."""
        if patterns.ndim != 5 or patterns.shape[-1] != self.n_pos or patterns.shape[-2] != self.n_pos:
            raise ValueError(f"patterns: expected [batch, layer, head, {self.n_pos}, {self.n_pos}] for "
                             f"{self.n_rows}x{self.n_cols} matrices, got {tuple(patterns.shape)}")
        a = patterns.detach().to(torch.float64)
        b, dev = a.shape[0], a.device
        if observed is None:
            obs = torch.ones(b, self.n_pos, dtype=torch.bool, device=dev)
        else:
            obs = torch.as_tensor(observed, device=dev)
            if obs.dtype != torch.bool or obs.shape[-1] != self.n_pos or obs.ndim not in (1, 2) or (
                    obs.ndim == 2 and obs.shape[0] not in (1, b)):
                raise ValueError(f"observed: expected a bool mask [{self.n_pos}] or [{b}, {self.n_pos}], "
                                 f"got {obs.dtype} {tuple(obs.shape)}")
            obs = obs.expand(b, self.n_pos) if obs.ndim == 2 else obs.expand(b, -1)
        chunk = _Chunk(a, obs, self.n_rows, self.n_cols, self.masked_row_fraction)
        for name, stat in _STATISTICS.items():
            self._add(name, stat, chunk)
        ent = -(a * torch.log(a.clamp_min(1e-300))).sum(-1).sum((0, -1))       # [L, H]
        s, s2 = a.sum(0), a.pow(2).sum(0)
        if self._sum is None:
            self._sum, self._sum_sq, self._entropy = s, s2, ent
        else:
            self._sum += s
            self._sum_sq += s2
            self._entropy += ent
        self.n_samples += b

    def mean_patterns(self) -> Float[Tensor, "layer head query key"]:
        """Mean attention map of everything added so far (float64)."""
        if self._sum is None:
            raise ValueError("no patterns added yet; call update() first")
        return self._sum / self.n_samples

    def scores(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head`` (0-based), ``paper_label`` and the scores."""
        if self._sum is None:
            raise ValueError("no patterns added yet; call update() first")
        n_layers, n_heads = self._sum.shape[:2]
        stats = _Stats(self)
        layer_idx, head_idx = torch.meshgrid(torch.arange(n_layers), torch.arange(n_heads), indexing="ij")
        table = {"layer": layer_idx.reshape(-1).numpy(), "head": head_idx.reshape(-1).numpy()}
        table["paper_label"] = [paper_label(int(l), int(h)) for l, h in zip(table["layer"], table["head"])]
        for score in SCORES:
            table[score.name] = score.compute(stats).reshape(-1).cpu().numpy()
        return pd.DataFrame(table)


def head_scores(
    patterns: Float[Tensor, "*batch layer head query key"],
    observed: Bool[Tensor, "*batch pos"] | None,
    n_rows: int,
    n_cols: int | None = None,
    masked_row_fraction: float = 0.5,
) -> pd.DataFrame:
    """Head scores (:data:`SCORES`) of given attention patterns: per-sample ``[batch, layer, head,
    q, k]`` or one map ``[layer, head, q, k]`` (e.g. a mean over samples sharing one mask).

    Args:
        patterns: attention probabilities.
        observed: mask(s), True = observed; ``[pos]``, ``[batch, pos]`` or None (nothing masked).
        n_rows, n_cols: matrix shape.
        masked_row_fraction: threshold defining masked rows.

    Example:
        >>> import torch
        >>> from tfmatcomp.task.masks import positions_to_rows_cols
        >>> rows, _ = positions_to_rows_cols(3, 3)
        >>> row_head = (rows[:, None] == rows[None, :]).float() / 3
        >>> t = head_scores(row_head[None, None], None, 3)
        >>> round(float(t["row"].iloc[0]), 4), round(float(t["column"].iloc[0]), 4)
        (0.6667, 0.0)
    """
    if patterns.ndim == 4:
        patterns = patterns.unsqueeze(0)
        if observed is not None and torch.as_tensor(observed).ndim == 2:
            raise ValueError("observed: a single map [layer, head, q, k] needs one mask [pos]")
    n_cols = n_rows if n_cols is None else n_cols
    acc = HeadScoreAccumulator(n_rows, n_cols, masked_row_fraction)
    acc.update(patterns, observed)
    return acc.scores()
