"""pyvene addresses our hooks via tfmatcomp.interop.pyvene (optional extra ``tfmatcomp[interop]``).

* pyvene's interchange intervention on ``head_attention_value_output`` (``hook_z`` per head) of
  every layer, base ``-X``, source ``X``, reproduces
  :func:`~tfmatcomp.interventions.negation_patch` bit for bit (one source run via a shared
  ``group_key``; separate source runs agree under ``model.unfused()``), and so does
  ``attention_value_output`` (all heads, flat);
* one head of one layer, the attention pattern of one head, and the block output at two positions
  each match the corresponding :class:`~tfmatcomp.interventions.ActivationPatch` bit for bit;
* pyvene's ``CollectIntervention`` reads the same tensors as ``run_with_cache``;
* a custom pyvene intervention that negates ``hook_z`` equals the same edit as a TransformerLens
  hook.
"""

from __future__ import annotations

import copy

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.interop.pyvene import MODULE_MAPPING, PyveneEncoder, intervenable, locations
from tfmatcomp.interventions import ActivationPatch, negation_patch

pv = pytest.importorskip("pyvene")


@pytest.fixture(scope="module")
def trained():
    return tm.load_pretrained("tiny", step="post")


@pytest.fixture()
def model(trained):
    """A copy per test: pyvene freezes the model's parameters and strips its hooks."""
    return copy.deepcopy(trained)


@pytest.fixture(scope="module")
def x():
    return tm.get_preset("tiny").task.build().sample(8, generator=torch.Generator().manual_seed(0))


def _interchange(model, reps, x, locs, n_sources=1):
    with torch.no_grad():
        _, out = intervenable(model, reps)(
            base={"tokens": x.negated().tokens}, sources=[{"tokens": x.tokens}] * n_sources,
            unit_locations=locs)
    return out


def test_negation_patch_every_head_every_layer(model, x):
    patch, neg = negation_patch(x)
    L, H, (B, P) = model.cfg.n_layers, model.cfg.n_heads, x.tokens.shape
    with torch.no_grad():
        expected = patch.run(model, neg.tokens)
    assert (expected - model(neg.tokens)).abs().max() > 1e-2       # the patch matters
    per_head = [{"layer": l, "component": "head_attention_value_output", "unit": "h.pos"}
                for l in range(L)]
    locs = locations(B, range(P), heads=range(H), n=L)
    grouped = [dict(r, group_key=0) for r in per_head]
    assert torch.equal(_interchange(model, grouped, x, locs), expected)
    with model.unfused():                        # one source run per intervention: same values
        with torch.no_grad():
            expected_unfused = patch.run(model, neg.tokens)
        assert torch.equal(_interchange(model, per_head, x, locs, n_sources=L), expected_unfused)
    flat = [{"layer": l, "component": "attention_value_output", "group_key": 0} for l in range(L)]
    assert torch.equal(_interchange(model, flat, x, locations(B, range(P), n=L)), expected)


@pytest.mark.parametrize("component, patch_kwargs, sites", [
    ("head_attention_value_output", dict(hooks="attn.hook_z", layers=[1], heads=[2]),
     dict(positions=range(16), heads=[2])),
    ("attention_weight", dict(hooks="attn.hook_pattern", layers=[1], heads=[1]),
     dict(positions=[1])),                      # pyvene's "pos" is axis 1: the head
    ("block_output", dict(hooks="blocks.1.hook_normalized_resid_post", positions=[3, 5]),
     dict(positions=[3, 5])),
])
def test_single_sites_match_activation_patch(model, x, component, patch_kwargs, sites):
    with torch.no_grad():
        expected = ActivationPatch(x, **patch_kwargs).run(model, x.negated().tokens)
    rep = {"layer": 1, "component": component}
    if "heads" in sites:
        rep["unit"] = "h.pos"
    out = _interchange(model, rep, x, locations(x.tokens.shape[0], **sites))
    assert (expected - model(x.negated().tokens)).abs().max() > 1e-4
    assert torch.equal(out, expected)


def test_collect_reads_the_cached_activations(model, x):
    B, P = x.tokens.shape
    comps = {"block_input": "hook_resid_pre", "block_output": "hook_normalized_resid_post",
             "resid_post": "hook_resid_post", "attention_output": "hook_attn_out",
             "mlp_output": "hook_mlp_out", "mlp_activation": "mlp.hook_post"}
    assert set(comps) < set(MODULE_MAPPING)
    # unfused: run_with_cache watches every hook, so every component takes the explicit path
    with model.unfused(), torch.no_grad():
        _, cache = model.run_with_cache(x.tokens)
        for component, hook in comps.items():
            pvm = intervenable(model, {"layer": 0, "component": component, "max_number_of_units": P,
                                       "intervention_type": pv.CollectIntervention})
            (_, collected), _ = pvm(base={"tokens": x.tokens},
                                    unit_locations={"base": [[list(range(P))] * B]})
            assert torch.equal(collected[0].reshape(B, P, -1), cache[f"blocks.0.{hook}"]), component


class _Negate(pv.ConstantSourceIntervention):
    """Replace the base representation by its negation (a source-free custom intervention)."""

    def forward(self, base, source=None, subspaces=None):
        return -base


def test_custom_negation_matches_a_hook(model, x):
    B, P = x.tokens.shape
    pvm = intervenable(model, {"layer": 0, "component": "attention_value_output",
                               "intervention": _Negate()})
    with torch.no_grad():
        _, out = pvm(base={"tokens": x.tokens}, unit_locations={"base": [[list(range(P))] * B]})
        expected = model.run_with_hooks(x.tokens, fwd_hooks=[("blocks.0.attn.hook_z",
                                                              lambda z, hook: -z)])
    assert (expected - model(x.tokens)).abs().max() > 1e-2
    assert torch.equal(out, expected)


def test_view_checks_its_argument():
    with pytest.raises(TypeError, match="model: expected a HookedEncoder"):
        PyveneEncoder(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="batch_size"):
        locations(0, [1])
