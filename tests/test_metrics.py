import math

import torch

from tfmatcomp import L_mask_prime, MatrixBatch, losses


def test_losses_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    observed = torch.tensor([[True, True, False, False]])
    b = MatrixBatch.from_values(values, observed, 2, 2)
    pred = torch.tensor([[1.0, 1.0, 0.0, 2.0]])
    out = losses(pred, b)
    assert math.isclose(out["L"].item(), (0 + 1 + 9 + 4) / 4)
    assert math.isclose(out["L_obs"].item(), 0.5)
    assert math.isclose(out["L_mask"].item(), 6.5)
    assert math.isclose(out["mean_abs_pred_mask"].item(), 1.0)
    assert math.isclose(L_mask_prime(pred, b, 0.5).item(), (0.25 + 2.25) / 2)


def test_pooled_over_batch():
    values = torch.zeros(2, 4)
    observed = torch.tensor([[True, True, True, False], [True, False, False, False]])
    b = MatrixBatch.from_values(values, observed, 2, 2)
    pred = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 2.0, 2.0, 2.0]])
    # masked entries pooled: (1 + 4 + 4 + 4) / 4
    assert math.isclose(losses(pred, b)["L_mask"].item(), 13 / 4)


def test_empty_set_is_nan():
    b = MatrixBatch.from_values(torch.zeros(1, 4), torch.ones(1, 4, dtype=torch.bool), 2, 2)
    assert math.isnan(losses(torch.zeros(1, 4), b)["L_mask"].item())
