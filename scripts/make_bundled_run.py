"""Regenerate the run bundled in the package (tfmatcomp/pretrained/tiny) from the tiny preset.

Trains the preset's seeds at once with one torch thread (tfmatcomp.train_many), detects each
seed's drop, and bundles the seed whose drop onset is the median of those that dropped (the typical
seed): its metrics log, run.json and a few checkpoints (pre-shift on the plateau, around the drop,
the last), plus every seed's metrics log under group/ so that the report can show the distribution
of drop steps. pretrained.json records how it was trained (torch version, threads) and the drop.

    python scripts/make_bundled_run.py --seeds 0-7 --work runs/bundle
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

import tfmatcomp as tm
from tfmatcomp.multiseed import GROUP_FILE, seed_dir
from tfmatcomp.report.run import SeedGroup, choose_steps

TARGET = Path(tm.__file__).resolve().parent / "pretrained" / "tiny"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-7")
    ap.add_argument("--work", default="runs/bundle", help="where the seeds are trained (resumed)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--checkpoints", type=int, default=6, help="checkpoints to bundle")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tm.train_many("tiny", seeds=args.seeds, out_dir=args.work, resume=True, device="cpu")
    group = SeedGroup.load(args.work)
    seed = group.typical_seed()
    if seed is None:
        raise SystemExit("no seed dropped: nothing worth bundling")
    source = seed_dir(args.work, seed)
    ckpts = tm.list_checkpoints(source)
    drop = group.drops[seed]
    pre, post, _ = choose_steps(ckpts, drop)
    around = sorted(ckpts, key=lambda s: min(abs(s - drop.drop_start), abs(s - drop.drop_step),
                                             abs(s - drop.drop_end)))
    keep = sorted({pre, post, *around[:max(args.checkpoints - 2, 0)]})
    if TARGET.exists():
        shutil.rmtree(TARGET)
    (TARGET / "checkpoints").mkdir(parents=True)
    for name in ("metrics.jsonl", "run.json"):
        shutil.copy(source / name, TARGET / name)
    for step in keep:
        dest = TARGET / "checkpoints" / ckpts[step].name
        shutil.copytree(ckpts[step], dest, ignore=shutil.ignore_patterns("state.*"))
        config = json.loads((dest / "config.json").read_text())
        for name in ("state.safetensors", "state.json"):
            config["files"].pop(name, None)
        (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (TARGET / "group").mkdir()
    (TARGET / "group" / GROUP_FILE).write_text(json.dumps({"seeds": group.seeds}, indent=2))
    for s in group.seeds:
        dest = seed_dir(TARGET / "group", s)
        dest.mkdir()
        for name in ("metrics.jsonl", "run.json"):
            shutil.copy(seed_dir(args.work, s) / name, dest / name)
    run = json.loads((source / "run.json").read_text())
    info = {
        "name": "tiny", "preset": "tiny", "seed": seed,
        "pre_shift_step": pre, "post_shift_step": post, "group": "group",
        "how": (f"python scripts/make_bundled_run.py --seeds {args.seeds} (tfmatcomp.train_many on "
                f"the tiny preset, CPU, torch {run['torch']}, {run['torch_threads']} torch thread(s)); "
                f"seed {seed} is the seed whose drop onset is the median of the "
                f"{len(group.dropped)} of {len(group.seeds)} seeds that dropped; {len(keep)} of its "
                f"{len(ckpts)} checkpoints are bundled, and every seed's metrics log is in group/"),
        "torch": run["torch"], "torch_threads": run["torch_threads"],
        "detected_drop": drop.as_dict(),
    }
    (TARGET / "pretrained.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info, indent=2))
    print(group.table().to_string(index=False))


if __name__ == "__main__":
    main()
