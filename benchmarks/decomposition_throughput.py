"""Throughput of the streaming decomposition accumulator next to the forward passes that feed it.

Runs the ``tiny`` preset model (random weights or a checkpoint) on pre-sampled batches and times,
in the same process:

* ``forward``: ``model(tokens, return_type=None)`` alone (the baseline);
* ``forward + accumulate``: :func:`tfmatcomp.decomposition.accumulate` over the same batches
  (hooks feeding the accumulator for every residual-stream layer);
* ``forward + accumulate, second_moment=False``: the same without the ``d x d`` second moment
  (what the float64 Gram for the relative norm costs);
* ``accumulate only``: ``DecompositionAccumulator.update`` on activations cached beforehand.

The forward and the accumulate runs alternate (``--repeats`` pairs) so that a machine whose load
changes during the run slows both alike. Each path's time is its fastest run (the one least
disturbed by other processes); the overhead printed is their ratio, and the median over the pairs
of ``accumulate / forward`` beside it.

Memory: before the timings, ``accumulate`` streams freshly sampled batches (nothing kept) over
``--batches`` and then ``4 x --batches`` batches; the process's peak resident memory
(``resource.getrusage``) after each and the accumulator's state (``keep_ctx=False``: the
``O(L T d + L d^2)`` sums; with ``keep_ctx=True`` only the ``O(C d)`` context means grow) are printed.

Usage::

    python benchmarks/decomposition_throughput.py [--batches 20] [--batch-size 256] [--threads 1]
        [--repeats 7] [--checkpoint PATH] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

import tfmatcomp as tm
from tfmatcomp.datapath import load_model, run_chunked, sample_batch
from tfmatcomp.decomposition import DecompositionAccumulator, accumulate, residual_stream_names


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_once(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _peak_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return _peak_rss_mb()


def _memory(model, task, names, n_batches: int, batch_size: int, device: torch.device) -> None:
    """Peak memory while streaming n and 4n freshly sampled batches (none of them kept)."""
    def stream(n, keep_ctx):
        g = torch.Generator().manual_seed(1)
        batches = (sample_batch(task, batch_size, generator=g, device=device).tokens for _ in range(n))
        return accumulate(model, batches, names, keep_ctx=keep_ctx, progress=False)

    stream(2, False)  # warm-up: one forward pass's buffers
    for keep_ctx in (False, True):
        for n in (n_batches, 4 * n_batches):
            acc = stream(n, keep_ctx)
            print(f"  keep_ctx={keep_ctx!s:5} {n * batch_size:8,} contexts: accumulator state "
                  f"{acc.nbytes():>12,} bytes; peak {'GPU' if device.type == 'cuda' else 'RSS'} "
                  f"{_peak_bytes(device):8.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
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

    print(f"model: tiny preset ({model.cfg.n_layers} layers, d_model {model.cfg.d_model}, "
          f"{model.cfg.n_ctx} positions), "
          f"{'checkpoint ' + args.checkpoint if args.checkpoint else 'random weights'}, device {device}, "
          f"threads {args.threads}")
    print(f"data: {args.batches} batches x {args.batch_size} contexts = {n_tokens:,} tokens; "
          f"{len(names)} layers decomposed ({', '.join(names)})")
    print("memory (flat in the number of contexts):")
    _memory(model, preset.task, names, args.batches, args.batch_size, device)

    with torch.no_grad():
        model(tokens[0], return_type=None)  # warm-up
        accumulate(model, tokens[:1], names, progress=False)

        def forward_only():
            for t in tokens:
                model(t, return_type=None)

        def forward_accumulate():
            accumulate(model, tokens, names, progress=False)

        def forward_accumulate_means():
            accumulate(model, tokens, names, second_moment=False, progress=False)

        pairs = [(_time_once(forward_only, device), _time_once(forward_accumulate, device),
                  _time_once(forward_accumulate_means, device)) for _ in range(args.repeats)]
        t_fwd, t_acc = min(p[0] for p in pairs), min(p[1] for p in pairs)
        t_means = min(p[2] for p in pairs)
        ratio = t_acc / t_fwd
        ratio_pairs = statistics.median(p[1] / p[0] for p in pairs)

        cached = [run_chunked(model, t, batch_size=t.shape[0], names=names, return_predictions=False)[1]
                  for t in tokens]

        def update_only():
            acc = DecompositionAccumulator()
            for acts in cached:
                acc.update(acts)
            acc.results()

        t_upd = min(_time_once(update_only, device) for _ in range(args.repeats))

    print(f"time (fastest of {args.repeats} runs; forward and accumulate runs alternate):")
    rows = [("forward only (baseline)", t_fwd), ("forward + accumulate", t_acc),
            ("forward + accumulate, second_moment=False", t_means),
            ("accumulate only (cached activations)", t_upd)]
    for label, t in rows:
        print(f"  {label:42s} {t:8.3f} s  {n_tokens / t:14,.0f} tokens/s")
    print(f"  accumulate overhead on the forward pass: {ratio:.3f}x (+{100 * (ratio - 1):.1f}%; "
          f"median over the alternating pairs {ratio_pairs:.3f}x); accumulator alone is "
          f"{t_fwd / t_upd:.2f}x the forward-pass token rate")

if __name__ == "__main__":
    main()
