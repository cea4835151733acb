"""``tfmatcomp report`` and ``tfmatcomp demo``."""

from __future__ import annotations

import argparse

from tfmatcomp.cli.args import command, output_args, output_file, progress_of, written
from tfmatcomp.cli.names import ENCODER_PRESETS


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory (metrics.jsonl + checkpoints/), multi-seed run "
                   "directory (seeds.json), or a bundled run name")
    p.add_argument("--pre-step", type=int, help="pre-shift checkpoint step (default: chosen from "
                   "the loss curve, before the drop)")
    p.add_argument("--post-step", type=int, help="post-shift checkpoint step (default: the last)")
    output_args(p, "cpu or cuda (default: cpu)")


def _write_report(args: argparse.Namespace, run, device=None) -> int:
    from tfmatcomp.report import build_report
    from tfmatcomp.report.sections import DEFAULT_SECTIONS, SECTIONS

    sections = args.sections.split(",") if args.sections else None
    if args.llc:  # the opt-in section, in its place after 'before_drop'
        chosen = set(sections or DEFAULT_SECTIONS) | {"llc"}
        sections = [k for k in SECTIONS if k in chosen] + sorted(chosen - set(SECTIONS))
    report = build_report(run, args.output, pre_step=getattr(args, "pre_step", None),
                          post_step=getattr(args, "post_step", None), n_samples=args.samples,
                          seed=args.sample_seed, device=device, sections=sections,
                          progress=progress_of(args))
    return written(report, "report")


@command("report", _report_args)
def _report(args: argparse.Namespace) -> int:
    """Write the HTML report of a run: every analysis on its pre- and post-shift checkpoints."""
    output_file("-o/--output", args.output)
    return _write_report(args, args.run, args.device)


#: Seeds ``tfmatcomp demo`` trains at once by default. On a GPU the batched program makes eight
#: seeds nearly as cheap as one; on a CPU the tiny preset's step is bound by arithmetic, so each
#: seed costs a full run (benchmarks/multiseed.py) and the demo trains one.
DEMO_SEEDS = {"cuda": "0-7", "cpu": "0"}


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny",
                   choices=ENCODER_PRESETS,
                   help="the preset to train, or whose bundled run to use (default: tiny)")
    p.add_argument("--bundled", action="store_true",
                   help="use the run bundled in the package instead of training (tiny: about a "
                   "minute; paper-cpu: about 7 minutes on one CPU thread; paper-4l8h: about 19 "
                   "minutes on two)")
    p.add_argument("--run-dir", help="run directory to train into, one seed-S directory per seed "
                   "(default runs/<preset>-demo)")
    p.add_argument("--seed", type=int, help="the training seed (default 0); --seeds trains several")
    p.add_argument("--seeds", help="seeds trained at once, e.g. 0-3 (default: 0-7 on a GPU, 0 on a "
                   "CPU, where each seed costs a full run); the report analyses the typical one "
                   "that dropped and shows them all")
    p.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    p.add_argument("--overwrite", action="store_true", help="delete the runs in --run-dir and "
                   "train again (by default an interrupted demo continues where it stopped)")
    output_args(p, "training device (default: CUDA when present)")


@command("demo", _demo_args)
def _demo(args: argparse.Namespace) -> int:
    """Train a preset (several seeds at once on a GPU) or use its bundled run, and report."""
    from tfmatcomp import pretrained

    output_file("-o/--output", args.output)
    if args.seed is not None and args.seeds is not None:
        raise ValueError("--seed and --seeds: give one of them")
    if args.bundled:
        if args.preset not in pretrained.available():
            raise ValueError(f"--preset: no bundled run of {args.preset!r}; bundled runs are "
                             f"{sorted(pretrained.available())}")
        return _write_report(args, args.preset)
    from tfmatcomp.report import SeedGroup
    from tfmatcomp.training.multiseed import run_group
    from tfmatcomp.training.plan import default_device, plan_run
    from tfmatcomp.validation import check_device, writable_output

    with writable_output("-o/--output", args.output):  # checked before training
        pass
    out_dir = args.run_dir or f"runs/{args.preset}-demo"
    overrides = {"n_steps": args.steps} if args.steps is not None else {}  # 0 is refused, not ignored
    device = check_device("--device", args.device) if args.device else default_device()
    seeds = (str(args.seed) if args.seed is not None else args.seeds) or DEMO_SEEDS[
        "cuda" if device.type == "cuda" else "cpu"]
    from tfmatcomp._progress import wanted

    # the plan train_many makes of these arguments: batched or one seed at a time, decided there
    plan = plan_run(args.preset, dict(out_dir=out_dir, device=device, overwrite=args.overwrite,
                                      progress=wanted(progress_of(args)), **overrides),
                    resume=not args.overwrite, seeds=seeds)
    print(f"training seed(s) {seeds} of the {args.preset} preset into {out_dir} on {device} "
          f"(resumes if interrupted); {plan.for_seed(plan.seeds[0]).step_reason}")
    if args.preset in pretrained.available():  # a long preset's training is rarely what is meant
        print(f"{args.preset}: {plan.train_cfg.n_steps:,} steps per seed (the progress bar "
              f"estimates how long); `tfmatcomp demo --preset {args.preset} --bundled` reports on "
              "the run shipped in the package without training")
    run_group(plan)
    group = SeedGroup.load(out_dir)
    print(f"{len(group.dropped)} of {len(group.seeds)} seeds dropped"
          + (f" (onsets {', '.join(f'{group.drops[s].drop_start:,.0f}' for s in group.dropped)})"
             if group.dropped else "; the report says what to do"))
    return _write_report(args, out_dir)


