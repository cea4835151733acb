"""What the commands share: the registry :func:`command` fills, and the arguments and helpers
several commands use (the training overrides, the report's output arguments)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable

from tfmatcomp.cli.names import OPT_IN_SECTIONS, REPORT_SECTIONS
from tfmatcomp.validation import parse_json

#: ``--checkpoint-dtype`` values -> ``TrainConfig.checkpoint_dtype``.
CHECKPOINT_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16",
                      "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}

#: ``name -> (setup, run)`` of every sub-command, in the order they were registered.
_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None],
                           Callable[[argparse.Namespace], int]]] = {}


#: The largest step a command takes (the same bound as an intervention's window).
MAX_STEP = 10**12
#: The largest batch or sample count a command takes (2**20 matrices or contexts).
MAX_BATCH = 1 << 20
#: The range of every numeric flag of every command, checked before any work and stated in
#: ``--help``: ``flag -> (lo, hi)``, or ``(command, flag) -> (lo, hi)`` where one command's flag
#: means something else. Integers lie in ``[lo, hi]``; floats (``--lr``, ``--max-shard-mb``) are
#: finite and lie in ``(lo, hi]``; a list (``--checkpoint-steps``, dynamics ``--steps``) has
#: every entry in range. The library checks what depends on the run (a step the run has, a layer
#: the model has) once these pass.
BOUNDS: dict[str | tuple[str, str], tuple[int | float, int | float]] = {
    "--steps": (1, MAX_STEP), ("dynamics", "--steps"): (0, MAX_STEP),
    "--seed": (0, 2**63 - 1), "--sample-seed": (0, 2**63 - 1),
    "--lr": (0.0, 100.0),
    "--batch-size": (1, MAX_BATCH),
    "--log-every": (1, MAX_STEP),
    "--checkpoint-every": (0, MAX_STEP),
    "--checkpoint-steps": (0, MAX_STEP),
    "--max-shard-mb": (0.0, float(1 << 20)),
    "--nproc": (1, 1024),
    "--samples": (1, MAX_BATCH),
    "--pre-step": (0, MAX_STEP), "--post-step": (0, MAX_STEP),
    "--contexts": (1, MAX_BATCH), "--positions": (1, MAX_BATCH), "--second-pass": (1, MAX_BATCH),
    "--layer": (0, 1023), "--head": (0, 4095), "--drop-first": (0, 10**6),
}


def int_list(text: str) -> list[int]:
    """Comma-separated integers, e.g. ``"100,200"`` (argparse reports the ValueError)."""
    return [int(x) for x in text.split(",") if x.strip()]


int_list.__name__ = "integer list"  # argparse's "invalid integer list value: ..."
_NUMERIC = (int, float, int_list)


def _bound_text(value: int | float) -> str:
    return "2**63 - 1" if value == 2**63 - 1 else f"{value:,}"


def bounds_of(command_name: str, parser: argparse.ArgumentParser) -> list[tuple]:
    """``(flag, dest, lo, hi, type)`` of every numeric argument of ``parser``; their ``--help``
    states the range. A numeric argument without a range is a bug (tests/test_hostile.py)."""
    found = []
    for action in parser._actions:
        if action.type not in _NUMERIC:
            continue
        flag = max(action.option_strings, key=len) if action.option_strings else action.dest
        bound = BOUNDS.get((command_name, flag), BOUNDS.get(flag))
        if bound is None:
            raise RuntimeError(f"{command_name} {flag}: a numeric argument without a range in "
                               "tfmatcomp.cli.args.BOUNDS")
        lo, hi = bound
        kind = "number" if action.type is float else "integer"
        interval = f"({_bound_text(lo)}, {_bound_text(hi)}]" if action.type is float else \
            f"[{_bound_text(lo)}, {_bound_text(hi)}]"
        action.help = f"{action.help or ''} ({kind}{'s' if action.type is int_list else ''} in " \
                      f"{interval})".strip()
        found.append((flag, action.dest, lo, hi, action.type))
    return found


def check_bounds(args: argparse.Namespace) -> None:
    """Refuse, naming it, a numeric argument outside its range (:data:`BOUNDS`).

    Raises:
        ValueError: one line, e.g. ``--batch-size: must be an integer in [1, 1,048,576], got 2``.
    """
    for flag, dest, lo, hi, kind in getattr(args, "_bounds", ()):
        value = getattr(args, dest, None)
        if value is None:
            continue
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            if kind is float:
                if not (math.isfinite(v) and lo < v <= hi):
                    raise ValueError(f"{flag}: must be a finite number in ({_bound_text(lo)}, "
                                     f"{_bound_text(hi)}], got {v!r}")
            elif not lo <= v <= hi:
                raise ValueError(f"{flag}: must be an integer in [{_bound_text(lo)}, "
                                 f"{_bound_text(hi)}], got {v!r}")


def command(name: str, setup: Callable[[argparse.ArgumentParser], None]):
    """Register a sub-command: ``setup`` adds its arguments, the decorated function runs it."""
    def wrap(fn: Callable[[argparse.Namespace], int]):
        _COMMANDS[name] = (setup, fn)
        return fn
    return wrap


def json_object(text: str) -> dict:
    """A JSON object from the command line (argparse reports the ValueError)."""
    try:
        value = parse_json("JSON", text)
    except ValueError as e:  # argparse shows this message (for a ValueError, only its own)
        raise argparse.ArgumentTypeError(str(e)) from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


json_object.__name__ = "JSON object"  # argparse's "invalid JSON object value: ..."


def train_overrides(args: argparse.Namespace) -> dict:
    """TrainConfig overrides given on the command line, and ``task_cfg`` for ``--distribution``."""
    overrides = {k: v for k, v in {
        "n_steps": args.steps, "seed": getattr(args, "seed", None), "lr": args.lr,
        "batch_size": args.batch_size, "log_every": args.log_every,
        "checkpoint_every": args.checkpoint_every,
        "checkpoint_steps": getattr(args, "checkpoint_steps", None),
        "fast": getattr(args, "fast", None),
        "checkpoint_dtype": CHECKPOINT_DTYPES.get(getattr(args, "checkpoint_dtype", None)),
        "max_shard_mb": getattr(args, "max_shard_mb", None),
        "interventions": getattr(args, "intervention", None)}.items() if v is not None}
    if getattr(args, "distribution", None) is not None:
        import dataclasses

        from tfmatcomp.config import get_preset

        overrides["task_cfg"] = dataclasses.replace(get_preset(args.preset).task,
                                                    distribution=args.distribution)
    return overrides




def output_file(flag: str, path: str | None) -> Path | None:
    """``path`` (None passes) if its folder exists; a missing folder is refused in one line,
    before any work, instead of being created.

    Example:
        >>> output_file("-o/--output", "/nonexistent/dir/x.html")
        Traceback (most recent call last):
        ...
        ValueError: -o/--output: the folder /nonexistent/dir does not exist; create it first, or choose another path
    """
    if path is None:
        return None
    folder = Path(path).expanduser().parent
    if not folder.exists():   # a file in the way is refused by validation.writable_output
        raise ValueError(f"{flag}: the folder {folder} does not exist; create it first, or choose "
                         "another path")
    return Path(path)


def progress_arg(p: argparse.ArgumentParser) -> None:
    """``--no-progress``; without it a command shows bars on a terminal and none in a pipe."""
    p.add_argument("--no-progress", action="store_true",
                   help="hide the progress bars (shown by default on a terminal, not in a pipe)")


def progress_of(args: argparse.Namespace) -> bool | None:
    """What a command passes as ``progress=``: False with --no-progress, else None (a bar when
    stderr is a terminal; tfmatcomp._progress)."""
    return False if args.no_progress else None


def sample_seed_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--sample-seed``: the seed of the matrices a command draws (``--seed`` is for training)."""
    p.add_argument("--sample-seed", type=int, default=0,
                   help=f"seed of the {what} (default 0; --seed is always a training seed)")


def output_args(p: argparse.ArgumentParser, device_help: str) -> None:
    """Arguments shared by ``report`` and ``demo``."""
    p.add_argument("-o", "--output", default="report.html",
                   help="HTML file to write (default report.html; its folder must exist)")
    p.add_argument("--samples", type=int, default=256, help="matrices per experiment (256)")
    sample_seed_arg(p, "matrices the report draws")
    p.add_argument("--sections", help="comma-separated subset of the report's sections, in any "
                   f"order: {', '.join(k for k in REPORT_SECTIONS if k not in OPT_IN_SECTIONS)}; "
                   f"and the opt-in {', '.join(OPT_IN_SECTIONS)} (default: all but the opt-in)")
    p.add_argument("--llc", action="store_true",
                   help="also estimate the local learning coefficient at 6 checkpoints (section "
                   "'llc'; needs pip install 'tfmatcomp[llc]', about 40 s per checkpoint on tiny)")
    p.add_argument("--device", help=device_help)
    progress_arg(p)


def written(report, what: str) -> int:
    """Say where a report went and which sections failed (exit status 1 if any)."""
    print(f"{what} written to {report.path.resolve()}")
    if report.failed:
        print(f"sections that failed: {report.failed}", file=sys.stderr)
        return 1
    return 0


