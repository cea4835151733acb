"""What the wheel and the sdist carry of the pretrained runs: exactly the files that
tfmatcomp/pretrained/registry.json marks "bundled" (scripts/make_registry.py writes it), and the
registry itself. Everything else about the package is in pyproject.toml.

The clone keeps every run under tfmatcomp/pretrained/<run>/; the build filters the others out of
both artefacts (build_py for the wheel, sdist for the sdist), whatever finds them (package data,
MANIFEST.in, a file finder plugin). tests/test_registry.py checks the selection against the
registry, and scripts/check_dist.py checks the built artefacts.
"""

from __future__ import annotations

import json
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
PRETRAINED = "tfmatcomp/pretrained"
REGISTRY = f"{PRETRAINED}/registry.json"


def bundled_files(root: Path = ROOT) -> list[str]:
    """Repository paths of the pretrained files the registry marks bundled, and the registry."""
    registry = json.loads((root / REGISTRY).read_text(encoding="utf-8"))
    files = [f"{PRETRAINED}/{run}/{path}" for run, entry in registry["runs"].items()
             for path, f in entry["files"].items() if f["bundled"]]
    return sorted([REGISTRY, *files])


def keep(path: str, allowed: set[str]) -> bool:
    """Whether the repository path ``path`` may go into an artefact: anything outside the run
    folders, the package's own modules, and the bundled files."""
    path = Path(path).as_posix()
    if not path.startswith(f"{PRETRAINED}/"):
        return True
    inside = path[len(PRETRAINED) + 1:]
    if "/" not in inside:  # the package's modules (__init__.py, registry.py, ...) and registry.json
        return inside.endswith(".py") or path in allowed
    return path in allowed


ALLOWED = set(bundled_files())


class BuildPy(build_py):
    """build_py whose data files leave out every run file the registry does not bundle."""

    def find_data_files(self, package, src_dir):
        files = super().find_data_files(package, src_dir)
        return [f for f in files if keep(Path(f).resolve().relative_to(ROOT).as_posix(), ALLOWED)]


class SDist(sdist):
    """sdist whose file list leaves out every run file the registry does not bundle."""

    def prune_file_list(self):
        super().prune_file_list()
        self.filelist.files = [f for f in self.filelist.files if keep(f, ALLOWED)]


#: The package data, relative to tfmatcomp/: globs, and the bundled pretrained files one by one.
PACKAGE_DATA = ["py.typed", "report/templates/*.html.j2",
                *(p[len("tfmatcomp/"):] for p in sorted(ALLOWED))]

if __name__ == "__main__":
    setup(package_data={"tfmatcomp": PACKAGE_DATA},
          cmdclass={"build_py": BuildPy, "sdist": SDist})
