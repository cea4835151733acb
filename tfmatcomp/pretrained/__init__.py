"""Pretrained runs: a registry of verified files, found bundled, in a directory, or on the Hub.

Each run is a run directory (``metrics.jsonl`` + ``checkpoints/step_XXXXXXX/``) plus a
``pretrained.json`` naming its pre-shift and post-shift steps, so everything that takes a run
directory (:func:`tfmatcomp.read_metrics`, :func:`tfmatcomp.list_checkpoints`, ``tfmatcomp report``)
also takes :func:`run_dir` of a pretrained run. ``registry.json`` (:mod:`.registry`) lists every
file of every run with its size and SHA-256; the wheel bundles ``tiny`` and what
``tfmatcomp demo --preset paper-cpu --bundled`` needs, and the rest comes from the three sources
of :mod:`.sources`, each file verified before it is used (docs/pretrained.md).

Example:
    >>> import tfmatcomp as tm
    >>> sorted(tm.pretrained.available())
    ['paper-4l8h', 'paper-cpu', 'tiny']
    >>> model = tm.load_pretrained("tiny", step="post")
    >>> model.cfg.n_layers
    2
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.pretrained.registry import load_registry, run_entry
from tfmatcomp.pretrained.sources import (
    PretrainedFileRefused, PretrainedUnavailable, RunStatus, fetch, find_local, models_dir_of,
    status,
)
from tfmatcomp.runs.checkpoint import load_checkpoint
from tfmatcomp.runs.layout import checkpoint_path

__all__ = ["available", "run_dir", "run_info", "load_pretrained", "resolve_step", "pull", "partial_note",
           "RunStatus", "PretrainedFileRefused", "PretrainedUnavailable"]

ModelsDir = str | os.PathLike | None


def available(models_dir: ModelsDir = None) -> dict[str, RunStatus]:
    """``{name: RunStatus}`` for every run of the registry: its size, steps, and where its files
    are now (bundled, checkout, directory, cache or remote), found by presence and size only;
    files are verified when loaded."""
    where = models_dir_of(models_dir)
    return {name: status(run, where) for name, run in sorted(load_registry().items())}


def run_info(name: str = "tiny") -> dict[str, Any]:
    """The run's ``pretrained.json`` (pre/post-shift steps, how it was trained), from the registry."""
    return dict(run_entry(name).info)


def run_dir(name: str = "tiny", models_dir: ModelsDir = None) -> Path:
    """The run directory of the pretrained run ``name``: the first source holding the whole run,
    else the first holding its logs and its pre- and post-shift checkpoints (what the wheel
    bundles of ``paper-cpu``), else the download cache's folder after fetching those.

    Raises:
        ValueError: for an unknown name, listing the runs; or a file that fails its SHA-256.
        PretrainedUnavailable: (an ``OSError``) when the files are nowhere here and the Hub cannot
            give them, in one line naming the run, its size and the three ways to get it.
    """
    run = run_entry(name)
    where = models_dir_of(models_dir)
    return (find_local(run, list(run.files.values()), where)
            or fetch(run, run.core_files(), where))


def resolve_step(name: str, step: int | str) -> int:
    """Turn ``"pre"``, ``"post"``, ``"latest"`` or an int into a step of run ``name``."""
    run = run_entry(name)
    if step in ("pre", "pre_shift"):
        step = run.pre_shift_step
    elif step in ("post", "post_shift"):
        step = run.post_shift_step
    elif step == "latest":
        step = run.steps[-1]
    if not isinstance(step, int) or isinstance(step, bool) or step not in run.steps:
        raise ValueError(f"step: run {name!r} has steps {run.steps} (or 'pre', 'post', "
                         f"'latest'), got {step!r}")
    return step


def load_pretrained(name: str = "tiny", step: int | str = "post",
                    device: torch.device | str | None = None, *,
                    models_dir: ModelsDir = None) -> HookedEncoder:
    """A pretrained checkpoint as a ready model, its files verified against the registry.

    Args:
        name: a run of the registry (see :func:`available`).
        step: one of the run's steps, or ``"pre"`` / ``"post"`` (the run's pre- and post-shift
            steps) or ``"latest"``.
        device: where to put the model.
        models_dir: a folder holding ``<name>/...`` (default ``$TFMATCOMP_MODELS_DIR``), tried
            after the package's own files and before the download cache and the Hub.
    """
    step = resolve_step(name, step)
    run = run_entry(name)
    root = fetch(run, run.step_files(step), models_dir_of(models_dir))
    return load_checkpoint(checkpoint_path(root, step), device=device)


def pull(name: str, steps: list[int] | None = None, models_dir: ModelsDir = None) -> Path:
    """Make the run ``name`` (or, with ``steps``, its logs and those checkpoints) local and
    verified; returns the folder that holds it."""
    run = run_entry(name)
    chosen = [resolve_step(name, s) for s in steps] if steps is not None else run.steps
    files = [f for f in run.files.values() if f.step is None or f.step in chosen]
    return fetch(run, files, models_dir_of(models_dir))


def partial_note(name: str, steps_here: Iterable[int]) -> str:
    """``""`` when ``steps_here`` holds every checkpoint of run ``name``; else a sentence saying
    which ones this copy has and how to fetch the rest (a wheel carries two of paper-cpu's five)."""
    steps, here = run_entry(name).steps, sorted(set(steps_here))
    if set(steps) <= set(here):
        return ""
    return (f"this copy of {name} has checkpoints {', '.join(f'{s:,}' for s in here)} of its "
            f"{len(steps)} ({', '.join(f'{s:,}' for s in steps)}); `tfmatcomp models pull {name}` "
            "fetches the rest")
