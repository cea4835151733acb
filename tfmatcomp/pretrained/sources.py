"""Where a pretrained run's files are found, in order, each verified by its SHA-256.

1. **The package's own folder** (``tfmatcomp/pretrained/<run>/``): the files the wheel bundles,
   or, in a clone or an editable install, every file of every run.
2. **A directory the user names**: ``load_pretrained(..., models_dir=...)`` or the environment
   variable ``TFMATCOMP_MODELS_DIR``, holding ``<run>/...`` in the repository's layout (a clone's
   ``tfmatcomp/pretrained`` works as is).
3. **The download cache** (``$TFMATCOMP_CACHE``, default ``$HF_HOME/tfmatcomp``), filled from the
   Hub (:mod:`tfmatcomp.pretrained.hub`) and from copies of the first two sources, so that a run
   spread over several of them becomes one run folder.

What a file that does not match the registry's SHA-256 costs depends on where it is. In the
package or in the user's directory it is refused and named, and left where it is (those files
are the user's; nothing here deletes them). In the download cache it is removed and fetched again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tfmatcomp.pretrained.hub import PretrainedUnavailable, download, hub_settings
from tfmatcomp.pretrained.registry import FileEntry, RunEntry, mib
from tfmatcomp.runs.checkpoint_files import sha256_file
from tfmatcomp.runs.layout import TMP_SUFFIX

__all__ = ["PretrainedFileRefused", "PretrainedUnavailable", "RunStatus", "models_dir_of",
           "cache_dir", "find_local", "fetch", "status", "WHERE"]

_PACKAGE = Path(__file__).resolve().parent
#: The places ``available()`` reports, in the order they are tried.
WHERE = ("bundled", "checkout", "directory", "cache", "remote")


class PretrainedFileRefused(ValueError):
    """A file in the package or in the user's directory that does not match the registry."""


@dataclass(frozen=True)
class _Source:
    label: str       # "package", "directory" or "cache"
    root: Path       # the run's folder in this source
    owned: bool      # True for the cache: a bad file there is ours to remove


def models_dir_of(models_dir: str | os.PathLike | None = None) -> Path | None:
    """The user's models directory: ``models_dir``, else ``$TFMATCOMP_MODELS_DIR``, else None."""
    name = "models_dir"
    if models_dir is None:
        models_dir, name = os.environ.get("TFMATCOMP_MODELS_DIR") or None, "TFMATCOMP_MODELS_DIR"
    if models_dir is None:
        return None
    if not isinstance(models_dir, (str, os.PathLike)):
        raise ValueError(f"{name}: expected a directory path, got {type(models_dir).__name__}")
    path = Path(models_dir).expanduser()
    if not path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is not a directory (it should hold <run>/... "
                         "folders, e.g. a clone's tfmatcomp/pretrained)")
    return path


def cache_dir() -> Path:
    """The download cache: ``$TFMATCOMP_CACHE``, else ``$HF_HOME/tfmatcomp`` (huggingface_hub's
    default ``HF_HOME`` when unset)."""
    if os.environ.get("TFMATCOMP_CACHE"):
        return Path(os.environ["TFMATCOMP_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "tfmatcomp"
    from huggingface_hub import constants  # its default HF_HOME (XDG_CACHE_HOME, ~/.cache)

    return Path(constants.HF_HOME) / "tfmatcomp"


def _sources(run: RunEntry, models_dir: Path | None) -> list[_Source]:
    out = [_Source("package", _PACKAGE / run.name, False)]
    if models_dir is not None:
        out.append(_Source("directory", models_dir / run.name, False))
    out.append(_Source("cache", cache_dir() / run.name, True))
    return out


def _present(root: Path, f: FileEntry) -> Path | None:
    path = root / f.path
    try:
        return path if path.is_file() and path.stat().st_size == f.size else None
    except OSError:
        return None


#: Files already hashed in this process: path -> (size, mtime_ns, inode, digest).
_HASHED: dict[str, tuple[int, int, int, str]] = {}


def _digest(path: Path) -> str:
    st = path.stat()
    key = (st.st_size, st.st_mtime_ns, st.st_ino)
    seen = _HASHED.get(str(path))
    if seen is not None and seen[:3] == key:
        return seen[3]
    digest = sha256_file(path)
    _HASHED[str(path)] = (*key, digest)
    return digest


def _mismatch(run: RunEntry, f: FileEntry, path: Path) -> str | None:
    """Why ``path`` is not the registry's file ``f`` (None when it is)."""
    if not path.is_file():
        return "missing"
    if path.stat().st_size != f.size:
        return f"{path.stat().st_size:,} bytes, the registry says {f.size:,}"
    digest = _digest(path)
    return None if digest == f.sha256 else f"SHA-256 {digest[:12]}..., the registry says {f.sha256[:12]}..."


def _refuse(run: RunEntry, f: FileEntry, path: Path, why: str) -> PretrainedFileRefused:
    return PretrainedFileRefused(
        f"{path}: file {f.path} of pretrained run {run.name!r} does not match the registry ({why});"
        " refused and left in place (restore it, or move it away so that the next source is "
        "tried)")


def find_local(run: RunEntry, files: list[FileEntry], models_dir: Path | None) -> Path | None:
    """The run folder of the first source holding every one of ``files``, each verified; None
    when no source holds them all. A bad file in the cache is removed on the way."""
    for src in _sources(run, models_dir):
        if not all(_present(src.root, f) for f in files):
            continue
        bad = [(f, why) for f in files if (why := _mismatch(run, f, src.root / f.path))]
        if not bad:
            return src.root
        if not src.owned:
            f, why = bad[0]
            raise _refuse(run, f, src.root / f.path, why)
        for f, _ in bad:
            (src.root / f.path).unlink(missing_ok=True)
    return None


def _unavailable(run: RunEntry, missing: list[FileEntry], reason: str) -> PretrainedUnavailable:
    size = mib(sum(f.size for f in missing))
    return PretrainedUnavailable(
        f"{reason}; {len(missing)} file(s) ({size}) of run {run.name!r} ({mib(run.size)} in all) "
        f"are on no local source. "
        f"Get them by one of: (1) `tfmatcomp models pull {run.name}` with the Hub reachable "
        f"(HF_HUB_OFFLINE unset; HF_ENDPOINT for a mirror); (2) TFMATCOMP_MODELS_DIR or "
        f"models_dir= naming a folder that holds {run.name}/ (a clone's tfmatcomp/pretrained works "
        f"as is); (3) a copy of a pulled {run.name}/ folder in the download cache {cache_dir()}")


def fetch(run: RunEntry, files: list[FileEntry], models_dir: Path | None) -> Path:
    """A run folder holding every one of ``files``, verified: the first local source holding them
    all, else the cache's run folder, completed from the other sources and the Hub."""
    root = find_local(run, files, models_dir)
    if root is not None:
        return root
    sources = _sources(run, models_dir)
    cache = sources[-1].root
    missing = []
    for f in files:
        target = cache / f.path
        if target.exists():
            if _mismatch(run, f, target) is None:
                continue
            target.unlink()
        for src in sources[:-1]:
            found = _present(src.root, f)
            if found is None:
                continue
            if why := _mismatch(run, f, found):
                raise _refuse(run, f, found, why)
            _copy_into(found, target)
            break
        else:
            missing.append(f)
    if missing:
        settings = hub_settings()
        try:
            download(run, missing, cache, settings)
        except PretrainedUnavailable as e:
            raise _unavailable(run, missing, str(e)) from None
        for f in missing:
            if why := _mismatch(run, f, cache / f.path):
                (cache / f.path).unlink(missing_ok=True)
                raise PretrainedFileRefused(
                    f"{settings.endpoint}: file {f.path} of pretrained run {run.name!r} "
                    f"({run.repo_id}@{run.revision}) does not match the registry ({why}); the "
                    "download was removed and nothing was loaded")
    return cache


@dataclass
class RunStatus:
    """A pretrained run and where its files are now (by size, without hashing them)."""

    name: str
    size: int
    steps: list[int]
    pre_shift_step: int
    post_shift_step: int
    repo_id: str
    revision: str
    #: bytes per place, in the order of :data:`WHERE`: "bundled" (in the package, as the wheel
    #: ships it), "checkout" (in the package folder of a clone, not bundled in the wheel),
    #: "directory" (TFMATCOMP_MODELS_DIR / models_dir), "cache", "remote" (nowhere here).
    where: dict[str, int] = field(default_factory=dict)
    #: the steps whose checkpoint is complete on some local source
    local_steps: list[int] = field(default_factory=list)

    def where_text(self) -> str:
        """``"bundled 14.6 MiB, remote 21.1 MiB"``, or one word when one place holds it all."""
        if len(self.where) == 1:
            return next(iter(self.where))
        return ", ".join(f"{k} {mib(v)}" for k, v in self.where.items())


def status(run: RunEntry, models_dir: Path | None) -> RunStatus:
    """Where each file of ``run`` is now, by presence and size (no hashing)."""
    sources = _sources(run, models_dir)
    where: dict[str, int] = {}
    local: set[str] = set()
    for f in run.files.values():
        for src in sources:
            if _present(src.root, f):
                label = src.label
                if label == "package":
                    label = "bundled" if f.bundled else "checkout"
                local.add(f.path)
                break
        else:
            label = "remote"
        where[label] = where.get(label, 0) + f.size
    order = {k: i for i, k in enumerate(WHERE)}
    steps = [s for s in run.steps if all(f.path in local for f in run.step_files(s))]
    return RunStatus(run.name, run.size, run.steps, run.pre_shift_step, run.post_shift_step,
                     run.repo_id, run.revision, dict(sorted(where.items(), key=lambda kv: order[kv[0]])),
                     steps)


def _copy_into(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a fresh temporary name beside it, renamed over it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def copy_run(root: Path, files: list[FileEntry], target: Path) -> None:
    """Copy ``files`` from the run folder ``root`` into ``target`` (created)."""
    for f in files:
        _copy_into(root / f.path, target / f.path)
