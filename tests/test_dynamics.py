"""Drop detection on planted curves, and component-wise training from a saved checkpoint."""

from __future__ import annotations

import json
import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics import (
    PAPER_COMPONENTS, component_training, detect_drop, reinitialize_component, summarize_drops,
    train_component,
)
from tfmatcomp.interventions.during_training import Freeze, Reinitialize
from tfmatcomp.models.param_groups import GROUPS, group_parameter_names, group_predicate

STEPS = np.arange(0, 50_000, 50.0)


def planted(t0, width, plateau, final, noise, seed, transient=True):
    """Sigmoid in log space with multiplicative log-normal noise (and an initial transient)."""
    rng = np.random.default_rng(seed)
    y = np.log10(final) + (np.log10(plateau) - np.log10(final)) * expit((t0 - STEPS) / width)
    if transient:
        y = y + 0.8 * np.exp(-STEPS / 100)      # the first few hundred steps fall onto the plateau
    return 10 ** y * np.exp(rng.normal(0, noise, STEPS.size))


@settings(max_examples=25, deadline=None)
@given(t0=st.floats(8_000, 42_000), width=st.floats(50, 1_000), plateau=st.floats(0.05, 0.3),
       factor=st.floats(3, 30), noise=st.floats(0.02, 0.2), seed=st.integers(0, 2**31 - 1))
def test_planted_drop_found_within_2_percent(t0, width, plateau, factor, noise, seed):
    r = detect_drop(STEPS, planted(t0, width, plateau, plateau / factor, noise, seed))
    assert r.has_drop, r.reason
    assert abs(r.drop_step - t0) <= 0.02 * t0
    assert r.drop_start < r.drop_step < r.drop_end
    assert r.plateau_level == pytest.approx(plateau, rel=0.15)
    assert r.final_level == pytest.approx(plateau / factor, rel=0.15)
    # the 10-90% width of a logistic with scale w is 2 w ln 9
    # A width of a few logging intervals (50 steps here) is measured to within about five of them.
    assert r.drop_width == pytest.approx(2 * width * np.log(9), rel=0.5, abs=250)


def test_noiseless_drop_is_exact():
    r = detect_drop(STEPS, planted(21_234.0, 300.0, 0.2, 0.01, 0.0, 0, transient=False),
                    median_window=1)
    assert r.drop_step == pytest.approx(21_234.0, abs=1.0)
    assert r.drop_width == pytest.approx(600 * np.log(9), rel=1e-3)
    assert r.plateau_level == pytest.approx(0.2, rel=1e-4) and r.final_level == pytest.approx(0.01, rel=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_no_drop_on_flat_noisy_curve(seed):
    rng = np.random.default_rng(seed)
    r = detect_drop(STEPS, 0.11 * np.exp(rng.normal(0, 0.2, STEPS.size)))
    assert not r.has_drop and r.drop_step is None and r.reason.startswith("no drop")
    assert r.plateau_level == pytest.approx(0.11, rel=0.3)


@pytest.mark.parametrize("curve", ["exponential", "power", "from_start"])
def test_no_sudden_drop_on_gradual_or_plateau_free_curves(curve):
    rng = np.random.default_rng(1)
    noise = np.exp(rng.normal(0, 0.05, STEPS.size))
    loss = {"exponential": 0.2 * np.exp(-STEPS / 15_000),
            "power": 1 / (1 + STEPS / 100),
            "from_start": 10 ** (-2 + 1 / (1 + np.exp((STEPS - 300) / 100)))}[curve]
    r = detect_drop(STEPS, loss * noise)
    assert not r.has_drop
    assert ("gradual" in r.reason) or ("no plateau" in r.reason)


def test_dataframe_input_and_summary(tmp_path):
    loss = planted(30_000.0, 400.0, 0.1, 0.01, 0.05, 3)
    df = pd.DataFrame({"step": STEPS, "eval_L_mask": loss, "train_L_obs": 1e-4 * np.ones_like(loss)})
    r = detect_drop(df)                              # default column eval_L_mask
    assert r.has_drop and r.column == "eval_L_mask"
    assert detect_drop(df, column="train_L_obs").has_drop is False
    path = tmp_path / "metrics.jsonl"
    df.to_json(path, orient="records", lines=True)
    assert detect_drop(tmp_path).drop_step == pytest.approx(r.drop_step)
    table = summarize_drops(df, ["eval_L_mask", "train_L_obs"])
    assert table["has_drop"].tolist() == [True, False]
    assert np.allclose(r.curve([0.0, 49_950.0]), [r.plateau_level, r.final_level], rtol=1e-3)
    with pytest.raises(ValueError, match="column"):
        detect_drop(df, column="nope")
    with pytest.raises(ValueError, match="min_drop_factor"):
        detect_drop(df, min_drop_factor=0.5)
    with pytest.raises(ValueError, match="data"):
        detect_drop([0, 1, 2], [1.0, 1.0, 1.0])


# --------------------------------------------------------------------- component groups
def test_groups_partition_the_paper_components(tiny_model):
    names = [n for n, _ in tiny_model.named_parameters()]
    owned = {g: set(group_parameter_names(tiny_model, g)) for g in PAPER_COMPONENTS}
    for a in PAPER_COMPONENTS:
        assert owned[a], a
        for b in PAPER_COMPONENTS:
            assert a == b or not owned[a] & owned[b]
    assert owned["token_embed"] == {"embed.W_E"} and owned["pos_embed"] == {"embed.W_pos"}
    assert "blocks.1.attn.W_Q" in owned["attention"] and "blocks.1.ln1.w" in owned["attention"]
    assert "blocks.0.mlp.W_out" in owned["mlp"] and "blocks.0.ln2.b" in owned["mlp"]
    leftover = set(names) - set().union(*owned.values())
    assert leftover == {n for n in names if n.startswith(("readout.", "embed.ln."))}
    assert set(group_parameter_names(tiny_model, "all")) == set(names)
    assert group_predicate(["mlp", "pos_embed"])("embed.W_pos")
    with pytest.raises(ValueError, match="group"):
        group_predicate("heads")
    assert set(GROUPS) >= set(PAPER_COMPONENTS)


def test_reinitialize_uses_model_init_and_explicit_seed(tiny_model):
    a = reinitialize_component(tiny_model, "attention", seed=5)
    b = reinitialize_component(tiny_model, "attention", seed=torch.Generator().manual_seed(5))
    fresh = tm.HookedEncoder(tiny_model.cfg, seed=5)
    for name, p in a.named_parameters():
        if group_predicate("attention")(name):
            assert torch.equal(p, fresh.get_parameter(name)), name
        else:
            assert torch.equal(p, tiny_model.get_parameter(name)), name
        assert torch.equal(p, b.get_parameter(name))
    c = reinitialize_component(tiny_model, "token_embed", seed=6)
    assert torch.equal(c.embed.W_E[0], torch.zeros_like(c.embed.W_E[0]))   # MASK row stays zero
    assert not torch.equal(c.embed.W_E, tiny_model.embed.W_E)


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory):
    cfg = tm.EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)
    task_cfg = tm.TaskConfig(n_rows=4, rank=1, p_mask=0.3)
    out = tmp_path_factory.mktemp("run")
    res = tm.train(model_cfg=cfg, task_cfg=task_cfg, out_dir=out, device="cpu", progress=False,
                   n_steps=6, batch_size=16, eval_batch_size=8, log_every=3, checkpoint_steps=(),
                   checkpoint_every=0, lr=1e-3, seed=0)
    (step, path), = tm.runs.checkpoint.list_checkpoints(out).items()
    assert step == 6
    return path, res.model


@pytest.mark.parametrize("group", ["attention", "pos_embed"])
def test_component_training_from_checkpoint(trained_checkpoint, group, tmp_path):
    path, _ = trained_checkpoint
    source = tm.load_checkpoint(path)
    start = reinitialize_component(source, group, seed=11)
    res = train_component(path, group, reinit_seed=11, out_dir=tmp_path, n_steps=5,
                          batch_size=8, eval_batch_size=8, log_every=1, lr=1e-2, device="cpu")
    pred = group_predicate(group)
    changed = 0
    for name, p in res.model.named_parameters():
        if pred(name):
            assert not torch.equal(p, source.get_parameter(name)), name   # re-initialized ...
            changed += not torch.equal(p, start.get_parameter(name))     # ... and then trained
        else:
            assert torch.equal(p, source.get_parameter(name)), name       # frozen, bit-identical
    assert changed >= 1
    # one case of the interventions during training, recorded with the run
    recorded = json.loads((tmp_path / "run.json").read_text())["train"]["interventions"]
    assert recorded == [Reinitialize(group, step=0, seed=11).to_dict(),
                        Freeze("all", except_groups=[group]).to_dict()]
    assert list(res.metrics["step"]) == [1, 2, 3, 4, 5]
    assert {"train_L_mask", "eval_L_mask", "eval_L_obs"} <= set(res.metrics.columns)
    assert (tmp_path / "metrics.jsonl").exists()
    # the checkpoint on disk is untouched
    assert all(torch.equal(p, q) for p, q in zip(tm.load_checkpoint(path).parameters(),
                                                  source.parameters()))


def test_component_training_table(trained_checkpoint):
    _, model = trained_checkpoint
    before = {n: p.clone() for n, p in model.named_parameters()}
    df = component_training(model, ["mlp", "token_embed"], task_cfg=tm.TaskConfig(n_rows=4, rank=1),
                            n_steps=2, batch_size=4, eval_batch_size=4, log_every=1, device="cpu")
    assert list(df["component"]) == ["mlp", "mlp", "token_embed", "token_embed", "all", "all"]
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # source untouched


def test_a_fall_in_two_stages_is_one_drop():
    """The shape a fresh 2-thread run of the old tiny preset showed: it leaves the plateau at
    ~11,500, falls part way, rests on a shelf, then falls again to ~0.03 by 18,000."""
    rng = np.random.default_rng(0)
    t = np.arange(0, 20_000, 50.0)
    y = (np.log10(0.11) - 0.3 * expit((t - 12_000) / 150) - 0.27 * expit((t - 16_500) / 200))
    r = detect_drop(t, 10 ** y * np.exp(rng.normal(0, 0.05, t.size)))
    assert r.has_drop, r.reason
    assert 11_000 < r.drop_start < 12_000 and 16_500 < r.drop_end < 17_500
    assert r.plateau_level == pytest.approx(0.11, rel=0.05)
    assert r.final_level == pytest.approx(0.11 / 10 ** 0.57, rel=0.1)
    assert r.drop_factor == pytest.approx(10 ** 0.57, rel=0.1)


def test_slow_decline_after_a_plateau_is_gradual():
    """A plateau, then a decline that takes longer than the plateau did (the d_model 32 run)."""
    rng = np.random.default_rng(2)
    t = np.arange(0, 20_000, 50.0)
    y = np.log10(0.11) - 0.6 * np.clip((t - 6_000) / 14_000, 0, 1)
    r = detect_drop(t, 10 ** y * np.exp(rng.normal(0, 0.03, t.size)))
    assert not r.has_drop and "gradual" in r.reason


def test_bundled_run_has_its_drop():
    r = detect_drop(tm.read_metrics(tm.pretrained.run_dir("tiny")))
    assert r.has_drop, r.reason
    assert r.plateau_level > 2 * r.final_level
    assert r.drop_start < r.drop_step < r.drop_end


@pytest.mark.parametrize("name", ["b32_lr2e-3_seed0", "b32_lr2e-3_seed1", "b32_lr2e-3_seed2",
                                  "b64_lr4e-3_seed0", "b64_lr4e-3_seed1", "b64_lr4e-3_seed2"])
def test_real_plateaus_have_no_drop(name):
    """Real eval L_mask curves of the preset search that had not left their plateau."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "data" / "plateau_curves.json").read_text())
    curve = data["curves"][name]
    r = detect_drop(curve["step"], curve["eval_L_mask"])
    assert not r.has_drop, r.reason
    assert r.plateau_level == pytest.approx(1 / 9, rel=0.1)


def test_a_fit_without_plateau_points_reports_finite_levels():
    import json
    from pathlib import Path

    case = json.loads((Path(__file__).parent / "data" / "plateau_curves.json").read_text())["overflow_case"]
    r = detect_drop(case["step"], case["eval_L_mask"])
    assert not r.has_drop
    assert 0.05 < r.plateau_level < 0.2 and np.isfinite(r.drop_factor)


def test_median_filter_is_the_hand_written_running_median_it_replaced():
    """scipy.ndimage.median_filter (mode "nearest") gives bit for bit what the removed hand-written
    filter (edge padding, sliding windows, np.median) gave, for every odd window and for windows
    longer than the input (returned unchanged)."""
    from tfmatcomp.analyses.dynamics.drop import _median_filter

    def old(y, window):
        if window <= 1 or len(y) < window:
            return y
        half = window // 2
        padded = np.pad(y, half, mode="edge")
        return np.median(np.lib.stride_tricks.sliding_window_view(padded, window), axis=1)

    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 17, 200):
        y = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3])
        y[rng.random(n) < 0.1] = 0.0  # ties
        for window in (1, 3, 5, 7, 11, 25, 201):
            np.testing.assert_array_equal(_median_filter(y, window), old(y, window))
