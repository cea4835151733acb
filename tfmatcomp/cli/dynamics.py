"""``tfmatcomp dynamics``: progress measures at every checkpoint of a run."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from tfmatcomp.cli.args import (command, int_list, output_file, progress_arg, progress_of,
                                sample_seed_arg)
from tfmatcomp.cli.names import MEASURES
from tfmatcomp.validation import writable_output


def _dynamics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory, multi-seed group directory (seeds.json), or a "
                   "bundled run name")
    p.add_argument("--measures", help="comma-separated progress measures (default: all of "
                   f"{', '.join(MEASURES)})")
    p.add_argument("-o", "--output", help="CSV to write (default: next to the run, "
                   "RUN.dynamics.csv; for a bundled run name, NAME.dynamics.csv here; its folder "
                   "must exist)")
    p.add_argument("--figure", help="also write the measures' figure (HTML) here")
    p.add_argument("--samples", type=int, default=256, help="matrices in the fixed batch (256)")
    sample_seed_arg(p, "fixed batch every checkpoint is measured on")
    p.add_argument("--steps", type=int_list,
                   help="comma-separated checkpoint steps (default: all)")
    p.add_argument("--batch-size", type=int, default=256, help="matrices per forward pass (256)")
    p.add_argument("--device", help="cpu or cuda (default: cpu)")
    p.add_argument("--lead", action="store_true",
                   help="also each measure's lead over the loss's onset per seed (RUN.lead.csv "
                   "beside the table) and print its summary over seeds (docs/dynamics.md)")
    progress_arg(p)


def dynamics_output(run: str) -> Path:
    """Where ``tfmatcomp dynamics RUN`` writes its table by default: ``RUN.dynamics.csv`` beside the
    run directory (not inside it, which its trainer owns), or ``NAME.dynamics.csv`` in the working
    directory for a bundled run's name.

    Example:
        >>> dynamics_output("runs/tiny").as_posix(), dynamics_output("tiny").as_posix()
        ('runs/tiny.dynamics.csv', 'tiny.dynamics.csv')
    """
    path = Path(run)
    return path.parent / f"{path.name}.dynamics.csv"


@command("dynamics", _dynamics_args)
def _dynamics(args: argparse.Namespace) -> int:
    """Progress measures at every checkpoint of a run (or of every seed of a group) as a CSV."""
    from tfmatcomp.analyses.dynamics.progress import PROGRESS_MEASURES

    names = [m.strip() for m in args.measures.split(",") if m.strip()] if args.measures else \
        list(PROGRESS_MEASURES)
    unknown = [m for m in names if m not in PROGRESS_MEASURES]
    if unknown or not names:
        raise ValueError(f"--measures: unknown {unknown or names}; choose from "
                         f"{', '.join(PROGRESS_MEASURES)}")
    out = output_file("-o/--output", dynamics_output(args.run) if args.output is None
                      else args.output)
    output_file("--figure", args.figure)
    lead_out = out.with_name(out.name.removesuffix(".csv").removesuffix(".dynamics") + ".lead.csv")
    with contextlib.ExitStack() as outputs:  # every output checked before the work
        for flag, path in [("-o", out), *([("--lead", lead_out)] if args.lead else []),
                           *([("--figure", args.figure)] if args.figure else [])]:
            outputs.enter_context(writable_output(flag, path))
        return _dynamics_table(args, names, out, lead_out)


def _dynamics_table(args: argparse.Namespace, names: list[str], out: Path, lead_out: Path) -> int:
    from tfmatcomp.analyses.dynamics import over_checkpoints, run_seeds
    from tfmatcomp.analyses.dynamics.progress import PROGRESS_MEASURES

    table = over_checkpoints(args.run, {m: PROGRESS_MEASURES[m] for m in names},
                             n_samples=args.samples, seed=args.sample_seed, steps=args.steps,
                             batch_size=args.batch_size, device=args.device,
                             progress=progress_of(args))
    table.to_csv(out, index=False)
    print(f"{len(table)} rows ({table['measure'].nunique()} measures, {table['step'].nunique()} "
          f"steps, {table['seed'].nunique()} seed(s)) written to {out}")
    if args.lead:
        from tfmatcomp.analyses.dynamics.lead import lead_time_summary, lead_times

        leads = lead_times(table, args.run)
        leads.to_csv(lead_out, index=False)
        print(lead_time_summary(leads).to_string(index=False, float_format=lambda x: f"{x:.0f}"))
        print(f"leads per seed written to {lead_out}")
    if args.figure:
        from tfmatcomp.plotting.dynamics import measures_figure
        from tfmatcomp.training.trainer import read_metrics

        runs = run_seeds(args.run)
        metrics = read_metrics(next(iter(runs.values()))) if len(runs) == 1 else None
        measures_figure(table, metrics).write_html(args.figure, include_plotlyjs=True)
        print(f"figure written to {args.figure}")
    return 0


