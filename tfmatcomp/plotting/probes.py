"""Figure for probe tables (the NeurIPS paper Fig. 6 / the workshop paper Fig. 11): probe quality per layer.

Layer ``0`` is the embedding output and layer ``l`` the output of the ``l``-th block, i.e. the
papers' 1-based "layer l" (see :mod:`tfmatcomp.analyses.probes`).

Example:
    >>> import pandas as pd
    >>> t = pd.DataFrame({"layer": [0, 1], "masked_row_mse": [0.2, 0.1], "masked_row_cos": [0.5, 0.9]})
    >>> [a.text for a in probe_table_figure(t).layout.annotations]
    ['MSE (test)', 'mean |cosine| (test)']
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["probe_table_figure"]

_PANELS = (("_mse", "MSE (test)"), ("_cos", "mean |cosine| (test)"), ("_corr", "Pearson r (test)"))


def probe_table_figure(table: pd.DataFrame, *, log_mse: bool = True, title: str | None = None) -> go.Figure:
    """Probe metrics against layer: one panel for MSEs, one for mean |cosine|, one for value
    correlations (panels without columns are left out); one line per probe target.

    Args:
        table: output of :func:`~tfmatcomp.analyses.probes.probe_layers` (needs ``layer``).
        log_mse: log-scale y axis for the MSE panel.

    Example:
        >>> import pandas as pd
        >>> t = pd.DataFrame({"layer": [0, 1], "value_masked_mse": [0.2, 0.1],
        ...                   "value_masked_corr": [0.1, 0.7]})
        >>> [d.name for d in probe_table_figure(t).data]
        ['value_masked', 'value_masked']
    """
    if "layer" not in table:
        raise ValueError("table: needs a 'layer' column; pass probe_layers(...) output")
    panels = [(suffix, name, [c for c in table.columns if c.endswith(suffix)]) for suffix, name in _PANELS]
    panels = [p for p in panels if p[2]]
    if not panels:
        raise ValueError("table: no *_mse, *_cos or *_corr columns to plot")
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[1] for p in panels])
    colors = {}
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    df = table.sort_values("layer")
    for i, (suffix, _, cols) in enumerate(panels):
        for c in cols:
            target = c[: -len(suffix)]
            color = colors.setdefault(target, palette[len(colors) % len(palette)])
            fig.add_trace(go.Scatter(x=df["layer"], y=df[c], mode="lines+markers", name=target,
                                     legendgroup=target, showlegend=target not in
                                     {t.name for t in fig.data}, line=dict(color=color)),
                          row=1, col=i + 1)
        fig.update_xaxes(title_text="layer (0 = embeddings, l = after block l)", dtick=1, row=1, col=i + 1)
        if suffix == "_mse" and log_mse:
            fig.update_yaxes(type="log", row=1, col=i + 1)
    fig.update_layout(title=title or "Linear probes per layer", width=380 * len(panels) + 120, height=420)
    return fig
