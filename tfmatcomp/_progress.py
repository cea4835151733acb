"""The one progress convention: every call a user may wait on takes ``progress: bool | None = None``.

* ``None`` (the default): a bar where someone watches, none elsewhere. Watched means a notebook
  kernel, or a terminal (stderr is a TTY); not watched means a pipe, a file, or a test run
  (``PYTEST_CURRENT_TEST`` is set) - and ``TQDM_DISABLE=1`` turns every default bar off.
* ``True``: always a bar (on stderr); ``False``: never.
* Inside another bar (a report's sections, an experiment called from a scan), a default bar draws
  nothing itself and moves the outer bar instead, so the outer bar advances *inside* its step
  and names what runs (``report: 40%|... heads · head scan 12/32``).

Bars come from ``tqdm.notebook`` in a notebook when ipywidgets is installed (the ``notebook``
extra), else from plain ``tqdm``, so a notebook never shows tqdm's "IProgress not found" warning.

Example:
    >>> from tfmatcomp._progress import bar, wanted
    >>> wanted(None)        # under pytest: no bar
    False
    >>> with bar(3, "demo", progress=False) as b:
    ...     for _ in range(3):
    ...         b.update()
    >>> b.n
    3
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["wanted", "bar", "tracked", "check_progress"]

_OUTER: contextvars.ContextVar["_Bar | None"] = contextvars.ContextVar("tfmatcomp_bar", default=None)


def check_progress(progress: Any) -> None:
    """Refuse anything but None, True or False for ``progress``."""
    if progress is not None and not isinstance(progress, bool):
        raise ValueError(f"progress: must be None (a bar when watched), True or False, got {progress!r}")


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (an IPython shell with a kernel attached)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython without a running shell
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def wanted(progress: bool | None) -> bool:
    """What ``progress`` means here: True/False as given; None: a notebook or a terminal, but not
    under pytest, in a pipe or with ``TQDM_DISABLE`` set."""
    check_progress(progress)
    if progress is not None:
        return progress
    if os.environ.get("PYTEST_CURRENT_TEST") or os.environ.get("TQDM_DISABLE", "") not in ("", "0"):
        return False
    if in_notebook():
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _tqdm_class():
    if in_notebook():
        try:
            import ipywidgets  # noqa: F401  (tqdm.notebook needs it; without, tqdm warns)
            from tqdm.notebook import tqdm
            return tqdm
        except ImportError:
            pass
    from tqdm.std import tqdm
    return tqdm


class _Bar:
    """A bar: a tqdm bar, a share of an outer bar's current step, or nothing."""

    def __init__(self, total: int | None, desc: str, progress: bool | None, unit: str):
        self.total, self.desc, self.n = total, desc, 0
        self._tqdm = None
        self._closed = False
        self._outer: _Bar | None = None
        outer = _OUTER.get()
        if progress is None and outer is not None and outer.drawing:
            self._outer = outer
        elif wanted(progress):
            self._tqdm = _tqdm_class()(total=total, desc=desc, unit=unit, dynamic_ncols=True,
                                       file=sys.stderr, leave=outer is None)
        #: where this step's share of the outer bar starts and may go (set by :meth:`step`)
        self._step_start: float | None = None

    @property
    def drawing(self) -> bool:
        """Whether anything is drawn (this bar or an outer one it moves)."""
        if self._closed:
            return False
        return self._tqdm is not None or (self._outer is not None and self._outer.drawing)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._tqdm is not None:
            self._tqdm.update(n)
        elif self._outer is not None:
            left = (self.total - self.n + 1) if self.total else 2
            self._outer._advance_within(n / max(left, 1), f"{self.desc} {self.n}/{self.total or '?'}")

    def set_postfix_str(self, text: str) -> None:
        if self._tqdm is not None:
            self._tqdm.set_postfix_str(text, refresh=True)
        elif self._outer is not None:
            self._outer._advance_within(0.0, f"{self.desc} {text}")

    def _advance_within(self, fraction: float, text: str) -> None:
        """Move a fraction of what is left of the current step (never past 95% of it)."""
        if self._tqdm is None:
            if self._outer is not None:
                self._outer._advance_within(fraction, f"{self.desc} · {text}")
            return
        if self._step_start is None:
            self._tqdm.set_postfix_str(text, refresh=True)
            return
        cap = self._step_start + 0.95
        move = max(0.0, (cap - self._tqdm.n) * min(fraction, 1.0))
        self._tqdm.set_postfix_str(f"{self._label} · {text}", refresh=False)
        self._tqdm.update(move)

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        """One step of this bar, named ``label``: calls inside with the default ``progress`` move
        the bar within the step; it ends exactly one step further on."""
        self._label = label
        if self._tqdm is not None:
            self._step_start = float(self._tqdm.n)
            self._tqdm.set_postfix_str(label, refresh=True)
        try:
            yield
        finally:
            if self._tqdm is not None:
                self._tqdm.n = self._step_start + 1
                self._tqdm.refresh()
                self._step_start = None
                self.n += 1
            else:
                self.update()

    def close(self) -> None:
        self._closed = True
        if self._tqdm is not None:
            if self.total is not None and isinstance(self._tqdm.n, float):
                self._tqdm.n = round(self._tqdm.n)
            self._tqdm.close()


@contextmanager
def bar(total: int | None, desc: str, progress: bool | None = None, unit: str = "step"
        ) -> Iterator[_Bar]:
    """A bar of ``total`` steps named ``desc`` for the duration of the block (see the module)."""
    b = _Bar(total, desc, progress, unit)
    token = _OUTER.set(b)
    try:
        yield b
    finally:
        try:
            _OUTER.reset(token)
        except ValueError:  # a generator (tracked) closed from another context: nothing to undo
            pass
        b.close()


def tracked(items: Iterable, desc: str, progress: bool | None = None, total: int | None = None,
            unit: str = "step") -> Iterator:
    """``items``, one bar step per item (``total`` defaults to ``len(items)`` where it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with bar(total, desc, progress, unit) as b:
        for item in items:
            yield item
            b.update()
