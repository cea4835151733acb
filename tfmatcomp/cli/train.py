"""``tfmatcomp train`` and ``tfmatcomp presets``."""

from __future__ import annotations

import argparse

from tfmatcomp.cli.args import (CHECKPOINT_DTYPES, command, int_list, json_object, progress_arg,
                                progress_of, train_overrides)
from tfmatcomp.cli.names import DISTRIBUTIONS, PRESETS


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                   help="model / task / training defaults (default: tiny)")
    p.add_argument("--run-dir", required=True,
                   help="run directory to write (metrics.jsonl, checkpoints/); with --seeds, one "
                   "run directory per seed inside it")
    p.add_argument("--steps", type=int, help="total optimizer steps (default: the preset's)")
    p.add_argument("--seed", type=int, help="training seed: initialization and data (default: 0)")
    p.add_argument("--seeds", help="train several seeds at once as one batched program, e.g. 0-7 "
                   "or 0,3,5; seed s writes RUN_DIR/seed-s (an ordinary run directory)")
    p.add_argument("--lr", type=float, help="constant Adam learning rate")
    p.add_argument("--batch-size", type=int, help="training batch size")
    p.add_argument("--log-every", type=int, help="steps between metrics-log lines")
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (0: none)")
    p.add_argument("--checkpoint-steps", type=int_list,
                   help="comma-separated steps that always get a checkpoint")
    p.add_argument("--distribution", choices=DISTRIBUTIONS,
                   help="law of the factors' entries (default: the preset's, uniform on [-1, 1])")
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: CUDA when present)")
    fast = p.add_mutually_exclusive_group()
    fast.add_argument("--fast", dest="fast", action="store_true", default=None,
                      help="the fast step (bf16 matmuls, fused Adam) also where it is not chosen "
                      "by itself (default: on CUDA, and on CPUs with AMX / AVX-512 bf16 for "
                      "d_model >= 256; see docs/fast-cpu.md)")
    fast.add_argument("--no-fast", dest="fast", action="store_false",
                      help="the explicit float32 step, also on CUDA")
    p.add_argument("--checkpoint-dtype", choices=sorted(CHECKPOINT_DTYPES),
                   help="dtype of the checkpoints' weights (default float32; bf16 halves them and "
                   "loads as float32)")
    p.add_argument("--max-shard-mb", type=float,
                   help="split each checkpoint's weights into shards of at most this many MiB")
    p.add_argument("--intervention", action="append", type=json_object, metavar="JSON",
                   help="an intervention during training as JSON, e.g. '{\"kind\": "
                   "\"row_column_attention_scale\", \"factor\": 10, \"start_step\": 500}' "
                   "(repeat for several; kinds: tfmatcomp.interventions.during_training; "
                   "docs/interventions.md)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true",
                      help="continue the run in --run-dir from its latest checkpoint (starts "
                      "fresh when --run-dir is absent or empty)")
    mode.add_argument("--overwrite", action="store_true",
                      help="delete the run in --run-dir and train again from step 0 (without "
                      "--resume or --overwrite, a non-empty --run-dir is refused)")
    progress_arg(p)
    p.add_argument("--nproc", type=int, help="train on N processes of this machine (launches "
                   "torchrun: data-parallel over one global batch, or with --seeds the seeds "
                   "spread over the processes; one GPU each on CUDA, gloo on CPU)")



def _without_nproc(argv: list[str]) -> list[str]:
    """``argv`` less its ``--nproc N`` (what each process that ``--nproc`` starts runs)."""
    out, skip = [], False
    for a in argv:
        if skip or a.startswith("--nproc="):
            skip = False
            continue
        skip = a == "--nproc"
        if not skip:
            out.append(a)
    return out


@command("train", _train_args)
def _train(args: argparse.Namespace) -> int:
    """Train a preset (under torchrun, or with --nproc N, on several processes)."""
    from tfmatcomp import distributed

    if (args.nproc or 1) > 1 and not distributed.under_torchrun():
        return distributed.launch(args.nproc, ["-m", "tfmatcomp", *_without_nproc(args.argv)])
    joined = distributed.world_size() > 1  # a caller's process group stays theirs to end
    try:
        return _train_here(args)
    finally:
        if not joined:
            distributed.shutdown()


def _train_here(args: argparse.Namespace) -> int:
    from tfmatcomp import distributed

    # the run's keywords (RunSetup's and the TrainConfig overrides), for one seed or many
    from tfmatcomp._progress import wanted

    keywords = dict(out_dir=args.run_dir, device=args.device, overwrite=args.overwrite,
                    progress=wanted(progress_of(args)), **train_overrides(args))
    if args.seeds is not None and args.seed is not None:
        raise ValueError("--seed and --seeds: give one of them")
    if distributed.under_torchrun():  # one of several ranks: the data- or seed-parallel trainers
        if args.seeds is not None:
            runs = distributed.train_many(args.preset, seeds=args.seeds, resume=args.resume,
                                          **keywords)
        else:
            runs = distributed.train(args.preset, resume=args.resume, **keywords)
        if distributed.rank() != 0 and args.seeds is None:
            return 0
    else:  # one process: the plan, decided once here, trained as it is
        from tfmatcomp.training.multiseed import run_plan
        from tfmatcomp.training.plan import plan_run

        runs = run_plan(plan_run(args.preset, keywords, resume=args.resume, seeds=args.seeds))
    if args.seeds is not None:
        for seed, result in runs:
            if len(result.metrics):
                last = result.metrics.iloc[-1]
                print(f"seed {seed}, step {result.step}: eval L_obs {last['eval_L_obs']:.3g}, "
                      f"eval L_mask {last['eval_L_mask']:.3g}")
        if distributed.rank() == 0:
            print(f"runs written to {args.run_dir}/seed-*")
        return 0
    last = runs.metrics.iloc[-1] if len(runs.metrics) else None
    if last is not None:
        print(f"step {runs.step}: eval L_obs {last['eval_L_obs']:.3g}, "
              f"eval L_mask {last['eval_L_mask']:.3g}")
    print(f"run written to {runs.out_dir}")
    return 0


@command("presets", lambda p: None)
def _presets(args: argparse.Namespace) -> int:
    """List the presets: model shape, task and what each is for."""
    from tfmatcomp.config import PRESETS

    for name, preset in PRESETS.items():
        m, t = preset.model, preset.task
        print(f"{name:14s} {m.n_layers}L {m.n_heads}H d={m.d_model} | {t.n_rows}x{t.n_cols or t.n_rows}"
              f" rank {t.rank} | {preset.description}")
    return 0


