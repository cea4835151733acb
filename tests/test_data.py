import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmatcomp import MatrixBatch, MatrixCompletionTask
from tfmatcomp.task.data import DISTRIBUTIONS


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_batch_fields_and_rounding():
    task = MatrixCompletionTask(n_rows=7, rank=2, p_mask=0.3)
    b = task.sample(32, generator=gen())
    assert b.tokens.shape == b.values.shape == b.observed.shape == (32, 49)
    assert b.tokens.dtype == torch.long and b.observed.dtype == torch.bool
    assert torch.equal(b.tokens[b.masked], torch.zeros_like(b.tokens[b.masked]))
    assert (b.tokens[b.observed] > 0).all()
    # targets are on the 0.01 grid and decode from the tokens at observed entries
    assert torch.allclose(b.values * 100, torch.round(b.values * 100), atol=1e-3)
    assert torch.allclose(b.tokenizer.decode(b.tokens)[b.observed], b.values[b.observed], atol=1e-6)
    assert b.values.abs().max() <= 2.0


def test_same_generator_same_batch_and_rank():
    task = MatrixCompletionTask(n_rows=6, n_cols=5, rank=2)
    a, b = task.sample(8, generator=gen(3)), task.sample(8, generator=gen(3))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.observed, b.observed)
    x = task.sample_matrices(8, generator=gen(1))
    assert x.shape == (8, 6, 5)
    assert (torch.linalg.matrix_rank(x, atol=1e-5) == 2).all()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), m=st.integers(1, 6), p=st.floats(0, 0.95), seed=st.integers(0, 2**31 - 1),
       dist=st.sampled_from(DISTRIBUTIONS))
def test_sampling_properties(n, m, p, seed, dist):
    r = min(n, m)
    task = MatrixCompletionTask(n_rows=n, n_cols=m, rank=r, p_mask=p, distribution=dist)
    b = task.sample(16, generator=gen(seed))
    assert b.tokens.shape == (16, n * m)
    assert ((b.tokens == 0) == b.masked).all()
    assert b.values.abs().max() <= 10
    if p == 0:
        assert b.observed.all()


def test_mask_rate_matches_p_mask():
    task = MatrixCompletionTask(n_rows=7, rank=2, p_mask=0.3)
    obs = task.sample_observed(4000, generator=gen())
    assert abs((~obs).float().mean().item() - 0.3) < 0.01


def test_explicit_mask_and_negation():
    task = MatrixCompletionTask(n_rows=3, rank=1)
    mask = torch.tensor([True, False, True] * 3)
    b = task.sample(4, generator=gen(), observed=mask)
    assert (b.observed == mask).all()
    neg = b.negated()
    assert torch.equal(neg.observed, b.observed)
    assert torch.allclose(neg.values, -b.values)
    sub = b.with_mask_value(0.44)
    assert (sub[b.masked] == b.tokenizer.encode(torch.tensor(0.44))).all()
    assert torch.equal(sub[b.observed], b.tokens[b.observed])


def test_full_rank_random_matrices():
    task = MatrixCompletionTask(n_rows=5, rank=None)
    x = task.sample_matrices(16, generator=gen())
    assert (torch.linalg.matrix_rank(x, atol=1e-5) == 5).all()


@pytest.mark.parametrize("kwargs,name", [
    (dict(n_rows=4, rank=5), "rank"),
    (dict(n_rows=4, rank=0), "rank"),
    (dict(n_rows=4, p_mask=1.0), "p_mask"),
    (dict(n_rows=4, p_mask=-0.1), "p_mask"),
    (dict(n_rows=4, p_mask=float("nan")), "p_mask"),
    (dict(n_rows=0), "n_rows"),
    (dict(n_rows=4, distribution="cauchy"), "distribution"),
])
def test_bad_task_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MatrixCompletionTask(**kwargs)


def test_bad_explicit_mask_and_values():
    task = MatrixCompletionTask(n_rows=3, rank=1)
    with pytest.raises(ValueError, match="observed"):
        task.sample(2, generator=gen(), observed=torch.ones(8, dtype=torch.bool))
    with pytest.raises(ValueError, match="values"):
        MatrixBatch.from_values(torch.full((1, 9), 11.0), torch.ones(1, 9, dtype=torch.bool), 3, 3)
    with pytest.raises(ValueError, match="values"):
        MatrixBatch.from_values(torch.full((1, 9), float("nan")), torch.ones(1, 9, dtype=torch.bool), 3, 3)
