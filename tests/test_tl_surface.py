"""TransformerLens's encoder surface on HookedEncoder: QK / OV / all_head_labels, short-name cache
access, and every public ActivationCache method either verified against a recomputation from the
cached tensors and the weights, or raising a clear error (none silently returns wrong numbers)."""

from __future__ import annotations

import importlib.metadata
import inspect

import pytest
import torch
from transformer_lens import ActivationCache, FactoredMatrix

import tfmatcomp as tm
from tfmatcomp.models.cache import EncoderActivationCache, PostLNError

L, H = 2, 4


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.fixture(scope="module")
def model() -> tm.HookedEncoder:
    """Float64, every parameter random (LayerNorm gains and biases and all biases included: the
    default 1 / 0 would hide a missing w, b or b_O)."""
    cfg = tm.EncoderConfig(n_layers=L, n_heads=H, d_model=32, d_mlp=48, n_ctx=12)
    model = tm.HookedEncoder(cfg, seed=0).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".w"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name.rsplit(".", 1)[-1].startswith("b"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.fixture(scope="module")
def tokens(model) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (3, 12), generator=torch.Generator().manual_seed(2))


@pytest.fixture()
def cache(model, tokens) -> EncoderActivationCache:
    return model.run_with_cache(tokens)[1]


# --------------------------------------------------------------------- weights
def test_qk_ov_are_factored_products_of_the_weights(model):
    qk, ov = model.QK, model.OV
    assert isinstance(qk, FactoredMatrix) and isinstance(ov, FactoredMatrix)
    d = model.cfg.d_model
    assert qk.shape == ov.shape == (L, H, d, d)
    for l in range(L):
        for h in range(H):
            attn = model.blocks[l].attn
            _close(qk.AB[l, h], attn.W_Q[h] @ attn.W_K[h].T)
            _close(ov.AB[l, h], attn.W_V[h] @ attn.W_O[h])
    assert model.all_head_labels == [f"L{l}H{h}" for l in range(L) for h in range(H)]


def test_qk_is_the_bilinear_form_of_the_attention_scores(tokens):
    model = tm.HookedEncoder(tm.EncoderConfig(n_layers=L, n_heads=H, d_model=32, d_mlp=48, n_ctx=12),
                             seed=3).double()  # biases 0 at init: the scores are x QK x^T / sqrt(d_head)
    _, cache = model.run_with_cache(tokens)
    for l in range(L):
        x = cache["resid_pre", l]
        expected = torch.einsum("bid,hde,bje->bhij", x, model.QK.AB[l], x) / model.cfg.d_head ** 0.5
        _close(cache["attn_scores", l], expected)


# ----------------------------------------------------------------- the cache
def test_run_with_cache_returns_the_subclass_or_a_dict(model, tokens):
    _, cache = model.run_with_cache(tokens)
    assert isinstance(cache, EncoderActivationCache) and isinstance(cache, ActivationCache)
    _, plain = model.run_with_cache(tokens, return_cache_object=False)
    assert type(plain) is dict and plain.keys() == cache.keys()
    _, one = model.run_with_cache(tokens[:1], remove_batch_dim=True)
    assert not one.has_batch_dim and one["pattern", 0].shape == (H, 12, 12)


SHORT_NAMES = [
    (("pattern", 1), "blocks.1.attn.hook_pattern"), (("attn", 0), "blocks.0.attn.hook_pattern"),
    (("attn_scores", 1), "blocks.1.attn.hook_attn_scores"), (("q", 0), "blocks.0.attn.hook_q"),
    (("k", 1, "attn"), "blocks.1.attn.hook_k"), (("v", 0), "blocks.0.attn.hook_v"),
    (("z", 1), "blocks.1.attn.hook_z"), (("resid_pre", 0), "blocks.0.hook_resid_pre"),
    (("resid_mid", 1), "blocks.1.hook_resid_mid"), (("resid_post", 1), "blocks.1.hook_resid_post"),
    (("attn_out", 0), "blocks.0.hook_attn_out"), (("mlp_out", 1), "blocks.1.hook_mlp_out"),
    (("pre", 0), "blocks.0.mlp.hook_pre"), (("post", 1), "blocks.1.mlp.hook_post"),
    (("scale", 0, "ln1"), "blocks.0.ln1.hook_scale"),
    (("normalized", 1, "ln2"), "blocks.1.ln2.hook_normalized"),
    (("pattern", -1), f"blocks.{L - 1}.attn.hook_pattern"), ("pattern1", "blocks.1.attn.hook_pattern"),
    ("scale0ln2", "blocks.0.ln2.hook_scale"), ("embed", "embed.hook_embed"),
    ("pos_embed", "embed.hook_pos_embed"), ("hook_embed", "embed.hook_embed"),
    ("blocks.0.hook_resid_pre", "blocks.0.hook_resid_pre"),
]


@pytest.mark.parametrize("key, full", SHORT_NAMES, ids=[str(k) for k, _ in SHORT_NAMES])
def test_short_names_are_transformer_lens_names(cache, key, full):
    assert cache[key] is cache.cache_dict[full]


def test_missing_names_raise_key_error_with_a_hint(cache):
    with pytest.raises(KeyError, match="no ln_final"):
        cache["scale"]
    with pytest.raises(KeyError, match="blocks.0.attn.hook_result"):
        cache["result", 0]


# ------------------------------------------- every public ActivationCache method
def _public_methods() -> set[str]:
    # Only TransformerLens's own methods: importing nnsight (the interop tests, same process) adds
    # a `save` to every class, which is not part of the ActivationCache surface.
    names = {n for n, f in inspect.getmembers(ActivationCache, callable)
             if not n.startswith("_") and getattr(f, "__module__", "").startswith("transformer_lens")}
    return names | {"__getitem__", "__len__", "__iter__", "__repr__"}


def check_dict_interface(cache):
    d = cache.cache_dict
    assert len(cache) == len(d) and list(cache) == list(d) == list(cache.keys())
    assert list(cache.values()) == list(d.values()) and list(cache.items()) == list(d.items())
    assert "blocks.0.attn.hook_pattern" in repr(cache)
    assert cache["blocks.1.hook_mlp_out"] is d["blocks.1.hook_mlp_out"]


def check_to(cache):
    assert cache.to("cpu") is cache and cache["q", 0].device.type == "cpu"


def check_toggle_autodiff(cache):
    before = torch.is_grad_enabled()
    try:
        cache.toggle_autodiff(False)
        assert not torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(before)


def check_remove_batch_dim(cache):
    one = cache.apply_slice_to_batch_dim(slice(0, 1)).remove_batch_dim()
    assert not one.has_batch_dim
    _close(one["resid_pre", 1], cache["resid_pre", 1][0])


def check_apply_slice_to_batch_dim(cache):
    part = cache.apply_slice_to_batch_dim(slice(1, 3))
    assert isinstance(part, EncoderActivationCache)  # still refuses the pre-LN helpers
    _close(part["pattern", 1], cache["pattern", 1][1:3])
    with pytest.raises(PostLNError):
        part.accumulated_resid()


def check_stack_activation(cache):
    _close(cache.stack_activation("resid_pre"), torch.stack([cache["resid_pre", l] for l in range(L)]))
    _close(cache.stack_activation("scale", 1, "ln2"), cache["scale", 0, "ln2"][None])


def check_compute_head_results(cache, model):
    cache.compute_head_results()
    for l in range(L):  # the heads' outputs and b_O add up to the attention output
        _close(cache["result", l].sum(-2) + model.blocks[l].attn.b_O, cache["attn_out", l])


def check_stack_head_results(cache, model):
    stack, labels = cache.stack_head_results(return_labels=True)
    assert labels == model.all_head_labels and stack.shape[0] == L * H
    for l in range(L):
        for h in range(H):
            _close(stack[l * H + h], cache["z", l][:, :, h] @ model.blocks[l].attn.W_O[h])
    assert cache.stack_head_results(1, pos_slice=3).shape == (H, 3, model.cfg.d_model)
    for option in ("incl_remainder", "apply_ln"):
        with pytest.raises(PostLNError, match=f"stack_head_results\\({option}=True\\)"):
            cache.stack_head_results(**{option: True})


def check_get_neuron_results(cache, model):
    mlp = model.blocks[1].mlp
    per_neuron = cache.get_neuron_results(1)
    _close(per_neuron.sum(-2) + mlp.b_out, cache["mlp_out", 1])
    direction = torch.randn(model.cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    _close(cache.get_neuron_results(1, project_output_onto=direction), per_neuron @ direction)


def check_stack_neuron_results(cache, model):
    stack, labels = cache.stack_neuron_results(L, return_labels=True)
    m = model.cfg.d_mlp
    assert stack.shape[0] == L * m and labels[m] == "L1N0"
    for l in range(L):
        expected = cache["post", l][..., None] * model.blocks[l].mlp.W_out
        _close(stack[l * m:(l + 1) * m], expected.movedim(-2, 0))
    for option in ("incl_remainder", "apply_ln"):
        with pytest.raises(PostLNError, match=f"stack_neuron_results\\({option}=True\\)"):
            cache.stack_neuron_results(L, **{option: True})


def check_apply_ln_to_stack(cache, model):
    for l in range(L):  # the MLP reads ln1(resid_mid) = ln1(resid_pre + attn_out)
        ln1 = model.blocks[l].ln1
        parts = cache.apply_ln_to_stack(torch.stack([cache["resid_pre", l], cache["attn_out", l]]),
                                        layer=l, mlp_input=True)
        mlp_input = cache["resid_post", l] - cache["mlp_out", l]
        _close(parts.sum(0) * ln1.w + ln1.b, mlp_input)
    last = L - 1  # the read-out reads the last ln2(resid_post) = ln2(ln1 output + mlp_out)
    stack = torch.stack([cache["resid_post", last] - cache["mlp_out", last], cache["mlp_out", last]])
    for layer in (None, -1, L):
        parts = cache.apply_ln_to_stack(stack, layer=layer)
        ln2 = model.blocks[last].ln2
        _close(parts.sum(0) * ln2.w + ln2.b, cache["blocks.1.hook_normalized_resid_post"])
    sliced = cache.apply_ln_to_stack(stack[:, :, 5], pos_slice=5)
    _close(sliced, cache.apply_ln_to_stack(stack)[:, :, 5])
    _close(cache.apply_ln_to_stack(stack[:, :2], batch_slice=slice(0, 2)),
           cache.apply_ln_to_stack(stack)[:, :2])
    with pytest.raises(PostLNError, match=r"apply_ln_to_stack\(layer=0, mlp_input=False\)"):
        cache.apply_ln_to_stack(stack, layer=0)
    with pytest.raises(PostLNError, match="recompute_ln"):
        cache.apply_ln_to_stack(stack, recompute_ln=True)
    with pytest.raises(ValueError, match="layer"):
        cache.apply_ln_to_stack(stack, layer=L + 1)


def check_ssm_layers(cache):
    assert cache.ssm_layers() == []  # true: this encoder has no SSM mixer


def check_no_ssm_state(cache):  # TransformerLens's own errors say so
    with pytest.raises((RuntimeError, TypeError), match="SSM"):
        cache.compute_ssm_state()
    with pytest.raises((RuntimeError, TypeError), match="SSM"):
        cache.compute_ssm_effective_attention(layer=0)


VERIFIED = {
    "__getitem__": check_dict_interface, "__len__": check_dict_interface,
    "__iter__": check_dict_interface, "__repr__": check_dict_interface, "keys": check_dict_interface,
    "values": check_dict_interface, "items": check_dict_interface, "to": check_to,
    "toggle_autodiff": check_toggle_autodiff, "remove_batch_dim": check_remove_batch_dim,
    "apply_slice_to_batch_dim": check_apply_slice_to_batch_dim,
    "stack_activation": check_stack_activation, "compute_head_results": check_compute_head_results,
    "stack_head_results": check_stack_head_results, "get_neuron_results": check_get_neuron_results,
    "stack_neuron_results": check_stack_neuron_results, "apply_ln_to_stack": check_apply_ln_to_stack,
    "ssm_layers": check_ssm_layers, "compute_ssm_state": check_no_ssm_state,
    "compute_ssm_effective_attention": check_no_ssm_state,
}
REFUSED = {
    "accumulated_resid": lambda c: c.accumulated_resid(apply_ln=False),
    "decompose_resid": lambda c: c.decompose_resid(),
    "get_full_resid_decomposition": lambda c: c.get_full_resid_decomposition(),
    "logit_attrs": lambda c: c.logit_attrs(c.stack_activation("resid_pre"), tokens=1),
    "logit_lens": lambda c: c.logit_lens(),
}


#: ActivationCache methods that TransformerLens 3.x does not have yet.
NEW_IN_TL4 = {"logit_lens"}
TL_MAJOR = int(importlib.metadata.version("transformer-lens").split(".")[0])
EXPECTED = (set(VERIFIED) | set(REFUSED)) - (NEW_IN_TL4 if TL_MAJOR < 4 else set())


def test_every_public_method_is_classified():
    public = _public_methods()
    assert public == EXPECTED, (
        f"unclassified ActivationCache methods (TransformerLens changed?): "
        f"{sorted(public - set(VERIFIED) - set(REFUSED))}; gone: "
        f"{sorted(EXPECTED - public)}")
    assert not set(VERIFIED) & set(REFUSED)


@pytest.mark.parametrize("method", sorted(VERIFIED))
def test_method_is_verified(method, cache, model):
    check = VERIFIED[method]
    check(*[cache, model][:len(inspect.signature(check).parameters)])


@pytest.mark.parametrize("method", sorted(REFUSED))
def test_method_raises_a_clear_error(method, cache):
    if method not in EXPECTED:
        pytest.skip(f"TransformerLens {TL_MAJOR}.x has no ActivationCache.{method}")
    with pytest.raises(PostLNError, match=f"^{method}: not defined for this post-LN encoder: "
                                          r".*re-normalizes the residual stream"):
        REFUSED[method](cache)
