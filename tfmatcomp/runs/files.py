"""Writing a run's files: no write follows a link, no file is seen half-written, a full disk says so.

Every file the library creates or replaces in a run directory goes through this module:

* :func:`replace_file` writes a fresh file (a new name from :func:`tempfile.mkstemp`, created with
  ``O_EXCL``, in the target's own directory) and renames it over the target. A symlink, fifo or
  hard link planted at the target's name, or at any name a temporary file could have, is replaced
  or ignored, never opened.
* :func:`open_append` opens a log for appending with ``O_NOFOLLOW`` and refuses anything but a
  regular file with one link.
* :func:`open_lock_file` opens a run directory's lock file the same way (created if absent).
* :func:`remove_entry` removes a file, link or folder found with ``lstat``, without following it.
* :func:`check_real_dir` refuses a folder of the run (``checkpoints/``, ``step_X``, ``seed-N``)
  that is a symlink.
* :func:`disk_full` turns "no space left on device" into :class:`DiskFullError`, which names the
  file and says that the last checkpoint is intact.

Example:
    >>> import os, tempfile
    >>> from pathlib import Path
    >>> run = Path(tempfile.mkdtemp())
    >>> outside = Path(tempfile.mkdtemp()) / "yours.txt"
    >>> _ = outside.write_text("keep me")
    >>> os.symlink(outside, run / "run.json")          # planted
    >>> replace_file(run / "run.json", "{}")
    >>> outside.read_text(), (run / "run.json").is_symlink()
    ('keep me', False)
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from tfmatcomp.runs.layout import TMP_SUFFIX, temporary_of

__all__ = ["RunDirError", "DiskFullError", "replace_file", "open_append", "AppendFile", "open_lock_file",
           "remove_entry", "check_real_dir", "disk_full", "is_temporary"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a fifo planted at a log's name: refused, not waited on


class RunDirError(ValueError):
    """A run directory that cannot be used as asked (it holds another run, has nothing to
    resume, a link where a run's file or folder belongs, ...)."""


class DiskFullError(OSError):
    """A file of a run could not be written because the disk is full.

    The message names the file, says that the disk is full and that the run's last checkpoint is
    intact: checkpoints are written to a temporary folder and renamed into place only once
    complete, so a full disk never damages one. Free some space and resume the run.
    """

    def __init__(self, path: str | os.PathLike):
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        return (f"path: {self.path} could not be written: the disk is full (no space left on "
                "device). Every earlier checkpoint is intact, and the run's last checkpoint can be "
                "resumed (resume=True, --resume) once there is space")


def _is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    # safetensors' writer reports the OS error in its text only
    return type(error).__name__ == "SafetensorError" and (
        "No space left on device" in str(error) or "os error 28" in str(error))


@contextlib.contextmanager
def disk_full(path: str | os.PathLike) -> Iterator[None]:
    """Turn an error that says the disk is full, raised in the body while writing ``path``, into
    :class:`DiskFullError` naming ``path``; every other error passes unchanged."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:
        if _is_disk_full(e):
            raise DiskFullError(path) from e
        raise


def is_temporary(name: str, of: frozenset[str] | set[str]) -> bool:
    """Whether ``name`` is a temporary copy (:data:`~tfmatcomp.runs.layout.TMP_FILE`) of one of the
    files named in ``of``: what a kill in the middle of :func:`replace_file` leaves.

    Example:
        >>> is_temporary(".run.json.k2j4_x9a.tmp", {"run.json"}), is_temporary("run.json.tmp", {"run.json"})
        (True, True)
        >>> is_temporary(".notes.k2j4_x9a.tmp", {"run.json"})
        False
    """
    return temporary_of(name) in of


def replace_file(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically: into a fresh temporary file in the
    same directory (a name no one can have planted a link at, created with ``O_EXCL``), flushed to
    disk, then renamed over ``path``. A reader never sees half a file, and whatever was at ``path``
    (a symlink, a fifo, a hard link to another file) is replaced, not opened.

    Raises:
        DiskFullError: the disk is full (``path`` is left as it was).
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with disk_full(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _open_regular(path: Path, flags: int, what: str) -> int:
    """``os.open`` that follows no link at the last component and keeps the descriptor only for a
    regular file with one link; :class:`RunDirError` naming ``what`` otherwise."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP or (path.is_symlink() and e.errno != errno.ENOSPC):
            raise RunDirError(f"{what}: {path} is a symbolic link; a run never writes through one "
                              "(it could point at any file). Remove it and try again") from None
        if e.errno == errno.ENXIO:  # a fifo with no reader
            raise RunDirError(f"{what}: {path} is not a regular file (a fifo); refused") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        kind = "a hard link to another file" if stat.S_ISREG(st.st_mode) else \
            "not a regular file (a fifo, device or directory)"
        raise RunDirError(f"{what}: {path} is {kind}; a run writes only its own files. Remove it "
                          "and try again")
    if _NONBLOCK:
        import fcntl  # a regular file: back to ordinary blocking writes

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    return fd


class AppendFile:
    """A log opened by :func:`open_append`: ``write`` appends at once (no buffer to lose) and
    turns a full disk into :class:`DiskFullError` naming the file."""

    def __init__(self, fd: int, path: Path):
        self.fd: int | None = fd
        self.path = path

    def write(self, text: str) -> int:
        if self.fd is None:
            raise ValueError(f"{self.path}: write to a closed log")
        data = text.encode("utf-8")
        with disk_full(self.path):
            while data:
                data = data[os.write(self.fd, data):]
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Nothing to do: every ``write`` reached the operating system already."""

    @property
    def closed(self) -> bool:
        return self.fd is None

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> "AppendFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def open_append(path: str | os.PathLike, what: str = "out_dir") -> AppendFile:
    """``path`` opened for appending text (created if absent), never through a link: a symlink
    (dangling or not), a hard link, a fifo or a device at ``path`` is refused with
    :class:`RunDirError` naming ``what``."""
    path = Path(path)
    with disk_full(path):
        fd = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what)
    return AppendFile(fd, path)


def open_lock_file(path: str | os.PathLike, what: str = "out_dir") -> int:
    """A read-write descriptor of the lock file ``path`` (created if absent, never truncated: the
    holder's note stays readable), never through a link: see :func:`open_append`."""
    path = Path(path)
    with disk_full(path):
        return _open_regular(path, os.O_RDWR | os.O_CREAT, what)


def remove_entry(path: str | os.PathLike) -> None:
    """Remove ``path``, found with ``lstat``: a link (dangling or not) or a file is unlinked, a
    real folder removed with everything in it; nothing is followed. An absent ``path`` is fine."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def check_real_dir(path: str | os.PathLike, what: str = "out_dir") -> Path:
    """``path`` if it is absent or a real folder; a symlink there (to a folder or dangling) is
    refused with :class:`RunDirError` naming ``what``, before anything is written into it."""
    path = Path(path)
    if path.is_symlink():
        raise RunDirError(f"{what}: {path} is a symbolic link to {os.readlink(path)}; a run's "
                          "folders are never links (training would write outside the run "
                          "directory). Remove it and try again")
    return path
