"""Attention-head analysis: mean attention maps and a geometric head taxonomy.

The papers (seed 000 Section 3 and Appendices E, G, H; seed 002 Section 3.2.2 and Appendix M) read
the 4L8H model's attention maps averaged over samples, under random masks and under structured
masks (:mod:`tfmatcomp.masks`), and name head types:

* **row** heads attend to the query's row (block-diagonal maps), **column** heads to its column
  ("parallel off-diagonal" maps), **identity** heads to the query itself (diagonal maps);
* **masked-row** heads are active mainly for queries in masked rows, where they attend to the
  (only) observed entries of that row;
* **observed-copy** heads are roughly identity maps, except that masked queries attend to the
  observed entries of their row;
* **mask-ignore** ("observed-only") heads put their attention on observed entries only;
* **longest-contiguous-column** heads attend, in each row, to the entry in the column with the
  longest contiguous run of observed entries;
* **input-processing** heads (first layer) are static across masks and inputs.

This module turns each description into a score computed from the attention probabilities
(``blocks.{l}.attn.hook_pattern``, ``[batch, head, query, key]``) and the mask, then classifies
heads by thresholds. The operational definitions (all in [0, 1] unless said otherwise; ``A[q, k]``
is a query's attention distribution; "pooled" means averaged over all (sample, query) pairs of the
stated kind):

=============================  ===============================================================
score                          definition
=============================  ===============================================================
``row``                        pooled mass on the *other* keys of the query's row
``column``                     pooled mass on the other keys of the query's column
``self_observed``              pooled self-attention ``A[q, q]`` over observed queries
``self_masked``                pooled self-attention over masked queries
``identity``                   ``min(self_observed, self_masked)``
``row_observed_masked``        pooled mass, over masked queries, on observed keys of their row
``observed_copy``              ``min(self_observed, row_observed_masked)``
``masked_row``                 pooled mass on observed keys of the own row (self included)
                               for queries in masked rows, minus the same for queries in other
                               rows (0 if there are none); a masked row has at least
                               ``masked_row_fraction`` of its entries masked. Range [-1, 1].
``longest_contiguous_column``  pooled lift ``m_lcc - m_row * c / n_cols``: ``m_lcc`` is the mass
                               on the keys of the query's row lying in the longest contiguous
                               column(s) (``c`` of them, see
                               :func:`tfmatcomp.masks.longest_contiguous_columns`), ``m_row`` the
                               mass on the whole row (self included). 0 for row-uniform heads.
``observed_mass``              pooled mass on observed keys
``mask_ignore``                ``(observed_mass - F) / (1 - F)``, ``F`` the pooled fraction of
                               observed keys: 1 = attends to observed keys only, 0 = blind to
                               the mask.
``mask_sink``                  ``(m - c) / (1 - c)``, ``m`` the pooled mass on masked keys over
                               *observed* queries, ``c`` the pooled fraction of masked keys over
                               the same queries: 1 = observed queries attend only to masked keys
                               (which carry only their positional embedding), 0 = chance. Not a
                               paper type; found in our tiny models (see docs/heads.md).
``static``                     ``1 - sum Var_samples(A) / sum E_samples(A^2)`` (sums over query
                               and key): 1 when the map does not change across samples / masks;
                               NaN with a single sample.
``entropy``                    mean attention entropy over queries divided by ``log(n_keys)``
                               (1 = uniform attention).
``middle_row``                 pooled mass on keys in the middle row (``n_rows // 2``); descriptive.
=============================  ===============================================================

:func:`classify_heads` assigns one ``type`` per head by checking, in order: ``uniform``
(entropy >= threshold), ``identity`` / ``observed_copy`` (the larger passing one),
``masked_row``, ``longest_contiguous_column``, ``row`` / ``column`` (the larger passing one),
``mask_ignore``, ``mask_sink``, ``input_processing`` (``static`` above threshold, not uniform, in
the configured layers), else ``other``. The ``types`` column lists every type whose criterion passes.

Layers and heads are 0-based (``layer``, ``head`` columns); ``paper_label`` is the papers' 1-based
``"(layer, head)"``.

Example:
    >>> import torch
    >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
    >>> from tfmatcomp.heads import analyse_heads
    >>> model = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
    >>> task = MatrixCompletionTask(n_rows=4, rank=1)
    >>> res = analyse_heads(model, task, n_samples=8, generator=torch.Generator().manual_seed(0))
    >>> res.mean_patterns.shape, res.table["paper_label"].tolist()
    (torch.Size([2, 2, 16, 16]), ['(1,1)', '(1,2)', '(2,1)', '(2,2)'])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.interventions.sites import paper_label as _paper_label
from tfmatcomp.masks import longest_contiguous_columns, masked_rows, positions_to_rows_cols

__all__ = [
    "HEAD_TYPES",
    "SCORE_COLUMNS",
    "HeadThresholds",
    "HeadScoreAccumulator",
    "HeadAnalysis",
    "pattern_hook_names",
    "attention_patterns",
    "mean_attention_patterns",
    "head_scores",
    "classify_heads",
    "analyse_heads",
    "head_score_evolution",
    "paper_label",
]

HEAD_TYPES = ("uniform", "identity", "observed_copy", "masked_row", "longest_contiguous_column",
              "row", "column", "mask_ignore", "mask_sink", "input_processing", "other")

SCORE_COLUMNS = ("row", "column", "identity", "observed_copy", "masked_row",
                 "longest_contiguous_column", "mask_ignore", "mask_sink", "static", "entropy",
                 "self_observed", "self_masked", "row_observed_masked", "observed_mass",
                 "middle_row")


def paper_label(layer: int, head: int) -> str:
    """The papers' 1-based label of one 0-based ``(layer, head)`` (see
    :func:`tfmatcomp.interventions.sites.paper_label` for groups of heads).

    Example:
        >>> paper_label(3, 2)
        '(4,3)'
    """
    return _paper_label([(layer, head)])


# ------------------------------------------------------------------------------ collecting
def pattern_hook_names(model, layers: Sequence[int] | None = None) -> list[str]:
    """``blocks.{l}.attn.hook_pattern`` for the given 0-based layers (all when None)."""
    n = model.cfg.n_layers
    layers = list(range(n)) if layers is None else [int(l) for l in layers]
    bad = [l for l in layers if not 0 <= l < n]
    if bad:
        raise ValueError(f"layers: 0-based layer indices must lie in [0, {n - 1}], got {bad}")
    return [f"blocks.{l}.attn.hook_pattern" for l in layers]


def attention_patterns(model, tokens: Tensor, layers: Sequence[int] | None = None
                       ) -> Float[Tensor, "batch layer head query key"]:
    """Per-sample attention probabilities of the requested layers via ``model.run_with_cache``.

    Example:
        >>> import torch
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=4))
        >>> attention_patterns(m, torch.ones(3, 4, dtype=torch.long)).shape
        torch.Size([3, 2, 2, 4, 4])
    """
    names = pattern_hook_names(model, layers)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    return torch.stack([cache[n] for n in names], dim=1)


def mean_attention_patterns(model, tokens: Tensor, layers: Sequence[int] | None = None,
                            batch_size: int = 64) -> Float[Tensor, "layer head query key"]:
    """Attention probabilities averaged over the samples of ``tokens`` (the papers' maps).

    Example:
        >>> import torch
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=4))
        >>> p = mean_attention_patterns(m, torch.ones(3, 4, dtype=torch.long))
        >>> p.shape, bool(torch.allclose(p.sum(-1), torch.ones(2, 2, 4)))
        (torch.Size([2, 2, 4, 4]), True)
    """
    total = None
    for start in range(0, tokens.shape[0], batch_size):
        p = attention_patterns(model, tokens[start:start + batch_size], layers).to(torch.float64).sum(0)
        total = p if total is None else total + p
    return (total / tokens.shape[0]).to(model.dtype)


# --------------------------------------------------------------------------------- scoring
class HeadScoreAccumulator:
    """Streams per-sample attention patterns and masks into the head scores (module docstring).

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

    def _add(self, name: str, mass: Tensor, qweight: Tensor) -> None:
        # mass [B, L, H, Q], qweight [B, Q]
        num = torch.einsum("blhq,bq->lh", mass, qweight)
        den = qweight.sum()
        if name in self._num:
            self._num[name] += num
            self._den[name] += den
        else:
            self._num[name], self._den[name] = num, den

    def _add_scalar(self, name: str, value: Tensor, qweight: Tensor) -> None:
        # value, qweight [B, Q]: a pooled chance level (no layer / head dependence)
        self._num[name] = self._num.get(name, 0) + (value * qweight).sum()
        self._den[name] = self._den.get(name, 0) + qweight.sum()

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
        rows, cols = positions_to_rows_cols(self.n_rows, self.n_cols, device=dev)
        same_row = (rows[:, None] == rows[None, :]).to(torch.float64)        # [Q, K]
        same_col = (cols[:, None] == cols[None, :]).to(torch.float64)
        eye = torch.eye(self.n_pos, dtype=torch.float64, device=dev)
        obs_f = obs.to(torch.float64)                                         # [B, P]
        mask_f = 1.0 - obs_f
        obs_k = obs_f[:, None, :]                                             # [B, 1, K]

        def mass(w: Tensor) -> Tensor:  # w [Q, K] or [B, Q, K] -> [B, L, H, Q]
            if w.ndim == 2:
                return torch.einsum("blhqk,qk->blhq", a, w)
            return torch.einsum("blhqk,bqk->blhq", a, w)

        ones = torch.ones(b, self.n_pos, dtype=torch.float64, device=dev)
        self._add("row", mass(same_row - eye), ones)
        self._add("column", mass(same_col - eye), ones)
        self_mass = torch.diagonal(a, dim1=-2, dim2=-1)                       # [B, L, H, Q]
        self._add("self_observed", self_mass, obs_f)
        self._add("self_masked", self_mass, mask_f)
        row_obs = same_row * obs_k                                            # [B, Q, K]
        self._add("row_observed_masked", mass(row_obs * (1 - eye)), mask_f)
        in_masked_row = masked_rows(obs, self.n_rows, self.n_cols, self.masked_row_fraction)
        q_in_masked_row = in_masked_row[:, rows].to(torch.float64)            # [B, Q]
        m_row_obs = mass(row_obs)
        self._add("row_obs_in_masked_rows", m_row_obs, q_in_masked_row)
        self._add("row_obs_in_other_rows", m_row_obs, 1.0 - q_in_masked_row)
        lcc = longest_contiguous_columns(obs, self.n_rows, self.n_cols).to(torch.float64)  # [B, C]
        n_lcc = lcc.sum(-1)                                                   # [B]
        lift = same_row * (lcc[:, cols][:, None, :] - (n_lcc / self.n_cols)[:, None, None])
        self._add("longest_contiguous_column", mass(lift),
                  (n_lcc > 0).to(torch.float64)[:, None].expand(-1, self.n_pos))
        self._add("observed_mass", mass(obs_k.expand(-1, self.n_pos, -1)), ones)
        frac = obs_f.mean(-1, keepdim=True).expand(-1, self.n_pos)            # [B, Q]
        self._add_scalar("observed_fraction", frac, ones)
        self._add("masked_mass_observed_queries", mass(1.0 - obs_k.expand(-1, self.n_pos, -1)), obs_f)
        self._add_scalar("masked_fraction_observed_queries", 1.0 - frac, obs_f)
        middle = (rows == self.n_rows // 2).to(torch.float64)[None, :].expand(self.n_pos, -1)
        self._add("middle_row", mass(middle), ones)
        ent = -(a * torch.log(a.clamp_min(1e-300))).sum(-1).sum((0, -1))       # [L, H]
        s, s2 = a.sum(0), a.pow(2).sum(0)
        if self._sum is None:
            self._sum, self._sum_sq, self._entropy = s, s2, ent
        else:
            self._sum += s
            self._sum_sq += s2
            self._entropy += ent
        self.n_samples += b

    def _pooled(self, name: str) -> Tensor:
        den = self._den[name]
        num = self._num[name]
        if den == 0:
            return torch.full_like(num, float("nan"))
        return num / den

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
        chance = ("observed_fraction", "masked_fraction_observed_queries")
        s = {name: self._pooled(name) for name in self._num if name not in chance}
        out = {k: s[k] for k in ("row", "column", "self_observed", "self_masked", "row_observed_masked",
                                 "observed_mass", "middle_row", "longest_contiguous_column")}
        out["identity"] = torch.fmin(s["self_observed"], s["self_masked"])
        out["observed_copy"] = torch.fmin(s["self_observed"], s["row_observed_masked"])
        other = s["row_obs_in_other_rows"]
        out["masked_row"] = s["row_obs_in_masked_rows"] - torch.nan_to_num(other, nan=0.0)
        f = self._num["observed_fraction"] / self._den["observed_fraction"]
        out["mask_ignore"] = ((s["observed_mass"] - f) / (1 - f) if f < 1
                              else torch.full_like(s["observed_mass"], float("nan")))
        den = self._den["masked_fraction_observed_queries"]
        c = self._num["masked_fraction_observed_queries"] / den if den > 0 else None
        m = s["masked_mass_observed_queries"]
        out["mask_sink"] = (m - c) / (1 - c) if c is not None and c > 0 else torch.full_like(m, float("nan"))
        if self.n_samples >= 2:
            mean = self._sum / self.n_samples
            var = (self._sum_sq / self.n_samples - mean.pow(2)).clamp_min(0).sum((-2, -1))
            out["static"] = 1.0 - var / (self._sum_sq / self.n_samples).sum((-2, -1))
        else:
            out["static"] = torch.full((n_layers, n_heads), float("nan"), dtype=torch.float64)
        out["entropy"] = self._entropy / (self.n_samples * self.n_pos * math.log(self.n_pos)) \
            if self.n_pos > 1 else torch.zeros(n_layers, n_heads, dtype=torch.float64)
        layer_idx, head_idx = torch.meshgrid(torch.arange(n_layers), torch.arange(n_heads), indexing="ij")
        table = {"layer": layer_idx.reshape(-1).numpy(), "head": head_idx.reshape(-1).numpy()}
        table["paper_label"] = [paper_label(int(l), int(h)) for l, h in zip(table["layer"], table["head"])]
        for name in SCORE_COLUMNS:
            table[name] = out[name].reshape(-1).cpu().numpy()
        return pd.DataFrame(table)


def head_scores(
    patterns: Float[Tensor, "*batch layer head query key"],
    observed: Bool[Tensor, "*batch pos"] | None,
    n_rows: int,
    n_cols: int | None = None,
    masked_row_fraction: float = 0.5,
) -> pd.DataFrame:
    """Head scores (module docstring) of given attention patterns: per-sample ``[batch, layer,
    head, q, k]`` or one map ``[layer, head, q, k]`` (e.g. a mean over samples sharing one mask).

    Args:
        patterns: attention probabilities.
        observed: mask(s), True = observed; ``[pos]``, ``[batch, pos]`` or None (nothing masked).
        n_rows, n_cols: matrix shape.
        masked_row_fraction: threshold defining masked rows.

    Example:
        >>> import torch
        >>> from tfmatcomp.masks import positions_to_rows_cols
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


# ------------------------------------------------------------------------------ classifying
@dataclass(frozen=True)
class HeadThresholds:
    """Thresholds of :func:`classify_heads` (a head passes a type when its score is >= the value).

    ``input_processing_layers``: 0-based layers where input-processing heads are looked for (the
    papers find them in the first layer); None allows any layer.
    """

    uniform_entropy: float = 0.95
    identity: float = 0.6
    observed_copy: float = 0.6
    masked_row: float = 0.5
    longest_contiguous_column: float = 0.4
    row: float = 0.5
    column: float = 0.5
    mask_ignore: float = 0.8
    mask_sink: float = 0.6
    input_processing_static: float = 0.9
    input_processing_layers: tuple[int, ...] | None = (0,)


def _passes(row: pd.Series, th: HeadThresholds) -> dict[str, bool]:
    def ge(name, thr):
        v = row[name]
        return bool(v == v and v >= thr)

    uniform = ge("entropy", th.uniform_entropy)
    static_ok = ge("static", th.input_processing_static) and not uniform and (
        th.input_processing_layers is None or int(row["layer"]) in th.input_processing_layers)
    return {
        "uniform": uniform,
        "identity": ge("identity", th.identity),
        "observed_copy": ge("observed_copy", th.observed_copy),
        "masked_row": ge("masked_row", th.masked_row),
        "longest_contiguous_column": ge("longest_contiguous_column", th.longest_contiguous_column),
        "row": ge("row", th.row),
        "column": ge("column", th.column),
        "mask_ignore": ge("mask_ignore", th.mask_ignore),
        "mask_sink": ge("mask_sink", th.mask_sink),
        "input_processing": static_ok,
    }


_PRIORITY = (("uniform",), ("identity", "observed_copy"), ("masked_row",),
             ("longest_contiguous_column",), ("row", "column"), ("mask_ignore",), ("mask_sink",),
             ("input_processing",))
_SCORE_OF = {"uniform": "entropy", "input_processing": "static"}


def classify_heads(scores: pd.DataFrame, thresholds: HeadThresholds | None = None) -> pd.DataFrame:
    """Add ``type`` (one per head, by the priority order in the module docstring) and ``types``
    (every passing type, comma-separated, ``""`` if none) to a :func:`head_scores` table.

    Example:
        >>> import torch
        >>> t = classify_heads(head_scores(torch.eye(4)[None, None], None, 2))
        >>> t["type"].tolist()
        ['identity']
    """
    th = thresholds or HeadThresholds()
    missing = [c for c in ("layer", "entropy", "static") + tuple(_SCORE_OF.get(t, t) for g in _PRIORITY
                                                                for t in g) if c not in scores]
    if missing:
        raise ValueError(f"scores: missing columns {sorted(set(missing))}; pass a head_scores() table")
    out = scores.copy()
    types, all_types = [], []
    for _, row in out.iterrows():
        ok = _passes(row, th)
        chosen = "other"
        for group in _PRIORITY:
            cand = [t for t in group if ok[t]]
            if cand:
                chosen = max(cand, key=lambda t: row[_SCORE_OF.get(t, t)])
                break
        types.append(chosen)
        all_types.append(",".join(t for g in _PRIORITY for t in g if ok[t]))
    out["type"] = types
    out["types"] = all_types
    return out


# ------------------------------------------------------------------------------ model level
@dataclass(frozen=True)
class HeadAnalysis:
    """Result of :func:`analyse_heads`.

    Attributes:
        mean_patterns: ``[layer, head, q, k]`` attention averaged over the samples.
        table: :func:`classify_heads` table (scores, ``type``, ``types``).
        observed: the fixed structured mask ``[pos]`` used, or None (random Bernoulli masks).
        n_rows, n_cols, n_samples: what was analysed.
        thresholds: as a dict.
    """

    mean_patterns: Float[Tensor, "layer head query key"]
    table: pd.DataFrame
    observed: Bool[Tensor, "pos"] | None
    n_rows: int
    n_cols: int
    n_samples: int
    thresholds: dict


def _run_accumulate(model, batch, layers, batch_size, masked_row_fraction) -> HeadScoreAccumulator:
    if batch.n_rows * batch.n_cols > model.cfg.n_ctx:
        raise ValueError(f"task: {batch.n_rows}x{batch.n_cols} matrices need "
                         f"{batch.n_rows * batch.n_cols} positions, the model has n_ctx {model.cfg.n_ctx}")
    acc = HeadScoreAccumulator(batch.n_rows, batch.n_cols, masked_row_fraction)
    dev = model.device
    for start in range(0, batch.batch_size, batch_size):
        sub = batch[start:start + batch_size]
        acc.update(attention_patterns(model, sub.tokens.to(dev), layers), sub.observed.to(dev))
    return acc


def analyse_heads(
    model,
    task,
    n_samples: int = 256,
    *,
    observed: Bool[Tensor, "pos"] | Bool[Tensor, "batch pos"] | None = None,
    generator: torch.Generator | None = None,
    batch=None,
    layers: Sequence[int] | None = None,
    batch_size: int = 64,
    masked_row_fraction: float = 0.5,
    thresholds: HeadThresholds | None = None,
) -> HeadAnalysis:
    """Mean attention maps and classified head scores of ``model`` on samples of ``task``.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder`.
        task: a :class:`~tfmatcomp.MatrixCompletionTask` (samples drawn with ``task.sample``).
        n_samples: matrices to average over.
        observed: a structured mask (``[pos]``, shared by all samples, or ``[batch, pos]``) from
            :mod:`tfmatcomp.masks`; None for the task's random masks.
        generator: randomness for the samples (default a CPU ``manual_seed(0)`` generator); the
            batch is moved to the model's device.
        batch: an already sampled :class:`~tfmatcomp.MatrixBatch` to use instead of sampling.
        layers: 0-based layers (default all).
        batch_size: matrices per forward pass.
        masked_row_fraction, thresholds: see :func:`head_scores` / :func:`classify_heads`.

    Example:
        >>> import torch
        >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
        >>> from tfmatcomp.masks import row_mask
        >>> model = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9))
        >>> res = analyse_heads(model, MatrixCompletionTask(n_rows=3, rank=1), 4,
        ...                     observed=row_mask(3, masked_rows=[1], keep=0))
        >>> len(res.table), res.table["type"].iloc[0]
        (2, 'uniform')
    """
    if batch is None:
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        batch = task.sample(n_samples, generator=generator, observed=observed)
    acc = _run_accumulate(model, batch, layers, batch_size, masked_row_fraction)
    th = thresholds or HeadThresholds()
    scores = acc.scores()
    if layers is not None:
        layer_of = [int(l) for l in layers]
        scores["layer"] = [layer_of[i] for i in scores["layer"]]
        scores["paper_label"] = [paper_label(l, h) for l, h in zip(scores["layer"], scores["head"])]
    table = classify_heads(scores, th)
    fixed = None
    if observed is not None and torch.as_tensor(observed).ndim == 1:
        fixed = torch.as_tensor(observed).cpu()
    return HeadAnalysis(mean_patterns=acc.mean_patterns().to(model.dtype), table=table,
                        observed=fixed, n_rows=batch.n_rows, n_cols=batch.n_cols,
                        n_samples=acc.n_samples, thresholds=asdict(th))


def head_score_evolution(
    checkpoints,
    task,
    n_samples: int = 128,
    *,
    observed: Bool[Tensor, "pos"] | None = None,
    seed: int = 0,
    batch_size: int = 64,
    masked_row_fraction: float = 0.5,
    thresholds: HeadThresholds | None = None,
) -> pd.DataFrame:
    """Head scores and types of every checkpoint, on the same samples (seeded by ``seed``).

    Args:
        checkpoints: ``{step: HookedEncoder | path}``, a list of checkpoint paths or a run
            directory (see :func:`tfmatcomp.embeddings.load_models`).
        task, n_samples, observed: the samples (random masks, or one structured mask).

    Returns:
        The :func:`classify_heads` table of each checkpoint with a leading ``step`` column.

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
        >>> cfg = EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9)
        >>> ev = head_score_evolution({0: HookedEncoder(cfg, seed=1), 10: HookedEncoder(cfg)},
        ...                           MatrixCompletionTask(n_rows=3, rank=1), n_samples=4)
        >>> ev[["step", "paper_label"]].values.tolist()
        [[0, '(1,1)'], [0, '(1,2)'], [10, '(1,1)'], [10, '(1,2)']]
    """
    from tfmatcomp.embeddings import load_models

    models = load_models(checkpoints)
    batch = task.sample(n_samples, generator=torch.Generator().manual_seed(seed), observed=observed)
    frames = []
    for step, model in models.items():
        res = analyse_heads(model, task, batch=batch, batch_size=batch_size,
                            masked_row_fraction=masked_row_fraction, thresholds=thresholds)
        df = res.table.copy()
        df.insert(0, "step", step)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
