"""The papers' losses: L (all entries), L_obs (observed), L_mask (masked), L'_mask (vs a value m).

Following the papers' code, each loss is a mean of squared errors over *all* entries of its set in
the batch (entries pooled across matrices), not a mean of per-matrix means. The two differ only in
how matrices with more masked entries are weighted.

Example:
    >>> import torch
    >>> from tfmatcomp import MatrixCompletionTask, losses
    >>> batch = MatrixCompletionTask(n_rows=4, rank=1).sample(16, generator=torch.Generator().manual_seed(0))
    >>> out = losses(torch.zeros_like(batch.values), batch)   # predict 0 everywhere
    >>> sorted(out)
    ['L', 'L_mask', 'L_obs', 'mean_abs_pred_mask']
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.task.data import MatrixBatch

__all__ = ["mse", "losses", "L_mask_prime", "mean_abs_prediction"]


def mse(
    predictions: Float[Tensor, "batch pos"],
    targets: Float[Tensor, "batch pos"],
    where: Bool[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, ""]:
    """Mean squared error: the mean of ``(predictions - targets)^2`` over every entry, or over the
    entries where ``where`` is True. Over every entry it is the papers' ``L`` (the training loss);
    with ``where=batch.masked`` it is ``L_mask``, with ``batch.observed`` ``L_obs``.

    Returns NaN when the set is empty (e.g. L_mask of a batch with nothing masked).

    Example:
        >>> import torch
        >>> p, t = torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 0.0]])
        >>> float(mse(p, t)), float(mse(p, t, torch.tensor([[True, False]])))
        (5.0, 1.0)
    """
    if predictions.shape != targets.shape:
        raise ValueError(f"predictions: shape {tuple(predictions.shape)} does not match targets "
                         f"{tuple(targets.shape)}")
    sq = (predictions.float() - targets.float()).pow(2)
    if where is None:
        return sq.mean()
    where = where.expand_as(sq)
    return sq[where].mean() if where.any() else sq.new_tensor(float("nan"))


def losses(predictions: Float[Tensor, "batch pos"], batch: MatrixBatch, as_floats: bool = False
           ) -> dict[str, Tensor] | dict[str, float]:
    """``L``, ``L_obs``, ``L_mask`` against the rounded targets, and ``mean_abs_pred_mask``, the
    mean ``|prediction|`` at masked entries (0 means the model copies MASK as 0).

    Args:
        predictions: ``[batch, n_rows * n_cols]`` predicted values.
        batch: the batch they predict (moved to the predictions' device if it is elsewhere).
        as_floats: False (default): 0-d tensors that keep the predictions' graph, so
            ``losses(model(t), b)["L_mask"].backward()`` gives gradients for attribution. True:
            the same four numbers as plain Python floats, for tables and printing.

    Example:
        >>> import torch
        >>> from tfmatcomp import MatrixCompletionTask
        >>> b = MatrixCompletionTask(n_rows=4, rank=1).sample(2, generator=torch.Generator().manual_seed(0))
        >>> losses(b.values, b, as_floats=True)["L"]
        0.0
    """
    if batch.values.device != predictions.device:
        batch = batch.to(predictions.device)
    out = {
        "L": mse(predictions, batch.values),
        "L_obs": mse(predictions, batch.values, batch.observed),
        "L_mask": mse(predictions, batch.values, batch.masked),
        "mean_abs_pred_mask": mean_abs_prediction(predictions, batch.masked),
    }
    if as_floats:
        return {k: float(v.detach()) for k, v in out.items()}
    return out


def L_mask_prime(predictions: Float[Tensor, "batch pos"], batch: MatrixBatch, m: float) -> Float[Tensor, ""]:
    """``L'_mask``: MSE between the predictions at masked entries and the substituted value ``m``
    (the workshop paper, Section 3.1.1). With MASK left in place, use ``m = 0``."""
    return mse(predictions, torch.full_like(predictions, float(m)), batch.masked)


def mean_abs_prediction(predictions: Float[Tensor, "batch pos"],
                        where: Bool[Tensor, "batch pos"]) -> Float[Tensor, ""]:
    """Mean ``|prediction|`` over the entries where ``where`` is True (NaN if none)."""
    a = predictions.float().abs()
    return a[where].mean() if where.any() else a.new_tensor(float("nan"))
