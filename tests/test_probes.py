"""Linear probes: exact recovery of planted signals, the closed form, the split, the model path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tfmatcomp as tm
from tfmatcomp.analyses import probes


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 4))
def test_planted_affine_map_is_recovered_exactly(seed, d, k):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(40, d, generator=g, dtype=torch.float64)
    w = torch.randn(d, k, generator=g, dtype=torch.float64)
    b = torch.randn(k, generator=g, dtype=torch.float64)
    probe = probes.fit_linear_probe(f.float(), (f @ w + b).float())
    # float32 inputs, float64 fit: exact up to the float32 rounding of the data
    assert torch.allclose(probe.weight, w, atol=1e-4) and torch.allclose(probe.bias, b, atol=1e-4)
    probe64 = probes.fit_linear_probe(f, f @ w + b)
    assert torch.allclose(probe64.weight, w, atol=1e-10) and torch.allclose(probe64.bias, b, atol=1e-10)
    m = probes.probe_metrics(probe64.predict(f), f @ w + b)
    assert m["mse"] < 1e-20 and (k == 1 or m["cos"] == pytest.approx(1.0))


def test_rank_deficient_features_give_min_norm_exact_fit():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(50, 3, generator=g, dtype=torch.float64)
    f = torch.cat([base, base[:, :1] * 2.0, torch.zeros(50, 1, dtype=torch.float64)], dim=1)  # rank 3 of 5
    y = base @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64) + 1.0
    probe = probes.fit_linear_probe(f, y)
    assert torch.allclose(probe.predict(f), y, atol=1e-10)
    # minimum norm: the weight lies in the row space (no mass on the zero column; x0 / 2x0 split 1:2)
    assert abs(probe.weight[4, 0].item()) < 1e-12
    assert probe.weight[3, 0].item() == pytest.approx(2 * probe.weight[0, 0].item())


def test_ridge_matches_normal_equations_with_unpenalised_bias():
    g = torch.Generator().manual_seed(1)
    f = torch.randn(30, 4, generator=g, dtype=torch.float64)
    y = torch.randn(30, 2, generator=g, dtype=torch.float64)
    lam = 3.0
    probe = probes.fit_linear_probe(f, y, ridge=lam)
    fc, yc = f - f.mean(0), y - y.mean(0)
    w = torch.linalg.solve(fc.T @ fc + lam * torch.eye(4, dtype=torch.float64), fc.T @ yc)
    assert torch.allclose(probe.weight, w, atol=1e-12)
    assert torch.allclose(probe.bias, y.mean(0) - f.mean(0) @ w, atol=1e-12)
    with pytest.raises(ValueError, match="ridge"):
        probes.fit_linear_probe(f, y, ridge=-1.0)
    with pytest.raises(ValueError, match="targets"):
        probes.fit_linear_probe(f, y[:5])


def test_metrics_sign_invariance_and_zero_targets():
    t = torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    p = torch.tensor([[-1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    m = probes.probe_metrics(p, t)
    assert m["cos"] == pytest.approx(1.0)                       # zero target row skipped
    assert m["mse"] == pytest.approx((4 + 1 + 2) / 6)
    assert probes.probe_metrics(p, t, sign_invariant=True)["mse"] == pytest.approx((0 + 1 + 2) / 6)
    assert np.isnan(probes.probe_metrics(p[:, :1], t[:, :1])["cos"])


def test_split_is_by_matrix_and_reproducible():
    a = probes.split_matrices(20, 0.25, torch.Generator().manual_seed(4))
    b = probes.split_matrices(20, 0.25, torch.Generator().manual_seed(4))
    c = probes.split_matrices(20, 0.25, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[1], c[1])
    assert len(a[1]) == 5 and set(a[0].tolist()).isdisjoint(a[1].tolist())
    with pytest.raises(ValueError, match="test_fraction"):
        probes.split_matrices(20, 1.0)


def test_targets(task4):
    batch = task4.sample(3, generator=torch.Generator().manual_seed(0))
    rows = probes.masked_row_targets(batch)
    x = batch.matrices
    masked_in = (batch.values * batch.observed).reshape(3, 4, 4)
    for pos in range(16):
        assert torch.equal(rows[:, pos], masked_in[:, pos // 4])
    v = probes.top_singular_vector_targets(batch)[:, 0]
    u, s, vh = torch.linalg.svd(x.double())
    assert torch.allclose(v.double().abs(), vh[:, 0].abs(), atol=1e-6)
    assert torch.allclose(v.norm(dim=-1), torch.ones(3), atol=1e-6)
    assert bool((v.gather(-1, v.abs().argmax(-1, keepdim=True)) > 0).all())
    left = probes.top_singular_vector_targets(batch, side="left")
    assert torch.allclose(left[:, 0].double().abs(), u[:, :, 0].abs(), atol=1e-6)


def test_hidden_states_follow_the_layer_convention(tiny_model, batch4):
    hs = probes.hidden_states(tiny_model, batch4.tokens, batch_size=3)
    _, cache = tiny_model.run_with_cache(batch4.tokens)
    assert sorted(hs) == [0, 1, 2]
    # chunks of 3 vs one batch of 8: equal up to float32 matmul blocking
    assert torch.allclose(hs[0], cache["hook_full_embed"], atol=1e-5)
    assert torch.allclose(hs[2], cache["blocks.1.hook_normalized_resid_post"], atol=1e-5)
    assert torch.allclose(hs[1], cache["blocks.1.hook_resid_pre"], atol=1e-5)
    with pytest.raises(ValueError, match="layers"):
        probes.hidden_states(tiny_model, batch4.tokens, layers=[3])


def test_probe_table_on_model_has_one_row_per_layer(tiny_model, task4):
    batch = task4.sample(32, generator=torch.Generator().manual_seed(0))
    table = probes.probe_layers(tiny_model, batch, ridge=1e-3, generator=torch.Generator().manual_seed(0))
    assert table["layer"].tolist() == [0, 1, 2]
    assert table["hook_name"].tolist() == ["hook_full_embed", "blocks.0.hook_normalized_resid_post",
                                           "blocks.1.hook_normalized_resid_post"]
    for col in ("masked_row_mse", "masked_row_cos", "value_masked_mse", "value_observed_mse",
                "value_observed_corr", "singular_vector_mse", "singular_vector_cos"):
        assert np.isfinite(table[col]).all(), col
    assert (table["n_train"] == 24).all() and (table["n_test"] == 8).all()
    assert tiny_model.active_hook_count() == 0
    with pytest.raises(ValueError, match="targets"):
        probes.probe_layers(tiny_model, batch, targets=["rows"])


def test_probe_layers_recovers_signals_planted_in_the_hidden_state(tiny_cfg, task4):
    """Overwrite the embedding output (layer 0) with features that contain the masked row, the
    value and the top singular vector linearly (plus random dimensions): the probes must be exact."""
    model = tm.HookedEncoder(tiny_cfg, seed=0).eval()
    batch = task4.sample(48, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(3)
    rows = probes.masked_row_targets(batch)                             # [b, 16, 4]
    vals = probes.value_targets(batch)                                  # [b, 16, 1]
    sv = probes.top_singular_vector_targets(batch)                      # [b, 16, 4]
    signal = torch.cat([rows, vals, sv], dim=-1)                        # 9 dims
    mix = torch.randn(9, 9, generator=g) + 3 * torch.eye(9)             # an invertible linear mix
    noise = torch.randn(48, 16, tiny_cfg.d_model - 9, generator=g)
    planted = torch.cat([signal @ mix, noise], dim=-1)

    def plant(act, hook):
        return planted[: act.shape[0]].to(act)

    model.add_hook("hook_full_embed", plant, is_permanent=True)
    try:
        table = probes.probe_layers(model, batch, layers=[0], generator=torch.Generator().manual_seed(0),
                                    batch_size=64)
    finally:
        model.reset_hooks(including_permanent=True)
    row = table.iloc[0]
    assert row["masked_row_mse"] < 1e-9 and row["masked_row_cos"] == pytest.approx(1.0, abs=1e-6)
    assert row["value_masked_mse"] < 1e-9 and row["value_observed_mse"] < 1e-9
    assert row["value_masked_corr"] == pytest.approx(1.0, abs=1e-6)
    assert row["singular_vector_mse"] < 1e-9 and row["singular_vector_cos"] == pytest.approx(1.0, abs=1e-6)


def test_probe_table_figure(tiny_model, task4):
    import plotly.graph_objects as go

    from tfmatcomp.plotting.probes import probe_table_figure

    batch = task4.sample(16, generator=torch.Generator().manual_seed(0))
    table = probes.probe_layers(tiny_model, batch, ridge=1e-2)
    fig = probe_table_figure(table)
    assert isinstance(fig, go.Figure)
    assert [a.text for a in fig.layout.annotations] == ["MSE (test)", "mean |cosine| (test)",
                                                        "Pearson r (test)"]
    mse_traces = [t for t in fig.data if t.xaxis == "x"]
    assert {t.name for t in mse_traces} == {"masked_row", "value_masked", "value_observed",
                                           "singular_vector"}
    assert list(mse_traces[0].x) == [0, 1, 2]
    with pytest.raises(ValueError, match="layer"):
        probe_table_figure(table.drop(columns="layer"))
