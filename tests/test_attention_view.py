"""Labelled tokens for matrices and the one-call attention view of one example."""

from __future__ import annotations

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.plotting import attention_view
from tfmatcomp.plotting.attention import MAX_WIDTH


@pytest.fixture(scope="module")
def run():
    preset = tm.get_preset("tiny")
    model = tm.HookedEncoder(preset.model, seed=0).eval()
    batch = preset.task.build().sample(3, generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(batch.tokens)
    return model, batch, cache


def test_to_str_tokens_names_row_column_and_value_or_mask(run):
    _, batch, _ = run
    labels = batch.to_str_tokens(2)
    assert len(labels) == batch.n_rows * batch.n_cols
    for k, (label, seen) in enumerate(zip(labels, batch.observed[2].tolist())):
        r, c = divmod(k, batch.n_cols)
        assert label.startswith(f"({r},{c})=")
        if seen:
            assert float(label.split("=")[1]) == pytest.approx(batch.values[2, k].item(), abs=5e-3)
        else:
            assert label.endswith("=MASK")
    assert "MASK" in "".join(labels) and labels != batch.to_str_tokens(0)
    with pytest.raises(ValueError, match="i: "):
        batch.to_str_tokens(3)


def test_attention_view_draws_every_head_labelled_within_the_page(run):
    model, batch, cache = run
    fig = attention_view(cache, batch, 1)
    n_l, n_h = model.cfg.n_layers, model.cfg.n_heads
    assert len(fig.data) == n_l * n_h and fig.layout.width <= MAX_WIDTH
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:2] == ["L1 H1", "L1 H2"] and f"L{n_l} H{n_h}" in titles
    ticks = list(fig.layout.xaxis.ticktext)
    masked = [t for t in ticks if "MASK" in t]
    assert masked and all(t.startswith("<b>") for t in masked)      # masked entries marked
    assert ticks == [f"<b>{t}</b>" if t.endswith("MASK") else t for t in batch.to_str_tokens(1)]
    torch.testing.assert_close(torch.tensor(fig.data[n_h].z, dtype=torch.float32),
                               cache["blocks.1.attn.hook_pattern"][1, 0])
    one = attention_view(cache, batch, 1, layers=[0])
    assert len(one.data) == n_h
    with pytest.raises(ValueError, match="layers"):
        attention_view(cache, batch, 1, layers=[7])
    with pytest.raises(ValueError, match="backend"):
        attention_view(cache, batch, 1, backend="bertviz")


def test_a_wide_model_still_fits_1200_px():
    cfg = tm.EncoderConfig(n_layers=1, n_heads=12, d_model=48, d_mlp=32, n_ctx=49)
    model = tm.HookedEncoder(cfg, seed=0).eval()
    batch = tm.TaskConfig(n_rows=7, rank=2).build().sample(1, generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(batch.tokens)
    fig = attention_view(cache, batch, 0)
    assert fig.layout.width <= MAX_WIDTH and len(fig.data) == 12


def test_circuitsvis_backend_labels_the_tokens(run):
    pytest.importorskip("circuitsvis", reason="the notebook extra")
    _, batch, cache = run
    view = attention_view(cache, batch, 0, backend="circuitsvis")
    html = str(view)
    assert "(0,0)=" in html and "MASK" in html and "L2H4" in html
