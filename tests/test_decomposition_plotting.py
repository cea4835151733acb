"""Figures for the decomposition: they build, carry the right data, and reject bad arguments."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from tfmatcomp.decomposition import accumulate, decompose, residual_pass
from tfmatcomp.geometry import gram_dct, qk_decomposition
from tfmatcomp.plotting.decomposition import gram_figure, pos_pca_figure, qk_figure, spectrum_figure


@pytest.fixture()
def decs(tiny_model, task4):
    g = torch.Generator().manual_seed(0)
    acc = accumulate(tiny_model, [task4.sample(32, generator=g)], progress=False)
    second = residual_pass(tiny_model, acc, task4.sample(6, generator=g))
    return acc, second


def test_pos_pca_figure(decs):
    acc, second = decs
    fig = pos_pca_figure(second, n_cvec=50, n_rows=4)
    assert isinstance(fig, go.Figure)
    assert len(fig.data) == 2 * len(second)  # cvec + pos per layer
    pos_trace = [t for t in fig.data if t.name == "pos"][0]
    assert len(pos_trace.x) == 16 and "row 3, col 3" in pos_trace.text[-1]
    cvec_trace = [t for t in fig.data if t.name == "cvec"][0]
    assert len(cvec_trace.x) == 50
    # without residuals only pos is drawn
    assert len(pos_pca_figure(acc.result()).data) == 1
    with pytest.raises(ValueError, match="decompositions"):
        pos_pca_figure("nope")


def test_gram_figure(decs):
    acc, _ = decs
    dec = acc.result("blocks.1.hook_resid_pre")
    labels = torch.arange(32) % 4
    fig = gram_figure(dec, labels, max_contexts=20)
    z = np.asarray(fig.data[0].z)
    assert z.shape == (36, 36)
    assert np.allclose(np.diag(z), 1.0)
    with pytest.raises(ValueError, match="labels"):
        gram_figure(dec, torch.arange(3))


def test_spectrum_figure(decs):
    _, second = decs
    dec = second["blocks.1.hook_resid_pre"]
    fig = spectrum_figure(dec, n_values=10, dct_k=5)
    names = [t.name for t in fig.data if isinstance(t, go.Scatter)]
    assert names == ["pos", "cvec", "resid"]
    heat = [t for t in fig.data if isinstance(t, go.Heatmap)][0]
    assert np.allclose(np.asarray(heat.z), gram_dct(dec.pos).abs()[:5, :5].numpy())
    pos_sv = [t for t in fig.data if t.name == "pos"][0].y
    ref = torch.linalg.svdvals(dec.pos.double())[:10] / 4.0
    assert np.allclose(pos_sv, ref.numpy())


def test_qk_figure(tiny_model, task4, decs):
    acc, _ = decs
    tokens = task4.sample(2, generator=torch.Generator().manual_seed(1)).tokens
    qk = qk_decomposition(tiny_model, tokens, 1, acc.result("blocks.1.hook_resid_pre"), heads=[1, 3])
    fig = qk_figure(qk, head=3, batch_index=1)
    assert len(fig.data) == 6
    assert np.allclose(np.asarray(fig.data[0].z), qk.pos_pos[1, 1].numpy())
    assert np.allclose(np.asarray(fig.data[5].z), qk.pattern[1, 1].double().numpy())
    assert "layer 1, head 3 (0-based)" in fig.layout.title.text
    with pytest.raises(ValueError, match="head"):
        qk_figure(qk, head=0)
    with pytest.raises(ValueError, match="batch_index"):
        qk_figure(qk, head=1, batch_index=2)
