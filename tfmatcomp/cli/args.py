"""What the commands share: the registry :func:`command` fills, and the arguments and helpers
several commands use (the training overrides, the report's output arguments)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from tfmatcomp.validation import parse_json

#: ``--checkpoint-dtype`` values -> ``TrainConfig.checkpoint_dtype``.
CHECKPOINT_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16",
                      "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}

#: ``name -> (setup, run)`` of every sub-command, in the order they were registered.
_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None],
                           Callable[[argparse.Namespace], int]]] = {}


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
    if args.distribution is not None:
        import dataclasses

        from tfmatcomp.config import get_preset

        overrides["task_cfg"] = dataclasses.replace(get_preset(args.preset).task,
                                                    distribution=args.distribution)
    return overrides




def output_args(p: argparse.ArgumentParser, device_help: str) -> None:
    """Arguments shared by ``report`` and ``demo``."""
    p.add_argument("-o", "--out", default="report.html", help="HTML file to write")
    p.add_argument("--samples", type=int, default=256, help="matrices per experiment (256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples the report draws")
    p.add_argument("--sections", help="comma-separated subset of the report's sections "
                   "(training, before_drop, llc, copying, ablation, ..., decomposition)")
    p.add_argument("--llc", action="store_true",
                   help="also estimate the local learning coefficient at 6 checkpoints (section "
                   "'llc'; needs pip install 'tfmatcomp[llc]', about 40 s per checkpoint on tiny)")
    p.add_argument("--device", help=device_help)
    p.add_argument("--no-progress", action="store_true")


def written(report, what: str) -> int:
    """Say where a report went and which sections failed (exit status 1 if any)."""
    print(f"{what} written to {report.path.resolve()}")
    if report.failed:
        print(f"sections that failed: {report.failed}", file=sys.stderr)
        return 1
    return 0


