"""Check that the fast training step agrees with the explicit float32 step to bf16 accuracy.

Trains one initialization twice through the Trainer, on the same batches: once with the explicit
float32 step (``fast=False``) and once with the fast step (``fast=True``: on CUDA bf16 autocast,
``torch.compile`` with inductor, TF32, fused Adam; on a CPU bf16 weights cast once per step).
First one forward pass of the fast step (learning rate 0, so no update counts) against the
float32 forward pass of the same weights on the same batch: their predictions must agree within
``--rtol`` of the predictions' scale (bf16 keeps 8 bits of mantissa: about 0.4% per rounding).
Then both runs' training and evaluation losses at every logging step and their relative
difference, which grows as the two trajectories drift apart; the check fails when it exceeds
``--trajectory-rtol``. Exits with status 1 if either check fails.

    python benchmarks/fast_step_agreement.py                      # paper-4l8h on CUDA, 100 steps
    python benchmarks/fast_step_agreement.py --preset tiny --device cpu --steps 20 --batch-size 32
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import tfmatcomp as tm
from tfmatcomp.training import fast_step

COLUMNS = ("train_L", "train_L_mask", "eval_L", "eval_L_mask")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="paper-4l8h")
    p.add_argument("--device", default=str(tm.training.plan.default_device()))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=None, help="default: the preset's")
    p.add_argument("--rtol", type=float, default=2e-2)
    p.add_argument("--trajectory-rtol", type=float, default=5e-2)
    args = p.parse_args()
    preset, device = tm.get_preset(args.preset), torch.device(args.device)
    model = tm.HookedEncoder(preset.model, seed=0).to(device)
    batch = preset.task.build().sample(args.batch_size or preset.train.batch_size,
                                       generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        expected = model(batch.tokens)
    step = fast_step.FastStep(model, torch.optim.Adam(model.parameters(), lr=0.0))
    with fast_step.numerics(device):
        got = step.update(batch).detach()
    one_step = float((got - expected).abs().max() / expected.abs().max())
    print(f"one forward pass: largest |fast - float32| / largest |float32| = {one_step:.2e} "
          f"(rtol {args.rtol:g})")
    kw = dict(n_steps=args.steps, log_every=args.log_every, progress=False, device=args.device,
              **({"batch_size": args.batch_size} if args.batch_size else {}))
    runs = {}
    for fast in (False, True):
        t0 = time.perf_counter()
        trainer = tm.Trainer(args.preset, fast=fast, **kw)
        runs[fast] = trainer.run()
        print(f"{trainer.step_reason} ({time.perf_counter() - t0:.1f} s, compilation included)")
    explicit, fast = runs[False].metrics, runs[True].metrics
    worst = 0.0
    print(f"{'step':>6s} " + " ".join(f"{c + ' fp32':>16s} {c + ' fast':>16s}" for c in COLUMNS))
    for i in range(len(explicit)):
        row = []
        for c in COLUMNS:
            a, b = float(explicit[c].iloc[i]), float(fast[c].iloc[i])
            worst = max(worst, abs(b - a) / max(abs(a), 1e-12))
            row.append(f"{a:16.5f} {b:16.5f}")
        print(f"{int(explicit['step'].iloc[i]):6d} " + " ".join(row))
    ok = one_step <= args.rtol and worst <= args.trajectory_rtol
    print(f"trajectories: largest relative difference {worst:.2e} (rtol {args.trajectory_rtol:g}); "
          f"{'agree' if ok else 'DISAGREE'}; torch {torch.__version__} on {device}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
