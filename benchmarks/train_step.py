"""Time one training step of our HookedEncoder against transformers' BertModel + read-out.

Same config, same weights, same batch, same device, in one run; prints ms/step and the ratio.

    python benchmarks/train_step.py                      # tiny and paper-4l8h on the default device
    python benchmarks/train_step.py --presets tiny --steps 50 --device cpu
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from transformers import BertModel

import tfmatcomp as tm
from tfmatcomp.convert import config_to_hf
from tfmatcomp.metrics import masked_mse


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step, n_steps: int, n_warmup: int, device: torch.device) -> list[float]:
    for _ in range(n_warmup):
        step()
    _sync(device)
    times = []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def bench(preset_name: str, device: torch.device, n_steps: int, n_warmup: int, batch_size: int | None):
    preset = tm.get_preset(preset_name)
    batch_size = batch_size or preset.train.batch_size
    ours = tm.HookedEncoder(preset.model, seed=0).to(device).train()
    bert, readout = ours.to_hf()  # eager attention, as in the equivalence tests
    bert.train()
    sdpa_cfg = config_to_hf(preset.model)
    sdpa_cfg._attn_implementation = "sdpa"
    bert_sdpa = BertModel(sdpa_cfg, add_pooling_layer=False).to(device)
    bert_sdpa.load_state_dict(bert.state_dict())
    bert_sdpa.train()
    readout_sdpa = torch.nn.Linear(preset.model.d_model, 1).to(device)
    readout_sdpa.load_state_dict(readout.state_dict())
    batch = preset.task.build().sample(batch_size, generator=torch.Generator(device).manual_seed(0), device=device)
    opt_ours = torch.optim.Adam(ours.parameters(), lr=preset.train.lr)
    opt_hf = torch.optim.Adam(list(bert.parameters()) + list(readout.parameters()), lr=preset.train.lr)
    opt_sdpa = torch.optim.Adam(list(bert_sdpa.parameters()) + list(readout_sdpa.parameters()),
                                lr=preset.train.lr)

    def step_ours():
        loss = masked_mse(ours(batch.tokens), batch.values)
        opt_ours.zero_grad(set_to_none=True)
        loss.backward()
        opt_ours.step()

    def hf_step(model, head, opt):
        def step():
            pred = head(model(batch.tokens).last_hidden_state).squeeze(-1)
            loss = masked_mse(pred, batch.values)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    steps = {"ours": step_ours, "HF eager": hf_step(bert, readout, opt_hf),
             "HF sdpa": hf_step(bert_sdpa, readout_sdpa, opt_sdpa)}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(2):  # interleave rounds so drift in machine load hits all equally
        for name, step in steps.items():
            times[name] += time_steps(step, n_steps // 2 or 1, n_warmup, device)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{preset_name:12s} batch {batch_size:4d} {str(device):6s} | ours {ms['ours']:9.2f} ms/step"
          f" | HF eager {ms['HF eager']:9.2f} | HF sdpa {ms['HF sdpa']:9.2f} | ours/eager "
          f"{ms['ours'] / ms['HF eager']:5.2f}x | ours/sdpa {ms['ours'] / ms['HF sdpa']:5.2f}x")
    return ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="tiny,paper-4l8h")
    p.add_argument("--device", default=str(tm.training.default_device()))
    p.add_argument("--steps", type=int, default=None, help="timed steps (default: 40 tiny, 6 paper)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=None, help="default: the preset's")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {device}")
    for name in args.presets.split(","):
        steps = args.steps or (40 if name == "tiny" else 6)
        bench(name, device, steps, args.warmup, args.batch_size)


if __name__ == "__main__":
    main()
