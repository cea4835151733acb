"""Command line: ``tfmatcomp train``, ``presets``, ``report``, ``demo``, ``geometry``, ``sweep`` and
``dynamics``.

Example::

    tfmatcomp presets
    tfmatcomp train --preset tiny --out runs/tiny --steps 2000
    tfmatcomp train --preset tiny --out runs/tiny --steps 4000 --resume
    tfmatcomp train --preset tiny --out runs/tiny-ddp --nproc 2        # data-parallel (torchrun)
    tfmatcomp train --preset tiny --out runs/tiny-gauss --distribution gaussian
    tfmatcomp train --preset paper-4l8h --out runs/paper-4l8h --checkpoint-dtype bf16 --max-shard-mb 15
    tfmatcomp sweep --out runs/width --grid d_model=32,64,128 --seeds 0-1
    tfmatcomp dynamics runs/tiny --measures L_mask,copying      # writes runs/tiny.dynamics.csv
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Callable

from tfmatcomp.config import PRESETS, EncoderConfig
from tfmatcomp.task.data import DISTRIBUTIONS

#: ``--checkpoint-dtype`` values -> ``TrainConfig.checkpoint_dtype``.
_CHECKPOINT_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16",
                      "bf16": "bfloat16", "float16": "float16", "fp16": "float16"}

_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None],
                           Callable[[argparse.Namespace], int]]] = {}


def command(name: str, setup: Callable[[argparse.ArgumentParser], None]):
    """Register a sub-command: ``setup`` adds its arguments, the decorated function runs it."""
    def wrap(fn: Callable[[argparse.Namespace], int]):
        _COMMANDS[name] = (setup, fn)
        return fn
    return wrap


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                   help="model / task / training defaults (default: tiny)")
    p.add_argument("--out", required=True, help="run directory (metrics.jsonl, checkpoints/)")
    p.add_argument("--steps", type=int, help="total optimizer steps (default: the preset's)")
    p.add_argument("--seed", type=int, help="seed for initialization and data (default: 0)")
    p.add_argument("--seeds", help="train several seeds at once as one batched program, e.g. 0-7 "
                   "or 0,3,5; seed s writes OUT/seed-s (an ordinary run directory)")
    p.add_argument("--lr", type=float, help="constant Adam learning rate")
    p.add_argument("--batch-size", type=int, help="training batch size")
    p.add_argument("--log-every", type=int, help="steps between metrics-log lines")
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (0: none)")
    p.add_argument("--checkpoint-steps", type=lambda s: tuple(int(x) for x in s.split(",") if x),
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
    p.add_argument("--checkpoint-dtype", choices=sorted(_CHECKPOINT_DTYPES),
                   help="dtype of the checkpoints' weights (default float32; bf16 halves them and "
                   "loads as float32)")
    p.add_argument("--max-shard-mb", type=float,
                   help="split each checkpoint's weights into shards of at most this many MiB")
    p.add_argument("--intervention", action="append", type=_json_object, metavar="JSON",
                   help="an intervention during training as JSON, e.g. '{\"kind\": "
                   "\"row_column_attention_scale\", \"factor\": 10, \"start_step\": 500}' "
                   "(repeat for several; kinds: tfmatcomp.config.DURING_TRAINING; "
                   "docs/interventions.md)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true",
                      help="continue the run in --out from its latest checkpoint (starts fresh "
                      "when --out is absent or empty)")
    mode.add_argument("--overwrite", action="store_true",
                      help="delete the run in --out and train again from step 0 (without "
                      "--resume or --overwrite, a non-empty --out is refused)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--nproc", type=int, help="train on N processes of this machine (launches "
                   "torchrun: data-parallel over one global batch, or with --seeds the seeds "
                   "spread over the processes; one GPU each on CUDA, gloo on CPU)")


def _json_object(text: str) -> dict:
    """A JSON object from the command line (argparse reports the ValueError)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


_json_object.__name__ = "JSON object"  # argparse's "invalid JSON object value: ..."


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


def _train_overrides(args: argparse.Namespace) -> dict:
    """TrainConfig overrides given on the command line, and ``task_cfg`` for ``--distribution``."""
    overrides = {k: v for k, v in {
        "n_steps": args.steps, "seed": getattr(args, "seed", None), "lr": args.lr,
        "batch_size": args.batch_size, "log_every": args.log_every,
        "checkpoint_every": args.checkpoint_every,
        "checkpoint_steps": getattr(args, "checkpoint_steps", None),
        "fast": getattr(args, "fast", None),
        "checkpoint_dtype": _CHECKPOINT_DTYPES.get(getattr(args, "checkpoint_dtype", None)),
        "max_shard_mb": getattr(args, "max_shard_mb", None),
        "interventions": getattr(args, "intervention", None)}.items() if v is not None}
    if args.distribution is not None:
        import dataclasses

        from tfmatcomp.config import get_preset

        overrides["task_cfg"] = dataclasses.replace(get_preset(args.preset).task,
                                                    distribution=args.distribution)
    return overrides


@command("train", _train_args)
def _train(args: argparse.Namespace) -> int:
    """Train a preset (under torchrun, or with --nproc N, on several processes)."""
    from tfmatcomp import distributed

    if args.nproc is not None and args.nproc < 1:
        raise ValueError(f"--nproc: must be at least 1, got {args.nproc}")
    if (args.nproc or 1) > 1 and not distributed.under_torchrun():
        return distributed.launch(args.nproc, ["-m", "tfmatcomp", *_without_nproc(args.argv)])
    joined = distributed.world_size() > 1  # a caller's process group stays theirs to end
    try:
        return _train_here(args)
    finally:
        if not joined:
            distributed.shutdown()


def _train_here(args: argparse.Namespace) -> int:
    from tfmatcomp import distributed  # the single-process trainers when not under torchrun

    # the run's keywords (RunSetup's, resume and the TrainConfig overrides), for one seed or many
    keywords = dict(out_dir=args.out, device=args.device, resume=args.resume,
                    overwrite=args.overwrite, progress=not args.no_progress,
                    **_train_overrides(args))
    if args.seeds is not None:
        if args.seed is not None:
            raise ValueError("--seed and --seeds: give one of them")
        runs = distributed.train_many(args.preset, seeds=args.seeds, **keywords)
        for seed, result in runs:
            if len(result.metrics):
                last = result.metrics.iloc[-1]
                print(f"seed {seed}, step {result.step}: eval L_obs {last['eval_L_obs']:.3g}, "
                      f"eval L_mask {last['eval_L_mask']:.3g}")
        if distributed.rank() == 0:
            print(f"runs written to {args.out}/seed-*")
        return 0
    result = distributed.train(args.preset, **keywords)
    if distributed.rank() != 0:
        return 0
    last = result.metrics.iloc[-1] if len(result.metrics) else None
    if last is not None:
        print(f"step {result.step}: eval L_obs {last['eval_L_obs']:.3g}, "
              f"eval L_mask {last['eval_L_mask']:.3g}")
    print(f"run written to {result.out_dir}")
    return 0


@command("presets", lambda p: None)
def _presets(args: argparse.Namespace) -> int:
    for name, preset in PRESETS.items():
        m, t = preset.model, preset.task
        print(f"{name:14s} {m.n_layers}L {m.n_heads}H d={m.d_model} | {t.n_rows}x{t.n_cols or t.n_rows}"
              f" rank {t.rank} | {preset.description}")
    return 0


# ------------------------------------------------------------------------ report, demo
def _output_args(p: argparse.ArgumentParser, device_help: str) -> None:
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


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory (metrics.jsonl + checkpoints/), multi-seed run "
                   "directory (seeds.json), or a bundled run name")
    p.add_argument("--pre-step", type=int, help="pre-shift checkpoint step")
    p.add_argument("--post-step", type=int, help="post-shift checkpoint step")
    _output_args(p, "cpu or cuda (default: cpu)")


def _write_report(args: argparse.Namespace, run, device=None) -> int:
    from tfmatcomp.report import build_report
    from tfmatcomp.report.sections import DEFAULT_SECTIONS, SECTIONS

    sections = args.sections.split(",") if args.sections else None
    if args.llc:  # the opt-in section, in its place after 'before_drop'
        chosen = set(sections or DEFAULT_SECTIONS) | {"llc"}
        sections = [k for k in SECTIONS if k in chosen] + sorted(chosen - set(SECTIONS))
    report = build_report(run, args.out, pre_step=getattr(args, "pre_step", None),
                          post_step=getattr(args, "post_step", None), n_samples=args.samples,
                          seed=args.seed, device=device, sections=sections,
                          progress=not args.no_progress)
    return _written(report, "report")


def _written(report, what: str) -> int:
    """Say where a report went and which sections failed (exit status 1 if any)."""
    print(f"{what} written to {report.path.resolve()}")
    if report.failed:
        print(f"sections that failed: {report.failed}", file=sys.stderr)
        return 1
    return 0


@command("report", _report_args)
def _report(args: argparse.Namespace) -> int:
    """Write the HTML report of a run."""
    return _write_report(args, args.run, args.device)


#: Seeds ``tfmatcomp demo`` trains at once by default. On a GPU the batched program makes eight
#: seeds nearly as cheap as one; on a CPU the tiny preset's step is bound by arithmetic, so each
#: seed costs a full run (benchmarks/multiseed.py) and the demo trains one.
DEMO_SEEDS = {"cuda": "0-7", "cpu": "0"}


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny",
                   choices=sorted(n for n, pr in PRESETS.items()
                                  if isinstance(pr.model, EncoderConfig)),
                   help="the preset to train, or whose bundled run to use (default: tiny)")
    p.add_argument("--bundled", action="store_true",
                   help="use the run bundled in the package instead of training (tiny: about a "
                   "minute; paper-cpu: about 7 minutes on one CPU thread; paper-4l8h: about 19 "
                   "minutes on two)")
    p.add_argument("--out-dir", help="where to train (default runs/<preset>-demo)")
    p.add_argument("--seeds", help="seeds trained at once, e.g. 0-3 (default: 0-7 on a GPU, 0 on a "
                   "CPU, where each seed costs a full run); the report analyses the typical one "
                   "that dropped and shows them all")
    p.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    p.add_argument("--overwrite", action="store_true", help="delete the runs in --out-dir and "
                   "train again (by default an interrupted demo continues where it stopped)")
    _output_args(p, "training device (default: CUDA when present)")


@command("demo", _demo_args)
def _demo(args: argparse.Namespace) -> int:
    """Train a preset (several seeds at once on a GPU) or use its bundled run, and report."""
    from tfmatcomp import pretrained

    if args.bundled:
        if args.preset not in pretrained.available():
            raise ValueError(f"--preset: no bundled run of {args.preset!r}; bundled runs are "
                             f"{sorted(pretrained.available())}")
        return _write_report(args, args.preset)
    import torch

    from tfmatcomp.runs.layout import seed_dir
    from tfmatcomp.training.multiseed import parse_seeds, train_many, write_group_file
    from tfmatcomp.report import SeedGroup
    from tfmatcomp.training.trainer import Trainer, default_device, train
    from tfmatcomp.validation import writable_output

    with writable_output("out", args.out):  # the report can be written: checked before training
        pass
    out_dir = args.out_dir or f"runs/{args.preset}-demo"
    overrides = {"n_steps": args.steps} if args.steps is not None else {}  # 0 is refused, not ignored
    device = torch.device(args.device) if args.device else default_device()
    seeds = args.seeds or DEMO_SEEDS["cuda" if device.type == "cuda" else "cpu"]
    probe = Trainer(args.preset, device=device, progress=False, **overrides)
    print(f"training seed(s) {seeds} of the {args.preset} preset into {out_dir} on {device} "
          f"(resumes if interrupted); {probe.step_reason}")
    if args.preset in pretrained.available():  # a long preset's training is rarely what is meant
        print(f"{args.preset}: {probe.train_cfg.n_steps:,} steps per seed (the progress bar "
              f"estimates how long); `tfmatcomp demo --preset {args.preset} --bundled` reports on "
              "the run shipped in the package without training")
    keywords = dict(resume=not args.overwrite, overwrite=args.overwrite,
                    progress=not args.no_progress, **overrides)
    if probe.fast:  # the fast step trains one seed at a time; the batched program is float32
        for s in parse_seeds(seeds):
            train(args.preset, seed=s, out_dir=seed_dir(out_dir, s), device=device, **keywords)
        write_group_file(out_dir, parse_seeds(seeds))
    else:
        train_many(args.preset, seeds=seeds, out_dir=out_dir, device=args.device, **keywords)
    group = SeedGroup.load(out_dir)
    print(f"{len(group.dropped)} of {len(group.seeds)} seeds dropped"
          + (f" (onsets {', '.join(f'{group.drops[s].drop_start:,.0f}' for s in group.dropped)})"
             if group.dropped else "; the report says what to do"))
    return _write_report(args, out_dir)


# ------------------------------------------------------------------------ geometry
def _geometry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", help="local transformers model directory (bert or gpt2, with its "
                   "tokenizer), or a tfmatcomp HookedDecoder checkpoint or run directory whose "
                   "metadata holds its tokenizer (tfmatcomp.song_zhong.lm.train_lm); nothing is "
                   "downloaded")
    p.add_argument("text", help="text file (documents separated by blank lines) or directory (one "
                   "document per file); documents are the cluster labels")
    p.add_argument("-o", "--out", default="geometry.html", help="HTML file to write")
    p.add_argument("--contexts", type=int, default=256, help="C, contexts of the first pass (256)")
    p.add_argument("--positions", type=int, default=128, help="T, tokens per context (128)")
    p.add_argument("--second-pass", type=int, default=32, help="contexts of the second pass (32)")
    p.add_argument("--batch-size", type=int, default=16, help="contexts per forward pass (16)")
    p.add_argument("--layer", type=int, help="layer of the Gram / QK sections (default: middle)")
    p.add_argument("--head", type=int, default=0, help="head of the QK figure (0-based)")
    p.add_argument("--drop-first", type=int, default=1, help="leading tokens dropped (1: the "
                   "paper's first-token artifact)")
    p.add_argument("--seed", type=int, default=0, help="which windows are drawn")
    p.add_argument("--sections", help="comma-separated subset of table1, pca, gram, clusters, qk, theory, induction")
    p.add_argument("--device", help="cpu or cuda (default: cpu)")
    p.add_argument("--no-progress", action="store_true")


@command("geometry", _geometry_args)
def _geometry(args: argparse.Namespace) -> int:
    """Song & Zhong's geometry of a local BERT / GPT-2 / HookedDecoder on a text, as one HTML page."""
    from tfmatcomp.song_zhong.command import run_geometry

    report = run_geometry(args.model_dir, args.text, args.out, n_contexts=args.contexts,
                          n_positions=args.positions, n_second=args.second_pass,
                          batch_size=args.batch_size, layer=args.layer, head=args.head,
                          drop_first=args.drop_first, seed=args.seed, device=args.device,
                          sections=args.sections.split(",") if args.sections else None,
                          progress=not args.no_progress)
    return _written(report, "geometry report")


# ------------------------------------------------------------------------ sweep
def _grid_value(text: str):
    """A grid value as typed: an int, a float, true / false / none, or else the text itself."""
    low = text.strip().lower()
    if low in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[low]
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        if kind is float and not math.isfinite(value):
            raise ValueError(f"--grid: {text.strip()!r} is not a finite number")
        return value
    return text.strip()


def _parse_grid(items: list[str] | None) -> dict[str, list]:
    from tfmatcomp.analyses.sweeps import DEFAULT_GRID

    if not items:
        return {k: list(v) for k, v in DEFAULT_GRID.items()}
    grid: dict[str, list] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise ValueError(f"--grid: expected FIELD=V1,V2,..., got {item!r}")
        grid[name.strip()] = [_grid_value(v) for v in values.split(",") if v.strip()]
    return grid


def _sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="sweep directory: OUT/<field=value,...>/seed-S per "
                   "run, OUT/sweep.csv (one row per configuration and seed) and OUT/sweep.html")
    p.add_argument("--grid", action="append", metavar="FIELD=V1,V2,...",
                   help="a swept field and its values, repeatable (the grid is their product): any "
                   "EncoderConfig / TaskConfig / TrainConfig field, or width, depth, heads "
                   "(default: d_model=32,64,128, a CPU grid around the tiny preset)")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                   help="the base configuration (default: tiny)")
    p.add_argument("--seeds", default="0", help="seeds of every configuration, trained together "
                   "(default: 0)")
    p.add_argument("--steps", type=int, help="optimizer steps per run (default: the preset's)")
    p.add_argument("--lr", type=float, help="constant Adam learning rate")
    p.add_argument("--batch-size", type=int, help="training batch size")
    p.add_argument("--log-every", type=int, help="steps between metrics-log lines")
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (0: only the "
                   "preset's fixed steps and the last)")
    p.add_argument("--distribution", choices=DISTRIBUTIONS, help="law of the factors' entries")
    p.add_argument("--device", help="cpu, cuda, ... (default: CUDA when present)")
    p.add_argument("--overwrite", action="store_true", help="train every configuration again from "
                   "step 0 (by default finished runs are kept and unfinished ones resumed)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")


@command("sweep", _sweep_args)
def _sweep(args: argparse.Namespace) -> int:
    """Train a grid of configurations and plot final L_mask and the drop step against it."""
    from tfmatcomp.analyses.sweeps import sweep

    grid = _parse_grid(args.grid)
    result = sweep(grid, args.preset, seeds=args.seeds, out_dir=args.out, device=args.device,
                   resume=not args.overwrite, overwrite=args.overwrite,
                   progress=not args.no_progress, **_train_overrides(args))
    result.table.to_csv(result.out_dir / "sweep.csv", index=False)
    result.figure().write_html(result.out_dir / "sweep.html", include_plotlyjs=True)
    columns = [*result.fields, "seed", "steps", "final_L_mask", "drop_step"]
    print(result.table[columns].to_string(index=False))
    print(f"table written to {result.out_dir / 'sweep.csv'}, figure to "
          f"{result.out_dir / 'sweep.html'}")
    return 0


# ------------------------------------------------------------------------ dynamics
def _dynamics_args(p: argparse.ArgumentParser) -> None:
    from tfmatcomp.analyses.dynamics.progress import PROGRESS_MEASURES

    p.add_argument("run", help="run directory, multi-seed group directory (seeds.json), or a "
                   "bundled run name")
    p.add_argument("--measures", help="comma-separated progress measures (default: all of "
                   f"{', '.join(PROGRESS_MEASURES)})")
    p.add_argument("-o", "--out", help="CSV to write (default: next to the run, RUN.dynamics.csv; "
                   "for a bundled run name, NAME.dynamics.csv here)")
    p.add_argument("--figure", help="also write the measures' figure (HTML) here")
    p.add_argument("--samples", type=int, default=256, help="matrices in the fixed batch (256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fixed batch (0)")
    p.add_argument("--steps", type=lambda s: [int(x) for x in s.split(",") if x],
                   help="comma-separated checkpoint steps (default: all)")
    p.add_argument("--batch-size", type=int, default=256, help="matrices per forward pass (256)")
    p.add_argument("--device", help="cpu or cuda (default: cpu)")
    p.add_argument("--lead", action="store_true",
                   help="also each measure's lead over the loss's onset per seed (RUN.lead.csv "
                   "beside the table) and print its summary over seeds (docs/dynamics.md)")


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
    from tfmatcomp.analyses.dynamics import over_checkpoints, run_seeds
    from tfmatcomp.analyses.dynamics.progress import PROGRESS_MEASURES

    names = [m.strip() for m in args.measures.split(",") if m.strip()] if args.measures else \
        list(PROGRESS_MEASURES)
    unknown = [m for m in names if m not in PROGRESS_MEASURES]
    if unknown or not names:
        raise ValueError(f"--measures: unknown {unknown or names}; choose from "
                         f"{', '.join(PROGRESS_MEASURES)}")
    table = over_checkpoints(args.run, {m: PROGRESS_MEASURES[m] for m in names},
                             n_samples=args.samples, seed=args.seed, steps=args.steps,
                             batch_size=args.batch_size, device=args.device)
    out = dynamics_output(args.run) if args.out is None else Path(args.out)
    table.to_csv(out, index=False)
    print(f"{len(table)} rows ({table['measure'].nunique()} measures, {table['step'].nunique()} "
          f"steps, {table['seed'].nunique()} seed(s)) written to {out}")
    if args.lead:
        from tfmatcomp.analyses.dynamics.lead import lead_time_summary, lead_times

        leads = lead_times(table, args.run)
        lead_out = out.with_name(out.name.removesuffix(".csv").removesuffix(".dynamics")
                                 + ".lead.csv")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfmatcomp", description=__doc__.splitlines()[0])
    debug_help = "show the full traceback of an error instead of one line"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    from tfmatcomp import __version__

    parser.add_argument("--version", action="version", version=f"tfmatcomp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (setup, fn) in _COMMANDS.items():
        p = sub.add_parser(name, help=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else None)
        setup(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
        p.set_defaults(_run=fn)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command. A user error (a bad value, an unusable path or device, a checkpoint that
    cannot be loaded) prints one line and returns 2; any other error prints one line naming its
    type and returns 1; ``--debug`` shows the traceback instead."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if getattr(args, "device", None) is not None:
            from tfmatcomp.validation import check_device

            check_device("--device", args.device)
        return args._run(args)
    except (ValueError, OSError) as e:  # user errors: one line naming the argument or file
        if args.debug:
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"tfmatcomp {args.command}: error: {message}", file=sys.stderr)
        return 2
    except Exception as e:  # anything else: still one line; --debug shows the traceback
        if args.debug:
            raise
        message = " ".join(str(e).split())
        print(f"tfmatcomp {args.command}: error: {type(e).__name__}"
              f"{': ' + message if message else ''} (an unexpected error: run again with --debug "
              "for the traceback, and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
