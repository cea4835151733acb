"""When each seed of several multi-seed groups leaves the plateau: one row per group (its
interventions during training, the seeds, how many dropped, median / range of the onset and of the
drop step), and with --per-seed one row per seed. The groups' logs are read as written
(``eval_L_mask``, measured with the interventions active, see docs/interventions.md).

    python scripts/drop_steps.py runs/lead/tiny-s1-8 runs/attnscale/rc10-s1-4 --seeds 1-4

``--fixed N`` adds, per seed, ``L_mask`` of its last checkpoint (or of ``--step``) on N fixed
fresh matrices (batch seed ``--fixed-seed``, 12345) beside nuclear-norm minimization on the same
matrices and masks (:func:`tfmatcomp.analyses.baselines.compare.compare_with_model`): the
per-seed table of docs/paper-cpu.md.

    python scripts/drop_steps.py runs/paper-cpu --per-seed --fixed 512
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd

from tfmatcomp.analyses.baselines.compare import compare_with_model
from tfmatcomp.report.run import SeedGroup
from tfmatcomp.runs.checkpoint import list_checkpoints, load_checkpoint_info
from tfmatcomp.runs.layout import RUN_FILE, seed_dir
from tfmatcomp.training.multiseed import parse_seeds


def describe(path: str) -> str:
    """The group's interventions during training, in short."""
    group = SeedGroup.load(path)
    run = json.loads((seed_dir(path, group.seeds[0]) / RUN_FILE).read_text())
    ivs = run["train"].get("interventions", [])
    return "; ".join(", ".join(f"{k}={v}" for k, v in iv.items() if v is not None) for iv in ivs) \
        or "none"


def fixed_batch_losses(run, n: int, seed: int, step: int | None = None) -> dict[str, float]:
    """``L_mask`` of a run's checkpoint (the last, or ``step``) and of nuclear-norm minimization
    on the same ``n`` fresh matrices of the run's task (batch seed ``seed``)."""
    ckpts = list_checkpoints(run)
    if not ckpts:
        raise SystemExit(f"--fixed: {run} has no checkpoint")
    at = max(ckpts) if step is None else step
    if at not in ckpts:
        raise SystemExit(f"--step: {run} has checkpoints at {list(ckpts)}, not at {step}")
    model, info = load_checkpoint_info(ckpts[at])
    df = compare_with_model(model.eval(), [info.task_cfg.p_mask], task=info.task_cfg,
                            n_samples=n, seed=seed)
    by = df.set_index("method")["L_mask"]
    return {"fixed_step": at, "fixed_L_mask": float(by["model"]),
            "nuclear_norm_L_mask": float(by["nuclear_norm"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("groups", nargs="+", help="multi-seed group directories")
    ap.add_argument("--seeds", help="only these seeds (e.g. 1-4)")
    ap.add_argument("--per-seed", action="store_true", help="also one row per seed")
    ap.add_argument("--fixed", type=int, metavar="N", help="per seed: L_mask of the last "
                    "checkpoint and of nuclear-norm minimization on N fixed fresh matrices")
    ap.add_argument("--fixed-seed", type=int, default=12345, help="batch seed of --fixed (12345)")
    ap.add_argument("--step", type=int, help="the checkpoint --fixed measures (default: the last)")
    args = ap.parse_args()
    keep = set(parse_seeds(args.seeds)) if args.seeds else None
    rows, per_seed = [], []
    for path in args.groups:
        group = SeedGroup.load(path)
        table = group.table()
        if keep is not None:
            table = table[table["seed"].isin(keep)]
        if args.fixed:
            fixed = [fixed_batch_losses(seed_dir(path, s), args.fixed, args.fixed_seed, args.step)
                     for s in table["seed"]]
            table = pd.concat([table.reset_index(drop=True), pd.DataFrame(fixed)], axis=1)
        dropped = table[table["has_drop"]]
        onset = dropped["onset"].to_numpy(dtype=float)
        step = dropped["drop_step"].to_numpy(dtype=float)
        rows.append({"group": path, "interventions": describe(path), "seeds": len(table),
                     "dropped": len(dropped), "last_step": int(table["last_step"].min()),
                     "median_onset": np.median(onset) if len(onset) else np.nan,
                     "onset_min": onset.min() if len(onset) else np.nan,
                     "onset_max": onset.max() if len(onset) else np.nan,
                     "median_drop_step": np.median(step) if len(step) else np.nan,
                     "median_final_L_mask": float(table["final_L_mask"].median())})
        per_seed.append(table.assign(group=path))
    fmt = dict(index=False, float_format=lambda x: f"{x:.4g}")
    print(pd.DataFrame(rows).to_string(**fmt))
    if args.per_seed:
        print()
        columns = ["group", "seed", "last_step", "has_drop", "onset", "drop_step", "end",
                   "plateau_L_mask", "final_L_mask", "fall_factor"]
        if args.fixed:
            columns += ["fixed_step", "fixed_L_mask", "nuclear_norm_L_mask"]
        print(pd.concat(per_seed)[columns].to_string(**fmt))


if __name__ == "__main__":
    main()
