"""The arguments the search scripts share (``preset_search.py``, ``gpt_search.py``): a preset's
task and model with sizes overridden from the command line, and the training options.

    ap = argparse.ArgumentParser()
    add_config_args(ap)
    add_training_args(ap, out_help="run directory")
    args = ap.parse_args(["--out", "runs/x", "--lr", "1e-3"])
    task_cfg, model_cfg = configs_from_args(args, tm.get_preset("tiny"))
    training_overrides(args)  # {"lr": 0.001}
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Callable

import tfmatcomp as tm


def add_config_args(ap: argparse.ArgumentParser) -> None:
    """Add the task (``--n-rows --rank --p-mask``) and model size options to ``ap``."""
    ap.add_argument("--n-rows", type=int)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--p-mask", type=float)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--d-mlp", type=int)
    ap.add_argument("--n-layers", type=int)
    ap.add_argument("--n-heads", type=int)
    ap.add_argument("--d-head", type=int,
                    help="default: d_model // n_heads (recomputed when --n-heads or --d-model is given)")
    ap.add_argument("--init-range", type=float, help="std of the normal weight init (default: the preset's)")


def configs_from_args(args: argparse.Namespace, preset: tm.Preset,
                      n_ctx: Callable[[int], int] = lambda n_positions: n_positions):
    """The preset's task and model configs with the options of :func:`add_config_args` applied;
    ``n_ctx`` maps the task's number of matrix positions to the model's context length."""
    task_cfg = dataclasses.replace(preset.task, **{k: v for k, v in {
        "n_rows": args.n_rows, "rank": args.rank, "p_mask": args.p_mask}.items() if v is not None})
    sizes = {k: v for k, v in {"d_model": args.d_model, "d_mlp": args.d_mlp,
                                "n_layers": args.n_layers, "n_heads": args.n_heads,
                                "init_range": args.init_range}.items() if v is not None}
    if args.d_head is not None or "n_heads" in sizes or "d_model" in sizes:
        # the preset's d_head was filled in from its own n_heads; recompute it unless given
        sizes["d_head"] = args.d_head
    model_cfg = dataclasses.replace(preset.model, n_ctx=n_ctx(task_cfg.n_positions), **sizes)
    return task_cfg, model_cfg


def add_training_args(ap: argparse.ArgumentParser, out_help: str) -> None:
    """Add ``--out --threads --steps --batch-size --lr --log-every --checkpoint-every`` to ``ap``."""
    ap.add_argument("--out", required=True, help=out_help)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--log-every", type=int)
    ap.add_argument("--checkpoint-every", type=int,
                    help="also checkpoint every this many steps, so a stopped run resumes near "
                    "where it stopped (default: the preset's)")


def training_overrides(args: argparse.Namespace, **more) -> dict:
    """The :class:`tfmatcomp.TrainConfig` fields set by :func:`add_training_args`'s options (and
    ``more``), leaving out those not given."""
    given = {"n_steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
             "log_every": args.log_every, "checkpoint_every": args.checkpoint_every, **more}
    return {k: v for k, v in given.items() if v is not None}
