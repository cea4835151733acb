"""Why the fast CPU step is built as it is: one training step of the same model, batch and weights
under each way of using bf16 on a CPU, timed in one run.

* ``float32``: the Trainer's explicit step;
* ``autocast``: the float32 model under ``torch.autocast("cpu", bfloat16)`` (weights re-cast per
  op; SDPA's flash kernel in bf16);
* ``cast, sdpa flash`` / ``cast, sdpa math`` / ``cast, explicit``: the weights cast to bf16 once per
  step (:class:`tfmatcomp.training.fast_step.FastStep`'s way) with attention through SDPA's default (flash)
  kernel, its math kernel, or the components' explicit matmuls (what the fast step runs).

Printed: ms/step and the speed-up over ``float32``, medians of interleaved rounds.

    chrt -r 1 python benchmarks/cpu_step_variants.py                  # 4L8H d 256, batch 128
    python benchmarks/cpu_step_variants.py --d-model 512 --batch-size 256 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tfmatcomp as tm
from tfmatcomp.training.fast_step import FastStep
from tfmatcomp.task.metrics import mse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=4, help="timed steps per variant and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    preset = tm.get_preset("paper-4l8h")
    cfg = dataclasses.replace(preset.model, d_model=args.d_model, d_mlp=4 * args.d_model,
                              d_head=None)
    base = tm.HookedEncoder(cfg, seed=0)
    batch = preset.task.build().sample(args.batch_size, generator=torch.Generator().manual_seed(0))

    def plain(autocast: bool):
        model = copy.deepcopy(base).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else contextlib.nullcontext

        def step():
            with ctx():
                predictions = model(batch.tokens)
            loss = mse(predictions.float(), batch.values)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    def cast(backend: SDPBackend | None):
        model = copy.deepcopy(base).train()
        runner = FastStep(model, torch.optim.Adam(model.parameters(), lr=1e-4, fused=True),
                          attention="explicit" if backend is None else "sdpa")
        ctx = (lambda: sdpa_kernel(backend)) if backend is not None else contextlib.nullcontext

        def step():
            with ctx():
                runner.update(batch)
        return step

    variants = {"float32": plain(False), "autocast": plain(True),
                "cast, sdpa flash": cast(SDPBackend.FLASH_ATTENTION),
                "cast, sdpa math": cast(SDPBackend.MATH), "cast, explicit": cast(None)}
    for step in variants.values():
        step()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, step in variants.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append((time.perf_counter() - t0) / args.steps)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; 4L8H d_model "
          f"{args.d_model}, batch {args.batch_size}")
    print(f"{'step':20s} {'ms/step':>9s} {'vs float32':>11s}")
    for name, v in ms.items():
        print(f"{name:20s} {v:9.1f} {ms['float32'] / v:10.2f}x")


if __name__ == "__main__":
    main()
