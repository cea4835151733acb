"""TransformerLens's residual helpers on HookedDecoder's cache, each checked against a recomputation
from the cached hooks by hand: decompose_resid, accumulated_resid (with and without apply_ln),
apply_ln_to_stack, get_full_resid_decomposition, logit_attrs, the logit lens; and the model surface
they read (cfg flags, W_U / b_U, ln_final, accumulated_bias, tokens_to_residual_directions).

The model is seeded, in float64 and has every weight randomized (LayerNorm gains and biases and
``b_U`` included), so that a helper that skipped a bias, a gain or the centering would fail.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from transformer_lens import ActivationCache

import tfmatcomp as tm

TL_MAJOR = int(importlib.metadata.version("transformer-lens").split(".")[0])

CFG = tm.DecoderConfig(n_layers=3, n_heads=2, d_model=16, d_mlp=24, n_ctx=7, d_vocab=19)
L, H, B, P = CFG.n_layers, CFG.n_heads, 3, 7


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


def _layer_norm(x: torch.Tensor, ln) -> torch.Tensor:
    """LayerNorm by hand (biased variance, as GPT-2), with ``ln``'s eps, gain and bias."""
    centered = x - x.mean(-1, keepdim=True)
    return centered / (centered.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt() * ln.w + ln.b


@pytest.fixture(scope="module")
def model() -> tm.HookedDecoder:
    model = tm.HookedDecoder(CFG, seed=0).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5
            p.copy_(noise + 1 if name.endswith(".w") else noise)
    return model.eval()


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, CFG.d_vocab, (B, P), generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def run(model, tokens):
    return model.run_with_cache(tokens)


@pytest.fixture()
def cache(run) -> ActivationCache:
    return run[1]


@pytest.fixture(scope="module")
def logits(run) -> torch.Tensor:
    return run[0]


# ------------------------------------------------------------------ the model surface
def test_unembedding_is_w_u_and_b_u(model, tokens, cache, logits):
    assert model.W_U.shape == (CFG.d_model, CFG.d_vocab) and model.b_U.shape == (CFG.d_vocab,)
    assert model.W_U is model.unembed.W_U and model.b_U is model.unembed.b_U  # the parameters
    names = dict(model.named_parameters())
    assert names["unembed.W_U"] is model.W_U and names["unembed.b_U"] is model.b_U
    final = _layer_norm(cache[f"blocks.{L - 1}.hook_resid_post"], model.ln_final)
    _close(logits, final @ model.W_U + model.b_U)


def test_fresh_unembedding_is_the_transposed_embedding():
    model = tm.HookedDecoder(CFG, seed=3)
    assert torch.equal(model.W_U, model.W_E.T) and not model.b_U.any()


def test_config_carries_transformer_lens_flags(model):
    cfg = model.cfg
    assert (cfg.normalization_type, cfg.attn_only, cfg.final_rms) == ("LN", False, False)
    assert cfg.positional_embedding_type == "standard"
    for flag in ("normalization_type", "attn_only", "final_rms", "positional_embedding_type"):
        assert flag not in cfg.to_dict()  # constants of the architecture, not saved config
    assert all(block.hook_out_is_single_residual_stream for block in model.blocks)


def test_cache_is_transformer_lens_own(cache):
    assert type(cache) is ActivationCache and cache.has_embed and cache.has_pos_embed


def test_accumulated_bias(model):
    b_O = [block.attn.b_O for block in model.blocks]
    b_out = [block.mlp.b_out for block in model.blocks]
    _close(model.accumulated_bias(0), torch.zeros(CFG.d_model, dtype=torch.float64))
    _close(model.accumulated_bias(2), b_O[0] + b_out[0] + b_O[1] + b_out[1])
    _close(model.accumulated_bias(1, mlp_input=True), b_O[0] + b_out[0] + b_O[1])
    _close(model.accumulated_bias(L, include_mlp_biases=False), sum(b_O))
    for bad in (-1, L + 1, 1.0, True):
        with pytest.raises(ValueError, match=r"layer: expected an int in \[0, 3\]"):
            model.accumulated_bias(bad)
    with pytest.raises(ValueError, match="mlp_input"):
        model.accumulated_bias(L, mlp_input=True)


def test_tokens_to_residual_directions(model):
    _close(model.tokens_to_residual_directions(4), model.W_U[:, 4])
    _close(model.tokens_to_residual_directions(torch.tensor([5])), model.W_U[:, 5])
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    directions = model.tokens_to_residual_directions(ids)
    assert directions.shape == (2, 3, CFG.d_model)
    _close(directions[1, 2], model.W_U[:, 6])
    for bad in (CFG.d_vocab, -1, torch.tensor([0, CFG.d_vocab]), torch.tensor([0.5, 1.0])):
        with pytest.raises(ValueError, match="tokens"):
            model.tokens_to_residual_directions(bad)


# ------------------------------------------------------------------ decompose_resid
def test_decompose_resid_sums_to_every_stream(cache):
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed"] + [f"{l}_{s}_out" for l in range(L) for s in ("attn", "mlp")]
    _close(parts[0], cache["hook_embed"])
    _close(parts[1], cache["hook_pos_embed"])
    _close(parts[2 + 2 * 1 + 1], cache["blocks.1.hook_mlp_out"])
    _close(parts.sum(0), cache[f"blocks.{L - 1}.hook_resid_post"])
    for l in range(L):
        _close(cache.decompose_resid(l).sum(0), cache[f"blocks.{l}.hook_resid_pre"])
        _close(cache.decompose_resid(l, mlp_input=True).sum(0), cache[f"blocks.{l}.hook_resid_mid"])
    attn = cache.decompose_resid(mode="attn", incl_embeds=False)
    _close(attn, torch.stack([cache[f"blocks.{l}.hook_attn_out"] for l in range(L)]))
    mlp = cache.decompose_resid(mode="mlp", incl_embeds=False)
    _close(mlp, torch.stack([cache[f"blocks.{l}.hook_mlp_out"] for l in range(L)]))
    _close(cache.decompose_resid(pos_slice=2), parts[:, :, 2])


def test_decompose_resid_apply_ln_sums_to_each_layer_norm(model, cache):
    # With apply_ln, the components are centered and divided by the cached scale of the LayerNorm
    # their sum goes into, so they sum to that LayerNorm's hook_normalized (before w and b).
    _close(cache.decompose_resid(apply_ln=True).sum(0), cache["ln_final.hook_normalized"])
    for l in range(L):
        _close(cache.decompose_resid(l, apply_ln=True).sum(0), cache[f"blocks.{l}.ln1.hook_normalized"])
        _close(cache.decompose_resid(l, mlp_input=True, apply_ln=True).sum(0),
               cache[f"blocks.{l}.ln2.hook_normalized"])
    ln = model.blocks[1].ln2
    parts = cache.apply_ln_to_stack(torch.stack([cache["blocks.1.hook_resid_pre"],
                                                 cache["blocks.1.hook_attn_out"]]), 1, mlp_input=True)
    _close(parts.sum(0) * ln.w + ln.b, _layer_norm(cache["blocks.1.hook_resid_mid"], ln))


@pytest.mark.skipif(TL_MAJOR < 4, reason="TransformerLens 3.x's stack_neuron_results has no mlp_input")
def test_head_and_neuron_stacks_with_remainder_and_apply_ln(model, cache):
    # The remainder completes the heads (neurons) to the stream; with apply_ln the stack sums to
    # the normalized input of the LayerNorm that reads that stream.
    for layer, normalized in ((L, "ln_final.hook_normalized"), (1, "blocks.1.ln1.hook_normalized")):
        heads = cache.stack_head_results(layer, incl_remainder=True)
        _close(heads.sum(0), cache[f"blocks.{layer - 1}.hook_resid_post"])
        _close(cache.stack_head_results(layer, incl_remainder=True, apply_ln=True).sum(0),
               cache[normalized])
        neurons = cache.stack_neuron_results(layer, incl_remainder=True, apply_ln=True)
        _close(neurons.sum(0), cache[normalized])
    ln = model.blocks[2].ln2
    mlp_in = cache.stack_neuron_results(2, incl_remainder=True, apply_ln=True, mlp_input=True)
    _close(mlp_in.sum(0) * ln.w + ln.b, _layer_norm(cache["blocks.2.hook_resid_mid"], ln))


# ------------------------------------------------------------------ accumulated_resid
def test_accumulated_resid_is_every_block_input(cache):
    stack, labels = cache.accumulated_resid(return_labels=True)
    assert labels == [f"{l}_pre" for l in range(L)] + ["final_post"]
    expected = [cache[f"blocks.{l}.hook_resid_pre"] for l in range(L)]
    _close(stack, torch.stack(expected + [cache[f"blocks.{L - 1}.hook_resid_post"]]))
    with_mid, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels[:3] == ["0_pre", "0_mid", "1_pre"]
    _close(with_mid[1], cache["blocks.0.hook_resid_mid"])
    _close(cache.accumulated_resid(1, mlp_input=True)[-1], cache["blocks.1.hook_resid_mid"])


def test_accumulated_resid_apply_ln_is_the_logit_lens(model, cache, logits):
    # At the last layer, apply_ln runs ln_final on every stream with its own statistics: the
    # logit lens. Its last entry through W_U + b_U is the model's logits.
    stack = cache.accumulated_resid(apply_ln=True)
    streams = cache.accumulated_resid()
    assert stack.shape == (L + 1, B, P, CFG.d_model)
    for l in range(L + 1):
        _close(stack[l], _layer_norm(streams[l], model.ln_final))
    _close(stack[-1] @ model.W_U + model.b_U, logits)
    # Before layer l, apply_ln divides by that layer's cached ln1 scale (no recomputation).
    before_1 = cache.accumulated_resid(1, apply_ln=True)
    _close(before_1[-1], cache["blocks.1.ln1.hook_normalized"])
    centered = streams[0] - streams[0].mean(-1, keepdim=True)
    _close(before_1[0], centered / cache["blocks.1.ln1.hook_scale"])


@pytest.mark.skipif(TL_MAJOR < 4, reason="TransformerLens 3.x has no logit_lens tool")
def test_logit_lens_at_each_layer(model, tokens, cache, logits):
    from transformer_lens.tools.analysis.logit_lens import logit_lens

    by_hand = torch.stack([_layer_norm(cache[f"blocks.{l}.hook_resid_pre"], model.ln_final)
                           for l in range(L)] + [_layer_norm(cache[f"blocks.{L - 1}.hook_resid_post"],
                                                             model.ln_final)]) @ model.W_U + model.b_U
    _close(by_hand[-1], logits)
    result = cache.logit_lens(positions=None)  # TransformerLens's own, full vocabulary
    assert result.labels == [f"{l}_pre" for l in range(L)] + ["final_post"]
    _close(result.values, by_hand)
    last = logit_lens(model, tokens, targets=tokens[:, -1])  # runs the model, checks the read-out
    _close(last.values[..., 0], by_hand[:, torch.arange(B), -1, tokens[:, -1]])
    ranks = (by_hand[:, :, -1] > by_hand[:, torch.arange(B), -1, tokens[:, -1]][..., None]).sum(-1)
    assert torch.equal(last.rank_trajectory(), ranks)


# ------------------------------------------------------- get_full_resid_decomposition
def test_full_resid_decomposition_sums_to_the_stream(model, cache):
    stack, labels = cache.get_full_resid_decomposition(return_labels=True)
    m = CFG.d_mlp
    assert len(labels) == stack.shape[0] == L * H + L * m + 3
    assert labels[:H + 1] == ["L0H0", "L0H1", "L1H0"] and labels[L * H] == "L0N0"
    assert labels[-3:] == ["embed", "pos_embed", "bias"]
    _close(stack.sum(0), cache[f"blocks.{L - 1}.hook_resid_post"])
    z, W_O = cache["blocks.2.attn.hook_z"], model.blocks[2].attn.W_O
    _close(stack[2 * H + 1], z[:, :, 1] @ W_O[1])
    post, W_out = cache["blocks.1.mlp.hook_post"], model.blocks[1].mlp.W_out
    _close(stack[L * H + m + 5], post[..., 5, None] * W_out[5])
    _close(stack[-1], model.accumulated_bias(L).expand(B, P, -1))
    for l in range(L):
        _close(cache.get_full_resid_decomposition(l).sum(0), cache[f"blocks.{l}.hook_resid_pre"])
        _close(cache.get_full_resid_decomposition(l, mlp_input=True).sum(0),
               cache[f"blocks.{l}.hook_resid_mid"])
    per_layer, labels = cache.get_full_resid_decomposition(expand_neurons=False, return_labels=True)
    assert labels[L * H:L * H + L] == [f"{l}_mlp_out" for l in range(L)]
    _close(per_layer.sum(0), cache[f"blocks.{L - 1}.hook_resid_post"])
    _close(cache.get_full_resid_decomposition(apply_ln=True).sum(0), cache["ln_final.hook_normalized"])
    direction = torch.randn(CFG.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    _close(cache.get_full_resid_decomposition(project_output_onto=direction), stack @ direction)


# ------------------------------------------------------------------ logit_attrs
@pytest.mark.skipif(TL_MAJOR < 4, reason="TransformerLens 3.x's logit_attrs does not broadcast "
                    "one token per batch row over the positions")
def test_logit_attrs_sum_to_the_logit_direction(model, cache):
    # Each component, centered and divided by ln_final's cached scale, dotted with W_U[:, t]
    # (TransformerLens's meaning: ln_final's w and b are not folded in).
    parts = cache.decompose_resid()
    target, other = torch.tensor([3, 7, 11]), torch.tensor([4, 4, 0])
    attrs = cache.logit_attrs(parts, tokens=target, incorrect_tokens=other)
    assert attrs.shape == (parts.shape[0], B, P)
    direction = model.W_U[:, target] - model.W_U[:, other]  # [d_model, batch]
    normalized = cache["ln_final.hook_normalized"]
    _close(attrs.sum(0), torch.einsum("bpd,db->bp", normalized, direction))
    centered = parts[2] - parts[2].mean(-1, keepdim=True)
    _close(attrs[2], torch.einsum("bpd,db->bp", centered / cache["ln_final.hook_scale"], direction))
    one = cache.logit_attrs(parts[:, :, -1], tokens=5, pos_slice=-1)
    _close(one.sum(0), normalized[:, -1] @ model.W_U[:, 5])


def test_logit_attrs_sum_to_the_logit_difference_with_a_plain_final_ln(tokens):
    # With ln_final's gain 1 and bias 0 and no b_U (a fresh model: what folding would give),
    # the attributions of the decomposed stream add up to the model's logit difference.
    model = tm.HookedDecoder(CFG, seed=4).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(("ln_final", "unembed.b_U")):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(6),
                                   dtype=p.dtype) * 0.3)
    logits, cache = model.run_with_cache(tokens)
    target, other = tokens[:, -1], (tokens[:, -1] + 1) % CFG.d_vocab
    for stack in (cache.decompose_resid(pos_slice=-1), cache.get_full_resid_decomposition(pos_slice=-1)):
        attrs = cache.logit_attrs(stack, tokens=target, incorrect_tokens=other, pos_slice=-1)
        rows = torch.arange(B)
        _close(attrs.sum(0), logits[rows, -1, target] - logits[rows, -1, other])


def test_encoder_cache_still_refuses(tokens):
    from tfmatcomp.models.cache import PostLNError

    encoder = tm.HookedEncoder(tm.get_preset("tiny").model)
    _, cache = encoder.run_with_cache(torch.ones(2, 16, dtype=torch.long))
    with pytest.raises(PostLNError, match="post-LN encoder"):
        cache.decompose_resid()
