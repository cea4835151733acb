"""The papers' claims the report computes for any run: per-head X -> -X patching and which rows are
true by construction, several positional permutations with their spread, head groups from the
model's own labels, and OOD factors scaled to the training variance. Random-init small models
only (one of the papers' 4-layer 8-head shape, narrow)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.analyses.heads import (LABEL_GROUPS, analyse_heads, label_group_ablation,
                                     label_head_groups)
from tfmatcomp.analyses.ood import (DEFAULT_OOD_DISTRIBUTIONS, evaluate_ood, ood_conditions,
                                    outside_fraction)
from tfmatcomp.datapath import sample_batch
from tfmatcomp.experiments import (activation_patching, attention_ablation, head_group_ablation,
                                   permutation_summary, positional_permutation)
from tfmatcomp.experiments.patching import patched_by_construction
from tfmatcomp.interventions import ActivationPatch, from_dict
from tfmatcomp.plotting.experiments import patching_figure, patching_head_heatmap
from tfmatcomp.report import sections as S
from tfmatcomp.report.sections.experiments import PERMUTATIONS
from tfmatcomp.report.run import RunContext
from tfmatcomp.task.data import DISTRIBUTIONS, max_abs_entry
from tfmatcomp.task.metrics import mse

TASK = tm.TaskConfig(n_rows=4, rank=1, p_mask=0.3)
CFG = tm.EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=16, n_ctx=16)


@pytest.fixture(scope="module")
def model() -> tm.HookedEncoder:
    return tm.HookedEncoder(CFG, seed=3).eval()


# ---------------------------------------------------------------------- patching X -> -X
def test_all_layers_patch_is_f_of_x_at_masked_entries_for_any_model(model):
    """The all-layers hook_z row at masked entries equals the model's own L_mask on X even for a
    random model: it is true by construction, and the table says so."""
    df = activation_patching(model, TASK, n_samples=24, seed=2)
    x = sample_batch(TASK, 24, 2)
    with torch.no_grad():
        own = tm.losses(model(x.tokens), x)
    row = df[(df["patched"] == "all") & (df["entries"] == "masked")].iloc[0]
    assert math.isclose(row["mse_to_X"], float(own["L_mask"]), rel_tol=1e-5)
    assert df[df["by_construction"]][["patched", "entries"]].values.tolist() == [["all", "masked"]]
    observed = df[(df["patched"] == "all") & (df["entries"] == "observed")].iloc[0]
    assert not math.isclose(observed["mse_to_X"], float(own["L_obs"]), rel_tol=1e-3)


def test_per_head_rows_are_single_head_patches(model):
    df = activation_patching(model, TASK, n_samples=16, seed=1, per_head=True)
    heads = df[df["head"].notna()]
    assert list(dict.fromkeys(heads["patched"])) == ["head (0, 0)", "head (0, 1)", "head (1, 0)",
                                                       "head (1, 1)"]
    assert not heads["by_construction"].any()
    layer_rows = df[df["patched"] == "layer 1"]
    assert (layer_rows["layer"] == 1).all() and layer_rows["head"].isna().all()
    row = heads[(heads["patched"] == "head (1, 0)") & (heads["entries"] == "masked")].iloc[0]
    x = sample_batch(TASK, 16, 1)
    with torch.no_grad():
        f_p = ActivationPatch(x, layers=[1], heads=[0]).run(model, x.negated().tokens)
    assert float(mse(f_p, x.values, x.masked)) == pytest.approx(row["mse_to_X"], rel=1e-6)
    rebuilt = from_dict(json.loads(df.attrs["interventions"][row.name]))
    assert (rebuilt.layers, rebuilt.heads, rebuilt.hooks) == ([1], [0], ["attn.hook_z"])
    # the per-layer figure leaves the per-head rows to the heatmap
    assert list(patching_figure(df).data[0].x) == ["none", "all", "layer 0", "layer 1"]
    z = patching_head_heatmap(df).data[0].z
    none = df[(df["patched"] == "none") & (df["entries"] == "masked")]["mse_to_X"].item()
    assert z[1][0] == pytest.approx(row["mse_to_X"] - none, abs=1e-9)
    with pytest.raises(ValueError, match="per_head"):
        patching_head_heatmap(activation_patching(model, TASK, n_samples=4))


def test_by_construction_rule_and_patching_errors(model):
    one_layer = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=8,
                                                  n_ctx=16), seed=0)
    df = activation_patching(one_layer, TASK, n_samples=8)
    assert set(df[df["by_construction"]]["patched"]) == {"all", "layer 0"}
    resid = activation_patching(model, TASK, hook="hook_resid_pre", n_samples=8)
    assert resid["by_construction"].tolist() == [p != "none" for p in resid["patched"]]
    assert not patched_by_construction(model, "attn.hook_z", None, [0], "masked")
    assert not patched_by_construction(model, "attn.hook_pattern", None, None, "masked")
    assert patched_by_construction(model, "hook_attn_out", [0, 1], None, "masked")
    dec = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=1, d_model=8, d_mlp=8, n_ctx=33))
    assert not patched_by_construction(dec, "attn.hook_z", None, None, "masked")
    with pytest.raises(ValueError, match="entries"):
        patched_by_construction(model, "attn.hook_z", None, None, "all")
    with pytest.raises(ValueError, match="per_head"):
        activation_patching(model, TASK, n_samples=4, per_head="yes")
    with pytest.raises(ValueError, match="per_head"):
        activation_patching(model, TASK, hook="hook_resid_pre", n_samples=4, per_head=True)
    with pytest.raises(ValueError, match="per_layer"):
        activation_patching(model, TASK, n_samples=4, per_layer=1)
    with pytest.raises(ValueError, match="hook"):
        activation_patching(model, TASK, n_samples=4, hook=["attn.hook_z"])


# ------------------------------------------------------------------ positional permutation
def test_permutation_summary_over_several_permutations(model):
    df = positional_permutation({"a": model, "b": tm.HookedEncoder(CFG, seed=4)}, TASK,
                                n_samples=16, n_permutations=4)
    summary = permutation_summary(df)
    assert summary["model"].tolist() == ["a", "b"] and (summary["n_permutations"] == 4).all()
    perm = df[(df["model"] == "b") & (df["condition"] == "permuted")]["L_mask"]
    row = summary.iloc[1]
    assert row["L_mask_mean"] == pytest.approx(perm.mean())
    assert row["L_mask_std"] == pytest.approx(perm.std())
    assert (row["L_mask_min"], row["L_mask_max"]) == (perm.min(), perm.max())
    assert row["L_mask_baseline"] == df[(df["model"] == "b") & (df["condition"] == "baseline")]["L_mask"].item()
    assert perm.nunique() > 1  # the permutations differ
    with pytest.raises(ValueError, match="table"):
        permutation_summary(df.drop(columns="L_obs"))
    with pytest.raises(ValueError, match="table"):
        permutation_summary(df[df["condition"] == "baseline"])
    with pytest.raises(ValueError, match="table"):
        permutation_summary([1, 2])


# ------------------------------------------------------------------- head groups by labels
def test_label_head_groups_from_a_head_table():
    labels = pd.DataFrame({"layer": [1, 0, 0, 1, 1], "head": [0, 0, 1, 1, 2],
                           "type": ["row", "column", "identity", "other", "mask_ignore"]})
    groups = label_head_groups(labels)
    assert list(groups) == list(LABEL_GROUPS)
    assert groups[LABEL_GROUPS[0]] == [(1, 1), (1, 2)]
    assert groups[LABEL_GROUPS[1]] == [(0, 0), (1, 0)]
    assert label_head_groups(labels, interpretable=["row"])[LABEL_GROUPS[0]] == [(0, 0), (0, 1), (1, 1), (1, 2)]
    with pytest.raises(ValueError, match="labels"):
        label_head_groups(labels.drop(columns="type"))
    with pytest.raises(ValueError, match="interpretable"):
        label_head_groups(labels, interpretable=["rowish"])


def test_head_group_ablation_by_the_models_own_labels(model):
    df = label_group_ablation({"post-shift": model}, TASK, n_samples=16, seed=2)
    assert df["group"].tolist() == list(LABEL_GROUPS)
    own = analyse_heads(model, None, batch=sample_batch(TASK, 16, 2)).table
    expected = label_head_groups(own)
    for _, row in df.iterrows():
        heads = expected[row["group"]]
        assert row["heads"] == heads
        assert row["head_types"] == "; ".join(
            f"{tm.interventions.paper_label(p)} {own.set_index(['layer', 'head']).loc[p, 'type']}"
            for p in heads)
        ablated = attention_ablation(model, TASK, heads=heads, n_samples=16, seed=2)
        assert row["L_mask_with"] == ablated.loc[1, "L_mask"]
    assert df.attrs["groups"] == "labels"
    # the mapping is head_group_ablation's groups= (the same numbers)
    again = head_group_ablation({"post-shift": model}, TASK, groups=expected, n_samples=16, seed=2)
    assert again["L_mask_with"].tolist() == df["L_mask_with"].tolist()
    # a random model has no row or column head: that group is empty and ablates nothing
    empty = df[df["heads"].map(len) == 0]
    assert len(empty) and (empty["L_mask_with"] == empty["L_mask_without"]).all()
    two = label_group_ablation({"a": model, "b": tm.HookedEncoder(CFG, seed=9)}, TASK, n_samples=8)
    assert two["model"].tolist() == ["a", "a", "b", "b"]
    with pytest.raises(ValueError, match="interpretable"):
        label_group_ablation(model, TASK, n_samples=4, interpretable="row")
    with pytest.raises(ValueError, match="variant"):
        label_group_ablation(model, TASK, n_samples=4, variant="zero")


# ----------------------------------------------------------------- OOD, matched variances
def test_matched_laws_have_the_training_variance_and_round_trip(tmp_path):
    assert {"gaussian_matched", "laplace_matched"} <= set(DISTRIBUTIONS)
    g = torch.Generator
    for law in ("gaussian", "laplace"):
        plain = tm.MatrixCompletionTask(7, rank=2, distribution=law)
        matched = tm.MatrixCompletionTask(7, rank=2, distribution=f"{law}_matched")
        a = plain._draw((20_000,), g().manual_seed(0), "cpu")
        b = matched._draw((20_000,), g().manual_seed(0), "cpu")
        assert torch.allclose(b, a * math.sqrt(1 / 3 / plain.factor_variance))  # the same draws, scaled
        assert b.var().item() == pytest.approx(1 / 3, rel=0.05)
        x = matched.sample(512, generator=g().manual_seed(1)).values
        assert x.var().item() == pytest.approx(2 / 9, rel=0.1)  # rank / 9, as Uniform[-1, 1] factors
    cfg = tm.TaskConfig(n_rows=4, rank=1, distribution="gaussian_matched")
    assert tm.TaskConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    path = tm.save_checkpoint(tm.HookedEncoder(CFG), tmp_path / "ckpt", task_cfg=cfg, step=1)
    _, info = tm.runs.checkpoint.load_checkpoint_info(path)
    assert info.task_cfg == cfg and info.task_cfg.build().distribution == "gaussian_matched"
    with pytest.raises(ValueError, match="distribution"):
        tm.TaskConfig(distribution="gaussian_scaled")
    assert (max_abs_entry("uniform", 2), max_abs_entry("uniform", None)) == (2.0, 1.0)
    assert tm.MatrixCompletionTask(4, rank=3).max_abs_entry == 3.0


def test_ood_reports_values_outside_the_training_range(model):
    conds = ood_conditions(TASK, 16, ranks=[2], n_rows=[], n_cols=[])
    assert [c.value for c in conds if c.group == "distribution"] == list(DEFAULT_OOD_DISTRIBUTIONS)
    df = evaluate_ood(model, TASK, conds, n_samples=64, baseline=False).set_index("condition")
    frac = df["frac_outside_train_range"]
    assert (df["train_max_abs"] == 1.0).all()  # rank-1 uniform factors: |entry| <= 1
    assert frac["train"] == 0 and frac["full_rank=random"] == 0
    assert frac["rank=2"] > 0
    for law in ("gaussian", "laplace"):
        assert frac[f"distribution={law}"] > 0.1 > frac[f"distribution={law}_matched"]
    assert df.loc["distribution=gaussian_matched", "factor_variance"] == pytest.approx(1 / 3)
    batch = conds[3].task.sample(64, generator=torch.Generator().manual_seed(0))
    assert frac["distribution=gaussian_matched"] == outside_fraction(batch, 1.0)
    # without a task the in-distribution condition gives the range; without either it is NaN
    alone = evaluate_ood(model, conditions=conds, n_samples=8, baseline=False)
    assert (alone["train_max_abs"] == 1.0).all()
    assert evaluate_ood(model, conditions=conds[1:2], n_samples=8, baseline=False)[
        "frac_outside_train_range"].isna().all()
    with pytest.raises(ValueError, match="distributions"):
        ood_conditions(TASK, 16, distributions=["cauchy"])
    with pytest.raises(ValueError, match="distributions"):
        ood_conditions(TASK, 16, distributions="gaussian")
    with pytest.raises(ValueError, match="max_abs"):
        outside_fraction(batch, "1")


# ------------------------------------------------------------------------- report sections
@pytest.fixture(scope="module")
def paper_shaped() -> RunContext:
    """A run context with random 4-layer 8-head models on 7x7 rank-2 matrices (narrow, cheap)."""
    cfg = tm.EncoderConfig(n_layers=4, n_heads=8, d_model=32, d_mlp=32, n_ctx=49)
    pre, post = tm.HookedEncoder(cfg, seed=0).eval(), tm.HookedEncoder(cfg, seed=1).eval()
    return RunContext(run_dir=Path("."), checkpoints={}, metrics=None, pre_step=0, post_step=1,
                      pre=pre, post=post, task=tm.TaskConfig(n_rows=7, rank=2).build(),
                      n_samples=16, seed=0)


def _run(ctx, key):
    s = S.Section(key, S.SECTIONS[key][0])
    S.SECTIONS[key][1](ctx, s)
    return s


def test_patching_section_shows_layers_heads_and_what_is_by_construction(paper_shaped):
    s = _run(paper_shaped, "patching")
    assert "true by construction" in s.text and "per-head" in s.text
    tables = [i for i in s.items if isinstance(i, pd.DataFrame)]
    assert tables[0]["by_construction"].tolist().count(True) == 1
    assert {"layer 0", "layer 3"} <= set(tables[0]["patched"])
    assert tables[1].shape == (4, 9)  # layers x (layer, 8 heads)
    titles = [i.layout.title.text for i in s.items if hasattr(i, "layout")]
    assert any("Per-head patching" in t for t in titles)


def test_permutation_section_uses_several_permutations(paper_shaped):
    s = _run(paper_shaped, "permutation")
    summary = next(i for i in s.items if isinstance(i, pd.DataFrame))
    assert (summary["n_permutations"] == PERMUTATIONS).all() and PERMUTATIONS >= 5
    assert summary["model"].tolist() == ["pre-shift", "post-shift"]
    assert {"L_mask_mean", "L_mask_std", "L_mask_min", "L_mask_max"} <= set(summary.columns)
    assert f"{PERMUTATIONS} permutations" in s.text and "std" in s.text


def test_head_groups_section_has_own_label_groups_and_the_papers(paper_shaped):
    s = _run(paper_shaped, "head_groups")
    (table,) = s.items
    groups = table["group"].tolist()
    assert groups[:2] == list(LABEL_GROUPS)
    assert "uninterpretable" in groups and "masked-row" in groups  # 4L8H: the papers' groups too
    assert "neither row, column nor identity" in s.text and "(1,1-8)" in s.text  # names the heads
    small = RunContext(run_dir=Path("."), checkpoints={}, metrics=None, pre_step=0, post_step=1,
                       pre=tm.HookedEncoder(CFG), post=tm.HookedEncoder(CFG, seed=1),
                       task=TASK.build(), n_samples=8, seed=0)
    table = _run(small, "head_groups").items[0]
    assert table["group"].tolist() == [*LABEL_GROUPS, "layer 1 (all heads)", "layer 2 (all heads)"]


def test_ood_section_shows_matched_laws(model):
    ctx = RunContext(run_dir=Path("."), checkpoints={}, metrics=None, pre_step=0, post_step=1,
                     pre=model, post=model, task=TASK.build(), n_samples=8, seed=0)
    s = _run(ctx, "ood")
    table = next(i for i in s.items if isinstance(i, pd.DataFrame))
    assert {"distribution=gaussian_matched", "distribution=laplace_matched"} <= set(table["condition"])
    assert "frac_outside_train_range" in table and "gaussian_matched:" in s.text
    assert "% outside" in s.text
