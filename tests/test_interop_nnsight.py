"""nnsight traces a HookedEncoder as it is (optional extra ``tfmatcomp[interop]``).

* reading ``blocks[l].attn.hook_pattern.output`` in a trace gives the cached pattern, bit for bit;
* editing it in a trace changes the output exactly as the same edit through ``run_with_hooks``
  (bit for bit on the wrapped model, to 1e-6 against a model nnsight never wrapped, whose
  unhooked components take the fused kernels);
* the LayerNorm hooks, also skipped by the fused path when nobody watches, are traced too;
* a trace leaves no TransformerLens hook behind.
"""

from __future__ import annotations

import copy

import pytest
import torch

import tfmatcomp as tm

nnsight = pytest.importorskip("nnsight")


@pytest.fixture(scope="module")
def trained():
    return tm.load_pretrained("tiny", step="post")


@pytest.fixture(scope="module")
def batch():
    return tm.get_preset("tiny").task.build().sample(8, generator=torch.Generator().manual_seed(0))


def _uniform_query(pattern, query: int = 1):
    pattern = pattern.clone()
    pattern[:, :, query] = 1.0 / pattern.shape[-1]
    return pattern


def test_read_pattern_is_the_cached_pattern(trained, batch):
    model = copy.deepcopy(trained)
    _, cache = model.run_with_cache(batch.tokens)
    traced = nnsight.NNsight(model)
    saved = {}  # filled in the order the forward pass reaches the hooks, as nnsight requires
    with torch.no_grad(), traced.trace(batch.tokens):
        for l, block in enumerate(traced.blocks):
            saved[f"blocks.{l}.attn.hook_pattern"] = block.attn.hook_pattern.output.save()
            saved[f"blocks.{l}.ln1.hook_scale"] = block.ln1.hook_scale.output.save()
    for name, value in saved.items():
        assert torch.equal(value, cache[name]), name
    assert model.active_hook_count() == 0


def test_pattern_edit_matches_run_with_hooks(trained, batch):
    never_wrapped = copy.deepcopy(trained)
    model = copy.deepcopy(trained)
    traced = nnsight.NNsight(model)
    with torch.no_grad():
        with traced.trace(batch.tokens):
            traced.blocks[1].attn.hook_pattern.output[:, :, 1] = 1.0 / batch.tokens.shape[1]
            edited = traced.output.save()
        clean = model(batch.tokens)
        hooks = [("blocks.1.attn.hook_pattern", lambda p, hook: _uniform_query(p))]
        same_model = model.run_with_hooks(batch.tokens, fwd_hooks=hooks)
        fresh_model = never_wrapped.run_with_hooks(batch.tokens, fwd_hooks=hooks)
    assert (edited - clean).abs().max() > 1e-3        # the edit matters
    assert torch.equal(edited, same_model)
    torch.testing.assert_close(edited, fresh_model, rtol=0, atol=1e-6)
