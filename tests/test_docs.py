"""The documentation site: strict build, complete nav and API pages, and docs that match the code.

* the site builds with ``mkdocs build --strict`` (warnings are errors; skipped only when the docs
  extras are not installed);
* the nav lists every page under docs/, and every public module has an API page;
* the hook table of docs/concepts/model.md is the model's hook set, with the right shapes;
* the Python snippets of the quickstart and the concept pages run (at a tenth of their training
  steps, so the test stays fast);
* every ``tfmatcomp`` import in a ``python`` code block of docs/ or README.md resolves (the blocks
  that need a run directory are not executed, so a moved module would otherwise go unnoticed);
* the docs' griffe extension rewrites docstrings as documented.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tfmatcomp as tm

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: Top-level modules that need no API page of their own.
NO_API_PAGE = {"cli"}
#: Folders of the layout that only group modules (each module inside has its own page).
LAYERS = {"task", "models", "training", "runs", "analyses"}
#: Pages whose ``python`` code blocks are executed by this test (the pages of the docs' own area;
#: each analysis page is exercised by its area's tests).
SNIPPET_PAGES = ["quickstart.md", "concepts/task.md", "concepts/model.md",
                 "concepts/training.md", "concepts/conventions.md"]


def _have_docs_tools() -> bool:
    return all(importlib.util.find_spec(m) is not None
               for m in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "material"))


def _nav_pages() -> list[str]:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages: list[str] = []

    def walk(node):
        if isinstance(node, str):
            pages.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    walk(config["nav"])
    return pages


def _doc_pages() -> set[str]:
    return {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
            if not any(part.startswith("_") for part in p.relative_to(DOCS).parts)}


# ------------------------------------------------------------------------------ site build
@pytest.mark.skipif(not _have_docs_tools(), reason="docs extras (mkdocs-material, mkdocstrings) "
                    "not installed: pip install -e '.[docs]'")
def test_site_builds_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    assert proc.returncode == 0 and not warnings, "mkdocs build --strict failed:\n" + "\n".join(
        warnings or log.splitlines()[-40:])
    assert (tmp_path / "site" / "api" / "model" / "index.html").exists()


# ------------------------------------------------------------------- nav and API coverage
def test_nav_lists_every_page_and_only_existing_ones():
    nav = _nav_pages()
    pages = _doc_pages()
    assert len(nav) == len(set(nav)), f"pages listed twice in the nav: {sorted(nav)}"
    missing_from_nav = sorted(pages - set(nav))
    assert not missing_from_nav, f"add these pages to the nav in mkdocs.yml: {missing_from_nav}"
    not_found = sorted(set(nav) - pages)
    assert not not_found, f"the nav in mkdocs.yml lists pages that do not exist: {not_found}"


def _api_targets() -> set[str]:
    targets = set()
    for page in (DOCS / "api").glob("*.md"):
        targets |= set(re.findall(r"^:::\s+([\w.]+)", page.read_text(), flags=re.M))
    return targets


def test_every_public_module_has_an_api_page():
    targets = _api_targets()
    modules = []
    for m in pkgutil.iter_modules(tm.__path__):
        if m.name.startswith("_") or m.name in NO_API_PAGE:
            continue
        if m.name in LAYERS:  # a folder of the layout: each of its modules has a page
            layer = importlib.import_module(f"tfmatcomp.{m.name}")
            modules += [f"tfmatcomp.{m.name}.{s.name}" for s in pkgutil.iter_modules(layer.__path__)
                        if not s.name.startswith("_")]
        else:
            modules.append(f"tfmatcomp.{m.name}")
    import tfmatcomp.plotting as plotting

    modules += [f"tfmatcomp.plotting.{m.name}" for m in pkgutil.iter_modules(plotting.__path__)
                if not m.name.startswith("_")]
    missing = sorted(m for m in modules if m not in targets and m != "tfmatcomp.plotting")
    assert not missing, ("these modules have no API page: add docs/api/<module>.md with "
                         f"'::: <module>' and list it in the nav: {missing}")
    assert "tfmatcomp" in targets


# ------------------------------------------------------------- hook table vs the code
def _hook_table() -> dict[str, str]:
    text = (DOCS / "concepts" / "model.md").read_text()
    section = text.split("## Hook points", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\|\s*`([^`]+)`\s*\|\s*`(\[[^`]+\])`\s*\|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_hook_table_is_the_models_hook_set_with_its_shapes():
    cfg = tm.EncoderConfig(n_layers=3, n_heads=4, d_model=24, d_mlp=40, n_ctx=12, n_token_types=2)
    model = tm.HookedEncoder(cfg, seed=0)
    table = _hook_table()
    documented = {name.replace("{l}", str(l)): shape for name, shape in table.items()
                  for l in (range(cfg.n_layers) if "{l}" in name else [None])}
    assert set(documented) == set(model.hook_dict), (
        f"undocumented hooks: {sorted(set(model.hook_dict) - set(documented))}; documented but "
        f"absent: {sorted(set(documented) - set(model.hook_dict))}")

    batch, pos = 3, 10
    tokens = torch.randint(1, cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0))
    model.set_use_attn_result(True)  # so that hook_result fires too
    _, cache = model.run_with_cache(tokens)
    sizes = {"batch": batch, "pos": pos, "query_pos": pos, "key_pos": pos, "head": cfg.n_heads,
             "d_head": cfg.d_head, "d_model": cfg.d_model, "d_mlp": cfg.d_mlp, "1": 1}
    for name, shape in documented.items():
        expected = tuple(sizes[axis.strip()] for axis in shape.strip("[]").split(","))
        assert tuple(cache[name].shape) == expected, f"{name}: documented {shape}"


# ---------------------------------------------------------------------- code snippets
def _shrink(code: str) -> str:
    """Divide the training steps of a snippet by 10 (n_steps, checkpoint steps, step_XXXXXXX)."""
    code = re.sub(r"n_steps=(\d+)", lambda m: f"n_steps={int(m.group(1)) // 10}", code)
    code = re.sub(r"checkpoint_steps=\(([\d, ]+)\)", lambda m: "checkpoint_steps=(" + "".join(
        f"{int(s) // 10}," for s in m.group(1).split(",") if s.strip()) + ")", code)
    return re.sub(r"step_(\d{7})", lambda m: f"step_{int(m.group(1)) // 10:07d}", code)


@pytest.mark.parametrize("page", SNIPPET_PAGES)
def test_snippets_run(page, tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)
    assert blocks, f"{page} has no python snippet"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    exec(compile(_shrink("\n".join(blocks)), str(DOCS / page), "exec"), namespace)


def _tfmatcomp_imports(code: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every tfmatcomp import in ``code`` (``name`` None for ``import m``);
    a block that does not parse as a whole is read statement by statement."""
    try:
        trees = [ast.parse(code)]
    except SyntaxError:
        trees = []
        for line in code.splitlines():
            if line.lstrip().startswith(("import ", "from ")):
                try:
                    trees.append(ast.parse(line.strip()))
                except SyntaxError:
                    pass
    found = []
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tfmatcomp":
                found += [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(alias.name, None) for alias in node.names
                          if alias.name.split(".")[0] == "tfmatcomp"]
    return found


def _import_problem(module: str, name: str | None) -> str | None:
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        return f"import {module}: {err}"
    if name is None or name == "*" or hasattr(mod, name):
        return None
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return f"from {module} import {name}: no such name"
    return None


def test_every_tfmatcomp_import_in_the_docs_resolves():
    pages = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
    problems = []
    for page in pages:
        for code in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S):
            for module, name in _tfmatcomp_imports(code):
                problem = _import_problem(module, name)
                if problem:
                    problems.append(f"{page.relative_to(ROOT)}: {problem}")
    assert problems == []


def test_the_import_check_sees_a_moved_module():
    code = "import torch\nfrom tfmatcomp import embeddings as E\nfrom tfmatcomp.analyses import heads\n"
    found = _tfmatcomp_imports(code)
    assert found == [("tfmatcomp", "embeddings"), ("tfmatcomp.analyses", "heads")]
    assert [_import_problem(*f) for f in found] == [
        "from tfmatcomp import embeddings: no such name", None]


# ------------------------------------------------------------------ griffe extension
def _extension():
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_docstrings",
                                                  DOCS / "_ext" / "griffe_docstrings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_griffe_extension_rewrites_docstrings():
    rewrite = _extension().rewrite
    doc = ("Summary.\n\n    Args:\n        model_cfg, task_cfg: the configs,\n            continued.\n"
           "        seed (int): a seed.\n\n    Example:\n        >>> 1 + 1\n        2\n")
    out = rewrite(doc)
    assert ("        model_cfg: the configs,\n            continued.\n"
            "        task_cfg: the configs,\n            continued.\n") in out
    assert "        seed (int): a seed." in out
    assert "    Examples:" in out and "Example:\n" not in out
    assert rewrite("See :class:`~tfmatcomp.task.data.MatrixBatch`.") == "See `MatrixBatch`."
    table = ("=====  =====\nname   what\n=====  =====\n``a``  first\n"
             "       still first\n``b``  second\n=====  =====")
    assert rewrite(table).splitlines() == ["| name | what |", "| --- | --- |",
                                           "| ``a`` | first still first |", "| ``b`` | second |"]
    assert rewrite("    Returns:\n        DataFrame: rows.") == "    Returns:\n        (DataFrame): rows."
    assert rewrite("    Returns:\n        One row per (a, b): x.").endswith("One row per (a, b): x.")
    hooks = "    Hooks:\n        hook_pre: ``[b]`` before.\n        hook_post: after\n            it.\n"
    assert rewrite(hooks).splitlines() == ["    Hooks:", "        - `hook_pre`: ``[b]`` before.",
                                           "        - `hook_post`: after it."]
    assert rewrite("The forward pass, in one sitting::") == "The forward pass, in one sitting:"
    assert rewrite("A checkpoint is a directory::") == "A checkpoint is a directory:<!-- -->"


def test_the_readme_is_read_in_two_minutes(monkeypatch, tmp_path):
    """Under 600 words, the quick look within the first 300, the two set-up commands (one runs
    the demo, one the tests), and the quick look runs as printed."""
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) < 600, f"README.md has {len(text.split())} words"
    start = text.index("```python")
    assert len(text[:start].split()) < 300, "the quick look must start within the first 300 words"
    commands = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert len(commands) == 2
    assert commands[0].strip().endswith("tfmatcomp demo") and "pip install -e ." in commands[0]
    assert commands[1].strip().endswith("python -m pytest -n 2 -q")
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) < 15
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})


def test_the_nav_starts_here_and_the_concepts_live_in_concepts():
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    first = nav[0]
    assert list(first) == ["Start here"]
    pages = [list(p.values())[0] for p in first["Start here"]]
    assert pages[:2] == ["index.md", "quickstart.md"] and "coming-from.md" in pages
    concepts = next(n["Concepts"] for n in nav if "Concepts" in n)
    assert all(list(p.values())[0].startswith("concepts/") for p in concepts)
    assert list(nav[-1]) == ["API reference"]
    page = (DOCS / "api" / "model.md").read_text()
    assert all(name in page for name in ("inherited_members", "run_with_cache", "hooks", "unfused"))
