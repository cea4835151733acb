"""Griffe extension used by the docs build: lets the package's docstrings stay plain Google style.

The docstrings are written to read well in ``help()`` and in an editor. A few habits of that style
are not understood by griffe's Google parser; this extension rewrites them (in the copy griffe
renders, never in the source):

* ``Example:`` becomes ``Examples:``, so doctests render as code (griffe only knows the plural).
* grouped parameters / attributes (``model_cfg, task_cfg, train_cfg: ...``) become one entry per
  name with the shared description, so they match the signature.
* Sphinx roles (``:class:`~tfmatcomp.task.data.MatrixBatch```, ``:func:`train```) become code spans,
  linked to the API page of the object when griffe can resolve the name and the page renders it.
* a ``Returns:`` section opening with ``Type: description`` names a type (griffe would read a
  name).
* ``Hooks:`` blocks of ``name: description`` lines become bulleted lists.
* reStructuredText simple tables (``====  ====`` rulers) become Markdown tables.
* a trailing ``::`` (reST literal-block marker) becomes ``:``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SECTION = re.compile(
    r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters|"
    r"Attributes):\s*$")
_GROUPED = re.compile(r"^(\s+)(\w+(?:\s*,\s*\*{0,2}\w+)+)(\s*\([^)]*\))?:(\s.*)?$")
_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
_RULER = re.compile(r"^\s*=+(\s+=+)+\s*$")
_ADMONITION_LIKE = re.compile(r"^\s*[\w][\s\w-]*$")
_RETURNS = re.compile(r"^(\s*)(Returns|Yields):\s*$")
_RETURN_TYPE = re.compile(r"^(\s+)([A-Z]\w*|int|float|str|bool|list|dict|tuple)(\[[^\]]*\])?:(\s)")
_HOOKS = re.compile(r"^(\s*)(Hooks\b.*):\s*$")
_HOOK_ITEM = re.compile(r"^\s*([^:`]+?):\s+(.*)$")


def _resolve(obj: griffe.Object, name: str) -> str | None:
    name = name.lstrip(".")
    if name.startswith("tfmatcomp"):
        return name
    head, _, rest = name.partition(".")
    try:
        path = obj.resolve(head)
    except Exception:  # griffe raises NameResolutionError and friends
        return None
    return f"{path}.{rest}" if rest else path


def _roles(text: str, obj: griffe.Object) -> str:
    def sub(m: re.Match) -> str:
        tilde, target = m.group(2), m.group(3).strip()
        shown = target.rsplit(".", 1)[-1] if tilde else target.lstrip(".")
        path = _resolve(obj, target)
        code = f"<code>{shown}</code>"
        if path is None:
            return f"`{shown}`"
        return f'<autoref identifier="{path}" optional>{code}</autoref>'

    out, fenced = [], False
    for line in text.split("\n"):
        if line.strip().startswith("```"):
            fenced = not fenced
        out.append(line if fenced or line.lstrip().startswith(">>>") else _ROLE.sub(sub, line))
    return "\n".join(out)


def _grouped(lines: list[str]) -> list[str]:
    out: list[str] = []
    section_indent: int | None = None
    item_indent: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        i += 1
        if m := _SECTION.match(line):
            section_indent, item_indent = len(m.group(1)), None
            out.append(line)
            continue
        if section_indent is not None and stripped:
            if indent <= section_indent:
                section_indent = item_indent = None
            elif item_indent is None:
                item_indent = indent
        if section_indent is not None and item_indent == indent and stripped:
            if m := _GROUPED.match(line):
                continuation = []
                while i < len(lines) and lines[i].strip() and (
                        len(lines[i]) - len(lines[i].lstrip()) > indent):
                    continuation.append(lines[i])
                    i += 1
                annotation, desc = m.group(3) or "", m.group(4) or ""
                for name in (n.strip() for n in m.group(2).split(",")):
                    out.append(f"{m.group(1)}{name}{annotation}:{desc}")
                    out.extend(continuation)
                continue
        out.append(line)
    return out


def _return_types(lines: list[str]) -> list[str]:
    """``Returns:`` + ``DataFrame: description`` means a type, not a name: ``(DataFrame): ...``."""
    out = list(lines)
    for i, line in enumerate(lines[:-1]):
        if _RETURNS.match(line):
            out[i + 1] = _RETURN_TYPE.sub(r"\1(\2\3):\4", lines[i + 1], count=1)
    return out


def _hook_lists(lines: list[str]) -> list[str]:
    """``Hooks:`` blocks (``name: description`` lines) as bulleted lists."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _HOOKS.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, header = m.group(1), m.group(2)
        block = []
        j = i + 1
        while j < len(lines) and lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) > len(indent):
            block.append(lines[j])
            j += 1
        item_indent = min((len(b) - len(b.lstrip()) for b in block), default=0)
        items: list[list[str]] = []
        for b in block:
            if len(b) - len(b.lstrip()) == item_indent and (im := _HOOK_ITEM.match(b)):
                items.append([f"`{im.group(1).strip()}`: {im.group(2).strip()}"])
            elif items:
                items[-1].append(b.strip())
            else:
                items = []
                break
        if not items:
            out.append(lines[i])
            i += 1
            continue
        if header == "Hooks":  # griffe renders "Hooks:" + indented block as an admonition
            out.append(lines[i])
            out.extend(f"{' ' * item_indent}- {' '.join(item)}" for item in items)
        else:
            out.extend([f"{indent}{header}:", ""])
            out.extend(f"{indent}- {' '.join(item)}" for item in items)
            out.append("")
        i = j
    return out


def _cells(line: str, spans: list[tuple[int, int]]) -> list[str]:
    cells = []
    for i, (a, b) in enumerate(spans):
        end = None if i == len(spans) - 1 else spans[i + 1][0]
        cells.append(line[a:end].strip())
    return cells


def _rst_table(block: list[str], indent: str) -> list[str]:
    """A reST simple table (three ``====`` rulers) as a Markdown table."""
    ruler = block[0]
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", ruler)]
    second = next(i for i in range(1, len(block)) if _RULER.match(block[i]))
    header = [_cells(ln, spans) for ln in block[1:second] if ln.strip()]
    body: list[list[str]] = []
    for ln in block[second + 1 : -1]:
        if not ln.strip():
            continue
        cells = _cells(ln, spans)
        if body and not cells[0]:  # continuation line of the previous row
            body[-1] = [f"{a} {b}".strip() for a, b in zip(body[-1], cells)]
        else:
            body.append(cells)
    head = [" ".join(col).strip() for col in zip(*header)] if header else [""] * len(spans)
    rows = [head, ["---"] * len(spans), *body]
    return [indent + "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]


def _tables(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        if _RULER.match(lines[i]):
            rulers = [j for j in range(i, len(lines)) if _RULER.match(lines[j])][:3]
            if len(rulers) == 3:
                block = lines[i : rulers[2] + 1]
                indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
                out.extend(_rst_table([ln.rstrip() for ln in block], indent))
                i = rulers[2] + 1
                continue
        out.append(lines[i])
        i += 1
    return out


def _literal_markers(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        if line.rstrip().endswith("::") and line.strip() != "::":
            head = line.rstrip()[:-2]
            # "Word words:" alone followed by an indented block would read as a griffe admonition;
            # an (invisible) HTML comment after the colon keeps it a sentence.
            line = head + (":<!-- -->" if _ADMONITION_LIKE.match(head) else ":")
        out.append(line)
    return out


def rewrite(text: str, obj: griffe.Object | None = None) -> str:
    """The docstring ``text`` as griffe's Google parser should see it (see the module docs)."""
    lines = text.splitlines()
    lines = [re.sub(r"^(\s*)Example:\s*$", r"\1Examples:", ln) for ln in lines]
    lines = _grouped(lines)
    lines = _hook_lists(lines)
    lines = _return_types(lines)
    lines = _tables(lines)
    lines = _literal_markers(lines)
    text = "\n".join(lines)
    return _roles(text, obj) if obj is not None else _ROLE.sub(
        lambda m: f"`{m.group(3).rsplit('.', 1)[-1] if m.group(2) else m.group(3)}`", text)


class RewriteDocstrings(griffe.Extension):
    """Apply :func:`rewrite` to every docstring of the loaded package."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value, obj)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self.on_object(obj=pkg)  # on_object is not fired for the top-level package itself
