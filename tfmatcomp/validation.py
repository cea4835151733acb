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

import contextlib
import math
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any, Iterator, TypeVar

__all__ = [
    "is_int",
    "check_positive_int",
    "check_int_in_range",
    "check_non_negative",
    "check_in_range",
    "check_choice",
    "check_seed",
    "check_positive_float",
    "check_bool",
    "check_int_list",
    "check_float_dtype",
    "check_finite",
    "parse_json",
    "read_json_bounded",
    "check_output_file",
    "check_device",
    "writable_output",
]

MAX_SEED = 2**63 - 1

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


def check_seed(name: str, value: Any, *, allow_none: bool = False) -> Any:
    """``value`` if it is an integer seed in ``[0, 2**63 - 1]`` (what ``torch.Generator.manual_seed``
    takes without wrapping), else ``ValueError``.

    Example:
        >>> check_seed("seed", 0)
        0
        >>> check_seed("seed", 2**64)
        Traceback (most recent call last):
        ...
        ValueError: seed: must be an integer in [0, 2**63 - 1], got 18446744073709551616
    """
    if value is None and allow_none:
        return value
    if not is_int(value) or not 0 <= value <= MAX_SEED:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name}: must be an integer in [0, 2**63 - 1]{extra}, got {value!r}")
    return value


def check_positive_float(name: str, value: Any) -> Any:
    """``value`` if it is a finite real number ``> 0``, else ``ValueError`` (NaN and inf refused).

    Example:
        >>> check_positive_float("lr", 1e-3)
        0.001
        >>> check_positive_float("lr", float("inf"))
        Traceback (most recent call last):
        ...
        ValueError: lr: must be a finite number > 0, got inf
    """
    v = _as_float(value)
    if isinstance(value, (bool, str)) or not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (not a string or a number), else ``ValueError``.

    Example:
        >>> check_bool("learned_mask_embedding", "no")
        Traceback (most recent call last):
        ...
        ValueError: learned_mask_embedding: must be True or False, got 'no'
    """
    if not isinstance(value, bool):
        raise ValueError(f"{name}: must be True or False, got {value!r}")
    return value


def check_int_list(name: str, values: Any, lo: int | None = None, hi: int | None = None) -> list[int]:
    """``values`` (an iterable of integers, each in ``[lo, hi]`` when given) as a list of ``int``.

    NumPy / torch integer scalars are accepted here (they come out of index tensors); strings,
    floats and bools are not.

    Example:
        >>> check_int_list("layers", (0, 1))
        [0, 1]
        >>> check_int_list("layers", [0, "a"])
        Traceback (most recent call last):
        ...
        ValueError: layers: must be a list of integers, got [0, 'a']
    """
    from numbers import Integral

    if lo is not None and hi is not None:
        where = f" in [{lo}, {hi}]"
    else:
        where = f" >= {lo}" if lo is not None else (f" <= {hi}" if hi is not None else "")
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name}: must be a list of integers{where}, got {values!r}")
    items = list(values)
    if not all(isinstance(v, Integral) and not isinstance(v, bool) for v in items):
        raise ValueError(f"{name}: must be a list of integers{where}, got {items!r}")
    out = [int(v) for v in items]
    if any((lo is not None and v < lo) or (hi is not None and v > hi) for v in out):
        raise ValueError(f"{name}: must be a list of integers{where}, got {out!r}")
    return out


def shape_text(value: Any) -> Any:
    """What an error message says a tensor argument was: its shape as a tuple, or the name of
    the type given instead of a tensor.

    Example:
        >>> import torch
        >>> shape_text(torch.zeros(2, 3)), shape_text([1.0, 2.0])
        ((2, 3), 'list')
    """
    import torch

    return tuple(value.shape) if torch.is_tensor(value) else type(value).__name__


def check_float_dtype(name: str, dtype: Any) -> Any:
    """``dtype`` if it is a floating-point ``torch.dtype``, else ``ValueError`` (integer dtypes would
    silently truncate).

    Example:
        >>> import torch
        >>> check_float_dtype("dtype", torch.long)
        Traceback (most recent call last):
        ...
        ValueError: dtype: must be a floating-point torch dtype (float64, float32, ...), got torch.int64
    """
    import torch

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{name}: must be a floating-point torch dtype (float64, float32, ...), "
                         f"got {dtype!r}")
    return dtype


def check_sum_dtype(name: str, dtype: Any) -> Any:
    """``dtype`` if sums may accumulate in it (float32 or float64), else ``ValueError``: float16
    overflows past 65,504 and bfloat16 drops everything below 1/256 of the running total.

    Example:
        >>> import torch
        >>> check_sum_dtype("dtype", torch.float16)
        Traceback (most recent call last):
        ...
        ValueError: dtype: sums accumulate in torch.float32 or torch.float64 (half precision overflows or loses the small terms), got torch.float16
    """
    import torch

    check_float_dtype(name, dtype)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{name}: sums accumulate in torch.float32 or torch.float64 (half "
                         f"precision overflows or loses the small terms), got {dtype}")
    return dtype


#: Largest metrics log read (50,000 logged steps take about 20 MiB).
MAX_LOG_BYTES = 1 << 30
#: Largest JSON file of a run directory read (run.json, seeds.json, sweep.json, pretrained.json).
MAX_JSON_BYTES = 64 << 20


def read_bounded(name: str, path: Any, max_bytes: int, *, binary: bool = False) -> Any:
    """The content of the file at ``path`` (text, or bytes with ``binary``) if it is a regular file
    (after following symlinks) of at most ``max_bytes``; else ``ValueError`` naming ``name`` and
    the file. A fifo, a device (``/dev/zero``) or a directory is refused before it is opened, so a
    read can neither block nor run out of memory.

    Example:
        >>> read_bounded("log", "/dev/zero", 1 << 20)
        Traceback (most recent call last):
        ...
        ValueError: log: /dev/zero is not a regular file (a fifo, device or directory); refused
    """
    import stat as stat_module

    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"{name}: {path} cannot be read ({e.strerror})") from None
    if not stat_module.S_ISREG(st.st_mode):
        raise ValueError(f"{name}: {path} is not a regular file (a fifo, device or directory); "
                         "refused")
    if st.st_size > max_bytes:
        raise ValueError(f"{name}: {path} holds {st.st_size:,} bytes, more than the "
                         f"{max_bytes:,} read at most; refused")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{name}: {path} grew past {max_bytes:,} bytes while read; refused")
    if binary:
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{name}: {path} is not UTF-8 text") from None


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise _DuplicateKey(twice)
    return dict(pairs)


class _DuplicateKey(ValueError):
    def __init__(self, keys: list[str]):
        super().__init__(keys)
        self.keys = keys


def parse_json(name: str, text: str | bytes, source: Any = None) -> Any:
    """``text`` parsed as JSON, refusing an object that holds a key twice (Python keeps the last
    value, other readers the first, and a digest covers only one reading). ``ValueError`` in one
    line naming ``name`` and ``source`` (the file, or what the text is) otherwise.

    Example:
        >>> parse_json("run.json", '{"step": 3}')
        {'step': 3}
        >>> parse_json("config.json", '{"step": 3, "step": 6}', "ckpt/config.json")
        Traceback (most recent call last):
        ...
        ValueError: config.json: ckpt/config.json holds the key 'step' twice in one object; a JSON file with duplicate keys is refused (readers disagree on which value counts)
    """
    import json

    where = f"{source} " if source is not None else ""
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as e:
        keys = ", ".join(repr(k) for k in e.keys[:5])
        raise ValueError(f"{name}: {where}holds the key{'s' if len(e.keys) > 1 else ''} {keys} "
                         "twice in one object; a JSON file with duplicate keys is refused "
                         "(readers disagree on which value counts)") from None
    except (ValueError, RecursionError) as e:  # JSON errors, and ints past Python's digit limit
        raise ValueError(f"{name}: {where}is not valid JSON ({e})") from None


def read_json_bounded(name: str, path: Any, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """:func:`read_bounded`, parsed with :func:`parse_json` (no duplicate keys); invalid JSON
    raises ``ValueError`` naming the file."""
    return parse_json(name, read_bounded(name, path, max_bytes), path)


def check_finite(name: str, tensor: Any) -> Any:
    """``tensor`` if every entry is finite, else ``ValueError`` counting the NaN / inf entries.

    Example:
        >>> import torch
        >>> check_finite("h", torch.tensor([1.0, float("nan")]))
        Traceback (most recent call last):
        ...
        ValueError: h: must be finite; found 1 NaN and 0 inf entries
    """
    import torch

    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            n_nan = int(torch.isnan(tensor).sum())
            n_inf = int((~finite).sum()) - n_nan
            raise ValueError(f"{name}: must be finite; found {n_nan} NaN and {n_inf} inf entries")
    return tensor


def check_output_file(name: str, path: Any) -> Path:
    """``path`` as a :class:`~pathlib.Path` once it is known that a file can be written there.

    Creates the parent directory if needed and opens (then removes) a temporary sibling for
    writing, so a long computation is never started for a file that cannot be written. Raises
    ``ValueError`` naming ``name`` otherwise (parent is a file, no permission, a directory
    given, a full disk, ...).

    Example:
        >>> import tempfile
        >>> check_output_file("out", tempfile.mkdtemp() + "/sub/report.html").name
        'report.html'
        >>> check_output_file("out", "/dev/null/report.html")
        Traceback (most recent call last):
        ...
        ValueError: out: cannot write /dev/null/report.html (its parent /dev/null is not a directory)
    """
    import tempfile

    if not isinstance(path, (str, os.PathLike)) or str(path) == "":
        raise ValueError(f"{name}: must be a file path, got {path!r}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{name}: {path} is a directory; give a file name")
    if path.exists() and not path.is_file():
        raise ValueError(f"{name}: cannot write {path} (not a regular file)")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in [parent, *parent.parents] if p.exists() and not p.is_dir()),
                       parent)
        raise ValueError(f"{name}: cannot write {path} (its parent {blocker} is not a "
                         "directory)") from None
    except OSError as e:
        raise ValueError(f"{name}: cannot create the directory {parent} ({e.strerror})") from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".check", dir=parent)
        try:
            os.write(fd, b"x")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(tmp)
        if path.exists() and not os.access(path, os.W_OK):
            raise PermissionError(13, "permission denied")
    except OSError as e:
        raise ValueError(f"{name}: cannot write {path} ({e.strerror or e})") from None
    return path


@contextlib.contextmanager
def writable_output(name: str, path: Any) -> Iterator[Path]:
    """Check ``path`` with :func:`check_output_file` before the work that produces it, and yield it.

    If the body raises, the directories created for ``path`` are removed again (when still
    empty), so a failed computation leaves nothing behind.

    Example:
        >>> import os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> try:
        ...     with writable_output("out", root + "/a/b/report.html") as out:
        ...         raise KeyboardInterrupt
        ... except KeyboardInterrupt:
        ...     pass
        >>> os.listdir(root)
        []
    """
    target = Path(path) if isinstance(path, (str, os.PathLike)) else path
    missing = ([p for p in [target.parent, *target.parent.parents] if not p.exists()]
               if isinstance(target, Path) else [])
    try:
        yield check_output_file(name, path)
    except BaseException:
        for directory in missing:  # deepest first
            try:
                directory.rmdir()
            except OSError:
                break
        raise


def check_device(name: str, device: Any) -> Any:
    """``device`` as a ``torch.device`` if it names one that exists here, else ``ValueError``
    (an unknown device type, or CUDA / MPS requested where there is none).

    Example:
        >>> check_device("device", "cpu")
        device(type='cpu')
        >>> check_device("device", "bogus")
        Traceback (most recent call last):
        ...
        ValueError: device: must be 'cpu', 'cuda', 'cuda:N' or 'mps', got 'bogus'
    """
    import torch

    try:
        dev = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{name}: must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}: {device!r} was requested but CUDA is not available here; "
                             "use 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}: {device!r} does not exist; this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s) (cuda:0..)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{name}: 'mps' was requested but MPS is not available here; use 'cpu'")
    elif dev.type not in ("cpu", "cuda", "mps", "meta"):
        raise ValueError(f"{name}: must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}")
    return dev
