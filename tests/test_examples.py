"""Every script in examples/ runs to completion, offline, as a subprocess.

Scripts are found by globbing, so examples added by anyone are run too. Conventions for examples
(see docs/quickstart.md):

* ``TFMATCOMP_EXAMPLE_STEPS``: when set, the number of training steps a script trains for, if it
  trains; CI sets it low (default here: 30) so that each script takes seconds, not minutes.
* a script writes only under a temporary directory or its working directory (here a fresh tmp dir).

``TFMATCOMP_EXAMPLE_TIMEOUT`` (seconds, default 300) bounds each script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT = float(os.environ.get("TFMATCOMP_EXAMPLE_TIMEOUT", "300"))


def test_the_documented_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.py", "hooks_and_cache.py"} <= names


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script: Path, tmp_path: Path):
    env = dict(os.environ)
    env.setdefault("TFMATCOMP_EXAMPLE_STEPS", "30")
    env.setdefault("OMP_NUM_THREADS", "1")        # tests run in parallel workers
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("TFMATCOMP_EXAMPLE_OUT", str(tmp_path))  # figures / files stay in the test dir
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")[-3000:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-3000:]
        pytest.fail(f"{script.name} did not finish within {TIMEOUT:.0f} s "
                    f"(does it honour TFMATCOMP_EXAMPLE_STEPS?)\n{out}")
    assert proc.returncode == 0, (
        f"{script.name} exited with {proc.returncode}\n--- stdout (tail) ---\n{proc.stdout[-3000:]}"
        f"\n--- stderr (tail) ---\n{proc.stderr[-3000:]}")
