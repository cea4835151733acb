"""The search scripts (scripts/preset_search.py, scripts/gpt_search.py) take their shared options
from scripts/_config_args.py: each option reaches the run's config, and a second call resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _run(script: str, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPTS / script), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


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
