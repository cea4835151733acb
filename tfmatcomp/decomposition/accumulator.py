"""The streaming path: :class:`DecompositionAccumulator`, the sufficient statistics of the
decomposition over batches, for many layers at once.

Example:
    >>> import torch
    >>> acc = DecompositionAccumulator()
    >>> acc.update({"layer": torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(0))})
    >>> acc.names, acc.n_contexts("layer")
    (['layer'], 4)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Callable

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tfmatcomp.decomposition._gram import RunningGram
from tfmatcomp.decomposition.formula import (
    centered_means,
    check_activations,
    check_finite_entries,
    check_mask,
    masked,
    split_contexts,
    valid_weights,
)
from tfmatcomp.decomposition.result import Decomposition
from tfmatcomp.validation import check_bool, check_sum_dtype, is_int

__all__ = ["DecompositionAccumulator"]


class _LayerState:
    """Running sums for one layer (all float64 by default)."""

    def __init__(self, d: int, dtype: torch.dtype, device: torch.device, keep_ctx: bool,
                 second_moment: bool, exact_gram: bool = False):
        self.d = d
        self.exact_gram = exact_gram
        self.dtype, self.device = dtype, device
        self.pos_sum = torch.zeros(0, d, dtype=dtype, device=device)  # [T, d]
        self.pos_counts = torch.zeros(0, dtype=dtype, device=device)  # [T]
        self.keep_ctx = keep_ctx
        self.ctx_sum = torch.zeros(0, d, dtype=dtype, device=device) if keep_ctx else None
        self.ctx_counts = torch.zeros(0, dtype=dtype, device=device) if keep_ctx else None
        self.raw_gram = RunningGram(d, dtype, device) if second_moment else None
        self.n_contexts = 0

    def _grow_positions(self, T: int) -> None:
        if T > self.pos_sum.shape[0]:
            extra = T - self.pos_sum.shape[0]
            self.pos_sum = torch.cat([self.pos_sum, self.pos_sum.new_zeros(extra, self.d)])
            self.pos_counts = torch.cat([self.pos_counts, self.pos_counts.new_zeros(extra)])

    def _grow_contexts(self, C: int) -> None:
        need = self.n_contexts + C
        cap = self.ctx_sum.shape[0]
        if need > cap:  # amortized doubling: a constant number of tensors, O(C d) numbers
            new_cap = max(need, 2 * cap, 16)  # rows past n_contexts are scratch, never read
            n = self.n_contexts
            sums = self.ctx_sum.new_empty(new_cap, self.d)
            sums[:n] = self.ctx_sum[:n]
            counts = self.ctx_counts.new_empty(new_cap)
            counts[:n] = self.ctx_counts[:n]
            self.ctx_sum, self.ctx_counts = sums, counts

    def update(self, h: Tensor, mask: Tensor | None, head: Tensor | None,
               check: Callable[[], None]) -> None:
        """Add ``h`` (after ``drop_first``; ``head`` is a float64 sum over the dropped positions,
        checked with the rest). The batch's sums are formed first and checked for finiteness: a
        NaN / inf valid entry makes them non-finite (float64 sums of float32 values cannot
        overflow), and only then does ``check`` (the full check, counting the bad entries) run, so
        a clean batch costs a reduction over ``[T, d]`` rather than one over all of ``h``."""
        C, T, d = h.shape
        # unmasked float32 into float64 sums: reduce straight from float32 (no float64 copy of h)
        # and form the second moment in float32 around a shift, unless exact_gram
        float32 = (mask is None and h.dtype == torch.float32 and self.dtype == torch.float64
                   and h.device == self.device)
        sum_dtype = self.dtype if float32 else None
        w = None
        if not float32:
            h = h.to(device=self.device, dtype=self.dtype)
        if mask is not None:
            mask = mask.to(self.device)
            h = masked(h, mask)
            w = valid_weights(h, mask)
        pos_batch = h.sum(0, dtype=sum_dtype)
        finite = torch.isfinite(pos_batch).all()
        if head is not None:
            finite = finite & torch.isfinite(head.to(self.device)).all()
        if not bool(finite):
            check()  # raises naming the NaN / inf entries (a float64 overflow passes through)
        self._grow_positions(T)
        self.pos_sum[:T] += pos_batch
        self.pos_counts[:T] += C if w is None else w.sum(0)
        if self.keep_ctx:
            self._grow_contexts(C)
            rows = slice(self.n_contexts, self.n_contexts + C)
            torch.sum(h, 1, dtype=sum_dtype, out=self.ctx_sum[rows])
            self.ctx_counts[rows] = T if w is None else w.sum(1)
        if self.raw_gram is not None:  # one symmetric rank-k update per layer and batch
            rows = h.reshape(C * T, d)
            if float32 and not self.exact_gram:
                self.raw_gram.add_float32(rows, pos_batch.sum(0))
            else:
                self.raw_gram.add(rows.to(self.dtype))
        self.n_contexts += C

    def combine(self, reduce_sum: Callable[[Tensor], Tensor],
                gather_rows: Callable[[Tensor], Tensor]) -> None:
        """Replace the sums by ``reduce_sum`` of them and the per-context rows by
        ``gather_rows`` of them (see :meth:`DecompositionAccumulator.combine`)."""
        self.pos_sum, self.pos_counts = reduce_sum(self.pos_sum), reduce_sum(self.pos_counts)
        if self.raw_gram is not None:  # every part holds the same triangle (or all of it)
            self.raw_gram.replace(reduce_sum(self.raw_gram.tensor))
        if self.keep_ctx:
            self.ctx_sum = gather_rows(self.ctx_sum[:self.n_contexts])
            self.ctx_counts = gather_rows(self.ctx_counts[:self.n_contexts])
            self.n_contexts = self.ctx_counts.shape[0]
        else:
            count = torch.tensor([self.n_contexts], dtype=self.dtype, device=self.device)
            self.n_contexts = int(reduce_sum(count).item())

    def tensors(self) -> list[Tensor]:
        out = [self.pos_sum, self.pos_counts]
        if self.keep_ctx:
            out += [self.ctx_sum, self.ctx_counts]
        if self.raw_gram is not None:
            out.append(self.raw_gram.tensor)
        return out

    def stats(self) -> tuple[Tensor, Tensor, float]:
        """``mu``, ``pos`` and the number of valid entries so far."""
        n = float(self.pos_counts.sum())
        if n == 0:
            raise ValueError("no valid entries were accumulated")
        mu = self.pos_sum.sum(0) / n
        return mu, centered_means(self.pos_sum, self.pos_counts, mu), n


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
        exact_gram: with float32 activations and float64 sums (the default), each batch's second
            moment is formed in float32 around a fixed shift and added to the float64 sum, at about
            half the cost; its error is float32 rounding relative to the centered second moment,
            the size of the rounding already in float32 activations. True forms it in float64
            (``decompose``'s own precision). Means (``mu``, ``pos``, ``ctx``) are float64 sums
            either way.
        dtype: accumulation precision.
        device: where the sums live (default: the device of the first batch).

    Example:
        >>> import torch
        >>> from tfmatcomp.decomposition import decompose
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
                 exact_gram: bool = False, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None):
        if not is_int(drop_first) or drop_first < 0:
            raise ValueError(f"drop_first: must be a non-negative integer, got {drop_first!r}")
        check_sum_dtype("dtype", dtype)
        check_bool("keep_ctx", keep_ctx)
        check_bool("second_moment", second_moment)
        check_bool("exact_gram", exact_gram)
        self.exact_gram = exact_gram
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

    @property
    def feature_sizes(self) -> dict[str | int, int]:
        """``{name: d}`` of the layers seen so far, in first-seen order."""
        return {name: state.d for name, state in self._states.items()}

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
        label = f"activations[{name!r}]"
        h = check_activations(h, label)
        mask = check_mask(mask, h)
        if h.shape[1] <= self.drop_first:
            raise ValueError(f"drop_first: {self.drop_first} leaves no position of a batch with "
                             f"{h.shape[1]} positions")
        full, full_mask = h.detach(), mask
        head = None
        if self.drop_first:  # dropped positions are checked for NaN / inf like the rest
            kept = None if mask is None else mask[:, :self.drop_first]
            head = masked(full[:, :self.drop_first], kept).sum(0, dtype=torch.float64)
        h = full[:, self.drop_first:]
        if mask is not None:
            mask = mask[:, self.drop_first:]
        state = self._states.get(name)
        if state is None:
            state = self._new_layer(h.shape[2], h.device)
        elif h.shape[2] != state.d:
            raise ValueError(f"activations[{name!r}]: feature size {h.shape[2]} differs from "
                             f"earlier batches ({state.d})")
        with torch.no_grad():
            state.update(h, mask, head, lambda: check_finite_entries(full, full_mask, label))
        self._states[name] = state  # a layer is known only once a batch of it was accepted

    def _new_layer(self, d: int, device: torch.device) -> _LayerState:
        return _LayerState(d, self.dtype, self.device or device, self.keep_ctx, self.second_moment,
                           self.exact_gram)

    def _add_layer(self, name: str | int, d: int, device: torch.device) -> _LayerState:
        self._states[name] = state = self._new_layer(d, device)
        return state

    def combine(self, reduce_sum: Callable[[Tensor], Tensor],
                gather_rows: Callable[[Tensor], Tensor],
                layers: Mapping[str | int, int] | None = None) -> None:
        """Merge these statistics with those of other accumulators holding other contexts.

        Every statistic is either a sum over contexts (per-position sums and counts, the second
        moment) or one row per context (the context sums and counts). ``reduce_sum(t)`` must
        return the sum of every part's ``t`` (each zero-padded along its first axis to the
        longest: parts may have seen different numbers of positions); ``gather_rows(t)`` every
        part's rows, concatenated in the contexts' global order.
        :func:`tfmatcomp.distributed.all_reduce_accumulator` supplies the two through
        ``torch.distributed`` collectives, so that the result equals one accumulator fed all the
        contexts.

        Args:
            reduce_sum, gather_rows: the two combining functions.
            layers: ``{name: feature size}`` of every layer any part holds, in the order every
                part combines them; layers this accumulator has not seen start empty. Default:
                its own, in first-seen order.

        Example:
            >>> import torch
            >>> h = torch.randn(6, 3, 2, generator=torch.Generator().manual_seed(0))
            >>> acc = DecompositionAccumulator()
            >>> acc.update(h)
            >>> before = acc.result().ctx
            >>> acc.combine(lambda t: t, lambda t: t)      # a single part: nothing changes
            >>> bool(torch.equal(acc.result().ctx, before))
            True
        """
        layers = dict(layers) if layers is not None else self.feature_sizes
        for name, d in layers.items():
            if name not in self._states:
                self._add_layer(name, d, torch.device("cpu"))
        for name in layers:
            with torch.no_grad():
                self._states[name].combine(reduce_sum, gather_rows)

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
            ctx_counts = state.ctx_counts[:state.n_contexts].clone()
            ctx = centered_means(state.ctx_sum[:state.n_contexts], ctx_counts, mu)
        cg = None
        if state.raw_gram is not None:
            cg = state.raw_gram.full() - n * torch.outer(mu, mu)
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
        h = check_activations(h)
        mask = check_mask(mask, h)
        check_finite_entries(h, mask)
        if h.shape[1] <= self.drop_first:
            raise ValueError(f"h: {h.shape[1]} positions, drop_first is {self.drop_first}")
        h = h.detach()[:, self.drop_first:].to(device=state.device, dtype=self.dtype)
        if mask is not None:
            mask = mask[:, self.drop_first:].to(state.device)
        T, d = h.shape[1:]
        if d != state.d:
            raise ValueError(f"h: feature size {d} differs from the accumulated {state.d}")
        if T > state.pos_sum.shape[0]:
            raise ValueError(f"h: {T} positions (after drop_first) but only "
                             f"{state.pos_sum.shape[0]} were accumulated")
        full = self.result(name)
        pos = full.pos[:T]
        ctx, counts, resid = split_contexts(h, mask, full.mu, pos)
        return replace(full, pos=pos, pos_counts=full.pos_counts[:T], ctx=ctx, resid=resid,
                       mask=mask, ctx_counts=counts, name=name)

    # ------------------------------------------------------------- memory
    def retained_tensors(self) -> list[Tensor]:
        """Every tensor the accumulator holds (its whole memory footprint)."""
        return [t for state in self._states.values() for t in state.tensors()]

    def nbytes(self) -> int:
        """Bytes held by :meth:`retained_tensors`."""
        return sum(t.numel() * t.element_size() for t in self.retained_tensors())
