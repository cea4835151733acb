"""Checkpoints bundled inside the package, loadable offline.

Each bundled run is a run directory (``metrics.jsonl`` + ``checkpoints/step_XXXXXXX/``) plus a
``pretrained.json`` naming its pre-shift and post-shift steps, so everything that takes a run
directory (:func:`tfmatcomp.read_metrics`, :func:`tfmatcomp.list_checkpoints`, ``tfmatcomp report``)
also takes :func:`run_dir` of a bundled run.

Example:
    >>> import tfmatcomp as tm
    >>> sorted(tm.pretrained.available())
    ['paper-4l8h', 'paper-cpu', 'tiny']
    >>> model = tm.load_pretrained("tiny", step="post")
    >>> model.cfg.n_layers
    2
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tfmatcomp.runs.checkpoint import list_checkpoints, load_checkpoint
from tfmatcomp.runs.layout import PRETRAINED_FILE
from tfmatcomp.models.encoder import HookedEncoder

__all__ = ["available", "run_dir", "run_info", "load_pretrained", "resolve_step"]

_ROOT = Path(__file__).resolve().parent


def available() -> dict[str, list[int]]:
    """``{name: [bundled steps]}`` for every bundled run."""
    return {p.name: list(list_checkpoints(p)) for p in sorted(_ROOT.iterdir())
            if (p / PRETRAINED_FILE).exists()}


def run_dir(name: str = "tiny") -> Path:
    """The run directory of the bundled run ``name``.

    Raises:
        ValueError: for an unknown name, listing the bundled ones.
    """
    names = sorted(available())
    if not isinstance(name, str) or name not in names:  # a name, never a path ("../x", "/tmp/run")
        raise ValueError(f"name: no bundled run {name!r}; bundled runs are {names} (to load a "
                         "checkpoint from a path use tfmatcomp.load_checkpoint)")
    path = _ROOT / name
    if not (path / PRETRAINED_FILE).exists():
        raise ValueError(f"name: no bundled run {name!r}; bundled runs are {sorted(available())}")
    return path


def run_info(name: str = "tiny") -> dict[str, Any]:
    """The bundled run's ``pretrained.json`` (pre/post-shift steps, how it was trained)."""
    from tfmatcomp.validation import read_json_bounded

    return read_json_bounded(PRETRAINED_FILE, run_dir(name) / PRETRAINED_FILE)


def resolve_step(name: str, step: int | str) -> int:
    """Turn ``"pre"``, ``"post"``, ``"latest"`` or an int into a bundled step of run ``name``."""
    steps = list(list_checkpoints(run_dir(name)))
    info = run_info(name)
    if step in ("pre", "pre_shift"):
        step = info["pre_shift_step"]
    elif step in ("post", "post_shift"):
        step = info["post_shift_step"]
    elif step == "latest":
        step = steps[-1]
    if not isinstance(step, int) or step not in steps:
        raise ValueError(f"step: run {name!r} bundles steps {steps} (or 'pre', 'post', 'latest'), "
                         f"got {step!r}")
    return step


def load_pretrained(name: str = "tiny", step: int | str = "post",
                    device: torch.device | str | None = None) -> HookedEncoder:
    """A bundled checkpoint as a ready model (offline).

    Args:
        name: bundled run (see :func:`available`).
        step: a bundled step, or ``"pre"`` / ``"post"`` (the run's pre- and post-shift steps) or
            ``"latest"``.
        device: where to put the model.
    """
    step = resolve_step(name, step)
    return load_checkpoint(list_checkpoints(run_dir(name))[step], device=device)
