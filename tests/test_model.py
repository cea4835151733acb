import pytest
import torch
from transformer_lens import ActivationCache

import tfmatcomp as tm
from tfmatcomp import EncoderConfig, HookedEncoder, UnknownHookError

B, T = 3, 16


def expected_hook_shapes(cfg: EncoderConfig, b=B, t=T):
    d, h, e, m = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp
    shapes = {
        "embed.hook_embed": (b, t, d), "embed.hook_pos_embed": (b, t, d),
        "embed.ln.hook_scale": (b, t, 1), "embed.ln.hook_normalized": (b, t, d),
        "hook_full_embed": (b, t, d), "hook_readout": (b, t),
    }
    for l in range(cfg.n_layers):
        p = f"blocks.{l}."
        for name in ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z"):
            shapes[p + name] = (b, t, h, e)
        shapes[p + "attn.hook_attn_scores"] = shapes[p + "attn.hook_pattern"] = (b, h, t, t)
        for name in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out",
                     "hook_resid_post", "hook_normalized_resid_post", "ln1.hook_normalized",
                     "hook_normalized_resid_mid",
                     "ln2.hook_normalized"):
            shapes[p + name] = (b, t, d)
        shapes[p + "ln1.hook_scale"] = shapes[p + "ln2.hook_scale"] = (b, t, 1)
        shapes[p + "mlp.hook_pre"] = shapes[p + "mlp.hook_post"] = (b, t, m)
    return shapes


def test_every_documented_hook_has_its_shape(tiny_model, batch4):
    _, cache = tiny_model.run_with_cache(batch4.tokens[:B])
    assert isinstance(cache, ActivationCache)
    shapes = expected_hook_shapes(tiny_model.cfg)
    for name, shape in shapes.items():
        assert tuple(cache[name].shape) == shape, name
    # only the token-type hook (no token types in the paper config) and the per-head results
    # (TransformerLens's: computed after set_use_attn_result(True)) never fire
    results = {f"blocks.{l}.attn.hook_result" for l in range(tiny_model.cfg.n_layers)}
    assert set(tiny_model.hook_dict) - set(cache.keys()) == {"embed.hook_token_type_embed"} | results


def test_stacked_weight_views(tiny_model):
    c = tiny_model.cfg
    assert tiny_model.W_Q.shape == (c.n_layers, c.n_heads, c.d_model, c.d_head)
    assert tiny_model.W_O.shape == (c.n_layers, c.n_heads, c.d_head, c.d_model)
    assert tiny_model.b_V.shape == (c.n_layers, c.n_heads, c.d_head)
    assert tiny_model.W_E.shape == (c.d_vocab, c.d_model) and tiny_model.W_pos.shape == (c.n_ctx, c.d_model)
    assert torch.equal(tiny_model.W_K[1], tiny_model.blocks[1].attn.W_K)


def test_uniform_pattern_edit_matches_manual_recomputation(tiny_model, batch4):
    tokens = batch4.tokens[:B]
    layer, head = 1, 2

    def uniform(pattern, hook):
        pattern = pattern.clone()
        pattern[:, head] = 1.0 / pattern.shape[-1]
        return pattern

    edited = tiny_model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", uniform)])
    clean, cache = tiny_model.run_with_cache(tokens)
    assert not torch.allclose(edited, clean)
    # recompute by hand from the cached input of block 1
    attn = tiny_model.blocks[layer].attn
    x = cache[f"blocks.{layer}.hook_resid_pre"]
    v = cache[f"blocks.{layer}.attn.hook_v"]
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"].clone()
    pattern[:, head] = 1.0 / T
    z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
    attn_out = torch.einsum("bqhe,hed->bqd", z, attn.W_O) + attn.b_O
    block = tiny_model.blocks[layer]
    h = block.ln1(x + attn_out)
    h = block.ln2(h + block.mlp(h))
    manual = tiny_model.readout(h)
    assert torch.allclose(edited, manual, atol=1e-5)
    assert tiny_model.active_hook_count() == 0


def test_unknown_hook_name_is_a_clear_error(tiny_model, batch4):
    with pytest.raises(UnknownHookError, match="hook_patern"):
        tiny_model.run_with_hooks(batch4.tokens, fwd_hooks=[("blocks.0.attn.hook_patern", lambda x, hook: x)])
    with pytest.raises(UnknownHookError):
        tiny_model.run_with_cache(batch4.tokens, names_filter=None) if False else tiny_model.add_hook("nope", lambda x, hook: x)
    assert tiny_model.active_hook_count() == 0


@pytest.mark.parametrize("tokens,match", [
    (torch.full((1, 4), 2002), "tokens"),
    (torch.full((1, 4), -1), "tokens"),
    (torch.zeros(1, 17, dtype=torch.long), "n_ctx"),
    (torch.zeros(4, dtype=torch.long), "tokens"),
    (torch.zeros(1, 4), "tokens"),
])
def test_bad_tokens_raise(tiny_model, tokens, match):
    with pytest.raises(ValueError, match=match):
        tiny_model(tokens)


def test_mask_embedding_is_zero_and_untrained_by_default(tiny_cfg, batch4):
    model = HookedEncoder(tiny_cfg, seed=1)
    assert torch.equal(model.W_E[0], torch.zeros(tiny_cfg.d_model))
    model(batch4.tokens).pow(2).mean().backward()
    assert torch.equal(model.embed.W_E.grad[0], torch.zeros(tiny_cfg.d_model))
    learned = HookedEncoder(EncoderConfig(**{**tiny_cfg.to_dict(), "learned_mask_embedding": True}), seed=1)
    assert learned.W_E[0].abs().sum() > 0
    learned(batch4.tokens).pow(2).mean().backward()
    assert learned.embed.W_E.grad[0].abs().sum() > 0


def test_seeded_initialisation(tiny_cfg):
    a, b, c = HookedEncoder(tiny_cfg, seed=0), HookedEncoder(tiny_cfg, seed=0), HookedEncoder(tiny_cfg, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.W_Q, c.W_Q)


def test_presets_by_name():
    assert tm.EncoderConfig.from_preset("paper-4l8h").d_head == 96
    assert tm.get_preset("paper-12l12h").model.n_layers == 12
    with pytest.raises(ValueError, match="preset"):
        tm.get_preset("huge")
    model = HookedEncoder(tm.EncoderConfig.from_preset("paper-4l8h"))
    n = sum(p.numel() for p in model.parameters())
    d, m, L = 768, 3072, 4
    per_block = 4 * (d * d + d) + 2 * (2 * d) + (d * m + m) + (m * d + d)
    assert n == 2002 * d + 49 * d + 2 * d + L * per_block + d + 1
    # The papers quote ~30.3M: HuggingFace's default 512 positions add 463 * 768 = 0.36M.
    assert abs(n + 463 * d - 30.3e6) < 0.05e6


def test_bad_config_values():
    with pytest.raises(ValueError, match="d_model"):
        EncoderConfig(d_model=100, n_heads=8)
    with pytest.raises(ValueError, match="n_layers"):
        EncoderConfig(n_layers=0)


def test_fused_path_equals_hooked_path(tiny_model, batch4):
    fast = tiny_model(batch4.tokens)
    slow, _ = tiny_model.run_with_cache(batch4.tokens)  # every hook active: unfused path
    assert torch.allclose(fast, slow, atol=1e-5)
    assert tiny_model.active_hook_count() == 0


def test_unfused_context_makes_hooked_and_plain_runs_bit_identical(tiny_model, batch4):
    with tiny_model.unfused():
        plain = tiny_model(batch4.tokens)
        hooked = tiny_model.run_with_hooks(batch4.tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: x)])
    assert torch.equal(plain, hooked)
    assert all(m.fused for m in tiny_model.modules() if hasattr(m, "fused"))
