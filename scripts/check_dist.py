"""Build the wheel and the sdist, and fail when either weighs more than the budget or carries a
pretrained file the registry does not bundle (or lacks one it does).

    python scripts/check_dist.py                      # build into a temporary folder
    python scripts/check_dist.py --outdir dist        # keep the artefacts (CI installs the wheel)
    python scripts/check_dist.py --no-isolation       # build with this environment's setuptools

Prints each artefact's size and file count and its ten largest files; exit 1 on a failure.
The budget (25 MiB each) and the bundled set come from tfmatcomp/pretrained/registry.json, which
setup.py reads too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "tfmatcomp" / "pretrained" / "registry.json"


def members(artefact: Path) -> dict[str, int]:
    """``{path inside the package's tree: uncompressed bytes}`` of a wheel or an sdist (the
    sdist's top folder ``tfmatcomp-X.Y.Z/`` stripped)."""
    if artefact.suffix == ".whl":
        with zipfile.ZipFile(artefact) as z:
            return {i.filename: i.file_size for i in z.infolist() if not i.is_dir()}
    with tarfile.open(artefact) as t:
        return {m.name.split("/", 1)[1]: m.size for m in t.getmembers() if m.isfile()}


def expected_pretrained() -> set[str]:
    registry = json.loads(REGISTRY.read_text(encoding="utf-8"))
    return {f"tfmatcomp/pretrained/{run}/{path}" for run, entry in registry["runs"].items()
            for path, f in entry["files"].items() if f["bundled"]}


def check(artefact: Path, budget: int, expected: set[str]) -> list[str]:
    """Print the artefact's figures; return its failures."""
    files = members(artefact)
    size = artefact.stat().st_size
    print(f"{artefact.name}: {size:,} B ({size / (1 << 20):.1f} MiB), {len(files)} files, "
          f"budget {budget:,} B")
    for name, n in sorted(files.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {n:>12,}  {name}")
    failures = []
    if size > budget:
        failures.append(f"{artefact.name} weighs {size:,} B, more than the budget {budget:,} B")
    runs = {n for n in files if n.startswith("tfmatcomp/pretrained/") and n.count("/") > 2}
    if runs != expected:
        extra, missing = sorted(runs - expected), sorted(expected - runs)
        failures.append(f"{artefact.name}: pretrained files differ from the registry's bundled "
                        f"set: {len(extra)} not bundled but present (e.g. {extra[:3]}), "
                        f"{len(missing)} bundled but absent (e.g. {missing[:3]})")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outdir", type=Path, help="where the artefacts go (default: a temporary "
                    "folder, removed)")
    ap.add_argument("--no-isolation", action="store_true",
                    help="build with this environment's setuptools (python -m build -n)")
    args = ap.parse_args()
    budget = json.loads(REGISTRY.read_text(encoding="utf-8"))["budget_bytes"]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.outdir or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for old in [*out.glob("tfmatcomp-*.whl"), *out.glob("tfmatcomp-*.tar.gz")]:
            old.unlink()
        cmd = [sys.executable, "-m", "build", "-o", str(out), str(ROOT)]  # sdist, then wheel from it
        if args.no_isolation:
            cmd.insert(3, "--no-isolation")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        failures = []
        for artefact in sorted([*out.glob("tfmatcomp-*.whl"), *out.glob("tfmatcomp-*.tar.gz")]):
            failures += check(artefact, budget, expected_pretrained())
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
