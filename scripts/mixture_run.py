"""Train an encoder on a uniform mixture of matrix sizes (the NeurIPS paper Appendix I) on the CPU, then
print the tables of docs/concepts/decoder.md: per-size L_mask at every checkpoint (the learning order) and,
at the last one, per-size losses on sizes in and out of the mixture next to nuclear-norm
minimization on the same matrices and masks.

The model is the tiny preset's (2 layers, 4 heads, d_model 64, init std 0.1, Adam 1e-3, batch 128)
with n_ctx 81 for 9x9 matrices. Resumable: run it again with a larger --steps to continue.

    python scripts/mixture_run.py --out runs/mixture --steps 6000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd
import torch

import tfmatcomp as tm
from tfmatcomp.analyses.baselines import complete_nuclear_norm
from tfmatcomp.runs.checkpoint import list_checkpoints
from tfmatcomp.datapath import per_size_losses, sample_batch


def sizes(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="run directory (resumed if present)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--mixture", type=sizes, default=(5, 7, 9))
    ap.add_argument("--test-sizes", type=sizes, default=(3, 4, 5, 6, 7, 8, 9))
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--p-mask", type=float, default=0.2)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--checkpoint-every", type=int, default=500)
    ap.add_argument("--samples", type=int, default=256, help="test matrices per size")
    ap.add_argument("--no-baseline", action="store_true", help="skip nuclear-norm minimization")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    preset = tm.get_preset("tiny")
    task_cfg = tm.TaskConfig(mixture=args.mixture, rank=args.rank, p_mask=args.p_mask)
    model_cfg = dataclasses.replace(preset.model, n_ctx=task_cfg.n_positions)
    overrides = {k: v for k, v in {"batch_size": args.batch_size, "lr": args.lr}.items()
                 if v is not None}
    tm.train(preset, model_cfg=model_cfg, task_cfg=task_cfg, out_dir=args.out, resume=True,
             device="cpu", progress=False, n_steps=args.steps,
             checkpoint_every=args.checkpoint_every, checkpoint_steps=(), **overrides)
    m = tm.read_metrics(args.out)
    print(f"ms per step: {1000 * m['elapsed_s'].iloc[-1] / m['step'].iloc[-1]:.1f}")

    rows = []  # learning order: per-size L_mask at every checkpoint
    for step, path in list_checkpoints(args.out).items():
        model = tm.load_checkpoint(path, device="cpu")
        for n, v in per_size_losses(model, task_cfg, sizes=args.mixture,
                                    n_samples=args.samples).items():
            rows.append({"step": step, "size": n, **v})
    order = pd.DataFrame(rows)
    order.to_csv(Path(args.out, "per_size_by_step.csv"), index=False)
    print(order.pivot(index="step", columns="size", values="L_mask")
          .to_string(float_format=lambda x: f"{x:.4f}"))

    final = tm.load_checkpoint(max(list_checkpoints(args.out).items())[1], device="cpu")
    table = []
    for n, v in per_size_losses(final, task_cfg, sizes=args.test_sizes,
                                n_samples=args.samples).items():
        row = {"size": n, "in_mixture": n in args.mixture, **v}
        if not args.no_baseline:  # the same matrices and masks as per_size_losses (seed 0)
            sized = tm.MatrixCompletionTask(n_rows=n, rank=args.rank, p_mask=args.p_mask)
            batch = sample_batch(sized, args.samples, seed=0)
            nn_losses = complete_nuclear_norm(batch).losses(batch)
            row["nuclear_L_mask"] = float(nn_losses["L_mask"])
            row["zero_L_mask"] = float((batch.values[batch.masked] ** 2).mean())
        table.append(row)
    table = pd.DataFrame(table)
    table.to_csv(Path(args.out, "per_size_final.csv"), index=False)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    Path(args.out, "summary.json").write_text(json.dumps(
        {"task": task_cfg.to_dict(), "model": model_cfg.to_dict(), "steps": int(m["step"].max()),
         "ms_per_step": 1000 * float(m["elapsed_s"].iloc[-1]) / float(m["step"].iloc[-1]),
         "threads": args.threads, "final": table.to_dict("records")}, indent=1, default=str))


if __name__ == "__main__":
    main()
