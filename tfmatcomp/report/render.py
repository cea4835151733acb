"""The report as one self-contained HTML page (plotly.js embedded once, tables as HTML).

Example:
    >>> from tfmatcomp.report.render import table_html
    >>> import pandas as pd
    >>> table_html(pd.DataFrame({"a": [0.123456]})).count("0.1235")
    1
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections import Section

__all__ = ["render", "page", "table_html"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222} h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:2em} p.what{max-width:60em;line-height:1.45} table.df{border-collapse:collapse;font-size:13px;
margin:1em 0;display:block;overflow-x:auto} table.df td,table.df th{border:1px solid #ddd;padding:3px 6px;
text-align:right} table.df th{background:#f5f5f5} .error{background:#fee;border:1px solid #c00;padding:1em;
white-space:pre-wrap;font-family:monospace;font-size:12px} .meta{color:#555;font-size:14px}
.verdict{font-size:16px;padding:.6em 1em;border-left:4px solid #6A9F58;background:#f4f9f2}
.verdict.none{border-color:#D1615D;background:#fbf1f0} nav ol{columns:2}
"""


def table_html(df: pd.DataFrame) -> str:
    """A DataFrame as an HTML table (4 significant digits)."""
    return df.to_html(classes="df", index=False, float_format=lambda x: f"{x:.4g}", na_rep="",
                      border=0)


def _verdict(ctx: RunContext) -> str:
    """The one-line answer at the top: did this run show the papers' drop?"""
    if ctx.drop is None:
        return "<p class='verdict none'>This run has no metrics log long enough to look for a drop.</p>"
    d = ctx.drop
    if d.has_drop:
        return (f"<p class='verdict'>Sudden drop detected: L_mask fell {d.drop_factor:.1f}x, from "
                f"{d.plateau_level:.3g} to {d.final_level:.3g}, between steps {d.drop_start:,.0f} "
                f"and {d.drop_end:,.0f}.</p>")
    return ("<p class='verdict none'>No sudden drop was detected in this run; see the first "
            "section for what that means and what to do.</p>")


def page(title: str, header: str, sections: Sequence[Section]) -> str:
    """A self-contained page: ``title``, ``header`` HTML, a table of contents and the sections."""
    first_figure = True
    body = []
    for s in sections:
        parts = [f'<h2 id="{s.key}">{html.escape(s.title)}</h2>',
                 f'<p class="what">{html.escape(s.text)}</p>']
        if s.error:
            parts.append(f'<div class="error">This section failed:\n{html.escape(s.error)}</div>')
        for item in s.items:
            if isinstance(item, go.Figure):
                parts.append(item.to_html(full_html=False, include_plotlyjs=first_figure,
                                          config={"displaylogo": False}))
                first_figure = False
            elif isinstance(item, pd.DataFrame):
                parts.append(table_html(item))
            else:
                parts.append(f"<p>{html.escape(str(item))}</p>")
        parts.append(f'<p class="meta">computed in {s.seconds:.1f} s</p>')
        body.append("\n".join(parts))
    toc = "".join(f'<li><a href="#{s.key}">{html.escape(s.title)}</a></li>' for s in sections)
    t = html.escape(title)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{t}</title>"
            f"<style>{_CSS}</style></head><body><h1>{t}</h1>{header}"
            f"<nav><ol>{toc}</ol></nav>{''.join(body)}</body></html>")


def render(ctx: RunContext, sections: Sequence[Section], seconds: float) -> str:
    """The HTML page of a report."""
    cfg, tcfg = ctx.post.cfg, ctx.task
    seed = f" (seed {ctx.run_seed})" if ctx.run_seed is not None else ""
    meta = (f"run <code>{html.escape(str(ctx.run_dir))}</code>{seed}; model {cfg.n_layers} layers x "
            f"{cfg.n_heads} heads x d_model {cfg.d_model}; task {tcfg.n_rows}x{tcfg.n_cols} rank "
            f"{tcfg.rank}, p_mask {tcfg.p_mask}; pre-shift step {ctx.pre_step:,}, post-shift step "
            f"{ctx.post_step:,} ({html.escape(ctx.step_note or 'chosen by the caller')}); "
            f"{ctx.n_samples} samples per experiment, sampling seed {ctx.seed}; built in "
            f"{seconds:.0f} s. Layers and heads are 1-based in figure titles (the papers' labels) and "
            "0-based in table columns named layer / head.")
    return page("tfmatcomp report", f"{_verdict(ctx)}<p class='meta'>{meta}</p>", sections)
