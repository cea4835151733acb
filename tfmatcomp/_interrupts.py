"""Context managers that an interrupt cannot leave half-applied.

A ``KeyboardInterrupt`` (Ctrl-C, or any exception a Python signal handler raises) can arrive at
nearly any bytecode. A context manager that changes a model in ``__enter__`` and undoes it in
``__exit__`` can then be stopped half-way through either: in ``__enter__`` after some changes (and
``__exit__`` is never called), or in ``__exit__`` before the undo is done; a ``finally`` does not
help, since the interrupt can land on its first line. An :class:`Undoable` is safe against both:

* ``_apply`` records what ``_undo`` needs before its first change; ``_undo`` puts everything back
  and may be called any number of times, at any point of ``_apply`` (it is idempotent).
* While the ``__enter__`` or ``__exit__`` of an :class:`Undoable` is on the main thread's stack,
  every signal whose handler is a Python function is *deferred*: the handler is wrapped
  (:class:`_Deferring`) so that the signal is recorded and the original handler runs once the
  outermost ``__enter__`` / ``__exit__`` has finished. An interrupt that lands in ``__enter__``
  undoes what was applied and then raises (a context whose entry raised has changed nothing); one
  that lands in ``__exit__`` raises after the undo.
* Whether a signal landed inside ``__enter__`` / ``__exit__`` is read from the frame the handler
  runs in and its callers, so no flag has to be set first (the interrupt could precede it).
* The wrappers are installed when the first context is entered and removed when the last one is
  left; in between they call the original handler at once whenever no ``__enter__`` / ``__exit__``
  is running, so Ctrl-C in the body (a long forward pass) stops it as usual.

Main thread only: Python runs signal handlers in the main thread and ``signal.signal`` works only
there, so contexts on other threads install nothing and cannot be interrupted by a handler.
Exceptions injected by other means (``PyThreadState_SetAsyncExc``) and hard kills are not covered.

Example:
    >>> class Flag(Undoable):
    ...     def __init__(self, box):
    ...         self.box = box
    ...     def _apply(self):
    ...         self.box["on"] = True
    ...         return self.box
    ...     def _undo(self):
    ...         self.box["on"] = False
    >>> box = {"on": False}
    >>> with Flag(box):
    ...     box["on"]
    True
    >>> box["on"]
    False
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any, Callable

__all__ = ["Undoable", "UndoError", "undo_all"]

#: the signals a Python handler can be installed for (SIGKILL and SIGSTOP cannot have one)
_SIGNALS = tuple(sorted(set(signal.valid_signals()) - {getattr(signal, "SIGKILL", None),
                                                        getattr(signal, "SIGSTOP", None)}))
_live = 0  # contexts entered and not yet left on the main thread
_pending: list[tuple[Callable[..., Any], int]] = []  # deferred (handler, signum), in arrival order


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _protected(frame: FrameType | None) -> bool:
    """Whether ``frame`` or one of its callers is an ``Undoable.__enter__`` / ``__exit__``."""
    while frame is not None:
        if frame.f_code in _PROTECTED:
            return True
        frame = frame.f_back
    return False


class _Deferring:
    """A signal handler that calls ``original`` unless an enter / exit is running (then it defers)."""

    def __init__(self, original: Callable[..., Any]):
        self.original = original

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        if _protected(frame):
            _pending.append((self.original, signum))
            return None
        return self.original(signum, frame)


def _wrap_handlers() -> None:
    for sig in _SIGNALS:
        handler = signal.getsignal(sig)
        if callable(handler) and not isinstance(handler, _Deferring):
            signal.signal(sig, _Deferring(handler))


def _unwrap_handlers() -> None:
    """Put the original handlers back. A signal whose handler is back already is no longer deferred:
    if its handler raises meanwhile, the loop goes on and the exception is raised at the end."""
    error: BaseException | None = None
    todo = list(_SIGNALS)
    while todo:
        try:
            while todo:
                handler = signal.getsignal(todo[-1])
                if isinstance(handler, _Deferring):
                    signal.signal(todo[-1], handler.original)
                todo.pop()
        except BaseException as exc:  # noqa: BLE001 - raised below, once every handler is back
            error = error or exc
    if error is not None:
        raise error


def _release() -> None:
    global _live
    _live = max(_live - 1, 0)
    if _live == 0:
        _unwrap_handlers()


def _deliver() -> None:
    """Run the deferred handlers, oldest first (the first that raises stops; the rest wait)."""
    frame = sys._getframe(1)
    while _pending:
        handler, signum = _pending.pop(0)
        handler(signum, frame)


def _release_and_deliver(outermost: bool) -> None:
    try:
        _release()
    finally:
        if outermost:
            _deliver()


class UndoError(RuntimeError):
    """Some steps of an undo raised; every other step was still done. ``failed`` lists
    ``(what, exception)`` for the steps that could not be done."""

    def __init__(self, failed: list[tuple[str, BaseException]]):
        self.failed = failed
        super().__init__("could not restore " + "; ".join(
            f"{what} ({type(e).__name__}: {e})" for what, e in failed))


def undo_all(steps: list[tuple[str, Callable[[], Any]]]) -> None:
    """Run every ``(what, step)`` of an undo even when some raise, then raise one
    :class:`UndoError` naming what could not be restored (a ``KeyboardInterrupt`` in a step is
    re-raised after the remaining steps ran).

    Example:
        >>> done = []
        >>> undo_all([("a", lambda: done.append("a")), ("b", lambda: 1 / 0),
        ...           ("c", lambda: done.append("c"))])
        Traceback (most recent call last):
        ...
        tfmatcomp._interrupts.UndoError: could not restore b (ZeroDivisionError: division by zero)
        >>> done
        ['a', 'c']
    """
    failed: list[tuple[str, BaseException]] = []
    interrupt: BaseException | None = None
    for what, step in steps:
        try:
            step()
        except Exception as e:  # noqa: BLE001 - collected and raised once every step ran
            failed.append((what, e))
        except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt: finish the undo first
            interrupt = interrupt or e
    if interrupt is not None:
        raise interrupt
    if failed:
        raise UndoError(failed)


class Undoable:
    """A context manager whose ``_apply`` no exception or interrupt can leave half-done.

    Subclasses implement ``_apply()`` (make the changes; its return value is what ``with ... as``
    binds) and ``_undo()`` (idempotent: put back whatever ``_apply`` changed so far; also called
    when ``_apply`` has not started). See the module docs for how interrupts are deferred.
    """

    def _apply(self) -> Any:
        raise NotImplementedError

    def _undo(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        global _live
        guard = _on_main_thread()
        outermost = guard and not _protected(sys._getframe(1))
        counted = False
        try:
            if guard:
                # no call between these two statements, so no signal handler runs between them
                _live += 1
                counted = True
                if _live == 1:
                    _wrap_handlers()
            result = self._apply()
            if outermost:
                _deliver()
        except BaseException:
            try:
                self._undo()
            finally:
                if counted:
                    _release_and_deliver(outermost)
            raise
        return result

    def __exit__(self, *exc_info: Any) -> None:
        guard = _on_main_thread()
        try:
            self._undo()
        finally:
            if guard:
                _release_and_deliver(not _protected(sys._getframe(1)))


_PROTECTED = frozenset({Undoable.__enter__.__code__, Undoable.__exit__.__code__})
