"""Regenerate a run bundled in the package (tfmatcomp/pretrained/<preset>) from its preset.

Trains the preset's seeds with one torch thread (each on the step the trainer chooses: the fast
bf16 step for paper-cpu on a CPU with bf16 matrix units, float32 for tiny), detects each seed's drop, and bundles the seed whose drop onset is the median of those that dropped (the typical
seed): its metrics log, run.json and a few checkpoints (pre-shift on the plateau, around the drop,
the last), plus every seed's metrics log under group/ so that the report can show the distribution
of drop steps. pretrained.json records how it was trained (torch version, threads) and the drop.

    python scripts/make_bundled_run.py --seeds 0-15 --work runs/bundle --bundle-seed 0
    python scripts/make_bundled_run.py --preset paper-cpu --seeds 0-3 --work runs/bundle-paper-cpu

By default each seed is trained alone (``tfmatcomp.train``, the program ``tfmatcomp train --seed S``
and ``tfmatcomp demo`` run), so the bundled seed's metrics are bit-identical to a user's run of that
seed with the same torch version, thread count and CPU model (``run.json``'s ``processor``).
``--no-train`` bundles the seeds already in ``--work`` as they are, for runs trained elsewhere
(paper-4l8h was trained on a GPU with ``tfmatcomp train``; its run directory became
``--work``/seed-0).
``--batched`` trains them at once (``tfmatcomp.train_many``), faster on a GPU, whose trajectories
part from the single-seed ones by float rounding. Finished seeds in ``--work`` are kept (each run
resumes).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint import load_checkpoint_info
from tfmatcomp.runs.layout import (
    CHECKPOINTS_DIR, GROUP_FILE, METRICS_FILE, PRETRAINED_FILE, RUN_FILE, seed_dir,
)
from tfmatcomp.training.multiseed import write_group_file, parse_seeds
from tfmatcomp.report.run import SeedGroup, choose_steps

PRETRAINED = Path(tm.__file__).resolve().parent / "pretrained"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--seeds", default="0-15")
    ap.add_argument("--batched", action="store_true", help="train the seeds at once (train_many)")
    ap.add_argument("--work", default="runs/bundle", help="where the seeds are trained (resumed)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--target", help="where the bundle is written (default: the package's "
                    "tfmatcomp/pretrained/<preset>, replaced)")
    ap.add_argument("--no-train", action="store_true",
                    help="bundle the seeds' runs in --work as they are (trained elsewhere)")
    ap.add_argument("--checkpoints", type=int, default=6, help="checkpoints to bundle")
    ap.add_argument("--bundle-seed", type=int, help="the seed to bundle (default: the typical seed, "
                    "whose onset is the median of those that dropped); seed 0 is the seed that "
                    "`tfmatcomp demo` trains, so bundling it lets a user reproduce the bundled run "
                    "bit for bit with the same thread count on the same CPU model")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    preset = args.preset
    target = Path(args.target) if args.target else PRETRAINED / preset
    if args.batched and not args.no_train:
        tm.train_many(preset, seeds=args.seeds, out_dir=args.work, resume=True, device="cpu")
    else:
        seeds = parse_seeds(args.seeds)
        for s in ([] if args.no_train else seeds):
            tm.train(preset, seed=s, out_dir=seed_dir(args.work, s), resume=True, device="cpu")
        Path(args.work).mkdir(parents=True, exist_ok=True)
        write_group_file(Path(args.work), seeds)
    group = SeedGroup.load(args.work)
    seed = group.typical_seed() if args.bundle_seed is None else args.bundle_seed
    if seed is None:
        raise SystemExit("no seed dropped: nothing worth bundling")
    if seed not in group.dropped:
        raise SystemExit(f"--bundle-seed: seed {seed} did not drop (dropped: {group.dropped})")
    source = seed_dir(args.work, seed)
    ckpts = tm.list_checkpoints(source)
    drop = group.drops[seed]
    pre, post, _ = choose_steps(ckpts, drop)
    around = sorted(ckpts, key=lambda s: min(abs(s - drop.drop_start), abs(s - drop.drop_step),
                                             abs(s - drop.drop_end)))
    keep = sorted({pre, post, *around[:max(args.checkpoints - 2, 0)]})
    if target.exists():
        shutil.rmtree(target)
    (target / CHECKPOINTS_DIR).mkdir(parents=True)
    for name in (METRICS_FILE, RUN_FILE):
        shutil.copy(source / name, target / name)
    train_cfg = tm.get_preset(preset).train
    for step in keep:
        # written again without training state, in the preset's checkpoint dtype and shards (a
        # seed trained before the preset had them, or one screened with float32 checkpoints,
        # bundles the same files as one trained by the preset now)
        model, info = load_checkpoint_info(ckpts[step])
        tm.save_checkpoint(model, target / CHECKPOINTS_DIR / ckpts[step].name,
                           task_cfg=info.task_cfg, train_cfg=info.train_cfg, step=info.step,
                           metadata=info.metadata, dtype=train_cfg.checkpoint_dtype,
                           max_shard_mb=train_cfg.max_shard_mb)
    (target / "group").mkdir()
    (target / "group" / GROUP_FILE).write_text(json.dumps({"seeds": group.seeds}, indent=2))
    for s in group.seeds:
        dest = seed_dir(target / "group", s)
        dest.mkdir()
        for name in (METRICS_FILE, RUN_FILE):
            shutil.copy(seed_dir(args.work, s) / name, dest / name)
    run = json.loads((source / RUN_FILE).read_text())
    info = {
        "name": preset, "preset": preset, "seed": seed,
        "pre_shift_step": pre, "post_shift_step": post, "group": "group",
        "how": (f"python scripts/make_bundled_run.py --preset {preset} --seeds {args.seeds}"
                f"{' --batched' if args.batched else ''}{' --no-train' if args.no_train else ''}"
                f"{'' if args.bundle_seed is None else f' --bundle-seed {args.bundle_seed}'}"
                f" --checkpoints {args.checkpoints} --work {args.work} "
                f"({'tfmatcomp.train_many' if args.batched else 'tfmatcomp.train, one seed at a time,'} "
                f"on the {preset} preset, {run.get('processor', run.get('device', 'cpu'))}, "
                f"torch {run['torch']}, {run['torch_threads']} torch "
                f"thread(s), {run.get('step', 'float32 step')}); "
                + (f"seed {seed} (whose drop onset is the median; of an even count, the earlier "
                   "of the two middle ones) is bundled; "
                   if args.bundle_seed is None else
                   f"seed {seed} (chosen with --bundle-seed; `tfmatcomp demo --preset {preset} "
                   f"--seeds {seed}` trains it again) is bundled; ")
                + "the seeds that dropped: "
                + f"{len(group.dropped)} of {len(group.seeds)}; {len(keep)} of its "
                f"{len(ckpts)} checkpoints are bundled, and every seed's metrics log is in group/"),
        "torch": run["torch"], "torch_threads": run["torch_threads"],
        "step": run.get("step"),
        "detected_drop": drop.as_dict(),
    }
    (target / PRETRAINED_FILE).write_text(json.dumps(info, indent=2))
    print(json.dumps(info, indent=2))
    print(group.table().to_string(index=False))


if __name__ == "__main__":
    main()
