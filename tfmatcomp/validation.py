"""Argument checks at the public boundary, in one place.

Every check raises :class:`ValueError` whose message starts with the argument's name and states the
allowed range, e.g. ``"n_samples: must be a positive integer, got 0"``; it returns the value so that
a check can sit in an assignment. Integers are Python ``int`` (``bool`` is rejected, NumPy / torch
integer scalars are not accepted: convert them with ``int()`` first).

Example:
    >>> from tfmatcomp.validation import check_positive_int, check_in_range
    >>> check_positive_int("batch_size", 64)
    64
    >>> check_in_range("test_fraction", 0.25, 0.0, 1.0, closed=False)
    0.25
    >>> check_positive_int("batch_size", 0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size: must be a positive integer, got 0
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Collection
from typing import Any, TypeVar

__all__ = [
    "is_int",
    "check_positive_int",
    "check_int_in_range",
    "check_non_negative",
    "check_in_range",
    "check_probability",
    "check_choice",
    "renamed_argument",
]

T = TypeVar("T")


def is_int(value: Any) -> bool:
    """True for a Python ``int`` that is not a ``bool``.

    Example:
        >>> is_int(3), is_int(True), is_int(3.0)
        (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(name: str, value: Any, *, allow_none: bool = False) -> Any:
    """``value`` if it is an integer ``>= 1`` (or None with ``allow_none``), else ``ValueError``.

    Example:
        >>> check_positive_int("n_rows", 4), check_positive_int("max_iter", None, allow_none=True)
        (4, None)
    """
    if value is None and allow_none:
        return value
    if not is_int(value) or value < 1:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name}: must be a positive integer{extra}, got {value!r}")
    return value


def check_int_in_range(name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` if it is an integer in ``[lo, hi]`` (both inclusive), else ``ValueError``.

    Example:
        >>> check_int_in_range("layer", 2, 0, 3)
        2
        >>> check_int_in_range("layer", 4, 0, 3)
        Traceback (most recent call last):
        ...
        ValueError: layer: must be an integer in [0, 3], got 4
    """
    if not is_int(value) or not lo <= value <= hi:
        raise ValueError(f"{name}: must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def check_non_negative(name: str, value: Any) -> Any:
    """``value`` if it is a real number ``>= 0`` (not NaN), else ``ValueError``.

    Example:
        >>> check_non_negative("ridge", 0.0)
        0.0
    """
    if isinstance(value, bool) or not _as_float(value) >= 0:
        raise ValueError(f"{name}: must be >= 0, got {value!r}")
    return value


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def check_in_range(name: str, value: Any, lo: float, hi: float, *, closed: bool | tuple[bool, bool] = True
                   ) -> Any:
    """``value`` if it is a real number in the interval from ``lo`` to ``hi``, else ``ValueError``.

    Args:
        closed: True for ``[lo, hi]``, False for ``(lo, hi)``, or ``(low_closed, high_closed)``.

    Example:
        >>> check_in_range("p_mask", 0.3, 0.0, 1.0, closed=(True, False))
        0.3
        >>> check_in_range("p_mask", 1.0, 0.0, 1.0, closed=(True, False))
        Traceback (most recent call last):
        ...
        ValueError: p_mask: must lie in [0.0, 1.0), got 1.0
    """
    lo_closed, hi_closed = (closed, closed) if isinstance(closed, bool) else closed
    v = _as_float(value)
    ok = (not isinstance(value, bool) and v == v
          and (v >= lo if lo_closed else v > lo) and (v <= hi if hi_closed else v < hi))
    if not ok:
        interval = f"{'[' if lo_closed else '('}{lo}, {hi}{']' if hi_closed else ')'}"
        raise ValueError(f"{name}: must lie in {interval}, got {value!r}")
    return value


def check_probability(name: str, value: Any) -> Any:
    """``value`` if it is a probability in ``[0, 1]``, else ``ValueError``.

    Example:
        >>> check_probability("masked_row_fraction", 0.5)
        0.5
    """
    return check_in_range(name, value, 0.0, 1.0)


def check_choice(name: str, value: T, choices: Collection[T]) -> T:
    """``value`` if it is one of ``choices``, else ``ValueError`` listing them.

    Example:
        >>> check_choice("side", "left", ("left", "right"))
        'left'
        >>> check_choice("side", "up", ("left", "right"))
        Traceback (most recent call last):
        ...
        ValueError: side: must be one of ('left', 'right'), got 'up'
    """
    if value not in choices:
        raise ValueError(f"{name}: must be one of {tuple(choices)}, got {value!r}")
    return value


def renamed_argument(where: str, old_name: str, old_value: Any, new_name: str, new_value: T) -> T:
    """The value of a renamed keyword: ``new_value`` unless the deprecated ``old_value`` was given
    (not None), in which case that one, with a :class:`DeprecationWarning`.

    Example:
        >>> import warnings
        >>> renamed_argument("f", "chunk_size", None, "batch_size", 64)
        64
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always")
        ...     value = renamed_argument("f", "chunk_size", 8, "batch_size", 64)
        >>> value, str(w[0].message)
        (8, 'f: chunk_size is deprecated, use batch_size')
    """
    if old_value is None:
        return new_value
    warnings.warn(f"{where}: {old_name} is deprecated, use {new_name}", DeprecationWarning, stacklevel=3)
    return old_value
