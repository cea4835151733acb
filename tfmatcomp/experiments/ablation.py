"""Attention-ablation experiments: all heads or any group, the papers' head groups, a per-head scan.

All use :class:`~tfmatcomp.interventions.UniformAttentionAblation` (the papers' 1/n^2 patterns) by
default, or :class:`~tfmatcomp.interventions.MeanAttentionAblation` (the batch-mean variant the
papers' code ran) with ``variant="mean"``; conditions are compared on the same seeded batch. Heads are
0-based in code; tables also give the papers' 1-based label (column ``heads_paper``).

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments import attention_ablation
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> attention_ablation(model, "tiny", n_samples=8)[["condition", "heads"]].values.tolist()
    [['baseline', 'all'], ['ablated', 'all']]
"""

from __future__ import annotations

from typing import Any, Iterator, Literal, Mapping

import pandas as pd

from tfmatcomp.datapath import ModelsLike, TaskLike, predict, resolve_models, sample_batch
from tfmatcomp.experiments.reference import (PAPER_ABLATION_ALL, PAPER_HEAD_GROUP_VALUES,
                                             PAPER_HEAD_GROUPS, POST)
from tfmatcomp.experiments.table import experiment_table, loss_row, papers
from tfmatcomp._progress import bar, check_progress
from tfmatcomp.interventions import (MeanAttentionAblation, UniformAttentionAblation, paper_heads,
                                     paper_label, resolve_heads, to_json)
from tfmatcomp.interventions.sites import HeadSpec
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.metrics import losses

__all__ = ["attention_ablation", "head_group_ablation", "head_ablation_scan"]

Variant = Literal["uniform", "mean"]
_NAN = float("nan")


def _ablation(heads, variant: Variant):
    if variant == "uniform":
        return UniformAttentionAblation(heads)
    if variant == "mean":
        return MeanAttentionAblation(heads)
    raise ValueError(f"variant: must be 'uniform' (the papers' 1/n^2) or 'mean' (batch mean, the "
                     f"papers' code), got {variant!r}")


def _seeded_batches(named: Mapping[str, Any], task, n_samples: int, seed: int
                    ) -> Iterator[tuple[str, Any, MatrixBatch]]:
    """``(label, model, batch)`` for each of the resolved ``named`` models: the same seeded batch
    of ``task`` on the model's device, which every condition is compared on."""
    for label, model in named.items():
        yield label, model, sample_batch(task, n_samples, seed, model.device)


def _heads_text(heads) -> str:
    return "all" if heads == "all" else paper_label(heads)


def attention_ablation(
    models: ModelsLike,
    task: TaskLike = None,
    *,
    heads: HeadSpec = "all",
    variant: Variant = "uniform",
    n_samples: int = 256,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool | None = None,
) -> pd.DataFrame:
    """``L``, ``L_obs``, ``L_mask`` with and without ablating ``heads`` (the workshop paper Sections 3.1.2, 3.2.1).

    Args:
        models, task, n_samples, seed, batch_size: the experiments' common arguments
            (:mod:`tfmatcomp.experiments`).
        heads: ``"all"`` or 0-based ``(layer, head)`` pairs (``paper_heads("(4,3)")`` converts).
        variant: ``"uniform"`` (papers' text) or ``"mean"`` (papers' code).
        progress: a bar over the conditions (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        Rows per (model, condition): ``model``, ``heads`` (``"all"`` or the papers' 1-based label),
        ``variant``, ``condition`` (``"baseline"`` / ``"ablated"``), ``L``, ``L_obs``, ``L_mask``,
        and ``paper_4l8h_L_obs``, ``paper_4l8h_L_mask`` for the papers' model labelled
        ``"pre-shift"`` / ``"post-shift"`` (all heads, uniform). ``df.attrs["interventions"]``
        holds each row's ablation as JSON (:func:`~tfmatcomp.experiments.with_interventions`).

    Example:
        >>> import tfmatcomp as tm
        >>> df = attention_ablation({"post-shift": tm.HookedEncoder(tm.get_preset("tiny").model)},
        ...                         "tiny", n_samples=8)
        >>> df["condition"].tolist(), "paper_4l8h_L_mask" in df   # not the papers' model
        (['baseline', 'ablated'], False)
    """
    check_progress(progress)
    named, task = resolve_models(models, task)
    rows = []
    with bar(2 * len(named), "attention ablation", progress) as b:
        for label, model, batch in _seeded_batches(named, task, n_samples, seed):
            chosen = "all" if heads == "all" else resolve_heads(model.cfg.n_layers, model.cfg.n_heads, heads)
            abl = _ablation(chosen, variant)
            paper = papers(PAPER_ABLATION_ALL, label, model) if (
                chosen == "all" and variant == "uniform") else {}
            for condition, iv in (("baseline", None), ("ablated", abl)):
                rows.append({"model": label, "heads": _heads_text(chosen), "variant": variant,
                             "condition": condition,
                             **loss_row(model, batch, iv, batch_size, paper.get(condition))})
                b.update()
    return experiment_table(rows, experiment="attention ablation", n_samples=n_samples, seed=seed,
                            heads_convention="papers' 1-based labels")


def _groups(groups, n_layers: int, n_heads: int) -> dict[str, list[tuple[int, int]]]:
    if isinstance(groups, str):
        if groups == "paper":
            spec: Mapping = PAPER_HEAD_GROUPS
        elif groups == "layers":
            return {f"layer {l + 1} (all heads)": [(l, h) for h in range(n_heads)]
                    for l in range(n_layers)}
        else:
            raise ValueError(f"groups: must be 'paper', 'layers' or a mapping name -> heads, got {groups!r}")
    elif isinstance(groups, Mapping):
        spec = groups
    else:
        raise ValueError(f"groups: must be 'paper', 'layers' or a mapping name -> heads, got "
                         f"{type(groups).__name__}")
    out = {}
    for name, heads in spec.items():
        pairs = paper_heads(heads) if isinstance(heads, str) and heads != "all" else heads
        try:
            out[str(name)] = resolve_heads(n_layers, n_heads, pairs)
        except ValueError as e:
            hint = (" (the papers' groups need a 4-layer, 8-head model; use groups='layers' or your "
                    "own mapping)" if groups == "paper" else "")
            raise ValueError(f"groups: group {name!r}: {e}{hint}") from None
    return out


def head_group_ablation(
    models: ModelsLike,
    task: TaskLike = None,
    *,
    groups: str | Mapping[str, str | HeadSpec] = "paper",
    variant: Variant = "uniform",
    n_samples: int = 256,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Ablate each group of heads on its own; losses without / with and their ratio (the NeurIPS paper App. L).

    Args:
        models, task, n_samples, seed, batch_size: the experiments' common arguments
            (:mod:`tfmatcomp.experiments`).
        groups: ``"paper"`` (the papers' groups, :data:`~tfmatcomp.experiments.reference.PAPER_HEAD_GROUPS`,
            4-layer 8-head models only), ``"layers"`` (one group per layer), or a mapping from a name
            to heads: a string in the papers' 1-based notation (``"(2,2-4), (2,6)"``), ``"all"``, or
            0-based ``(layer, head)`` pairs. For groups from the model's own head labels (any
            shape) see :func:`tfmatcomp.analyses.heads.label_group_ablation`, which builds such a
            mapping and calls this function.
        variant: ``"uniform"`` or ``"mean"``.
        progress: a bar over the groups (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        One row per (model, group): ``model``, ``group``, ``heads_paper`` (1-based label), ``heads``
        (0-based pairs), ``L_without``, ``L_with``, ``L_obs_without``, ``L_obs_with``,
        ``L_mask_without``, ``L_mask_with``, ``ratio_L``, ``ratio_L_obs``, ``ratio_L_mask`` (with /
        without), ``paper_4l8h_*`` columns where the paper reports the group (the papers' model,
        post-shift). ``df.attrs["interventions"]``: each group's ablation as JSON (the
        ``_without`` values are the plain model).

    Example:
        >>> import tfmatcomp as tm
        >>> df = head_group_ablation(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny",
        ...                          groups={"first": "(1,1-2)", "second": [(1, 3)]}, n_samples=8)
        >>> df[["group", "heads_paper"]].values.tolist()
        [['first', '(1,1-2)'], ['second', '(2,4)']]
    """
    check_progress(progress)
    named, task = resolve_models(models, task)
    specs = {label: _groups(groups, m.cfg.n_layers, m.cfg.n_heads) for label, m in named.items()}
    rows = []
    with bar(sum(len(s) + 1 for s in specs.values()), "head-group ablation", progress) as b:
        for label, model, batch in _seeded_batches(named, task, n_samples, seed):
            _group_rows(rows, label, model, batch, specs[label], groups, variant, batch_size, b)
    return experiment_table(rows, experiment="head-group ablation", variant=variant,
                            n_samples=n_samples, seed=seed,
                            heads_convention="heads: 0-based (layer, head); heads_paper: papers' 1-based")


def _group_rows(rows, label, model, batch, spec, groups, variant, batch_size, b) -> None:
    """Append one row per group of ``spec`` for one model to ``rows``, moving the bar ``b``."""
    base = losses(predict(model, batch, None, batch_size), batch, as_floats=True)
    b.update()
    for name, heads in spec.items():
        iv = _ablation(heads, variant)
        with_ = losses(predict(model, batch, iv, batch_size), batch, as_floats=True)
        row = {"model": label, "group": name, "heads_paper": paper_label(heads), "heads": heads}
        for k in ("L", "L_obs", "L_mask"):
            row[f"{k}_without"], row[f"{k}_with"] = base[k], with_[k]
        for k in ("L", "L_obs", "L_mask"):
            row[f"ratio_{k}"] = with_[k] / base[k] if base[k] else _NAN
        paper = papers(PAPER_HEAD_GROUP_VALUES, name, model) if (
            label == POST and variant == "uniform" and groups == "paper") else {}
        for k in ("L_obs_without", "L_obs_with", "L_mask_without", "L_mask_with"):
            row[f"paper_4l8h_{k}"] = paper.get(k, _NAN)
        row["intervention"] = to_json(iv)
        rows.append(row)
        b.update()


def head_ablation_scan(
    models: ModelsLike,
    task: TaskLike = None,
    *,
    metric: Literal["L", "L_obs", "L_mask"] = "L_mask",
    variant: Variant = "uniform",
    n_samples: int = 256,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Ablate every head alone; the change in ``metric`` (ablated minus baseline) as a layers x heads table.

    Args:
        models, task, n_samples, seed, batch_size: the experiments' common arguments
            (:mod:`tfmatcomp.experiments`). A mapping of models gives a table with a
            ``(model, layer)`` index.
        metric: ``"L_mask"`` (default), ``"L_obs"`` or ``"L"``.
        variant: ``"uniform"`` or ``"mean"``.
        progress: a bar over the heads (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        A DataFrame with index ``layer`` and columns ``head``, both **0-based**; ``df.attrs`` holds
        ``baseline`` (the unablated metric, per model when several), ``metric``, the convention and
        ``interventions``: ``{(layer, head): JSON of the ablation that gave that cell}``.
        :func:`tfmatcomp.plotting.experiments.head_scan_heatmap` draws it with 1-based labels.

    Example:
        >>> import tfmatcomp as tm
        >>> scan = head_ablation_scan(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=8)
        >>> scan.shape, scan.index.name, scan.columns.name
        ((2, 4), 'layer', 'head')
    """
    if metric not in ("L", "L_obs", "L_mask"):
        raise ValueError(f"metric: must be 'L', 'L_obs' or 'L_mask', got {metric!r}")
    check_progress(progress)
    named, task = resolve_models(models, task)
    tables, baselines, cells = {}, {}, {}
    total = sum(1 + m.cfg.n_layers * m.cfg.n_heads for m in named.values())
    with bar(total, "head ablation scan", progress) as b:
        for label, model, batch in _seeded_batches(named, task, n_samples, seed):
            base = losses(predict(model, batch, None, batch_size), batch, as_floats=True)[metric]
            b.update()
            grid = []
            for l in range(model.cfg.n_layers):
                row = []
                for h in range(model.cfg.n_heads):
                    iv = _ablation([(l, h)], variant)
                    row.append(losses(predict(model, batch, iv, batch_size), batch,
                                      as_floats=True)[metric] - base)
                    cells[(l, h)] = to_json(iv)
                    b.update()
                grid.append(row)
            table = pd.DataFrame(grid)
            table.index.name, table.columns.name = "layer", "head"
            tables[label], baselines[label] = table, base
    if isinstance(models, Mapping):
        df = pd.concat(tables, names=["model"])
        df.attrs["baseline"] = baselines
    else:
        df = next(iter(tables.values()))
        df.attrs["baseline"] = next(iter(baselines.values()))
    df.attrs["interventions"] = cells
    df.attrs.update(experiment="per-head ablation scan", metric=metric, variant=variant,
                    value=f"{metric}(head ablated) - {metric}(baseline)", n_samples=n_samples,
                    seed=seed, convention="layer and head are 0-based")
    return df
