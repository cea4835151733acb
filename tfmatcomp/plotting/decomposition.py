"""Figures for the position / context decomposition (Song & Zhong Figs. 1-4).

* :func:`pos_pca_figure`: top-2 PCA of ``pos_t`` with sampled ``cvec`` (Fig. 1), per layer;
* :func:`gram_figure`: normalized Gram matrix of ``[pos; ctx]`` (Fig. 2);
* :func:`spectrum_figure`: singular values of ``pos``, ``cvec``, ``resid`` and the DCT coefficients
  of the positional Gram matrix (Fig. 3);
* :func:`qk_figure`: the four QK components, the scores and the pattern of one head (Fig. 4).

Layers and heads in titles are 0-based (code convention), and say so.

Example:
    >>> import torch
    >>> from tfmatcomp.decomposition import decompose
    >>> dec = decompose(torch.randn(16, 9, 6, generator=torch.Generator().manual_seed(0)))
    >>> fig = pos_pca_figure(dec, n_rows=3)
    >>> type(fig).__name__
    'Figure'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from tfmatcomp.decomposition import Decomposition
from tfmatcomp.geometry.fourier import gram_dct
from tfmatcomp.geometry.pca import pca
from tfmatcomp.geometry.qk import COMPONENTS, QKComponents
from tfmatcomp.geometry.similarity import normalized_gram
from tfmatcomp.validation import check_int_in_range

__all__ = ["pos_pca_figure", "gram_figure", "spectrum_figure", "qk_figure"]


def _as_list(decompositions) -> list[tuple[str, Decomposition]]:
    if isinstance(decompositions, Decomposition):
        return [(str(decompositions.name), decompositions)]
    if isinstance(decompositions, Mapping):
        items = list(decompositions.items())
    elif isinstance(decompositions, Sequence) and not isinstance(decompositions, str):
        items = [(str(getattr(d, "name", None) if getattr(d, "name", None) is not None else i), d)
                 for i, d in enumerate(decompositions)]
    else:
        raise ValueError(f"decompositions: expected a Decomposition, a list or a mapping of them, "
                         f"got {type(decompositions).__name__}")
    for name, d in items:
        if not isinstance(d, Decomposition):
            raise ValueError(f"decompositions[{name!r}]: expected a Decomposition, got {type(d).__name__}")
    return [(str(n), d) for n, d in items]


def _labels(t: Tensor, n_rows: int | None, n_cols: int | None) -> list[str]:
    if n_rows is None:
        return [f"t={int(i)}" for i in t]
    n_cols = n_cols or n_rows
    return [f"t={int(i)} (row {int(i) // n_cols}, col {int(i) % n_cols})" for i in t]


def pos_pca_figure(
    decompositions,
    *,
    n_cvec: int = 200,
    seed: int = 0,
    n_rows: int | None = None,
    n_cols: int | None = None,
    max_cols: int = 4,
    title: str | None = None,
) -> go.Figure:
    """Top-2 principal components of ``pos_t`` (blue) with sampled ``cvec_{c,t}`` (red), per layer.

    Each panel projects ``pos`` and up to ``n_cvec`` random ``cvec`` vectors (if the decomposition
    has residuals; sampled with ``seed``) on the top-2 principal directions of ``pos``. Darker colour =
    later position. With ``n_rows`` (matrix completion), hover text gives each position's (row, col).

    Args:
        decompositions: a :class:`Decomposition`, or a list / mapping of them (one panel each).
    """
    items = _as_list(decompositions)
    n = len(items)
    ncols = min(n, max_cols)
    nrows = math.ceil(n / ncols)
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[name for name, _ in items])
    gen = torch.Generator().manual_seed(seed)
    for i, (name, dec) in enumerate(items):
        r, c = i // ncols + 1, i % ncols + 1
        pos = dec.pos.detach().cpu().to(torch.float64)
        fit = pca(pos, min(2, *pos.shape))
        mean, dirs, ratio = fit.mean, fit.components, fit.explained_variance_ratio
        if dirs.shape[0] < 2:
            dirs = torch.cat([dirs, torch.zeros(1, pos.shape[1], dtype=dirs.dtype)])
        coords = (pos - mean) @ dirs.T
        t = torch.arange(dec.start, dec.start + pos.shape[0])
        if dec.resid is not None and dec.ctx is not None and n_cvec > 0:
            cvec = dec.cvec.detach().cpu().to(torch.float64)
            C, T, _ = cvec.shape
            valid = torch.ones(C, T, dtype=torch.bool) if dec.mask is None else dec.mask.cpu()
            idx = valid.reshape(-1).nonzero().squeeze(1)
            pick = idx[torch.randperm(idx.numel(), generator=gen)[:n_cvec]]
            cv = cvec.reshape(-1, cvec.shape[-1])[pick] @ dirs.T  # cvec is centered: no mean shift
            tc = (pick % T) + dec.start
            fig.add_trace(go.Scatter(
                x=cv[:, 0].numpy(), y=cv[:, 1].numpy(), mode="markers", name="cvec",
                legendgroup="cvec", showlegend=i == 0,
                marker=dict(size=4, color=tc.numpy(), colorscale="Reds", opacity=0.6),
                text=_labels(tc, n_rows, n_cols), hoverinfo="text"), row=r, col=c)
        fig.add_trace(go.Scatter(
            x=coords[:, 0].numpy(), y=coords[:, 1].numpy(), mode="markers+lines", name="pos",
            legendgroup="pos", showlegend=i == 0, line=dict(color="rgba(30,60,150,0.3)"),
            marker=dict(size=7, color=t.numpy(), colorscale="Blues", line=dict(width=0.5)),
            text=_labels(t, n_rows, n_cols), hoverinfo="text"), row=r, col=c)
        fig.update_xaxes(title_text=f"PC1 ({100 * float(ratio[0]):.0f}%)", row=r, col=c)
        if ratio.numel() > 1:
            fig.update_yaxes(title_text=f"PC2 ({100 * float(ratio[1]):.0f}%)", row=r, col=c)
    fig.update_layout(title=title or "Top-2 PCA of the positional basis (blue) and cvec samples (red)",
                      height=320 * nrows, width=max(420, 330 * ncols))
    return fig


def gram_figure(
    decomposition: Decomposition,
    labels: Tensor | Sequence[int] | None = None,
    *,
    max_contexts: int = 128,
    seed: int = 0,
    title: str | None = None,
) -> go.Figure:
    """Heatmap of the normalized Gram matrix of ``[pos; ctx]`` (cosines, Song & Zhong Fig. 2).

    Up to ``max_contexts`` contexts are drawn (a random subset, seeded), sorted by ``labels`` when
    given so that clusters appear as blocks. The first ``T`` rows / columns are positions.
    """
    pos = decomposition.pos.detach().cpu()
    ctx = decomposition.ctx
    n_ctx = 0
    if ctx is not None:
        ctx = ctx.detach().cpu()
        idx = torch.arange(ctx.shape[0])
        if ctx.shape[0] > max_contexts:
            idx = torch.randperm(ctx.shape[0], generator=torch.Generator().manual_seed(seed))[:max_contexts]
        if labels is not None:
            lab = torch.as_tensor(labels).cpu()
            if lab.shape[0] != ctx.shape[0]:
                raise ValueError(f"labels: expected {ctx.shape[0]} labels, got {lab.shape[0]}")
            idx = idx[torch.argsort(lab[idx], stable=True)]
        ctx = ctx[idx]
        n_ctx = ctx.shape[0]
    G = normalized_gram(pos, ctx).numpy()
    T = pos.shape[0]
    ticks = [f"pos {decomposition.start + i}" for i in range(T)] + [f"ctx {i}" for i in range(n_ctx)]
    fig = go.Figure(go.Heatmap(z=G, x=ticks, y=ticks, zmin=-1, zmax=1, colorscale="RdBu_r",
                               colorbar=dict(title="cos")))
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    if n_ctx:
        for kw in (dict(x0=T - 0.5, x1=T - 0.5, y0=-0.5, y1=T + n_ctx - 0.5),
                   dict(y0=T - 0.5, y1=T - 0.5, x0=-0.5, x1=T + n_ctx - 0.5)):
            fig.add_shape(type="line", line=dict(color="black", width=1), **kw)
    fig.update_layout(title=title or f"Normalized Gram matrix of [pos; ctx] ({decomposition.name})",
                      width=620, height=560)
    return fig


def _adjusted_singular_values(x: Tensor, n: int) -> Tensor:
    sv = torch.linalg.svdvals(x.detach().to(torch.float64).cpu())
    return sv[:n] / math.sqrt(x.shape[0])


def spectrum_figure(
    decomposition: Decomposition,
    *,
    n_values: int = 60,
    dct_k: int = 10,
    title: str | None = None,
) -> go.Figure:
    """Singular values of ``P``, ``Cvec``, ``R`` and the DCT of the positional Gram (Song & Zhong Fig. 3).

    Left: the top ``n_values`` singular values of the matrices whose rows are ``pos_t`` (``T``
    rows), ``cvec_{c,t}`` and ``resid_{c,t}`` (valid entries), each divided by the square root of its
    number of rows (the paper's "adjusted for dimensional difference": the RMS size per row, so a
    matrix of ``C`` copies of ``P`` has the same values as ``P``). ``cvec`` / ``resid`` need a
    second-pass decomposition. Right: ``|DCT-II|`` coefficients of the normalized positional Gram
    matrix, lowest ``dct_k x dct_k`` frequencies.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=["Singular values (per-row RMS)",
                                                        f"|DCT| of the positional Gram, first {dct_k}"])
    series = {"pos": decomposition.pos}
    if decomposition.resid is not None and decomposition.ctx is not None:
        d = decomposition.d_model
        valid = (decomposition.mask.reshape(-1) if decomposition.mask is not None
                 else torch.ones(decomposition.resid.shape[0] * decomposition.resid.shape[1],
                                 dtype=torch.bool, device=decomposition.resid.device))
        series["cvec"] = decomposition.cvec.reshape(-1, d)[valid]
        series["resid"] = decomposition.resid.reshape(-1, d)[valid]
    colors = {"pos": "royalblue", "cvec": "crimson", "resid": "gray"}
    for name, x in series.items():
        sv = _adjusted_singular_values(x, n_values)
        fig.add_trace(go.Scatter(x=list(range(1, sv.numel() + 1)), y=sv.numpy(), mode="lines+markers",
                                 name=name, line=dict(color=colors[name])), row=1, col=1)
    fig.update_xaxes(title_text="index", row=1, col=1)
    fig.update_yaxes(title_text="singular value / sqrt(rows)", row=1, col=1)
    coeffs = gram_dct(decomposition.pos).abs().cpu()
    k = min(dct_k, coeffs.shape[0])
    fig.add_trace(go.Heatmap(z=coeffs[:k, :k].numpy(), colorscale="Viridis", showscale=True,
                             colorbar=dict(x=1.02)), row=1, col=2)
    fig.update_yaxes(autorange="reversed", title_text="frequency", row=1, col=2)
    fig.update_xaxes(title_text="frequency", row=1, col=2)
    fig.update_layout(title=title or f"Spectral and Fourier analysis ({decomposition.name})",
                      width=1000, height=420)
    return fig


def qk_figure(
    components: QKComponents,
    head: int | None = None,
    *,
    batch_index: int = 0,
    title: str | None = None,
) -> go.Figure:
    """The four QK components, the scores and the attention pattern of one head (Song & Zhong Fig. 4).

    Args:
        components: from :func:`~tfmatcomp.geometry.qk_decomposition`.
        head: the 0-based head number (must be among ``components.heads``; default the first).
        batch_index: which input of the batch.
    """
    heads = list(components.heads) or list(range(components.pos_pos.shape[1]))
    head = heads[0] if head is None else head
    if head not in heads:
        raise ValueError(f"head: {head!r} is not among the decomposed heads {heads}")
    hi = heads.index(head)
    B = components.pos_pos.shape[0]
    check_int_in_range("batch_index", batch_index, 0, B - 1)
    panels = {name: getattr(components, name)[batch_index, hi] for name in COMPONENTS}
    panels["scores"] = (components.scores[batch_index, hi] if components.scores is not None
                        else components.total()[batch_index, hi])
    if components.pattern is not None:
        panels["pattern"] = components.pattern[batch_index, hi]
    names = {"pos_pos": "pos-pos", "pos_cvec": "pos-cvec", "cvec_pos": "cvec-pos",
             "cvec_cvec": "cvec-cvec", "scores": "QK (scores)", "pattern": "pattern"}
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[names[k] for k in panels],
                        horizontal_spacing=0.02)
    for j, (name, z) in enumerate(panels.items()):
        z = z.detach().cpu().to(torch.float64)
        z = torch.where(z < -1e30, torch.full_like(z, float("nan")), z)  # padded keys
        fig.add_trace(go.Heatmap(z=z.numpy(), colorscale="Viridis" if name == "pattern" else "RdBu_r",
                                 zmid=None if name == "pattern" else 0, showscale=False),
                      row=1, col=j + 1)
        fig.update_yaxes(autorange="reversed", showticklabels=j == 0, row=1, col=j + 1)
        fig.update_xaxes(title_text="key", row=1, col=j + 1)
    fig.update_yaxes(title_text="query", row=1, col=1)
    where = f"layer {components.layer}, head {head}" if components.layer is not None else f"head {head}"
    fig.update_layout(title=title or f"QK decomposition, {where} (0-based)",
                      width=220 * len(panels) + 80, height=330)
    return fig
