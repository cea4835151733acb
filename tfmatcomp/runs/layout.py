"""The names inside a run directory: every file and folder a run writes, defined here only.

A run directory (``RUN_DIR``, the ``out_dir`` of :func:`tfmatcomp.train`)::

    RUN_DIR/
        .lock                       LOCK_FILE: held by the trainer writing here
        run.json                    RUN_FILE: the run's model / task / train configs
        metrics.jsonl               METRICS_FILE: one JSON object per logged step
        metrics.jsonl.bad           BAD_LINES_FILE: unreadable log lines set aside on resume
        checkpoints/                CHECKPOINTS_DIR
            step_0004000/           checkpoint_dir_name(4000)
                config.json         CONFIG_FILE: configs, step, SHA-256 of every file
                model.safetensors   WEIGHTS_FILE (or shards SHARD_NAME and INDEX_FILE)
                state.safetensors   STATE_TENSORS_FILE: optimizer moments, RNG states
                state.json          STATE_FILE: the rest of the training state

A multi-seed group directory holds ``seeds.json`` (:data:`GROUP_FILE`) and one run directory per
seed, ``seed-{s}`` (:func:`seed_dir`); a sweep directory holds ``sweep.json``
(:data:`SWEEP_FILE`) and one group directory per configuration. :func:`list_checkpoints` is the
one function that lists a run's checkpoints.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> run = Path(tempfile.mkdtemp())
    >>> (checkpoint_path(run, 40) / CONFIG_FILE).parent.mkdir(parents=True)
    >>> (checkpoint_path(run, 40) / CONFIG_FILE).write_text("{}")
    2
    >>> checkpoint_path(run, 7).mkdir()                  # no config.json: not complete
    >>> {s: p.name for s, p in list_checkpoints(run).items()}
    {40: 'step_0000040'}
    >>> list(list_checkpoints(run, complete=False))
    [7, 40]
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "LOCK_FILE", "RUN_FILE", "GROUP_FILE", "SWEEP_FILE", "PRETRAINED_FILE", "METRICS_FILE",
    "BAD_LINES_FILE", "TMP_SUFFIX", "TMP_FILE", "temporary_of", "CHECKPOINTS_DIR", "CONFIG_FILE", "WEIGHTS_FILE",
    "INDEX_FILE", "SHARD_NAME", "STATE_TENSORS_FILE", "STATE_FILE", "SEED_DIR", "START_FILES",
    "RUN_FILES", "LEFTOVER", "checkpoint_dir_name", "checkpoint_path", "checkpoints_root",
    "shard_name", "seed_dir", "list_checkpoints", "latest_checkpoint", "has_training_state",
]

# ------------------------------------------------------------------------ a run directory
#: The lock file (pid, host and start time of the trainer writing the run).
LOCK_FILE = ".lock"
#: The run's configs (``kind``, ``model``, ``task``, ``train``, how it runs).
RUN_FILE = "run.json"
#: The metrics log, one JSON object per logged step.
METRICS_FILE = "metrics.jsonl"
#: Where resume keeps the metrics log's unreadable lines (``{"line": n, "text": ...}`` per line).
BAD_LINES_FILE = "metrics.jsonl.bad"
#: Suffix of a file being replaced atomically (written, then renamed over the file).
TMP_SUFFIX = ".tmp"
#: A file being replaced atomically: ``.NAME.XXXXXXXX.tmp`` (a fresh name from ``mkstemp`` beside
#: ``NAME``, :func:`tfmatcomp.runs.files.replace_file`), or ``NAME.tmp`` as older versions wrote.
TMP_FILE = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp|(?P<old>[^.].*)\.tmp")
#: The folder holding the run's checkpoints.
CHECKPOINTS_DIR = "checkpoints"
#: A multi-seed group directory's list of its seeds.
GROUP_FILE = "seeds.json"
#: A sweep directory's list of its configurations.
SWEEP_FILE = "sweep.json"
#: A bundled run's pre- and post-shift steps and how it was trained (:mod:`tfmatcomp.pretrained`).
PRETRAINED_FILE = "pretrained.json"
#: Run directories of a group: ``seed-{s}``.
SEED_DIR = re.compile(r"seed-\d+")

# --------------------------------------------------------------------------- a checkpoint
#: A checkpoint's configs, step, dtype and the SHA-256 of each of its files.
CONFIG_FILE = "config.json"
#: A checkpoint's weights in one file.
WEIGHTS_FILE = "model.safetensors"
#: The shards' index (transformers' layout) when the weights are sharded.
INDEX_FILE = "model.safetensors.index.json"
#: A shard of the weights: ``model-0000k-of-0000n.safetensors`` (:func:`shard_name`).
SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
#: The optimizer moments and random-number states saved for resuming.
STATE_TENSORS_FILE = "state.safetensors"
#: The rest of the training state (step, optimizer groups).
STATE_FILE = "state.json"
#: A checkpoint directory's name: ``step_0004000``.
_CHECKPOINT_NAME = re.compile(r"step_(\d+)")
#: What a killed checkpoint write leaves in ``checkpoints/``: ``.step_XXXXXXX.tmp-*`` (being
#: written) or ``.step_XXXXXXX.old-*`` (being replaced).
LEFTOVER = re.compile(r"\.(step_\d+)\.(tmp|old)-.+")

#: What a start that failed before its first logged step leaves (besides an empty metrics log).
START_FILES = frozenset({LOCK_FILE, RUN_FILE, GROUP_FILE})
#: Everything a run or a multi-seed group writes; ``overwrite`` clears nothing else.
RUN_FILES = START_FILES | {METRICS_FILE, METRICS_FILE + TMP_SUFFIX, BAD_LINES_FILE,
                           CHECKPOINTS_DIR}


def temporary_of(name: str) -> str | None:
    """The file that ``name`` is a temporary copy of (see :data:`TMP_FILE`), else None.

    Example:
        >>> temporary_of(".run.json.k2j4_x9a.tmp"), temporary_of("config.json.tmp"), temporary_of("x")
        ('run.json', 'config.json', None)
    """
    m = TMP_FILE.fullmatch(name)
    return (m.group("name") or m.group("old")) if m else None


def checkpoint_dir_name(step: int) -> str:
    """Directory name of the checkpoint at ``step`` inside a run.

    Example:
        >>> checkpoint_dir_name(4000)
        'step_0004000'
    """
    return f"step_{step:07d}"


def checkpoints_root(run_dir: str | os.PathLike) -> Path:
    """``RUN_DIR/checkpoints``."""
    return Path(run_dir) / CHECKPOINTS_DIR


def checkpoint_path(run_dir: str | os.PathLike, step: int) -> Path:
    """``RUN_DIR/checkpoints/step_XXXXXXX``, the checkpoint of ``step`` (present or not)."""
    return checkpoints_root(run_dir) / checkpoint_dir_name(step)


def shard_name(index: int, count: int) -> str:
    """File name of shard ``index`` (1-based) of ``count``.

    Example:
        >>> shard_name(1, 3), bool(SHARD_NAME.fullmatch(shard_name(1, 3)))
        ('model-00001-of-00003.safetensors', True)
    """
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def seed_dir(out_dir: str | os.PathLike, seed: int) -> Path:
    """The run directory of ``seed`` inside a multi-seed group directory: ``OUT/seed-{seed}``.

    Example:
        >>> seed_dir("runs/group", 3).as_posix()
        'runs/group/seed-3'
    """
    return Path(out_dir) / f"seed-{int(seed)}"


def list_checkpoints(run_dir: str | os.PathLike, complete: bool = True) -> dict[int, Path]:
    """``{step: checkpoint directory}`` of a run, sorted by step (empty if none).

    Args:
        run_dir: the run directory.
        complete: list only checkpoints holding their ``config.json`` (those a loader can read);
            False lists every ``checkpoints/step_XXXXXXX`` directory, usable or not (what
            resume inspects and cuts back).
    """
    found = {}
    root = checkpoints_root(run_dir)
    for p in sorted(root.iterdir()) if root.is_dir() else ():
        m = _CHECKPOINT_NAME.fullmatch(p.name)
        if m and p.is_dir() and (not complete or (p / CONFIG_FILE).exists()):
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def has_training_state(checkpoint: str | os.PathLike) -> bool:
    """Whether the checkpoint directory holds training state (it can be resumed from)."""
    return (Path(checkpoint) / STATE_FILE).exists()


def latest_checkpoint(run_dir: str | os.PathLike, with_state: bool = False) -> Path | None:
    """The checkpoint with the largest step (optionally only among those holding training state);
    None when there is none."""
    for p in reversed(list_checkpoints(run_dir).values()):
        if not with_state or has_training_state(p):
            return p
    return None
