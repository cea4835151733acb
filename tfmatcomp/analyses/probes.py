"""Linear probes on hidden states: what does each layer know about the input matrix?

The workshop paper Appendix I / the NeurIPS paper Section 3.2.2 and Appendix K probe, for every element of the input,
its hidden state after a given layer with a linear map fitted by least squares. Targets:

* ``"masked_row"``: the row of the *masked* input matrix that contains the element (missing entries
  replaced by 0), a vector of ``n_cols`` (the papers' Fig. 6 / Fig. 11);
* ``"value"``: the element's true value ``X_ij`` (rounded, as the losses use), fitted and reported
  separately at masked entries and at observed entries;
* ``"singular_vector"``: the top singular vector of the true ``X`` (right, ``n_cols``, by default;
  left with ``singular_side="left"``), the same target for every element of a matrix.

Layer convention (probe tables say ``layer``): ``layer 0`` is the embedding output
``hook_full_embed``; ``layer l`` for ``l >= 1`` is the output of block ``l - 1`` (0-based), hook
``blocks.{l-1}.hook_normalized_resid_post``. So ``layer l`` is "after ``l`` layers", which is also
the papers' 1-based "layer l". This is the library's hidden-state convention
(:mod:`tfmatcomp.models.hook_names`); probe tables name each state by the hook that writes it
(``at="layer_output"``), which carries the same tensor as ``blocks.{l}.hook_resid_pre``. The table
carries the hook name of each row. Hidden states come through :func:`tfmatcomp.datapath.run_chunked`.

Probes are affine (weights plus a bias), fitted in closed form in float64 with optional ridge
``lambda * ||W||^2`` (the bias is not penalised). The train / test split is by *matrix* (all
elements of a matrix fall on the same side), drawn from an explicit generator.

Example:
    >>> import torch
    >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
    >>> from tfmatcomp.analyses.probes import probe_layers
    >>> model = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
    >>> batch = MatrixCompletionTask(n_rows=4, rank=1).sample(64, generator=torch.Generator().manual_seed(0))
    >>> table = probe_layers(model, batch, ridge=1e-3, generator=torch.Generator().manual_seed(1))
    >>> table["layer"].tolist()
    [0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp._progress import check_progress, tracked
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.datapath import run_chunked
from tfmatcomp.models.hook_names import resid_name
from tfmatcomp.task.masks import positions_to_rows_cols
from tfmatcomp.validation import check_choice, check_in_range, check_non_negative

__all__ = [
    "LinearProbe",
    "hidden_states",
    "masked_row_targets",
    "value_targets",
    "top_singular_vector_targets",
    "fit_linear_probe",
    "probe_metrics",
    "split_matrices",
    "probe_layers",
    "PROBE_TARGETS",
]

PROBE_TARGETS = ("masked_row", "value", "singular_vector")


# --------------------------------------------------------------------------- hidden states
def hidden_states(
    model,
    tokens: Tensor,
    layers: Sequence[int] | None = None,
    batch_size: int = 256,
) -> dict[int, Float[Tensor, "batch pos d_model"]]:
    """Hidden states after each requested layer, via ``model.run_with_cache`` (no gradients).

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder`.
        tokens: ``[batch, pos]`` token ids (e.g. ``batch.tokens``).
        layers: layers in the probe convention (0 = embedding output, ``l`` = after block ``l-1``);
            all ``0..n_layers`` when None.
        batch_size: matrices per forward pass (memory bound only; results do not depend on it).

    Example:
        >>> import torch
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> model = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
        >>> hs = hidden_states(model, torch.ones(3, 16, dtype=torch.long))
        >>> sorted(hs), hs[2].shape
        ([0, 1, 2], torch.Size([3, 16, 16]))
    """
    n_layers = model.cfg.n_layers
    layers = list(range(n_layers + 1)) if layers is None else [int(l) for l in layers]
    names = {resid_name(l, n_layers, at="layer_output", arg="layers"): l for l in layers}
    _, cache = run_chunked(model, tokens, batch_size=batch_size, names=list(names),
                           return_predictions=False)
    return {l: cache[name] for name, l in names.items()}


# --------------------------------------------------------------------------------- targets
def masked_row_targets(batch: MatrixBatch) -> Float[Tensor, "batch pos n_cols"]:
    """For every element, the row of the masked input containing it (masked entries set to 0).

    Example:
        >>> import torch
        >>> from tfmatcomp import MatrixBatch
        >>> b = MatrixBatch.from_values(torch.tensor([[1., 2., 3., 4.]]),
        ...                             torch.tensor([[True, False, True, True]]), 2, 2)
        >>> masked_row_targets(b)[0].tolist()
        [[1.0, 0.0], [1.0, 0.0], [3.0, 4.0], [3.0, 4.0]]
    """
    masked_input = torch.where(batch.observed, batch.values, torch.zeros_like(batch.values))
    rows, _ = positions_to_rows_cols(batch.n_rows, batch.n_cols, device=batch.device)
    return masked_input.reshape(-1, batch.n_rows, batch.n_cols)[:, rows, :]


def value_targets(batch: MatrixBatch) -> Float[Tensor, "batch pos 1"]:
    """For every element, its true value ``X_ij`` (rounded, as the losses use), as a 1-vector."""
    return batch.values.unsqueeze(-1)


def top_singular_vector_targets(batch: MatrixBatch, side: str = "right") -> Float[Tensor, "batch pos k"]:
    """The top singular vector of each true matrix ``X``, repeated for every element.

    ``side="right"``: ``v_1`` (length ``n_cols``; a rank-1 row ``X_i = s u_i v_1^T`` is a multiple
    of it); ``side="left"``: ``u_1`` (length ``n_rows``). The sign of a singular vector is arbitrary;
    we fix it so that its largest-magnitude entry is positive, and the probe metrics are
    sign-invariant anyway (see :func:`probe_metrics`).

    Example:
        >>> import torch
        >>> from tfmatcomp import MatrixBatch
        >>> b = MatrixBatch.from_values(torch.tensor([[0., -3., 0., 0.]]), torch.ones(1, 4, dtype=torch.bool), 2, 2)
        >>> top_singular_vector_targets(b)[0, 0].tolist()
        [0.0, 1.0]
    """
    check_choice("side", side, ("left", "right"))
    x = batch.values.to(torch.float64).reshape(-1, batch.n_rows, batch.n_cols)
    u, _, vh = torch.linalg.svd(x, full_matrices=False)
    vec = u[..., :, 0] if side == "left" else vh[..., 0, :]               # [batch, k]
    idx = vec.abs().argmax(-1, keepdim=True)
    sign = torch.sign(vec.gather(-1, idx))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    vec = (vec * sign).to(batch.values.dtype)
    return vec[:, None, :].expand(-1, batch.n_rows * batch.n_cols, -1)


# ------------------------------------------------------------------------------- the probe
@dataclass(frozen=True)
class LinearProbe:
    """An affine map ``features @ weight + bias`` fitted by (ridge) least squares, in float64.

    Attributes:
        weight: ``[d_features, d_target]``.
        bias: ``[d_target]``.
        ridge: the ridge strength it was fitted with.
    """

    weight: Float[Tensor, "d_features d_target"]
    bias: Float[Tensor, "d_target"]
    ridge: float = 0.0

    def predict(self, features: Float[Tensor, "n d_features"]) -> Float[Tensor, "n d_target"]:
        """Predictions (float64) for ``features [..., d_features]``."""
        return features.to(self.weight) @ self.weight + self.bias


def fit_linear_probe(
    features: Float[Tensor, "n d_features"],
    targets: Float[Tensor, "n d_target"],
    ridge: float = 0.0,
    rcond: float = 1e-10,
) -> LinearProbe:
    """Closed-form affine least squares: minimise ``||F W + b - Y||^2 + ridge * ||W||^2``.

    Features and targets are centred (which fits the un-penalised bias exactly), then
    ``W = (Fc^T Fc + ridge I)^+ Fc^T Yc`` through an eigendecomposition of the Gram matrix in
    float64. With ``ridge = 0`` eigen-directions below ``rcond * largest eigenvalue`` are dropped,
    giving the minimum-norm solution when the features are rank deficient. Works on the features'
    device.

    Args:
        features: ``[n, d_features]`` (any float dtype).
        targets: ``[n, d_target]`` or ``[n]``.
        ridge: ridge strength ``>= 0`` (0: ordinary least squares).
        rcond: relative eigenvalue cut-off for the pseudo-inverse.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> f = torch.randn(100, 5, generator=g, dtype=torch.float64)
        >>> w = torch.randn(5, 2, generator=g, dtype=torch.float64)
        >>> probe = fit_linear_probe(f, f @ w + 3.0)
        >>> torch.allclose(probe.weight, w), torch.allclose(probe.bias, torch.full((2,), 3.0, dtype=torch.float64))
        (True, True)
    """
    if features.ndim != 2:
        raise ValueError(f"features: expected [n, d_features], got shape {tuple(features.shape)}")
    if targets.ndim == 1:
        targets = targets[:, None]
    if targets.ndim != 2 or targets.shape[0] != features.shape[0]:
        raise ValueError(f"targets: expected [n, d_target] with n = {features.shape[0]}, got shape "
                         f"{tuple(targets.shape)}")
    if features.shape[0] < 1:
        raise ValueError("features: need at least one sample to fit a probe")
    check_non_negative("ridge", ridge)
    f = features.to(torch.float64)
    y = targets.to(device=f.device, dtype=torch.float64)
    f_mean, y_mean = f.mean(0), y.mean(0)
    fc, yc = f - f_mean, y - y_mean
    gram = fc.T @ fc
    evals, evecs = torch.linalg.eigh(gram)
    denom = evals + ridge
    cutoff = rcond * evals.abs().max().clamp_min(torch.finfo(torch.float64).tiny)
    keep = denom > cutoff if ridge == 0 else denom > 0
    inv = torch.where(keep, 1.0 / torch.where(keep, denom, torch.ones_like(denom)), torch.zeros_like(denom))
    weight = evecs @ (inv[:, None] * (evecs.T @ (fc.T @ yc)))
    bias = y_mean - f_mean @ weight
    return LinearProbe(weight=weight, bias=bias, ridge=float(ridge))


def probe_metrics(
    predictions: Float[Tensor, "n d_target"],
    targets: Float[Tensor, "n d_target"],
    sign_invariant: bool = False,
) -> dict[str, float]:
    """``mse`` (mean over elements and components), ``cos`` (mean ``|cosine|`` between prediction
    and target vectors, over elements whose target and prediction are non-zero; NaN for scalar
    targets) and ``r2`` (1 - SSE / total sum of squares about the target mean).

    With ``sign_invariant=True`` (singular vectors) the squared error of each element is
    ``min(||p - t||^2, ||p + t||^2)``.

    Example:
        >>> import torch
        >>> t = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> probe_metrics(-t, t, sign_invariant=True)["mse"], probe_metrics(-t, t)["cos"]
        (0.0, 1.0)
    """
    p = predictions.to(torch.float64)
    t = targets.to(device=p.device, dtype=torch.float64)
    if p.ndim == 1:
        p, t = p[:, None], t[:, None]
    sq = (p - t).pow(2).sum(-1)
    if sign_invariant:
        sq = torch.minimum(sq, (p + t).pow(2).sum(-1))
    mse = (sq.sum() / t.numel()).item()
    sst = (t - t.mean(0)).pow(2).sum()
    r2 = (1.0 - sq.sum() / sst).item() if sst > 0 else float("nan")
    cos = float("nan")
    if t.shape[-1] > 1:
        pn, tn = p.norm(dim=-1), t.norm(dim=-1)
        ok = (pn > 0) & (tn > 0)
        if ok.any():
            cos = ((p * t).sum(-1)[ok] / (pn[ok] * tn[ok])).abs().mean().item()
    return {"mse": mse, "cos": cos, "r2": r2}


def split_matrices(n_samples: int, test_fraction: float = 0.25,
                   generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Random split of matrix indices ``0..n_samples-1`` into (train, test), both non-empty.

    The permutation comes from ``generator`` (a fresh ``manual_seed(0)`` CPU generator when None).

    Example:
        >>> import torch
        >>> train, test = split_matrices(8, 0.25, torch.Generator().manual_seed(0))
        >>> len(train), len(test), sorted(train.tolist() + test.tolist()) == list(range(8))
        (6, 2, True)
    """
    if not isinstance(n_samples, int) or n_samples < 2:
        raise ValueError(f"n_samples: need at least 2 matrices to split, got {n_samples!r}")
    check_in_range("test_fraction", test_fraction, 0.0, 1.0, closed=False)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    perm = torch.randperm(n_samples, generator=generator, device=generator.device).cpu()
    n_test = min(max(1, round(test_fraction * n_samples)), n_samples - 1)
    return perm[n_test:].sort().values, perm[:n_test].sort().values


def _fit_and_score(feat, tgt, train_sel, test_sel, ridge, sign_invariant):
    probe = fit_linear_probe(feat[train_sel], tgt[train_sel], ridge=ridge)
    if not test_sel.any():
        return {"mse": float("nan"), "cos": float("nan"), "r2": float("nan")}
    return probe_metrics(probe.predict(feat[test_sel]), tgt[test_sel], sign_invariant=sign_invariant)


def probe_layers(
    model,
    batch: MatrixBatch,
    targets: Sequence[str] = PROBE_TARGETS,
    *,
    layers: Sequence[int] | None = None,
    ridge: float = 0.0,
    test_fraction: float = 0.25,
    generator: torch.Generator | None = None,
    singular_side: str = "right",
    batch_size: int = 256,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Fit and test one linear probe per (layer, target); one table row per layer.

    Hidden states come from ``model.run_with_cache`` (see :func:`hidden_states` for the layer
    convention). Matrices are split into train / test with :func:`split_matrices`; every element
    (position) of a matrix is one probe sample.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder`.
        batch: samples from :class:`~tfmatcomp.MatrixCompletionTask` (``task.sample(...)``).
        targets: any of ``"masked_row"``, ``"value"``, ``"singular_vector"``.
        layers: probe-convention layers (default all, ``0..n_layers``).
        ridge: ridge strength (0 = least squares, as the papers).
        test_fraction: fraction of matrices held out.
        generator: drives the split (default ``manual_seed(0)``).
        singular_side: ``"right"`` or ``"left"`` singular vector.
        batch_size: matrices per forward pass.
        progress: a bar over the layers probed (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        DataFrame with columns ``layer``, ``hook_name``, ``n_train``, ``n_test`` (matrices) and per
        target: ``masked_row_mse``, ``masked_row_cos``, ``masked_row_r2``; ``value_masked_mse``,
        ``value_masked_r2``, ``value_masked_corr``, ``value_observed_mse``, ``value_observed_r2``,
        ``value_observed_corr`` (probes fitted on masked / observed elements separately; ``corr``
        is the Pearson correlation of prediction and value on the test set); ``singular_vector_mse``
        (sign-invariant), ``singular_vector_cos``, ``singular_vector_r2``.

    Example:
        >>> import torch
        >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
        >>> model = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9))
        >>> batch = MatrixCompletionTask(n_rows=3, rank=1).sample(40, generator=torch.Generator().manual_seed(0))
        >>> t = probe_layers(model, batch, targets=["masked_row"], ridge=1e-2)
        >>> list(t.columns[:4]), len(t)
        (['layer', 'hook_name', 'n_train', 'n_test'], 2)
    """
    check_progress(progress)
    unknown = [t for t in targets if t not in PROBE_TARGETS]
    if unknown or not targets:
        raise ValueError(f"targets: choose a non-empty subset of {PROBE_TARGETS}, got {list(targets)}")
    if batch.n_rows * batch.n_cols > model.cfg.n_ctx:
        raise ValueError(f"batch: {batch.n_rows}x{batch.n_cols} matrices need "
                         f"{batch.n_rows * batch.n_cols} positions, the model has n_ctx {model.cfg.n_ctx}")
    train_idx, test_idx = split_matrices(batch.batch_size, test_fraction, generator)
    states = hidden_states(model, batch.tokens, layers, batch_size=batch_size)
    device = next(iter(states.values())).device
    n_pos = batch.n_rows * batch.n_cols
    is_train = torch.zeros(batch.batch_size, dtype=torch.bool)
    is_train[train_idx] = True
    train_el = is_train[:, None].expand(-1, n_pos).reshape(-1).to(device)
    test_el = ~train_el
    observed = batch.observed.reshape(-1).to(device)

    target_tensors: dict[str, Tensor] = {}
    if "masked_row" in targets:
        target_tensors["masked_row"] = masked_row_targets(batch)
    if "value" in targets:
        target_tensors["value"] = value_targets(batch)
    if "singular_vector" in targets:
        target_tensors["singular_vector"] = top_singular_vector_targets(batch, singular_side)
    target_tensors = {k: v.reshape(-1, v.shape[-1]).to(device) for k, v in target_tensors.items()}

    rows = []
    for layer, h in tracked(states.items(), "probes", progress, total=len(states), unit="layer"):
        feat = h.reshape(-1, h.shape[-1])
        row = {"layer": layer, "hook_name": resid_name(layer, model.cfg.n_layers, at="layer_output"),
               "n_train": len(train_idx), "n_test": len(test_idx)}
        if "masked_row" in target_tensors:
            m = _fit_and_score(feat, target_tensors["masked_row"], train_el, test_el, ridge, False)
            row.update({f"masked_row_{k}": v for k, v in m.items()})
        if "value" in target_tensors:
            for where, sel in (("masked", ~observed), ("observed", observed)):
                tr, te = train_el & sel, test_el & sel
                if not tr.any():
                    row.update({f"value_{where}_{k}": float("nan") for k in ("mse", "r2", "corr")})
                    continue
                tgt = target_tensors["value"]
                probe = fit_linear_probe(feat[tr], tgt[tr], ridge=ridge)
                if te.any():
                    pred = probe.predict(feat[te])
                    m = probe_metrics(pred, tgt[te])
                    corr = _pearson(pred[:, 0], tgt[te][:, 0])
                else:
                    m, corr = {"mse": float("nan"), "r2": float("nan")}, float("nan")
                row.update({f"value_{where}_mse": m["mse"], f"value_{where}_r2": m["r2"],
                            f"value_{where}_corr": corr})
        if "singular_vector" in target_tensors:
            m = _fit_and_score(feat, target_tensors["singular_vector"], train_el, test_el, ridge, True)
            row.update({f"singular_vector_{k}": v for k, v in m.items()})
        rows.append(row)
    return pd.DataFrame(rows)


def _pearson(a: Tensor, b: Tensor) -> float:
    a = a.to(torch.float64) - a.to(torch.float64).mean()
    b = b.to(device=a.device, dtype=torch.float64)
    b = b - b.mean()
    denom = a.norm() * b.norm()
    return (a @ b / denom).item() if denom > 0 else float("nan")
