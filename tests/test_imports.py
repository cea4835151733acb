"""The package has no import cycle, counting imports inside functions (they only defer a cycle), and
importing it never imports the optional interop libraries (nnsight, pyvene)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import tfmatcomp

ROOT = Path(tfmatcomp.__file__).parent


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package), for every module of tfmatcomp."""
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"


def _imports(name: str, mods: dict[str, tuple[Path, bool]]) -> set[str]:
    """The tfmatcomp modules ``name`` imports anywhere in its code (not under TYPE_CHECKING)."""
    path, is_pkg = mods[name]
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            nodes = node.orelse
        else:
            nodes = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in mods)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{source}.{a.name}"
                found.add(sub if sub in mods else source)
        for child in nodes:
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in mods and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_every_module_imports():
    for info in pkgutil.walk_packages(tfmatcomp.__path__, "tfmatcomp."):
        importlib.import_module(info.name)


def test_no_import_cycle():
    mods = _modules()
    graph = {m: _imports(m, mods) for m in mods}
    assert graph["tfmatcomp.interventions.base"] >= {"tfmatcomp.interventions.weights"}
    assert _cycles(graph) == [], "import cycles (module groups that import each other)"


def test_cycle_finder_finds_a_deferred_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_module_imports_the_optional_interop_libraries():
    # A fresh interpreter: this test session may already have imported them (tests/test_interop_*).
    code = ("import importlib, pkgutil, sys, tfmatcomp\n"
            "for info in pkgutil.walk_packages(tfmatcomp.__path__, 'tfmatcomp.'):\n"
            "    importlib.import_module(info.name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('nnsight', 'pyvene')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         cwd=ROOT.parent, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]", f"modules imported by importing tfmatcomp: {out}"
