"""The local learning coefficient (LLC) of a model at its weights, and over a run's checkpoints.

The LLC ``lambda(w*)`` measures how degenerate the loss landscape is around the weights ``w*``
(Lau et al., "The local learning coefficient: a singularity-aware complexity measure", 2023).
It is estimated by sampling weights ``w`` near ``w*`` from the tempered, localized posterior
``p(w) ~ exp(-nbeta * L_n(w) - gamma / 2 * |w - w*|^2)`` with SGLD (stochastic-gradient Langevin
dynamics) and reading off ``llc = nbeta * (E_w[L_n(w)] - L_n(w*))``.

Here ``L_n`` is the **training loss** of matrix completion, the MSE over all entries (``L``,
:func:`tfmatcomp.task.metrics.mse`), on a fixed pool of ``n_matrices`` matrices drawn by a seeded
generator (:func:`tfmatcomp.datapath.sample_batch`). Each SGLD step draws ``batch_size`` of
them (without replacement, fresh every step). ``L_n(w*)`` is the loss on the whole pool;
``E_w[L_n(w)]`` is the mean of the minibatch losses over every chain's draws (the steps after
``n_burnin``; devinterp's own ``compute_llc`` also averages over the burn-in, this module does
not).

**What devinterp does here.** The SGLD step is devinterp's optimizer, ``SGMCMC.sgld`` (the one
behind devinterp's ``sample()``, with its localization prior centred on ``w*`` and its per-element
parameter masks); the chain loop is ours, because devinterp 2's ``sample()`` gives its loss only
the ``input_ids`` of a HuggingFace dataset (a per-token loss of shape ``[batch, seq - 1]``), while
this task's loss needs each matrix's values, and it seeds the global RNG. devinterp is an optional extra, imported on first use:
``pip install "tfmatcomp[llc]"``.

**Restricting to parameter groups.** ``groups`` (:mod:`tfmatcomp.models.param_groups`:
``"attention"``, ``"mlp"``, ``"embed"``, ...) samples only those weights; every other weight stays
at ``w*`` (it is not given to the optimizer and gets no gradient), as devinterp's
``weight_restrictions`` do. The MASK row of ``W_E`` is always held fixed when the model does not
learn it (``learned_mask_embedding=False``, the papers' setting): it is not a trained weight
(devinterp's per-element mask keeps it at its value).

**Randomness.** Every random draw comes from an explicit generator seeded from ``seed``: chain
``c`` takes its minibatches from a CPU ``torch.Generator`` and its SGLD noise from a generator on
the model's device, seeded by ``numpy.random.SeedSequence([seed, c, stream])``. The same model,
data, settings and seed give the same estimate; the global RNG is not touched.

**Stability.** An estimate is *stable* (``LLCResult.stable``) when all of these hold:

=========================  ===================================================================
check                      rule
=========================  ===================================================================
finite                     every chain's loss trace is finite (no NaN / inf: no divergence)
positive                   ``llc_mean > 0`` (a negative estimate means the chains found lower
                           loss than ``w*``: ``w*`` is not a local minimum at this resolution,
                           or the step size is too large)
chains agree               ``llc_std / llc_mean <= max_rel_std`` (``llc_std``: the standard
                           deviation of the per-chain estimates, ``ddof=0`` as devinterp's
                           ``llc_std``)
flat after burn-in         ``abs(drift) / llc_mean <= max_rel_drift``, ``drift`` being
                           ``nbeta * (mean loss over the draws' second half - mean over their
                           first half)`` of the chain-averaged trace:
                           the chains have reached equilibrium rather than still climbing
                           (burn-in too short) or running away
=========================  ===================================================================

``LLCResult.problems`` names the checks that failed. The thresholds are settings
(:class:`LLCSettings`), recorded with every result.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.analyses.dynamics.llc import LLCSettings
    >>> s = LLCSettings(n_chains=2, n_draws=20, n_burnin=10, n_matrices=64, batch_size=32)
    >>> s.effective_nbeta == 32 / math.log(32), LLCSettings(**s.to_dict()) == s
    (True, True)
    >>> import pytest; _ = pytest.importorskip("devinterp")    # the llc extra
    >>> r = llc(tm.load_pretrained("tiny", step=10000), "tiny", settings=s)
    >>> r.llc_mean > 0, r.to_dict()["settings"] == s.to_dict(), r.n_matrices
    (True, True, 64)
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp._progress import bar, check_progress
from tfmatcomp.datapath import TaskLike, sample_batch
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.models.objectives import model_kind
from tfmatcomp.models.param_groups import canonical_group, group_parameter_names
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.task.metrics import mse
from tfmatcomp.validation import (
    check_non_negative, check_positive_float, check_positive_int, check_seed,
)

__all__ = ["LLCSettings", "LLCResult", "llc", "llc_measure", "default_nbeta", "LLC_GROUPS",
           "INSTALL_HINT"]

#: The groups :func:`llc_measure` estimates by default: the whole model and its three parts.
LLC_GROUPS = ("all", "attention", "mlp", "embed")

#: What to run when devinterp is missing.
INSTALL_HINT = 'pip install "tfmatcomp[llc]"'


def default_nbeta(batch_size: int) -> float:
    """devinterp's default inverse temperature for a minibatch size ``m``: ``m / log(m)``
    (``devinterp.utils.default_nbeta``), here without importing devinterp.

    Example:
        >>> round(default_nbeta(64), 3)
        15.389
    """
    check_positive_int("batch_size", batch_size)
    if batch_size < 2:
        raise ValueError("batch_size: the default nbeta, batch_size / log(batch_size), needs "
                         f"batch_size >= 2, got {batch_size}; give nbeta explicitly")
    return batch_size / math.log(batch_size)


def _sgmcmc():
    """devinterp's SGMCMC optimizer class, imported on first use."""
    try:
        from devinterp.optim import SGMCMC
    except ImportError as e:  # pragma: no cover - the message is tested with devinterp hidden
        raise ImportError(f"the local learning coefficient needs the optional package devinterp "
                          f"(>=2,<3): {INSTALL_HINT}") from e
    return SGMCMC


# ------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class LLCSettings:
    """How an LLC estimate samples; recorded with every result (:meth:`to_dict`).

    The defaults are the calibration on the bundled ``tiny`` run (docs/dynamics.md, "The local
    learning coefficient"): below ``lr`` 3e-4 the estimate no longer depends on the step size,
    and the whole model's estimate is stable at every one of its checkpoints. The value depends
    on ``localization`` and ``nbeta``: compare estimates made with the same settings. Another
    model size or task needs its own calibration.

    Attributes:
        lr: the SGLD step size ``epsilon`` (> 0).
        localization: ``gamma``, the pull towards ``w*`` (>= 0; 0 switches it off).
        nbeta: the inverse temperature ``n * beta`` (> 0); None: devinterp's default for the
            minibatch size, ``batch_size / log(batch_size)`` (:attr:`effective_nbeta`).
        n_chains: independent chains (>= 2: the stability check compares them).
        n_draws: SGLD steps per chain after burn-in whose losses are averaged (>= 2).
        n_burnin: SGLD steps per chain before the draws, not averaged (>= 0).
        batch_size: matrices per SGLD step (>= 1, <= ``n_matrices``).
        n_matrices: the pool of matrices the loss is over (>= 1); a given batch must have at
            least this many (its first ``n_matrices`` are used).
        max_rel_std: the stability threshold on ``llc_std / llc_mean`` (> 0).
        max_rel_drift: the stability threshold on the drift between the draws' halves, relative
            to ``llc_mean`` (> 0).

    Raises:
        ValueError: naming the setting and its allowed range.

    Example:
        >>> LLCSettings(lr=-1.0)
        Traceback (most recent call last):
        ...
        ValueError: lr: must be a finite number > 0, got -1.0
    """

    lr: float = 3e-4
    localization: float = 300.0
    nbeta: float | None = None
    n_chains: int = 4
    n_draws: int = 800
    n_burnin: int = 100
    batch_size: int = 64
    n_matrices: int = 256
    max_rel_std: float = 0.15
    max_rel_drift: float = 0.15

    def __post_init__(self) -> None:
        check_positive_float("lr", self.lr)
        check_non_negative("localization", self.localization)
        if not math.isfinite(float(self.localization)):
            raise ValueError(f"localization: must be a finite number >= 0, got "
                             f"{self.localization!r}")
        if self.nbeta is not None:
            check_positive_float("nbeta", self.nbeta)
        for name, lo in (("n_chains", 2), ("n_draws", 2), ("batch_size", 1), ("n_matrices", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name}: must be an integer >= {lo}, got {value!r}")
        if isinstance(self.n_burnin, bool) or not isinstance(self.n_burnin, int) \
                or self.n_burnin < 0:
            raise ValueError(f"n_burnin: must be an integer >= 0, got {self.n_burnin!r}")
        if self.batch_size > self.n_matrices:
            raise ValueError(f"batch_size: must be <= n_matrices ({self.n_matrices}), got "
                             f"{self.batch_size}")
        if self.nbeta is None and self.batch_size < 2:
            default_nbeta(self.batch_size)   # raises, naming batch_size
        check_positive_float("max_rel_std", self.max_rel_std)
        check_positive_float("max_rel_drift", self.max_rel_drift)

    @property
    def effective_nbeta(self) -> float:
        """``nbeta``, or devinterp's default for ``batch_size`` when it is None."""
        return float(self.nbeta) if self.nbeta is not None else default_nbeta(self.batch_size)

    @property
    def n_steps(self) -> int:
        """SGLD steps per chain: ``n_burnin + n_draws``."""
        return self.n_burnin + self.n_draws

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (``LLCSettings(**d)`` gives them back)."""
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------- result
@dataclass(frozen=True)
class LLCResult:
    """One LLC estimate: the value, the chains, the stability check and what made it.

    Attributes:
        llc_mean: the estimate, the mean of the per-chain estimates (NaN if a chain failed).
        llc_per_chain: ``nbeta * (mean draw loss of chain c - init_loss)`` per chain.
        llc_std: the standard deviation of the per-chain estimates (``ddof=0``).
        init_loss: ``L`` at ``w*`` on the whole pool.
        trace: the minibatch loss ``L`` at every SGLD step of every chain, burn-in included,
            ``[chain, step]`` on the CPU.
        rel_std: ``llc_std / |llc_mean|``.
        drift: ``nbeta * (mean loss over the draws' second half - over their first half)``,
            chain-averaged, in LLC units (positive: still climbing).
        rel_drift: ``|drift| / |llc_mean|``.
        stable: every stability check passed (module docstring); ``problems`` lists the failed.
        problems: the failed checks, in words (empty when stable).
        settings: the :class:`LLCSettings` used.
        nbeta: the inverse temperature used (``settings.effective_nbeta``).
        groups: the sampled parameter groups (canonical names).
        n_params: how many scalar weights were sampled.
        n_matrices: the size of the pool.
        seed: the seed of the chains (and of the pool when it was drawn here).
    """

    llc_mean: float
    llc_per_chain: tuple[float, ...]
    llc_std: float
    init_loss: float
    trace: Float[Tensor, "chain step"] = dataclasses.field(repr=False, compare=False)
    rel_std: float
    drift: float
    rel_drift: float
    stable: bool
    problems: tuple[str, ...]
    settings: LLCSettings
    nbeta: float
    groups: tuple[str, ...]
    n_params: int
    n_matrices: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        """Everything but the trace, as plain values; the settings under ``"settings"``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("trace", "settings")}
        out["llc_per_chain"] = list(self.llc_per_chain)
        out["groups"] = list(self.groups)
        out["problems"] = list(self.problems)
        out["finite"] = bool(torch.isfinite(self.trace).all())
        out["settings"] = self.settings.to_dict()
        return out


# ------------------------------------------------------------------------------- estimate
def _check_settings(settings: Any) -> LLCSettings:
    if not isinstance(settings, LLCSettings):
        raise ValueError(f"settings: expected an LLCSettings, got {type(settings).__name__}")
    return settings


def _check_groups(groups: str | Iterable[str] | None) -> tuple[str, ...]:
    if groups is None:
        return ("all",)
    names = [groups] if isinstance(groups, str) else list(groups)
    if not names or not all(isinstance(g, str) for g in names):
        raise ValueError(f"groups: expected a parameter group name or a non-empty list of them "
                         f"(tfmatcomp.models.param_groups), got {groups!r}")
    try:
        return tuple(dict.fromkeys(canonical_group(g) for g in names))
    except ValueError as e:
        raise ValueError(f"groups: {e}") from None


def _pool(model: HookedEncoder, data: MatrixBatch | TaskLike, n_matrices: int,
          seed: int) -> MatrixBatch:
    """The first ``n_matrices`` of a batch, or ``n_matrices`` drawn from a task (the model's own
    when ``data`` is None), on the model's device."""
    if isinstance(data, MatrixBatch):
        if data.batch_size < n_matrices:
            raise ValueError(f"data: the batch has {data.batch_size} matrices, fewer than "
                             f"settings.n_matrices = {n_matrices} (over_checkpoints: pass "
                             f"n_samples >= n_matrices)")
        pool = data[:n_matrices]
    else:
        task = data if data is not None else model.task_cfg
        if task is None:
            raise ValueError("data: give a MatrixBatch, a task, a task config or a preset name "
                             "(the model carries no task config)")
        pool = sample_batch(task, n_matrices, seed=seed)
    if pool.tokens.shape[1] > model.cfg.n_ctx:
        raise ValueError(f"data: matrices of {pool.tokens.shape[1]} entries need more positions "
                         f"than the model has (n_ctx = {model.cfg.n_ctx})")
    return pool.to(model.device)


def _generator(seed: int, chain: int, stream: int, device: torch.device) -> torch.Generator:
    state = np.random.SeedSequence([seed, chain, stream]).generate_state(2, np.uint32)
    return torch.Generator(device=device).manual_seed(
        (int(state[0]) << 31) ^ int(state[1]))


@torch.no_grad()
def _pool_loss(model: HookedEncoder, pool: MatrixBatch, chunk: int) -> float:
    total = 0.0
    for i in range(0, pool.batch_size, chunk):
        part = pool[i:i + chunk]
        total += float(mse(model(part.tokens), part.values)) * part.batch_size
    return total / pool.batch_size


def _run_chain(model: HookedEncoder, sampled: Mapping[str, Tensor], masks: Mapping[str, Tensor],
               w_star: Mapping[str, Tensor], pool: MatrixBatch, settings: LLCSettings,
               nbeta: float, seed: int, chain: int, bar=None) -> Float[Tensor, "step"]:
    """One SGLD chain from ``w*``: the minibatch loss at every step (before that step's update)."""
    sgmcmc = _sgmcmc()
    device = model.device
    with torch.no_grad():
        for name, p in sampled.items():
            p.copy_(w_star[name])
    groups = [{"params": [p], **({"mask": [masks[name]]} if name in masks else {})}
              for name, p in sampled.items()]
    optimizer = sgmcmc.sgld(groups, lr=settings.lr, localization=settings.localization,
                            nbeta=nbeta)
    data_gen = _generator(seed, chain, 0, torch.device("cpu"))
    noise_gen = _generator(seed, chain, 1, device)
    losses = torch.empty(settings.n_steps, device=device)
    with torch.enable_grad():  # SGLD needs gradients, also when called under no_grad (a report)
        for step in range(settings.n_steps):
            idx = torch.randperm(pool.batch_size, generator=data_gen)[:settings.batch_size]
            mb = pool[idx.to(device)]
            optimizer.zero_grad(set_to_none=True)
            loss = mse(model(mb.tokens), mb.values)
            loss.backward()
            losses[step] = loss.detach()
            optimizer.step(noise_generator=noise_gen)
            if bar is not None:
                bar.update()
    return losses.cpu()


def llc(
    model: HookedEncoder,
    data: MatrixBatch | TaskLike = None,
    *,
    groups: str | Sequence[str] | None = None,
    settings: LLCSettings = LLCSettings(),
    seed: int = 0,
    progress: bool | None = None,
) -> LLCResult:
    """The LLC estimate of ``model`` at its current weights (SGLD, module docstring).

    Args:
        model: the encoder; it is not changed (the chains run on a copy).
        data: the pool the training loss ``L`` is over: a :class:`~tfmatcomp.MatrixBatch` (its
            first ``settings.n_matrices`` matrices), or a task, task config or preset name
            (``settings.n_matrices`` matrices drawn with
            :func:`tfmatcomp.datapath.sample_batch` from ``seed``); None: the model's own task.
        groups: sample only these parameter groups (:mod:`tfmatcomp.models.param_groups`; a
            list is their union); None: every weight (``"all"``).
        settings: how to sample (:class:`LLCSettings`).
        seed: seeds the chains' minibatches and noise, and the pool when it is drawn here.
        progress: a bar over the SGLD steps of all chains (None: when watched;
            :mod:`tfmatcomp._progress`).

    Returns:
        An :class:`LLCResult`.

    Raises:
        ValueError: naming the argument: not an encoder, bad settings, unknown groups, a batch
            smaller than ``settings.n_matrices``, no task to draw from.
        ImportError: devinterp is not installed (``pip install "tfmatcomp[llc]"``).

    Example:
        >>> import pytest; _ = pytest.importorskip("devinterp")    # the llc extra
        >>> import tfmatcomp as tm
        >>> s = LLCSettings(n_chains=2, n_draws=30, n_burnin=20, n_matrices=64, batch_size=32)
        >>> r = llc(tm.load_pretrained("tiny", step=10000), "tiny", groups="mlp", settings=s)
        >>> r.groups, len(r.llc_per_chain), tuple(r.trace.shape)
        (('mlp',), 2, (2, 50))
    """
    if model_kind(model) != "encoder":
        raise ValueError(f"model: the LLC of the training loss L is defined here for a "
                         f"HookedEncoder, got {type(model).__name__}")
    settings = _check_settings(settings)
    names = _check_groups(groups)
    check_seed("seed", seed)
    check_progress(progress)
    _sgmcmc()   # fail before any work when devinterp is missing
    pool = _pool(model, data, settings.n_matrices, seed)
    nbeta = settings.effective_nbeta

    work = copy.deepcopy(model).eval()
    sampled_names = group_parameter_names(work, names)
    if not sampled_names:
        raise ValueError(f"groups: {list(names)} select no parameter of this model")
    params = dict(work.named_parameters())
    for name, p in params.items():
        p.requires_grad_(name in sampled_names)
    sampled = {name: params[name] for name in sampled_names}
    w_star = {name: p.detach().clone() for name, p in sampled.items()}
    masks: dict[str, Tensor] = {}
    embed = getattr(work, "embed", None)
    if getattr(embed, "padding_idx", None) is not None and "embed.W_E" in sampled:
        mask = torch.ones_like(sampled["embed.W_E"])
        mask[embed.padding_idx] = 0.0      # the MASK row is not a trained weight: held fixed
        masks["embed.W_E"] = mask
    n_params = sum(int(masks[n].count_nonzero()) if n in masks else p.numel()
                   for n, p in sampled.items())

    init_loss = _pool_loss(work, pool, settings.batch_size)
    with bar(settings.n_chains * settings.n_steps, "llc", progress, unit="SGLD step") as b:
        trace = torch.stack([_run_chain(work, sampled, masks, w_star, pool, settings, nbeta, seed,
                                        c, b) for c in range(settings.n_chains)]).double()
    draws = trace[:, settings.n_burnin:]
    per_chain = nbeta * (draws.mean(1) - init_loss)
    llc_mean = float(per_chain.mean())
    llc_std = float(per_chain.std(correction=0))
    half = settings.n_draws // 2
    drift = nbeta * float(draws[:, half:].mean() - draws[:, :half].mean())
    finite = bool(torch.isfinite(trace).all())
    rel_std = llc_std / abs(llc_mean) if llc_mean != 0 else math.inf
    rel_drift = abs(drift) / abs(llc_mean) if llc_mean != 0 else math.inf

    problems = []
    if not finite:
        problems.append("a chain's loss is not finite (diverged: lower lr)")
    else:
        if not llc_mean > 0:
            problems.append(f"llc_mean = {llc_mean:.4g} <= 0")
        if not rel_std <= settings.max_rel_std:
            problems.append(f"chains disagree: llc_std / llc_mean = {rel_std:.3g} > "
                            f"max_rel_std = {settings.max_rel_std}")
        if not rel_drift <= settings.max_rel_drift:
            problems.append(f"not flat after burn-in: drift / llc_mean = {rel_drift:.3g} > "
                            f"max_rel_drift = {settings.max_rel_drift}")
    return LLCResult(
        llc_mean=llc_mean if finite else math.nan,
        llc_per_chain=tuple(float(v) for v in per_chain),
        llc_std=llc_std if finite else math.nan,
        init_loss=init_loss, trace=trace.float(), rel_std=rel_std if finite else math.nan,
        drift=drift if finite else math.nan, rel_drift=rel_drift if finite else math.nan,
        stable=not problems,
        problems=tuple(problems), settings=settings, nbeta=nbeta, groups=names,
        n_params=n_params, n_matrices=pool.batch_size, seed=seed)


def llc_measure(
    settings: LLCSettings = LLCSettings(),
    groups: Sequence[str] = LLC_GROUPS,
    *,
    seed: int = 0,
) -> Callable[[HookedEncoder, MatrixBatch], dict[str, float]]:
    """A measure ``f(model, batch) -> dict`` for
    :func:`tfmatcomp.analyses.dynamics.over_checkpoints`: the LLC of each group in ``groups``
    (each sampled on its own, the rest held at ``w*``), on the first ``settings.n_matrices``
    matrices of the batch.

    The dict has, per group ``g``: ``g`` (``llc_mean``), ``g.std`` (``llc_std``), ``g.drift``
    (``drift``) and ``g.stable`` (1.0 or 0.0), so ``over_checkpoints`` names the rows
    ``llc.all``, ``llc.all.std``, ``llc.all.drift``, ``llc.all.stable``, ... for
    ``{"llc": llc_measure()}``. The same ``seed`` at every checkpoint: the curve's changes are
    the model's, not the chains'.

    Raises:
        ValueError: bad settings or groups (when the measure is made, not at the first
            checkpoint).
        ImportError: devinterp is not installed.

    Example:
        >>> import pytest; _ = pytest.importorskip("devinterp")    # the llc extra
        >>> from tfmatcomp.analyses.dynamics import over_checkpoints
        >>> s = LLCSettings(n_chains=2, n_draws=20, n_burnin=10, n_matrices=64, batch_size=32)
        >>> df = over_checkpoints("tiny", {"llc": llc_measure(s, ["all"])}, n_samples=64,
        ...                       steps=[2000, 10000])
        >>> df["measure"].unique().tolist()
        ['llc.all', 'llc.all.drift', 'llc.all.stable', 'llc.all.std']
    """
    settings = _check_settings(settings)
    if isinstance(groups, str):
        groups = [groups]
    names = [_check_groups(g)[0] for g in groups] if groups else _check_groups(groups)
    if len(set(names)) != len(names):
        raise ValueError(f"groups: each group once, got {list(groups)}")
    check_seed("seed", seed)
    _sgmcmc()

    def measure(model: HookedEncoder, batch: MatrixBatch) -> dict[str, float]:
        out: dict[str, float] = {}
        for g in names:
            r = llc(model, batch, groups=g, settings=settings, seed=seed)
            out[g] = r.llc_mean
            out[f"{g}.std"] = r.llc_std
            out[f"{g}.drift"] = r.drift
            out[f"{g}.stable"] = float(r.stable)
        return out

    return measure
