"""tfmatcomp.experiments: the papers' pre-shift behaviour on a briefly trained tiny model, exact
consistency between experiments, reproducibility, paper columns, and errors."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.experiments import (activation_patching, attention_ablation, copying_check,
                                   head_ablation_scan, head_group_ablation, positional_permutation,
                                   weight_transplant)
from tfmatcomp.plotting.experiments import head_scan_heatmap, loss_bars_figure, patching_figure

TASK = tm.TaskConfig(n_rows=4, rank=1, p_mask=0.3)


@pytest.fixture(scope="session")
def copying_model(trained_tiny) -> tm.HookedEncoder:
    """The tiny preset trained for 300 steps (conftest): observed entries copied, masked ones on
    the plateau."""
    return trained_tiny.model.eval()


@pytest.fixture(scope="session")
def random_model(trained_tiny) -> tm.HookedEncoder:
    return tm.HookedEncoder(trained_tiny.model.cfg, seed=1).eval()


# ------------------------------------------------------------------- the papers' pre-shift picture
def test_copying_check_on_trained_model(copying_model):
    df = copying_check({"pre-shift": copying_model}, TASK, n_samples=512)
    assert len(df) == 6 and set(df["inputs"]) == {"rank-1", "random"}
    for _, row in df.iterrows():
        assert row["L_obs"] < 1e-2, row.to_dict()
        assert row["L_mask_prime"] < 1e-2, row.to_dict()  # outputs m at masked entries: copying
    row = df[(df["inputs"] == "rank-1") & (df["mask"] == "0.44")].iloc[0]
    assert row["m"] == 0.44 and not any(c.startswith("paper_4l8h") for c in df)  # not the papers' model
    # the masked entries are far from the truth: the model is on the plateau, not completing
    assert (df["L_mask"] > 0.05).all()


def test_ablating_all_heads_keeps_observed_copying(copying_model):
    df = attention_ablation({"pre-shift": copying_model}, TASK, n_samples=256)
    base, abl = df.iloc[0], df.iloc[1]
    assert (base["condition"], abl["condition"]) == ("baseline", "ablated")
    assert abl["L_obs"] < 1e-2
    assert abs(abl["L_mask"] - base["L_mask"]) < 1e-2
    assert "paper_4l8h_L_mask" not in df  # the papers' numbers sit only beside the papers' model


def test_copying_check_detects_a_non_copying_model(random_model):
    df = copying_check(random_model, TASK, n_samples=64, random_matrices=False)
    assert (df["L_obs"] > 1e-2).all() and "paper_4l8h_L_obs" not in df


# -------------------------------------------------------------------------------- consistency
def test_scan_matches_single_head_ablations(copying_model, random_model):
    scan = head_ablation_scan(copying_model, TASK, n_samples=64, seed=3)
    assert scan.shape == (2, 4) and scan.attrs["convention"] == "layer and head are 0-based"
    for l, h in [(0, 1), (1, 3)]:
        df = attention_ablation(copying_model, TASK, heads=[(l, h)], n_samples=64, seed=3)
        assert scan.loc[l, h] == df.loc[1, "L_mask"] - df.loc[0, "L_mask"]
        assert df.loc[0, "L_mask"] == scan.attrs["baseline"]
    fig = head_scan_heatmap(scan)
    assert list(fig.data[0].y) == ["L1", "L2"] and list(fig.data[0].x) == ["H1", "H2", "H3", "H4"]
    both = head_ablation_scan({"a": copying_model, "b": random_model}, TASK, n_samples=16)
    assert both.index.names == ["model", "layer"] and both.shape == (4, 4)


def test_head_groups_ratio_and_layers(random_model):
    df = head_group_ablation(random_model, TASK, groups="layers", n_samples=32)
    assert df["group"].tolist() == ["layer 1 (all heads)", "layer 2 (all heads)"]
    assert df["heads_paper"].tolist() == ["(1,1-4)", "(2,1-4)"]
    for k in ("L", "L_obs", "L_mask"):
        assert (df[f"ratio_{k}"] == df[f"{k}_with"] / df[f"{k}_without"]).all()
    one = attention_ablation(random_model, TASK, heads=[(0, h) for h in range(4)], n_samples=32)
    assert df.loc[0, "L_mask_with"] == one.loc[1, "L_mask"]
    with pytest.raises(ValueError, match="4-layer, 8-head"):
        head_group_ablation(random_model, TASK, groups="paper", n_samples=4)
    big = tm.HookedEncoder(tm.EncoderConfig(n_layers=4, n_heads=8, d_model=32, d_mlp=32, n_ctx=49))
    paper = head_group_ablation({"post-shift": big}, "paper-4l8h", n_samples=4)
    assert len(paper) == 6 and "paper_4l8h_L_mask_with" not in paper  # the papers' shape, not d 768
    row = paper[paper["group"] == "uninterpretable"].iloc[0]
    assert row["heads"] == [(2, 2), (3, 1), (3, 4), (3, 5), (3, 6)]


def test_patching_planted_and_paper_columns(copying_model):
    task = TASK.build()
    # patching the whole residual stream of layer 0 from X makes the -X run give f(X) exactly
    df = activation_patching({"post-shift": copying_model}, TASK, hook="hook_resid_pre",
                             n_samples=64, seed=1)
    x = task.sample(64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        on_x, on_neg = model_losses(copying_model, x), model_losses(copying_model, x.negated())
    row = df[(df["patched"] == "layer 0") & (df["entries"] == "masked")].iloc[0]
    assert math.isclose(row["mse_to_X"], on_x["L_mask"], rel_tol=1e-6)
    none = df[(df["patched"] == "none") & (df["entries"] == "observed")].iloc[0]
    assert math.isclose(none["mse_to_neg_X"], on_neg["L_obs"], rel_tol=1e-6)
    assert "paper_4l8h_mse_to_X" not in df
    z = activation_patching({"post-shift": copying_model}, TASK, n_samples=32)
    assert patching_figure(z).data[0].name == "MSE(f_p, X)"


def model_losses(model, batch):
    return {k: float(v) for k, v in tm.losses(model(batch.tokens), batch).items()}


def test_transplant_and_permutation(copying_model, random_model):
    same = weight_transplant(copying_model, copying_model, TASK, n_samples=32)
    assert same.loc[2, "L"] == same.loc[0, "L"] and same.loc[3, "L_mask"] == same.loc[1, "L_mask"]
    df = weight_transplant(copying_model, random_model, TASK, n_samples=32, params="all")
    assert df["donor"].tolist() == ["none", "none", "post-shift", "pre-shift"]
    assert df.loc[2, "L"] == pytest.approx(df.loc[1, "L"], rel=1e-5)  # all params: pre becomes post
    assert "paper_4l8h_L_obs" not in df
    perm = positional_permutation({"post-shift": random_model}, TASK, n_samples=32, n_permutations=2)
    assert perm["condition"].tolist() == ["baseline", "permuted", "permuted"]
    assert perm.loc[1, "L"] != perm.loc[0, "L"] and "paper_4l8h_L_mask" not in perm
    assert loss_bars_figure(perm, x="permutation_seed").data


@pytest.fixture(scope="module")
def papers_model() -> tm.HookedEncoder:
    """The papers' shape (4 layers, 8 heads, d_model 768), untrained: only the columns matter."""
    return tm.HookedEncoder(tm.get_preset("paper-4l8h").model, seed=0).eval()


def test_paper_columns_only_beside_the_papers_model(papers_model):
    from tfmatcomp.experiments import is_papers_model

    assert is_papers_model(papers_model)
    pre, post = {"pre-shift": papers_model}, {"post-shift": papers_model}
    df = attention_ablation(post, "paper-4l8h", n_samples=4)
    assert df["paper_4l8h_L_mask"].tolist() == [0.0128, 0.2183]
    cc = copying_check(pre, "paper-4l8h", n_samples=4, random_matrices=False, mask_values=[0.44])
    assert cc.loc[0, "paper_4l8h_L_mask_prime"] == 4e-4
    tr = weight_transplant(papers_model, papers_model, "paper-4l8h", n_samples=4)
    assert tr.loc[2, "paper_4l8h_L_mask"] == 0.2246 and tr.loc[3, "paper_4l8h_L_obs"] == 9.5e-4
    perm = positional_permutation(post, "paper-4l8h", n_samples=4)
    assert perm.loc[1, "paper_4l8h_L_mask"] == 0.5687
    z = activation_patching(post, "paper-4l8h", n_samples=4, per_layer=False)
    assert z[(z["patched"] == "all") & (z["entries"] == "masked")]["paper_4l8h_mse_to_neg_X"].tolist() == [0.8066]
    groups = head_group_ablation(post, "paper-4l8h", n_samples=4)
    row = groups[groups["group"] == "uninterpretable"].iloc[0]
    assert row["paper_4l8h_L_mask_with"] == 0.01575
    assert groups[groups["group"] == "masked-row"]["paper_4l8h_L_mask_with"].isna().all()
    other = attention_ablation({"post-shift": papers_model}, "paper-4l8h", heads=[(0, 0)], n_samples=4)
    assert "paper_4l8h_L_mask" not in other  # the papers report all heads only


# ---------------------------------------------------------------- reproducibility and inputs
def test_same_seed_same_table_and_chunking(random_model):
    a = activation_patching(random_model, TASK, n_samples=40, seed=5)
    b = activation_patching(random_model, TASK, n_samples=40, seed=5)
    pd.testing.assert_frame_equal(a, b)
    c = activation_patching(random_model, TASK, n_samples=40, seed=6)
    assert not a["mse_to_X"].equals(c["mse_to_X"])
    d = activation_patching(random_model, TASK, n_samples=40, seed=5, batch_size=7)
    pd.testing.assert_frame_equal(a, d, rtol=1e-5)


def test_checkpoint_paths_and_task_from_checkpoint(random_model, tmp_path):
    path = tm.save_checkpoint(random_model, tmp_path / "ckpt", task_cfg=TASK, step=7)
    df = attention_ablation(path, None, n_samples=16)
    ref = attention_ablation(random_model, TASK, n_samples=16)
    assert df["model"].tolist() == ["step 7", "step 7"]
    assert df["L"].tolist() == ref["L"].tolist()
    with pytest.raises(ValueError, match="task"):
        attention_ablation(random_model, None, n_samples=4)


def test_errors(random_model):
    with pytest.raises(ValueError, match="n_samples"):
        copying_check(random_model, TASK, n_samples=0)
    with pytest.raises(ValueError, match="variant"):
        attention_ablation(random_model, TASK, variant="zero", n_samples=4)
    with pytest.raises(ValueError, match="n_ctx"):
        attention_ablation(random_model, "paper-4l8h", n_samples=4)
    with pytest.raises(ValueError, match="metric"):
        head_ablation_scan(random_model, TASK, metric="L_mask_prime", n_samples=4)
    assert random_model.active_hook_count() == 0


def test_transplant_labels(copying_model, random_model):
    df = weight_transplant(copying_model, random_model, TASK, labels=("early", "late"), n_samples=8)
    assert df["recipient"].tolist() == ["early", "late", "early", "late"]
    assert "paper_4l8h_L_obs" not in df
    with pytest.raises(ValueError, match="labels"):
        weight_transplant(copying_model, random_model, TASK, labels=("a", "a"), n_samples=8)
