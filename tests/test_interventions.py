"""Invariants of tfmatcomp.interventions (random-weight models; exact comparisons on CPU).

The model runs attention and LayerNorm through fused kernels when none of their hooks is active and
through the explicit (hooked) path otherwise; the two agree to float rounding (~1e-7), not bit for
bit. To compare runs *exactly* whatever hooks an intervention adds, the ``model`` fixture keeps a
no-op hook on every attention pattern and LayerNorm scale (:func:`explicit`), so every run takes
the explicit path; hook leaks are checked against that baseline count and, after the fixture
removes its own hooks, against zero.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tfmatcomp as tm
from tfmatcomp.models.param_groups import GROUPS
from tfmatcomp.interventions import (ActivationAblation, ActivationPatch,
                                     DonorMismatchError, MaskSubstitution, MeanAttentionAblation,
                                     PositionalPermutation, UniformAttentionAblation,
                                     WeightTransplant, compose, negation_patch, paper_heads,
                                     paper_label, parameter_override_hooks)

RESID_HOOKS = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_normalized_resid_post"]


def _noop(act, hook):
    return None


@contextmanager
def explicit(model):
    """Every attention / LayerNorm of ``model`` on its explicit path while inside."""
    names = [n for n in model.hook_dict if n.endswith(("attn.hook_pattern", "hook_scale"))]
    with model.hooks(fwd_hooks=[(n, _noop) for n in names]):
        model.n_explicit_hooks = len(names)
        yield model
    model.n_explicit_hooks = 0


def hooks_left(model) -> int:
    """Hooks registered beyond the fixture's own no-op hooks."""
    return model.active_hook_count() - getattr(model, "n_explicit_hooks", 0)


def fresh_with(model, values):
    """A new model with ``model``'s weights, some replaced by ``values``."""
    ref = tm.HookedEncoder(model.cfg).eval()
    ref.load_state_dict({**model.state_dict(), **values})
    return ref


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(model, snap):
    now = model.state_dict()
    assert set(now) == set(snap)
    for k, v in snap.items():
        assert torch.equal(now[k], v), k


@pytest.fixture()
def model(tiny_model):
    with explicit(tiny_model):
        yield tiny_model
        assert hooks_left(tiny_model) == 0
    assert tiny_model.active_hook_count() == 0


@pytest.fixture()
def donor(tiny_cfg):
    """A different model whose every parameter (LayerNorms and zero-init biases too) differs."""
    m = tm.HookedEncoder(tiny_cfg, seed=1).eval()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return m


@pytest.fixture()
def batch(batch4):
    return batch4


# ------------------------------------------------------------------------------- uniform ablation
def test_uniform_ablation_pattern_is_exactly_one_over_n_keys(model, batch):
    heads = [(0, 1), (1, 0), (1, 3)]
    _, clean = model.run_with_cache(batch.tokens)
    _, cache = UniformAttentionAblation(heads).run_with_cache(model, batch.tokens)
    n_keys = batch.tokens.shape[1]
    assert n_keys == 16
    for l in range(2):
        pat = cache[f"blocks.{l}.attn.hook_pattern"]
        scores = cache[f"blocks.{l}.attn.hook_attn_scores"]
        for h in range(4):
            if (l, h) in heads:
                assert (pat[:, h] == 1 / n_keys).all()
            else:  # untouched: still the softmax of this run's scores
                assert torch.equal(pat[:, h], torch.softmax(scores, -1)[:, h])
    # layer 0 is upstream of every edit: identical to the clean run except the ablated head
    keep = [0, 2, 3]
    assert torch.equal(cache["blocks.0.attn.hook_pattern"][:, keep],
                       clean["blocks.0.attn.hook_pattern"][:, keep])


def test_uniform_ablation_exact_for_7x7(tiny_cfg):
    cfg = tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=16, n_ctx=49)
    m = tm.HookedEncoder(cfg).eval()
    tokens = tm.MatrixCompletionTask(7).sample(3, generator=torch.Generator().manual_seed(0)).tokens
    _, cache = UniformAttentionAblation(paper_heads("(1,2)")).run_with_cache(m, tokens)
    pat = cache["blocks.0.attn.hook_pattern"]
    assert (pat[:, 1] == torch.tensor(1 / 49, dtype=pat.dtype)).all()
    assert not (pat[:, 0] == pat[0, 0, 0, 0]).all()
    assert m.active_hook_count() == 0


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3)), max_size=8))
def test_uniform_ablation_property(tiny_cfg, heads):
    m = tm.HookedEncoder(tiny_cfg, seed=0).eval()
    tokens = tm.MatrixCompletionTask(4, rank=1).sample(2, generator=torch.Generator().manual_seed(1)).tokens
    pred, cache = UniformAttentionAblation(heads).run_with_cache(m, tokens)
    for l in range(2):
        pat = cache[f"blocks.{l}.attn.hook_pattern"]
        for h in range(4):
            if (l, h) in heads:
                assert (pat[:, h] == 1 / 16).all()
            else:
                assert torch.equal(pat[:, h], torch.softmax(cache[f"blocks.{l}.attn.hook_attn_scores"],
                                                            -1)[:, h])
    if not heads:
        assert torch.equal(pred, m.run_with_cache(tokens)[0])
    assert m.active_hook_count() == 0


def test_ablating_no_heads_is_a_noop(model, batch):
    clean = model(batch.tokens)
    for abl in (UniformAttentionAblation([]), MeanAttentionAblation([])):
        assert abl.fwd_hooks(model) == []
        assert torch.equal(abl.run(model, batch.tokens), clean)


def test_ablation_changes_output(model, batch):
    assert not torch.equal(UniformAttentionAblation("all").run(model, batch.tokens), model(batch.tokens))


def test_mean_ablation_is_batch_mean_and_noop_at_batch_one(model, batch):
    _, clean = model.run_with_cache(batch.tokens)
    _, cache = MeanAttentionAblation([(0, 2)]).run_with_cache(model, batch.tokens)
    want = clean["blocks.0.attn.hook_pattern"][:, 2].mean(0, keepdim=True).expand(8, -1, -1)
    assert torch.equal(cache["blocks.0.attn.hook_pattern"][:, 2], want)
    one = batch.tokens[:1]
    assert torch.equal(MeanAttentionAblation("all").run(model, one), model(one))


def test_ablation_rejects_bad_heads(model):
    with pytest.raises(ValueError, match="0-based"):
        UniformAttentionAblation([(2, 0)]).fwd_hooks(model)
    with pytest.raises(ValueError, match="heads"):
        UniformAttentionAblation("(1,1)")


def test_activation_ablation_zero_and_mean(model, batch):
    _, cache = ActivationAblation("attn.hook_z", layers=[1], heads=[0, 2]).run_with_cache(model, batch.tokens)
    z = cache["blocks.1.attn.hook_z"]
    assert (z[:, :, [0, 2]] == 0).all() and (z[:, :, [1, 3]] != 0).any()
    _, clean = model.run_with_cache(batch.tokens)
    pos = torch.zeros(16, dtype=torch.bool)
    pos[3] = True
    _, cache = ActivationAblation("blocks.0.hook_mlp_out", mode="mean", positions=pos).run_with_cache(
        model, batch.tokens)
    got, ref = cache["blocks.0.hook_mlp_out"], clean["blocks.0.hook_mlp_out"]
    assert torch.equal(got[:, 3], ref[:, 3].mean(0, keepdim=True).expand(8, -1))
    assert torch.equal(got[:, :3], ref[:, :3])
    with pytest.raises(ValueError, match="no head axis"):
        ActivationAblation("hook_mlp_out", heads=[0]).run(model, batch.tokens)
    with pytest.raises(ValueError, match="not a hook"):
        ActivationAblation("hook_nonsense").fwd_hooks(model)


# ----------------------------------------------------------------------------- weight transplant
def test_self_transplant_is_a_noop_and_restores_bits(model, batch):
    snap = snapshot(model)
    clean = model(batch.tokens)
    t = WeightTransplant(model, params="all")
    with t.applied(model):
        assert torch.equal(model(batch.tokens), clean)
    assert_same_weights(model, snap)
    assert torch.equal(model.run_with_hooks(batch.tokens, fwd_hooks=t.fwd_hooks(model)), clean)


@pytest.mark.parametrize("params", sorted(GROUPS))
def test_transplant_applied_equals_reference_and_hooks(model, donor, batch, params):
    snap = snapshot(model)
    t = WeightTransplant(donor, params=params)
    names = t.parameter_names(model)
    # independent reference: a copy with the donor's values loaded
    ref = fresh_with(model, {n: donor.state_dict()[n] for n in names})
    with explicit(ref):
        want = ref(batch.tokens)
    with t.applied(model):
        for n in names:
            assert torch.equal(dict(model.named_parameters())[n], dict(donor.named_parameters())[n])
        got = model(batch.tokens)
    assert torch.equal(got, want)
    assert not torch.equal(got, model(batch.tokens))
    assert_same_weights(model, snap)
    hooked = model.run_with_hooks(batch.tokens, fwd_hooks=t.fwd_hooks(model))
    torch.testing.assert_close(hooked, want, rtol=0, atol=1e-6)
    assert torch.equal(hooked, want)
    assert_same_weights(model, snap)


def test_transplant_restores_after_exception(model, donor, batch):
    snap = snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        with (WeightTransplant(donor, "all") + UniformAttentionAblation("all")).applied(model):
            assert hooks_left(model) > 0
            raise RuntimeError("boom")
    assert hooks_left(model) == 0
    assert_same_weights(model, snap)


def test_transplant_layers_and_names(model, donor):
    t = WeightTransplant(donor, params=["qkv", "readout.b"], layers=[1])
    assert t.parameter_names(model) == [
        "blocks.1.attn.W_Q", "blocks.1.attn.W_K", "blocks.1.attn.W_V", "blocks.1.attn.b_Q",
        "blocks.1.attn.b_K", "blocks.1.attn.b_V", "readout.b"]
    with pytest.raises(ValueError, match="neither a group"):
        WeightTransplant(donor, params="queries").parameter_names(model)


def test_transplant_refuses_mismatched_donor(model, batch, tiny_cfg):
    other = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=4, d_model=64, d_mlp=64, n_ctx=16))
    snap = snapshot(model)
    with pytest.raises(DonorMismatchError, match="d_model"):
        with WeightTransplant(other).applied(model):
            pass
    assert_same_weights(model, snap)
    with pytest.raises(DonorMismatchError, match="shape"):
        WeightTransplant(other, strict=False).fwd_hooks(model)
    eps = tm.HookedEncoder(tm.EncoderConfig(**{**tiny_cfg.to_dict(), "layer_norm_eps": 1e-5}))
    with pytest.raises(DonorMismatchError, match="layer_norm_eps"):
        WeightTransplant(eps).fwd_hooks(model)
    assert WeightTransplant(eps, strict=False).fwd_hooks(model)


def test_override_hooks_each_parameter(model, batch):
    """Every single parameter, overridden alone in hook form, equals writing it."""
    gen = torch.Generator().manual_seed(0)
    snap = snapshot(model)
    for name, p in model.named_parameters():
        value = p.detach() + 0.05 * torch.randn(p.shape, generator=gen)
        ref = fresh_with(model, {name: value})
        hooked = model.run_with_hooks(batch.tokens, fwd_hooks=parameter_override_hooks(model, {name: value}))
        with explicit(ref):
            assert torch.equal(hooked, ref(batch.tokens)), name
    assert_same_weights(model, snap)


def test_transplant_hooks_equal_a_model_with_the_donors_parameters(tiny_model, donor, batch):
    """Hook form and applied are the model's own forward pass: bit-exact to a model loaded with
    the donor's values, on the fused path too, activations included."""
    t = WeightTransplant(donor, params="all_but_attn")
    names = t.parameter_names(tiny_model)
    ref = fresh_with(tiny_model, {n: donor.state_dict()[n] for n in names})
    want, want_cache = ref.run_with_cache(batch.tokens)
    with tiny_model.hooks(fwd_hooks=t.fwd_hooks(tiny_model)):
        got, cache = tiny_model.run_with_cache(batch.tokens)
    assert torch.equal(got, want)
    for name in ("embed.hook_pos_embed", "blocks.0.ln1.hook_normalized", "blocks.0.hook_normalized_resid_mid",
                 "blocks.1.hook_mlp_out"):
        assert torch.equal(cache[name], want_cache[name]), name
    with tiny_model.unfused(), ref.unfused():
        want = ref(batch.tokens)
        assert torch.equal(tiny_model.run_with_hooks(batch.tokens, fwd_hooks=t.fwd_hooks(tiny_model)), want)
        assert torch.equal(t.run(tiny_model, batch.tokens), want)
    assert tiny_model.active_hook_count() == 0


def test_weight_hooks_restore_parameters_when_the_forward_stops_early(tiny_model, donor, batch):
    snap = snapshot(tiny_model)
    objects = dict(tiny_model.named_parameters())
    t = WeightTransplant(donor, params="all")
    hidden = tiny_model.run_with_hooks(batch.tokens, fwd_hooks=t.fwd_hooks(tiny_model),
                                       return_type="hidden")          # hook_readout never runs
    assert hidden.shape == (*batch.tokens.shape, tiny_model.cfg.d_model)

    def boom(act, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tiny_model.run_with_hooks(batch.tokens, fwd_hooks=t.fwd_hooks(tiny_model) +
                                  [("blocks.0.hook_attn_out", boom)])
    assert tiny_model.active_hook_count() == 0
    assert_same_weights(tiny_model, snap)
    assert all(p is objects[n] for n, p in tiny_model.named_parameters())


def test_weight_hooks_give_the_edited_models_gradients(tiny_model, donor, batch):
    """Substituted tensors are constants of the graph: gradients are those of the donor-loaded
    model for every other parameter, and none reach the replaced ones."""
    t = WeightTransplant(donor, params="qkv")
    names = set(t.parameter_names(tiny_model))
    ref = fresh_with(tiny_model, {n: donor.state_dict()[n] for n in names})
    with tiny_model.unfused(), ref.unfused():
        tiny_model.zero_grad()
        tiny_model.run_with_hooks(batch.tokens, fwd_hooks=t.fwd_hooks(tiny_model)).sum().backward()
        ref(batch.tokens).sum().backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    for n, p in tiny_model.named_parameters():
        if n in names:
            assert p.grad is None, n
        else:
            torch.testing.assert_close(p.grad, ref_grads[n], rtol=0, atol=1e-6, msg=n)
    tiny_model.zero_grad(set_to_none=True)


# ------------------------------------------------------------------------- positional permutation
def test_identity_permutation_is_a_noop(model, batch):
    clean = model(batch.tokens)
    ident = PositionalPermutation(list(range(16)))
    assert torch.equal(ident.run(model, batch.tokens), clean)
    assert torch.equal(model.run_with_hooks(batch.tokens, fwd_hooks=ident.fwd_hooks(model)), clean)


def test_permutation_direction_and_hook_form(model, batch):
    snap = snapshot(model)
    perm = PositionalPermutation(seed=0, n_positions=16)
    p = perm.permutation(model)
    assert not torch.equal(p, torch.arange(16))
    _, cache = perm.run_with_cache(model, batch.tokens)
    pos = cache["embed.hook_pos_embed"][0]
    for i in range(16):  # the embedding that encoded position i is used at position perm[i]
        assert torch.equal(pos[p[i]], snap["embed.W_pos"][i])
    applied = perm.run(model, batch.tokens)
    assert not torch.equal(applied, model(batch.tokens))
    assert torch.equal(model.run_with_hooks(batch.tokens, fwd_hooks=perm.fwd_hooks(model)), applied)
    assert torch.equal(PositionalPermutation(seed=0, n_positions=16).permutation(), p)
    assert_same_weights(model, snap)
    with pytest.raises(ValueError, match="permutation"):
        PositionalPermutation([0, 0, 1])
    with pytest.raises(ValueError, match="exactly one"):
        PositionalPermutation()


# --------------------------------------------------------------------------------- patching
def test_patch_from_itself_is_a_noop(model, batch):
    clean, cache = model.run_with_cache(batch.tokens)
    for hooks in ("attn.hook_z", RESID_HOOKS, "attn.hook_pattern"):
        assert torch.equal(ActivationPatch(batch, hooks=hooks).run(model, batch.tokens), clean)
        assert torch.equal(ActivationPatch(cache, hooks=hooks).run(model, batch.tokens), clean)


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("hook", RESID_HOOKS)
def test_patching_residual_stream_gives_source_output(model, task4, layer, hook):
    a = task4.sample(8, generator=torch.Generator().manual_seed(10))
    b = task4.sample(8, generator=torch.Generator().manual_seed(11))
    out_b, cache_b = model.run_with_cache(b.tokens)
    name = f"blocks.{layer}.{hook}"
    assert torch.equal(ActivationPatch(b, hooks=name).run(model, a.tokens), out_b)
    assert torch.equal(model.run_with_hooks(a.tokens, fwd_hooks=ActivationPatch(cache_b, hooks=name)
                                            .fwd_hooks(model)), out_b)
    assert not torch.equal(model(a.tokens), out_b)


def test_patch_full_embed_gives_source_output(model, task4):
    a = task4.sample(4, generator=torch.Generator().manual_seed(1))
    b = task4.sample(4, generator=torch.Generator().manual_seed(2))
    assert torch.equal(ActivationPatch(b, hooks="hook_full_embed").run(model, a.tokens), model(b.tokens))


def test_patch_heads_and_positions(model, batch):
    neg = batch.negated()
    _, src = model.run_with_cache(batch.tokens)
    _, tgt = model.run_with_cache(neg.tokens)
    _, cache = ActivationPatch(batch, layers=[0], heads=[1]).run_with_cache(model, neg.tokens)
    z = cache["blocks.0.attn.hook_z"]
    assert torch.equal(z[:, :, 1], src["blocks.0.attn.hook_z"][:, :, 1])
    assert torch.equal(z[:, :, [0, 2, 3]], tgt["blocks.0.attn.hook_z"][:, :, [0, 2, 3]])
    _, cache = ActivationPatch(batch, layers=[0], positions=batch.masked).run_with_cache(model, neg.tokens)
    z = cache["blocks.0.attn.hook_z"]
    assert torch.equal(z[batch.masked], src["blocks.0.attn.hook_z"][batch.masked])
    assert torch.equal(z[batch.observed], tgt["blocks.0.attn.hook_z"][batch.observed])


def test_negation_patch_recipe_and_shape_error(model, batch):
    patch, target = negation_patch(batch)
    assert patch.acts_on(model) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    assert torch.equal(target.observed, batch.observed) and torch.equal(target.values, -batch.values)
    f_p = patch.run(model, target.tokens)
    assert not torch.equal(f_p, model(target.tokens))
    with pytest.raises(ValueError, match="same batch size"):
        patch.run(model, target.tokens[:4])
    assert hooks_left(model) == 0
    with pytest.raises(ValueError, match="no activation"):
        ActivationPatch({}, hooks="attn.hook_z").fwd_hooks(model)


# ------------------------------------------------------------------------------ token edits
@pytest.mark.parametrize("learned_mask", [False, True])
@pytest.mark.parametrize("m", [0.44, -0.24, 0.0])
def test_mask_substitution_equals_feeding_tokens(tiny_cfg, batch, learned_mask, m):
    cfg = tm.EncoderConfig(**{**tiny_cfg.to_dict(), "learned_mask_embedding": learned_mask})
    model = tm.HookedEncoder(cfg, seed=3).eval()
    sub = MaskSubstitution(m)
    want = model(batch.with_mask_value(m))
    assert torch.equal(sub.transform_tokens(batch.tokens), batch.with_mask_value(m))
    assert torch.equal(sub.run(model, batch.tokens), want)
    assert torch.equal(model.run_with_hooks(batch.tokens, fwd_hooks=sub.fwd_hooks(model)), want)
    assert hooks_left(model) == 0
    with pytest.raises(ValueError, match="value"):
        MaskSubstitution(12.0)


# -------------------------------------------------------------------------------- composition
def test_composition_of_hooks_equals_hand_order(model, batch):
    a = UniformAttentionAblation([(0, 1)])
    b = ActivationAblation("attn.hook_pattern", layers=[0], heads=[1])  # zero at the same site
    c = ActivationPatch(batch.negated(), hooks="attn.hook_z", layers=[1])
    for first, second in ((a, b), (b, a), (a, c), (c, b)):
        by_hand = model.run_with_hooks(batch.tokens, fwd_hooks=first.fwd_hooks(model) + second.fwd_hooks(model))
        assert torch.equal((first + second).run(model, batch.tokens), by_hand)
        assert torch.equal(model.run_with_hooks(batch.tokens, fwd_hooks=(first + second).fwd_hooks(model)),
                           by_hand)
    # order matters at a shared hook point: the later edit wins
    _, ab = (a + b).run_with_cache(model, batch.tokens)
    _, ba = (b + a).run_with_cache(model, batch.tokens)
    assert (ab["blocks.0.attn.hook_pattern"][:, 1] == 0).all()
    assert (ba["blocks.0.attn.hook_pattern"][:, 1] == 1 / 16).all()


def test_composition_stage_order(model, donor, batch):
    """tokens, then weights, then hooks, whatever the list order; both forms agree."""
    snap = snapshot(model)
    sub, t, abl = MaskSubstitution(0.44), WeightTransplant(donor, ["qkv", "embed", "ln"]), \
        UniformAttentionAblation([(1, 2)])
    perm = PositionalPermutation(seed=1, n_positions=16)
    with t.applied(model), perm.applied(model):
        by_hand = model.run_with_hooks(sub.transform_tokens(batch.tokens), fwd_hooks=abl.fwd_hooks(model))
    for combo in (compose(abl, t, perm, sub), compose([sub, t], perm, abl), abl + t + perm + sub):
        assert torch.equal(combo.run(model, batch.tokens), by_hand)
        assert torch.equal(model.run_with_hooks(batch.tokens, fwd_hooks=combo.fwd_hooks(model)), by_hand)
        assert torch.equal(combo.transform_tokens(batch.tokens), batch.with_mask_value(0.44))
    assert_same_weights(model, snap)
    assert "then" in (abl + t).describe()


def test_weight_edits_compose_sequentially(model, donor, batch):
    """A transplant of W_pos followed by a permutation permutes the donor's positions."""
    perm = PositionalPermutation(seed=2, n_positions=16)
    combo = WeightTransplant(donor, "embed.W_pos") + perm
    edits = combo.weight_edits(model)
    p = perm.permutation()
    assert torch.equal(edits["embed.W_pos"][p], donor.embed.W_pos.detach())
    with combo.applied(model):
        applied = model(batch.tokens)
    assert torch.equal(model.run_with_hooks(batch.tokens, fwd_hooks=combo.fwd_hooks(model)), applied)


def test_no_hook_left_when_forward_raises(model, batch):
    bad = ActivationPatch({"blocks.0.attn.hook_z": torch.zeros(1, 2, 3, 4)}, hooks="blocks.0.attn.hook_z")
    combo = UniformAttentionAblation("all") + bad
    with pytest.raises(ValueError, match="shape"):
        combo.run(model, batch.tokens)
    assert hooks_left(model) == 0
    with pytest.raises(ValueError, match="shape"):
        model.run_with_hooks(batch.tokens, fwd_hooks=combo.fwd_hooks(model))
    assert hooks_left(model) == 0


def test_describe_and_acts_on(model, donor):
    assert UniformAttentionAblation("all").acts_on(model) == [
        "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    assert MaskSubstitution(0.44).acts_on(model) == ["embed.hook_embed"]
    assert PositionalPermutation(seed=0).acts_on(model) == ["embed.W_pos"]
    assert WeightTransplant(donor).acts_on(model)[0] == "blocks.0.attn.W_Q"
    for iv in (UniformAttentionAblation("all"), MaskSubstitution(0.44), WeightTransplant(donor),
               PositionalPermutation(seed=0), ActivationPatch({}), ActivationAblation("hook_mlp_out")):
        assert isinstance(iv.describe(), str) and repr(iv).startswith("<")


def test_float64_model(tiny_cfg, batch):
    model = tm.HookedEncoder(tiny_cfg).double().eval()
    _, cache = UniformAttentionAblation("all").run_with_cache(model, batch.tokens)
    assert cache["blocks.0.attn.hook_pattern"].dtype == torch.float64
    assert (cache["blocks.1.attn.hook_pattern"] == 1 / 16).all()
    assert torch.equal(PositionalPermutation(list(range(16))).run(model, batch.tokens), model(batch.tokens))


# ------------------------------------------------------------------------------ head labels
def test_paper_heads_parsing():
    assert paper_heads("(2,2\u20134), (2,6), (3,2)") == [(1, 1), (1, 2), (1, 3), (1, 5), (2, 1)]
    assert paper_heads([(1, "1-2"), (1, "5-8")]) == [(0, 0), (0, 1), (0, 4), (0, 5), (0, 6), (0, 7)]
    for bad in ("(0,1)", "(2,3) junk", "(2,5-3)"):
        with pytest.raises(ValueError):
            paper_heads(bad)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=12))
def test_paper_label_round_trip(heads):
    assert paper_heads(paper_label(heads)) == heads if heads else paper_label(heads) == ""
