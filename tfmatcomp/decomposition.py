"""Position / context / residual decomposition of hidden states (Song & Zhong 2023, eqs. 2-3).

For hidden states ``h[c, t]`` of ``C`` contexts (sequences) and ``T`` positions at one layer::

    mu      = mean over (c, t) of h[c, t]                  global mean            [d]
    pos[t]  = mean over c of h[c, t] - mu                  positional basis       [T, d]
    ctx[c]  = mean over t of h[c, t] - mu                  context basis          [C, d]
    resid   = h - mu - pos[t] - ctx[c]                     residual               [C, T, d]
    cvec    = ctx[c] + resid[c, t]

so that ``h = mu + pos + ctx + resid`` exactly. With per-context masks of valid positions (padding)
every mean runs over valid entries only (see :func:`decompose`).

Three ways in:

* :func:`decompose` on a tensor ``[C, T, d]`` (any model's activations, e.g. a TransformerBridge
  cache entry), or :func:`decompose_cache` on a TransformerLens ``ActivationCache``;
* :class:`DecompositionAccumulator`, a streaming accumulator over batches for many layers at once,
  holding ``O(L (T + C) d)`` numbers (plus ``d x d`` per layer for the relative norm), whose results
  equal :func:`decompose` on the concatenated data; residuals come from a second pass over a chosen
  subset of contexts (:meth:`DecompositionAccumulator.residuals`, :func:`residual_pass`);
* :func:`accumulate`, which runs the accumulator over a model and an iterable of token batches with
  a progress bar, feeding it from hooks so the full cache is never stored.

Example:
    >>> import torch
    >>> from tfmatcomp.decomposition import decompose
    >>> h = torch.randn(8, 5, 3, generator=torch.Generator().manual_seed(0))
    >>> dec = decompose(h)
    >>> dec.pos.shape, dec.ctx.shape, dec.resid.shape
    (torch.Size([5, 3]), torch.Size([8, 3]), torch.Size([8, 5, 3]))
    >>> bool(torch.allclose(dec.reconstruct(), h.double()))
    True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

__all__ = [
    "Decomposition",
    "decompose",
    "decompose_cache",
    "DecompositionAccumulator",
    "accumulate",
    "residual_pass",
    "residual_stream_names",
    "hf_bert_modules",
]


# --------------------------------------------------------------------------- result


@dataclass(frozen=True)
class Decomposition:
    """The decomposition ``h = mu + pos + ctx + resid`` of one layer.

    Attributes:
        mu: global mean ``[d]``.
        pos: positional basis ``[T, d]``; row ``i`` is absolute position ``start + i``. Positions that
            no context covers (possible with padding) are zero.
        ctx: context basis ``[C, d]`` (None when a streaming accumulator was told not to keep it).
        resid: residuals ``[C, T, d]`` (None for streamed statistics; see
            :meth:`DecompositionAccumulator.residuals`). Zero at invalid (padded) entries.
        mask: valid entries ``[C, T]`` for the contexts in ``ctx`` / ``resid`` (None: all valid).
        pos_counts: number of valid contexts at each position ``[T]``.
        ctx_counts: number of valid positions of each context ``[C]`` (None when ``ctx`` is None).
        n_tokens: number of valid ``(c, t)`` entries the means were taken over.
        n_contexts: number of contexts the means were taken over (may exceed ``ctx.shape[0]`` for
            a second-pass result, which carries only the chosen contexts).
        centered_gram: ``M^T M`` ``[d, d]`` where the rows of ``M`` are ``h[c, t] - mu`` over valid
            entries (None if not computed); used for the relative norm.
        start: number of leading positions dropped before decomposing.
        name: the hook name or layer key this came from (None for a bare tensor).
    """

    mu: Float[Tensor, "d"]
    pos: Float[Tensor, "pos d"]
    ctx: Float[Tensor, "ctx d"] | None
    resid: Float[Tensor, "ctx pos d"] | None
    mask: Bool[Tensor, "ctx pos"] | None
    pos_counts: Float[Tensor, "pos"]
    ctx_counts: Float[Tensor, "ctx"] | None
    n_tokens: int
    n_contexts: int
    centered_gram: Float[Tensor, "d d"] | None = None
    start: int = 0
    name: str | int | None = None

    @property
    def d_model(self) -> int:
        return self.mu.shape[0]

    @property
    def n_positions(self) -> int:
        """``T``, the number of (kept) positions."""
        return self.pos.shape[0]

    @property
    def cvec(self) -> Float[Tensor, "ctx pos d"]:
        """``ctx[c] + resid[c, t]`` ``[C, T, d]`` (zero at invalid entries)."""
        if self.resid is None or self.ctx is None:
            raise ValueError("cvec: this decomposition has no residuals; run a second pass "
                             "(DecompositionAccumulator.residuals or residual_pass) to get them")
        cvec = self.ctx[:, None, :] + self.resid
        if self.mask is not None:
            cvec = cvec * self.mask[..., None].to(cvec.dtype)
        return cvec

    def reconstruct(self) -> Float[Tensor, "ctx pos d"]:
        """``mu + pos[t] + ctx[c] + resid[c, t]`` (zero at invalid entries): equals ``h``."""
        if self.resid is None or self.ctx is None:
            raise ValueError("reconstruct: this decomposition has no residuals")
        out = self.mu + self.pos[None] + self.ctx[:, None] + self.resid
        if self.mask is not None:
            out = out * self.mask[..., None].to(out.dtype)
        return out

    def gram(self, centered: bool = True) -> Float[Tensor, "d d"]:
        """``M^T M`` of the (centered, or raw if ``centered=False``) valid activations."""
        if self.centered_gram is None:
            raise ValueError("gram: not computed for this decomposition (pass gram=True / "
                             "second_moment=True)")
        if centered:
            return self.centered_gram
        return self.centered_gram + self.n_tokens * torch.outer(self.mu, self.mu)

    def to(self, device: torch.device | str | None = None,
           dtype: torch.dtype | None = None) -> "Decomposition":
        """The same decomposition with float tensors moved / cast."""
        def mv(x):
            if x is None:
                return None
            return x.to(device=device, dtype=dtype if x.dtype.is_floating_point else None)
        return replace(self, mu=mv(self.mu), pos=mv(self.pos), ctx=mv(self.ctx),
                       resid=mv(self.resid), mask=mv(self.mask), pos_counts=mv(self.pos_counts),
                       ctx_counts=mv(self.ctx_counts), centered_gram=mv(self.centered_gram))


# --------------------------------------------------------------------------- helpers


def _check_h(h: Any, name: str = "h") -> Tensor:
    if not torch.is_tensor(h) or h.ndim != 3:
        shape = tuple(h.shape) if torch.is_tensor(h) else type(h).__name__
        raise ValueError(f"{name}: expected a float tensor [contexts, positions, d], got {shape}")
    if not h.dtype.is_floating_point:
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {h.dtype}")
    return h


def _check_mask(mask: Any, h: Tensor, name: str = "mask") -> Tensor | None:
    if mask is None:
        return None
    mask = torch.as_tensor(mask, device=h.device)
    if tuple(mask.shape) != tuple(h.shape[:2]):
        raise ValueError(f"{name}: expected shape {tuple(h.shape[:2])} (contexts, positions), got "
                         f"{tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"{name}: must be bool or 0/1 integers (1 = valid), got {mask.dtype}")
        mask = mask.bool()
    return mask


def _check_drop(drop_first: Any, T: int) -> int:
    if not isinstance(drop_first, int) or isinstance(drop_first, bool) or not 0 <= drop_first < max(T, 1):
        raise ValueError(f"drop_first: must be an integer in [0, {max(T - 1, 0)}], got {drop_first!r}")
    return drop_first


def _masked(h: Tensor, mask: Tensor | None) -> Tensor:
    # Zero at invalid entries (torch.where, not multiplication, so NaN padding cannot leak in).
    if mask is None:
        return h
    return torch.where(mask[..., None], h, torch.zeros((), dtype=h.dtype, device=h.device))


# --------------------------------------------------------------------------- batch


def decompose(
    h: Float[Tensor, "ctx pos d"],
    mask: Bool[Tensor, "ctx pos"] | None = None,
    *,
    drop_first: int = 0,
    dtype: torch.dtype = torch.float64,
    gram: bool = True,
    name: str | int | None = None,
) -> Decomposition:
    """Decompose hidden states ``h[c, t]`` into ``mu + pos[t] + ctx[c] + resid[c, t]``.

    Args:
        h: activations ``[C, T, d]`` of one layer (contexts x positions x features).
        mask: valid entries ``[C, T]`` (True / 1 = a real token, False / 0 = padding), or None.
        drop_first: number of leading positions to drop first (e.g. 1 for BERT's ``[CLS]``; the
            paper drops the first token).
        dtype: precision of the statistics (float64 by default; the means are always summed in
            this dtype).
        gram: also compute ``M^T M`` of the centered activations (for :func:`relative_norm`).
        name: stored on the result.

    With a mask, every mean is over valid entries only: with ``n_t`` the number of valid contexts at
    position ``t``, ``m_c`` the number of valid positions of context ``c`` and ``N`` the number of
    valid entries, ``mu = (1/N) sum_valid h``, ``pos_t = (1/n_t) sum_{c valid at t} h[c, t] - mu``
    (0 if ``n_t = 0``), ``ctx_c = (1/m_c) sum_{t valid in c} h[c, t] - mu`` (0 if ``m_c = 0``),
    ``resid = h - mu - pos_t - ctx_c`` at valid entries and 0 elsewhere. The identity holds at every
    valid entry; the zero-sum constraints become weighted: ``sum_t n_t pos_t = 0`` and
    ``sum_c m_c ctx_c = 0`` (unweighted when nothing is masked).

    Example:
        >>> import torch
        >>> h = torch.randn(4, 6, 2, generator=torch.Generator().manual_seed(0))
        >>> dec = decompose(h, drop_first=1)
        >>> dec.pos.shape, round(float(dec.pos.sum(0).abs().max()), 12)
        (torch.Size([5, 2]), 0.0)
    """
    h = _check_h(h)
    mask = _check_mask(mask, h)
    drop_first = _check_drop(drop_first, h.shape[1])
    if h.shape[0] == 0 or h.shape[1] == 0:
        raise ValueError(f"h: needs at least one context and one position, got {tuple(h.shape)}")
    h = h[:, drop_first:].to(dtype)
    if mask is not None:
        mask = mask[:, drop_first:]
    C, T, d = h.shape
    hm = _masked(h, mask)
    if mask is None:
        w = torch.ones(C, T, dtype=dtype, device=h.device)
    else:
        w = mask.to(dtype)
    n_tokens = float(w.sum())
    if n_tokens == 0:
        raise ValueError("mask: no valid entries (after drop_first)")
    pos_counts, ctx_counts = w.sum(0), w.sum(1)
    mu = hm.sum((0, 1)) / n_tokens
    pos = _safe_mean(hm.sum(0), pos_counts) - mu * (pos_counts > 0)[:, None]
    ctx = _safe_mean(hm.sum(1), ctx_counts) - mu * (ctx_counts > 0)[:, None]
    resid = _masked(h - mu - pos[None] - ctx[:, None], mask)
    cg = None
    if gram:
        centered = _masked(h - mu, mask).reshape(-1, d)
        cg = centered.T @ centered
    return Decomposition(mu=mu, pos=pos, ctx=ctx, resid=resid, mask=mask, pos_counts=pos_counts,
                         ctx_counts=ctx_counts, n_tokens=int(n_tokens), n_contexts=C,
                         centered_gram=cg, start=drop_first, name=name)


def _safe_mean(total: Tensor, count: Tensor) -> Tensor:
    return total / count.clamp(min=1)[:, None]


def _act_name(name: str, layer: int | None) -> str:
    if layer is None:
        return name
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        raise ValueError(f"layer: must be a non-negative integer, got {layer!r}")
    if name.startswith("blocks."):
        raise ValueError(f"name: give either a full hook name or a per-block name with layer=, "
                         f"got {name!r} and layer={layer}")
    if "." not in name and not name.startswith("hook_"):
        name = "hook_" + name
    return f"blocks.{layer}.{name}"


def decompose_cache(
    cache: Mapping[str, Tensor],
    name: str,
    layer: int | None = None,
    *,
    mask: Bool[Tensor, "ctx pos"] | None = None,
    drop_first: int = 0,
    dtype: torch.dtype = torch.float64,
    gram: bool = True,
) -> Decomposition:
    """:func:`decompose` the activation ``name`` (of block ``layer``) from an ``ActivationCache``.

    Args:
        cache: a TransformerLens ``ActivationCache`` (or any mapping from hook names to tensors).
        name: a full hook name (``"blocks.1.hook_resid_pre"``) or, with ``layer``, a per-block one
            (``"hook_resid_pre"`` or ``"resid_pre"``).
        layer: 0-based block index, or None when ``name`` is a full hook name.
        mask, drop_first, dtype, gram: as in :func:`decompose`.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        >>> batch = tm.MatrixCompletionTask(4, rank=1).sample(8, generator=torch.Generator().manual_seed(0))
        >>> _, cache = model.run_with_cache(batch.tokens)
        >>> decompose_cache(cache, "resid_pre", 1).pos.shape
        torch.Size([16, 64])
    """
    full = _act_name(name, layer)
    try:
        h = cache[full]
    except KeyError:
        keys = list(cache.keys())
        raise ValueError(f"name: {full!r} is not in the cache; cached names include "
                         f"{keys[:8]}{' ...' if len(keys) > 8 else ''}") from None
    if h.ndim != 3:
        raise ValueError(f"name: {full!r} has shape {tuple(h.shape)}; the decomposition needs "
                         "[batch, pos, d] activations (select a head first for per-head hooks)")
    return decompose(h, mask, drop_first=drop_first, dtype=dtype, gram=gram, name=full)


# --------------------------------------------------------------------------- streaming


class _LayerState:
    """Running sums for one layer (all float64 by default)."""

    def __init__(self, d: int, dtype: torch.dtype, device: torch.device, keep_ctx: bool,
                 second_moment: bool):
        self.d = d
        self.dtype, self.device = dtype, device
        self.pos_sum = torch.zeros(0, d, dtype=dtype, device=device)  # [T, d]
        self.pos_counts = torch.zeros(0, dtype=dtype, device=device)  # [T]
        self.keep_ctx = keep_ctx
        self.ctx_mean = torch.zeros(0, d, dtype=dtype, device=device) if keep_ctx else None
        self.ctx_counts = torch.zeros(0, dtype=dtype, device=device) if keep_ctx else None
        self.raw_gram = torch.zeros(d, d, dtype=dtype, device=device) if second_moment else None
        self.n_contexts = 0

    def _grow_positions(self, T: int) -> None:
        if T > self.pos_sum.shape[0]:
            extra = T - self.pos_sum.shape[0]
            self.pos_sum = torch.cat([self.pos_sum, self.pos_sum.new_zeros(extra, self.d)])
            self.pos_counts = torch.cat([self.pos_counts, self.pos_counts.new_zeros(extra)])

    def _grow_contexts(self, C: int) -> None:
        need = self.n_contexts + C
        cap = self.ctx_mean.shape[0]
        if need > cap:  # amortized doubling: a constant number of tensors, O(C d) numbers
            new_cap = max(need, 2 * cap, 16)
            mean = self.ctx_mean.new_zeros(new_cap, self.d)
            mean[:cap] = self.ctx_mean
            counts = self.ctx_counts.new_zeros(new_cap)
            counts[:cap] = self.ctx_counts
            self.ctx_mean, self.ctx_counts = mean, counts

    def update(self, h: Tensor, mask: Tensor | None) -> None:
        C, T, d = h.shape
        h = h.to(device=self.device, dtype=self.dtype)
        hm = _masked(h, None if mask is None else mask.to(self.device))
        w = (torch.ones(C, T, dtype=self.dtype, device=self.device) if mask is None
             else mask.to(device=self.device, dtype=self.dtype))
        self._grow_positions(T)
        self.pos_sum[:T] += hm.sum(0)
        self.pos_counts[:T] += w.sum(0)
        if self.keep_ctx:
            self._grow_contexts(C)
            counts = w.sum(1)
            self.ctx_mean[self.n_contexts:self.n_contexts + C] = _safe_mean(hm.sum(1), counts)
            self.ctx_counts[self.n_contexts:self.n_contexts + C] = counts
        if self.raw_gram is not None:
            flat = hm.reshape(-1, d)
            self.raw_gram += flat.T @ flat
        self.n_contexts += C

    def tensors(self) -> list[Tensor]:
        out = [self.pos_sum, self.pos_counts]
        if self.keep_ctx:
            out += [self.ctx_mean, self.ctx_counts]
        if self.raw_gram is not None:
            out.append(self.raw_gram)
        return out

    def stats(self) -> tuple[Tensor, Tensor, float]:
        n = float(self.pos_counts.sum())
        if n == 0:
            raise ValueError("no valid entries were accumulated")
        mu = self.pos_sum.sum(0) / n
        pos = _safe_mean(self.pos_sum, self.pos_counts) - mu * (self.pos_counts > 0)[:, None]
        return mu, pos, n


class DecompositionAccumulator:
    """Streaming means for :func:`decompose`, for many layers at once.

    Feed it batches of activations ``[batch, T, d]`` (one entry per layer / hook name) with
    :meth:`update`, or let :func:`accumulate` feed it from model hooks. It keeps, per layer, the
    running sums of ``h`` per position ``[T, d]`` and their counts, the mean of every context
    ``[C, d]`` (if ``keep_ctx``), and the ``d x d`` second moment (if ``second_moment``, for the
    relative norm): ``O(L (T + C) d + L d^2)`` numbers, never the activations themselves. All sums
    are in float64 by default. :meth:`result` then gives the same ``mu``, ``pos``, ``ctx`` (and
    centered Gram) as :func:`decompose` on the concatenation of all batches, padding included:
    batches may have different ``T`` (shorter ones count as padded).

    Args:
        drop_first: leading positions dropped from every batch (as in :func:`decompose`).
        keep_ctx: keep one mean vector per context (needed for ``ctx``, incoherence and cluster
            measures). With False the memory is independent of the number of contexts.
        second_moment: accumulate ``sum h h^T`` per layer (``d x d``) for the relative norm.
        dtype: accumulation precision.
        device: where the sums live (default: the device of the first batch).

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> h = torch.randn(10, 6, 4, generator=g)
        >>> acc = DecompositionAccumulator()
        >>> for chunk in h.split(3):
        ...     acc.update({"layer": chunk})
        >>> res, ref = acc.result("layer"), decompose(h)
        >>> bool(torch.allclose(res.pos, ref.pos)) and bool(torch.allclose(res.ctx, ref.ctx))
        True
        >>> second = acc.residuals("layer", h[:2])       # residuals of two contexts
        >>> bool(torch.allclose(second.resid, ref.resid[:2]))
        True
    """

    def __init__(self, *, drop_first: int = 0, keep_ctx: bool = True, second_moment: bool = True,
                 dtype: torch.dtype = torch.float64, device: torch.device | str | None = None):
        if not isinstance(drop_first, int) or isinstance(drop_first, bool) or drop_first < 0:
            raise ValueError(f"drop_first: must be a non-negative integer, got {drop_first!r}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype: must be a floating-point dtype, got {dtype}")
        self.drop_first = drop_first
        self.keep_ctx = keep_ctx
        self.second_moment = second_moment
        self.dtype = dtype
        self.device = None if device is None else torch.device(device)
        self._states: dict[str | int, _LayerState] = {}

    # ------------------------------------------------------------- feeding
    @property
    def names(self) -> list[str | int]:
        """The layer keys seen so far, in first-seen order."""
        return list(self._states)

    def n_contexts(self, name: str | int | None = None) -> int:
        """Contexts accumulated for ``name`` (default: the first layer)."""
        return self._state(name).n_contexts

    def update(
        self,
        activations: Mapping[str | int, Tensor] | Sequence[Tensor] | Tensor,
        mask: Bool[Tensor, "batch pos"] | None = None,
    ) -> None:
        """Add one batch of contexts for one or several layers.

        Args:
            activations: ``{name: [batch, T, d]}``, a list of ``[batch, T, d]`` tensors (keys
                0, 1, ...: e.g. a TransformerBridge's or ``output_hidden_states`` per-layer states),
                or one ``[batch, T, d]`` tensor (key 0).
            mask: valid entries ``[batch, T]`` (before ``drop_first``), or None.
        """
        if torch.is_tensor(activations):
            items = [(0, activations)]
        elif isinstance(activations, Mapping):
            items = list(activations.items())
        elif isinstance(activations, Sequence):
            items = list(enumerate(activations))
        else:
            raise ValueError(f"activations: expected a tensor, a list of tensors or a mapping, got "
                             f"{type(activations).__name__}")
        for name, h in items:
            self.update_one(name, h, mask)

    def update_one(self, name: str | int, h: Float[Tensor, "batch pos d"],
                   mask: Bool[Tensor, "batch pos"] | None = None) -> None:
        """Add one batch of contexts for the layer ``name``."""
        h = _check_h(h, f"activations[{name!r}]")
        mask = _check_mask(mask, h)
        if h.shape[1] <= self.drop_first:
            raise ValueError(f"drop_first: {self.drop_first} leaves no position of a batch with "
                             f"{h.shape[1]} positions")
        h = h.detach()[:, self.drop_first:]
        if mask is not None:
            mask = mask[:, self.drop_first:]
        state = self._states.get(name)
        if state is None:
            device = self.device or h.device
            state = self._states[name] = _LayerState(h.shape[2], self.dtype, device,
                                                     self.keep_ctx, self.second_moment)
        elif h.shape[2] != state.d:
            raise ValueError(f"activations[{name!r}]: feature size {h.shape[2]} differs from "
                             f"earlier batches ({state.d})")
        with torch.no_grad():
            state.update(h, mask)

    def hook(self, name: str, mask: Tensor | None = None) -> Callable:
        """A TransformerLens hook function feeding ``name``'s activation into the accumulator."""
        def fn(activation: Tensor, hook: Any = None) -> None:
            self.update_one(name, activation, mask)
        return fn

    def fwd_hooks(self, names: Sequence[str], mask: Tensor | None = None) -> list[tuple[str, Callable]]:
        """``[(name, hook_fn), ...]`` for ``model.run_with_hooks(tokens, fwd_hooks=...)``."""
        return [(name, self.hook(name, mask)) for name in names]

    # ------------------------------------------------------------- results
    def _state(self, name: str | int | None) -> _LayerState:
        if not self._states:
            raise ValueError("accumulator: nothing accumulated yet; call update() first")
        if name is None:
            return next(iter(self._states.values()))
        try:
            return self._states[name]
        except KeyError:
            raise ValueError(f"name: {name!r} was never accumulated; known: {self.names}") from None

    def result(self, name: str | int | None = None) -> Decomposition:
        """``mu``, ``pos``, ``ctx`` (and the centered Gram) of layer ``name``; ``resid`` is None."""
        state = self._state(name)
        mu, pos, n = state.stats()
        ctx = ctx_counts = None
        if state.keep_ctx:
            counts = state.ctx_counts[:state.n_contexts]
            ctx = state.ctx_mean[:state.n_contexts] - mu * (counts > 0)[:, None]
            ctx_counts = counts.clone()
        cg = None
        if state.raw_gram is not None:
            cg = state.raw_gram - n * torch.outer(mu, mu)
        return Decomposition(mu=mu, pos=pos, ctx=ctx, resid=None, mask=None,
                             pos_counts=state.pos_counts.clone(), ctx_counts=ctx_counts,
                             n_tokens=int(n), n_contexts=state.n_contexts, centered_gram=cg,
                             start=self.drop_first, name=name if name is not None else self.names[0])

    def results(self) -> dict[str | int, Decomposition]:
        """:meth:`result` for every layer, in first-seen order."""
        return {name: self.result(name) for name in self._states}

    def residuals(self, name: str | int, h: Float[Tensor, "ctx pos d"],
                  mask: Bool[Tensor, "ctx pos"] | None = None) -> Decomposition:
        """Second pass: the decomposition of the contexts ``h`` against the accumulated means.

        ``h`` holds the activations of layer ``name`` for a chosen subset of contexts (all
        positions, before ``drop_first``). ``ctx`` is each context's own mean minus the accumulated
        ``mu`` (identical to the stored ``ctx`` when these contexts were part of the first pass)
        and ``resid = h - mu - pos - ctx``, so ``h = mu + pos + ctx + resid`` holds exactly.
        """
        state = self._state(name)
        h = _check_h(h)
        mask = _check_mask(mask, h)
        if h.shape[1] <= self.drop_first:
            raise ValueError(f"h: {h.shape[1]} positions, drop_first is {self.drop_first}")
        h = h.detach()[:, self.drop_first:].to(device=state.device, dtype=self.dtype)
        if mask is not None:
            mask = mask[:, self.drop_first:].to(state.device)
        C, T, d = h.shape
        if d != state.d:
            raise ValueError(f"h: feature size {d} differs from the accumulated {state.d}")
        if T > state.pos_sum.shape[0]:
            raise ValueError(f"h: {T} positions (after drop_first) but only "
                             f"{state.pos_sum.shape[0]} were accumulated")
        full = self.result(name)
        pos = full.pos[:T]
        hm = _masked(h, mask)
        w = torch.ones(C, T, dtype=self.dtype, device=h.device) if mask is None else mask.to(self.dtype)
        counts = w.sum(1)
        ctx = _safe_mean(hm.sum(1), counts) - full.mu * (counts > 0)[:, None]
        resid = _masked(h - full.mu - pos[None] - ctx[:, None], mask)
        return replace(full, pos=pos, pos_counts=full.pos_counts[:T], ctx=ctx, resid=resid,
                       mask=mask, ctx_counts=counts, name=name)

    # ------------------------------------------------------------- memory
    def retained_tensors(self) -> list[Tensor]:
        """Every tensor the accumulator holds (its whole memory footprint)."""
        return [t for state in self._states.values() for t in state.tensors()]

    def nbytes(self) -> int:
        """Bytes held by :meth:`retained_tensors`."""
        return sum(t.numel() * t.element_size() for t in self.retained_tensors())


# --------------------------------------------------------------------------- models


def residual_stream_names(model: nn.Module) -> list[str]:
    """Hook names of the residual stream between blocks, ``h^(0), ..., h^(L)`` in the paper's terms.

    ``blocks.{l}.hook_resid_pre`` for every block (``h^(l)``, the input of block ``l``; ``l = 0`` is
    the embedding output), then the last block's output (``hook_normalized_resid_post`` in a post-LN
    model, else ``hook_resid_post``): ``L + 1`` names, matching the paper's "Layer 0..L" columns.

    Example:
        >>> import tfmatcomp as tm
        >>> residual_stream_names(tm.HookedEncoder(tm.get_preset("tiny").model))
        ['blocks.0.hook_resid_pre', 'blocks.1.hook_resid_pre', 'blocks.1.hook_normalized_resid_post']
    """
    hook_dict = getattr(model, "hook_dict", None)
    if not hook_dict:
        raise ValueError(f"model: {type(model).__name__} has no TransformerLens hook_dict; pass "
                         "names= or modules= explicitly")
    pat = re.compile(r"^blocks\.(\d+)\.hook_resid_pre$")
    layers = sorted(int(m.group(1)) for n in hook_dict if (m := pat.match(n)))
    if not layers:
        raise ValueError("model: no blocks.{l}.hook_resid_pre hooks found; pass names= explicitly")
    names = [f"blocks.{l}.hook_resid_pre" for l in layers]
    last = layers[-1]
    for suffix in ("hook_normalized_resid_post", "hook_resid_post"):
        if f"blocks.{last}.{suffix}" in hook_dict:
            names.append(f"blocks.{last}.{suffix}")
            break
    return names


def hf_bert_modules(bert: nn.Module) -> dict[str, nn.Module]:
    """Sub-modules of a transformers BERT whose outputs are ``hidden_states[0..L]``.

    ``{"hidden_states.0": bert.embeddings, "hidden_states.1": bert.encoder.layer[0], ...}``; pass as
    ``modules=`` to :func:`accumulate` to stream a ``BertModel`` through plain forward hooks.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> bert = BertModel(BertConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        ...                             intermediate_size=16, vocab_size=30))
        >>> list(hf_bert_modules(bert))
        ['hidden_states.0', 'hidden_states.1', 'hidden_states.2']
    """
    inner = getattr(bert, "bert", bert)
    try:
        layers = list(inner.encoder.layer)
        embeddings = inner.embeddings
    except AttributeError:
        raise ValueError(f"bert: {type(bert).__name__} has no .embeddings / .encoder.layer; pass "
                         "modules= yourself") from None
    out = {"hidden_states.0": embeddings}
    out.update({f"hidden_states.{i + 1}": layer for i, layer in enumerate(layers)})
    return out


def _unpack_batch(batch: Any) -> tuple[Tensor, Tensor | None]:
    if torch.is_tensor(batch):
        return batch, None
    if hasattr(batch, "tokens") and torch.is_tensor(getattr(batch, "tokens")):  # MatrixBatch
        return batch.tokens, None
    if isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise ValueError(f"batches: a mapping batch needs 'input_ids', got keys {list(batch)}")
        return batch["input_ids"], batch.get("attention_mask")
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(f"batches: each item must be a token tensor, a MatrixBatch, a mapping with "
                     f"input_ids / attention_mask, or (tokens, mask); got {type(batch).__name__}")


def _model_device(model: nn.Module) -> torch.device | None:
    for p in model.parameters():
        return p.device
    return None


def _output_tensor(output: Any) -> Tensor:
    if torch.is_tensor(output):
        return output
    if isinstance(output, (tuple, list)) and output and torch.is_tensor(output[0]):
        return output[0]
    for attr in ("last_hidden_state", "hidden_states"):
        value = getattr(output, attr, None)
        if torch.is_tensor(value):
            return value
    raise ValueError(f"modules: cannot find a [batch, pos, d] tensor in a {type(output).__name__} output")


def _run(model: nn.Module, tokens: Tensor, mask: Tensor | None, fwd_hooks, forward_kwargs) -> None:
    kwargs = dict(forward_kwargs or {})
    if mask is not None:
        kwargs["attention_mask"] = mask
    from tfmatcomp.model import HookedEncoder

    if isinstance(model, HookedEncoder):
        kwargs.setdefault("return_type", None)
    if fwd_hooks is None:
        model(tokens, **kwargs)
    else:
        model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, **kwargs)


def _feed(
    model: nn.Module,
    batches: Iterable[Any],
    sink: Callable[[str, Tensor, Tensor | None], None],
    names: Sequence[str] | None,
    modules: Mapping[str, nn.Module] | None,
    progress: bool,
    total: int | None,
    desc: str,
    forward_kwargs: Mapping[str, Any] | None,
) -> int:
    """Run ``model`` over ``batches``, calling ``sink(name, activation, mask)`` from hooks."""
    from tqdm.auto import tqdm

    if modules is not None and names is not None:
        raise ValueError("names / modules: give one of them (hook names for run_with_hooks, or "
                         "modules for plain forward hooks)")
    if modules is None:
        if not hasattr(model, "run_with_hooks"):
            raise ValueError(f"model: {type(model).__name__} has no run_with_hooks; pass modules= "
                             "(name -> nn.Module whose output to decompose)")
        names = list(names) if names is not None else residual_stream_names(model)
        if not names:
            raise ValueError("names: empty")
    device = _model_device(model)
    current: dict[str, Tensor | None] = {"mask": None}
    handles = []
    if modules is not None:
        for name, module in modules.items():
            def fn(mod, args, output, _name=name):
                sink(_name, _output_tensor(output), current["mask"])
            handles.append(module.register_forward_hook(fn))
    n_tokens = 0
    try:
        with torch.no_grad():
            for batch in tqdm(batches, total=total, disable=not progress, desc=desc, unit="batch"):
                tokens, mask = _unpack_batch(batch)
                if device is not None:
                    tokens = tokens.to(device)
                    mask = None if mask is None else mask.to(device)
                current["mask"] = mask
                hooks = None
                if modules is None:
                    hooks = [(name, (lambda act, hook, _n=name, _m=mask: sink(_n, act, _m)))
                             for name in names]
                _run(model, tokens, mask, hooks, forward_kwargs)
                n_tokens += int(tokens.numel() if mask is None else mask.sum())
    finally:
        for handle in handles:
            handle.remove()
    return n_tokens


def accumulate(
    model: nn.Module,
    batches: Iterable[Any],
    names: Sequence[str] | None = None,
    *,
    modules: Mapping[str, nn.Module] | None = None,
    accumulator: DecompositionAccumulator | None = None,
    drop_first: int = 0,
    keep_ctx: bool = True,
    second_moment: bool = True,
    progress: bool = True,
    total: int | None = None,
    forward_kwargs: Mapping[str, Any] | None = None,
) -> DecompositionAccumulator:
    """Stream a model's activations over ``batches`` into a :class:`DecompositionAccumulator`.

    Each batch is run once with hook functions that feed the accumulator and return nothing, so no
    activation is stored beyond the forward pass itself.

    Args:
        model: a HookedEncoder or any TransformerLens-style module with ``run_with_hooks`` (e.g. a
            TransformerBridge), or any ``nn.Module`` together with ``modules``.
        batches: iterable of token tensors ``[batch, T]``, :class:`~tfmatcomp.MatrixBatch` objects,
            mappings with ``input_ids`` (and ``attention_mask``: 1 = real token), or
            ``(tokens, mask)`` pairs. A mask is passed to the model as ``attention_mask`` and makes
            the decomposition padding-aware.
        names: hook names to decompose (default :func:`residual_stream_names`).
        modules: instead of hook names, ``{name: submodule}`` whose forward outputs to decompose
            (torch forward hooks; e.g. :func:`hf_bert_modules` for a transformers BERT).
        accumulator: continue an existing accumulator (its settings win over the next three).
        drop_first, keep_ctx, second_moment: see :class:`DecompositionAccumulator`.
        progress: show a tqdm progress bar.
        total: number of batches, for the progress bar.
        forward_kwargs: extra keyword arguments for every forward call.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        >>> task = tm.MatrixCompletionTask(4, rank=1)
        >>> g = torch.Generator().manual_seed(0)
        >>> acc = accumulate(model, (task.sample(16, generator=g) for _ in range(3)), progress=False)
        >>> acc.n_contexts(), acc.result("blocks.1.hook_resid_pre").pos.shape
        (48, torch.Size([16, 64]))
    """
    acc = accumulator or DecompositionAccumulator(drop_first=drop_first, keep_ctx=keep_ctx,
                                                  second_moment=second_moment)
    _feed(model, batches, acc.update_one, names, modules, progress, total, "decompose",
          forward_kwargs)
    return acc


def residual_pass(
    model: nn.Module,
    accumulator: DecompositionAccumulator,
    batch: Any,
    names: Sequence[str] | None = None,
    *,
    modules: Mapping[str, nn.Module] | None = None,
    forward_kwargs: Mapping[str, Any] | None = None,
) -> dict[str | int, Decomposition]:
    """Second pass: full decompositions (with ``resid`` and ``cvec``) of the contexts in ``batch``.

    Runs the model once on ``batch`` (any form :func:`accumulate` accepts), capturing only the
    requested activations, and returns ``{name: accumulator.residuals(name, h, mask)}``.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        >>> task = tm.MatrixCompletionTask(4, rank=1)
        >>> g = torch.Generator().manual_seed(0)
        >>> acc = accumulate(model, [task.sample(32, generator=g)], progress=False)
        >>> out = residual_pass(model, acc, task.sample(4, generator=g))
        >>> out["blocks.1.hook_resid_pre"].cvec.shape
        torch.Size([4, 16, 64])
    """
    if names is None and modules is None:
        names = [n for n in accumulator.names]
    captured: dict[str, tuple[Tensor, Tensor | None]] = {}

    def sink(name, h, mask):
        captured[name] = (h.detach(), mask)

    _feed(model, [batch], sink, names, modules, False, None, "residuals", forward_kwargs)
    return {name: accumulator.residuals(name, h, mask) for name, (h, mask) in captured.items()}
