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

Two shapes (``--shape``): ``tiny``, the matrix-completion preset (2 layers, d_model 64, 16
positions: a forward pass so small per token that the accumulator's fixed per-layer work weighs
most), and ``minilm``, a random HookedEncoder of the shape of all-MiniLM-L6-v2 (6 layers, d_model
384, 12 heads, d_mlp 1536) on contexts of 128 tokens: the shape ``tfmatcomp geometry`` runs on in
docs/geometry.md, with no download.

Usage::

    python benchmarks/decomposition_throughput.py [--shape tiny|minilm] [--batches 20]
        [--batch-size 256] [--threads 1] [--repeats 7] [--checkpoint PATH] [--device cpu|cuda]
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


def _memory(model, make_batch, names, n_batches: int, batch_size: int, device: torch.device) -> None:
    """Peak memory while streaming n and 4n freshly made batches (none of them kept)."""
    def stream(n, keep_ctx):
        g = torch.Generator().manual_seed(1)
        batches = (make_batch(g) for _ in range(n))
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
    parser.add_argument("--shape", choices=("tiny", "minilm"), default="tiny")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="contexts per batch (default: 256 for tiny, 16 for minilm)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (default: random weights)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.batch_size is None:
        args.batch_size = 256 if args.shape == "tiny" else 16

    preset = tm.get_preset("tiny")
    g = torch.Generator().manual_seed(0)   # the same inputs on every device
    if args.shape == "minilm":
        cfg = tm.EncoderConfig(n_layers=6, n_heads=12, d_model=384, d_mlp=1536, n_ctx=128,
                               d_vocab=30522)
        model = load_model(tm.HookedEncoder(cfg, seed=0), device=device)

        def make_batch(gen):
            return torch.randint(1, cfg.d_vocab, (args.batch_size, cfg.n_ctx), generator=gen).to(device)
    else:
        model = load_model(args.checkpoint or tm.HookedEncoder(preset.model, seed=0), device=device)

        def make_batch(gen):
            return sample_batch(preset.task, args.batch_size, generator=gen, device=device).tokens
    tokens = [make_batch(g) for _ in range(args.batches)]
    model.eval()
    n_tokens = sum(t.numel() for t in tokens)
    names = residual_stream_names(model)

    print(f"model: {args.shape} ({model.cfg.n_layers} layers, d_model {model.cfg.d_model}, "
          f"{model.cfg.n_ctx} positions), "
          f"{'checkpoint ' + args.checkpoint if args.checkpoint else 'random weights'}, device {device}, "
          f"threads {args.threads}")
    print(f"data: {args.batches} batches x {args.batch_size} contexts = {n_tokens:,} tokens; "
          f"{len(names)} layers decomposed ({', '.join(names)})")
    print("memory (flat in the number of contexts):")
    _memory(model, make_batch, names, args.batches, args.batch_size, device)

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
