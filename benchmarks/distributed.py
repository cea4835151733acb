"""Data-parallel training step time at 1 and 2 processes (tfmatcomp.distributed), and the ratio.

Times full training steps (sampling, forward, backward, gradient all-reduce, Adam) of the same
global batch on one process (the single-process Trainer) and on 2 processes under torchrun
(DistributedTrainer): on CPU with gloo, one thread per process (so 2 processes use 2 cores; the
single process is timed at 1 and at 2 threads, the fair comparison on the same cores), and on GPUs
with NCCL where the machine has at least 2. Prints ms/step and the speed-up over one process.

    python benchmarks/distributed.py                       # tiny preset, batch 128
    python benchmarks/distributed.py --preset paper-4l8h --batch-size 256 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from tfmatcomp import distributed
from tfmatcomp.training.trainer import Trainer


def _worker(args: argparse.Namespace) -> None:
    """One rank (or the single process): time ``args.steps`` updates after a warm-up."""
    torch.set_num_threads(args.threads)
    overrides = {"batch_size": args.batch_size} if args.batch_size else {}
    if distributed.init(args.device):
        trainer = distributed.DistributedTrainer(args.preset, device=args.device,
                                                 progress=False, **overrides)
        trainer._data_parallel()
        sync = torch.distributed.barrier
    else:
        trainer = Trainer(args.preset, device=args.device, progress=False, **overrides)
        sync = (lambda: None)
    cuda = trainer.device.type == "cuda"
    for _ in range(args.warmup):
        trainer.update()
    if cuda:
        torch.cuda.synchronize(trainer.device)
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        trainer.update()
    if cuda:
        torch.cuda.synchronize(trainer.device)
    sync()
    seconds = (time.perf_counter() - t0) / args.steps
    if distributed.rank() == 0:
        Path(args.out).write_text(json.dumps({"s_per_step": seconds,
                                              "batch": trainer.train_cfg.batch_size}))
    distributed.shutdown()


def _time(args: argparse.Namespace, nproc: int, device: str, threads: int) -> dict:
    out = Path(tempfile.mkdtemp()) / "result.json"
    cmd = [__file__, "--worker", "--preset", args.preset, "--device", device,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(threads),
           "--out", str(out)] + (["--batch-size", str(args.batch_size)] if args.batch_size else [])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if nproc == 1:
        import subprocess

        status = subprocess.call([sys.executable, *cmd], env=env)
    else:
        status = distributed.launch(nproc, cmd, env=env)
    if status != 0:
        raise SystemExit(f"the {nproc}-process run failed (status {status})")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch-size", type=int, help="global batch (default: the preset's)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker(args)
    print(f"preset {args.preset}, torch {torch.__version__}, {os.cpu_count()} CPU cores")
    rows = [("cpu", 1, 1), ("cpu", 1, 2), ("cpu", 2, 1)]
    if torch.cuda.device_count() >= 2:
        rows += [("cuda", 1, 1), ("cuda", 2, 1)]
    base: dict[str, float] = {}
    print(f"{'device':>6} {'procs':>5} {'threads/proc':>12} {'batch':>6} {'ms/step':>9} "
          f"{'speed-up':>9}")
    for device, nproc, threads in rows:
        result = _time(args, nproc, device, threads)
        ms = result["s_per_step"] * 1e3
        base.setdefault(device, ms)
        print(f"{device:>6} {nproc:>5} {threads:>12} {result['batch']:>6} {ms:>9.1f} "
              f"{base[device] / ms:>8.2f}x")
    print("speed-up: against 1 process at 1 thread on the same device")


if __name__ == "__main__":
    main()
