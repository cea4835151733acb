"""The result type of the decomposition: :class:`Decomposition`, ``h = mu + pos + ctx + resid``.

Example:
    >>> import torch
    >>> from tfmatcomp.decomposition import decompose
    >>> dec = decompose(torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(0)))
    >>> dec.n_tokens, dec.n_contexts, dec.n_positions, dec.d_model
    (12, 3, 4, 2)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from jaxtyping import Bool, Float
from torch import Tensor

__all__ = ["Decomposition"]


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
