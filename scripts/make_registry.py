"""Regenerate tfmatcomp/pretrained/registry.json from the run folders beside it.

The registry lists, for every pretrained run (a folder ``tfmatcomp/pretrained/<run>/`` with a
``pretrained.json``), every file with its size and SHA-256, whether the wheel and sdist bundle it,
the run's Hub repository and revision, and its ``pretrained.json`` (pre/post-shift steps, how it was
trained). ``setup.py`` reads the bundled set from it, ``tests/test_registry.py`` checks it against
the folders, and :mod:`tfmatcomp.pretrained` verifies every file it loads against it.

    python scripts/make_registry.py            # rewrite the registry
    python scripts/make_registry.py --check    # exit 1 if the registry differs from the folders

What the wheel carries (``BUNDLE``): every file of ``tiny``; ``paper-cpu``'s logs and its pre- and
post-shift checkpoints (what ``tfmatcomp demo --preset paper-cpu --bundled`` and the first-hour
notebook load); nothing of ``paper-4l8h``. A run added later is bundled only if named here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tfmatcomp.pretrained.registry import (  # noqa: E402
    BUDGET_BYTES, HUB_ORGANIZATION, HUB_REVISION, REGISTRY_FILE, checkpoint_step,
)
from tfmatcomp.runs.checkpoint_files import sha256_file  # noqa: E402
from tfmatcomp.runs.layout import PRETRAINED_FILE  # noqa: E402

PRETRAINED = ROOT / "tfmatcomp" / "pretrained"
#: Which files of each run the wheel and sdist carry: "all", "pre-post" (every file that is not a
#: checkpoint, and the pre- and post-shift checkpoints) or "none" (the default).
BUNDLE = {"tiny": "all", "paper-cpu": "pre-post", "paper-4l8h": "none"}


def _bundled(policy: str, rel: str, info: dict) -> bool:
    if policy == "all":
        return True
    if policy == "pre-post":
        step = checkpoint_step(rel)
        return step is None or step in (info["pre_shift_step"], info["post_shift_step"])
    return False


def build(pretrained: Path = PRETRAINED) -> dict:
    """The registry of the run folders under ``pretrained``."""
    runs = {}
    for run in sorted(p for p in pretrained.iterdir() if (p / PRETRAINED_FILE).is_file()):
        info = json.loads((run / PRETRAINED_FILE).read_text())
        policy = BUNDLE.get(run.name, "none")
        files = {}
        for f in sorted(run.rglob("*"), key=lambda p: p.relative_to(run).as_posix()):
            if not f.is_file() or "__pycache__" in f.parts:
                continue
            rel = f.relative_to(run).as_posix()
            files[rel] = {"size": f.stat().st_size, "sha256": sha256_file(f),
                          "bundled": _bundled(policy, rel, info)}
        runs[run.name] = {"repo_id": f"{HUB_ORGANIZATION}/{run.name}", "revision": HUB_REVISION,
                          "bundle": policy, "pretrained": info, "files": files}
    return {"format_version": 1,
            "generated_by": "python scripts/make_registry.py (do not edit by hand)",
            "budget_bytes": BUDGET_BYTES, "runs": runs}


def dumps(registry: dict) -> str:
    return json.dumps(registry, indent=1) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare instead of writing; exit 1 when the registry is out of date")
    args = ap.parse_args()
    text = dumps(build())
    target = PRETRAINED / REGISTRY_FILE
    if args.check:
        same = target.is_file() and target.read_text() == text
        print(f"{target}: {'up to date' if same else 'OUT OF DATE: run scripts/make_registry.py'}")
        return 0 if same else 1
    target.write_text(text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
