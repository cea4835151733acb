"""The command line's first touch: help without torch, whole help texts, one meaning per flag, and
output folders checked before any work."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tfmatcomp.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("train", "presets", "report", "demo", "geometry", "sweep", "dynamics")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _imported(argv: list[str]) -> set[str]:
    """The modules ``python -X importtime -m tfmatcomp ARGV`` imports."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                    os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "tfmatcomp", *argv],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
            if line.startswith("import time:")}


@pytest.mark.parametrize("argv", [["--help"], *[[c, "--help"] for c in COMMANDS]],
                         ids=lambda a: " ".join(a))
def test_help_imports_neither_torch_nor_transformer_lens(argv):
    modules = _imported(argv)
    assert "tfmatcomp.cli" in modules
    heavy = {m for m in modules if m.split(".")[0] in ("torch", "transformer_lens", "numpy",
                                                       "pandas", "plotly")}
    assert not heavy, f"tfmatcomp {' '.join(argv)} imports {sorted(heavy)[:5]}"


def test_import_tfmatcomp_is_light():
    code = "import sys, tfmatcomp; print(sorted(m for m in ('torch', 'transformer_lens') if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_help_is_whole_and_every_flag_explains_itself(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text and ":mod:" not in text             # no raw RST
    assert "--run-dir is a run directory" in text and "examples:" in text
    for name in COMMANDS:
        assert re.search(rf"^\s+{name}\s+\S", text, re.M), f"{name} has no help line"
    for name, sub in _subparsers().items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"tfmatcomp {name} {action.option_strings or action.dest}: no help"
    sections = next(a for a in _subparsers()["report"]._actions if a.dest == "sections").help
    from tfmatcomp.report.sections import SECTIONS

    assert all(k in sections for k in SECTIONS), "--sections names every section"
    assert "..." not in sections


def test_the_names_the_cli_offers_are_the_librarys():
    from tfmatcomp.analyses.dynamics.progress import PROGRESS_MEASURES
    from tfmatcomp.cli import names
    from tfmatcomp.config import PRESETS
    from tfmatcomp.models.objectives import config_kind
    from tfmatcomp.report.sections import DEFAULT_SECTIONS, SECTIONS
    from tfmatcomp.task.data import DISTRIBUTIONS

    assert names.PRESETS == tuple(sorted(PRESETS))
    assert names.ENCODER_PRESETS == tuple(sorted(n for n, p in PRESETS.items()
                                                 if config_kind(p.model) == "encoder"))
    assert names.DISTRIBUTIONS == tuple(DISTRIBUTIONS)
    assert names.REPORT_SECTIONS == tuple(SECTIONS)
    assert [k for k in SECTIONS if k not in names.OPT_IN_SECTIONS] == list(DEFAULT_SECTIONS)
    from tfmatcomp.report.sections import OPT_IN_SECTIONS

    assert names.OPT_IN_SECTIONS == tuple(OPT_IN_SECTIONS)
    assert names.MEASURES == tuple(PROGRESS_MEASURES)
    from tfmatcomp.report.geometry import SECTIONS as GEOMETRY

    assert names.GEOMETRY_SECTIONS == tuple(GEOMETRY)


def test_one_meaning_per_flag():
    flags = {name: {s for a in sub._actions for s in a.option_strings}
             for name, sub in _subparsers().items()}
    for name, options in flags.items():
        assert not options & {"--out", "--out-dir"}, f"{name}: --out is gone"
    assert {n for n, o in flags.items() if "--run-dir" in o} == {"train", "sweep", "demo"}
    assert {n for n, o in flags.items() if "--output" in o} == {"report", "demo", "dynamics",
                                                                "geometry"}
    assert all("-o" in o for n, o in flags.items() if "--output" in o)
    assert {n for n, o in flags.items() if "--seed" in o} == {"train", "demo"}   # training seeds
    assert {n for n, o in flags.items() if "--sample-seed" in o} == {"report", "demo", "dynamics",
                                                                     "geometry"}


@pytest.mark.parametrize("argv", [
    ["report", "tiny", "-o", "{missing}/x.html"],
    ["demo", "--bundled", "-o", "{missing}/x.html"],
    ["demo", "--steps", "2", "--run-dir", "{tmp}/run", "-o", "{missing}/x.html"],
    ["dynamics", "tiny", "-o", "{missing}/d.csv"],
    ["dynamics", "tiny", "-o", "{tmp}/d.csv", "--figure", "{missing}/f.html"],
], ids=["report", "demo-bundled", "demo-training", "dynamics", "dynamics-figure"])
def test_a_missing_output_folder_is_refused_in_one_line_before_any_work(argv, tmp_path, capsys):
    missing = tmp_path / "no" / "such"
    argv = [a.format(missing=missing, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err, err
    assert not (tmp_path / "no").exists() and not (tmp_path / "run").exists()
    assert not (tmp_path / "d.csv").exists()


def test_demo_seed_trains_that_seed(tmp_path):
    out = tmp_path / "report.html"
    assert main(["demo", "--seed", "3", "--steps", "4", "--run-dir", str(tmp_path / "runs"),
                 "--device", "cpu", "-o", str(out), "--sections", "training", "--samples", "8",
                 "--no-progress"]) in (0, 1)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if p.is_dir()) == ["seed-3"]
    assert out.exists()
    with pytest.raises(SystemExit):
        main(["report", "tiny", "--seed", "1"])      # --seed is a training seed; report draws samples
