"""TransformerLens and packaging habits a researcher brings (issue 25's smaller things): a loaded
model knows its task, the stacked MLP biases, ``--version``, the examples' stated settings, and an
sdist that carries the whole test suite."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.datapath import load_model_info
from tfmatcomp.experiments import activation_patching

TL_MAJOR = int(importlib.metadata.version("transformer-lens").split(".")[0])

ROOT = Path(__file__).resolve().parents[1]


def test_a_loaded_model_carries_its_task_and_analyses_use_it(tmp_path):
    model = tm.load_pretrained("tiny", step="post")
    assert model.task_cfg == tm.get_preset("tiny").task
    assert load_model_info(model)[1] == model.task_cfg
    table = activation_patching(model, n_samples=8)  # no task given: the model's own
    assert len(table)
    trained = tm.train("tiny", n_steps=2, batch_size=4, progress=False).model
    assert trained.task_cfg == tm.get_preset("tiny").task
    assert tm.HookedEncoder(tm.get_preset("tiny").model).task_cfg is None


def test_stacked_mlp_biases_are_the_blocks_biases():
    model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            block.mlp.b_in.fill_(i + 1.0)
            block.mlp.b_out.fill_(-i - 1.0)
    assert model.b_in.shape == (model.cfg.n_layers, model.cfg.d_mlp)
    assert model.b_out.shape == (model.cfg.n_layers, model.cfg.d_model)
    for i, block in enumerate(model.blocks):
        assert torch.equal(model.b_in[i], block.mlp.b_in)
        assert torch.equal(model.b_out[i], block.mlp.b_out)


def test_cli_prints_its_version():
    out = subprocess.run([sys.executable, "-m", "tfmatcomp", "--version"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == f"tfmatcomp {tm.__version__}"


def test_license_is_an_spdx_string_and_the_sdist_carries_the_test_suite():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert "tests/conftest.py" in manifest and "graft tests/data" in manifest


def test_examples_state_the_bundled_runs_settings():
    text = (ROOT / "examples" / "baselines_and_probes.py").read_text()
    assert f"p_mask {tm.get_preset('tiny').task.p_mask}" in text
    text = (ROOT / "examples" / "interventions_tiny.py").read_text()
    assert "default=4000" not in text and 'resolve_step("tiny", "pre")' in text


def test_screenot_default_k_fits_a_small_model():
    from tfmatcomp.geometry.rank import max_screenot_k, screenot

    g = torch.Generator().manual_seed(0)
    pos = torch.randn(16, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 64, generator=g,
                                                                             dtype=torch.float64)
    pos += 0.01 * torch.randn(16, 64, generator=g, dtype=torch.float64)
    result = screenot(pos)  # 16 positions cannot support k = 20
    assert result.k == max_screenot_k(16) == 7
    assert result.rank == screenot(pos, k=7).rank == 3
    big = torch.randn(60, 50, generator=g, dtype=torch.float64)
    assert screenot(big).k == 20


def test_transformer_lens_patching_helpers_run_and_agree_with_our_patch():
    from transformer_lens import patching

    from tfmatcomp.interventions import ActivationPatch

    model = tm.load_pretrained("tiny", step="post")
    assert model.cfg.device == torch.device("cpu") and model.cfg.n_key_value_heads is None
    assert model.cfg == tm.get_preset("tiny").model  # the per-model copy is equal to the preset's
    batch = model.task_cfg.build().sample(4, generator=torch.Generator().manual_seed(0))
    corrupted = batch.negated()
    _, clean_cache = model.run_with_cache(batch.tokens)

    def metric(predictions):
        return predictions[batch.masked].mean()

    table = patching.get_act_patch_attn_head_out_by_pos(model, corrupted.tokens, clean_cache, metric)
    assert table.shape == (model.cfg.n_layers, batch.tokens.shape[1], model.cfg.n_heads)
    for layer, pos, head in [(0, 3, 1), (1, 0, 2), (1, 7, 3)]:
        patch = ActivationPatch(clean_cache, hooks=["attn.hook_z"], layers=[layer], heads=[head],
                                positions=[pos])
        with torch.no_grad(), patch.applied(model):
            ours = metric(model(corrupted.tokens))
        torch.testing.assert_close(table[layer, pos, head], ours, rtol=1e-5, atol=1e-6)
    assert tm.HookedEncoder(model.cfg).to("meta").cfg.device == torch.device("meta")
    assert model.cfg.device == torch.device("cpu")  # each model its own copy
    for name in ("get_act_patch_resid_pre", "get_act_patch_attn_out", "get_act_patch_mlp_out",
                 "get_act_patch_attn_head_out_all_pos", "get_act_patch_attn_head_pattern_by_pos"):
        assert torch.isfinite(getattr(patching, name)(model, corrupted.tokens, clean_cache,
                                                      metric)).all(), name


def test_run_with_cache_incl_bwd_caches_the_gradients_of_the_papers_loss():
    model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    batch = tm.get_preset("tiny").task.build().sample(4, generator=torch.Generator().manual_seed(0))
    loss, cache = model.run_with_cache(batch.tokens, return_type="loss", values=batch.values,
                                       incl_bwd=True)
    torch.testing.assert_close(loss, tm.mse(model(batch.tokens), batch.values))
    name = "blocks.1.hook_resid_pre"
    seen = {}

    def keep(act, hook):
        act.retain_grad()
        seen["act"] = act

    model.zero_grad()
    with model.unfused():  # run_with_cache watched every hook: the explicit path, as here
        out = model.run_with_hooks(batch.tokens, fwd_hooks=[(name, keep)], return_type="loss",
                                   values=batch.values)
    out.backward()
    torch.testing.assert_close(cache[name + "_grad"], seen["act"].grad, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="values: give the matrices' values"):
        model(batch.tokens, return_type="loss")
    with pytest.raises(ValueError, match="values: expected shape"):
        model(batch.tokens, return_type="loss", values=batch.values[:, :3])


def test_to_tokens_and_to_string_for_matrices():
    model = tm.load_pretrained("tiny", step="post")
    batch = model.task_cfg.build().sample(3, generator=torch.Generator().manual_seed(0))
    shape = (3, batch.n_rows, batch.n_cols)
    tokens = model.to_tokens(batch.values.reshape(shape), batch.observed.reshape(shape))
    assert torch.equal(tokens, batch.tokens)
    texts = model.to_string(tokens)
    assert len(texts) == 3 and all(t.count("?") == int(m.sum()) for t, m in zip(texts, batch.masked))
    assert all(len(t.splitlines()) == batch.n_rows for t in texts)
    with pytest.raises(ValueError, match="n_ctx"):
        model.to_tokens(torch.zeros(5, 5))


def test_use_attn_result_caches_each_heads_output():
    model = tm.load_pretrained("tiny", step="post")
    batch = model.task_cfg.build().sample(4, generator=torch.Generator().manual_seed(0))
    plain, base = model.run_with_cache(batch.tokens)
    with pytest.raises(KeyError, match="set_use_attn_result"):
        base["result", 0]
    model.set_use_attn_result(True)
    try:
        preds, cache = model.run_with_cache(batch.tokens)
    finally:
        model.set_use_attn_result(False)
    torch.testing.assert_close(preds, plain, rtol=1e-4, atol=1e-5)
    for layer in range(model.cfg.n_layers):
        result = cache["result", layer]
        assert result.shape == (4, 16, model.cfg.n_heads, model.cfg.d_model)
        torch.testing.assert_close(result.sum(-2) + model.b_O[layer], cache["attn_out", layer],
                                   rtol=1e-4, atol=1e-5)
        z = cache["z", layer]
        for head in range(model.cfg.n_heads):
            torch.testing.assert_close(result[:, :, head], z[:, :, head] @ model.W_O[layer, head],
                                       rtol=1e-4, atol=1e-5)
    stacked = base.stack_head_results(layer=model.cfg.n_layers)  # TransformerLens's, from hook_z
    torch.testing.assert_close(stacked[model.cfg.n_heads + 1],
                               cache["result", 1][:, :, 1], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="use_attn_result"):
        model.set_use_attn_result("yes")


def test_loading_a_checkpoint_draws_no_random_weights_and_imports_no_compiler():
    code = ("import sys, torch, tfmatcomp as tm\n"
            "state = torch.random.get_rng_state()\n"
            "m = tm.load_pretrained('tiny', step='post')\n"
            "assert torch.equal(state, torch.random.get_rng_state())\n"
            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # no compiler beyond what TransformerLens's hook points import themselves (3.x imports
    # torch._dynamo and sympy; 4.x neither)
    floor = subprocess.run([sys.executable, "-c", "import sys, transformer_lens.hook_points\n"
                            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)"],
                           capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == floor.stdout.split()
    if TL_MAJOR >= 4:
        assert out.stdout.split() == ["False", "False"]
    decoder = tm.HookedDecoder.uninitialized(tm.get_preset("gpt-tiny").model, device="meta")
    assert type(decoder) is tm.HookedDecoder and decoder.cfg.device == torch.device("meta")


def test_first_touch_benchmark_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_touch.py"), "--runs",
                          "1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tfmatcomp / floor" in out.stdout


# TransformerLens helper -> (our ActivationPatch hook, whether the table has a head axis)
PATCH_HELPERS = {
    "get_act_patch_resid_pre": ("hook_resid_pre", False),
    "get_act_patch_attn_out": ("hook_attn_out", False),
    "get_act_patch_mlp_out": ("hook_mlp_out", False),
    "get_act_patch_attn_head_out_by_pos": ("attn.hook_z", True),
}


def _check_patching_helpers(model, tokens, corrupted, metric):
    """Each TransformerLens patching helper, at a few (layer, position[, head]) cells, equals our
    ActivationPatch of the same hook at the same cell."""
    from transformer_lens import patching

    from tfmatcomp.interventions import ActivationPatch

    _, clean_cache = model.run_with_cache(tokens)
    for name, (hook, by_head) in PATCH_HELPERS.items():
        table = getattr(patching, name)(model, corrupted, clean_cache, metric)
        cells = [(0, 1, 0), (model.cfg.n_layers - 1, tokens.shape[1] - 1, model.cfg.n_heads - 1)]
        for layer, pos, head in cells:
            patch = ActivationPatch(clean_cache, hooks=[hook], layers=[layer], positions=[pos],
                                    heads=[head] if by_head else None)
            with torch.no_grad(), patch.applied(model):
                ours = metric(model(corrupted))
            theirs = table[layer, pos, head] if by_head else table[layer, pos]
            torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-6, msg=name)
    for name in ("get_act_patch_attn_head_out_all_pos", "get_act_patch_attn_head_pattern_by_pos",
                 "get_act_patch_attn_head_q_all_pos", "get_act_patch_attn_head_k_all_pos",
                 "get_act_patch_attn_head_v_all_pos"):
        assert torch.isfinite(getattr(patching, name)(model, corrupted, clean_cache, metric)).all()


def test_transformer_lens_patching_helpers_agree_with_our_patch_on_both_models():
    encoder = tm.load_pretrained("tiny", step="post")
    batch = encoder.task_cfg.build().sample(4, generator=torch.Generator().manual_seed(0))
    _check_patching_helpers(encoder, batch.tokens, batch.negated().tokens,
                            lambda predictions: predictions[batch.masked].mean())
    decoder = tm.HookedDecoder(tm.DecoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32,
                                                n_ctx=12, d_vocab=50), seed=0).eval()
    g = torch.Generator().manual_seed(1)
    clean, corrupted = torch.randint(50, (3, 12), generator=g), torch.randint(50, (3, 12), generator=g)
    _check_patching_helpers(decoder, clean, corrupted,
                            lambda logits: logits[:, -1].log_softmax(-1)[:, 7].mean())


def test_run_with_cache_incl_bwd_caches_the_gradients_of_the_decoders_next_token_loss():
    decoder = tm.HookedDecoder(tm.DecoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32,
                                                n_ctx=12, d_vocab=50), seed=0)
    tokens = torch.randint(50, (3, 12), generator=torch.Generator().manual_seed(2))
    loss, cache = decoder.run_with_cache(tokens, return_type="loss", incl_bwd=True)
    torch.testing.assert_close(loss, decoder(tokens, return_type="loss"))
    name, seen = "blocks.1.hook_resid_pre", {}

    def keep(act, hook):
        act.retain_grad()
        seen["act"] = act

    decoder.zero_grad()
    with decoder.unfused():
        decoder.run_with_hooks(tokens, fwd_hooks=[(name, keep)], return_type="loss").backward()
    torch.testing.assert_close(cache[name + "_grad"], seen["act"].grad, rtol=1e-4, atol=1e-7)


def test_one_loss_function_switches_between_tensors_and_floats():
    model = tm.load_pretrained("tiny", step="post")
    batch = model.task_cfg.build().sample(8, generator=torch.Generator().manual_seed(0))
    predictions = model(batch.tokens)
    tensors = tm.losses(predictions, batch)
    floats = tm.losses(predictions, batch, as_floats=True)
    assert set(tensors) == set(floats) == {"L", "L_obs", "L_mask", "mean_abs_pred_mask"}
    assert all(isinstance(v, torch.Tensor) and v.requires_grad for v in tensors.values())
    assert all(type(v) is float for v in floats.values())
    assert floats["L_mask"] == tensors["L_mask"].item()
    assert not hasattr(tm, "loss_values")
