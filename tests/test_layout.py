"""The package's layout rules, checked on the source (ast; nothing is imported).

1. **A handful of entry modules**: at most :data:`MAX_TOP_MODULES` ``.py`` files directly in
   ``tfmatcomp/`` (``__init__`` and ``__main__`` included); everything else lives in a layer folder.

2. **No import cycle among tfmatcomp modules.** The graph has an edge ``a -> b`` for every import
   statement in ``a`` that names tfmatcomp module ``b``, *wherever the statement is*: at module
   level, inside a function or method, and under ``if TYPE_CHECKING:``. A deferred import only
   moves a cycle from import time to the first call (the two modules still need each other to
   work), and a ``TYPE_CHECKING`` import is a dependency that type checkers and readers follow, so
   neither is a way out of a cycle. ``from pkg import name`` is an edge to ``pkg.name`` when that is
   a module, else to ``pkg`` (its ``__init__``). The parent packages that Python runs before a module
   (``tfmatcomp/__init__`` before everything) are not edges: the top package re-exports the
   public names of every layer, so counting them would put every module in one cycle.

3. **No private name imported from another folder.** A private name starts with one underscore
   (``_x``, not ``__x__``): an imported name, a module in the imported path, or an attribute read
   from a module bound by an import (``import a.b as m; m._x``). It belongs to the folder of the
   file that defines it (for a private module, the folder the module sits in) and may be used by
   modules in that folder or below it; ``tfmatcomp/_interrupts.py`` is thus private to the package
   and its layers, ``decomposition/_gram.py`` to ``decomposition/``.

4. **No transformer math outside ``models/components/``.** Outside that folder, no module calls or
   references, by attribute (``torch.softmax``, ``x.softmax(-1)``, ``F.layer_norm``) or by a called
   bare name (``softmax(x)``), any of :data:`TRANSFORMER_MATH`: softmax, layer norm, scaled
   dot-product attention, and ``tril`` / ``triu`` (the way causal masks are built). A causal or
   padding mask comes from ``models.components.attention`` (``future_mask``, ``padding_mask``), an
   attention pattern from the model's ``hook_pattern``. Each exception is in :data:`ALLOWED` with
   its reason. Q / K / V projections are matrix products and cannot be told from other products
   statically; the rule does not cover them (``geometry.qk.qk_components`` splits ``q . k`` into
   Song & Zhong's four components: a measurement, not a forward pass).

5. **Layers import downward.** Every module belongs to one layer of :data:`LAYERS` (the rows of
   docs/design-notes.md's map, lowest first; ``models/conversion/`` counts as ``models/``); an import
   may name a module of its own layer or of a lower one, never of a higher one. ``tfmatcomp/__init__``
   (the public re-exports) and ``__main__`` sit above every layer. Exceptions are in
   :data:`UPWARD_ALLOWED` with their reasons.

6. **One owner of the run directory's names.** No module but ``runs/layout.py`` spells a file or
   folder name of a run directory or checkpoint (a string constant equal to one of the names
   :mod:`tfmatcomp.runs.layout` defines); the others import them. Exceptions, names of another
   format that happen to be equal, are in :data:`OTHER_FORMATS`.

7. **Model kinds are told apart in ``models/`` only.** Outside ``tfmatcomp/models/``, no
   ``isinstance`` / ``issubclass`` names a model or config class of a kind (:data:`KIND_CLASSES`):
   what differs between encoder, decoder and language model is asked of the model's objective or
   the kind registry in ``models/``.

8. **No module over :data:`MAX_CODE_LINES` lines of code** (:func:`code_lines`: lines holding a
   token other than a comment, docstrings left out).

9. **No folder or module named after a paper's authors** (:data:`AUTHORS`): code is laid out by
   idea, and the papers are cited where their ideas are used.

10. **The map is true**: besides the order of its rows (rule 5), every lower-case name a row of
    docs/design-notes.md's map puts in backticks (`` `loop` ``, `` `sections/` ``) is a module or
    folder of that row's folder.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

import tfmatcomp

PKG = Path(tfmatcomp.__file__).parent
ROOT = PKG.parent

MAX_TOP_MODULES = 9

#: Names whose call or attribute reference is transformer math (rule 4).
TRANSFORMER_MATH = frozenset({"softmax", "layer_norm", "LayerNorm", "scaled_dot_product_attention",
                              "MultiheadAttention", "tril", "triu"})

#: ``(file relative to the repository, name) -> why it is not transformer math``.
ALLOWED = {
    ("tfmatcomp/decomposition/_gram.py", "tril"):
        "packs and unpacks a symmetric Gram matrix by its lower triangle; no attention mask",
}

#: The layers, lowest first (docs/design-notes.md's map): module-name prefixes relative to
#: ``tfmatcomp.``; a module belongs to the layer of its longest matching prefix.
LAYERS = [
    ("validation", "_interrupts", "_progress", "_notebook", "_lazy"), ("task",), ("config",), ("models.components",), ("models",),
    ("interventions.base", "interventions.hook_fn", "interventions.serialize", "interventions.weights",
     "interventions.during_training"),
    ("runs",), ("datapath",), ("training",), ("decomposition",), ("distributed",),
    ("pretrained",), ("interventions",), ("experiments",), ("geometry",), ("analyses",),
    ("plotting",), ("report",), ("cli",), ("interop",),
]
#: ``(importer, imported) -> why this upward edge is right``.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {
    ("tfmatcomp.cli", "tfmatcomp"): "`tfmatcomp --version` prints the package's __version__",
    ("tfmatcomp.training.sweeps", "tfmatcomp.plotting.sweeps"):
        "SweepResult.figure(), a convenience like pandas' .plot, imports plotting on first call",
    ("tfmatcomp.config", "tfmatcomp.interventions.during_training"):
        "TrainConfig reads its interventions' JSON through the one kind registry, on first use "
        "(the presets hold none)",
    ("tfmatcomp.training.sweeps", "tfmatcomp.analyses.dynamics"):
        "sweep_table summarizes each run's drop with the one drop detector, imported on first call",
}



# ----------------------------------------------------------------------------- the module graph
def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package), for every module of tfmatcomp."""
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


MODULES = _modules()


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _source_of(name: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` in module ``name`` reads from."""
    path, is_pkg = MODULES[name]
    package = name if is_pkg else name.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    base = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str) -> list[tuple[ast.stmt, str, str | None]]:
    """Every import in module ``name``: ``(node, target module, imported name or None)``, the
    target being the tfmatcomp module the statement makes Python load."""
    tree = ast.parse(MODULES[name][0].read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node, a.name, None) for a in node.names if a.name in MODULES]
        elif isinstance(node, ast.ImportFrom):
            source = _source_of(name, node)
            for a in node.names:
                sub = f"{source}.{a.name}"
                target = sub if sub in MODULES else source
                if target in MODULES:
                    out.append((node, target, None if target == sub else a.name))
    return out


def import_graph() -> dict[str, set[str]]:
    """``module -> the tfmatcomp modules it imports`` (rule 2's edges)."""
    return {m: {t for _, t, _ in _imports(m) if t != m} for m in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(out)


# ----------------------------------------------------------------------------- private names
def _folder(path: Path) -> str:
    return path.parent.relative_to(ROOT).as_posix()


def _private_owner(target: str, name: str | None) -> str | None:
    """The folder that owns the private part of ``from target import name`` (None: nothing
    private). A private module is owned by the folder it sits in; a private name by the folder of
    the module defining it."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return _folder(MODULES[".".join(parts[:i + 1])][0])
    if name is not None and name.startswith("_") and not name.startswith("__"):
        return _folder(MODULES[target][0])
    return None


def _visible(owner: str, importer: Path) -> bool:
    here = _folder(importer)
    return here == owner or here.startswith(owner + "/")


def private_imports() -> list[str]:
    """``"file:line: what"`` for every private name used outside its folder (rule 3)."""
    found = []
    for mod, (path, _) in MODULES.items():
        bound: dict[str, str] = {}  # local name -> tfmatcomp module it is bound to
        for node, target, name in _imports(mod):
            owner = _private_owner(target, name)
            if owner is not None and not _visible(owner, path):
                found.append(f"{_rel(path)}:{node.lineno}: {target} {name or ''}".rstrip())
            for a in node.names:
                if isinstance(node, ast.ImportFrom) and name is None and a.name == target.rpartition(".")[2]:
                    bound[a.asname or a.name] = target
                elif isinstance(node, ast.Import) and a.asname and a.name == target:
                    bound[a.asname] = target
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                target = bound[node.value.id]
                owner = _folder(MODULES[target][0])
                if not _visible(owner, path):
                    found.append(f"{_rel(path)}:{node.lineno}: {target}.{node.attr}")
    return sorted(set(found))


# ----------------------------------------------------------------------------- transformer math
def transformer_math() -> list[str]:
    """``"file:line: name"`` for every use of :data:`TRANSFORMER_MATH` outside
    ``models/components/`` that :data:`ALLOWED` does not list (rule 4)."""
    found = []
    for path, _ in MODULES.values():
        rel = _rel(path)
        if rel.startswith("tfmatcomp/models/components/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in TRANSFORMER_MATH:
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in TRANSFORMER_MATH):
                name = node.func.id
                if name == "LayerNorm":  # the component class itself, called by the models
                    continue
            if name is not None and (rel, name) not in ALLOWED:
                found.append(f"{rel}:{node.lineno}: {name}")
    return sorted(found)


def layer(module: str) -> int | None:
    """Index in :data:`LAYERS` of a tfmatcomp module (None above every layer: the package's
    ``__init__`` and ``__main__``)."""
    rel = module.removeprefix("tfmatcomp").lstrip(".")
    best = None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if rel == prefix or rel.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (i, prefix)
    return None if best is None else best[0]


def upward_imports() -> list[str]:
    """Rule 5's violations: ``importer -> imported`` edges that go up the layers."""
    found = []
    for a, targets in import_graph().items():
        la = layer(a)
        if la is None:
            continue
        for b in sorted(targets):
            lb = layer(b)
            if (a, b) not in UPWARD_ALLOWED and (lb is None or lb > la):
                found.append(f"{a} ({'.'.join(LAYERS[la])}) -> {b}")
    return found


# ----------------------------------------------------------------------------- the tests
def test_at_most_a_handful_of_modules_at_the_top():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of tfmatcomp/: {top}"


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_private_name_imported_from_another_folder():
    assert private_imports() == []


def test_no_transformer_math_outside_components():
    assert transformer_math() == []


#: ``(file, name) -> why that string is not a run directory's name``.
OTHER_FORMATS = {
    ("tfmatcomp/geometry/models.py", "config.json"):
        "a transformers model directory's config, not a tfmatcomp checkpoint's",
}


def _string_constants():
    """``(file, line, value)`` of every string constant in the package's modules."""
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield rel, node.lineno, node.value


def run_directory_names() -> list[tuple[str, int, str]]:
    """``(file, line, name)`` of every string constant outside runs/layout.py equal to a run
    directory name of :mod:`tfmatcomp.runs.layout` (rule 6), less :data:`OTHER_FORMATS`."""
    from tfmatcomp.runs import layout

    names = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}
    return [(rel, line, value) for rel, line, value in _string_constants()
            if value in names and rel != "tfmatcomp/runs/layout.py"
            and (rel, value) not in OTHER_FORMATS]


def test_run_directory_names_are_spelled_in_layout_only():
    assert run_directory_names() == []


def test_other_formats_entries_are_still_needed():
    assert set(OTHER_FORMATS) <= {(rel, value) for rel, _, value in _string_constants()}


def test_allow_list_entries_are_still_needed():
    """An allowed use that is gone must leave the allow-list too."""
    used = set()
    for rel, name in ALLOWED:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        if any(isinstance(n, ast.Attribute) and n.attr == name for n in ast.walk(tree)):
            used.add((rel, name))
    assert used == set(ALLOWED)


# ----------------------------------------------------------------------------- the checkers can fail
def test_cycle_finder_finds_a_deferred_cycle_and_ignores_a_chain():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_graph_counts_imports_in_functions_and_under_type_checking():
    graph = import_graph()
    # tfmatcomp.models.encoder imports hf_mapping inside from_hf / to_hf only
    assert "tfmatcomp.models.conversion.hf_mapping" in graph["tfmatcomp.models.encoder"]
    assert "tfmatcomp.interventions.weights" in graph["tfmatcomp.interventions.base"]
    # gpt2_mapping imports the decoder only under TYPE_CHECKING (at the time of writing)
    src = MODULES["tfmatcomp.models.conversion.gpt2_mapping"][0].read_text(encoding="utf-8")
    if "TYPE_CHECKING" in src and "models.decoder import" in src:
        assert "tfmatcomp.models.decoder" in graph["tfmatcomp.models.conversion.gpt2_mapping"]


def test_private_rule_sees_folders():
    assert _private_owner("tfmatcomp._interrupts", "undo_all") == "tfmatcomp"
    assert _visible("tfmatcomp", PKG / "models" / "hooked_base.py")
    assert _private_owner("tfmatcomp.geometry.qk", "_x") == "tfmatcomp/geometry"
    assert not _visible("tfmatcomp/geometry", PKG / "report" / "geometry.py")
    assert _private_owner("tfmatcomp.geometry.qk", "full_pos") is None
    assert _private_owner("tfmatcomp.decomposition._gram", "RunningGram") == "tfmatcomp/decomposition"


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer(m) is None] == ["tfmatcomp", "tfmatcomp.__main__"]


def test_layers_import_downward():
    assert upward_imports() == []


def test_layers_are_the_design_notes_map():
    """The layer list is the map's table, row for row."""
    text = (ROOT / "docs" / "design-notes.md").read_text(encoding="utf-8")
    table = text.split("## The map", 1)[1].split("**How data flows.**", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    named = [tuple(n.strip("`/").removesuffix(".py").replace("/", ".") for n in row.split(", "))
             for row in (r.strip() for r in rows)]
    flat = [n for row in named for n in row if n != "models.conversion"]  # part of models
    order = [n for prefixes in LAYERS for n in prefixes if n != "_interrupts"]
    assert flat == order


# ----------------------------------------------------------------------------- kinds, size, names
#: The classes of a model kind (rule 7): the hooked models and their configs.
KIND_CLASSES = frozenset({"HookedEncoder", "HookedDecoder", "EncoderConfig", "DecoderConfig"})

#: Rule 8's limit.
MAX_CODE_LINES = 450

#: Surnames of the authors of the papers the package reproduces and cites (rule 9).
AUTHORS = frozenset({"song", "zhong", "gopalani", "lubana", "hu", "chen", "hoogland", "carroll"})


def kind_isinstance() -> list[str]:
    """``"file:line: class"`` for every ``isinstance`` / ``issubclass`` on a kind class outside
    ``models/`` (rule 7)."""
    found = []
    for path, _ in MODULES.values():
        rel = _rel(path)
        if rel.startswith("tfmatcomp/models/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
                cls = node.args[1]
                for c in cls.elts if isinstance(cls, ast.Tuple) else [cls]:
                    name = c.id if isinstance(c, ast.Name) else getattr(c, "attr", None)
                    if name in KIND_CLASSES:
                        found.append(f"{rel}:{node.lineno}: {name}")
    return sorted(found)


def code_lines(text: str) -> int:
    """Lines of code: lines holding a token other than a comment, docstrings left out."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docstrings)


def long_modules() -> list[tuple[str, int]]:
    """``(file, lines of code)`` of every module over :data:`MAX_CODE_LINES` (rule 8)."""
    sizes = ((_rel(path), code_lines(path.read_text(encoding="utf-8"))) for path, _ in MODULES.values())
    return sorted((rel, n) for rel, n in sizes if n > MAX_CODE_LINES)


def named_after_authors() -> list[str]:
    """Folders and modules of the package whose name has an author's surname as a part (rule 9)."""
    found = []
    for path in sorted(PKG.rglob("*")):
        if "__pycache__" in path.parts or not (path.is_dir() or path.suffix == ".py"):
            continue
        parts = path.relative_to(PKG).with_suffix("").parts
        if any(set(p.lower().split("_")) & AUTHORS for p in parts):
            found.append(path.relative_to(ROOT).as_posix())
    return found


def test_model_kinds_are_told_apart_in_models_only():
    assert kind_isinstance() == []


def test_no_module_over_the_size_limit():
    assert long_modules() == []


def test_no_folder_named_after_authors():
    assert named_after_authors() == []


def test_size_and_kind_checkers_can_fail():
    assert code_lines('"""doc\nstring"""\n# comment\n\nx = (1,\n     2)\ndef f():\n    """d"""\n    return x\n') == 4
    src = "import tfmatcomp as tm\nisinstance(m, tm.HookedEncoder)\nisinstance(c, (int, DecoderConfig))\n"
    calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)]
    names = {getattr(c, "id", getattr(c, "attr", None)) for n in calls
             for c in (n.args[1].elts if isinstance(n.args[1], ast.Tuple) else [n.args[1]])}
    assert names & KIND_CLASSES == {"HookedEncoder", "DecoderConfig"}
    assert not set("training_format".split("_")) & AUTHORS and set("song_zhong".split("_")) & AUTHORS


def _map_rows() -> list[tuple[list[str], str]]:
    text = (ROOT / "docs" / "design-notes.md").read_text(encoding="utf-8")
    table = text.split("## The map", 1)[1].split("**How data flows.**", 1)[0]
    rows = []
    for line in table.splitlines():
        if line.startswith("| `"):
            _, folders, description, _ = line.split("|")
            rows.append(([f.strip().strip("`") for f in folders.split(",")], description))
    return rows


def map_names_missing() -> list[str]:
    """``"folder: name"`` for every backticked lower-case name of a map row that is no module or
    folder of that row's folders (rule 10)."""
    import re

    missing = []
    for folders, description in _map_rows():
        dirs = [PKG / f.rstrip("/") for f in folders if f.endswith("/")]
        for name in re.findall(r"`([a-z_]+/?)`", description):
            n = name.rstrip("/")
            if dirs and not any((d / f"{n}.py").exists() or (d / n).is_dir() for d in dirs):
                missing.append(f"{', '.join(folders)}: {name}")
    return missing


def test_the_map_names_only_modules_that_are_there():
    assert map_names_missing() == []
