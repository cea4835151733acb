"""The decomposition h = mu + pos + ctx + resid: exact identity, zero sums, padding semantics,
streaming == batch, second-pass residuals, bounded accumulator memory, and the model paths."""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tfmatcomp as tm
from tfmatcomp.decomposition import (
    DecompositionAccumulator,
    accumulate,
    decompose,
    decompose_cache,
    residual_pass,
    residual_stream_names,
)

F64 = torch.float64


def _h(C, T, d, seed=0, dtype=torch.float32):
    return torch.randn(C, T, d, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 3 + 1


def _random_mask(C, T, seed=0):
    """Right-padded masks with every context keeping at least one position."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (C,), generator=g)
    return torch.arange(T)[None, :] < lengths[:, None]


# ----------------------------------------------------------------------------- batch


@settings(max_examples=25, deadline=None)
@given(C=st.integers(1, 9), T=st.integers(1, 9), d=st.integers(1, 6), seed=st.integers(0, 1000),
       drop=st.integers(0, 3), dtype=st.sampled_from([torch.float32, F64]))
def test_identity_and_zero_sums(C, T, d, seed, drop, dtype):
    drop = min(drop, T - 1)
    h = _h(C, T, d, seed, dtype)
    dec = decompose(h, drop_first=drop)
    target = h[:, drop:].to(F64)
    assert dec.resid.dtype == F64 and dec.start == drop
    assert torch.allclose(dec.reconstruct(), target, rtol=0, atol=1e-12)
    assert torch.allclose(dec.mu + dec.pos[None] + dec.cvec, target, rtol=0, atol=1e-12)
    assert dec.pos.sum(0).abs().max() < 1e-12
    assert dec.ctx.sum(0).abs().max() < 1e-12
    # residuals have zero mean over contexts at every position and over positions in every context
    assert dec.resid.sum(0).abs().max() < 1e-12 and dec.resid.sum(1).abs().max() < 1e-12


def test_definitions_by_hand():
    h = torch.tensor([[[1.0], [3.0]], [[5.0], [11.0]]])  # C=2, T=2, d=1
    dec = decompose(h)
    assert dec.mu.item() == 5.0
    assert dec.pos.squeeze().tolist() == [-2.0, 2.0]
    assert dec.ctx.squeeze().tolist() == [-3.0, 3.0]
    assert dec.resid.squeeze().tolist() == [[1.0, -1.0], [-1.0, 1.0]]


def test_masked_means_over_valid_entries_only():
    h = _h(6, 5, 3, seed=1, dtype=F64)
    mask = _random_mask(6, 5, seed=1)
    h_nan = torch.where(mask[..., None], h, torch.full_like(h, float("nan")))  # padding holds NaN
    dec = decompose(h_nan, mask)
    for t in range(5):
        rows = h[mask[:, t], t]
        valid_mu = h[mask].mean(0)
        assert torch.allclose(dec.pos[t], rows.mean(0) - valid_mu if len(rows) else torch.zeros(3, dtype=F64))
    for c in range(6):
        assert torch.allclose(dec.ctx[c], h[c, mask[c]].mean(0) - h[mask].mean(0))
    assert not torch.isnan(dec.resid).any() and bool((dec.resid[~mask] == 0).all())
    assert torch.allclose(dec.reconstruct()[mask], h[mask], atol=1e-12)
    # the zero-sum constraints hold with the documented weights
    assert torch.allclose((dec.pos_counts[:, None] * dec.pos).sum(0), torch.zeros(3, dtype=F64), atol=1e-12)
    assert torch.allclose((dec.ctx_counts[:, None] * dec.ctx).sum(0), torch.zeros(3, dtype=F64), atol=1e-12)
    assert dec.n_tokens == int(mask.sum())
    # an all-ones mask is the same as no mask
    full = decompose(h, torch.ones(6, 5, dtype=torch.long))
    ref = decompose(h)
    assert torch.allclose(full.pos, ref.pos) and torch.allclose(full.resid, ref.resid)


def test_centered_gram():
    h = _h(4, 3, 5, seed=2, dtype=F64)
    dec = decompose(h)
    M = (h - h.mean((0, 1))).reshape(-1, 5)
    assert torch.allclose(dec.gram(), M.T @ M)
    assert torch.allclose(dec.gram(centered=False), h.reshape(-1, 5).T @ h.reshape(-1, 5))


def test_decompose_errors():
    h = _h(3, 4, 2)
    with pytest.raises(ValueError, match="h: expected"):
        decompose(h[0])
    with pytest.raises(ValueError, match="mask: expected shape"):
        decompose(h, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask: must be bool"):
        decompose(h, torch.full((3, 4), 0.5))
    with pytest.raises(ValueError, match="drop_first: must be an integer in \\[0, 3\\]"):
        decompose(h, drop_first=4)
    with pytest.raises(ValueError, match="no valid entries"):
        decompose(h, torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="floating"):
        decompose(torch.ones(2, 2, 2, dtype=torch.long))


# ----------------------------------------------------------------------------- streaming


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=6), T=st.integers(2, 7),
       d=st.integers(1, 5), drop=st.integers(0, 1), masked=st.booleans(),
       keep_ctx=st.booleans(), seed=st.integers(0, 1000))
def test_streaming_equals_batch(sizes, T, d, drop, masked, keep_ctx, seed):
    C = sum(sizes)
    layers = {"a": _h(C, T, d, seed), "b": _h(C, T, d + 1, seed + 1, F64)}
    mask = _random_mask(C, T, seed) if masked else None
    assume(mask is None or bool(mask[:, drop:].any()))  # decompose refuses data with no valid entry
    acc = DecompositionAccumulator(drop_first=drop, keep_ctx=keep_ctx)
    start = 0
    for n in sizes:
        sl = slice(start, start + n)
        acc.update({k: v[sl] for k, v in layers.items()}, None if mask is None else mask[sl])
        start += n
    assert acc.names == ["a", "b"] and acc.n_contexts("b") == C
    for name, h in layers.items():
        ref = decompose(h, mask, drop_first=drop)
        got = acc.result(name)
        assert torch.allclose(got.mu, ref.mu, atol=1e-12)
        assert torch.allclose(got.pos, ref.pos, atol=1e-12)
        assert torch.equal(got.pos_counts, ref.pos_counts)
        # float32 layers: each batch's Gram in float32 (exact_gram=False), so float32 rounding
        # relative to the whole matrix; float64 layers: float64 throughout
        rel = 1e-5 if h.dtype == torch.float32 else 1e-12
        err = (got.centered_gram - ref.centered_gram).abs().max().item()
        assert err <= rel * ref.centered_gram.abs().max().item() + 1e-9
        assert got.n_tokens == ref.n_tokens and got.start == drop
        if keep_ctx:
            assert torch.allclose(got.ctx, ref.ctx, atol=1e-12)
            assert torch.equal(got.ctx_counts, ref.ctx_counts)
        else:
            assert got.ctx is None
        # second pass on a subset of contexts reproduces the batch residuals exactly
        sub = slice(0, min(3, C))
        second = acc.residuals(name, h[sub], None if mask is None else mask[sub])
        assert torch.allclose(second.resid, ref.resid[sub], atol=1e-12)
        assert torch.allclose(second.ctx, ref.ctx[sub], atol=1e-12)


def test_streaming_with_varying_lengths_equals_padded_batch():
    # batches of different T (e.g. tokenizer padding="longest"): shorter batches count as padded
    parts = [_h(3, 4, 2, seed=0, dtype=F64), _h(2, 6, 2, seed=1, dtype=F64), _h(4, 5, 2, seed=2, dtype=F64)]
    acc = DecompositionAccumulator()
    for p in parts:
        acc.update(p)
    T = 6
    padded = torch.cat([torch.nn.functional.pad(p, (0, 0, 0, T - p.shape[1])) for p in parts])
    mask = torch.cat([torch.arange(T)[None].expand(p.shape[0], T) < p.shape[1] for p in parts])
    ref = decompose(padded, mask)
    got = acc.result(0)
    assert torch.allclose(got.pos, ref.pos) and torch.allclose(got.ctx, ref.ctx)
    assert torch.allclose(got.mu, ref.mu)


def test_accumulator_memory_does_not_grow_with_batches():
    def run(n_batches, keep_ctx):
        acc = DecompositionAccumulator(keep_ctx=keep_ctx)
        for i in range(n_batches):
            acc.update([_h(8, 10, 6, seed=i), _h(8, 10, 6, seed=100 + i)])
        return acc

    small, large = run(2, False), run(40, False)
    assert len(small.retained_tensors()) == len(large.retained_tensors())
    assert small.nbytes() == large.nbytes()
    # with ctx kept: same number of tensors; only the per-context rows grow (O(C d), doubling)
    small, large = run(2, True), run(40, True)
    assert len(small.retained_tensors()) == len(large.retained_tensors())
    growth = large.nbytes() - small.nbytes()
    per_layer_ctx_capacity = large._states[0].ctx_sum.shape[0]
    assert per_layer_ctx_capacity < 2 * 8 * 40
    assert growth <= 2 * (per_layer_ctx_capacity * (6 + 1) * 8)


def test_accumulator_state_flat_in_contexts_through_a_model(tiny_model, task4):
    """Streaming 8 or 64 contexts through the model leaves the same state (keep_ctx=False); with
    keep_ctx=True only the per-context means (d + 1 numbers per context and layer) are added."""
    def stream(n_batches, keep_ctx):
        g = torch.Generator().manual_seed(0)
        return accumulate(tiny_model, (task4.sample(8, generator=g) for _ in range(n_batches)),
                          keep_ctx=keep_ctx, progress=False)

    small, large = stream(1, False), stream(8, False)
    assert (small.n_contexts(), large.n_contexts()) == (8, 64)
    assert [tuple(t.shape) for t in small.retained_tensors()] == \
        [tuple(t.shape) for t in large.retained_tensors()]
    assert small.nbytes() == large.nbytes()
    small, large = stream(1, True), stream(8, True)
    d, layers = tiny_model.cfg.d_model, len(large.names)
    capacity = large._states[large.names[0]].ctx_sum.shape[0]
    assert 64 <= capacity < 2 * 64
    assert large.nbytes() - small.nbytes() <= layers * capacity * (d + 1) * 8
    assert torch.equal(large.result().centered_gram, large.result().centered_gram.T)


def test_running_gram_both_paths_and_nan_batches():
    from tfmatcomp.decomposition._gram import RunningGram

    x = _h(40, 3, 7, dtype=F64).reshape(-1, 7)
    grams = [RunningGram(7, F64, torch.device("cpu")) for _ in range(2)]
    grams[1]._syrk = None  # the GEMM path taken on CUDA
    for g in grams:
        for rows in x.split(25):
            g.add(rows)
        assert torch.allclose(g.full(), x.T @ x, rtol=0, atol=1e-10)
    # a batch with NaN is refused whole: no partial sums, and a first one registers no layer
    acc = DecompositionAccumulator(drop_first=1)
    bad = _h(2, 4, 3)
    bad[1, 0, 2] = float("nan")  # in a dropped position: still checked, as in decompose()
    with pytest.raises(ValueError, match="1 NaN"):
        acc.update({"a": bad})
    assert acc.names == []
    acc.update({"a": _h(2, 4, 3)})
    before = acc.result("a")
    with pytest.raises(ValueError, match="must be finite"):
        acc.update({"a": bad})
    after = acc.result("a")
    assert after.n_contexts == 2 and torch.equal(after.pos, before.pos)


def test_float32_gram_is_shifted_so_a_large_mean_does_not_cancel():
    """The default (exact_gram=False) forms each batch's Gram in float32 around a shift: with a
    mean 1000x the spread, an unshifted float32 Gram loses the centered second moment entirely,
    the shifted one keeps it to float32 rounding; exact_gram=True matches decompose in float64."""
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(64, 8, 6, generator=g) + 1000 * torch.randn(6, generator=g)).float()
    ref = decompose(h).centered_gram                                # float64 from the float32 values
    scale = ref.abs().max().item()
    rows = h.reshape(-1, 6)
    mean = rows.double().mean(0)
    unshifted = (rows.T @ rows).double() - rows.shape[0] * torch.outer(mean, mean)
    assert (unshifted - ref).abs().max().item() > 0.1 * scale        # the data defeat naive float32
    for exact, rtol in ((False, 1e-5), (True, 1e-8)):
        acc = DecompositionAccumulator(exact_gram=exact)
        for chunk in h.split(10):
            acc.update({"a": chunk})
        got = acc.result("a").centered_gram
        assert (got - ref).abs().max().item() <= rtol * scale, exact
        assert torch.allclose(acc.result("a").pos, decompose(h).pos, rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="exact_gram"):
        DecompositionAccumulator(exact_gram=1)


def test_accumulate_model_retains_no_activations(tiny_model, task4):
    g = torch.Generator().manual_seed(0)

    def live_tensors():
        gc.collect()
        return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))

    acc = DecompositionAccumulator(keep_ctx=False)
    accumulate(tiny_model, [task4.sample(8, generator=g)], accumulator=acc, progress=False)
    before, bytes_before = live_tensors(), acc.nbytes()
    accumulate(tiny_model, (task4.sample(8, generator=g) for _ in range(10)), accumulator=acc,
               progress=False)
    assert live_tensors() <= before
    assert acc.nbytes() == bytes_before and acc.n_contexts() == 88
    assert tiny_model.active_hook_count() == 0


# ----------------------------------------------------------------------------- models


def test_accumulate_model_equals_cache_decomposition(tiny_model, task4):
    g = torch.Generator().manual_seed(0)
    batches = [task4.sample(n, generator=g) for n in (5, 11, 7)]
    names = residual_stream_names(tiny_model)
    assert names == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre",
                     "blocks.1.hook_normalized_resid_post"]
    acc = accumulate(tiny_model, batches, progress=False)
    tokens = torch.cat([b.tokens for b in batches])
    _, cache = tiny_model.run_with_cache(tokens)
    for name in names:
        ref = decompose(cache[name])
        got = acc.result(name)
        assert torch.allclose(got.pos, ref.pos, atol=1e-6) and torch.allclose(got.ctx, ref.ctx, atol=1e-6)
    assert torch.equal(cache["hook_full_embed"], cache["blocks.0.hook_resid_pre"])
    # second pass through the model
    out = residual_pass(tiny_model, acc, batches[1])
    ref = decompose(cache["blocks.1.hook_resid_pre"])
    assert torch.allclose(out["blocks.1.hook_resid_pre"].resid, ref.resid[5:16], atol=1e-6)
    assert tiny_model.active_hook_count() == 0


def test_accumulate_with_attention_masks(tiny_model, task4):
    g = torch.Generator().manual_seed(3)
    tokens = task4.sample(6, generator=g).tokens
    mask = _random_mask(6, 16, seed=3).long()
    acc = accumulate(tiny_model, [(tokens[:4], mask[:4]), {"input_ids": tokens[4:], "attention_mask": mask[4:]}],
                     ["blocks.1.hook_resid_pre"], drop_first=1, progress=False)
    _, cache = tiny_model.run_with_cache(tokens, attention_mask=mask)
    ref = decompose(cache["blocks.1.hook_resid_pre"], mask, drop_first=1)
    got = acc.result()
    assert torch.allclose(got.pos, ref.pos, atol=1e-6) and torch.allclose(got.ctx, ref.ctx, atol=1e-6)
    assert torch.equal(got.pos_counts, ref.pos_counts)


def test_decompose_cache_by_name_and_layer(tiny_model, batch4):
    _, cache = tiny_model.run_with_cache(batch4.tokens)
    a = decompose_cache(cache, "resid_pre", 1)
    b = decompose_cache(cache, "hook_resid_pre", layer=1)
    c = decompose_cache(cache, "blocks.1.hook_resid_pre")
    assert a.name == b.name == c.name == "blocks.1.hook_resid_pre"
    assert torch.equal(a.pos, c.pos) and torch.equal(b.resid, c.resid)
    with pytest.raises(ValueError, match="not in the cache"):
        decompose_cache(cache, "resid_pre", 7)
    with pytest.raises(ValueError, match="select a head"):
        decompose_cache(cache, "attn.hook_z", 0)
    with pytest.raises(ValueError, match="either a full hook name"):
        decompose_cache(cache, "blocks.0.hook_resid_pre", 0)


def test_accumulate_errors_and_hook_cleanup(tiny_model, task4):
    with pytest.raises(tm.UnknownHookError):
        accumulate(tiny_model, [task4.sample(2)], ["blocks.0.hook_resid_typo"], progress=False)
    assert tiny_model.active_hook_count() == 0
    with pytest.raises(ValueError, match="run_with_hooks"):
        accumulate(torch.nn.Linear(2, 2), [torch.zeros(1, 2)], progress=False)
    with pytest.raises(ValueError, match="batches"):
        accumulate(tiny_model, ["not a batch"], progress=False)
    # plain forward hooks are removed even when the forward pass raises
    lin = torch.nn.Linear(3, 3)
    with pytest.raises(RuntimeError):
        accumulate(lin, [torch.zeros(2, 4, 5)], modules={"x": lin}, progress=False)
    assert len(lin._forward_hooks) == 0
    acc = DecompositionAccumulator()
    with pytest.raises(ValueError, match="nothing accumulated"):
        acc.result()
    acc.update(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="feature size"):
        acc.update(torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="never accumulated"):
        acc.result("x")
