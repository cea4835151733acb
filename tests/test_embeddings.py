"""Embedding analyses on models with planted embedding geometry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.analyses import embeddings as emb


def _plant_token_geometry(model, a=4.0, b=1.0, seed=0):
    """W_E[encode(v)] = a |v| e0 + b sign(v) e1 + tiny noise, for the grid -1.5..1.5."""
    tok = tm.ValueTokenizer()
    vals = emb.value_grid(-1.5, 1.5)
    ids = tok.encode(vals)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = torch.randn(len(vals), model.cfg.d_model, generator=g) * 1e-4
        w[:, 0] += a * vals.abs().float()
        w[:, 1] += b * torch.sign(vals).float()
        model.embed.W_E[ids] = w
    return vals


def test_value_grid_and_ids_use_the_tokenizer():
    vals = emb.value_grid(-1.5, 1.5)
    assert len(vals) == 301 and vals[0] == -1.5 and vals[-1] == 1.5
    assert torch.equal(tm.ValueTokenizer().encode(vals), torch.arange(851, 1152))
    with pytest.raises(ValueError, match="v_min"):
        emb.value_grid(-11, 0)


def test_token_norms_are_exact_and_symmetric(tiny_model):
    vals = _plant_token_geometry(tiny_model, a=2.0, b=1.0)
    df = emb.token_embedding_norms(tiny_model)
    expected = np.sqrt((2 * vals.abs().numpy()) ** 2 + np.sign(vals.numpy()) ** 2)
    assert df["norm"].to_numpy() == pytest.approx(expected, abs=1e-3)
    assert df["norm"].to_numpy() == pytest.approx(df["norm"].to_numpy()[::-1], abs=1e-3)
    assert df["token_id"].tolist() == tm.ValueTokenizer().encode(vals).tolist()
    sub = emb.token_embedding_norms(tiny_model, [0.44, -0.24])
    assert sub["token_id"].tolist() == [1045, 977]


def test_token_pca_finds_sign_and_magnitude_axes(tiny_model):
    _plant_token_geometry(tiny_model, a=4.0, b=1.0)       # magnitude variance 3 > sign variance 1
    res = emb.token_embedding_pca(tiny_model)
    assert res.magnitude_axis == 0 and res.sign_axis == 1
    corr = res.correlations.set_index("pc")
    assert abs(corr.loc[1, "corr_magnitude"]) == pytest.approx(1.0, abs=1e-4)
    assert abs(corr.loc[2, "corr_sign"]) > 0.99
    assert corr["explained_variance_ratio"].sum() == pytest.approx(1.0, abs=1e-4)
    # swap which feature dominates: the axes swap
    _plant_token_geometry(tiny_model, a=1.0, b=3.0)
    res2 = emb.token_embedding_pca(tiny_model)
    assert res2.sign_axis == 0 and res2.magnitude_axis == 1


def test_positional_norms_pca_and_similarity(tiny_model):
    rows, cols = np.divmod(np.arange(16), 4)
    with torch.no_grad():
        w = torch.zeros(16, tiny_model.cfg.d_model)
        w[torch.arange(16), torch.as_tensor(cols)] = 5.0                   # column code dominates
        w[torch.arange(16), 4 + torch.as_tensor(rows)] = 1.0
        tiny_model.embed.W_pos.copy_(w)
    norms = emb.positional_embedding_norms(tiny_model, 4)
    assert norms["norm"].to_numpy() == pytest.approx(np.full(16, np.sqrt(26.0)))
    assert norms["row"].tolist() == rows.tolist() and norms["col"].tolist() == cols.tolist()
    res = emb.positional_embedding_pca(tiny_model, 4)
    assert res.table.shape == (16, 5)
    sim = res.similarity
    assert sim["same_col"] > sim["same_row"] and sim["same_col"] > sim["other"]
    # PCA of the column-dominated code: positions of one column coincide in the top-2 plane
    for c in range(4):
        pts = res.table[res.table.col == c][["pc1", "pc2"]].to_numpy()
        assert np.ptp(pts, axis=0).max() < 1.5
    with pytest.raises(ValueError, match="n_ctx"):
        emb.positional_embedding_norms(tiny_model, 5)


def test_checkpoint_projection(tiny_cfg):
    final = tm.HookedEncoder(tiny_cfg, seed=0)
    half = tm.HookedEncoder(tiny_cfg, seed=1)
    vals = emb.value_grid(-0.5, 0.5)
    ids = tm.ValueTokenizer().encode(vals)
    with torch.no_grad():
        e = final.W_E[ids]
        half.embed.W_E[ids] = e.mean(0) + 0.5 * (e - e.mean(0))           # halfway to the final layout
    df = emb.checkpoint_token_projection({5000: final, 100: half, 0: tm.HookedEncoder(tiny_cfg, seed=2)},
                                         v_min=-0.5, v_max=0.5)
    assert sorted(df["step"].unique()) == [0, 100, 5000]
    by_step = df.groupby("step")["distance_to_final"].first()
    assert by_step[5000] == 0.0 and by_step[100] == pytest.approx(0.5, abs=1e-6)
    assert by_step[0] > 0.5
    ref = emb.pca(e, 2)
    fin = df[df.step == 5000]
    assert fin[["pc1", "pc2"]].to_numpy() == pytest.approx(ref.scores.numpy(), abs=1e-6)
    with pytest.raises(ValueError, match="final_step"):
        emb.checkpoint_token_projection({1: final}, final_step=2)


def test_checkpoint_projection_from_saved_checkpoints(tiny_cfg, tmp_path):
    ckpt = pytest.importorskip("tfmatcomp.runs.checkpoint")
    paths = []
    for step, seed in ((10, 1), (20, 0)):
        p = tmp_path / "run" / "checkpoints" / ckpt.checkpoint_dir_name(step)
        ckpt.save_checkpoint(tm.HookedEncoder(tiny_cfg, seed=seed), p, step=step)
        paths.append(p)
    from_list = emb.checkpoint_token_projection(paths, v_min=-0.1, v_max=0.1)
    from_run = emb.checkpoint_token_projection(tmp_path / "run", v_min=-0.1, v_max=0.1)
    assert sorted(from_list["step"].unique()) == [10, 20]
    assert from_list.equals(from_run)


def test_embedding_figures_build_from_small_data(tiny_model, tiny_cfg):
    import plotly.graph_objects as go

    from tfmatcomp.plotting import embeddings as ep

    _plant_token_geometry(tiny_model)
    f1 = ep.token_norms_figure(emb.token_embedding_norms(tiny_model))
    assert isinstance(f1, go.Figure) and len(f1.data) == 2 and len(f1.data[0].x) == 301
    pca_res = emb.token_embedding_pca(tiny_model)
    f2 = ep.token_pca_figure(pca_res)
    assert f2.layout.xaxis.title.text.startswith(f"PC{pca_res.magnitude_axis + 1}")
    assert f2.layout.yaxis.title.text.startswith(f"PC{pca_res.sign_axis + 1}")
    f3 = ep.positional_norms_figure(emb.positional_embedding_norms(tiny_model, 4))
    assert len(f3.data[0].x) == 16
    f4 = ep.positional_pca_figure(emb.positional_embedding_pca(tiny_model, 4))
    assert len(f4.data) == 8                                            # 4 rows + 4 columns
    proj = emb.checkpoint_token_projection({0: tm.HookedEncoder(tiny_cfg, seed=3), 10: tiny_model},
                                           v_min=-0.3, v_max=0.3)
    f5 = ep.checkpoint_projection_figure(proj)
    assert len(f5.data) == 2 and f5.layout.annotations[1].text.startswith("step 10 (dist 0.00)")
