"""Step time of K seeds trained at once (tfmatcomp.MultiSeedTrainer) against one seed (K = 1).

Times full training steps (sampling, forward, backward, Adam) of the batched program for
K = 1, 4, 8, 16 seeds in one run and prints ms/step, the ratio to K = 1 and the cost per seed.
The baseline, K = 1, is the same program with one seed; the single-seed trainer
(tfmatcomp.Trainer, fused kernels) is timed too, so the batched path's own overhead shows.

    python benchmarks/multiseed.py                     # tiny preset, 2 threads
    python benchmarks/multiseed.py --threads 1 --seeds 1,8
"""

from __future__ import annotations

import argparse
import time

import torch

import tfmatcomp as tm
from tfmatcomp.training.multiseed import MultiSeedTrainer, VmapStep


def _time(step, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--seeds", default="1,4,8,16", help="comma-separated K values")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, help="override the preset's batch size")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {"batch_size": args.batch_size} if args.batch_size else {}
    preset = tm.get_preset(args.preset)
    bs = args.batch_size or preset.train.batch_size

    single = tm.Trainer(preset, progress=False, device="cpu", **overrides)

    t_single = _time(single.update, 5, args.repeats)
    print(f"preset {args.preset}, batch {bs}, {args.threads} thread(s), torch {torch.__version__}")
    print(f"single-seed Trainer step: {t_single * 1e3:.1f} ms")
    print(f"{'K':>3} {'ms/step':>9} {'x K=1':>7} {'ms/seed':>8}")
    base = None
    for k in (int(x) for x in args.seeds.split(",")):
        trainer = MultiSeedTrainer(preset, seeds=list(range(k)), progress=False, device="cpu",
                                   **overrides)
        t = _time(VmapStep(trainer).update, 5, args.repeats)  # the step train_many runs
        base = base or t
        print(f"{k:>3} {t * 1e3:>9.1f} {t / base:>7.2f} {t / k * 1e3:>8.1f}")


if __name__ == "__main__":
    main()
