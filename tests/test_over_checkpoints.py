"""over_checkpoints (any measure over a run's checkpoints and seeds) and the progress measures of
matrix completion: the table's shape and rows, the fixed batch, multi-seed groups, the measures'
definitions against direct computations, the CLI and the figure."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics import over_checkpoints, run_seeds
from tfmatcomp.analyses.dynamics.progress import (
    L_mask, copying, masked_pair_cosine, positional_rank, representation_collapse,
    row_column_attention_mass, row_column_mass,
)
from tfmatcomp.datapath import predict, sample_batch
from tfmatcomp.task.metrics import losses
from tfmatcomp.decomposition import decompose
from tfmatcomp.experiments import attention_targets, copying_check
from tfmatcomp.geometry import screenot
from tfmatcomp.interventions import UniformAttentionAblation

STEPS = [2000, 4000, 5000, 6000, 7000, 10000]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """Two seeds of the tiny preset, 4 steps each, a checkpoint every 2 steps."""
    out = tmp_path_factory.mktemp("group") / "g"
    tm.train_many("tiny", seeds="0-1", out_dir=out, n_steps=4, batch_size=8, log_every=2,
                  checkpoint_every=2, progress=False)
    return out


# --------------------------------------------------------------------------- the table
def test_bundled_run_table_has_one_row_per_checkpoint_and_measure():
    df = over_checkpoints("tiny", {"L_mask": L_mask, "copying": copying}, n_samples=32)
    assert list(df.columns) == ["seed", "step", "measure", "value"]
    assert len(df) == len(STEPS) * 3
    assert set(df["seed"]) == {0}
    assert sorted(set(df["step"])) == STEPS
    assert set(df["measure"]) == {"L_mask", "copying.L_mask_prime", "copying.L_obs"}
    assert df.equals(df.sort_values(["seed", "step", "measure"]).reset_index(drop=True))
    assert df["value"].dtype == float
    mask = df[df["measure"] == "L_mask"].set_index("step")["value"]
    assert mask[10000] < mask[2000] / 2          # the drop is between these checkpoints


def test_the_batch_is_the_same_at_every_checkpoint():
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def record(model, batch):
        seen.append((batch.tokens.clone(), batch.values.clone(), batch.observed.clone()))
        return float(len(seen))

    df = over_checkpoints("tiny", {"record": record}, n_samples=16, seed=3)
    assert len(seen) == len(STEPS) and df["value"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    expected = sample_batch("tiny", 16, seed=3)
    for tokens, values, observed in seen:
        assert torch.equal(tokens, expected.tokens)
        assert torch.equal(values, expected.values)
        assert torch.equal(observed, expected.observed)


def test_steps_select_checkpoints():
    df = over_checkpoints("tiny", {"L_mask": L_mask}, n_samples=8, steps=[10000, 2000])
    assert df["step"].tolist() == [2000, 10000]


def test_a_group_of_seeds_gives_each_seed_its_rows(group):
    assert list(run_seeds(group)) == [0, 1]
    df = over_checkpoints(group, {"L_mask": L_mask}, n_samples=8)
    assert df[["seed", "step"]].values.tolist() == [[0, 2], [0, 4], [1, 2], [1, 4]]
    by_seed = df.pivot(index="step", columns="seed", values="value")
    assert not by_seed[0].equals(by_seed[1])     # different models on the same matrices
    one = over_checkpoints(group / "seed-1", {"L_mask": L_mask}, n_samples=8)
    assert one["seed"].tolist() == [1, 1]
    assert one["value"].tolist() == df[df["seed"] == 1]["value"].tolist()


def test_an_intervention_is_measured_as_its_L_mask():
    iv = UniformAttentionAblation("all")
    df = over_checkpoints("tiny", {"ablated": iv}, n_samples=16, steps=[10000])
    model = tm.load_pretrained("tiny", step=10000)
    batch = sample_batch("tiny", 16, seed=0)
    assert df["value"].item() == pytest.approx(losses(predict(model, batch, iv), batch, as_floats=True)["L_mask"])


def test_an_experiment_draws_the_same_matrices_and_its_table_becomes_rows():
    df = over_checkpoints("tiny", {"cc": copying_check, "copying": copying}, n_samples=16,
                          steps=[2000, 10000])
    measures = set(df["measure"])
    assert "cc.L_mask_prime[inputs=rank-1,mask=MASK]" in measures
    assert "cc.L_obs[inputs=random,mask=0.44]" in measures
    assert not any("paper_" in m for m in measures)
    targets = over_checkpoints("tiny", {"t": attention_targets}, n_samples=8, steps=[10000])
    assert "t.same_row[layer=1,head=0]" in set(targets["measure"])
    wide = df.pivot(index="step", columns="measure", values="value")
    assert wide["cc.L_mask_prime[inputs=rank-1,mask=MASK]"].tolist() == pytest.approx(
        wide["copying.L_mask_prime"].tolist())


@pytest.mark.parametrize("kwargs, arg", [
    (dict(run="no-such-run", measures={"a": L_mask}), "run"),
    (dict(run="tiny", measures={}), "measures"),
    (dict(run="tiny", measures={"a": 3}), "measures['a']"),
    (dict(run="tiny", measures={"a": lambda m, b: "text"}), "measures['a']"),
    (dict(run="tiny", measures={"a": L_mask}, steps=[123]), "steps"),
    (dict(run="tiny", measures={"a": L_mask}, n_samples=0), "n_samples"),
])
def test_bad_input_names_the_argument(kwargs, arg):
    run, measures = kwargs.pop("run"), kwargs.pop("measures")
    kwargs.setdefault("steps", [2000])      # one checkpoint keeps the valid cases short
    with pytest.raises(ValueError, match=re.escape(arg)):
        over_checkpoints(run, measures, **kwargs)


# --------------------------------------------------------------------------- the measures
def test_row_column_mass_on_a_hand_made_pattern():
    # 2x3 matrix, positions 0 1 2 / 3 4 5; masked: 0 and 4; one head, two samples
    observed = torch.tensor([[False, True, True, True, False, True]] * 2)
    a = torch.zeros(2, 1, 6, 6)
    a[0, 0, 0] = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4, 0.0])   # query 0: row keys 1, 2; column key 3
    a[0, 0, 4] = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])   # query 4: key 1 (column 1) only
    a[1, 0, 0] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0])   # key 5: neither row nor column
    a[1, 0, 4] = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.0, 0.5])   # keys 3, 5: its row
    got = row_column_mass(a, observed, 2, 3)
    assert got.tolist() == pytest.approx([(0.6 + 0.5 + 0.0 + 1.0) / 4])
    assert row_column_mass(a, observed, 2, 3, "row").tolist() == pytest.approx([(0.3 + 1.0) / 4])
    assert row_column_mass(a, observed, 2, 3, "column").tolist() == pytest.approx([(0.3 + 0.5) / 4])
    with pytest.raises(ValueError, match="part"):
        row_column_mass(a, observed, 2, 3, "diagonal")
    assert torch.isnan(row_column_mass(a, torch.ones(2, 6, dtype=torch.bool), 2, 3)).all()


def _cache(model, batch, names):
    _, cache = model.run_with_cache(batch.tokens, names_filter=names)
    return cache


def test_row_column_attention_mass_against_a_direct_computation():
    model = tm.load_pretrained("tiny", step=10000)
    batch = sample_batch("tiny", 12, seed=1)
    got = row_column_attention_mass(model, batch, batch_size=5)
    n = batch.n_cols
    per_head, per_part = [], {"row": [], "column": []}
    for l in range(model.cfg.n_layers):
        a = _cache(model, batch, [f"blocks.{l}.attn.hook_pattern"])[f"blocks.{l}.attn.hook_pattern"]
        heads = []
        for h in range(model.cfg.n_heads):
            total, count = 0.0, 0
            for b in range(batch.batch_size):
                for q in range(batch.tokens.shape[1]):
                    if batch.observed[b, q]:
                        continue
                    count += 1
                    total += sum(float(a[b, h, q, k]) for k in range(batch.tokens.shape[1])
                                 if batch.observed[b, k] and (k // n == q // n or k % n == q % n))
            heads.append(total / count)
            for part, same in (("row", lambda k, q: k // n == q // n),
                               ("column", lambda k, q: k % n == q % n)):
                per_part[part].append(sum(
                    float(a[b, h, q, k]) for b in range(batch.batch_size)
                    for q in range(batch.tokens.shape[1]) if not batch.observed[b, q]
                    for k in range(batch.tokens.shape[1]) if batch.observed[b, k] and same(k, q)
                ) / count)
        per_head.append(heads)
        assert got[f"layer{l}"] == pytest.approx(sum(heads) / len(heads), abs=1e-6)
    assert got["max_head"] == pytest.approx(max(max(h) for h in per_head), abs=1e-6)
    for part, values in per_part.items():
        assert got[f"{part}.max_head"] == pytest.approx(max(values), abs=1e-6)


def test_representation_collapse_against_a_direct_computation():
    model = tm.load_pretrained("tiny", step=5000)
    batch = sample_batch("tiny", 6, seed=2)
    got = representation_collapse(model, batch, batch_size=4)
    names = tm.models.hook_names.residual_stream_names(model)
    cache = _cache(model, batch, names)
    assert sorted(got) == [f"layer{l}" for l in range(len(names))]
    for l, name in enumerate(names):
        h = cache[name]
        cosines = [float(torch.nn.functional.cosine_similarity(h[b, i], h[b, j], dim=0))
                   for b in range(batch.batch_size)
                   for i in range(h.shape[1]) for j in range(h.shape[1])
                   if i != j and not batch.observed[b, i] and not batch.observed[b, j]]
        assert got[f"layer{l}"] == pytest.approx(sum(cosines) / len(cosines), abs=1e-6)
    assert masked_pair_cosine(h, torch.ones_like(batch.observed)) != masked_pair_cosine(h, batch.observed)


def test_positional_rank_and_copying_against_direct_computations():
    model = tm.load_pretrained("tiny", step=10000)
    batch = sample_batch("tiny", 64, seed=0)
    names = tm.models.hook_names.residual_stream_names(model)
    cache = _cache(model, batch, names)
    got = positional_rank(model, batch)
    assert got == {f"layer{l}": float(screenot(decompose(cache[n]).pos).rank)
                   for l, n in enumerate(names)}
    c = copying(model, batch)
    table = copying_check(model, "tiny", n_samples=64, seed=0, mask_values=[None],
                          random_matrices=False)
    assert c["L_mask_prime"] == pytest.approx(table.loc[0, "L_mask_prime"])
    assert c["L_obs"] == pytest.approx(table.loc[0, "L_obs"])
    assert L_mask(model, batch) == pytest.approx(table.loc[0, "L_mask"])


def test_measures_refuse_a_decoder_and_a_non_batch():
    dec = tm.HookedDecoder(tm.DecoderConfig(d_model=8, d_mlp=8, n_ctx=33))
    with pytest.raises(ValueError, match="model"):
        representation_collapse(dec, sample_batch("tiny", 2))
    with pytest.raises(ValueError, match="batch"):
        positional_rank(tm.load_pretrained("tiny"), torch.zeros(2, 16, dtype=torch.long))


# --------------------------------------------------------------------------- CLI, figure, docs
def test_cli_writes_the_table_next_to_the_run(group, capsys):
    from tfmatcomp.cli import main

    assert main(["dynamics", str(group), "--measures", "L_mask,copying", "--samples", "8"]) == 0
    out = group.parent / "g.dynamics.csv"
    df = pd.read_csv(out)
    assert list(df.columns) == ["seed", "step", "measure", "value"]
    assert len(df) == 2 * 2 * 3 and str(out) in capsys.readouterr().out
    assert main(["dynamics", str(group), "--measures", "nope"]) == 2


def test_cli_on_the_bundled_run_writes_here_with_a_figure(tmp_path, monkeypatch):
    from tfmatcomp.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["dynamics", "tiny", "--measures", "L_mask", "--samples", "8",
                 "--steps", "2000,10000", "--figure", "f.html", "-o", "t.csv"]) == 0
    assert pd.read_csv(tmp_path / "t.csv")["step"].tolist() == [2000, 10000]
    assert (tmp_path / "f.html").stat().st_size > 0


def test_measures_figure_marks_the_drop_band_on_every_panel():
    from tfmatcomp.plotting.dynamics import measures_figure
    from tfmatcomp.training.trainer import read_metrics

    table = over_checkpoints("tiny", {"copying": copying}, n_samples=8)
    fig = measures_figure(table, read_metrics(tm.pretrained.run_dir("tiny")))
    assert [t.name for t in fig.data] == ["eval_L_mask", "copying.L_mask_prime (seed 0)",
                                         "copying.L_obs (seed 0)"]
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(bands) == 3 and 4000 < bands[0].x0 < bands[0].x1 < 7000
    with pytest.raises(ValueError, match="measures"):
        measures_figure(table, measures=["nope"])


def test_the_docs_example_runs():
    text = (ROOT / "docs" / "dynamics.md").read_text()
    section = text.split("## Measures over checkpoints", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    exec(compile(code, "docs/dynamics.md", "exec"), {})
