"""The registry of pretrained runs: ``registry.json``, shipped in the package.

For each run it lists every file (path inside the run folder, size, SHA-256, whether the wheel
bundles it), the run's Hub repository and revision, and its ``pretrained.json`` (pre- and
post-shift steps, how it was trained). ``scripts/make_registry.py`` writes it from the run folders;
``setup.py`` takes the wheel's bundled files from it; :mod:`tfmatcomp.pretrained.sources` verifies
every file against it. Reading it imports neither torch nor huggingface_hub.

Example:
    >>> reg = load_registry()
    >>> sorted(reg)
    ['paper-4l8h', 'paper-cpu', 'tiny']
    >>> reg["tiny"].repo_id, reg["tiny"].revision
    ('tfmatcomp/tiny', 'v0.1.0')
    >>> reg["paper-cpu"].pre_shift_step, reg["paper-cpu"].post_shift_step
    (4000, 30000)
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["REGISTRY_FILE", "HUB_ORGANIZATION", "HUB_REVISION", "BUDGET_BYTES", "FileEntry",
           "RunEntry", "load_registry", "run_entry", "checkpoint_step", "mib"]

#: The registry's file name, inside the package's ``pretrained/`` folder.
REGISTRY_FILE = "registry.json"
#: The Hub organisation holding one model repository per run (``tfmatcomp/<run>``).
HUB_ORGANIZATION = "tfmatcomp"
#: The revision (a tag) of every run's Hub repository for this release.
HUB_REVISION = "v0.1.0"
#: The most the wheel and the sdist may each weigh.
BUDGET_BYTES = 25 << 20

_ROOT = Path(__file__).resolve().parent
_STEP_DIR = re.compile(r"checkpoints/step_(\d{7})/[^/]+")
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_REGISTRY_BYTES = 4 << 20


def checkpoint_step(path: str) -> int | None:
    """The training step of a file inside ``checkpoints/step_XXXXXXX/``, else None.

    Example:
        >>> checkpoint_step("checkpoints/step_0004000/config.json"), checkpoint_step("run.json")
        (4000, None)
    """
    m = _STEP_DIR.fullmatch(path)
    return int(m.group(1)) if m else None


def mib(n_bytes: int) -> str:
    """``n_bytes`` in MiB, one decimal: ``"14.6 MiB"``."""
    return f"{n_bytes / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class FileEntry:
    """One file of a run: its path inside the run folder (POSIX, relative), size and SHA-256."""

    path: str
    size: int
    sha256: str
    bundled: bool

    @property
    def step(self) -> int | None:
        """The checkpoint step the file belongs to (None for logs and run files)."""
        return checkpoint_step(self.path)


@dataclass(frozen=True)
class RunEntry:
    """A run of the registry."""

    name: str
    repo_id: str
    revision: str
    info: dict[str, Any]
    files: dict[str, FileEntry]

    @property
    def pre_shift_step(self) -> int:
        return self.info["pre_shift_step"]

    @property
    def post_shift_step(self) -> int:
        return self.info["post_shift_step"]

    @property
    def steps(self) -> list[int]:
        """Every checkpoint step of the run, ascending."""
        return sorted({f.step for f in self.files.values() if f.step is not None})

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())

    def step_files(self, step: int) -> list[FileEntry]:
        """The files of the checkpoint at ``step``."""
        return [f for f in self.files.values() if f.step == step]

    def core_files(self) -> list[FileEntry]:
        """What the report and the first hour need: every file that is not a checkpoint, and
        the pre- and post-shift checkpoints."""
        keep = (None, self.pre_shift_step, self.post_shift_step)
        return [f for f in self.files.values() if f.step in keep]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"registry: duplicate key {k!r}")
        out[k] = v
    return out


def _file(run: str, path: Any, entry: Any) -> FileEntry:
    where = f"registry: run {run!r}, file {path!r}"
    if not (isinstance(path, str) and all(_PART.fullmatch(p) for p in path.split("/"))):
        raise ValueError(f"{where}: not a relative path of plain names")
    if not isinstance(entry, dict) or set(entry) != {"size", "sha256", "bundled"}:
        raise ValueError(f"{where}: expected the keys size, sha256, bundled")
    size, digest, bundled = entry["size"], entry["sha256"], entry["bundled"]
    if not (type(size) is int and size >= 0 and isinstance(digest, str)
            and _SHA256.fullmatch(digest) and type(bundled) is bool):
        raise ValueError(f"{where}: size must be a non-negative int, sha256 64 lowercase hex "
                         "digits, bundled a bool")
    return FileEntry(path, size, digest, bundled)


def parse_registry(text: str) -> dict[str, RunEntry]:
    """The runs of a registry's JSON text, checked; ``ValueError`` naming what is wrong."""
    data = json.loads(text, object_pairs_hook=_no_duplicates)
    if not isinstance(data, dict) or data.get("format_version") != 1 or not isinstance(
            data.get("runs"), dict):
        raise ValueError("registry: expected format_version 1 and a 'runs' object")
    runs = {}
    for name, run in data["runs"].items():
        if not (isinstance(name, str) and _PART.fullmatch(name) and isinstance(run, dict)):
            raise ValueError(f"registry: bad run {name!r}")
        info, files = run.get("pretrained"), run.get("files")
        if not (isinstance(info, dict) and isinstance(files, dict) and files
                and isinstance(run.get("repo_id"), str) and isinstance(run.get("revision"), str)):
            raise ValueError(f"registry: run {name!r} needs repo_id, revision, pretrained, files")
        entry = RunEntry(name, run["repo_id"], run["revision"], info,
                         {p: _file(name, p, f) for p, f in files.items()})
        for key in ("pre_shift_step", "post_shift_step"):
            if info.get(key) not in entry.steps:
                raise ValueError(f"registry: run {name!r}: {key} {info.get(key)!r} is not one of "
                                 f"its checkpoint steps {entry.steps}")
        runs[name] = entry
    return runs


@functools.cache
def load_registry() -> dict[str, RunEntry]:
    """The package's registry, ``{run name: RunEntry}`` (read once per process)."""
    path = _ROOT / REGISTRY_FILE
    if path.stat().st_size > _MAX_REGISTRY_BYTES:
        raise ValueError(f"registry: {path} is larger than {_MAX_REGISTRY_BYTES:,} bytes")
    return parse_registry(path.read_text(encoding="utf-8"))


def run_entry(name: Any) -> RunEntry:
    """The registry's run ``name``; ``ValueError`` naming the runs for anything else (a path
    such as ``"../x"`` included)."""
    runs = load_registry()
    if not isinstance(name, str) or name not in runs:
        raise ValueError(f"name: no pretrained run {name!r}; the pretrained runs are "
                         f"{sorted(runs)} (to load a checkpoint from a path use "
                         "tfmatcomp.load_checkpoint)")
    return runs[name]
