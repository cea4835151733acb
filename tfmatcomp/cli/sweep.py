"""``tfmatcomp sweep``: a grid of configurations, trained and plotted."""

from __future__ import annotations

import argparse
import math

from tfmatcomp.cli.args import command, progress_arg, progress_of, train_overrides
from tfmatcomp.cli.names import DISTRIBUTIONS, PRESETS


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
    from tfmatcomp.training.sweeps import DEFAULT_GRID

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
    p.add_argument("--run-dir", required=True, help="sweep directory: RUN_DIR/<field=value,...>/"
                   "seed-S per run, RUN_DIR/sweep.csv (one row per configuration and seed) and "
                   "RUN_DIR/sweep.html")
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
    progress_arg(p)


@command("sweep", _sweep_args)
def _sweep(args: argparse.Namespace) -> int:
    """Train a grid of configurations and plot final L_mask and the drop step against it."""
    from tfmatcomp.training.sweeps import sweep

    grid = _parse_grid(args.grid)
    from tfmatcomp._progress import wanted

    result = sweep(grid, args.preset, seeds=args.seeds, out_dir=args.run_dir, device=args.device,
                   resume=not args.overwrite, overwrite=args.overwrite,
                   progress=wanted(progress_of(args)), **train_overrides(args))
    from tfmatcomp.runs.files import replace_file

    replace_file(result.out_dir / "sweep.csv", result.table.to_csv(index=False))
    replace_file(result.out_dir / "sweep.html", result.figure().to_html(include_plotlyjs=True))
    columns = [*result.fields, "seed", "steps", "final_L_mask", "drop_step"]
    print(result.table[columns].to_string(index=False))
    print(f"table written to {result.out_dir / 'sweep.csv'}, figure to "
          f"{result.out_dir / 'sweep.html'}")
    return 0


