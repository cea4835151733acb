"""The scripts in scripts/: the search scripts (preset_search.py, gpt_search.py) take their shared
options from _config_args.py (each option reaches the run's config, and a second call resumes);
make_bundled_run.py bundles a run trained elsewhere (``--no-train``, as paper-4l8h's GPU run was);
reproduction_extras.py prints the rows of docs/reproduction.md that the report does not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import tfmatcomp as tm
from tfmatcomp.runs.layout import PRETRAINED_FILE

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPTS / script), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_preset_search_applies_options_and_resumes(tmp_path):
    out = tmp_path / "search"
    common = ["--preset", "tiny", "--seeds", "0", "--out", str(out), "--lr", "2e-3",
              "--d-model", "32", "--log-every", "10", "--eval-samples", "16", "--checkpoint-every", "20"]
    _run("preset_search.py", *common, "--steps", "20")
    _run("preset_search.py", *common, "--steps", "40")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["lr"] == 2e-3 and summary["config"]["n_steps"] == 40
    assert summary["config"]["checkpoint_every"] == 20
    assert summary["config"]["model"]["d_model"] == 32 and summary["config"]["model"]["d_head"] == 8
    steps = [json.loads(line)["step"] for line in (out / "seed-0" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 40  # the second call went on from step 20
    assert summary["drops"] == "0/1"  # 4 logged points: too short to call a drop, and no crash


def test_gpt_search_applies_options(tmp_path):
    out = tmp_path / "gpt"
    _run("gpt_search.py", "--out", str(out), "--steps", "20", "--lr", "3e-3", "--seed", "2",
         "--log-every", "10", "--every", "10")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["lr"] == 3e-3 and summary["config"]["seed"] == 2
    assert summary["config"]["n_steps"] == 20 and summary["steps"] == 20


def test_make_bundled_run_bundles_a_run_trained_elsewhere(tmp_path):
    work, target = tmp_path / "work", tmp_path / "bundle"
    shutil.copytree(tm.pretrained.run_dir("tiny"), work / "seed-0",
                    ignore=shutil.ignore_patterns("group", PRETRAINED_FILE))
    _run("make_bundled_run.py", "--preset", "tiny", "--seeds", "0", "--no-train",
         "--bundle-seed", "0", "--checkpoints", "2", "--work", str(work), "--target", str(target))
    info = json.loads((target / PRETRAINED_FILE).read_text())
    assert "--no-train" in info["how"] and info["detected_drop"]["has_drop"]
    steps = sorted(int(p.name.split("_")[1]) for p in (target / "checkpoints").iterdir())
    assert steps == [info["pre_shift_step"], info["post_shift_step"]]
    bundled = tm.load_checkpoint(target / "checkpoints" / f"step_{info['post_shift_step']:07d}")
    assert bundled.cfg == tm.load_pretrained("tiny", step="post").cfg
    assert (target / "group" / "seed-0" / "metrics.jsonl").exists()


def test_reproduction_extras_prints_every_row():
    out = _run("reproduction_extras.py", "tiny")
    for row in ("embeddings, post-shift: norms of v and -v", "positional: same row",
                "transplant all_but_attn: pre-shift with the post-shift rest",
                "pre-shift head labels", "head scan, post-shift"):
        assert row in out, row
