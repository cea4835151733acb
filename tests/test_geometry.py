"""Geometry measures: ScreeNOT reference values and invariances, planted synthetic structure,
incoherence / cluster measures, DCT, QK decomposition vs the model's real scores, rotated W_QK,
matrix-grid shares, and the summary table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import scipy.fft
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tfmatcomp as tm
from tfmatcomp.decomposition import accumulate, decompose
from tfmatcomp.geometry import (
    SUMMARY_COLUMNS,
    cluster_separation,
    cluster_similarity,
    gram_dct,
    incoherence,
    low_frequency_energy,
    max_screenot_k,
    normalized_gram,
    pos_pca,
    pseudo_noise,
    qk_components,
    qk_decomposition,
    relative_norm,
    rotated_wqk,
    rotated_wqk_head,
    row_column_r2,
    screenot,
    screenot_singular_values,
    stable_rank,
    summary_table,
)

F64 = torch.float64
REF_Y = [10, 9, 5, 4, 3, 2, 1, 0.5, 0.25, 0.1]


# ----------------------------------------------------------------------------- planted data


def planted(seed=0, T=64, d=64, C=256, K=4, k=5, eps=0.3, sigma=0.5):
    """h = mu + pos + ctx + noise with a rank-k smooth pos, K clusters of ctx, and a planted overlap
    of the cluster centres with pos's first direction (so the incoherence is not trivially 0)."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))
    t = torch.arange(T, dtype=F64)
    amps = torch.linspace(3, 1, k, dtype=F64)
    F = torch.stack([torch.cos(math.pi * (j + 1) * (t + 0.5) / T) for j in range(k)], 1)
    pos = (F * amps) @ Q[:, :k].T
    labels = torch.arange(C) % K
    signs = torch.tensor([(-1.0) ** i for i in range(K)], dtype=F64)[:, None]
    centers = 5 * (math.sqrt(1 - eps ** 2) * Q[:, k:k + K].T + eps * signs * Q[:, :1].T)
    spread = torch.randn(C, K, generator=g, dtype=F64) @ Q[:, k + K:k + 2 * K].T
    ctx = centers[labels] + spread
    ctx = ctx - ctx.mean(0)
    mu = torch.randn(d, generator=g, dtype=F64)
    h = mu + pos[None] + ctx[:, None] + sigma * torch.randn(C, T, d, generator=g, dtype=F64)
    return h, pos, ctx, labels


@pytest.fixture(scope="module")
def planted_data():
    return planted()


# ----------------------------------------------------------------------------- ScreeNOT


def test_screenot_reference_values():
    z = pseudo_noise(torch.tensor(REF_Y, dtype=F64), k=2, strategy="impute")
    assert z[-1] == pytest.approx(8.40482877, abs=1e-8)
    assert z[-2] == pytest.approx(6.25992105, abs=1e-8)
    assert list(z[:-2]) == sorted(REF_Y)[:-2]
    res = screenot_singular_values(torch.tensor(REF_Y), gamma=1.0, k=2)
    assert res.threshold == pytest.approx(10.51849, abs=5e-6)
    assert res.rank == 0


def test_screenot_strategies_and_errors():
    y = torch.tensor(REF_Y, dtype=F64)
    assert np.all(pseudo_noise(y, 2, "winsorize")[-2:] == 5.0)
    assert np.all(pseudo_noise(y, 2, "zero")[-2:] == 0.0)
    assert max_screenot_k(10) == 4 and max_screenot_k(11) == 4 and max_screenot_k(12) == 5
    pseudo_noise(y, 4)  # 2k + 1 = 9 < 10: allowed
    with pytest.raises(ValueError, match="k: must be an integer in \\[1, 4\\]"):
        pseudo_noise(y, 5)
    with pytest.raises(ValueError, match="strategy"):
        pseudo_noise(y, 2, "median")
    with pytest.raises(ValueError, match="gamma"):
        screenot_singular_values(y, gamma=1.5, k=2)
    with pytest.raises(ValueError, match="matrix"):
        screenot(torch.zeros(3))


@settings(max_examples=15, deadline=None)
@given(m=st.integers(12, 40), n=st.integers(12, 40), scale=st.floats(1e-3, 1e3),
       seed=st.integers(0, 10_000))
def test_screenot_transpose_and_scale(m, n, scale, seed):
    g = torch.Generator().manual_seed(seed)
    Y = torch.randn(m, n, generator=g, dtype=F64)
    Y[:, :2] += 5 * torch.randn(m, 1, generator=g, dtype=F64)
    k = min(3, max_screenot_k(min(m, n)))
    a, b, c = screenot(Y, k=k), screenot(Y.T, k=k), screenot(scale * Y, k=k)
    assert b.threshold == pytest.approx(a.threshold, rel=1e-9)
    assert b.rank == a.rank
    assert c.threshold == pytest.approx(scale * a.threshold, rel=1e-8)
    assert c.rank == a.rank


def test_screenot_recovers_planted_rank(planted_data):
    h, *_ = planted_data
    dec = decompose(h)
    res = screenot(dec.pos)  # k = 20 default, T = d = 64
    assert res.k == 20 and res.rank == 5
    assert res.singular_values[4] > res.threshold > res.singular_values[5]


# ----------------------------------------------------------------------------- planted geometry


def test_planted_clusters_and_incoherence(planted_data):
    h, pos, ctx, labels = planted_data
    dec = decompose(h)
    sim = cluster_similarity(dec.ctx, labels)
    assert sim.intra > 0.6 and sim.inter < 0.4 and sim.intra > sim.inter + 0.3
    planted_inc = incoherence(pos, ctx)
    measured = incoherence(dec.pos, dec.ctx)
    assert planted_inc.max > 0.2  # the planted overlap is real
    assert abs(measured.max - planted_inc.max) < 0.1
    assert abs(measured.mean - planted_inc.mean) < 0.05
    # shuffled labels lose the cluster structure; separation drops by orders of magnitude
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    assert cluster_separation(dec.ctx, labels) > 100 * cluster_separation(dec.ctx, labels[perm])
    assert 1 < stable_rank(dec.pos) < 5
    rn = relative_norm(dec.pos, h)
    assert 0 < rn < 1
    assert rn == pytest.approx(relative_norm(dec.pos, gram=dec.gram(), n_rows=dec.n_tokens), rel=1e-10)


def test_cluster_similarity_excludes_self_pairs():
    x = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    s = cluster_similarity(x, torch.tensor([0, 0, 1]))
    assert s.intra == pytest.approx(1 / math.sqrt(2))  # one pair (0, 1); self-pairs would give > 0.8
    assert s.inter == pytest.approx((0 + 1 / math.sqrt(2)) / 2)
    signed = cluster_similarity(torch.tensor([[1.0, 0], [-1.0, 0], [0, 1.0]]), torch.tensor([0, 0, 1]),
                                absolute=False)
    assert signed.intra == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="labels"):
        cluster_similarity(x, torch.tensor([0, 1]))


def test_cluster_separation_by_hand():
    # 1-D: clusters {0, 2} and {10, 12}: means 1, 11, overall 6; Sigma_W = 1, Sigma_B = 25
    x = torch.tensor([[0.0], [2.0], [10.0], [12.0]])
    labels = torch.tensor([0, 0, 1, 1])
    assert cluster_separation(x, labels, ridge=0) == pytest.approx(25.0)
    assert cluster_separation(x, labels, ridge=0.5) == pytest.approx(25.0 / 1.5)
    with pytest.raises(ValueError, match="singular"):
        cluster_separation(torch.tensor([[0.0, 0], [0, 0], [1, 0], [1, 0]]), labels, ridge=0)


def test_incoherence_and_gram_exact():
    pos = torch.tensor([[1.0, 0.0, 0.0], [-2.0, 0.0, 0.0]])
    ctx = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    inc = incoherence(pos, ctx)
    assert inc.max == pytest.approx(1 / math.sqrt(2))
    assert inc.mean == pytest.approx(2 / math.sqrt(2) / 4)
    G = normalized_gram(pos, ctx)
    assert G.shape == (4, 4)
    assert torch.allclose(torch.diagonal(G), torch.ones(4, dtype=F64))
    assert G[0, 1] == pytest.approx(-1.0) and G[0, 2] == pytest.approx(1 / math.sqrt(2))
    assert torch.allclose(G, G.T)


def test_relative_norm_bounds_and_centering():
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(6, 5, generator=g, dtype=F64)
    pos -= pos.mean(0)
    mu = 10 * torch.randn(5, generator=g, dtype=F64)
    h = (mu + pos).expand(7, 6, 5)  # pure position: relative norm exactly 1 when centered
    dec = decompose(h)
    assert relative_norm(dec.pos, h) == pytest.approx(1.0, rel=1e-10)
    assert relative_norm(dec.pos, h, centered=False) < 0.9  # the uncentered variant is smaller
    assert relative_norm(dec.pos, gram=dec.gram(False), n_rows=dec.n_tokens) == pytest.approx(
        relative_norm(dec.pos, h, centered=False), rel=1e-10)
    with pytest.raises(ValueError, match="exactly one"):
        relative_norm(dec.pos)


def test_stable_rank_exact():
    assert stable_rank(torch.eye(7)) == pytest.approx(7.0)
    assert stable_rank(torch.outer(torch.arange(1.0, 5), torch.ones(3))) == pytest.approx(1.0)
    assert stable_rank(torch.diag(torch.tensor([2.0, 1.0]))) == pytest.approx(1.25)


# ----------------------------------------------------------------------------- DCT


def test_gram_dct_matches_scipy_and_parseval():
    pos = torch.randn(12, 5, generator=torch.Generator().manual_seed(0), dtype=F64)
    c = gram_dct(pos)
    G = normalized_gram(pos)
    ref = scipy.fft.dctn(G.numpy(), type=2, norm="ortho")
    assert np.allclose(c.numpy(), ref)
    assert float((c ** 2).sum()) == pytest.approx(float((G ** 2).sum()))
    unnorm = gram_dct(pos, normalize=False)
    assert np.allclose(unnorm.numpy(), scipy.fft.dctn((pos @ pos.T).numpy(), type=2, norm="ortho"))
    assert low_frequency_energy(c, 12) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="k:"):
        low_frequency_energy(c, 13)


def test_smooth_positions_concentrate_in_low_frequencies(planted_data):
    h, *_ = planted_data
    smooth = low_frequency_energy(gram_dct(decompose(h).pos), 6)
    rough = low_frequency_energy(gram_dct(torch.randn(64, 64, generator=torch.Generator().manual_seed(1))), 6)
    assert smooth > 0.95 and rough < 0.2


# ----------------------------------------------------------------------------- QK


@pytest.fixture()
def biased_model(tiny_cfg):
    """A random model with non-zero biases everywhere (so bias placement is tested)."""
    model = tm.HookedEncoder(tiny_cfg, seed=1).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("b"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize("mean_side,bias_side", [("pos", "pos"), ("cvec", "pos"), ("pos", "cvec")])
def test_qk_components_sum_to_real_scores(biased_model, task4, mean_side, bias_side):
    g = torch.Generator().manual_seed(0)
    names = [f"blocks.{l}.hook_resid_pre" for l in range(2)]
    acc = accumulate(biased_model, [task4.sample(32, generator=g) for _ in range(2)], names,
                     progress=False)
    tokens = task4.sample(3, generator=g).tokens
    for layer in range(2):
        qk = qk_decomposition(biased_model, tokens, layer, acc.result(names[layer]),
                              mean_side=mean_side, bias_side=bias_side)
        assert qk.pos_pos.shape == (3, 4, 16, 16) and qk.heads == (0, 1, 2, 3)
        assert torch.allclose(qk.total(), qk.scores.double(), atol=2e-5, rtol=1e-5)
        # the pos-pos part does not depend on the input (same for every batch element)
        assert torch.allclose(qk.pos_pos[0], qk.pos_pos[1])
        assert qk.cvec_cvec.abs().max() > 1e-3  # not trivially all in one component


def test_qk_decomposition_heads_padding_and_dropped_positions(biased_model, task4):
    g = torch.Generator().manual_seed(1)
    acc = accumulate(biased_model, [task4.sample(32, generator=g)], ["blocks.1.hook_resid_pre"],
                     drop_first=1, progress=False)
    tokens = task4.sample(2, generator=g).tokens
    mask = torch.ones_like(tokens)
    mask[1, -3:] = 0
    qk = qk_decomposition(biased_model, tokens, 1, acc.result(), heads=[2, 0], attention_mask=mask)
    assert qk.heads == (2, 0) and qk.scores.shape == (2, 2, 16, 16)
    valid = mask.bool()[:, None, None, :].expand_as(qk.scores)
    total = qk.total()
    assert torch.allclose(total[valid], qk.scores.double()[valid], atol=2e-5)
    assert bool((qk.scores[~valid] < -1e30).all())
    # position 0 was dropped: no pos part there, so pos-pos row 0 is only mu + bias terms
    dec = acc.result()
    assert dec.start == 1 and dec.pos.shape[0] == 15
    with pytest.raises(ValueError, match="layer"):
        qk_decomposition(biased_model, tokens, 2, dec)
    with pytest.raises(ValueError, match="heads"):
        qk_decomposition(biased_model, tokens, 1, dec, heads=[4])


def test_qk_components_plain_tensors_match_direct():
    g = torch.Generator().manual_seed(0)
    x_pos, x_cvec = torch.randn(2, 2, 5, 8, generator=g, dtype=F64)
    W_Q, W_K = torch.randn(2, 3, 8, 4, generator=g, dtype=F64)
    b_Q, b_K = torch.randn(2, 3, 4, generator=g, dtype=F64)
    x = x_pos + x_cvec
    q = torch.einsum("btd,hde->bhte", x, W_Q) + b_Q[None, :, None]
    k = torch.einsum("btd,hde->bhte", x, W_K) + b_K[None, :, None]
    direct = q @ k.transpose(-1, -2) / 2
    for side in ("pos", "cvec"):
        c = qk_components(x_pos, x_cvec, W_Q, W_K, b_Q, b_K, bias_side=side)
        assert torch.allclose(c.total(), direct)
    c = qk_components(x_pos, torch.zeros_like(x_cvec), W_Q, W_K, b_Q, b_K)
    assert torch.allclose(c.pos_pos, direct.new_tensor(0) + c.total())
    assert c.cvec_cvec.abs().max() == 0


# ----------------------------------------------------------------------------- rotated W_QK


def test_rotated_wqk_planted_alignment():
    g = torch.Generator().manual_seed(0)
    d, T, K, dh = 48, 32, 4, 16
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))
    pos = torch.randn(T, K, generator=g, dtype=F64) * torch.tensor([8.0, 6, 4, 3], dtype=F64) @ Q[:, :K].T
    # W_Q W_K^T / sqrt(dh) = V L V^T + small noise, V = pos's right singular vectors
    A = Q[:, :K] @ torch.randn(K, dh, generator=g, dtype=F64)
    B = Q[:, :K] @ torch.randn(K, dh, generator=g, dtype=F64)
    W_Q = A + 0.02 * torch.randn(d, dh, generator=g, dtype=F64)
    W_K = B + 0.02 * torch.randn(d, dh, generator=g, dtype=F64)
    r = rotated_wqk(W_Q, W_K, pos)
    assert torch.allclose(r.W, W_Q @ W_K.T / 4)
    assert torch.allclose(torch.diagonal(r.rotated + r.basis.T @ torch.diag(r.diagonal) @ r.basis),
                          torch.diagonal(r.basis.T @ r.W @ r.basis))
    assert torch.allclose(r.basis.T @ r.basis, torch.eye(d, dtype=F64), atol=1e-10)
    assert r.top_left_fraction(K) > 0.95
    # a head aligned with directions orthogonal to pos: survivors sit outside the top-left block
    other = rotated_wqk(Q[:, K:2 * K] @ torch.randn(K, dh, generator=g, dtype=F64),
                        Q[:, K:2 * K] @ torch.randn(K, dh, generator=g, dtype=F64), pos)
    assert other.denoised.count_nonzero() > 0 and other.top_left_fraction(K) < 0.05
    # pure Gaussian noise hardly survives the universal threshold
    rand = rotated_wqk(torch.randn(d, dh, generator=g, dtype=F64), torch.randn(d, dh, generator=g, dtype=F64), pos)
    assert rand.denoised.count_nonzero() < 0.01 * d * d
    assert r.threshold == pytest.approx(math.sqrt(2 * math.log(d * d)) * float(r.rotated.std()))


def test_rotated_wqk_head_uses_model_weights(tiny_model):
    pos = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    r = rotated_wqk_head(tiny_model, 1, 3, pos)
    W = tiny_model.W_Q[1, 3].double() @ tiny_model.W_K[1, 3].double().T / math.sqrt(8)
    assert torch.allclose(r.W, W)
    with pytest.raises(ValueError, match="head"):
        rotated_wqk_head(tiny_model, 1, 4, pos)


# ----------------------------------------------------------------------------- matrix grid


def test_row_column_shares_planted():
    g = torch.Generator().manual_seed(0)
    n, d = 5, 7
    R = torch.randn(n, d, generator=g, dtype=F64)
    R -= R.mean(0)
    C = 2 * torch.randn(n, d, generator=g, dtype=F64)
    C -= C.mean(0)
    pos = (R[:, None] + C[None, :]).reshape(n * n, d)
    s = row_column_r2(pos, n)
    total = n * (R ** 2).sum() + n * (C ** 2).sum()
    assert s.row == pytest.approx(float(n * (R ** 2).sum() / total))
    assert s.col == pytest.approx(float(n * (C ** 2).sum() / total))
    assert s.interaction == pytest.approx(0.0, abs=1e-12)
    inter = torch.randn(n, n, d, generator=g, dtype=F64)
    inter = inter - inter.mean(0, keepdim=True) - inter.mean(1, keepdim=True) + inter.mean((0, 1))
    s2 = row_column_r2(inter.reshape(n * n, d), n)
    assert s2.row == pytest.approx(0, abs=1e-12) and s2.col == pytest.approx(0, abs=1e-12)
    with pytest.raises(ValueError, match="pos"):
        row_column_r2(pos[1:], n)


def test_pos_pca_labels():
    pos = torch.randn(12, 6, generator=torch.Generator().manual_seed(0))
    df = pos_pca(pos, 3, n_rows=3, n_cols=4)
    assert list(df.columns) == ["t", "row", "col", "pc1", "pc2", "pc3"]
    assert df.loc[7, "row"] == 1 and df.loc[7, "col"] == 3
    ratios = df.attrs["explained_variance_ratio"]
    assert ratios == sorted(ratios, reverse=True) and 0 < sum(ratios) <= 1
    assert np.allclose(df[["pc1", "pc2", "pc3"]].mean().to_numpy(), 0, atol=1e-9)


# ----------------------------------------------------------------------------- summary table


def test_summary_table_sources_agree(planted_data):
    h, _, _, labels = planted_data
    layers = [h[:, :, :], h.flip(-1)]
    df = summary_table(layers, labels)
    assert tuple(df.columns) == SUMMARY_COLUMNS and len(df) == 2
    row = df.iloc[0]
    assert row["rank_estimate"] == 5 and row["screenot_k"] == 20
    assert row["intra_similarity"] > row["inter_similarity"]
    # the same numbers from a streaming accumulator fed in chunks
    from tfmatcomp.decomposition import DecompositionAccumulator
    acc = DecompositionAccumulator()
    for a, b in zip(h.split(100), h.flip(-1).split(100)):
        acc.update([a, b])
    df2 = summary_table(acc, labels)
    num = [c for c in SUMMARY_COLUMNS if c not in ("name", "rank_note")]
    pd.testing.assert_frame_equal(df[num], df2[num], rtol=1e-8)
    # the planted pos is smooth: the flipped feature axis changes nothing rotation-invariant
    assert df.loc[1, "rank_estimate"] == 5
    assert df.loc[1, "stable_rank"] == pytest.approx(df.loc[0, "stable_rank"])


def test_summary_table_small_T_clips_k(tiny_model, task4):
    g = torch.Generator().manual_seed(0)
    df = tm_summary(tiny_model, task4, g)
    assert (df["screenot_k"] == max_screenot_k(16)).all()
    assert df["inter_similarity"].isna().all()
    assert ((df["relative_norm"] > 0) & (df["relative_norm"] <= 1)).all()
    assert ((df["incoherence_max"] >= df["incoherence_mean"])).all()


def tm_summary(model, task, g):
    from tfmatcomp.geometry import model_summary_table
    return model_summary_table(model, [task.sample(32, generator=g) for _ in range(2)], progress=False)


def test_a_rank_of_zero_says_why():
    from tfmatcomp.geometry import layer_summary

    g = torch.Generator().manual_seed(0)
    noise = decompose(torch.randn(64, 48, 48, generator=g, dtype=torch.float64))
    row = layer_summary(noise)
    assert row["rank_estimate"] == 0 and "no low-rank positional structure" in row["rank_note"]
    t = torch.arange(48, dtype=torch.float64)[:, None]
    waves = torch.cat([torch.sin(t / 5), torch.cos(t / 7)], 1) @ torch.randn(2, 48, generator=g,
                                                                               dtype=torch.float64)
    structured = decompose(waves[None] * 3 + 0.01 * torch.randn(64, 48, 48, generator=g,
                                                                dtype=torch.float64))
    row = layer_summary(structured)
    assert row["rank_estimate"] >= 1 and row["rank_note"] == ""
