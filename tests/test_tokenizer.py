from decimal import Decimal

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tfmatcomp import MASK_TOKEN_ID, ValueTokenizer

tok = ValueTokenizer()


def test_vocabulary_and_anchor_ids():
    assert tok.vocab_size == 2002
    assert MASK_TOKEN_ID == 0
    assert tok.encode(torch.tensor([-10.0, 0.0, 10.0])).tolist() == [1, 1001, 2001]


def test_every_grid_value_round_trips_exactly():
    # Build the grid from exact decimals so the expectation does not share our arithmetic.
    values = [float(Decimal(i) / 100) for i in range(-1000, 1001)]
    ids = tok.encode(torch.tensor(values, dtype=torch.float64))
    assert ids.tolist() == list(range(1, 2002))
    # and from float32 inputs (what the task produces)
    ids32 = tok.encode(torch.tensor(values, dtype=torch.float32))
    assert ids32.tolist() == list(range(1, 2002))
    back = tok.decode(ids)
    assert torch.allclose(back.double(), torch.tensor(values, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("v", [-9.89, -8.02, -5.07, -5.01])
def test_values_the_reference_mismaps(v):
    expected = 1 + int(Decimal(str(v)) * 100 + 1000)
    assert tok.encode(torch.tensor([v])).item() == expected
    # the reference's truncating cast gives one id too low for these
    assert int(100 * (torch.tensor(v, dtype=torch.float32).item() + 10)) + 1 == expected - 1


def test_mask_decodes_to_mask_value():
    assert tok.decode(torch.tensor([0]), mask_value=-7.0).item() == -7.0


@pytest.mark.parametrize("bad", [10.01, -10.2, float("nan"), float("inf")])
def test_out_of_range_values_raise(bad):
    with pytest.raises(ValueError, match="values"):
        tok.encode(torch.tensor([0.0, bad]))


@pytest.mark.parametrize("bad", [-1, 2002])
def test_out_of_vocab_ids_raise(bad):
    with pytest.raises(ValueError, match="ids"):
        tok.decode(torch.tensor([bad]))


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-10, max_value=10, allow_nan=False))
def test_encode_is_nearest_grid_point(v):
    i = tok.encode(torch.tensor([v], dtype=torch.float64)).item()
    decoded = (i - 1) / 100 - 10
    assert abs(decoded - v) <= 0.005 + 1e-9
    assert 1 <= i <= 2001
