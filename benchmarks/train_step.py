"""Time one training step of our HookedEncoder against transformers' BertModel + read-out.

Four steps, each from the same initial weights on the same batch, on the same device, in one run:

* ``ours explicit``: the Trainer's explicit step (float32, default Adam);
* ``ours fast``: :class:`tfmatcomp.training.fast_step.FastStep`, what the Trainer runs when it takes the
  fast step: on CUDA bf16 autocast, ``torch.compile``, TF32; on a CPU bf16 weights cast once per
  step and explicit attention, eager; fused Adam on both;
* ``HF eager fp32``: ``BertModel`` with eager attention in float32, default Adam;
* ``HF sdpa bf16``: ``BertModel`` with ``attn_implementation="sdpa"`` under bf16 autocast, fused
  Adam on CUDA (the strongest plain-PyTorch baseline).

Steps are timed in blocks (one device synchronization per block, as a training loop that logs now
and then), in interleaved rounds so that drift in machine load hits every variant alike. Printed:
ms/step, the ratios to ``ours fast``, the projected time of 50,000 steps (the training steps
alone; evaluation and checkpoints add to it), and on a CPU the share of this machine's bf16 matmul
rate (measured first, on the model's MLP matmul) that ``ours fast`` reaches in its matmuls.
Goals: on one H100, ``ours fast`` at least 3x ``HF eager fp32`` and 1.5x ``HF sdpa bf16``, 50,000
steps within 10 minutes; on 2 CPU cores, also at least 3x ``ours explicit`` for d_model >= 256.

    python benchmarks/train_step.py                                  # paper-4l8h at batch 256 on CUDA
    python benchmarks/train_step.py --compile-mode max-autotune-no-cudagraphs
    chrt -r 1 python benchmarks/train_step.py --device cpu --widths 256,512,768   # 4L8H, 2 cores
    python benchmarks/train_step.py --presets tiny --steps 5 --device cpu   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from contextlib import nullcontext

import torch
from transformers import BertModel

import tfmatcomp as tm
from tfmatcomp.training import fast_step
from tfmatcomp.models.conversion.bert import config_to_hf
from tfmatcomp.task.metrics import mse

PROJECTED_STEPS = 50_000


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_block(step, n_steps: int, device: torch.device) -> float:
    """Seconds per step over ``n_steps`` steps with one synchronization at the end."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(n_steps):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / n_steps


def _adam(params, lr: float, fused: bool) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=lr, **({"fused": True} if fused else {}))


def matmul_flops(cfg: tm.EncoderConfig, batch_size: int, n_pos: int) -> float:
    """FLOPs of the matmuls of one training step (forward + backward = 3 forwards)."""
    tokens = batch_size * n_pos
    dense = 2 * tokens * cfg.n_layers * (4 * cfg.d_model * cfg.n_heads * cfg.d_head
                                         + 2 * cfg.d_model * cfg.d_mlp)
    attention = 2 * 2 * batch_size * cfg.n_heads * n_pos * n_pos * cfg.d_head * cfg.n_layers
    return 3.0 * (dense + attention)


def bf16_matmul_rate(cfg: tm.EncoderConfig, tokens: int, device: torch.device) -> float:
    """FLOP/s of this machine's bf16 matmul at the model's MLP shape (``[tokens, d] @ [d, d_mlp]``)."""
    a = torch.randn(tokens, cfg.d_model, dtype=torch.bfloat16, device=device)
    b = torch.randn(cfg.d_model, cfg.d_mlp, dtype=torch.bfloat16, device=device)
    seconds = min(time_block(lambda: a @ b, 10, device) for _ in range(3))
    return 2 * tokens * cfg.d_model * cfg.d_mlp / seconds


def build_steps(preset: tm.Preset, device: torch.device, batch_size: int,
                compile_mode: str | None, compile: bool | None) -> dict:
    """The four step functions, on copies of one initialization and one batch."""
    lr, cuda = preset.train.lr, device.type == "cuda"
    base = tm.HookedEncoder(preset.model, seed=0)
    batch = preset.task.build().sample(batch_size, generator=torch.Generator().manual_seed(0))
    batch = batch.to(device)
    tokens, values = batch.tokens, batch.values

    explicit = copy.deepcopy(base).to(device).train()
    opt_explicit = _adam(explicit.parameters(), lr, fused=False)

    def step_explicit():
        loss = mse(explicit(tokens), values)
        opt_explicit.zero_grad(set_to_none=True)
        loss.backward()
        opt_explicit.step()

    fast = copy.deepcopy(base).to(device).train()
    runner = fast_step.FastStep(fast, _adam(fast.parameters(), lr, fused=cuda), compile=compile,
                                mode=compile_mode)

    def hf_step(attn: str, autocast: bool, fused: bool):
        cfg = config_to_hf(preset.model)
        cfg._attn_implementation = attn
        bert_eager, head = copy.deepcopy(base).to_hf()
        bert = BertModel(cfg, add_pooling_layer=False)
        bert.load_state_dict(bert_eager.state_dict())
        bert, head = bert.to(device).train(), head.to(device).train()
        opt = _adam(list(bert.parameters()) + list(head.parameters()), lr, fused)
        ctx = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if autocast else nullcontext

        def step():
            with ctx():
                pred = head(bert(tokens).last_hidden_state).squeeze(-1)
            loss = mse(pred, values)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    return {"ours explicit": step_explicit, "ours fast": lambda: runner.update(batch),
            "HF eager fp32": hf_step("eager", autocast=False, fused=False),
            "HF sdpa bf16": hf_step("sdpa", autocast=True, fused=cuda)}


def bench(preset_name: str, device: torch.device, n_steps: int, n_warmup: int,
          batch_size: int | None, compile_mode: str | None = None, compile: bool | None = None,
          rounds: int = 2, d_model: int | None = None) -> dict[str, float]:
    """Median ms/step of every variant (printed with the ratios and the projected time);
    ``d_model`` resizes the preset's model (``d_mlp = 4 d_model``, ``d_head = d_model / n_heads``)."""
    preset = tm.get_preset(preset_name)
    if d_model is not None:
        preset = dataclasses.replace(preset, model=dataclasses.replace(
            preset.model, d_model=d_model, d_mlp=4 * d_model, d_head=None))
        preset_name = f"{preset_name} at d_model {d_model}"
    batch_size = batch_size or preset.train.batch_size
    steps = build_steps(preset, device, batch_size, compile_mode, compile)
    with fast_step.numerics(device):  # TF32 as the Trainer's fast run has it (all variants)
        for step in steps.values():  # warm-up (compilation, autotuning, allocator)
            for _ in range(n_warmup):
                step()
        times: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                times[name].append(time_block(step, max(n_steps // rounds, 1), device))
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    cuda = device.type == "cuda"
    compiled = compile if compile is not None else cuda
    backend = f"inductor, mode {compile_mode or 'default'}" if cuda else "aot_eager"
    print(f"\n{preset_name}, batch {batch_size}, {device}, fast step compiled: "
          f"{backend if compiled else 'no'}")
    print(f"{'step':16s} {'ms/step':>10s} {'vs ours fast':>13s} {PROJECTED_STEPS:,} steps")
    for name, v in ms.items():
        minutes = v * PROJECTED_STEPS / 6e4
        print(f"{name:16s} {v:10.2f} {v / ms['ours fast']:12.2f}x {minutes:9.1f} min")
    print(f"goals: HF eager fp32 / ours fast = {ms['HF eager fp32'] / ms['ours fast']:.2f} (>= 3), "
          f"HF sdpa bf16 / ours fast = {ms['HF sdpa bf16'] / ms['ours fast']:.2f} (>= 1.5), "
          f"{PROJECTED_STEPS:,} steps of ours fast in "
          f"{ms['ours fast'] * PROJECTED_STEPS / 6e4:.1f} min (<= 10 on one H100)")
    if not cuda:
        n_pos = preset.task.n_positions
        rate = bf16_matmul_rate(preset.model, batch_size * n_pos, device)
        used = matmul_flops(preset.model, batch_size, n_pos) / (ms["ours fast"] / 1e3)
        print(f"CPU: ours explicit / ours fast = {ms['ours explicit'] / ms['ours fast']:.2f} "
              f"(>= 3 for d_model >= 256); bf16 matmul rate {rate / 1e12:.2f} TFLOP/s, ours fast "
              f"runs its matmul FLOPs at {used / 1e12:.2f} TFLOP/s = {used / rate:.0%} of it")
    return ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_device = tm.training.plan.default_device()
    p.add_argument("--presets", default=None,
                   help="comma-separated presets (default: paper-4l8h on CUDA, tiny elsewhere)")
    p.add_argument("--device", default=str(default_device))
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per variant (default: 100 on CUDA, 6 elsewhere)")
    p.add_argument("--warmup", type=int, default=None, help="default: 10 on CUDA, 2 elsewhere")
    p.add_argument("--batch-size", type=int, default=None, help="default: the preset's")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode of the fast step on CUDA (default, reduce-overhead, "
                   "max-autotune-no-cudagraphs)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the fast step (default: on CUDA only, as the Trainer)")
    p.add_argument("--widths", default=None,
                   help="comma-separated d_model values of each preset's model (default: its own)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {device} ({name})")
    default = "paper-4l8h" if cuda or args.widths else "tiny"
    widths = [int(w) for w in args.widths.split(",")] if args.widths else [None]
    for preset in (args.presets or default).split(","):
        for d_model in widths:
            bench(preset, device, args.steps or (100 if cuda else 6),
                  args.warmup if args.warmup is not None else (10 if cuda else 2),
                  args.batch_size, args.compile_mode, args.compile, d_model=d_model)


if __name__ == "__main__":
    main()
