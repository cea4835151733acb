"""Head scores and classification on hand-built patterns, invariances, and the model path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tfmatcomp as tm
from tfmatcomp.analyses import heads
from tfmatcomp.task import masks

N = 4                      # 4x4 matrices
P = N * N
ROWS, COLS = masks.positions_to_rows_cols(N, N)
SAME_ROW = ROWS[:, None] == ROWS[None, :]
SAME_COL = COLS[:, None] == COLS[None, :]


def _normalize(w: torch.Tensor) -> torch.Tensor:
    w = w.to(torch.float64)
    return w / w.sum(-1, keepdim=True)


def _bernoulli(batch=8, seed=0):
    return torch.rand(batch, P, generator=torch.Generator().manual_seed(seed)) >= 0.3


def _row_masks(batch=8, seed=0):
    return masks.random_row_masks(N, N, n_masked_rows=2, batch_size=batch, n_keep=1,
                                  generator=torch.Generator().manual_seed(seed))


def _lcc_masks(batch=8, seed=0):
    """One fully observed column per sample; every other column has a masked entry in row 1 or 2,
    so the fully observed column is the unique longest contiguous column."""
    g = torch.Generator().manual_seed(seed)
    out = torch.ones(batch, N, N, dtype=torch.bool)
    full = torch.randint(0, N, (batch,), generator=g)
    for b in range(batch):
        for c in range(N):
            if c != int(full[b]):
                out[b, 1 + int(torch.randint(0, 2, (1,), generator=g)), c] = False
    return out.reshape(batch, P), full


def _pattern(kind: str, obs: torch.Tensor, extra=None) -> torch.Tensor:
    """[batch, q, k] hand-built attention of one head."""
    b = obs.shape[0]
    obs_k = obs[:, None, :].expand(b, P, P)
    eye = torch.eye(P, dtype=torch.bool).expand(b, P, P)
    if kind == "row":
        w = SAME_ROW.expand(b, P, P)
    elif kind == "column":
        w = SAME_COL.expand(b, P, P)
    elif kind == "identity":
        w = eye
    elif kind == "uniform":
        w = torch.ones(b, P, P, dtype=torch.bool)
    elif kind == "mask_ignore":
        w = obs_k
    elif kind == "observed_copy":
        row_obs = SAME_ROW & obs_k
        w = torch.where(obs[:, :, None], eye, row_obs)
    elif kind == "masked_row":
        in_mr = masks.masked_rows(obs, N, N)[:, ROWS]                  # [b, q]
        w = torch.where(in_mr[:, :, None], SAME_ROW & obs_k, torch.ones_like(eye))
    elif kind == "longest_contiguous_column":
        full = extra
        w = SAME_ROW & (COLS[None, None, :] == full[:, None, None])
    elif kind == "mask_sink":
        w = torch.where(obs[:, :, None], ~obs_k, eye)
    elif kind == "middle_row_static":
        w = (ROWS[None, :] == N // 2).expand(b, P, P)
    else:
        raise AssertionError(kind)
    return _normalize(w)


@pytest.mark.parametrize("kind, mask_kind", [
    ("row", "bernoulli"), ("column", "bernoulli"), ("identity", "bernoulli"),
    ("uniform", "bernoulli"), ("mask_ignore", "bernoulli"), ("observed_copy", "rowmask"),
    ("masked_row", "rowmask"), ("longest_contiguous_column", "lcc"),
    ("row", "rowmask"), ("column", "lcc"), ("identity", "rowmask"), ("mask_sink", "bernoulli"),
])
def test_pure_patterns_classify_as_their_type(kind, mask_kind):
    extra = None
    if mask_kind == "bernoulli":
        obs = _bernoulli()
    elif mask_kind == "rowmask":
        obs = _row_masks()
    else:
        obs, extra = _lcc_masks()
    a = _pattern(kind, obs, extra)[:, None, None]                   # [b, 1 layer, 1 head, q, k]
    table = heads.classify_heads(heads.head_scores(a, obs, N))
    assert table["type"].tolist() == [kind], table.T
    assert kind in table["types"].iloc[0].split(",")


def test_reference_score_values():
    """Exact values for pure patterns (4x4, nothing masked)."""
    eye = torch.eye(P, dtype=torch.float64)
    row = _normalize(SAME_ROW)
    t = heads.head_scores(torch.stack([row, _normalize(SAME_COL), eye])[None], None, N)
    assert t["row"].tolist() == pytest.approx([0.75, 0.0, 0.0])
    assert t["column"].tolist() == pytest.approx([0.0, 0.75, 0.0])
    assert t["identity"].tolist() == pytest.approx([0.25, 0.25, 1.0])   # no masked queries: min over observed only
    assert t["entropy"].tolist() == pytest.approx([0.5, 0.5, 0.0])
    assert t["static"].isna().all()                                     # one sample
    assert t["mask_ignore"].isna().all()                                # nothing masked
    assert t["paper_label"].tolist() == ["(1,1)", "(1,2)", "(1,3)"]
    assert t["layer"].tolist() == [0, 0, 0] and t["head"].tolist() == [0, 1, 2]


def test_masked_row_and_lcc_reference_values():
    obs = masks.row_mask(N, masked_rows=[1], keep=2)
    mr = _pattern("masked_row", obs[None])[0]
    t = heads.head_scores(mr[None, None], obs, N)
    # masked row (row 1): all mass on (1, 2), observed -> 1; other rows: uniform, row mass on
    # observed keys of the own row = 4/16.
    assert float(t["masked_row"].iloc[0]) == pytest.approx(1 - 4 / 16)
    obs_l, full = _lcc_masks(batch=1, seed=5)
    lcc = _pattern("longest_contiguous_column", obs_l, full)
    t = heads.head_scores(lcc[:, None, None], obs_l, N)
    assert float(t["longest_contiguous_column"].iloc[0]) == pytest.approx(1 - 1 / N)


def test_multi_head_model_like_tensor_and_static_input_processing():
    obs = _bernoulli(batch=8, seed=2)
    kinds = ["row", "column", "identity", "middle_row_static", "uniform"]
    layer = torch.stack([_pattern(k, obs) for k in kinds], dim=1)       # [b, head, q, k]
    a = torch.stack([layer, layer], dim=1)                              # [b, 2 layers, 5 heads, q, k]
    table = heads.classify_heads(heads.head_scores(a, obs, N))
    assert len(table) == 10
    got = table.set_index(["layer", "head"])["type"]
    assert [got[(0, h)] for h in range(5)] == ["row", "column", "identity", "input_processing", "uniform"]
    # input-processing heads are looked for in layer 0 only (by default)
    assert got[(1, 3)] == "other"
    anywhere = heads.classify_heads(heads.head_scores(a, obs, N),
                                    heads.HeadThresholds(input_processing_layers=None))
    assert anywhere.set_index(["layer", "head"])["type"][(1, 3)] == "input_processing"
    assert float(table["static"].iloc[3]) == pytest.approx(1.0)


def test_thresholds_are_parameters():
    obs = _bernoulli()
    a = _pattern("row", obs)[:, None, None]
    scores = heads.head_scores(a, obs, N)
    assert heads.classify_heads(scores)["type"].iloc[0] == "row"
    strict = heads.HeadThresholds(row=0.9)
    # a row pattern that never changes is, failing the row test, a static layer-0 head
    assert heads.classify_heads(scores, strict)["type"].iloc[0] == "input_processing"
    stricter = heads.HeadThresholds(row=0.9, input_processing_layers=())
    assert heads.classify_heads(scores, stricter)["type"].iloc[0] == "other"


def _random_patterns(seed, batch=3, heads_=2):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, 1, heads_, P, P, generator=g, dtype=torch.float64) * 2
    obs = torch.rand(batch, P, generator=g) >= 0.4
    return logits.softmax(-1), obs


def _relabel(a, obs, perm):
    """Move position k to perm[k] (same matrix entries, new sequence order)."""
    inv = torch.argsort(perm)
    return a[..., inv, :][..., :, inv], obs[:, inv]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_transpose_swaps_row_and_column(seed):
    a, obs = _random_patterns(seed)
    transpose = COLS * N + ROWS               # entry (r, c) goes to position of (c, r)
    at, obst = _relabel(a, obs, transpose)
    s, st_ = heads.head_scores(a, obs, N), heads.head_scores(at, obst, N)
    assert st_["row"].to_numpy() == pytest.approx(s["column"].to_numpy(), abs=1e-12)
    assert st_["column"].to_numpy() == pytest.approx(s["row"].to_numpy(), abs=1e-12)
    for col in ("identity", "self_observed", "observed_mass", "mask_ignore", "mask_sink", "entropy",
                "static"):
        assert st_[col].to_numpy() == pytest.approx(s[col].to_numpy(), abs=1e-12), col


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.permutations(range(N)), st.permutations(range(N)))
def test_scores_invariant_under_row_and_column_permutations(seed, row_perm, col_perm):
    a, obs = _random_patterns(seed)
    rp, cp = torch.tensor(row_perm), torch.tensor(col_perm)
    s = heads.head_scores(a, obs, N)
    # permuting columns: every score is invariant
    a2, o2 = _relabel(a, obs, ROWS * N + cp[COLS])
    s2 = heads.head_scores(a2, o2, N)
    for col in heads.SCORE_COLUMNS:
        assert s2[col].to_numpy() == pytest.approx(s[col].to_numpy(), abs=1e-12, nan_ok=True), col
    # permuting rows: all but the order-dependent ones (contiguity, middle row)
    a3, o3 = _relabel(a, obs, rp[ROWS] * N + COLS)
    s3 = heads.head_scores(a3, o3, N)
    for col in set(heads.SCORE_COLUMNS) - {"longest_contiguous_column", "middle_row"}:
        assert s3[col].to_numpy() == pytest.approx(s[col].to_numpy(), abs=1e-12, nan_ok=True), col


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000))
def test_score_ranges_and_streaming(seed):
    a, obs = _random_patterns(seed, batch=6)
    s = heads.head_scores(a, obs, N)
    for col in ("row", "column", "identity", "observed_copy", "self_observed", "observed_mass",
                "entropy", "static", "middle_row"):
        v = s[col].dropna().to_numpy()
        assert ((v >= -1e-12) & (v <= 1 + 1e-12)).all(), col
    assert ((s["row"] + s["column"]) <= 1 + 1e-9).all()
    assert s["masked_row"].between(-1 - 1e-12, 1 + 1e-12).all()
    acc = heads.HeadScoreAccumulator(N, N)
    acc.update(a[:2], obs[:2])
    acc.update(a[2:], obs[2:])
    streamed = acc.scores()
    for col in heads.SCORE_COLUMNS:
        assert streamed[col].to_numpy() == pytest.approx(s[col].to_numpy(), abs=1e-12, nan_ok=True)
    assert torch.allclose(acc.mean_patterns(), a.mean(0))


def test_fixed_mask_scores_are_linear_in_the_pattern():
    """With one shared mask, the linear scores of the mean map equal the per-sample pooled scores."""
    a, _ = _random_patterns(7, batch=5)
    obs = masks.row_mask(N, masked_rows=[0, 2], keep=1)
    per_sample = heads.head_scores(a, obs, N)
    of_mean = heads.head_scores(a.mean(0), obs, N)
    for col in ("row", "column", "identity", "observed_copy", "masked_row",
                "longest_contiguous_column", "mask_ignore", "observed_mass", "middle_row"):
        assert of_mean[col].to_numpy() == pytest.approx(per_sample[col].to_numpy(), abs=1e-12), col


def test_input_errors():
    with pytest.raises(ValueError, match="patterns"):
        heads.head_scores(torch.ones(1, 1, 1, 5, 5) / 5, None, N)
    with pytest.raises(ValueError, match="observed"):
        heads.head_scores(torch.ones(1, 1, 1, P, P) / P, torch.ones(P), N)
    with pytest.raises(ValueError, match="scores"):
        heads.classify_heads(heads.head_scores(torch.ones(1, 1, P, P) / P, None, N).drop(columns="row"))


# ------------------------------------------------------------------------------- model path
def test_analyse_heads_matches_run_with_cache(tiny_model, task4):
    batch = task4.sample(6, generator=torch.Generator().manual_seed(0))
    res = heads.analyse_heads(tiny_model, task4, batch=batch, batch_size=4)
    _, cache = tiny_model.run_with_cache(batch.tokens)
    L, H = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads
    expect = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"].mean(0) for l in range(L)])
    assert res.mean_patterns.shape == (L, H, P, P)
    assert torch.allclose(res.mean_patterns, expect, atol=1e-6)
    assert len(res.table) == L * H and res.n_samples == 6 and res.observed is None
    direct = heads.head_scores(torch.stack([cache[f"blocks.{l}.attn.hook_pattern"] for l in range(L)], 1),
                               batch.observed, N)
    assert res.table["row"].to_numpy() == pytest.approx(direct["row"].to_numpy(), abs=1e-6)
    assert tiny_model.active_hook_count() == 0


def test_analyse_heads_structured_mask_and_layer_subset(tiny_model, task4):
    obs = masks.row_mask(N, masked_rows=[1, 2], keep={1: 0, 2: 3})
    res = heads.analyse_heads(tiny_model, task4, 5, observed=obs, layers=[1],
                              generator=torch.Generator().manual_seed(1))
    assert torch.equal(res.observed, obs)
    assert res.table["layer"].unique().tolist() == [1]
    assert res.table["paper_label"].iloc[0] == "(2,1)"
    assert res.mean_patterns.shape == (1, tiny_model.cfg.n_heads, P, P)
    assert set(res.table["type"]) <= set(heads.HEAD_TYPES)


def test_head_score_evolution(tiny_cfg, task4):
    models = {100: tm.HookedEncoder(tiny_cfg, seed=1), 0: tm.HookedEncoder(tiny_cfg, seed=0)}
    ev = heads.head_score_evolution(models, task4, n_samples=4, seed=3)
    L, H = tiny_cfg.n_layers, tiny_cfg.n_heads
    assert ev["step"].tolist() == [0] * (L * H) + [100] * (L * H)
    # same samples for every checkpoint: the step-0 rows equal a direct analysis on those samples
    batch = task4.sample(4, generator=torch.Generator().manual_seed(3))
    direct = heads.analyse_heads(models[0], task4, batch=batch).table
    assert ev[ev.step == 0]["column"].to_numpy() == pytest.approx(direct["column"].to_numpy())


# ------------------------------------------------------------------------------------ figures
def test_head_figures_build_from_small_data(tiny_model, task4):
    import plotly.graph_objects as go

    from tfmatcomp.plotting import heads as hp

    obs = masks.row_mask(N, masked_rows=[1], keep=2)
    res = heads.analyse_heads(tiny_model, task4, 4, observed=obs)
    L, H = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads
    grid = hp.attention_grid_figure(res)
    assert isinstance(grid, go.Figure)
    assert len(grid.data) == L * H + 1                                  # + the mask panel
    titles = [a.text for a in grid.layout.annotations]
    assert titles[0].startswith("(1,1)") and titles[L * H - 1].startswith(f"({L},{H})")
    assert grid.data[-1].z.tolist() == masks.as_matrix(obs, N).int().tolist()
    assert torch.allclose(torch.tensor(grid.data[0].z), res.mean_patterns[0, 0].double(), atol=1e-6)

    sc = hp.head_scores_figure(res.table, ["row", "column"])
    assert len(sc.data) == 2 and list(sc.data[0].y) == list(range(1, L + 1))
    with pytest.raises(ValueError, match="scores"):
        hp.head_scores_figure(res.table, ["nope"])
    ty = hp.head_types_figure(res.table)
    assert ty.data[0].text[0][0] == res.table["type"].iloc[0]

    ev = heads.head_score_evolution({0: tiny_model, 5: tiny_model}, task4, n_samples=2)
    fig = hp.head_score_evolution_figure(ev, "column", heads=["(1,1)", (1, 0)])
    assert [t.name for t in fig.data] == ["(1,1)", "(2,1)"]
    assert list(fig.data[0].x) == [0, 5]
