"""Training dynamics: the sudden drop in the loss, and component-wise training (seed 002 Sec. 4).

**Drop detection.** :func:`detect_drop` fits, in log space, a plateau-then-drop curve to a loss log

    log10 L(t) ~ f + (p - f) * sigmoid((t0 - t) / s)

(``p``: plateau level, ``f``: final level, ``t0``: drop step, ``s``: width scale) by least squares:
a grid search over ``t0`` and ``s`` with the two levels solved in closed form, then a robust
(soft-L1) refinement of all four parameters. Because the model is fitted to ``log10 L``,
multiplicative noise becomes additive and the fit uses every point rather than a noisy derivative.
Definitions (all reported in :class:`DropResult`):

* drop step: ``t0``, where the log-loss is half way between plateau and final level (the geometric
  mean of the two losses);
* drop start / end: where 10% / 90% of the log-drop is done, ``t0 -+ s ln 9``; width = end - start;
* plateau level ``10**p`` and final level ``10**f`` (loss units).

A curve "has a drop" only if all of: the loss falls by at least ``min_drop_factor`` (default 2x);
the drop is sudden, its width at most ``max_width_fraction`` (default 25%) of the logged span; it
starts after a plateau of at least ``min_plateau_fraction`` (default 5%) of the span; the drop step
lies inside the log; and the fitted drop is at least 5 times the noise level (the robust standard
deviation of the fit's residuals). So a flat noisy curve, a smooth exponential or power-law decay,
and a curve that falls from its first step (no plateau) all report ``has_drop=False`` with a
``reason``.

**Component-wise training.** :func:`train_component` takes a trained model (or checkpoint),
re-initializes one component group with the model's own initialization (a fresh
:class:`~tfmatcomp.HookedEncoder` built from an explicit seed / generator, whose parameters in the
group are copied over), freezes everything else and trains the group with
:func:`tfmatcomp.train`, which logs the usual metrics. The groups (:data:`COMPONENT_GROUPS`) follow
HuggingFace BERT's modules: ``attention`` (Q, K, V, O and the LayerNorm after attention),
``mlp`` (both MLP layers and the LayerNorm after them), ``token_embed`` (``W_E``), ``pos_embed``
(``W_pos``), plus ``embed`` (all embedding parameters including their LayerNorm) and ``all``.

Example:
    >>> import numpy as np
    >>> t = np.arange(0, 20_000, 50.0)
    >>> loss = 10 ** (-2 + 1.0 / (1 + np.exp((t - 12_000) / 200)))
    >>> r = detect_drop(t, loss)
    >>> r.has_drop, round(r.drop_step), round(r.plateau_level, 3), round(r.final_level, 3)
    (True, 12000, 0.1, 0.01)
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from tfmatcomp.model import HookedEncoder

__all__ = [
    "DropResult", "detect_drop", "COMPONENT_GROUPS", "PAPER_COMPONENTS", "component_predicate",
    "component_parameter_names", "reinitialize_component", "train_component", "component_training",
    "summarize_drops",
]

_LN9 = math.log(9.0)


# ------------------------------------------------------------------------------ drop detection
@dataclass(frozen=True)
class DropResult:
    """What :func:`detect_drop` found (levels in loss units, steps in training steps).

    ``drop_step``, ``drop_start``, ``drop_end`` and ``drop_width`` are None when ``has_drop`` is
    False; the fitted levels are always reported (for a flat curve both are about its level).
    """

    has_drop: bool
    drop_step: float | None
    drop_start: float | None
    drop_end: float | None
    drop_width: float | None
    plateau_level: float
    final_level: float
    drop_factor: float
    noise: float
    reason: str
    column: str | None = None
    params: dict[str, float] = field(default_factory=dict, repr=False)

    def curve(self, steps: Sequence[float] | np.ndarray) -> np.ndarray:
        """The fitted plateau-drop curve (loss units) at ``steps``."""
        p = self.params
        t = np.asarray(steps, dtype=float)
        return 10 ** (p["f"] + (p["p"] - p["f"]) * _sigmoid((p["t0"] - t) / p["s"]))

    def as_dict(self) -> dict[str, Any]:
        """The scalar fields as a flat dict (one table row)."""
        return {k: getattr(self, k) for k in (
            "column", "has_drop", "drop_step", "drop_start", "drop_end", "drop_width",
            "plateau_level", "final_level", "drop_factor", "noise", "reason")}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))   # overflow-free logistic


def _steps_and_losses(data, losses, column: str, step_column: str):
    if isinstance(data, (str, os.PathLike)):
        from tfmatcomp.training import read_metrics

        data = read_metrics(data)
    if isinstance(data, pd.DataFrame):
        if losses is not None:
            raise ValueError("losses: pass either a DataFrame (with column=) or steps and losses")
        for c in (step_column, column):
            if c not in data.columns:
                raise ValueError(f"column: {c!r} is not in the metrics log; columns are "
                                 f"{list(data.columns)}")
        return data[step_column].to_numpy(float), data[column].to_numpy(float), column
    if losses is None:
        raise ValueError("losses: required when the first argument is an array of steps")
    steps, values = np.asarray(data, dtype=float).ravel(), np.asarray(losses, dtype=float).ravel()
    if steps.shape != values.shape:
        raise ValueError(f"losses: shape {values.shape} does not match steps {steps.shape}")
    return steps, values, None


def _median_filter(y: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or len(y) < window:
        return y
    half = window // 2
    padded = np.pad(y, half, mode="edge")
    view = np.lib.stride_tricks.sliding_window_view(padded, window)
    return np.median(view, axis=1)


def _grid_fit(t: np.ndarray, y: np.ndarray, widths: np.ndarray, centers: np.ndarray):
    """Best (rss, t0, s, p, f) with p > f over the grid; levels by closed-form least squares."""
    n = len(t)
    ybar = y.mean()
    yc = y - ybar
    best = (np.inf, None)
    for s in widths:
        phi = _sigmoid((centers[:, None] - t[None, :]) / s)        # [centers, points]
        phibar = phi.mean(1, keepdims=True)
        phic = phi - phibar
        var = (phic * phic).sum(1)
        cov = phic @ yc
        ok = var > 1e-12 * n
        delta = np.where(ok, cov / np.where(ok, var, 1.0), 0.0)      # p - f
        rss = (yc @ yc) - np.where(ok, cov * delta, 0.0)
        rss = np.where(delta > 0, rss, np.inf)
        i = int(np.argmin(rss))
        if rss[i] < best[0]:
            f = ybar - delta[i] * phibar[i, 0]
            best = (rss[i], (centers[i], s, f + delta[i], f))
    return best


def detect_drop(
    data,
    losses: Sequence[float] | np.ndarray | None = None,
    *,
    column: str = "eval_L_mask",
    step_column: str = "step",
    start_step: float | None = None,
    min_drop_factor: float = 2.0,
    max_width_fraction: float = 0.25,
    min_plateau_fraction: float = 0.05,
    median_window: int = 5,
) -> DropResult:
    """Find the sudden drop in a loss curve (see the module docstring for the definitions).

    Args:
        data: a metrics DataFrame (``step`` and ``column`` columns, as :func:`tfmatcomp.train`
            returns / ``read_metrics`` reads), a run directory or ``metrics.jsonl`` path, or an array
            of steps (then pass ``losses``).
        losses: the loss values when ``data`` is an array of steps.
        column: which loss to analyse (``eval_L_mask``, ``train_L_mask``, ``train_L``, ...).
        start_step: ignore points before this step (e.g. an initial transient before the plateau).
        min_drop_factor: smallest plateau / final ratio that counts as a drop (> 1).
        max_width_fraction: largest 10%-90% width, as a fraction of the logged span, that counts as
            sudden.
        min_plateau_fraction: the drop must start at least this fraction of the span after the
            first point (there is a plateau before it).
        median_window: points in the running median applied to the log-loss before fitting
            (removes isolated spikes; 1 turns it off).

    Returns:
        A :class:`DropResult`.

    Example:
        >>> import numpy as np
        >>> t = np.arange(0, 10_000, 20.0)
        >>> flat = 0.1 * np.exp(np.random.default_rng(0).normal(0, 0.1, t.size))
        >>> detect_drop(t, flat).has_drop
        False
    """
    steps, values, col = _steps_and_losses(data, losses, column, step_column)
    if not min_drop_factor > 1:
        raise ValueError(f"min_drop_factor: must be > 1, got {min_drop_factor!r}")
    for name, v in (("max_width_fraction", max_width_fraction),
                    ("min_plateau_fraction", min_plateau_fraction)):
        if not 0 <= v <= 1:
            raise ValueError(f"{name}: must lie in [0, 1], got {v!r}")
    if not isinstance(median_window, int) or median_window < 1:
        raise ValueError(f"median_window: must be a positive integer, got {median_window!r}")
    keep = np.isfinite(steps) & np.isfinite(values) & (values > 0)
    if start_step is not None:
        keep &= steps >= start_step
    steps, values = steps[keep], values[keep]
    order = np.argsort(steps, kind="stable")
    t, y = steps[order], np.log10(values[order])
    if len(t) < 8 or t[-1] <= t[0]:
        raise ValueError(f"data: need at least 8 logged points with positive finite loss over more "
                         f"than one step, got {len(t)}")
    y = _median_filter(y, median_window)
    span = t[-1] - t[0]
    spacing = np.median(np.diff(t))
    widths = np.geomspace(max(spacing / 4, span * 1e-5), span, 28)
    centers = t if len(t) <= 400 else np.linspace(t[0], t[-1], 400)
    rss, best = _grid_fit(t, y, widths, centers)
    if best is None:   # never decreasing anywhere: report the flat level
        level = 10 ** float(np.median(y))
        noise = float(1.4826 * np.median(np.abs(y - np.median(y))))
        return DropResult(False, None, None, None, None, level, level, 1.0, noise,
                          "no drop: the loss never decreases", col,
                          {"t0": float(t[0]), "s": float(span), "p": float(np.median(y)),
                           "f": float(np.median(y))})
    t0, s, p, f = (float(v) for v in best)
    t0, s, p, f = _refine(t, y, t0, s, p, f, spacing, span)
    resid = y - (f + (p - f) * _sigmoid((t0 - t) / s))
    noise = float(1.4826 * np.median(np.abs(resid - np.median(resid))))
    delta = p - f
    start, end = t0 - s * _LN9, t0 + s * _LN9
    params = {"t0": t0, "s": s, "p": p, "f": f}
    factor = 10 ** delta
    reasons = []
    if factor < min_drop_factor:
        reasons.append(f"the loss falls by a factor {factor:.3g} < min_drop_factor {min_drop_factor:g}")
    if delta < 5 * noise:
        reasons.append(f"the fitted drop ({delta:.3g} decades) is within 5x the noise ({noise:.3g})")
    if end - start > max_width_fraction * span:
        reasons.append(f"the decrease is gradual: its 10-90% width {end - start:.4g} exceeds "
                       f"{max_width_fraction:g} of the span {span:.4g}")
    if start - t[0] < min_plateau_fraction * span:
        reasons.append(f"no plateau before the decrease (it starts at step {start:.4g}, within "
                       f"{min_plateau_fraction:g} of the span from the first step {t[0]:.4g})")
    if not t[0] < t0 < t[-1]:
        reasons.append(f"the fitted drop step {t0:.4g} lies outside the logged steps")
    if reasons:
        return DropResult(False, None, None, None, None, 10 ** p, 10 ** f, factor, noise,
                          "no drop: " + "; ".join(reasons), col, params)
    return DropResult(True, t0, start, end, end - start, 10 ** p, 10 ** f, factor, noise,
                      "sudden drop", col, params)


def _refine(t, y, t0, s, p, f, spacing, span):
    """Robust least-squares polish of the grid optimum (keeps the grid point if it fails)."""
    from scipy.optimize import least_squares

    scale = max(span, 1.0)

    def resid(theta):
        c, log_s, pp, ff = theta
        return ff + (pp - ff) * _sigmoid((c * scale - t) / math.exp(log_s)) - y

    r0 = resid([t0 / scale, math.log(s), p, f])
    f_scale = max(1.4826 * float(np.median(np.abs(r0 - np.median(r0)))), 1e-6)
    lo = [t[0] / scale - 1, math.log(max(spacing / 20, span * 1e-7)), -np.inf, -np.inf]
    hi = [t[-1] / scale + 1, math.log(2 * span), np.inf, np.inf]
    x0 = np.clip([t0 / scale, math.log(s), p, f], np.array(lo) + 1e-12, np.array(hi) - 1e-12)
    try:
        out = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=f_scale,
                            x_scale=[spacing / scale, 0.1, 0.1, 0.1], max_nfev=200)
    except (ValueError, np.linalg.LinAlgError):
        return t0, s, p, f
    c, log_s, pp, ff = out.x
    if not (np.all(np.isfinite(out.x)) and pp > ff):
        return t0, s, p, f
    return float(c * scale), float(math.exp(log_s)), float(pp), float(ff)


def summarize_drops(metrics: pd.DataFrame, columns: Sequence[str] = ("eval_L_mask",), *,
                    by: str | None = None, **options: Any) -> pd.DataFrame:
    """:func:`detect_drop` for several columns (and groups, e.g. ``by="component"``), one row each.

    Example:
        >>> import numpy as np, pandas as pd
        >>> t = np.arange(0, 5000, 10.0)
        >>> df = pd.DataFrame({"step": t, "eval_L_mask": 10 ** (-2 + 1 / (1 + np.exp((t - 3000) / 50)))})
        >>> summarize_drops(df)[["column", "has_drop"]].values.tolist()
        [['eval_L_mask', True]]
    """
    groups = [(None, metrics)] if by is None else list(metrics.groupby(by, sort=False))
    rows = []
    for key, df in groups:
        for c in columns:
            row = {} if by is None else {by: key}
            row.update(detect_drop(df, column=c, **options).as_dict())
            rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------- component-wise training
_BLOCK = r"blocks\.\d+\."

#: Parameter-name predicates of the component groups (names as in ``model.named_parameters()``).
COMPONENT_GROUPS: dict[str, Callable[[str], bool]] = {
    "attention": lambda n: re.match(_BLOCK + r"(attn|ln1)\.", n) is not None,
    "mlp": lambda n: re.match(_BLOCK + r"(mlp|ln2)\.", n) is not None,
    "token_embed": lambda n: n == "embed.W_E",
    "pos_embed": lambda n: n == "embed.W_pos",
    "embed": lambda n: n.startswith("embed."),
    "all": lambda n: True,
}
#: The four groups of seed 002, Fig. 8.
PAPER_COMPONENTS: tuple[str, ...] = ("attention", "mlp", "token_embed", "pos_embed")


def component_predicate(group: str | Sequence[str]) -> Callable[[str], bool]:
    """A predicate on parameter names selecting one group or the union of several.

    Example:
        >>> pred = component_predicate("attention")
        >>> pred("blocks.0.attn.W_Q"), pred("blocks.0.ln1.w"), pred("blocks.0.mlp.W_in")
        (True, True, False)
    """
    names = [group] if isinstance(group, str) else list(group)
    unknown = [g for g in names if g not in COMPONENT_GROUPS]
    if unknown or not names:
        raise ValueError(f"group: unknown component group(s) {unknown or names}; choose from "
                         f"{sorted(COMPONENT_GROUPS)}")
    preds = [COMPONENT_GROUPS[g] for g in names]
    return lambda name: any(p(name) for p in preds)


def component_parameter_names(model: HookedEncoder, group: str | Sequence[str]) -> list[str]:
    """Names of ``model``'s parameters in ``group``.

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> component_parameter_names(m, "pos_embed")
        ['embed.W_pos']
    """
    pred = component_predicate(group)
    return [n for n, _ in model.named_parameters() if pred(n)]


@torch.no_grad()
def reinitialize_component(
    model: HookedEncoder,
    group: str | Sequence[str],
    seed: int | torch.Generator = 0,
) -> HookedEncoder:
    """A copy of ``model`` whose ``group`` parameters are freshly initialized.

    The fresh values come from the model's own initialization: a new ``HookedEncoder(model.cfg)``
    initialized from ``seed`` (an int, or an explicit CPU ``torch.Generator`` passed to
    ``init_weights``), whose parameters in the group are copied over. Every other parameter is
    copied bit for bit. ``model`` itself is not modified.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4), seed=0)
        >>> r = reinitialize_component(m, "mlp", seed=1)
        >>> torch.equal(r.embed.W_E, m.embed.W_E), torch.equal(r.blocks[0].mlp.W_in, m.blocks[0].mlp.W_in)
        (True, False)
    """
    if not isinstance(model, HookedEncoder):
        raise ValueError(f"model: expected a HookedEncoder, got {type(model).__name__}")
    names = set(component_parameter_names(model, group))
    if not names:
        raise ValueError(f"group: {group!r} selects no parameter of this model")
    if isinstance(seed, torch.Generator):
        fresh = HookedEncoder(model.cfg, seed=0)
        fresh.init_weights(seed)
    elif isinstance(seed, int) and not isinstance(seed, bool):
        fresh = HookedEncoder(model.cfg, seed=seed)
    else:
        raise ValueError(f"seed: expected an int or a torch.Generator, got {type(seed).__name__}")
    out = HookedEncoder(model.cfg, seed=0).to(device=model.device, dtype=model.dtype)
    fresh_params = dict(fresh.named_parameters())
    for name, p in out.named_parameters():
        src = fresh_params[name] if name in names else model.get_parameter(name)
        p.copy_(src.to(device=p.device, dtype=p.dtype))
    out.train(model.training)
    return out


def _load_source(source, task_cfg, train_cfg):
    if isinstance(source, HookedEncoder):
        return source, task_cfg, train_cfg
    if isinstance(source, (str, os.PathLike)):
        from tfmatcomp.checkpoint import load_checkpoint_info

        model, info = load_checkpoint_info(source)
        return model, task_cfg or info.task_cfg, train_cfg or info.train_cfg
    raise ValueError(f"source: expected a HookedEncoder or a checkpoint path, got {type(source).__name__}")


def train_component(
    source: HookedEncoder | str | os.PathLike,
    group: str | Sequence[str],
    *,
    reinit_seed: int | torch.Generator = 0,
    task_cfg=None,
    train_cfg=None,
    preset: str = "tiny",
    out_dir: str | os.PathLike | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
    **train_overrides: Any,
):
    """Re-initialize ``group`` of a trained model, freeze the rest, and train the group.

    Args:
        source: the trained model or a checkpoint path (its task and training configs are then
            the defaults). The source model is not modified.
        group: a component group (see :data:`COMPONENT_GROUPS`) or several.
        reinit_seed: seed (or CPU generator) of the fresh initialization of the group.
        task_cfg, train_cfg: override the checkpoint's configs (required for a model without a
            checkpoint unless ``preset`` has the right ones).
        preset: fallback preset for configs the source does not give.
        out_dir: run directory for the metrics log (``metrics.jsonl``) and checkpoints.
        train_overrides: TrainConfig fields, e.g. ``n_steps=2000, log_every=20, seed=0``.

    Returns:
        The :class:`tfmatcomp.training.TrainResult` of :func:`tfmatcomp.train` (``.metrics`` has
        the usual columns; ``.model`` the trained model).

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
        >>> r = train_component(m, "pos_embed", task_cfg=tm.TaskConfig(n_rows=4, rank=1),
        ...                     n_steps=4, batch_size=8, log_every=2, device="cpu")
        >>> list(r.metrics["step"])
        [2, 4]
    """
    from tfmatcomp.training import train

    model, task_cfg, train_cfg = _load_source(source, task_cfg, train_cfg)
    model = reinitialize_component(model, group, reinit_seed)
    return train(preset, model=model, trainable=component_predicate(group), task_cfg=task_cfg,
                 train_cfg=train_cfg, out_dir=out_dir, device=device, progress=progress,
                 **train_overrides)


def component_training(
    source: HookedEncoder | str | os.PathLike,
    groups: Sequence[str] = PAPER_COMPONENTS,
    *,
    include_all: bool = True,
    reinit_seed: int = 0,
    out_dir: str | os.PathLike | None = None,
    **options: Any,
) -> pd.DataFrame:
    """Seed 002 Fig. 8: train each group alone (others frozen at their trained values).

    Each group gets the same ``reinit_seed`` and the same training seed (``seed=`` in ``options``),
    so runs differ only in what is trainable. With ``include_all`` a run that re-initializes and
    trains every parameter (the paper's "All components", i.e. normal training) is added.

    Args:
        source, options: as :func:`train_component` (``n_steps=``, ``log_every=``, ...).
        out_dir: if given, each run logs to ``out_dir/<group>/``.

    Returns:
        The concatenated metrics logs with a ``component`` column.

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
        >>> df = component_training(m, ["mlp"], task_cfg=tm.TaskConfig(n_rows=4, rank=1),
        ...                         n_steps=2, batch_size=4, log_every=1, device="cpu")
        >>> sorted(set(df["component"]))
        ['all', 'mlp']
    """
    model, task_cfg, train_cfg = _load_source(source, options.pop("task_cfg", None),
                                              options.pop("train_cfg", None))
    names = list(groups) + (["all"] if include_all and "all" not in groups else [])
    frames = []
    for g in names:
        run_dir = Path(out_dir) / g if out_dir is not None else None
        res = train_component(model, g, reinit_seed=reinit_seed, task_cfg=task_cfg,
                              train_cfg=train_cfg, out_dir=run_dir, **options)
        df = res.metrics.copy()
        df.insert(0, "component", g)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
