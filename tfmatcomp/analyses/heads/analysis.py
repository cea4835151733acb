"""Attention maps of a model on samples of a task, scored and classified per head.

Patterns come from ``blocks.{l}.attn.hook_pattern`` (``[batch, head, query, key]``) through the
library's data path (:func:`tfmatcomp.datapath.iter_chunks`, ``batch_size`` matrices per forward
pass); samples from :func:`tfmatcomp.datapath.sample_batch`.

Example:
    >>> import torch
    >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
    >>> from tfmatcomp.analyses.heads import analyse_heads
    >>> model = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
    >>> res = analyse_heads(model, MatrixCompletionTask(n_rows=4, rank=1), n_samples=8)
    >>> res.mean_patterns.shape, res.table["paper_label"].tolist()
    (torch.Size([2, 2, 16, 16]), ['(1,1)', '(1,2)', '(2,1)', '(2,2)'])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp._progress import bar, check_progress, tracked
from tfmatcomp.datapath import iter_chunks, load_checkpoints, sample_batch
from tfmatcomp.analyses.heads.classify import HeadThresholds, classify_heads
from tfmatcomp.analyses.heads.scores import HeadScoreAccumulator
from tfmatcomp.models.hook_names import pattern_hook_names
from tfmatcomp.interventions.sites import paper_label

__all__ = ["attention_patterns", "mean_attention_patterns", "HeadAnalysis", "analyse_heads",
           "head_score_evolution"]


def _pattern_chunks(model, inputs, layers, batch_size, b=None):
    """(chunk, patterns [chunk, layer, head, q, k]) over ``inputs`` (tokens or a batch); each
    chunk moves the bar ``b`` (if given) one step."""
    names = pattern_hook_names(model, layers)
    for chunk in iter_chunks(model, inputs, batch_size=batch_size, names=names, return_predictions=False):
        yield chunk, torch.stack([chunk.cache[n] for n in names], dim=1)
        if b is not None:
            b.update()


def _n_chunks(inputs, batch_size: int) -> int:
    n = inputs.batch_size if hasattr(inputs, "batch_size") else inputs.shape[0]
    return -(-int(n) // int(batch_size))


def attention_patterns(model, tokens: Tensor, layers: Sequence[int] | None = None
                       ) -> Float[Tensor, "batch layer head query key"]:
    """Per-sample attention probabilities of the requested layers via ``model.run_with_cache``
    (one forward pass).

    Example:
        >>> import torch
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=4))
        >>> attention_patterns(m, torch.ones(3, 4, dtype=torch.long)).shape
        torch.Size([3, 2, 2, 4, 4])
    """
    return next(_pattern_chunks(model, tokens, layers, max(1, tokens.shape[0])))[1]


def mean_attention_patterns(model, tokens: Tensor, layers: Sequence[int] | None = None,
                            batch_size: int = 64, progress: bool | None = None
                            ) -> Float[Tensor, "layer head query key"]:
    """Attention probabilities averaged over the samples of ``tokens`` (the papers' maps).

    ``progress``: a bar over the forward passes (None: when watched; :mod:`tfmatcomp._progress`).

    Example:
        >>> import torch
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=4))
        >>> p = mean_attention_patterns(m, torch.ones(3, 4, dtype=torch.long))
        >>> p.shape, bool(torch.allclose(p.sum(-1), torch.ones(2, 2, 4)))
        (torch.Size([2, 2, 4, 4]), True)
    """
    check_progress(progress)
    total = None
    with bar(_n_chunks(tokens, batch_size), "attention patterns", progress, unit="batch") as b:
        for _, patterns in _pattern_chunks(model, tokens, layers, batch_size, b):
            p = patterns.to(torch.float64).sum(0)
            total = p if total is None else total + p
    return (total / tokens.shape[0]).to(model.dtype)


@dataclass(frozen=True)
class HeadAnalysis:
    """Result of :func:`analyse_heads`.

    Attributes:
        mean_patterns: ``[layer, head, q, k]`` attention averaged over the samples.
        table: :func:`~tfmatcomp.analyses.heads.classify_heads` table (scores, ``type``, ``types``).
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
    progress: bool | None = None,
) -> HeadAnalysis:
    """Mean attention maps and classified head scores of ``model`` on samples of ``task``.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder`.
        task: a :class:`~tfmatcomp.MatrixCompletionTask` (samples drawn with
            :func:`~tfmatcomp.datapath.sample_batch`).
        n_samples: matrices to average over.
        observed: a structured mask (``[pos]``, shared by all samples, or ``[batch, pos]``) from
            :mod:`tfmatcomp.task.masks`; None for the task's random masks.
        generator: randomness for the samples (default a CPU ``manual_seed(0)`` generator); the
            batch is moved to the model's device.
        batch: an already sampled :class:`~tfmatcomp.MatrixBatch` to use instead of sampling.
        layers: 0-based layers (default all).
        batch_size: matrices per forward pass.
        masked_row_fraction, thresholds: see :func:`~tfmatcomp.analyses.heads.head_scores` /
            :func:`~tfmatcomp.analyses.heads.classify_heads`.
        progress: a bar over the forward passes (None: when watched; :mod:`tfmatcomp._progress`).

    Example:
        >>> import torch
        >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
        >>> from tfmatcomp.task.masks import row_mask
        >>> model = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9))
        >>> res = analyse_heads(model, MatrixCompletionTask(n_rows=3, rank=1), 4,
        ...                     observed=row_mask(3, masked_rows=[1], keep=0))
        >>> len(res.table), res.table["type"].iloc[0]
        (2, 'uniform')
    """
    check_progress(progress)
    if batch is None:
        batch = sample_batch(task, n_samples, generator=generator, observed=observed)
    if batch.n_rows * batch.n_cols > model.cfg.n_ctx:
        raise ValueError(f"task: {batch.n_rows}x{batch.n_cols} matrices need "
                         f"{batch.n_rows * batch.n_cols} positions, the model has n_ctx {model.cfg.n_ctx}")
    acc = HeadScoreAccumulator(batch.n_rows, batch.n_cols, masked_row_fraction)
    with bar(_n_chunks(batch, batch_size), "head scores", progress, unit="batch") as b:
        for chunk, patterns in _pattern_chunks(model, batch, layers, batch_size, b):
            acc.update(patterns, chunk.inputs.observed)
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
    progress: bool | None = None,
) -> pd.DataFrame:
    """Head scores and types of every checkpoint, on the same samples (seeded by ``seed``).

    Args:
        checkpoints: ``{step: HookedEncoder | path}``, a list of checkpoint paths or a run
            directory (see :func:`tfmatcomp.datapath.load_checkpoints`).
        task, n_samples, observed: the samples (random masks, or one structured mask).
        progress: a bar over the checkpoints (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        The :func:`~tfmatcomp.analyses.heads.classify_heads` table of each checkpoint with a leading
        ``step`` column.

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
        >>> cfg = EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9)
        >>> ev = head_score_evolution({0: HookedEncoder(cfg, seed=1), 10: HookedEncoder(cfg)},
        ...                           MatrixCompletionTask(n_rows=3, rank=1), n_samples=4)
        >>> ev[["step", "paper_label"]].values.tolist()
        [[0, '(1,1)'], [0, '(1,2)'], [10, '(1,1)'], [10, '(1,2)']]
    """
    check_progress(progress)
    models = load_checkpoints(checkpoints)
    batch = sample_batch(task, n_samples, seed=seed, observed=observed)
    frames = []
    for step, model in tracked(models.items(), "head scores over checkpoints", progress,
                               total=len(models), unit="checkpoint"):
        res = analyse_heads(model, task, batch=batch, batch_size=batch_size,
                            masked_row_fraction=masked_row_fraction, thresholds=thresholds)
        df = res.table.copy()
        df.insert(0, "step", step)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
