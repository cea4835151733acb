"""Every hook holds the tensor its name promises: pinned against a recomputation from the weights.

A HuggingFace ``BertModel`` with *every* weight random (LayerNorm gains and biases included: the
default 1 and 0 would hide whether a hook sits before or after them) is converted with
``HookedEncoder.from_hf``; each activation in ``run_with_cache`` is compared, in float64, with the
same quantity computed here from the HuggingFace weights with plain torch ops (HF layouts, so the
re-layout of :mod:`tfmatcomp.models.conversion.hf_mapping` is checked too). The set of checked names must equal the
cache's keys, so a new hook cannot go unchecked. The LayerNorm hooks follow TransformerLens:
``hook_scale`` and ``hook_normalized`` come before the gain and bias.
"""

from __future__ import annotations

import math
from typing import Callable

import pytest
import torch
from transformers import BertConfig, BertModel

from tfmatcomp import HookedEncoder

TOL = dict(rtol=0.0, atol=1e-10)
D_MODEL, N_HEADS, N_LAYERS, D_MLP, N_CTX, VOCAB = 32, 4, 2, 64, 16, 50
BATCH, POS = 3, 10

Edit = Callable[[torch.Tensor], torch.Tensor]


def random_bert(seed: int = 0) -> tuple[BertModel, torch.nn.Linear]:
    """A float64 BERT (two token types) and read-out whose weights are all random float64 values
    (not representable in float32: a conversion that rounds through float32 fails the 1e-10 checks)."""
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=D_MODEL, num_hidden_layers=N_LAYERS,
                     num_attention_heads=N_HEADS, intermediate_size=D_MLP,
                     max_position_embeddings=N_CTX, type_vocab_size=2, hidden_act="gelu",
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     attn_implementation="eager")
    bert = BertModel(cfg, add_pooling_layer=False).eval().double()
    readout = torch.nn.Linear(D_MODEL, 1).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in (bert, readout):
            for name, p in module.named_parameters():
                if "LayerNorm.weight" in name:      # gains far from 1, some negative
                    p.copy_(1.0 + 0.7 * torch.randn(p.shape, generator=g, dtype=torch.float64))
                else:                               # biases far from 0, matrices of unit scale
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64)
                            / math.sqrt(p.shape[-1]))
    return bert, readout


def inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (BATCH, POS), generator=g)
    token_types = torch.randint(0, 2, (BATCH, POS), generator=g)
    mask = torch.ones(BATCH, POS, dtype=torch.long)
    mask[1, 7:] = 0                                 # padded keys: the additive mask is hooked too
    return tokens, token_types, mask


def layer_norm(acts: dict, prefix: str, x: torch.Tensor, ln: torch.nn.LayerNorm, edit) -> torch.Tensor:
    """Record a LayerNorm's pieces under TransformerLens's meaning; return its output."""
    centered = x - x.mean(-1, keepdim=True)
    scale = edit(f"{prefix}.hook_scale", torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + ln.eps))
    normalized = edit(f"{prefix}.hook_normalized", centered / scale)
    return normalized * ln.weight + ln.bias


def reference(bert: BertModel, readout: torch.nn.Linear, tokens, token_types, mask,
              edits: dict[str, Edit] | None = None) -> dict[str, torch.Tensor]:
    """Every activation of our hook set, from the HuggingFace weights; ``edits[name]`` replaces
    the value at ``name`` (as a forward hook would) before the computation goes on."""
    edits = edits or {}
    acts: dict[str, torch.Tensor] = {}

    def at(name: str, value: torch.Tensor) -> torch.Tensor:
        value = edits[name](value) if name in edits else value
        acts[name] = value
        return value

    emb = bert.embeddings
    x = (at("embed.hook_embed", emb.word_embeddings.weight[tokens])
         + at("embed.hook_pos_embed", emb.position_embeddings.weight[:POS].expand(BATCH, POS, D_MODEL))
         + at("embed.hook_token_type_embed", emb.token_type_embeddings.weight[token_types]))
    x = at("hook_full_embed", layer_norm(acts, "embed.ln", x, emb.LayerNorm, at))
    d_head = D_MODEL // N_HEADS
    additive = (1.0 - mask[:, None, None, :].double()) * torch.finfo(torch.float64).min
    for l, layer in enumerate(bert.encoder.layer):
        p = f"blocks.{l}."
        resid_pre = at(p + "hook_resid_pre", x)
        sa = layer.attention.self
        q, k, v = (at(p + f"attn.hook_{n}", (resid_pre @ lin.weight.T + lin.bias).view(BATCH, POS, N_HEADS, d_head))
                   for n, lin in (("q", sa.query), ("k", sa.key), ("v", sa.value)))
        scores = at(p + "attn.hook_attn_scores",
                    torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(d_head) + additive)
        pattern = at(p + "attn.hook_pattern", scores.softmax(-1))
        z = at(p + "attn.hook_z", torch.einsum("bhqk,bkhe->bqhe", pattern, v))
        o = layer.attention.output.dense
        attn_out = at(p + "hook_attn_out", z.reshape(BATCH, POS, D_MODEL) @ o.weight.T + o.bias)
        resid_mid = at(p + "hook_resid_mid", resid_pre + attn_out)
        mlp_in = at(p + "hook_normalized_resid_mid",
                    layer_norm(acts, p + "ln1", resid_mid, layer.attention.output.LayerNorm, at))
        pre = at(p + "mlp.hook_pre", mlp_in @ layer.intermediate.dense.weight.T + layer.intermediate.dense.bias)
        post = at(p + "mlp.hook_post", 0.5 * pre * (1.0 + torch.erf(pre / math.sqrt(2.0))))
        mlp_out = at(p + "hook_mlp_out", post @ layer.output.dense.weight.T + layer.output.dense.bias)
        resid_post = at(p + "hook_resid_post", mlp_in + mlp_out)
        x = at(p + "hook_normalized_resid_post",
               layer_norm(acts, p + "ln2", resid_post, layer.output.LayerNorm, at))
    at("hook_readout", (x @ readout.weight.T + readout.bias).squeeze(-1))
    return acts


@pytest.fixture(scope="module")
def setup():
    bert, readout = random_bert()
    model = HookedEncoder.from_hf(bert, readout)
    assert model.cfg.n_token_types == 2 and next(model.parameters()).dtype == torch.float64
    return bert, readout, model, inputs()


def test_the_reference_is_huggingfaces_forward(setup):
    """The recomputation below is anchored to HuggingFace's own forward pass."""
    bert, _, _, (tokens, tt, mask) = setup
    with torch.no_grad():
        out = bert(tokens, token_type_ids=tt, attention_mask=mask, output_hidden_states=True,
                   output_attentions=True)
        ref = reference(*setup[:2], tokens, tt, mask)
    torch.testing.assert_close(ref["hook_full_embed"], out.hidden_states[0], **TOL)
    for l in range(N_LAYERS):
        torch.testing.assert_close(ref[f"blocks.{l}.hook_normalized_resid_post"], out.hidden_states[l + 1], **TOL)
        torch.testing.assert_close(ref[f"blocks.{l}.attn.hook_pattern"], out.attentions[l], **TOL)


def test_every_hook_in_the_cache_means_what_its_name_says(setup):
    bert, readout, model, (tokens, tt, mask) = setup
    with torch.no_grad():
        preds, cache = model.run_with_cache(tokens, token_type_ids=tt, attention_mask=mask)
        ref = reference(bert, readout, tokens, tt, mask)
    assert set(ref) == set(cache.keys()), (
        f"unchecked hooks: {sorted(set(cache.keys()) - set(ref))}; "
        f"checked but not cached: {sorted(set(ref) - set(cache.keys()))}")
    # hook_result fires only after set_use_attn_result(True); test_habits checks its meaning
    results = {f"blocks.{l}.attn.hook_result" for l in range(model.cfg.n_layers)}
    assert set(cache.keys()) == set(model.hook_dict) - results
    for name, want in ref.items():
        torch.testing.assert_close(cache[name], want, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(preds, ref["hook_readout"], **TOL)
    with torch.no_grad():  # the fused path (F.layer_norm, SDPA: no hook active) is the same function
        torch.testing.assert_close(model(tokens, token_type_ids=tt, attention_mask=mask),
                                   ref["hook_readout"], **TOL)


def test_layer_norm_hooks_are_before_the_gain_and_bias(setup):
    """The property the names promise, stated directly: zero mean, unit variance (up to eps), and
    the post-affine output held by the block-level hook."""
    _, _, model, (tokens, tt, mask) = setup
    _, cache = model.run_with_cache(tokens, token_type_ids=tt, attention_mask=mask)
    for prefix, out in (("embed.ln", "hook_full_embed"),
                        ("blocks.0.ln1", "blocks.0.hook_normalized_resid_mid"),
                        ("blocks.1.ln2", "blocks.1.hook_normalized_resid_post")):
        normalized, ln = cache[f"{prefix}.hook_normalized"], model.get_submodule(prefix)
        torch.testing.assert_close(normalized.mean(-1), torch.zeros(BATCH, POS, dtype=torch.float64), **TOL)
        torch.testing.assert_close(normalized.pow(2).mean(-1), torch.ones(BATCH, POS, dtype=torch.float64),
                                   rtol=0.0, atol=1e-8)
        torch.testing.assert_close(cache[out], normalized * ln.w + ln.b, **TOL)


@pytest.mark.parametrize("name", ["blocks.0.ln1.hook_normalized", "embed.ln.hook_normalized",
                                  "blocks.1.ln2.hook_normalized", "blocks.0.ln2.hook_scale"])
def test_an_edit_at_a_layer_norm_hook_flows_through_its_gain_and_bias(setup, name):
    bert, readout, model, (tokens, tt, mask) = setup

    def edit(act: torch.Tensor, hook=None) -> torch.Tensor:
        noise = torch.randn(act.shape, generator=torch.Generator().manual_seed(7), dtype=act.dtype)
        return act.flip(-1) * 0.5 + noise

    with torch.no_grad():
        got = model.run_with_hooks(tokens, token_type_ids=tt, attention_mask=mask, fwd_hooks=[(name, edit)])
        ref = reference(bert, readout, tokens, tt, mask, edits={name: edit})
        clean = model(tokens, token_type_ids=tt, attention_mask=mask)
    assert not torch.allclose(got, clean)
    torch.testing.assert_close(got, ref["hook_readout"], **TOL)
    if name == "blocks.0.ln1.hook_normalized":  # the edited value, times w, plus b, is the MLP input
        ln = bert.encoder.layer[0].attention.output.LayerNorm
        want = edit(reference(bert, readout, tokens, tt, mask)[name]) * ln.weight + ln.bias
        with torch.no_grad(), model.hooks(fwd_hooks=[(name, edit)]):
            _, cache = model.run_with_cache(tokens, token_type_ids=tt, attention_mask=mask,
                                            names_filter="blocks.0.hook_normalized_resid_mid")
        torch.testing.assert_close(cache["blocks.0.hook_normalized_resid_mid"], want, **TOL)
    assert model.active_hook_count() == 0
