"""Run every experiment of tfmatcomp.experiments on the CPU tiny preset and time each one.

Three ways to get the models:

* default: the bundled tiny run (``tfmatcomp.pretrained.run_dir("tiny")``, offline, no training):
  the steps its ``pretrained.json`` names pre-shift (on the plateau) and post-shift
  (``tfmatcomp.pretrained.resolve_step("tiny", "pre" | "post")``), so the tables get the papers'
  reference columns.
* ``--run RUN_DIR``: your own training run of the tiny preset (``tfmatcomp train --preset tiny --out
  RUN_DIR``); the checkpoint at ``--pre-step`` (default: the first) is "pre-shift" and the last
  one (or ``--post-step``) "post-shift".
* ``--train``: train the tiny preset briefly here (``--steps``, default ``$TFMATCOMP_EXAMPLE_STEPS``
  or 600) and compare the checkpoint at a fifth of the way ("early") with the final one ("final").
  Both are on the copying plateau, so expect the pre-shift picture twice.

Usage::

    python examples/interventions_tiny.py                       # bundled checkpoints, seconds
    python examples/interventions_tiny.py --run runs/tiny       # a longer run's checkpoints
    python examples/interventions_tiny.py --train --steps 600   # brief training, ~1 minute on CPU
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import pandas as pd
import torch

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint import list_checkpoints, load_checkpoint_info
from tfmatcomp.experiments import (activation_patching, attention_ablation, copying_check,
                                   head_ablation_scan, head_group_ablation, positional_permutation,
                                   weight_transplant)


def load_models(args) -> tuple[dict[str, tm.HookedEncoder], tm.TaskConfig]:
    if not args.train:
        bundled = args.run is None
        if bundled:
            args.run = tm.pretrained.run_dir("tiny")
        ckpts = list_checkpoints(args.run)
        if not ckpts:
            raise SystemExit(f"--run: no checkpoints in {args.run}")
        default_pre = tm.pretrained.resolve_step("tiny", "pre") if bundled else min(ckpts)
        default_post = tm.pretrained.resolve_step("tiny", "post") if bundled else max(ckpts)
        if args.pre_step is not None and args.pre_step not in ckpts:
            raise SystemExit(f"--pre-step: {args.run} has checkpoints at {sorted(ckpts)}")
        pre_step = args.pre_step if args.pre_step is not None else default_pre
        post_step = args.post_step or default_post
        pre, info = load_checkpoint_info(ckpts[pre_step])
        post, _ = load_checkpoint_info(ckpts[post_step])
        print(f"pre-shift = step {pre_step}, post-shift = step {post_step} of {args.run}")
        return {"pre-shift": pre, "post-shift": post}, info.task_cfg
    out = tempfile.mkdtemp(prefix="tfmatcomp-tiny-")
    early = max(1, args.steps // 5)
    t0 = time.perf_counter()
    tm.train("tiny", out_dir=out, n_steps=args.steps, checkpoint_steps=(early,), checkpoint_every=0,
             log_every=max(1, args.steps // 10), progress=False, seed=args.seed)
    print(f"trained tiny for {args.steps} steps in {time.perf_counter() - t0:.1f} s ({out})")
    ckpts = list_checkpoints(out)
    first, info = load_checkpoint_info(ckpts[early])
    last, _ = load_checkpoint_info(ckpts[args.steps])
    return {"early": first, "final": last}, info.task_cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="run directory with checkpoints of the tiny preset "
                                      "(default: the bundled run, tfmatcomp.pretrained.run_dir('tiny'))")
    parser.add_argument("--train", action="store_true",
                        help="train the tiny preset briefly here instead of loading checkpoints")
    parser.add_argument("--pre-step", type=int, default=None,
                        help="pre-shift step (default: the bundled run's, or the first checkpoint)")
    parser.add_argument("--post-step", type=int, default=None)
    parser.add_argument("--steps", type=int,
                        default=int(os.environ.get("TFMATCOMP_EXAMPLE_STEPS", "600")),
                        help="training steps with --train (default: $TFMATCOMP_EXAMPLE_STEPS or 600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.train and args.run:
        parser.error("--train and --run exclude each other")
    torch.set_num_threads(args.threads)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.float_format", lambda v: f"{v:.4g}")

    models, task = load_models(args)
    (a, model_a), (b, model_b) = models.items()
    seed = args.seed
    experiments = [
        ("copying check (Table 1)", lambda: copying_check(models, task, seed=seed)),
        ("attention ablation, all heads", lambda: attention_ablation(models, task, seed=seed)),
        ("mean attention ablation (reference code's variant)",
         lambda: attention_ablation(models, task, variant="mean", seed=seed)),
        (f"weight transplant Q/K/V ({a} <-> {b})",
         lambda: weight_transplant(model_a, model_b, task, labels=(a, b), seed=seed)),
        ("positional permutation", lambda: positional_permutation(models, task, seed=seed)),
        ("activation patching X -> -X at hook_z", lambda: activation_patching(models, task, seed=seed)),
        ("head-group ablation (one group per layer; the papers' groups need 4L8H)",
         lambda: head_group_ablation(models, task, groups="layers", seed=seed)),
        ("per-head ablation scan: change in L_mask (layer, head 0-based)",
         lambda: head_ablation_scan(models, task, seed=seed)),
    ]
    print("note: paper_4l8h_* columns appear only beside the papers' 4L8H d768 model labelled "
          "pre-shift / post-shift; each table's interventions are in df.attrs['interventions']\n")
    timings = []
    for name, run in experiments:
        t0 = time.perf_counter()
        table = run()
        dt = time.perf_counter() - t0
        timings.append((name, dt))
        print(f"== {name}  [{dt:.2f} s]")
        print(table.to_string(index=not isinstance(table.index, pd.RangeIndex)))
        print()
    print("== time per experiment function (s)")
    for name, dt in timings:
        print(f"{dt:8.2f}  {name}")


if __name__ == "__main__":
    main()
