"""The registry of pretrained runs against the run folders, the wheel's budget, and the build's
selection of bundled files (setup.py reads the same registry)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import tfmatcomp as tm
from tfmatcomp.pretrained.registry import BUDGET_BYTES, load_registry, parse_registry
from tfmatcomp.runs.checkpoint_files import sha256_file

ROOT = Path(__file__).resolve().parents[1]
PRETRAINED = ROOT / "tfmatcomp" / "pretrained"
#: a clone holds every run; the sdist (which carries the tests) only the bundled files
CHECKOUT = (PRETRAINED / "paper-4l8h" / "run.json").is_file()
needs_checkout = pytest.mark.skipif(not CHECKOUT, reason="needs a clone's run folders")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _bundled() -> set[str]:
    return {f"tfmatcomp/pretrained/{run}/{f.path}" for run, entry in load_registry().items()
            for f in entry.files.values() if f.bundled}


@needs_checkout
def test_the_registry_lists_every_file_of_every_run_with_its_size_and_sha256():
    runs = load_registry()
    folders = sorted(p.name for p in PRETRAINED.iterdir() if (p / "pretrained.json").is_file())
    assert sorted(runs) == folders == ["paper-4l8h", "paper-cpu", "tiny"]
    for name, run in runs.items():
        on_disk = {p.relative_to(PRETRAINED / name).as_posix()
                   for p in (PRETRAINED / name).rglob("*") if p.is_file()}
        assert set(run.files) == on_disk, name
        for f in run.files.values():
            path = PRETRAINED / name / f.path
            assert path.stat().st_size == f.size and sha256_file(path) == f.sha256, f.path
        assert run.info == json.loads((PRETRAINED / name / "pretrained.json").read_text())
        assert (run.repo_id, run.revision) == (f"tfmatcomp/{name}", "v0.1.0")


@needs_checkout
def test_the_registry_is_what_make_registry_writes():
    make = _load(ROOT / "scripts" / "make_registry.py", "make_registry")
    assert (PRETRAINED / "registry.json").read_text() == make.dumps(make.build())


def test_the_wheel_carries_tiny_and_paper_cpus_pre_and_post_within_the_budget():
    runs = load_registry()
    assert all(f.bundled for f in runs["tiny"].files.values())
    assert not any(f.bundled for f in runs["paper-4l8h"].files.values())
    cpu = runs["paper-cpu"]
    assert {f.step for f in cpu.files.values() if f.bundled} == {None, 4_000, 30_000}
    code = sum(p.stat().st_size for p in (ROOT / "tfmatcomp").rglob("*.py"))
    bundled = sum(f.size for run in runs.values() for f in run.files.values() if f.bundled)
    assert json.loads((PRETRAINED / "registry.json").read_text())["budget_bytes"] == BUDGET_BYTES
    assert bundled + code < BUDGET_BYTES  # uncompressed: the artefacts only weigh less


def test_the_builds_selection_is_the_registrys_bundled_set():
    setup = _load(ROOT / "setup.py", "tfmatcomp_setup")  # not __main__: setup() does not run
    allowed = set(setup.bundled_files())
    assert allowed == _bundled() | {"tfmatcomp/pretrained/registry.json"}
    every = [p.relative_to(ROOT).as_posix() for p in PRETRAINED.rglob("*") if p.is_file()]
    kept = {p for p in every if setup.keep(p, allowed)}
    modules = {p for p in every if p.count("/") == 2 and p.endswith(".py")}
    assert kept == allowed | modules
    assert setup.keep("tfmatcomp/cli.py", allowed) and setup.keep("tests/test_hub.py", allowed)
    assert "pretrained/**" not in (ROOT / "pyproject.toml").read_text()  # setup.py alone chooses
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert "tfmatcomp/pretrained/registry.json" in manifest and "graft tfmatcomp" not in manifest


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["runs"]["tiny"]["files"].update({"../x": {"size": 1, "sha256": "0" * 64,
                                                           "bundled": False}}), "relative path"),
    (lambda r: r["runs"]["tiny"]["files"]["run.json"].update(sha256="ABC"), "sha256"),
    (lambda r: r["runs"]["tiny"]["pretrained"].update(post_shift_step=3), "post_shift_step"),
    (lambda r: r.update(format_version=2), "format_version"),
])
def test_a_damaged_registry_is_refused_naming_what(edit, message):
    registry = json.loads((PRETRAINED / "registry.json").read_text())
    edit(registry)
    with pytest.raises(ValueError, match=message):
        parse_registry(json.dumps(registry))


def test_a_registry_with_a_duplicate_key_is_refused():
    with pytest.raises(ValueError, match="duplicate key 'runs'"):
        parse_registry('{"format_version": 1, "runs": {}, "runs": {}}')


def test_available_names_every_run_with_its_steps_and_where():
    runs = tm.pretrained.available()
    assert runs["tiny"].steps == [2_000, 4_000, 5_000, 6_000, 7_000, 10_000]
    assert runs["tiny"].where == {"bundled": runs["tiny"].size}
    assert (runs["paper-cpu"].pre_shift_step, runs["paper-cpu"].post_shift_step) == (4_000, 30_000)
    assert set(runs["paper-4l8h"].where) <= {"checkout", "directory", "cache", "remote"}
