"""One run's directory as a trainer holds it: the lock, the metrics record, the checkpoints and the
choice of the checkpoint a resume continues from.

A :class:`RunDirectory` knows files, never a model: what a checkpoint holds and how a run's state
is restored from one are the caller's (:class:`~tfmatcomp.training.trainer.RunState`), passed in
as functions. Every host of the one training loop (:class:`~tfmatcomp.Trainer`, each seed of a
:class:`~tfmatcomp.MultiSeedTrainer`, :func:`~tfmatcomp.training.lm.train_lm`) writes its run
through one. Without a path it keeps the metrics record in memory and touches no file.

The rules (a fresh start needs an empty directory or ``overwrite``; a resume first removes what a
killed trainer left half-written; one writer at a time) are :mod:`tfmatcomp.runs.rundir`'s.

Example:
    >>> d = RunDirectory(None)
    >>> d.append({"step": 1, "train_L": 0.5}), len(d.records)
    ({'step': 1, 'train_L': 0.5}, 1)
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable

from tfmatcomp.runs import rundir
from tfmatcomp.runs.checkpoint import CheckpointError, ConfigMismatchError
from tfmatcomp.runs.layout import (
    METRICS_FILE, RUN_FILE, checkpoint_path, has_training_state, list_checkpoints,
)
from tfmatcomp.runs.files import AppendFile, open_append, replace_file
from tfmatcomp.runs.rundir import RunDirError

__all__ = ["RunDirectory"]


class RunDirectory:
    """One run's directory (``path``; None: in memory) and its metrics record (see the module
    docstring).

    Args:
        path: the run directory, or None.
        overwrite: a fresh start clears a directory that holds a run (only run files).
    """

    def __init__(self, path: str | os.PathLike | None, overwrite: bool = False):
        self.path = Path(path) if path is not None else None
        self.overwrite = bool(overwrite)
        #: the metrics rows of the run so far (cut back on resume)
        self.records: list[dict[str, Any]] = []
        self._lock = rundir.RunDirLock(self.path) if self.path is not None else None
        self._claimed = False
        self._fingerprint: tuple | None = None

    # ------------------------------------------------------------------ the lock
    def claim(self, resuming: bool) -> None:
        """Lock the run directory (nothing without one, or while this directory holds it). The
        first time, check that this run may write there: a fresh start needs an empty directory
        (or ``overwrite``); a resume (``resuming``) first removes what a killed trainer left
        half-written. Later, check that nobody wrote there since this run did.

        Raises:
            RunDirLockedError: another trainer holds the lock.
            RunDirError: the directory cannot take this run (see :mod:`tfmatcomp.runs.rundir`).
        """
        if self._lock is None or self._lock.held:
            return
        self._lock.acquire()
        try:
            if not self._claimed:
                if resuming:
                    rundir.check_kind(self.path, group=False)
                    rundir.remove_leftovers(self.path)
                else:
                    rundir.check_fresh(self.path, self.overwrite)
                self._claimed = True
            elif rundir.fingerprint(self.path) != self._fingerprint:
                raise RunDirError(
                    f"out_dir: {self.path} changed since this trainer last wrote to it "
                    "(another trainer used it); continue it with a new Trainer and resume()")
        except BaseException:
            self._lock.release()
            raise

    def release(self) -> None:
        """Release the lock, remembering what the directory held (for the next :meth:`claim`)."""
        if self._lock is not None and self._lock.held:
            self._fingerprint = rundir.fingerprint(self.path)
            self._lock.release()

    def shared(self) -> None:
        """Another process holds this directory (a data-parallel rank other than 0): never lock
        it here."""
        self._lock = None

    # ----------------------------------------------------------- the metrics record
    def open_log(self, info: dict[str, Any] | None) -> AppendFile | None:
        """Create the directory, write ``run.json`` (``info``; none when None) and open the
        metrics log for appending (None without a directory)."""
        if self.path is None:
            return None
        self.path.mkdir(parents=True, exist_ok=True)
        if info is not None:
            # replaced, never opened: a link, fifo or device planted there is never written through
            replace_file(self.path / RUN_FILE, json.dumps(info, indent=2, sort_keys=True))
        return open_append(self.path / METRICS_FILE)  # O_NOFOLLOW, a regular one-link file only

    def append(self, record: dict[str, Any], log_file: AppendFile | None = None) -> dict[str, Any]:
        """Add ``record`` to the record and write it to ``log_file``."""
        self.records.append(record)
        if log_file is not None:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
        return record

    def cut_back(self, step: int) -> None:
        """Keep the log rows and checkpoints up to ``step`` (:func:`~tfmatcomp.runs.rundir.cut_back`)."""
        self.records = rundir.cut_back(self.path, step)

    # --------------------------------------------------------------- checkpoints
    def save(self, step: int, write: Callable[[Path], Any]) -> Path:
        """The checkpoint of ``step``: :meth:`claim` the directory, then ``write(path)``."""
        if self.path is None:
            raise ValueError("out_dir: the trainer has no run directory to save into")
        self.claim(resuming=False)
        path = checkpoint_path(self.path, step)
        write(path)
        return path

    def strip_older_states(self, step: int) -> None:
        """Drop the training state of every checkpoint but ``step``'s."""
        for s, p in list_checkpoints(self.path).items():
            if s != step and has_training_state(p):
                rundir.strip_state(p)

    def checkpoint_at(self, step: int) -> Path | None:
        """The checkpoint of ``step`` with training state, or None."""
        path = list_checkpoints(self.path).get(step)
        return path if path is not None and has_training_state(path) else None

    def resume_latest(self, restore: Callable[[Path, int], None],
                      check_recorded: Callable[[tuple], None]) -> bool:
        """Claim the directory for a resume and ``restore(path, step)`` its latest checkpoint with
        usable training state (a :class:`CheckpointError` moves on to the one before, with a
        warning); False when it holds no checkpoint at all, after checking that it holds at most
        the start of this very run (``check_recorded(run.json's configs)``) and cutting it back
        to step 0.

        Raises:
            ConfigMismatchError: from ``restore`` or ``check_recorded``.
            RunDirError: checkpoints but none with usable training state; files no run writes.
        """
        if self.path is None:
            raise ValueError("out_dir: resume needs a run directory")
        self.claim(resuming=True)
        problems = []
        for step, path in reversed(list_checkpoints(self.path, complete=False).items()):
            if not has_training_state(path):
                problems.append(f"{path.name} has no training state")
                continue
            try:
                restore(path, step)
            except ConfigMismatchError:
                raise
            except CheckpointError as e:
                problems.append(str(e))
                continue
            if problems:
                warnings.warn(f"out_dir: resumed {self.path} from {path.name}; later "
                              f"checkpoints were unusable ({'; '.join(problems)})", stacklevel=3)
            return True
        if problems:
            raise RunDirError(
                f"out_dir: {self.path} has checkpoints but none with usable training state "
                f"({'; '.join(problems[:3])}), so it cannot be resumed exactly. Start a new run "
                "from a checkpoint's weights (model=load_checkpoint(...)), or pass overwrite=True "
                "(--overwrite) to train this directory again from step 0")
        foreign = rundir.foreign_entries(self.path)
        if foreign:
            raise RunDirError(f"out_dir: {self.path} holds files that no run writes "
                              f"({foreign[:6]}) and no checkpoint; choose another directory")
        recorded = rundir.run_configs(self.path)
        if recorded is not None:
            check_recorded(recorded)
        self.cut_back(0)
        return False
