"""The papers' experiment tables on two checkpoints of one run, either side of its drop: the
attention change per head, uniform ablation of all heads, X -> -X patching at hook_z and the
Q/K/V transplant both ways. Works on encoder and decoder runs alike (docs/gpt-variant.md).

    python scripts/drop_analysis.py runs/gpt/run --before 1000 --after 3000

``--before 0`` takes the model the run started from (rebuilt from its config and seed, as the
trainer builds it) when the run has no checkpoint at step 0.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd
import torch

from tfmatcomp.runs.checkpoint import list_checkpoints, load_checkpoint_info, save_checkpoint
from tfmatcomp.experiments import (activation_patching, attention_ablation, attention_change,
                                   weight_transplant)
from tfmatcomp.models.objectives import objective_for

COLS = ["L", "L_obs", "L_mask"]


def show(title: str, df: pd.DataFrame) -> None:
    print(f"\n## {title}\n")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run directory with checkpoints")
    ap.add_argument("--before", type=int, required=True, help="pre-shift checkpoint step")
    ap.add_argument("--after", type=int, required=True, help="post-shift checkpoint step")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ckpts = list_checkpoints(args.run)
    if 0 not in ckpts:  # the initial model: what the trainer built from the config and seed
        _, info = load_checkpoint_info(next(iter(ckpts.values())), device="cpu")
        init = objective_for(info.model_cfg).model_class(info.model_cfg, seed=info.train_cfg.seed)
        ckpts[0] = save_checkpoint(init, Path(tempfile.mkdtemp()) / "step_0000000",
                                   task_cfg=info.task_cfg, train_cfg=info.train_cfg, step=0)
    pre, post = str(ckpts[args.before]), str(ckpts[args.after])
    n = args.samples

    change = attention_change(pre, post, n_samples=n)
    wide = change.pivot_table(index=["layer", "head"], columns="target",
                              values=["before", "after"]).round(3)
    wide = wide[[(w, t) for t in ("same_row", "same_col", "self", "sep") for w in ("before", "after")]]
    wide.columns = [f"{t}_{w}" for w, t in wide.columns]
    show(f"attention targets, steps {args.before} -> {args.after} (0-based layer, head)",
         wide.reset_index())
    models = {"pre-shift": pre, "post-shift": post}
    show("uniform ablation of all heads",
         attention_ablation(models, n_samples=n)[["model", "condition", *COLS]])
    show("X -> -X patching at attn.hook_z",
         activation_patching(models, n_samples=n)[["model", "patched", "entries", "mse_to_X",
                                                   "mse_to_neg_X"]])
    show("Q/K/V transplant", weight_transplant(pre, post, n_samples=n)[
        ["recipient", "donor", "params", *COLS]])


if __name__ == "__main__":
    main()
