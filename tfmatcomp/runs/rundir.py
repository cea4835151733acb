"""Run directories: one run per directory, one writer at a time, nothing left half-done.

A run directory (the ``out_dir`` of :func:`tfmatcomp.train`, or a multi-seed group directory of
:func:`tfmatcomp.train_many`) holds exactly one run. The trainers enforce these rules through this
module:

* **No mixing.** Training from step 0 into a directory that already holds a run is refused
  (:class:`RunDirError`) unless the caller resumes it or asks for ``overwrite=True``, which clears
  it first. A directory holding only what a failed start leaves (``run.json``, ``seeds.json``, an
  empty ``metrics.jsonl``, the lock file) counts as empty. ``overwrite`` clears only directories
  that hold nothing but run files, so a mistyped ``out_dir`` cannot wipe unrelated files.
* **One writer.** A trainer holds an exclusive lock on ``RUN_DIR/.lock`` while it writes:
  ``filelock``'s native lock on the file's descriptor (``flock`` on POSIX, ``LockFileEx`` on
  Windows), which the operating system releases when the process ends, however it ends, so a
  killed trainer never leaves a stale lock. The file is opened with ``O_NOFOLLOW`` and used only
  if it is a regular file with one link (:func:`tfmatcomp.runs.files.open_lock_file`): a planted
  link is refused, never written through. The file records who holds it (pid, host, start
  time); a second trainer fails at once with :class:`RunDirLockedError` naming them.
* **No leftovers.** Temporary checkpoint directories that a kill left behind (``.step_*.tmp-*``,
  ``.step_*.old-*``) are removed when the run is resumed (a checkpoint caught between its two
  renames is put back first).
* **No lost rows.** The metrics log is read row by row: an unreadable line is set aside with a
  warning, never taken as the end of the log. Resume cuts the run back to its checkpoint
  (:func:`cut_back`) and keeps the unreadable lines in ``metrics.jsonl.bad``.

Example:
    >>> import tempfile
    >>> from tfmatcomp.runs.rundir import RunDirLock, RunDirLockedError, is_empty
    >>> run = tempfile.mkdtemp()
    >>> with RunDirLock(run) as lock:
    ...     try:
    ...         RunDirLock(run).acquire()
    ...     except RunDirLockedError as e:
    ...         print("locked:", "pid" in str(e))
    locked: True
    >>> is_empty(run)
    True
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import socket
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock
from tfmatcomp.runs.checkpoint_files import seal_config
from tfmatcomp.runs.group import read_seeds
from tfmatcomp.runs.files import (
    RunDirError, check_real_dir, is_temporary, open_append, open_lock_file, remove_entry,
    replace_file,
)
from tfmatcomp.runs.layout import (
    BAD_LINES_FILE, CHECKPOINTS_DIR, CONFIG_FILE, GROUP_FILE, INDEX_FILE, LEFTOVER, LOCK_FILE,
    METRICS_FILE, RUN_FILE, RUN_FILES, SEED_DIR, START_FILES, STATE_FILE, STATE_TENSORS_FILE,
    SWEEP_FILE,
    checkpoints_root, latest_checkpoint, list_checkpoints, seed_dir,
)
from tfmatcomp.validation import MAX_LOG_BYTES, parse_json, read_bounded, read_json_bounded

if TYPE_CHECKING:
    from tfmatcomp.config import EncoderConfig, TaskConfig, TrainConfig


__all__ = ["RunDirError", "RunDirLockedError", "RunDirLock", "is_empty", "foreign_entries",
           "check_fresh", "check_kind", "check_group", "check_group_resumable", "check_folders",
           "remove_leftovers", "read_log", "cut_back", "run_configs", "strip_state",
           "fingerprint"]


class RunDirLockedError(RunDirError):
    """Another trainer holds the run directory's lock."""


def _entries(path: Path) -> list[Path]:
    return sorted(path.iterdir()) if path.is_dir() else []


def _real_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink()


def is_empty(out_dir: str | os.PathLike) -> bool:
    """True when ``out_dir`` is absent or holds only what a failed start leaves: the lock file,
    ``run.json``, ``seeds.json``, an empty ``metrics.jsonl`` and ``seed-N`` directories that are
    themselves empty in this sense."""
    for p in _entries(Path(out_dir)):
        if p.name in START_FILES and not p.is_dir():
            continue
        if p.name == METRICS_FILE and p.is_file() and p.stat().st_size == 0:
            continue
        if SEED_DIR.fullmatch(p.name) and _real_dir(p) and is_empty(p):
            continue
        return False
    return True


def foreign_entries(out_dir: str | os.PathLike) -> list[str]:
    """Entries of ``out_dir`` that no run writes (``seed-N`` directories are looked into)."""
    found = []
    for p in _entries(Path(out_dir)):
        if SEED_DIR.fullmatch(p.name) and _real_dir(p):
            found += [f"{p.name}/{q}" for q in foreign_entries(p)]
        elif p.name not in RUN_FILES and not is_temporary(p.name, _TOP_FILES):
            found.append(p.name)
    return found


def check_fresh(out_dir: str | os.PathLike, overwrite: bool = False) -> None:
    """Make sure a run may start at step 0 in ``out_dir``: it must be empty (:func:`is_empty`), or
    ``overwrite`` clears it (the lock file stays: the caller holds it).

    Raises:
        RunDirError: ``out_dir`` holds a run and ``overwrite`` is False, or it holds files that no
            run writes (which ``overwrite`` never deletes).
    """
    out_dir = Path(out_dir)
    if is_empty(out_dir):
        return
    if not overwrite:
        names = [p.name for p in _entries(out_dir) if p.name != LOCK_FILE]
        raise RunDirError(
            f"out_dir: {out_dir} already holds a run ({', '.join(names[:6])}); training into it "
            "from step 0 would mix two runs. Pass resume=True (--resume) to continue it, "
            "overwrite=True (--overwrite) to replace it, or choose another directory")
    foreign = foreign_entries(out_dir)
    if foreign:
        raise RunDirError(f"out_dir: {out_dir} holds files that no run writes ({foreign[:6]}); "
                          "overwrite only clears run directories, so choose another directory")
    for p in _entries(out_dir):
        if p.name == LOCK_FILE:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def check_kind(out_dir: str | os.PathLike, group: bool) -> None:
    """Refuse to continue a single run in a multi-seed group directory (``group=False``) or a
    group in a single run's directory (``group=True``).

    Raises:
        RunDirError: ``out_dir`` holds the other kind of run.
    """
    out_dir = Path(out_dir)
    if group:
        log = out_dir / METRICS_FILE
        if (out_dir / CHECKPOINTS_DIR).exists() or (log.is_file() and log.stat().st_size):
            raise RunDirError(f"out_dir: {out_dir} holds a single run (metrics.jsonl, "
                              "checkpoints/), not a multi-seed group; resume it with train()")
    elif (out_dir / GROUP_FILE).exists() or any(
            SEED_DIR.fullmatch(p.name) and _real_dir(p) and not is_empty(p)
            for p in _entries(out_dir)):
        raise RunDirError(f"out_dir: {out_dir} is a multi-seed group; resume it with train_many(), "
                          f"or one seed alone with out_dir={out_dir / 'seed-N'}")


def check_group(out_dir: str | os.PathLike, seeds: list[int], resuming: bool,
                overwrite: bool = False) -> None:
    """Check that the multi-seed group of ``seeds`` may train in ``out_dir`` (whose lock the
    caller holds): a resume needs a group of the same seeds there (or nothing), a fresh start an
    empty directory (:func:`check_fresh`, which ``overwrite`` clears).

    Raises:
        RunDirError: ``out_dir`` holds a single run, another run, or an unreadable ``seeds.json``.
        ValueError: ``out_dir`` holds a group of other seeds.
    """
    out_dir = Path(out_dir)
    if not resuming:
        check_fresh(out_dir, overwrite)
        return
    check_folders(out_dir)
    check_kind(out_dir, group=True)
    path = out_dir / GROUP_FILE
    if not os.path.lexists(path):
        return
    try:
        theirs = read_seeds(out_dir)
    except ValueError as e:
        raise RunDirError(f"out_dir: {e}; pass overwrite=True to start this directory "
                          "again") from None
    if sorted(theirs) != seeds:
        diff = sorted(set(theirs) ^ set(seeds))
        raise ValueError(f"seeds: {diff} differ: {out_dir} holds the group of seeds "
                         f"{sorted(theirs)}, this call asks for {seeds}; resume with the "
                         "same seeds or choose another directory")


def check_group_resumable(out_dir: str | os.PathLike, seeds: list[int]) -> None:
    """Refuse a group in which some seeds have a resumable checkpoint and others none.

    Raises:
        ValueError: naming the seeds without one.
    """
    missing = [s for s in seeds
               if latest_checkpoint(seed_dir(out_dir, s), with_state=True) is None]
    if missing and len(missing) < len(seeds):
        raise ValueError(f"seeds: {missing} have no resumable checkpoint under {out_dir}; "
                         "resume them separately or start a new directory")


def remove_leftovers(out_dir: str | os.PathLike) -> list[str]:
    """Remove what a killed trainer can leave half-written in ``out_dir``; return their names.

    Removes ``checkpoints/.step_*.tmp-*`` (a checkpoint being written),
    ``checkpoints/.step_*.old-*`` (a checkpoint being replaced; renamed back into place first when
    the replacement never arrived), and the temporary copies of files being replaced
    (:data:`~tfmatcomp.runs.layout.TMP_FILE`: ``config.json`` inside checkpoints, ``run.json``,
    ``seeds.json``, ``metrics.jsonl``, ...). Entries are found with ``lstat`` and removed without
    following them: a planted link is removed, never written through, dangling or not. A folder
    of the run that is a link (``checkpoints/``, ``step_X``) is refused
    (:func:`check_folders`). Call it only while holding the directory's lock.
    """
    out_dir = Path(out_dir)
    check_folders(out_dir)
    removed = []
    for p in _entries(out_dir):
        if is_temporary(p.name, _TOP_FILES):
            remove_entry(p)
            removed.append(p.name)
    for p in _entries(checkpoints_root(out_dir)):
        m = LEFTOVER.fullmatch(p.name)
        if m and p.is_symlink():
            remove_entry(p)
            removed.append(f"{CHECKPOINTS_DIR}/{p.name}")
        elif m and p.is_dir():
            target = p.with_name(m.group(1))
            if (m.group(2) == "old" and not os.path.lexists(target)
                    and (p / CONFIG_FILE).exists()):
                os.replace(p, target)
                continue
            shutil.rmtree(p, ignore_errors=True)
            removed.append(f"{CHECKPOINTS_DIR}/{p.name}")
        elif p.is_dir() and not p.is_symlink():
            for q in _entries(p):
                if is_temporary(q.name, _CHECKPOINT_FILES):
                    remove_entry(q)
                    removed.append(f"{CHECKPOINTS_DIR}/{p.name}/{q.name}")
    return removed


def check_folders(out_dir: str | os.PathLike) -> None:
    """Refuse a run directory whose folders are links: ``checkpoints/``, a checkpoint
    ``step_X`` in it, or a group's ``seed-N`` (training would write wherever they point).

    Raises:
        RunDirError: naming the link.
    """
    out_dir = Path(out_dir)
    check_real_dir(checkpoints_root(out_dir))
    for p in _entries(checkpoints_root(out_dir)):
        if not LEFTOVER.fullmatch(p.name):  # leftovers are removed, links or not
            check_real_dir(p)
    for p in _entries(out_dir):
        if SEED_DIR.fullmatch(p.name):
            check_real_dir(p)


#: The files a run writes at its top level, and in a checkpoint, that are replaced atomically.
_TOP_FILES = frozenset({RUN_FILE, GROUP_FILE, METRICS_FILE, BAD_LINES_FILE, SWEEP_FILE,
                        "sweep.csv", "sweep.html"})
_CHECKPOINT_FILES = frozenset({CONFIG_FILE, INDEX_FILE, STATE_FILE})


# ------------------------------------------------------------------------- the run's files
def read_log(path: str | os.PathLike, stacklevel: int = 2
             ) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """``(records, bad)``: every valid row of a metrics log (a JSON object with a finite number
    as ``step``), and its unreadable lines as ``(line number, text)``, with a warning naming the
    file and the line numbers when there are any. An absent log reads as empty."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return [], []
    records, bad = [], []
    content = read_bounded("metrics log", path, MAX_LOG_BYTES, binary=True)
    for n, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        try:  # a row holding a key twice is unreadable too: which value would count?
            record = parse_json(METRICS_FILE, raw.decode())
        except ValueError:  # UnicodeDecodeError included
            record = None
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step):
            records.append(record)
        else:
            bad.append((n, raw.decode(errors="replace")))
    if bad:
        lines = ", ".join(str(n) for n, _ in bad[:10]) + (", ..." if len(bad) > 10 else "")
        warnings.warn(f"{path}: {len(bad)} unreadable line(s) set aside (line {lines}); every "
                      "other row is kept", stacklevel=stacklevel + 1)
    return records, bad


def cut_back(out_dir: str | os.PathLike, step: int) -> list[dict[str, Any]]:
    """Cut a run back to ``step`` (before continuing it from there) and return its log rows.

    Checkpoint directories after ``step`` are removed (with a warning), the metrics log keeps its
    rows up to ``step`` (rewritten atomically), and its unreadable lines are appended to
    ``metrics.jsonl.bad``. Call it only while holding the directory's lock.
    """
    out_dir = Path(out_dir)
    later = [p for s, p in list_checkpoints(out_dir, complete=False).items() if s > step]
    for p in later:
        shutil.rmtree(p)
    if later:
        warnings.warn(f"out_dir: removed checkpoints after step {step} in {out_dir} "
                      f"({[p.name for p in later]}); training writes them again", stacklevel=3)
    log = out_dir / METRICS_FILE
    records, bad = read_log(log, stacklevel=3)
    if bad:
        with open_append(out_dir / BAD_LINES_FILE) as f:
            f.writelines(json.dumps({"line": n, "text": text}) + "\n" for n, text in bad)
    kept = [r for r in records if r["step"] <= step]
    if log.exists():
        replace_file(log, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def run_configs(out_dir: str | os.PathLike
                ) -> tuple[EncoderConfig | DecoderConfig, TaskConfig, TrainConfig] | None:
    """The model, task and training configs that ``run.json`` records (None without one).

    Raises:
        RunDirError: ``run.json`` is unreadable.
    """
    from tfmatcomp.config import TaskConfig, TrainConfig  # standalone
    from tfmatcomp.models.objectives import DEFAULT_KIND, objective_named

    path = Path(out_dir) / RUN_FILE
    if not path.exists():
        return None
    try:
        run = read_json_bounded(RUN_FILE, path)
        model_cls = objective_named(run.get("kind", DEFAULT_KIND)).config_class
        return (model_cls.from_dict(run["model"]), TaskConfig.from_dict(run["task"]),
                TrainConfig.from_dict(run["train"]))
    except (ValueError, KeyError, TypeError) as e:
        raise RunDirError(f"out_dir: {path} is unreadable ({e}); pass overwrite=True to start "
                          "this directory again") from None


def strip_state(path: str | os.PathLike) -> bool:
    """Drop a checkpoint's training state, rewriting its ``config.json`` file list atomically
    first (a kill in between leaves files that nothing lists, never a list naming lost files).

    The checkpoint is verified first (``config.json``'s own digest and every file's SHA-256): one
    that does not verify is left exactly as it is, still refused by every loader, with a warning;
    it is never sealed again with whatever was edited into it. Returns whether it was stripped.
    """
    from tfmatcomp.runs.checkpoint import CheckpointError, read_config

    path = Path(path)
    try:
        config = read_config(path, verify=True)
    except CheckpointError as e:
        warnings.warn(f"out_dir: {path} does not verify ({e}); its training state is left in "
                      "place and it is not sealed again (loading it stays refused)",
                      stacklevel=2)
        return False
    for name in (STATE_TENSORS_FILE, STATE_FILE):
        config.get("files", {}).pop(name, None)
    replace_file(path / CONFIG_FILE, json.dumps(seal_config(config), indent=2, sort_keys=True))
    for name in (STATE_TENSORS_FILE, STATE_FILE):
        (path / name).unlink(missing_ok=True)
    return True


def fingerprint(out_dir: str | os.PathLike) -> tuple:
    """What changes when anyone trains in ``out_dir``: the log's size and time, the checkpoints."""
    log = Path(out_dir) / METRICS_FILE
    stat = (log.stat().st_size, log.stat().st_mtime_ns) if log.exists() else None
    return stat, tuple(list_checkpoints(out_dir, complete=False))


# ---------------------------------------------------------------------------------- the lock
class RunDirLock:
    """The exclusive lock on a run directory (``RUN_DIR/.lock``), held while a trainer writes.

    ``acquire()`` creates the directory if needed, takes the lock without waiting and writes the
    holder's pid, host and start time into the lock file; ``release()`` (or leaving the ``with``
    block, or the process ending in any way) frees it.

    Raises:
        RunDirLockedError: from ``acquire()`` when another trainer holds the lock; the message
            says which process.
    """

    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "RunDirLock":
        if self._fd is not None:
            return self
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise RunDirError(f"out_dir: {self.out_dir} is a file, not a directory")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW, no O_TRUNC (the holder's note stays readable); a link, a hard link or
        # anything but a regular file at .lock is refused before anything is written
        fd = open_lock_file(self.path)
        try:
            taken = filelock.lock_descriptor(fd, blocking=False)
        except BaseException:
            os.close(fd)
            raise
        if not taken:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirLockedError(f"out_dir: {self.out_dir} is in use by another trainer "
                                    f"({_describe(holder)}); wait for it to finish, stop it, or "
                                    "choose another directory") from None
        note = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds")}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(note) + "\n").encode())
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                filelock.unlock_descriptor(fd)
            finally:
                os.close(fd)

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown: the process's end frees the lock anyway
            pass


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        note = json.loads(os.read(fd, 4096).decode())
        return note if isinstance(note, dict) else {}
    except (OSError, ValueError):
        return {}  # the holder has not written its note yet


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process that is just starting"
    text = (f"pid {holder.get('pid')} on host {holder.get('host')}, since "
            f"{holder.get('started')}")
    if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        text += "; that is this process: close() the Trainer that still holds it"
    return text
