"""The fast training step, checked on CPU: off by default for narrow models and on CPUs without
bf16 matrix units (so ``tiny`` runs are unchanged), on by default for d_model >= 256 where the CPU
has them; forced on it agrees with the explicit float32 step to bf16 accuracy and keeps float32
weights, metrics and checkpoints; the switch is honoured, hooked and component-wise runs keep the
explicit step, and no tensor is read back to the host between logging steps on CUDA's path."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.training import fast_step
from tfmatcomp.training.steps import ExplicitStep, FastTrainerStep
from tfmatcomp.task.data import DISTRIBUTIONS, MatrixCompletionTask
from tfmatcomp.runs.layout import RUN_FILE

KW = dict(n_steps=5, batch_size=16, log_every=1, progress=False)
ROOT = Path(__file__).resolve().parents[1]


def test_off_by_default_on_cpu_and_on_by_default_on_cuda():
    trainer = tm.Trainer("tiny", device="cpu", progress=False)
    assert not trainer.fast and not trainer.optimizer.param_groups[0].get("fused")
    assert isinstance(trainer.training_step(), ExplicitStep)
    assert fast_step.use_fast(None, torch.device("cuda"), None)
    assert not fast_step.use_fast(False, torch.device("cuda"), None)
    assert not fast_step.use_fast(None, torch.device("cuda"), "a decoder")


@pytest.mark.parametrize("units", ["AMX", "AVX-512 bf16", None])
def test_cpu_default_takes_the_fast_step_for_wide_models_on_bf16_cpus_only(monkeypatch, units):
    fast_step.cpu_bf16_units.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: units == "AMX")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: units is not None)
    try:
        wide, why = fast_step.decide(None, torch.device("cpu"), None, d_model=256)
        assert wide is (units is not None)
        assert (units or "no bf16 matrix units") in why
        narrow, why = fast_step.decide(None, torch.device("cpu"), None, d_model=128)
        assert not narrow and "d_model 128 < 256" in why
        cfg = tm.EncoderConfig(n_layers=1, n_heads=8, d_model=256, d_mlp=64, n_ctx=16)
        trainer = tm.Trainer("tiny", model_cfg=cfg, device="cpu", progress=False)
        assert trainer.fast is (units is not None) and trainer.step_reason.startswith(
            "fast step" if units else "float32 step")
        assert bool(trainer.optimizer.param_groups[0].get("fused")) is (units is not None)
    finally:
        fast_step.cpu_bf16_units.cache_clear()


def test_tiny_never_takes_the_fast_step_by_itself(monkeypatch):
    monkeypatch.setattr(fast_step, "cpu_bf16_units", lambda: "AMX")
    trainer = tm.Trainer("tiny", device="cpu", progress=False)
    assert not trainer.fast and "d_model 64" in trainer.step_reason


def test_the_reason_is_written_in_run_json(tmp_path):
    import json

    tm.train("tiny", out_dir=tmp_path, fast=True, **KW)
    assert json.loads((tmp_path / RUN_FILE).read_text())["step"].startswith("fast step: bf16")
    tm.train("tiny", out_dir=tmp_path / "b", **KW)
    assert "d_model 64" in json.loads((tmp_path / "b" / RUN_FILE).read_text())["step"]


def test_fast_cpu_run_keeps_float32_weights_metrics_and_checkpoints(tmp_path):
    result = tm.train("tiny", out_dir=tmp_path, fast=True, checkpoint_every=5, **KW)
    assert all(p.dtype == torch.float32 for p in result.model.parameters())
    assert all(str(result.metrics[c].dtype) == "float64" for c in result.metrics.columns
               if c.startswith(("train_", "eval_")))
    loaded = tm.load_checkpoint(max(tm.list_checkpoints(tmp_path).items())[1])
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    # the update reads bf16 copies of the weights, made once per step, never the weights in place
    trainer = tm.Trainer("tiny", device="cpu", fast=True, **KW)
    casts = []
    real_to = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        if torch.bfloat16 in args or kwargs.get("dtype") is torch.bfloat16:
            casts.append(tuple(self.shape))
        return real_to(self, *args, **kwargs)

    step = trainer.training_step()
    torch.Tensor.to = counting_to
    try:
        step.update()
    finally:
        torch.Tensor.to = real_to
    assert len(casts) == len(list(trainer.model.parameters()))


def test_default_and_fast_false_are_the_same_run_on_cpu():
    a, b = tm.train("tiny", **KW), tm.train("tiny", fast=False, **KW)
    cols = [c for c in a.metrics.columns if c != "elapsed_s"]
    assert a.metrics[cols].equals(b.metrics[cols])
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


def test_forced_fast_step_agrees_with_the_float32_step_to_bf16_accuracy():
    explicit = tm.train("tiny", fast=False, **KW).metrics
    fast = tm.train("tiny", fast=True, **KW).metrics
    for col in ("train_L", "train_L_obs", "train_L_mask", "eval_L", "eval_L_mask"):
        torch.testing.assert_close(torch.tensor(fast[col].values), torch.tensor(explicit[col].values),
                                   rtol=2e-2, atol=1e-4, msg=col)


def test_one_fast_update_matches_the_explicit_forward_to_bf16_accuracy():
    model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    batch = MatrixCompletionTask(4, rank=1).sample(32, torch.Generator().manual_seed(0))
    expected = model(batch.tokens).detach()
    step = fast_step.FastStep(model, torch.optim.Adam(model.parameters(), lr=0.0), compile=True)
    predictions = step.update(batch)
    torch.testing.assert_close(predictions.float(), expected, rtol=2e-2, atol=2e-2)


def test_switch_is_honoured_and_fused_adam_goes_with_it():
    trainer = tm.Trainer("tiny", device="cpu", fast=True, **KW)
    assert trainer.optimizer.param_groups[0]["fused"]
    trainer.run()
    assert type(trainer.training_step()) is FastTrainerStep and trainer.train_cfg.fast is True


def test_runs_that_must_stay_explicit():
    with pytest.raises(ValueError, match="fast: .*attention penalty"):
        tm.Trainer("tiny", progress=False, fast=True,
                   interventions=[{"kind": "row_column_attention_penalty", "weight": 1.0}])
    with pytest.raises(ValueError, match="fast: .*HookedDecoder"):
        tm.Trainer("gpt-tiny", progress=False, fast=True)
    # left to choose (None), the same runs quietly keep the explicit step even on CUDA
    assert fast_step.blocker(tm.HookedEncoder, True)
    trainer = tm.Trainer("tiny", fast=True, **KW)
    trainer.model.add_hook("blocks.0.attn.hook_pattern", lambda t, hook: t)
    with pytest.warns(UserWarning, match="hooks are attached"):
        assert type(trainer.training_step()) is ExplicitStep
    trainer.model.reset_hooks()
    handle = trainer.model.blocks[0].register_forward_hook(lambda *a: None)  # a plain torch hook
    assert fast_step.hooks_attached(trainer.model)
    handle.remove()
    assert not fast_step.hooks_attached(trainer.model)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_device_sampling_is_the_task_stream(distribution):
    task = MatrixCompletionTask(n_rows=5, rank=2, p_mask=0.3, distribution=distribution)
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    for _ in range(3):
        a = fast_step.sample_batch(task, 64, g1, torch.device("cpu"))
        b = task.sample(64, generator=g2)
        for name in ("tokens", "values", "observed"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(g1.get_state(), g2.get_state())


_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")


def _count_reads(monkeypatch) -> list[str]:
    seen: list[str] = []
    for name in _READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            seen.append(_name)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return seen


def test_no_tensor_is_read_back_between_logging_steps(monkeypatch):
    trainer = tm.Trainer("tiny", progress=False, fast=True, batch_size=16, log_every=100)
    update = trainer.training_step().update
    update()  # compiles
    seen = _count_reads(monkeypatch)
    for _ in range(3):
        update()
    assert seen == [], f"host reads on non-logging steps: {seen}"
    trainer.training_step().check_finite(4)  # the logging step reads one flag
    assert seen == ["__bool__"]
    seen.clear()
    trainer.update()  # the explicit step reads back (token checks, finiteness): the test can tell
    assert seen


def test_a_non_finite_loss_stops_the_fast_run_before_a_checkpoint(tmp_path):
    model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    with torch.no_grad():
        model.readout.b.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="between steps 1 and 3"):
        tm.train("tiny", model=model, fast=True, n_steps=6, batch_size=8, log_every=3,
                 checkpoint_every=3, out_dir=tmp_path / "run", progress=False)
    assert tm.list_checkpoints(tmp_path / "run") == {}


def test_a_fast_run_resumes_with_the_explicit_step(tmp_path):
    kw = dict(batch_size=8, log_every=2, checkpoint_every=2, progress=False)
    tm.train("tiny", n_steps=4, out_dir=tmp_path, fast=True, **kw)
    trainer = tm.Trainer("tiny", out_dir=tmp_path, fast=False, n_steps=6, **kw)
    assert trainer.resume() and trainer.step == 4
    assert not trainer.optimizer.param_groups[0].get("fused")  # this run's Adam, not the saved one
    assert trainer.run().step == 6


def test_numerics_sets_tf32_for_cuda_only_inside_the_block():
    before = torch.get_float32_matmul_precision()
    with fast_step.numerics(torch.device("cuda")):  # a flag: needs no GPU to be set
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before


def test_benchmark_runs_on_cpu_with_a_small_preset():
    with warnings.catch_warnings():
        out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_step.py"),
                              "--presets", "tiny", "--steps", "2", "--warmup", "1", "--device",
                              "cpu", "--batch-size", "8"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    for word in ("ours explicit", "ours fast", "HF eager fp32", "HF sdpa bf16", "50,000 steps"):
        assert word in out.stdout, out.stdout


def test_cpu_step_variants_benchmark_runs_every_variant():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_step_variants.py"),
                          "--d-model", "64", "--batch-size", "4", "--steps", "1", "--rounds", "1",
                          "--threads", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    for word in ("float32", "autocast", "cast, sdpa flash", "cast, sdpa math", "cast, explicit"):
        assert word in out.stdout, out.stdout


def test_sdpa_attention_option_gives_the_same_step_to_bf16_accuracy():
    batch = MatrixCompletionTask(4, rank=1).sample(16, torch.Generator().manual_seed(0))
    out = {}
    for attention in ("explicit", "sdpa"):
        model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        step = fast_step.FastStep(model, torch.optim.Adam(model.parameters(), lr=0.0),
                                  attention=attention)
        out[attention] = step.update(batch)
    torch.testing.assert_close(out["sdpa"], out["explicit"], rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="attention"):
        fast_step.FastStep(model, torch.optim.Adam(model.parameters()), attention="flash")
