"""The sudden drop in the loss curve (the NeurIPS paper Sec. 4).

**Drop detection.** :func:`detect_drop` works on ``log10 L`` (multiplicative noise becomes additive)
after a running median (isolated spikes removed), in three steps:

1. *Fit.* A plateau-then-drop curve ``log10 L(t) ~ f + (p - f) * sigmoid((t0 - t) / s)`` by least
   squares (a grid over ``t0`` and ``s`` with the two levels in closed form, then a robust soft-L1
   polish). It gives the drop step ``t0`` and the noise level (the robust standard deviation of
   the residuals).
2. *Extent.* On a fall in one stage, the fit's 10% / 90% points ``t0 -+ s ln 9`` are the
   **onset** (``drop_start``: where the loss leaves the plateau) and the **end** (``drop_end``). A
   fall in several stages (a first fall, a shelf, a second fall) leaves a misfit: inside the fall,
   the root-mean-square difference between the curve and the fit exceeds both 3 times the
   point-to-point noise (estimated from first differences, so blind to the fall itself) and 2% of
   the log-fall. Then, on the curve smoothed again by a running median over 2% of the points, the
   onset is the last step at which it still lies within 10% of the log-fall of
   the plateau before it first comes within 10% of the final level, and the end is that first
   step: one drop from the onset of the first stage to the end of the last, not a "gradual"
   decline.
3. *Levels.* The **plateau level** is the median loss between the first point and the onset, the
   **final level** the median of the last 10% of the points (at least 3), and the **fall
   factor** their ratio.

A curve "has a drop" only if all of these hold (each failure is named in ``reason``):

* the fall factor is at least ``min_drop_factor`` (default 2);
* the fall is at least 5 times the noise level (in decades);
* there is a plateau: the onset comes at least ``min_plateau_fraction`` (default 5%) of the logged
  span after the first point;
* the fall is sudden: it takes at most ``max_width_ratio`` (default 1) times as long as the plateau
  before it, and at most ``max_width_fraction`` (default 50%) of the logged span;
* the drop step lies inside the log.

So a flat noisy curve, a smooth exponential or power-law decay and a curve that falls from its
first step report ``has_drop=False``; the papers' shape (a long plateau, then a fall in a fraction
of that time, in one or several stages) reports ``True``.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.ndimage import median_filter

__all__ = ["DropResult", "detect_drop", "summarize_drops"]

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
        """The detected shape (loss units) at ``steps``: the plateau level until the onset, a straight
        line in log space to the final level at the end, then the final level."""
        p = self.params
        t = np.asarray(steps, dtype=float)
        if "start" in p and p["end"] > p["start"]:
            frac = np.clip((t - p["start"]) / (p["end"] - p["start"]), 0.0, 1.0)
            return 10 ** (p["p"] + (p["f"] - p["p"]) * frac)
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
        from tfmatcomp.training.trainer import read_metrics

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
    """The running median of ``window`` points centred on each point, the ends repeated
    (unchanged when ``window`` is 1 or longer than ``y``)."""
    if window <= 1 or len(y) < window:
        return y
    return median_filter(y, size=window, mode="nearest")


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
    max_width_fraction: float = 0.5,
    max_width_ratio: float = 1.0,
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
        max_width_fraction: largest onset-to-end width, as a fraction of the logged span, that
            counts as sudden.
        max_width_ratio: largest onset-to-end width, as a multiple of the plateau's length (onset
            minus first step), that counts as sudden.
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
    if not max_width_ratio > 0:
        raise ValueError(f"max_width_ratio: must be > 0, got {max_width_ratio!r}")
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
    # Point-to-point noise of the raw log-loss, from first differences (blind to trends and steps).
    d = np.diff(y)
    point_noise = float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2))
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
    smoothed_noise = 1.25 * point_noise / math.sqrt(median_window)
    start, end = _extent(t, y, t0, s, p, f, smoothed_noise, max(median_window, (len(t) // 50) | 1))
    end = min(end, float(t[-1]))  # a fall still under way at the last point ends there
    if not start <= t0 <= end:
        t0 = float(np.clip(t0, start, end))
    n_tail = max(3, len(t) // 10)
    # An onset before the first point (a fit that found no plateau) has no plateau points: the
    # first 10% of the log stand in, never the fit's extrapolated level.
    plateau = float(np.median(y[t <= start])) if np.any(t <= start) else float(np.median(y[:n_tail]))
    final = float(np.median(y[-n_tail:]))
    delta = plateau - final
    params = {"t0": t0, "s": s, "p": plateau, "f": final, "start": start, "end": end}
    factor = 10 ** delta
    width, plateau_len = end - start, start - t[0]
    reasons = []
    if factor < min_drop_factor:
        reasons.append(f"the loss falls by a factor {factor:.3g} < min_drop_factor {min_drop_factor:g}")
    if delta < 5 * noise:
        reasons.append(f"the fall ({delta:.3g} decades) is within 5x the noise ({noise:.3g})")
    if plateau_len < min_plateau_fraction * span:
        reasons.append(f"no plateau before the decrease (it starts at step {start:.4g}, within "
                       f"{min_plateau_fraction:g} of the span from the first step {t[0]:.4g})")
    elif width > max_width_ratio * plateau_len:
        reasons.append(f"the decrease is gradual: it takes {width:.4g} steps (onset {start:.4g} to "
                       f"end {end:.4g}), longer than {max_width_ratio:g} x the {plateau_len:.4g}-step "
                       f"plateau before it")
    if width > max_width_fraction * span:
        reasons.append(f"the decrease is gradual: it takes {width:.4g} steps, more than "
                       f"{max_width_fraction:g} of the span {span:.4g}")
    if not t[0] < t0 < t[-1]:
        reasons.append(f"the fitted drop step {t0:.4g} lies outside the logged steps")
    if reasons:
        return DropResult(False, None, None, None, None, 10 ** plateau, 10 ** final, factor, noise,
                          "no drop: " + "; ".join(reasons), col, params)
    return DropResult(True, t0, start, end, width, 10 ** plateau, 10 ** final, factor, noise,
                      "sudden drop", col, params)


def _extent(t: np.ndarray, y: np.ndarray, t0: float, s: float, p: float, f: float,
            noise: float, window: int) -> tuple[float, float]:
    """Onset and end of the fall (see the module docstring, step 2). ``y`` is the lightly smoothed
    log-loss and ``noise`` its point-to-point noise; the crossings are read on a wider running
    median of it."""
    fit_start, fit_end = t0 - s * _LN9, t0 + s * _LN9
    ys = _median_filter(y, window)
    hi, lo = p - 0.1 * (p - f), f + 0.1 * (p - f)
    reached = np.flatnonzero(ys <= lo)
    if len(reached) == 0:
        return fit_start, fit_end
    first_low = reached[0]
    above = np.flatnonzero(ys[:first_low + 1] >= hi)
    onset = t[above[-1]] if len(above) else fit_start
    end = t[first_low]
    # One stage or several? Inside the fall, a single sigmoid leaves only noise behind; a shelf
    # between two stages leaves a structured misfit. Only then are the crossings used (on a clean
    # or noisy one-stage fall the fit's sub-grid values are more precise than a median's edge).
    region = (t >= min(onset, fit_start)) & (t <= max(end, fit_end))
    fitted = f + (p - f) * _sigmoid((t0 - t[region]) / s)
    misfit = float(np.sqrt(np.mean((y[region] - fitted) ** 2))) if region.any() else 0.0
    if misfit <= max(3 * noise, 0.02 * (p - f)):
        return fit_start, fit_end
    return float(onset), float(end)


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

    Steps (``drop_step``, ``drop_start``, ``drop_end``, ``drop_width``) are rounded to whole
    training steps (pandas ``Int64``, missing where no drop was found); :func:`detect_drop`
    keeps the interpolated values.

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
    df = pd.DataFrame(rows)
    for c in ("drop_step", "drop_start", "drop_end", "drop_width"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce").round().astype("Int64")
    return df
