"""Structured masks: exact layouts, the longest contiguous column, and use with the task."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tfmatcomp as tm
from tfmatcomp.task import masks


def test_row_mask_layout_and_task_roundtrip(task4):
    obs = masks.row_mask(4, masked_rows=[0, 3], keep={0: [1, 2], 3: 0})
    assert obs.dtype == torch.bool and obs.shape == (16,)
    assert masks.as_matrix(obs, 4).int().tolist() == [
        [0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]
    batch = task4.sample(5, generator=torch.Generator().manual_seed(1), observed=obs)
    assert torch.equal(batch.observed, obs.expand(5, -1))
    assert bool((batch.tokens[:, ~obs] == tm.MASK_TOKEN_ID).all())


def test_column_mask_is_transpose_of_row_mask():
    r = masks.as_matrix(masks.row_mask(5, masked_rows=[1, 4], keep={1: 2, 4: [0, 3]}), 5)
    c = masks.as_matrix(masks.column_mask(5, masked_cols=[1, 4], keep={1: 2, 4: [0, 3]}), 5)
    assert torch.equal(r.T, c)


def test_rectangular_and_full_row():
    obs = masks.row_mask(2, 3, masked_rows=[1])
    assert obs.tolist() == [True, True, True, False, False, False]
    assert masks.format_mask(obs, 2, 3) == "# # #\n. . ."


@pytest.mark.parametrize("kwargs, match", [
    (dict(masked_rows=[4]), "masked_rows"),
    (dict(masked_rows=[1], keep=7), "keep"),
    (dict(masked_rows=[1], keep={2: 0}), "keep"),
])
def test_row_mask_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        masks.row_mask(4, **kwargs)


def test_random_row_masks_structure():
    g = torch.Generator().manual_seed(3)
    obs = masks.random_row_masks(5, 4, n_masked_rows=2, batch_size=50, n_keep=1, generator=g)
    m = masks.as_matrix(obs, 5, 4)
    per_row_masked = (~m).sum(-1)                     # [batch, rows]
    assert bool(((per_row_masked == 0) | (per_row_masked == 3)).all())
    assert bool(((per_row_masked == 3).sum(-1) == 2).all())
    # reproducible from the generator alone
    again = masks.random_row_masks(5, 4, 2, 50, 1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(obs, again)
    cols = masks.random_column_masks(4, 5, n_masked_cols=1, batch_size=7, n_keep=2,
                                     generator=torch.Generator().manual_seed(0))
    assert bool(((~masks.as_matrix(cols, 4, 5)).sum((-2, -1)) == 2).all())


def _brute_runs(m):
    n_rows, n_cols = m.shape
    out = []
    for c in range(n_cols):
        best = run = 0
        for r in range(n_rows):
            run = run + 1 if bool(m[r, c]) else 0
            best = max(best, run)
        out.append(best)
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_contiguous_runs_match_brute_force(n_rows, n_cols, seed):
    obs = torch.rand(n_rows * n_cols, generator=torch.Generator().manual_seed(seed)) < 0.6
    runs = masks.contiguous_observed_run_lengths(obs, n_rows, n_cols)
    expect = _brute_runs(masks.as_matrix(obs, n_rows, n_cols))
    assert runs.tolist() == expect
    lcc = masks.longest_contiguous_columns(obs, n_rows, n_cols)
    best = max(expect)
    assert lcc.tolist() == [best > 0 and r == best for r in expect]
    # batched form agrees with the single-mask form
    assert torch.equal(masks.longest_contiguous_columns(obs[None].expand(2, -1), n_rows, n_cols)[1], lcc)


def test_masked_rows_fraction():
    obs = masks.observed_from_matrix([[1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1], [1, 0, 1, 1]])
    assert masks.masked_rows(obs, 4).tolist() == [False, True, True, False]
    assert masks.masked_rows(obs, 4, min_masked_fraction=0.75).tolist() == [False, False, True, False]
    with pytest.raises(ValueError, match="min_masked_fraction"):
        masks.masked_rows(obs, 4, min_masked_fraction=0.0)
