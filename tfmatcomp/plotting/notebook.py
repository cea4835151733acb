"""Plotly figures in notebooks that show as plots in JupyterLab, VS Code and static HTML, offline.

Plotly's default notebook output is only its own mimetype, ``application/vnd.plotly.v1+json``:
JupyterLab and VS Code draw it, but ``jupyter nbconvert --to html`` (and any viewer without
plotly's extension) shows nothing. :func:`notebook_mode` makes every figure carry two
representations in one output:

* ``application/vnd.plotly.v1+json`` (plotly's ``"plotly_mimetype"`` renderer), which JupyterLab
  (through the extension installed with plotly) and VS Code draw themselves;
* ``text/html``: a ``<div>`` and an inline ``Plotly.newPlot`` call (the renderer
  :data:`HTML_RENDERER` registered here), which static HTML shows.

plotly.js itself (about 4.8 MB) is written once, inline, as the output of the cell that calls
:func:`notebook_mode`, so later figures' HTML only references the global ``Plotly``: no CDN
script, and rerunning a figure's cell cannot lose it. Plotly's stock ``"notebook"`` renderer is not
used because each of its figures loads MathJax from a CDN and because it writes plotly.js into
whichever cell shows the first figure. Call it once, in the notebook's first code cell.

Example:
    >>> import plotly.io as pio
    >>> from tfmatcomp.plotting.notebook import notebook_mode, offline_figure_html
    >>> before = pio.renderers.default
    >>> notebook_mode()            # outside IPython nothing is displayed
    'plotly_mimetype+tfmatcomp_offline_html'
    >>> pio.renderers.default = before
"""

from __future__ import annotations

from typing import Any

import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer
from plotly.offline import get_plotlyjs

__all__ = ["HTML_RENDERER", "OfflineHtmlRenderer", "notebook_mode", "offline_figure_html",
           "plotlyjs_html"]

#: Name under which :class:`OfflineHtmlRenderer` is registered in ``plotly.io.renderers``.
HTML_RENDERER = "tfmatcomp_offline_html"


def offline_figure_html(fig: Any) -> str:
    """A figure as an HTML fragment that draws it with an already loaded global ``Plotly``.

    No ``<script src>`` (no plotly.js, no MathJax), so it needs no network; the page must load
    plotly.js before it (:func:`plotlyjs_html`).

    Example:
        >>> html = offline_figure_html({"data": [{"type": "scatter", "y": [3, 1]}]})
        >>> html.count("Plotly.newPlot"), "<script src" in html
        (1, False)
    """
    return pio.to_html(fig, include_plotlyjs=False, include_mathjax=False, full_html=False,
                       default_width="100%", default_height=525, validate=False)


def plotlyjs_html() -> str:
    """plotly.js, inline in a ``<script>`` element (it defines the global ``Plotly``).

    Example:
        >>> html = plotlyjs_html()
        >>> html.startswith("<script>") and "window.Plotly" in html
        True
    """
    return f"<script>{get_plotlyjs()}</script>"


class OfflineHtmlRenderer(MimetypeRenderer):
    """A plotly renderer whose ``text/html`` is :func:`offline_figure_html` of the figure.

    Example:
        >>> sorted(OfflineHtmlRenderer().to_mimebundle({"data": []}))
        ['text/html']
    """

    def to_mimebundle(self, fig_dict: dict) -> dict[str, str]:
        return {"text/html": offline_figure_html(fig_dict)}


def notebook_mode() -> str:
    """Show plotly figures as plotly's mimetype and as offline HTML; load plotly.js in this cell.

    Registers :class:`OfflineHtmlRenderer` as :data:`HTML_RENDERER`, sets
    ``plotly.io.renderers.default`` to ``"plotly_mimetype+" + HTML_RENDERER`` (both
    representations in every figure's output) and, when running in IPython (a notebook kernel),
    displays :func:`plotlyjs_html` as this cell's output. Returns the renderer string it set.

    Example:
        >>> import plotly.io as pio
        >>> before = pio.renderers.default
        >>> notebook_mode() == pio.renderers.default
        True
        >>> pio.renderers.default = before
    """
    pio.renderers[HTML_RENDERER] = OfflineHtmlRenderer()
    renderer = f"plotly_mimetype+{HTML_RENDERER}"
    pio.renderers.default = renderer
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:  # not in a notebook: nothing to load plotly.js into
        return renderer
    if get_ipython() is not None:
        display(HTML(plotlyjs_html()))
    return renderer
