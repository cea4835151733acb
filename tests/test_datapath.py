"""The one data path (datapath.py), hook names (hook_names.py) and argument checks (validation.py)."""

from __future__ import annotations

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp import datapath, validation
from tfmatcomp.models import hook_names
from tfmatcomp.interventions import ActivationAblation


def test_sample_batch_seed_and_generator_agree(task4):
    a = datapath.sample_batch(task4, 6, seed=3)
    b = datapath.sample_batch(task4, 6, generator=torch.Generator().manual_seed(3))
    c = task4.sample(6, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.tokens, c.tokens)
    assert torch.equal(datapath.sample_batch(task4, 6).tokens, datapath.sample_batch(task4, 6, seed=0).tokens)
    obs = torch.ones(16, dtype=torch.bool)
    assert datapath.sample_batch(task4, 2, seed=0, observed=obs).observed.all()
    with pytest.raises(ValueError, match="seed, generator"):
        datapath.sample_batch(task4, 2, seed=0, generator=torch.Generator())
    with pytest.raises(ValueError, match="n_samples: must be a positive integer"):
        datapath.sample_batch(task4, 0, seed=0)


def test_run_chunked_matches_one_forward(tiny_model, batch4):
    names = [hook_names.resid_name(l, 2) for l in range(3)]
    preds, cache = datapath.run_chunked(tiny_model, batch4, batch_size=3, names=names)
    _, full = tiny_model.run_with_cache(batch4.tokens)
    assert torch.allclose(preds, tiny_model(batch4.tokens), atol=1e-5)
    for n in names:
        assert torch.allclose(cache[n], full[n], atol=1e-5)
    # tokens in, cache only
    none, cache2 = datapath.run_chunked(tiny_model, batch4.tokens, batch_size=8, names=names[:1],
                                        return_predictions=False)
    assert none is None and torch.allclose(cache2[names[0]], full[names[0]], atol=1e-5)
    assert tiny_model.active_hook_count() == 0


def test_run_chunked_with_hooks_and_interventions(tiny_model, batch4):
    iv = ActivationAblation("attn.hook_z", layers=[0])
    want = iv.run(tiny_model, batch4.tokens)
    got, _ = datapath.run_chunked(tiny_model, batch4, batch_size=3, intervention=iv)
    assert torch.allclose(got, want, atol=1e-5)
    got2, _ = datapath.run_chunked(tiny_model, batch4, intervention=lambda chunk: iv)
    assert torch.allclose(got2, want, atol=1e-5)
    hooks = iv.fwd_hooks(tiny_model)
    got3, _ = datapath.run_chunked(tiny_model, batch4, fwd_hooks=hooks)
    assert torch.allclose(got3, want, atol=1e-5)
    assert tiny_model.active_hook_count() == 0


def test_run_chunked_takes_exactly_the_keywords_of_iter_chunks(tiny_model, batch4):
    preds, _ = datapath.run_chunked(tiny_model, batch4, batch_size=3, return_predictions=False)
    assert preds is None
    with pytest.raises(TypeError, match="batch_sise"):  # refused when called, before any chunk
        datapath.run_chunked(tiny_model, batch4, batch_sise=3)
    with pytest.raises(ValueError, match="batch_size"):
        datapath.run_chunked(tiny_model, batch4, batch_size=0)


def test_iter_chunks_streams(tiny_model, batch4):
    chunks = list(datapath.iter_chunks(tiny_model, batch4, batch_size=3, names=["hook_full_embed"]))
    assert [c.start for c in chunks] == [0, 3, 6]
    assert [c.tokens.shape[0] for c in chunks] == [3, 3, 2]
    assert all(isinstance(c.inputs, tm.MatrixBatch) for c in chunks)
    with pytest.raises(ValueError, match="batch_size"):
        next(datapath.iter_chunks(tiny_model, batch4, batch_size=0))


def test_load_model_and_checkpoints(trained_tiny):
    out = trained_tiny.out_dir
    models = datapath.load_checkpoints(out)
    assert list(models) == [100, 300]
    m, cfg, label = datapath.load_model_info(tm.list_checkpoints(out)[100])
    assert label == "step 100" and cfg is not None and isinstance(m, tm.HookedEncoder)
    assert isinstance(datapath.load_model(tm.list_checkpoints(out)[300]), tm.HookedEncoder)
    with pytest.raises(TypeError, match="models"):
        datapath.load_model(3)
    # a name that is no directory (a bundled run's name, a typo) says so, naming run_dir
    with pytest.raises(ValueError, match=r"checkpoints: 'tiny' does not exist .*run_dir"):
        datapath.load_checkpoints("tiny")


def test_losses_as_floats_are_floats(tiny_model, batch4):
    vals = tm.losses(tiny_model(batch4.tokens), batch4, as_floats=True)
    assert set(vals) == {"L", "L_obs", "L_mask", "mean_abs_pred_mask"}
    assert all(isinstance(v, float) for v in vals.values())


def test_resid_name_aliases_are_the_same_tensor(tiny_model, batch4):
    _, cache = tiny_model.run_with_cache(batch4.tokens)
    n = tiny_model.cfg.n_layers
    for l in range(n + 1):
        a = hook_names.resid_name(l, n)
        b = hook_names.resid_name(l, n, at="layer_output")
        assert torch.equal(cache[a], cache[b])
    assert [hook_names.resid_name(l, n) for l in range(n + 1)] == hook_names.residual_stream_names(tiny_model)
    with pytest.raises(ValueError, match="layer"):
        hook_names.resid_name(3, 2)
    with pytest.raises(ValueError, match="at"):
        hook_names.resid_name(0, 2, at="middle")


def test_hook_name_helpers(tiny_model):
    assert hook_names.pattern_hook_names(tiny_model) == ["blocks.0.attn.hook_pattern",
                                                         "blocks.1.attn.hook_pattern"]
    with pytest.raises(ValueError, match="0-based"):
        hook_names.pattern_hook_names(tiny_model, [2])
    assert hook_names.resolve_hook_names(tiny_model, ["hook_full_embed", "hook_resid_pre"], [1]) == \
        ["hook_full_embed", "blocks.1.hook_resid_pre"]
    with pytest.raises(ValueError, match="not a hook"):
        hook_names.resolve_hook_names(tiny_model, "hook_nothing")
    with pytest.raises(ValueError, match="either a full hook name"):
        hook_names.block_hook_name("blocks.0.hook_resid_pre", 0)


@pytest.mark.parametrize("check, args, match", [
    (validation.check_positive_int, ("n", 0), r"n: must be a positive integer, got 0"),
    (validation.check_positive_int, ("n", True), r"n: must be a positive integer"),
    (validation.check_positive_int, ("n", 2.0), r"n: must be a positive integer"),
    (validation.check_int_in_range, ("k", 5, 1, 4), r"k: must be an integer in \[1, 4\]"),
    (validation.check_non_negative, ("ridge", -1.0), r"ridge: must be >= 0"),
    (validation.check_non_negative, ("ridge", float("nan")), r"ridge: must be >= 0"),
    (validation.check_in_range, ("f", 1.0, 0.0, 1.0, ), None),
    (validation.check_in_range, ("p", 1.5, 0.0, 1.0), r"p: must lie in \[0.0, 1.0\]"),
    (validation.check_choice, ("side", "up", ("left", "right")), r"side: must be one of"),
])
def test_validation_messages(check, args, match):
    if match is None:
        assert check(*args) == args[1]
        return
    with pytest.raises(ValueError, match=match):
        check(*args)


def test_wide_encoders_predict_in_bf16_on_bf16_cpus_and_cache_in_float32(monkeypatch):
    from tfmatcomp.datapath import inference_bf16, run_chunked

    cfg = tm.EncoderConfig(n_layers=1, n_heads=8, d_model=256, d_mlp=64, n_ctx=16)
    wide = tm.HookedEncoder(cfg, seed=0)
    batch = datapath.sample_batch("tiny", 16, seed=0)
    exact, _ = run_chunked(wide, batch, bf16=False)
    monkeypatch.setattr(datapath, "cpu_bf16_units", lambda: "AMX")
    assert inference_bf16(wide) and not inference_bf16(tm.HookedEncoder(tm.get_preset("tiny").model))
    preds, _ = run_chunked(wide, batch)
    assert preds.dtype == torch.float32 and not torch.equal(preds, exact)  # bf16 did run
    torch.testing.assert_close(preds, exact, rtol=3e-2, atol=3e-2)
    name = "blocks.0.hook_resid_post"
    with_cache, cache = run_chunked(wide, batch, names=[name])
    assert torch.equal(with_cache, exact) and cache[name].dtype == torch.float32
    monkeypatch.setattr(datapath, "cpu_bf16_units", lambda: None)
    assert torch.equal(run_chunked(wide, batch)[0], exact)
