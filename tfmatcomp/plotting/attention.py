"""One matrix's attention in one call: every head of every layer, labelled by row, column and value.

``attention_view(cache, batch, i)`` reads ``blocks.{l}.attn.hook_pattern`` from a cache
(``model.run_with_cache(batch.tokens)``), takes matrix ``i`` of ``batch`` and draws a grid of
layers x heads, query on the y axis and key on the x axis, labelled with
:meth:`~tfmatcomp.MatrixBatch.to_str_tokens` (``"(row,col)=0.44"``; masked entries read
``"(row,col)=MASK"`` and are bold on the axes). The figure is at most 1,200 px wide.
``backend="circuitsvis"`` gives circuitsvis's interactive ``attention_heads`` view of the same
heads instead (``pip install "tfmatcomp[notebook]"``), with bidirectional attention.

Example:
    >>> import torch, tfmatcomp as tm
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> batch = tm.get_preset("tiny").task.build().sample(2, generator=torch.Generator().manual_seed(0))
    >>> _, cache = model.run_with_cache(batch.tokens)
    >>> fig = attention_view(cache, batch, 1)
    >>> len(fig.data), fig.layout.width <= 1200
    (8, True)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from tfmatcomp.task.data import MatrixBatch

__all__ = ["attention_view", "MAX_WIDTH"]

#: the widest figure drawn, in pixels
MAX_WIDTH = 1200
_PATTERN = re.compile(r"^blocks\.(\d+)\.attn\.hook_pattern$")


def _patterns(cache: Any, i: int, layers: Sequence[int] | None) -> dict[int, torch.Tensor]:
    """``{layer: [head, query, key]}`` of matrix ``i`` from ``cache``."""
    keys = list(cache.keys()) if hasattr(cache, "keys") else []
    found = sorted(int(m.group(1)) for k in keys if (m := _PATTERN.match(str(k))))
    if not found:
        raise ValueError("cache: holds no blocks.{l}.attn.hook_pattern; run "
                         "model.run_with_cache(batch.tokens) (or cache those names)")
    chosen = found if layers is None else [int(l) for l in layers]
    missing = [l for l in chosen if l not in found]
    if missing:
        raise ValueError(f"layers: {missing} are not in the cache, which has layers {found}")
    out = {}
    for l in chosen:
        p = cache[f"blocks.{l}.attn.hook_pattern"]
        if p.ndim != 4:
            raise ValueError(f"cache: blocks.{l}.attn.hook_pattern has shape {tuple(p.shape)}, "
                             "expected [batch, head, query, key]")
        if not -p.shape[0] <= i < p.shape[0]:
            raise ValueError(f"i: {i} is outside the cached batch of {p.shape[0]}")
        out[l] = p[i].detach().float().cpu()
    return out


def _labels(batch: MatrixBatch, i: int, n_pos: int) -> list[str]:
    labels = batch.to_str_tokens(i)
    P = len(labels)
    if n_pos == P:
        return labels
    # a decoder's sequence: the prompt, SEP, then the values it writes (task/gpt.py)
    extra = ["SEP"] + [f"{lab.split('=')[0]} out" for lab in labels]
    return (labels + extra)[:n_pos] + [f"pos {k}" for k in range(P + len(extra), n_pos)]


def attention_view(
    cache: Mapping[str, torch.Tensor] | Any,
    batch: MatrixBatch,
    i: int = 0,
    *,
    layers: Sequence[int] | None = None,
    backend: str = "plotly",
    zmax: float | None = None,
) -> Any:
    """Every head's attention on matrix ``i`` of ``batch``, labelled (module docstring).

    Args:
        cache: from ``model.run_with_cache(batch.tokens)`` (an ActivationCache or a dict holding
            ``blocks.{l}.attn.hook_pattern``, ``[batch, head, query, key]``).
        batch: the :class:`~tfmatcomp.MatrixBatch` the cache was run on.
        i: which matrix of the batch.
        layers: 0-based layers to draw (default: every layer in the cache).
        backend: ``"plotly"`` (a figure, at most 1,200 px wide) or ``"circuitsvis"``
            (circuitsvis's ``attention_heads``; needs the ``notebook`` extra).
        zmax: the colour scale's top (default: the largest probability shown).

    Returns:
        A plotly Figure, or circuitsvis's rendered view.

    Raises:
        ValueError: naming the argument: no patterns in the cache, a layer or index outside it,
            an unknown backend.
        ImportError: ``backend="circuitsvis"`` without circuitsvis installed.
    """
    if not isinstance(batch, MatrixBatch):
        raise ValueError(f"batch: expected the MatrixBatch the cache was run on, got "
                         f"{type(batch).__name__}")
    if isinstance(i, bool) or not isinstance(i, int) or not -batch.batch_size <= i < batch.batch_size:
        raise ValueError(f"i: must be an integer matrix index in [0, {batch.batch_size}), got {i!r}")
    if backend not in ("plotly", "circuitsvis"):
        raise ValueError(f"backend: must be 'plotly' or 'circuitsvis', got {backend!r}")
    pats = _patterns(cache, i, layers)
    n_pos = next(iter(pats.values())).shape[-1]
    labels = _labels(batch, i, n_pos)
    if backend == "circuitsvis":
        try:
            import circuitsvis as cv
        except ImportError as e:
            raise ImportError('backend="circuitsvis" needs circuitsvis: pip install '
                              '"tfmatcomp[notebook]"') from e
        stacked = torch.cat([p for p in pats.values()], dim=0)
        names = [f"L{l + 1}H{h + 1}" for l, p in pats.items() for h in range(p.shape[0])]
        return cv.attention.attention_heads(attention=stacked, tokens=labels,
                                            attention_head_names=names, mask_upper_tri=False)
    return _figure(pats, labels, zmax)


def _figure(pats: dict[int, torch.Tensor], labels: list[str], zmax: float | None) -> go.Figure:
    layer_ids = list(pats)
    n_heads = next(iter(pats.values())).shape[0]
    n_pos = len(labels)
    margin_l, margin_r = 110, 20
    panel = max(60, min(260, (MAX_WIDTH - margin_l - margin_r) // n_heads - 10))
    show_ticks = panel / n_pos >= 9   # room for a readable label per position
    bold = ["<b>" + t + "</b>" if t.endswith("MASK") else t for t in labels]
    titles = [f"L{l + 1} H{h + 1}" for l in layer_ids for h in range(n_heads)]
    fig = make_subplots(rows=len(layer_ids), cols=n_heads, subplot_titles=titles,
                        horizontal_spacing=min(0.02, 1 / max(n_heads, 2) / 4),
                        vertical_spacing=min(0.06, 1 / max(len(layer_ids), 2) / 3))
    top = float(max(p.max() for p in pats.values())) if zmax is None else float(zmax)
    hover = [[f"query {labels[q]}<br>key {labels[k]}" for k in range(n_pos)] for q in range(n_pos)]
    for r, l in enumerate(layer_ids):
        for h in range(n_heads):
            fig.add_trace(go.Heatmap(
                z=pats[l][h].numpy(), x=list(range(n_pos)), y=list(range(n_pos)), zmin=0, zmax=top,
                colorscale="Blues", showscale=(r == 0 and h == n_heads - 1), text=hover,
                hovertemplate="%{text}<br>attention %{z:.3f}<extra>" + f"L{l + 1} H{h + 1}</extra>",
                colorbar=dict(title="attention", len=0.5, thickness=10)), row=r + 1, col=h + 1)
            axis = dict(tickmode="array", tickvals=list(range(n_pos)), ticktext=bold,
                        tickfont=dict(size=8))
            fig.update_xaxes(**axis, row=r + 1, col=h + 1, tickangle=-90,
                             showticklabels=show_ticks and r == len(layer_ids) - 1)
            fig.update_yaxes(**axis, row=r + 1, col=h + 1, autorange="reversed",
                             showticklabels=show_ticks and h == 0)
    width = min(MAX_WIDTH, margin_l + margin_r + n_heads * (panel + 10))
    fig.update_layout(width=width, height=80 + len(layer_ids) * (panel + 40),
                      margin=dict(l=margin_l if show_ticks else 40, r=margin_r, t=60, b=40),
                      title=dict(text="Attention of one matrix: query (y) to key (x); bold: MASK"
                                 + ("" if show_ticks else "; hover for labels"), font=dict(size=13)))
    fig.update_annotations(font_size=10)
    return fig
