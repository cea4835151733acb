"""Throughput of the streaming decomposition accumulator next to the forward passes that feed it.

Runs the ``tiny`` preset model (random weights or a checkpoint) on pre-sampled batches and times,
in the same process:

* ``forward``: ``model(tokens, return_type=None)`` alone (the baseline);
* ``forward + accumulate``: :func:`tfmatcomp.decomposition.accumulate` over the same batches
  (hooks feeding the accumulator for every residual-stream layer);
* ``accumulate only``: ``DecompositionAccumulator.update`` on activations cached beforehand.

Each timing is the median of ``--repeats`` runs. Usage::

    python benchmarks/decomposition_throughput.py [--batches 20] [--batch-size 256] [--threads 1]
        [--checkpoint PATH] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import tfmatcomp as tm
from tfmatcomp.datapath import load_model, run_chunked, sample_batch
from tfmatcomp.decomposition import DecompositionAccumulator, accumulate, residual_stream_names


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (default: random weights)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    preset = tm.get_preset("tiny")
    model = load_model(args.checkpoint or tm.HookedEncoder(preset.model, seed=0), device=device)
    model.eval()
    g = torch.Generator().manual_seed(0)   # the same matrices on every device
    tokens = [sample_batch(preset.task, args.batch_size, generator=g, device=device).tokens
              for _ in range(args.batches)]
    n_tokens = sum(t.numel() for t in tokens)
    names = residual_stream_names(model)

    with torch.no_grad():
        model(tokens[0], return_type=None)  # warm-up

        def forward_only():
            for t in tokens:
                model(t, return_type=None)

        t_fwd = _time(forward_only, args.repeats, device)
        t_acc = _time(lambda: accumulate(model, tokens, names, progress=False), args.repeats, device)

        cached = [run_chunked(model, t, batch_size=t.shape[0], names=names, return_predictions=False)[1]
                  for t in tokens]

        def update_only():
            acc = DecompositionAccumulator()
            for acts in cached:
                acc.update(acts)
            acc.results()

        t_upd = _time(update_only, args.repeats, device)
    acc = accumulate(model, tokens, names, progress=False)

    d = model.cfg.d_model
    print(f"model: tiny preset ({model.cfg.n_layers} layers, d_model {d}, {model.cfg.n_ctx} positions), "
          f"{'checkpoint ' + args.checkpoint if args.checkpoint else 'random weights'}, device {device}, "
          f"threads {args.threads}")
    print(f"data: {args.batches} batches x {args.batch_size} contexts = {n_tokens:,} tokens; "
          f"{len(names)} layers decomposed ({', '.join(names)})")
    rows = [("forward only (baseline)", t_fwd), ("forward + accumulate", t_acc),
            ("accumulate only (cached activations)", t_upd)]
    for label, t in rows:
        print(f"  {label:40s} {t:8.3f} s  {n_tokens / t:14,.0f} tokens/s")
    print(f"  accumulate overhead on the forward pass: {t_acc / t_fwd:.2f}x "
          f"(+{100 * (t_acc - t_fwd) / t_fwd:.0f}%); accumulator alone is "
          f"{t_fwd / t_upd:.2f}x the forward-pass token rate")
    print(f"  accumulator memory: {acc.nbytes():,} bytes in {len(acc.retained_tensors())} tensors "
          f"for {acc.n_contexts():,} contexts")


if __name__ == "__main__":
    main()
