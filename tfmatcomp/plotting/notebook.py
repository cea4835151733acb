"""Figures in notebooks that show in JupyterLab, VS Code and static HTML, offline, with no setup
call: the renderer lives in :mod:`tfmatcomp._notebook` (it needs only plotly, so
``import tfmatcomp`` can switch it on in a kernel without loading torch); this module is its
public name.

Example:
    >>> from tfmatcomp.plotting.notebook import auto_mode
    >>> auto_mode()      # outside a notebook kernel nothing changes
    False
"""

from tfmatcomp._notebook import (HTML_RENDERER, PLOTLY_NOTEBOOK_DEFAULTS, OfflineHtmlRenderer,
                                 auto_mode, notebook_mode, offline_figure_html, plotlyjs_html)

__all__ = ["HTML_RENDERER", "PLOTLY_NOTEBOOK_DEFAULTS", "OfflineHtmlRenderer", "notebook_mode",
           "auto_mode", "offline_figure_html", "plotlyjs_html"]
