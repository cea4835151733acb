"""The report as one self-contained HTML page (plotly.js embedded once, tables as HTML).

Example:
    >>> from tfmatcomp.report.render import table_html
    >>> import pandas as pd
    >>> table_html(pd.DataFrame({"a": [0.123456]})).count("0.1235")
    1
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections import Section

__all__ = ["render", "page", "table_html", "frame_html"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222} h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:2em} p.what{max-width:60em;line-height:1.45} table.df{border-collapse:collapse;font-size:13px;
margin:1em 0;display:block;overflow-x:auto} table.df td,table.df th{border:1px solid #ddd;padding:3px 6px;
text-align:right} table.df th{background:#f5f5f5} .error{background:#fee;border:1px solid #c00;padding:1em;
white-space:pre-wrap;font-family:monospace;font-size:12px} .meta{color:#555;font-size:14px}
.verdict{font-size:16px;padding:.6em 1em;border-left:4px solid #6A9F58;background:#f4f9f2}
.verdict.none{border-color:#D1615D;background:#fbf1f0} nav ol{columns:2}
details.iv{font-size:13px;margin:-.5em 0 1em} details.iv pre{white-space:pre-wrap;word-break:break-all;
max-height:12em;overflow:auto;background:#f8f8f8;padding:.4em;margin:.2em 0 .6em}
"""


def table_html(df: pd.DataFrame) -> str:
    """A DataFrame as an HTML table (4 significant digits)."""
    return df.to_html(classes="df", index=False, float_format=lambda x: f"{x:.4g}", na_rep="",
                      border=0)


def _describe(text: str) -> str:
    """What an intervention's JSON describes, in words (empty when it cannot be rebuilt here)."""
    from tfmatcomp.interventions import from_dict

    try:
        return from_dict(json.loads(text)).describe()
    except Exception:  # a moved checkpoint, say: the JSON below still says what was done
        return ""


def frame_html(df: pd.DataFrame) -> str:
    """A table of the report; the interventions it ran are written out in full below it.

    An experiment table records what it did to the model as JSON (``to_json``, see
    :mod:`tfmatcomp.interventions.serialize`): in a column ``intervention`` (None = the model as it
    is) or, for a grid, in ``df.attrs["interventions"]`` (``{cell: JSON}``). The table shows
    ``#k kind`` in that column, and a list below it gives, for each ``#k``, its description and
    the exact JSON that ``tfmatcomp.interventions.from_dict`` rebuilds it from.

    Example:
        >>> from tfmatcomp.interventions import UniformAttentionAblation, to_json
        >>> df = pd.DataFrame({"L": [0.5, 0.7], "intervention": [None, to_json(UniformAttentionAblation("all"))]})
        >>> page = frame_html(df)
        >>> "#1 uniform_attention_ablation" in page, "{&quot;kind&quot;: &quot;uniform_attention_ablation&quot;" in page
        (True, True)
    """
    column = df["intervention"] if "intervention" in df.columns else None
    cells = df.attrs.get("interventions")
    texts = [t for t in (column if column is not None else []) if isinstance(t, str)]
    if isinstance(cells, Mapping):
        texts += [t for t in cells.values() if isinstance(t, str)]
    numbers: dict[str, int] = {}
    for t in texts:
        numbers.setdefault(t, len(numbers) + 1)
    if not numbers:
        return table_html(df)

    def label(text):
        return (f"#{numbers[text]} {json.loads(text).get('kind', '')}" if isinstance(text, str)
                else "none")

    shown = df.copy()
    if column is not None:
        shown["intervention"] = [label(t) for t in column]
    where = {t: ", ".join(str(k) for k, v in cells.items() if v == t)
             for t in numbers} if isinstance(cells, Mapping) else {}
    items = "".join(
        f"<li>{html.escape(_describe(t))}{' (cell ' + html.escape(where[t]) + ')' if where.get(t) else ''}"
        f"<pre>{html.escape(t)}</pre></li>" for t in numbers)
    return (table_html(shown) + f"<details class='iv'><summary>What was done to the model: "
            f"{len(numbers)} intervention(s), as data (<code>tfmatcomp.interventions.from_dict("
            f"json.loads(...))</code> rebuilds each)</summary><ol>{items}</ol></details>")


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
                parts.append(frame_html(item))
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
