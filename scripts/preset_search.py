"""Measure one configuration of a preset over many seeds: the figures of docs/tiny-preset.md and
docs/paper-cpu.md.

Trains the seeds with tfmatcomp.train_many: at once, or one after another on the fast bf16 step
when the run takes it (--fast, or by itself for d_model >= 256 on a CPU with bf16 matrix units);
detects each seed's drop in eval L_mask, and
compares every seed's final model with nuclear-norm minimization on the same matrices and masks.
Prints one table row per seed and a summary:

* drops: the share of seeds with a detected sudden drop;
* median fall: plateau / final eval L_mask over all seeds;
* L_mask of the final models (median) against nuclear-norm minimization on the same batch;
* median drop step, the seconds per step of the runs (their own clock, elapsed_s / step), and
  their product (the wall-clock time to the drop).

    python scripts/preset_search.py --seeds 0-15 --threads 1 --out runs/search/tiny-t1
    python scripts/preset_search.py --seeds 0-15 --threads 2 --p-mask 0.2 --batch-size 32 ...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import tfmatcomp as tm
from tfmatcomp.analyses.baselines import complete_nuclear_norm
from tfmatcomp.datapath import sample_batch
from tfmatcomp.analyses.dynamics import detect_drop
from tfmatcomp.runs.layout import RUN_FILE, seed_dir

from _config_args import (  # scripts/, beside this file
    add_config_args, add_training_args, configs_from_args, training_overrides)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--seeds", default="0-15")
    add_training_args(ap, out_help="multi-seed run directory (resumed if present)")
    add_config_args(ap)
    ap.add_argument("--eval-samples", type=int, default=512)
    ap.add_argument("--eval-batch-size", type=int, help="eval batch of the metrics log")
    ap.add_argument("--fast", action=argparse.BooleanOptionalAction, default=None,
                    help="the fast (bf16) step; it trains the seeds one after another (the batched "
                    "multi-seed program runs float32). Default: where it pays (tfmatcomp.training.fast_step)")
    ap.add_argument("--intervention", action="append", type=json.loads, metavar="JSON",
                    help="an intervention during training (TrainConfig.interventions) as JSON; "
                    "repeat for several")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    preset = tm.get_preset(args.preset)
    task_cfg, model_cfg = configs_from_args(args, preset)
    overrides = training_overrides(args, eval_batch_size=args.eval_batch_size, fast=args.fast,
                                   interventions=args.intervention)
    t0 = time.perf_counter()
    runs = tm.train_many(preset, seeds=args.seeds, model_cfg=model_cfg, task_cfg=task_cfg,
                         out_dir=args.out, resume=True, device="cpu", **overrides)
    wall = time.perf_counter() - t0
    # the step that trained them, as each seed's run.json records it
    step_reason = json.loads((seed_dir(runs.out_dir, runs.seeds[0]) / RUN_FILE).read_text())["step"]
    print(step_reason, flush=True)

    batch = sample_batch(task_cfg, args.eval_samples, seed=12345)
    nuclear = float(complete_nuclear_norm(batch).losses(batch)["L_mask"])
    rows = []
    for seed, result in runs:
        with torch.no_grad():
            final = float(tm.losses(result.model(batch.tokens), batch)["L_mask"])
        try:
            drop = detect_drop(result.metrics)
        except ValueError as e:  # a log too short to judge: no drop, and say why
            print(f"seed {seed}: {e}")
            rows.append({"seed": seed, "has_drop": False, "final_L_mask": final})
            continue
        rows.append({"seed": seed, "has_drop": drop.has_drop, "onset": drop.drop_start,
                     "drop_step": drop.drop_step, "end": drop.drop_end,
                     "plateau": drop.plateau_level, "final_eval": drop.final_level,
                     "fall": drop.drop_factor, "final_L_mask": final})
    table = pd.DataFrame(rows, columns=["seed", "has_drop", "onset", "drop_step", "end", "plateau",
                                        "final_eval", "fall", "final_L_mask"])
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))

    # seconds per step of the runs themselves (run.json records the thread count)
    s_per_step = float(np.median([r.metrics["elapsed_s"].iloc[-1] / r.metrics["step"].iloc[-1]
                                  for _, r in runs]))

    dropped = table[table["has_drop"]]
    median_step = float(np.median(dropped["drop_step"])) if len(dropped) else float("nan")
    median_end = float(np.median(dropped["end"])) if len(dropped) else float("nan")
    summary = {
        "config": {"task": task_cfg.to_dict(), "model": model_cfg.to_dict(), **overrides},
        "threads": args.threads, "seeds": len(table),
        "drops": f"{len(dropped)}/{len(table)}", "drop_share": len(dropped) / len(table),
        "median_fall": float(np.median(table["fall"])),
        "median_final_L_mask": float(np.median(table["final_L_mask"])),
        "nuclear_norm_L_mask": nuclear,
        "median_drop_step": median_step, "median_drop_end": median_end,
        "step": step_reason, "s_per_step": s_per_step,
        "minutes_to_median_drop": median_step * s_per_step / 60,
        "minutes_to_median_drop_end": median_end * s_per_step / 60,
        "batched_wall_minutes": wall / 60,
    }
    print(json.dumps(summary, indent=1))
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
