"""Compute every section on a run and write the report.

Example:
    >>> from tfmatcomp.report import build_report
    >>> report = build_report("tiny", "/tmp/tiny-report.html", n_samples=32, progress=False,
    ...                       sections=["training", "copying"])
    >>> report.failed
    []
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from tfmatcomp._progress import bar, check_progress
from tfmatcomp.report.render import render
from tfmatcomp.report.run import load_context
from tfmatcomp.report.sections import DEFAULT_SECTIONS, SECTIONS, Section
from tfmatcomp.validation import check_device, check_seed, is_int, writable_output

__all__ = ["Report", "build_report", "compute_sections"]


@dataclass
class Report:
    """What :func:`build_report` wrote."""

    path: Path
    sections: list[Section]

    @property
    def failed(self) -> list[str]:
        return [s.key for s in self.sections if s.error]


def build_report(
    run: str | os.PathLike = "tiny",
    out: str | os.PathLike = "report.html",
    *,
    pre_step: int | None = None,
    post_step: int | None = None,
    n_samples: int = 256,
    seed: int = 0,
    sections: list[str] | None = None,
    device: torch.device | str | None = None,
    progress: bool | None = None,
) -> Report:
    """Compute every analysis on a run's pre- and post-shift checkpoints and write one HTML file.

    Args:
        run: a run directory (``metrics.jsonl`` + ``checkpoints/``), a multi-seed run directory
            (then the typical seed that dropped is analysed and every seed's curve is shown), or a
            bundled run's name.
        out: the HTML file to write (self-contained: plotly.js is embedded).
        pre_step, post_step: checkpoints to analyse (default: see :mod:`tfmatcomp.report.run`).
        n_samples: matrices per experiment (the papers use 256 and 512 for the copying check).
        seed: seeds every sample drawn.
        sections: keys of :data:`SECTIONS` to compute (default: :data:`DEFAULT_SECTIONS`, all
            but the opt-in ``llc``, which needs the ``llc`` extra and about 40 s per checkpoint).
        device: where to run the models (default: CPU).
        progress: a bar over the sections that also advances inside each (None: on a terminal
            or in a notebook, not in a pipe or under pytest; :mod:`tfmatcomp._progress`).

    Returns:
        A :class:`Report`; sections that raised are listed in ``report.failed`` and shown in the
        HTML with their traceback (the others are still computed).
    """
    if not is_int(n_samples) or n_samples < 8:
        raise ValueError(f"n_samples: must be an integer >= 8, got {n_samples!r}")
    for name, step in (("pre_step", pre_step), ("post_step", post_step)):
        if step is not None and (not is_int(step) or step < 0):
            raise ValueError(f"{name}: must be None or a checkpoint step (an integer >= 0), got "
                             f"{step!r}")
    if pre_step is not None and post_step is not None and pre_step >= post_step:
        raise ValueError(f"pre_step, post_step: the pre-shift step ({pre_step:,}) must come "
                         f"before the post-shift step ({post_step:,})")
    check_seed("seed", seed)
    check_progress(progress)
    if device is not None:
        check_device("device", device)
    if isinstance(sections, str) or (sections is not None and not hasattr(sections, "__iter__")):
        raise ValueError(f"sections: must be a list of section keys from {list(SECTIONS)}, got "
                         f"{sections!r}")
    keys = list(DEFAULT_SECTIONS) if sections is None else list(sections)
    unknown = [k for k in keys if k not in SECTIONS]
    if unknown:
        raise ValueError(f"sections: unknown {unknown}; choose from {list(SECTIONS)}")
    with writable_output("out", out) as out:  # checked before anything is computed
        t0 = time.perf_counter()
        ctx = load_context(run, pre_step=pre_step, post_step=post_step, n_samples=n_samples,
                           seed=seed, device=device)
        done = compute_sections(ctx, keys, progress)
        out.write_text(render(ctx, done, time.perf_counter() - t0), encoding="utf-8")
    return Report(path=out, sections=done)


def compute_sections(ctx, keys: list[str], progress: bool | None = False, table=SECTIONS
                     ) -> list[Section]:
    """Run the sections ``keys`` of ``table`` in order on ``ctx``, under ``torch.no_grad()``.

    Args:
        ctx: what every section function reads (a :class:`~tfmatcomp.report.run.RunContext` for
            :data:`~tfmatcomp.report.sections.SECTIONS`; the geometry report passes its own context
            and table).
        keys: keys of ``table``, in the order to compute them.
        progress: a bar over the sections; the experiments a section calls move it within the
            section (:mod:`tfmatcomp._progress`).
        table: ``{key: (title, fn)}``; ``fn(ctx, section)`` fills the :class:`Section`.

    Returns:
        One :class:`Section` per key, with its run time. A section whose function raised keeps the
        traceback in ``section.error`` (also printed to stderr) and the others are still computed.

    Example:
        >>> table = {"a": ("A", lambda ctx, s: s.items.append(ctx)), "b": ("B", lambda ctx, s: 1 / 0)}
        >>> done = compute_sections(7, ["a", "b"], table=table)
        >>> [(s.title, s.items, s.error is None) for s in done]
        [('A', [7], True), ('B', [], False)]
    """
    done: list[Section] = []
    with bar(len(keys), "report", progress, unit="section") as b:
        for key in keys:
            title, fn = table[key]
            section = Section(key=key, title=title)
            start = time.perf_counter()
            with b.step(key):
                try:
                    with torch.no_grad():
                        fn(ctx, section)
                except Exception:  # a failed analysis must not hide the others; it is shown
                    section.error = traceback.format_exc()
                    print(f"report: section {key!r} failed:\n{section.error}", file=sys.stderr)
            section.seconds = time.perf_counter() - start
            done.append(section)
    return done
