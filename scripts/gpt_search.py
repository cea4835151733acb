"""Train one configuration of the GPT variant on the CPU and print the figures of the search in
docs/gpt-variant.md: the curve at a few steps, the detected drops (eval L_mask: the masked
entries; eval CE_obs: the copy transition at observed entries) and the time per step.

Resumable: running it again with a larger --steps continues the run in --out.

    python scripts/gpt_search.py --out runs/gpt/base --steps 3000
    python scripts/gpt_search.py --out runs/gpt/i01 --steps 3000 --init-range 0.1 --p-mask 0.2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch

import tfmatcomp as tm
from tfmatcomp.task import gpt as gpt_task
from tfmatcomp.analyses.dynamics import detect_drop

from _config_args import (  # scripts/, beside this file
    add_config_args, add_training_args, configs_from_args, training_overrides)

COLUMNS = ["step", "eval_CE_obs", "eval_CE_mask", "eval_acc_obs", "eval_acc_mask", "eval_L_mask",
           "eval_gen_acc_mask", "eval_gen_L_mask"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt-tiny")
    ap.add_argument("--seed", type=int)
    add_training_args(ap, out_help="run directory (resumed if present)")
    add_config_args(ap)
    ap.add_argument("--every", type=int, default=250, help="steps between rows of the printed curve")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    preset = tm.get_preset(args.preset)
    task_cfg, model_cfg = configs_from_args(args, preset, n_ctx=gpt_task.sequence_length)
    overrides = training_overrides(args, seed=args.seed)
    result = tm.train(preset, model_cfg=model_cfg, task_cfg=task_cfg, out_dir=args.out,
                      resume=True, device="cpu", progress=False, **overrides)

    del result
    m = tm.read_metrics(args.out)  # the whole log, also the part before a resume
    shown = m[(m["step"] % args.every == 0) | (m["step"] <= 200) | (m["step"] == m["step"].max())]
    print(shown[COLUMNS].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    drops = {}
    for col in ("eval_L_mask", "eval_CE_mask", "eval_CE_obs"):
        try:
            d = detect_drop(m, column=col, min_drop_factor=1.5 if "CE" in col else 2.0)
        except ValueError as e:  # too short a log
            drops[col] = str(e)
            continue
        drops[col] = {k: d.as_dict()[k] for k in ("has_drop", "drop_start", "drop_step", "drop_end",
                                                   "plateau_level", "final_level", "drop_factor",
                                                   "reason")}
    tail = m[m["step"] > 0.9 * m["step"].max()]
    summary = {
        "config": {"task": task_cfg.to_dict(), "model": model_cfg.to_dict(), **overrides},
        "threads": args.threads, "steps": int(m["step"].max()),
        "ms_per_step": 1000 * float(m["elapsed_s"].iloc[-1]) / float(m["step"].iloc[-1]),
        "final_medians": {c: float(tail[c].median()) for c in COLUMNS[1:]},
        "drops": drops,
    }
    print(json.dumps(summary, indent=1, default=str))
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
