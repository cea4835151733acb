"""The report as one self-contained HTML page (plotly.js embedded once, tables as HTML), from the
jinja2 templates in ``report/templates/`` with autoescaping.

Example:
    >>> from tfmatcomp.report.render import table_html
    >>> import pandas as pd
    >>> table_html(pd.DataFrame({"a": [0.123456]})).count("0.1235")
    1
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from jinja2 import Environment, PackageLoader
from markupsafe import Markup

from tfmatcomp.interventions import from_dict
from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections import Section

__all__ = ["render", "page", "table_html", "frame_html", "template"]

#: The pages' templates (``report/templates/*.html.j2``, package data), every value autoescaped.
_TEMPLATES = Environment(loader=PackageLoader("tfmatcomp.report", "templates"), autoescape=True)


def template(name: str):
    """One of the reports' jinja2 templates (``report/templates/NAME``), autoescaping on."""
    return _TEMPLATES.get_template(name)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222} h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:2em} p.what{max-width:60em;line-height:1.45} table.df{border-collapse:collapse;font-size:13px;
margin:1em 0;display:block;overflow-x:auto;max-width:100%} table.df td,table.df th{border:1px solid #ddd;
padding:3px 6px;text-align:right;white-space:nowrap} table.df th{background:#f5f5f5} .error{background:#fee;border:1px solid #c00;padding:1em;
white-space:pre-wrap;font-family:monospace;font-size:12px} .meta{color:#555;font-size:14px}
.verdict{font-size:16px;padding:.6em 1em;border-left:4px solid #6A9F58;background:#f4f9f2}
.verdict.none{border-color:#D1615D;background:#fbf1f0} nav ol{columns:2}
details.iv{font-size:13px;margin:-.5em 0 1em} details.iv pre{white-space:pre-wrap;word-break:break-all;
max-height:12em;overflow:auto;background:#f8f8f8;padding:.4em;margin:.2em 0 .6em}
"""


def number_text(x: float) -> str:
    """A float for people: whole numbers from 1,000 up with thousands separators (a step reads
    ``12,455``, never ``1.245e+04``), others with 4 significant digits.

    Example:
        >>> [number_text(x) for x in (12454.69, 2000.0, 0.012345, 3.0, 1e-7)]
        ['12,455', '2,000', '0.01235', '3', '1e-07']
    """
    if x != x:  # NaN
        return ""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def table_html(df: pd.DataFrame) -> str:
    """A DataFrame as an HTML table (:func:`number_text`; list cells shortened, so that no row is
    taller than a line or two)."""
    shown = df.copy()
    for c in shown.columns:
        if shown[c].dtype == object:
            shown[c] = [_short(v) for v in shown[c]]
        elif pd.api.types.is_integer_dtype(shown[c]) and not pd.api.types.is_bool_dtype(shown[c]):
            shown[c] = [f"{int(v):,}" if pd.notna(v) else "" for v in shown[c]]
    return shown.to_html(classes="df", index=False, float_format=number_text, na_rep="", border=0)


def _short(v):
    """A list or tuple cell as one short line (``[(2, 2), (3, 1), ... 5 heads]``)."""
    if isinstance(v, (list, tuple)) and len(v) > 4:
        return ", ".join(map(str, v[:3])) + f", ... ({len(v)} in all)"
    return v


def _describe(text: str) -> str:
    """What an intervention's JSON describes, in words (empty when it cannot be rebuilt here)."""
    try:
        return from_dict(json.loads(text)).describe()
    except Exception:  # a moved checkpoint, say: the JSON below still says what was done
        return ""


def frame_html(df: pd.DataFrame) -> Markup:
    """A table of the report; the interventions it ran are written out in full below it.

    An experiment table records what it did to the model as JSON (``to_json``, see
    :mod:`tfmatcomp.interventions.serialize`): in a column ``intervention`` (None = the model as it
    is), or in ``df.attrs["interventions"]``: ``{row index: JSON}`` for an experiment table,
    ``{cell: JSON}`` for a grid. The table shows
    ``#k kind`` in that column, and a list below it gives, for each ``#k``, its description and
    the exact JSON that ``tfmatcomp.interventions.from_dict`` rebuilds it from.

    Example:
        >>> from tfmatcomp.interventions import UniformAttentionAblation, to_json
        >>> df = pd.DataFrame({"L": [0.5, 0.7], "intervention": [None, to_json(UniformAttentionAblation("all"))]})
        >>> page = frame_html(df)
        >>> "#1 uniform_attention_ablation" in page, "{&#34;kind&#34;: &#34;uniform_attention_ablation&#34;" in page
        (True, True)
    """
    column = df["intervention"] if "intervention" in df.columns else None
    cells = df.attrs.get("interventions")
    if column is None and isinstance(cells, Mapping) and cells and set(cells) == set(df.index):
        # an experiment table: one record per row (tfmatcomp.experiments.with_interventions)
        column, cells = pd.Series([cells[i] for i in df.index], index=df.index), None
    texts = [t for t in (column if column is not None else []) if isinstance(t, str)]
    if isinstance(cells, Mapping):
        texts += [t for t in cells.values() if isinstance(t, str)]
    numbers: dict[str, int] = {}
    for t in texts:
        numbers.setdefault(t, len(numbers) + 1)
    if not numbers:
        return Markup(table_html(df))

    def label(text):
        return (f"#{numbers[text]} {json.loads(text).get('kind', '')}" if isinstance(text, str)
                else "none")

    shown = df.copy()
    if column is not None:
        shown["intervention"] = [label(t) for t in column]
    where = {t: ", ".join(str(k) for k, v in cells.items() if v == t)
             for t in numbers} if isinstance(cells, Mapping) else {}
    items = [{"description": _describe(t), "where": where.get(t), "json": t} for t in numbers]
    return Markup(table_html(shown)) + Markup(
        _TEMPLATES.get_template("interventions.html.j2").render(items=items))


def _item_html(item: Any, first_figure: bool) -> Markup:
    """One figure, table or text of a section as HTML."""
    if isinstance(item, go.Figure):
        return Markup(fit_figure(item).to_html(full_html=False, include_plotlyjs=first_figure,
                                               config={"displaylogo": False}))
    if isinstance(item, pd.DataFrame):
        return frame_html(item)
    return Markup("<p>{}</p>").format(str(item))


#: the widest figure a report page shows, in pixels (the page is 1,200 px with its padding)
MAX_FIGURE_WIDTH = 1150
#: more legend entries than this go below the plot, in rows
MAX_SIDE_LEGEND = 12


def fit_figure(fig: go.Figure) -> go.Figure:
    """``fig`` made to fit the page: at most :data:`MAX_FIGURE_WIDTH` wide, a long legend laid out
    below the plot instead of a column beside it, a title too long for the width wrapped.

    Example:
        >>> fig = go.Figure([go.Scatter(y=[k], name=f"seed {k}") for k in range(32)])
        >>> fig = fit_figure(fig.update_layout(width=2000, title="a title " * 40))
        >>> fig.layout.width, fig.layout.legend.orientation, "<br>" in fig.layout.title.text
        (1150, 'h', True)
    """
    if fig.layout.width is not None and fig.layout.width > MAX_FIGURE_WIDTH:
        if fig.layout.height is not None:
            fig.update_layout(height=max(300, int(fig.layout.height * MAX_FIGURE_WIDTH
                                                  / fig.layout.width)))
        fig.update_layout(width=MAX_FIGURE_WIDTH)
    shown = [t for t in fig.data if t.showlegend is not False and getattr(t, "name", None)]
    if len(shown) > MAX_SIDE_LEGEND and fig.layout.showlegend is not False:
        fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.15, x=0,
                                      font=dict(size=10)))
    text = fig.layout.title.text if fig.layout.title else None
    width = fig.layout.width or 700
    room = max(20, int((width - 60) / 7.5))   # characters of a 13-14 px title on one line
    if text and any(len(seg) > room and "<" not in seg for seg in text.split("<br>")):
        lines = []
        for seg in text.split("<br>"):
            if "<" in seg or len(seg) <= room:   # a subtitle (<sup>...) stays as it is
                lines.append(seg)
                continue
            line = ""
            for word in seg.split(" "):
                if line and len(line) + 1 + len(word) > room:
                    lines.append(line)
                    line = word
                else:
                    line = f"{line} {word}".strip()
            lines.append(line)
        fig.update_layout(title_text="<br>".join(lines),
                          margin=dict(t=max(60, 30 + 20 * len(lines))))
    return fig


def page(title: str, header: str, sections: Sequence[Section]) -> str:
    """A self-contained page: ``title``, ``header`` HTML (trusted: the caller escapes what it puts
    in), a table of contents and the sections; every text of a section is escaped."""
    first_figure = True
    bodies = []
    for s in sections:
        items = []
        for item in s.items:
            items.append(_item_html(item, first_figure))
            first_figure = first_figure and not isinstance(item, go.Figure)
        bodies.append(_TEMPLATES.get_template("section.html.j2").render(s=s, items=items))
    return _TEMPLATES.get_template("page.html.j2").render(
        title=title, css=Markup(_CSS), header=Markup(header), sections=sections,
        bodies=[Markup(b) for b in bodies])


def render(ctx: RunContext, sections: Sequence[Section], seconds: float) -> str:
    """The HTML page of a report."""
    header = _TEMPLATES.get_template("run_header.html.j2").render(
        drop=ctx.drop, run_dir=str(ctx.run_dir), run_seed=ctx.run_seed, cfg=ctx.post.cfg,
        task=ctx.task, pre_step=ctx.pre_step, post_step=ctx.post_step, step_note=ctx.step_note,
        n_samples=ctx.n_samples, seed=ctx.seed, seconds=seconds)
    return page("tfmatcomp report", header, sections)
