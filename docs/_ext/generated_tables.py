"""MkDocs hook: tables that the docs take from the code, so that each is written once.

A page line ``<!-- generated: head-score-table -->`` becomes :func:`tfmatcomp.analyses.heads.score_table`
(the registry of head scores). Listed under ``hooks:`` in mkdocs.yml.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])   # the repository: import the package being documented


def _head_score_table() -> str:
    if _ROOT not in sys.path:
        sys.path.insert(0, _ROOT)
    from tfmatcomp.analyses.heads import score_table

    return score_table()


_TABLES = {"head-score-table": _head_score_table}


def on_page_markdown(markdown: str, **kwargs) -> str:
    for key, make in _TABLES.items():
        marker = f"<!-- generated: {key} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
