"""Interventions as data: every kind and a composition survive to_dict -> JSON -> from_dict, and the
rebuilt intervention changes a small model's output exactly as the original; bad dicts are refused
with a message naming what is wrong; experiment tables and the report record what they ran."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.interventions import (KINDS, ActivationAblation, ActivationPatch, Composition,
                                     Intervention, MaskSubstitution, MeanAttentionAblation,
                                     PositionalPermutation, SampledBatch, UniformAttentionAblation,
                                     WeightTransplant, compose, from_dict, to_json)
from tfmatcomp.task.tokenizer import ValueTokenizer

CFG = tm.EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=16, n_ctx=16)
TASK = tm.MatrixCompletionTask(4, rank=1)


@pytest.fixture(scope="module")
def model():
    return tm.HookedEncoder(CFG, seed=0)


@pytest.fixture(scope="module")
def batch():
    return TASK.sample(8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def donor_path(tmp_path_factory):
    return tm.save_checkpoint(tm.HookedEncoder(CFG, seed=1), tmp_path_factory.mktemp("donor") / "ckpt",
                              step=7)


def _cases(model, batch, donor_path):
    other = TASK.sample(8, generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(other.tokens)
    donor = tm.HookedEncoder(CFG, seed=1)
    return {
        "uniform": UniformAttentionAblation([(0, 1), (1, 0)]),
        "uniform_all": UniformAttentionAblation("all"),
        "mean_attention": MeanAttentionAblation("all"),
        "zero_ablation": ActivationAblation("attn.hook_z", layers=[1], heads=[1],
                                            positions=batch.masked),
        "mean_ablation_tensor": ActivationAblation("blocks.0.hook_mlp_out", mode="mean",
                                                   mean_value=torch.randn(16, 16,
                                                                          dtype=torch.float64)),
        "mean_ablation_by_hook": ActivationAblation(
            "hook_resid_mid", mode="mean", positions=[1, 3],
            mean_value={f"blocks.{l}.hook_resid_mid": torch.randn(16) for l in range(2)}),
        "patch_tokens": ActivationPatch(other.tokens, heads=[0], positions=torch.tensor([2, 5])),
        "patch_sample": ActivationPatch(SampledBatch(TASK, 8, seed=1), layers=[1]),
        "patch_cache": ActivationPatch(cache, hooks="attn.hook_z", layers=[1]),
        "mask_substitution": MaskSubstitution(0.44),
        "permutation": PositionalPermutation([2, 0, 1, 3, 5, 4]),
        "permutation_seeded": PositionalPermutation(seed=3, n_positions=16),
        "transplant_memory": WeightTransplant(donor, params=["attn_out", "ln"], layers=[1]),
        "transplant_checkpoint": WeightTransplant(donor_path),
        "composition": compose(MaskSubstitution(-0.24), WeightTransplant(donor_path, params="mlp"),
                               PositionalPermutation(seed=0, n_positions=16),
                               UniformAttentionAblation([(1, 1)]),
                               ActivationAblation("attn.hook_pattern", layers=[1], heads=[1])),
    }


CASES = ["uniform", "uniform_all", "mean_attention", "zero_ablation", "mean_ablation_tensor",
         "mean_ablation_by_hook", "patch_tokens", "patch_sample", "patch_cache", "mask_substitution",
         "permutation", "permutation_seeded", "transplant_memory", "transplant_checkpoint",
         "composition"]


def _through_json(iv: Intervention) -> Intervention:
    return from_dict(json.loads(json.dumps(iv.to_dict())))


@pytest.mark.parametrize("case", CASES)
def test_round_trip_changes_the_output_exactly_as_the_original(case, model, batch, donor_path):
    iv = _cases(model, batch, donor_path)[case]
    again = _through_json(iv)
    assert type(again) is type(iv) and again == iv and hash(again) == hash(iv)
    assert again.to_dict() == iv.to_dict()
    want = iv.run(model, batch.tokens)
    assert not torch.equal(want, model(batch.tokens)), "the case must change the output"
    assert torch.equal(again.run(model, batch.tokens), want)
    hooks = model.run_with_hooks(batch.tokens, fwd_hooks=again.fwd_hooks(model))
    assert torch.equal(hooks, model.run_with_hooks(batch.tokens, fwd_hooks=iv.fwd_hooks(model)))


def test_every_kind_is_covered_and_registered_once(model, batch, donor_path):
    cases = _cases(model, batch, donor_path)
    covered = {iv.kind for iv in cases.values()} | {p.kind for iv in cases.values() for p in iv.parts}
    # the interventions during training share the registry; tests/test_training_interventions.py
    # covers them
    from tfmatcomp.interventions.during_training import during_training_kinds

    assert covered == set(KINDS) - set(during_training_kinds())
    assert set(during_training_kinds()) == {"attention_logit_scale", "row_column_attention_scale",
                                            "row_column_attention_penalty", "freeze", "reinitialize"}
    assert all(cls.kind == kind for kind, cls in KINDS.items())


def test_the_dicts_are_plain_and_refer_instead_of_embedding(model, batch, donor_path):
    cases = _cases(model, batch, donor_path)
    assert cases["transplant_checkpoint"].to_dict()["donor"] == {"checkpoint": str(donor_path),
                                                                 "step": 7}
    assert cases["patch_sample"].to_dict()["source"] == {
        "sample": {"task": tm.TaskConfig(4, 4, 1).to_dict(), "n_samples": 8, "seed": 1}}
    # a cache is written with only the activations the patch reads
    assert list(cases["patch_cache"].to_dict()["source"]["activations"]) == ["blocks.1.attn.hook_z"]
    # a donor in memory: its config and only the transplanted parameters
    donor = cases["transplant_memory"].to_dict()["donor"]
    assert sorted(donor["parameters"]) == ["blocks.1.attn.W_O", "blocks.1.attn.b_O",
                                           "blocks.1.ln1.b", "blocks.1.ln1.w", "blocks.1.ln2.b",
                                           "blocks.1.ln2.w", "embed.ln.b", "embed.ln.w"]
    assert donor["parameters"]["embed.ln.w"]["dtype"] == "float32"
    for iv in cases.values():
        assert json.loads(json.dumps(iv.to_dict(), allow_nan=False)) == iv.to_dict()


def test_mask_substitution_keeps_a_custom_tokenizer():
    sub = MaskSubstitution(0.5, tokenizer=ValueTokenizer(v_min=-2.0, v_max=2.0, scale=10))
    assert sub.to_dict()["tokenizer"]["scale"] == 10
    again = _through_json(sub)
    assert again.tokenizer == sub.tokenizer and again.token_id == sub.token_id
    assert "tokenizer" not in MaskSubstitution(0.5).to_dict()


def test_equality_is_by_kind_and_parameters():
    assert UniformAttentionAblation([(0, 1)]) == UniformAttentionAblation([[0, 1]])
    assert UniformAttentionAblation([(0, 1)]) != MeanAttentionAblation([(0, 1)])
    assert UniformAttentionAblation([(0, 1)]) != UniformAttentionAblation([(0, 0)])
    assert len({MaskSubstitution(0.44), MaskSubstitution(0.44)}) == 1
    assert Composition([]) == _through_json(Composition([]))


@pytest.mark.parametrize("data, message", [
    ({"kind": "uniform_ablation"}, "unknown kind 'uniform_ablation'; known kinds: activation_abl"),
    ({"heads": "all"}, "intervention: missing field 'kind'"),
    ("uniform", "expected a dict with a 'kind'"),
    ({"kind": "activation_ablation", "mode": "zero"}, "missing field 'hooks'"),
    ({"kind": "uniform_attention_ablation", "heads": "all", "head": 1}, "unknown field(s) 'head'"),
    ({"kind": "composition", "parts": [{"kind": "mask_substitution", "value": 0.1}, {"kind": "x"}]},
     "intervention.parts[1]: unknown kind 'x'"),
    ({"kind": "composition", "parts": [{"kind": "activation_patch"}]},
     "intervention.parts[0] (activation_patch): missing field 'source'"),
    ({"kind": "activation_patch", "source": {}}, "expected exactly one of 'sample', 'tokens'"),
    ({"kind": "activation_patch", "source": {"sample": {"task": {}, "seed": 0}}},
     "source.sample: missing field 'n_samples'"),
    ({"kind": "activation_ablation", "hooks": ["hook_embed"], "positions": {"dtype": "floaty",
                                                                         "shape": [1], "data": [1]}},
     "positions: unknown dtype 'floaty'"),
    ({"kind": "activation_ablation", "hooks": ["hook_embed"], "positions": {"dtype": "bool",
                                                                         "shape": [3], "data": [1]}},
     "positions: data do not form a bool tensor of shape [3]"),
    ({"kind": "weight_transplant", "donor": {"config": {}}}, "donor: missing field 'parameters'"),
    ({"kind": "positional_permutation"}, "perm, seed: give exactly one of them"),
])
def test_bad_dicts_are_refused_naming_what_is_wrong(data, message):
    with pytest.raises(ValueError) as err:
        from_dict(data)
    assert message in str(err.value)


def test_a_checkpoint_at_another_step_is_refused(donor_path):
    data = WeightTransplant(donor_path).to_dict()
    data["donor"]["step"] = 8
    with pytest.raises(ValueError, match="is at step 7, the record says 8"):
        from_dict(data)


def test_from_dict_on_a_class_checks_the_kind():
    assert UniformAttentionAblation.from_dict({"kind": "uniform_attention_ablation", "heads": "all"}
                                              ) == UniformAttentionAblation("all")
    with pytest.raises(ValueError, match="describes a MaskSubstitution .* not a UniformAttention"):
        UniformAttentionAblation.from_dict({"kind": "mask_substitution", "value": 0.4})


def test_an_intervention_without_a_kind_says_so():
    class Custom(Intervention):
        def describe(self):
            return "custom"

    with pytest.raises(NotImplementedError, match="Custom: has no kind"):
        Custom().to_dict()
    c = Custom()
    assert c == c and c != Custom()
    assert to_json(None) is None


# ------------------------------------------------------------------ experiment tables and report
from tfmatcomp.datapath import predict, sample_batch
from tfmatcomp.task.metrics import losses  # noqa: E402
from tfmatcomp.experiments import (activation_patching, attention_ablation, copying_check,  # noqa: E402
                                   head_ablation_scan, head_group_ablation, positional_permutation,
                                   weight_transplant, with_interventions)
from tfmatcomp.task.metrics import L_mask_prime, mse  # noqa: E402
from tfmatcomp.report.render import frame_html  # noqa: E402

TASK_CFG = tm.TaskConfig(n_rows=4, rank=1)
N = 16


def _rebuilt(text: str) -> Intervention:
    return from_dict(json.loads(text))


def _losses_again(model, text, seed=0):
    batch = sample_batch(TASK_CFG, N, seed)
    return losses(predict(model, batch, _rebuilt(text)), batch, as_floats=True)


def test_loss_tables_record_what_they_ran(model):
    """Rebuilding each row's intervention from its JSON and running it gives the row's numbers."""
    tables = [with_interventions(t) for t in (
        attention_ablation(model, TASK_CFG, n_samples=N, heads=[(1, 0)]),
        attention_ablation(model, TASK_CFG, n_samples=N, variant="mean"),
        positional_permutation(model, TASK_CFG, n_samples=N, n_permutations=2))]
    for df in tables:
        assert pd.isna(df["intervention"].iloc[0])  # the baseline: the model as it is (missing)
        for _, row in df.iloc[1:].iterrows():
            again = _losses_again(model, row["intervention"])
            assert [again[k] for k in ("L", "L_obs", "L_mask")] == [row["L"], row["L_obs"], row["L_mask"]]
    groups = with_interventions(head_group_ablation(model, TASK_CFG, groups="layers", n_samples=N))
    for _, row in groups.iterrows():
        assert _losses_again(model, row["intervention"])["L_mask"] == row["L_mask_with"]
        assert _rebuilt(row["intervention"]).heads == row["heads"]


def test_copying_table_records_the_substitution(model):
    df = with_interventions(copying_check(model, TASK_CFG, n_samples=N, mask_values=[None, 0.44],
                                          random_matrices=False))
    assert pd.isna(df["intervention"].iloc[0])
    row = df.iloc[1]
    assert json.loads(row["intervention"]) == {"kind": "mask_substitution", "value": 0.44}
    batch = sample_batch(TASK_CFG, N, 0)
    pred = predict(model, batch, _rebuilt(row["intervention"]))
    assert float(L_mask_prime(pred, batch, 0.44)) == row["L_mask_prime"]


def test_scan_records_each_cells_ablation(model):
    scan = head_ablation_scan(model, TASK_CFG, n_samples=N)
    cells = scan.attrs["interventions"]
    assert sorted(cells) == [(l, h) for l in range(2) for h in range(2)]
    assert _losses_again(model, cells[(1, 1)])["L_mask"] - scan.attrs["baseline"] == scan.loc[1, 1]


def test_transplant_table_names_checkpoints_not_weights(tmp_path):
    pre = tm.save_checkpoint(tm.HookedEncoder(CFG, seed=2), tmp_path / "pre", task_cfg=TASK_CFG, step=1)
    post = tm.save_checkpoint(tm.HookedEncoder(CFG, seed=3), tmp_path / "post", task_cfg=TASK_CFG, step=9)
    df = with_interventions(weight_transplant(pre, post, n_samples=N))
    assert df["intervention"].iloc[:2].isna().all()
    record = json.loads(df.loc[2, "intervention"])
    assert record["donor"] == {"checkpoint": str(post), "step": 9} and record["params"] == ["qkv"]
    assert len(df.loc[2, "intervention"]) < 300
    again = _losses_again(tm.load_checkpoint(pre), df.loc[2, "intervention"])
    assert again["L"] == df.loc[2, "L"]


def test_patching_table_records_a_small_exact_patch(model):
    df = with_interventions(activation_patching(model, TASK_CFG, n_samples=N, seed=4))
    assert df.loc[df["patched"] == "none", "intervention"].isna().all()
    row = df[(df["patched"] == "layer 1") & (df["entries"] == "masked")].iloc[0]
    assert len(row["intervention"]) < 400  # the source is (task, n_samples, seed), not tokens
    patch = _rebuilt(row["intervention"])
    assert patch.source == SampledBatch(TASK_CFG, N, 4) and patch.layers == [1]
    x = sample_batch(TASK_CFG, N, 4)
    with torch.no_grad():
        f_p = patch.run(model, x.negated().tokens)
    assert float(mse(f_p, x.values, x.masked)) == row["mse_to_X"]


def test_report_tables_write_the_interventions_out(model):
    df = attention_ablation(model, TASK_CFG, n_samples=N, heads=[(0, 1)])
    page = frame_html(df)
    assert "#1 uniform_attention_ablation" in page and page.count("<li>") == 1
    assert "uniform attention ablation (pattern = 1/n_keys) of heads [(0, 1)]" in page
    import html as _html
    import re
    shown = _html.unescape(re.search(r"<pre>(.*?)</pre>", page, re.S).group(1))
    assert _rebuilt(shown) == _rebuilt(with_interventions(df).loc[1, "intervention"])
    scan = head_ablation_scan(model, TASK_CFG, n_samples=N)
    assert frame_html(scan).count("<li>") == 4 and "(cell (1, 0))" in frame_html(scan)
    plain = pd.DataFrame({"a": [1.0]})
    assert "details" not in frame_html(plain)


def test_the_docs_example_runs(capsys):
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "interventions.md").read_text()
    section = page[page.index("## Interventions as data"):page.index("## The experiments")]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/interventions.md", "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out.strip() == '{"kind": "uniform_attention_ablation", "heads": [[1, 2]]}'
