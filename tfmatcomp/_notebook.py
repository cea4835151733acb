"""Plotly figures in notebooks that show as plots in JupyterLab, VS Code and static HTML, offline,
with no setup call.

Plotly's default notebook output is only its own mimetype, ``application/vnd.plotly.v1+json``:
JupyterLab and VS Code draw it, but ``jupyter nbconvert --to html`` (and any viewer without
plotly's extension) shows nothing. So importing :mod:`tfmatcomp` or :mod:`tfmatcomp.plotting` in
a notebook kernel whose plotly renderer is still plotly's own choice (no ``PLOTLY_RENDERER``, not
Colab / Kaggle / Databricks) switches it (:func:`auto_mode`): every figure then carries two
representations in one output:

* ``application/vnd.plotly.v1+json`` (plotly's ``"plotly_mimetype"`` renderer), which JupyterLab
  (through the extension installed with plotly) and VS Code draw themselves;
* ``text/html``: a ``<div>`` and an inline ``Plotly.newPlot`` call (the renderer
  :data:`HTML_RENDERER` registered here), which static HTML shows.

plotly.js itself (about 4.8 MB) is written once, inline, before the first figure shown in the
kernel, and again whenever the cell that showed it runs again (its old output, and plotly.js
with it, is then replaced): no CDN script, so the HTML works offline. Plotly's stock
``"notebook"`` renderer is not used because each of its figures loads MathJax from a CDN.
:func:`notebook_mode` does the same on request and loads plotly.js in the cell that calls it;
it is no longer needed.

Example:
    >>> import plotly.io as pio
    >>> from tfmatcomp._notebook import notebook_mode, offline_figure_html
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

__all__ = ["HTML_RENDERER", "OfflineHtmlRenderer", "notebook_mode", "auto_mode",
           "offline_figure_html", "plotlyjs_html"]

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


def _current_cell() -> tuple[str | None, int | None]:
    """(the running cell's id, or its source where the front end sends no id; its execution
    count), from the kernel's current request; (None, None) outside a kernel."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        parent = shell.kernel.get_parent() if shell is not None and hasattr(shell, "kernel") else {}
    except Exception:  # no kernel, or an IPython without get_parent
        return None, None
    parent = parent or {}
    cell = (parent.get("metadata") or {}).get("cellId") or (parent.get("content") or {}).get("code")
    return cell, getattr(shell, "execution_count", None)


class OfflineHtmlRenderer(MimetypeRenderer):
    """A plotly renderer whose ``text/html`` is :func:`offline_figure_html` of the figure, with
    plotly.js inline before the first figure it shows and again whenever that figure's cell runs
    again (so the page always holds plotly.js once, before every figure).

    Example:
        >>> r = OfflineHtmlRenderer()
        >>> sorted(r.to_mimebundle({"data": []}))
        ['text/html']
        >>> "window.Plotly" in r.to_mimebundle({"data": []})["text/html"]   # first figure only
        False
    """

    def __init__(self) -> None:
        # plotly renders with a shallow copy of the renderer: the state lives in a shared dict.
        #: ``"at"``: (cell, execution count) of the output that carries plotly.js; None before any
        self.state: dict[str, tuple[str | None, int | None] | None] = {"at": None}

    def to_mimebundle(self, fig_dict: dict) -> dict[str, str]:
        html = offline_figure_html(fig_dict)
        cell, count = _current_cell()
        at = self.state["at"]
        if at is None or (cell is not None and cell == at[0] and count != at[1]):
            html = plotlyjs_html() + html
            self.state["at"] = (cell, count)
        return {"text/html": html}


#: plotly's own default renderers in a Jupyter kernel, which :func:`auto_mode` replaces
PLOTLY_NOTEBOOK_DEFAULTS = ("plotly_mimetype", "plotly_mimetype+notebook", "vscode", "notebook",
                            "notebook_connected", "jupyterlab", "nteract")


def auto_mode() -> bool:
    """In a notebook kernel whose plotly renderer is plotly's own default, switch to figures
    that also show in static HTML (the module docstring); elsewhere do nothing. Returns whether
    the library's renderer is now the default. Called on import of :mod:`tfmatcomp` and
    :mod:`tfmatcomp.plotting`.

    Example:
        >>> auto_mode()      # not in a notebook kernel: plotly's renderer is left alone
        False
    """
    import os

    from tfmatcomp._progress import in_notebook

    renderer = f"plotly_mimetype+{HTML_RENDERER}"
    if pio.renderers.default == renderer:
        return True
    if not in_notebook() or os.environ.get("PLOTLY_RENDERER"):
        return False
    if pio.renderers.default not in PLOTLY_NOTEBOOK_DEFAULTS:
        return False   # chosen by the user, or an environment plotly knows better (Colab, ...)
    if HTML_RENDERER not in pio.renderers:
        pio.renderers[HTML_RENDERER] = OfflineHtmlRenderer()
    pio.renderers.default = renderer
    return True


def notebook_mode() -> str:
    """Show plotly figures as plotly's mimetype and as offline HTML; load plotly.js in this cell.

    Not needed in a notebook (:func:`auto_mode` does it on import); it also sets the renderer
    where plotly's default was changed, and loads plotly.js in the cell that calls it.

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
    ours = OfflineHtmlRenderer()
    pio.renderers[HTML_RENDERER] = ours
    renderer = f"plotly_mimetype+{HTML_RENDERER}"
    pio.renderers.default = renderer
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:  # not in a notebook: nothing to load plotly.js into
        return renderer
    if get_ipython() is not None:
        display(HTML(plotlyjs_html()))
        ours.state["at"] = _current_cell()
    return renderer
