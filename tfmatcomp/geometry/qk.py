"""QK decomposition of attention scores into pos / cvec parts, and the rotated ``W_QK`` analysis.

**QK decomposition** (Song & Zhong Section 4.1, eq. 7). Split each attention input vector as
``x[c, t] = x_pos[t] + x_cvec[c, t]`` with ``x_pos = mu + pos_t`` (from a decomposition of that
layer's input over many contexts) and ``x_cvec = x - x_pos``. Then with ``q = x W_Q + b_Q`` and
``k = x W_K + b_K`` the pre-softmax score ``q . k / sqrt(d_head)`` splits exactly into four parts:
pos-pos, pos-cvec (query pos, key cvec), cvec-pos and cvec-cvec. By default the global mean ``mu``
and the biases ``b_Q``, ``b_K`` go with the *pos* side (they do not depend on the context), so
the four parts sum to the model's scores exactly; ``mean_side`` / ``bias_side`` move them to the
cvec side instead.

In our post-LN BERT the input of block ``l``'s attention is ``blocks.{l}.hook_resid_pre`` (the
previous block's normalized output, or the embedding LayerNorm's output for ``l = 0``), used
directly by ``W_Q`` / ``W_K`` with no further LayerNorm, so the split is exact; decompose *that*
activation (no second LayerNorm, and no causal mask: BERT is bidirectional).

**Rotated W_QK** (Section 4.2, Fig. 5): ``W = W_Q W_K^T / sqrt(d_head)``; its off-diagonal part
rotated into the basis of right singular vectors of the positional matrix ``P`` and denoised at the
universal threshold ``sqrt(2 log(d^2)) * std``: large surviving entries in the top-left block mean
that the head reads the positional subspace.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.decomposition import accumulate
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    >>> task, g = tm.MatrixCompletionTask(4, rank=1), torch.Generator().manual_seed(0)
    >>> acc = accumulate(model, [task.sample(64, generator=g)], ["blocks.1.hook_resid_pre"], progress=False)
    >>> qk = qk_decomposition(model, task.sample(2, generator=g).tokens, 1, acc.result())
    >>> bool(torch.allclose(qk.total(), qk.scores.double(), atol=1e-5))
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.datapath import run_chunked
from tfmatcomp.decomposition import Decomposition
from tfmatcomp.models.components.attention import padding_mask
from tfmatcomp.models.hook_names import block_hook_name
from tfmatcomp.validation import check_int_in_range, check_non_negative

__all__ = ["QKComponents", "qk_components", "qk_decomposition", "RotatedWQK", "rotated_wqk",
           "rotated_wqk_head", "COMPONENTS", "full_pos"]

COMPONENTS = ("pos_pos", "pos_cvec", "cvec_pos", "cvec_cvec")
Side = Literal["pos", "cvec"]


@dataclass(frozen=True)
class QKComponents:
    """The four score components ``[batch, head, query, key]`` (float64), query side first.

    Attributes:
        pos_pos, pos_cvec, cvec_pos, cvec_cvec: e.g. ``pos_cvec[b, h, i, j] = q_pos_i . k_cvec_j /
            sqrt(d_head)``.
        scores: the model's actual ``hook_attn_scores`` for the heads (None for plain tensors).
        pattern: the model's ``hook_pattern`` for the heads (None for plain tensors).
        additive_mask: the padding mask added to the scores ``[batch, 1, 1, key]`` (None: none).
        heads: the (0-based) heads, in order of the head axis.
        layer: the (0-based) layer, if known.
    """

    pos_pos: Float[Tensor, "batch head query key"]
    pos_cvec: Float[Tensor, "batch head query key"]
    cvec_pos: Float[Tensor, "batch head query key"]
    cvec_cvec: Float[Tensor, "batch head query key"]
    scores: Float[Tensor, "batch head query key"] | None = None
    pattern: Float[Tensor, "batch head query key"] | None = None
    additive_mask: Float[Tensor, "batch 1 1 key"] | None = None
    heads: tuple[int, ...] = ()
    layer: int | None = None

    def total(self) -> Float[Tensor, "batch head query key"]:
        """Sum of the four components (plus the padding mask): equals ``scores``."""
        out = self.pos_pos + self.pos_cvec + self.cvec_pos + self.cvec_cvec
        if self.additive_mask is not None:
            out = out + self.additive_mask.to(out.dtype)
        return out

    def as_dict(self) -> dict[str, Tensor]:
        """``{"pos_pos": ..., "pos_cvec": ..., "cvec_pos": ..., "cvec_cvec": ...}``."""
        return {name: getattr(self, name) for name in COMPONENTS}


def _check_side(name: str, value: str) -> str:
    if value not in ("pos", "cvec"):
        raise ValueError(f"{name}: must be 'pos' or 'cvec', got {value!r}")
    return value


def qk_components(
    x_pos: Float[Tensor, "batch pos d_model"],
    x_cvec: Float[Tensor, "batch pos d_model"],
    W_Q: Float[Tensor, "head d_model d_head"],
    W_K: Float[Tensor, "head d_model d_head"],
    b_Q: Float[Tensor, "head d_head"] | None = None,
    b_K: Float[Tensor, "head d_head"] | None = None,
    *,
    bias_side: Side = "pos",
) -> QKComponents:
    """The four QK components for any attention input split ``x = x_pos + x_cvec``.

    Plain tensors, for any model (e.g. activations and weights from a TransformerBridge): scores
    ``(x W_Q + b_Q) . (x W_K + b_K) / sqrt(d_head)`` split by which part each side comes from.
    Biases are added to the ``bias_side`` part. Computed in float64.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> x_pos, x_cvec = torch.randn(2, 1, 5, 8, generator=g)
        >>> W_Q, W_K = torch.randn(2, 3, 8, 4, generator=g)
        >>> c = qk_components(x_pos, x_cvec, W_Q, W_K)
        >>> x = (x_pos + x_cvec).double()
        >>> direct = torch.einsum("bqe,bke->bqk", x @ W_Q.double()[0], x @ W_K.double()[0]) / 2
        >>> bool(torch.allclose(c.total()[:, 0], direct))
        True
    """
    _check_side("bias_side", bias_side)
    if x_pos.shape != x_cvec.shape or x_pos.ndim != 3:
        raise ValueError(f"x_pos, x_cvec: expected equal shapes [batch, pos, d_model], got "
                         f"{tuple(x_pos.shape)} and {tuple(x_cvec.shape)}")
    if W_Q.ndim != 3 or W_Q.shape != W_K.shape or W_Q.shape[1] != x_pos.shape[-1]:
        raise ValueError(f"W_Q, W_K: expected equal shapes [head, {x_pos.shape[-1]}, d_head], got "
                         f"{tuple(W_Q.shape)} and {tuple(W_K.shape)}")
    f64 = torch.float64
    xp, xc = x_pos.to(f64), x_cvec.to(f64)
    WQ, WK = W_Q.detach().to(f64), W_K.detach().to(f64)
    scale = W_Q.shape[-1] ** -0.5
    q_pos = torch.einsum("btd,hde->bhte", xp, WQ)
    q_cvec = torch.einsum("btd,hde->bhte", xc, WQ)
    k_pos = torch.einsum("btd,hde->bhte", xp, WK)
    k_cvec = torch.einsum("btd,hde->bhte", xc, WK)
    if b_Q is not None:
        bq = b_Q.detach().to(f64)[None, :, None, :]
        if bias_side == "pos":
            q_pos = q_pos + bq
        else:
            q_cvec = q_cvec + bq
    if b_K is not None:
        bk = b_K.detach().to(f64)[None, :, None, :]
        if bias_side == "pos":
            k_pos = k_pos + bk
        else:
            k_cvec = k_cvec + bk

    def dot(q, k):
        return q @ k.transpose(-1, -2) * scale

    return QKComponents(pos_pos=dot(q_pos, k_pos), pos_cvec=dot(q_pos, k_cvec),
                        cvec_pos=dot(q_cvec, k_pos), cvec_cvec=dot(q_cvec, k_cvec),
                        heads=tuple(range(W_Q.shape[0])))


def full_pos(decomposition: Decomposition, T: int) -> Float[Tensor, "T d_model"]:
    """``pos_t`` for absolute positions ``t = 0..T-1``: the decomposition's ``pos`` placed from its
    ``start`` (the positions it dropped, or beyond its length, get 0).

    Example:
        >>> import torch
        >>> from tfmatcomp.decomposition import decompose
        >>> d = decompose(torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(0)), drop_first=1)
        >>> p = full_pos(d, 4)
        >>> p.shape, p[0].tolist(), p[3].tolist(), bool(torch.equal(p[1:3], d.pos))
        (torch.Size([4, 2]), [0.0, 0.0], [0.0, 0.0], True)
    """
    pos = decomposition.pos
    out = pos.new_zeros(T, pos.shape[1])
    start = decomposition.start
    n = max(0, min(T - start, pos.shape[0]))
    if n:
        out[start:start + n] = pos[:n]
    return out


def qk_decomposition(
    model,
    tokens: Int[Tensor, "batch pos"],
    layer: int,
    decomposition: Decomposition,
    *,
    heads: int | list[int] | None = None,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    mean_side: Side = "pos",
    bias_side: Side = "pos",
) -> QKComponents:
    """Decompose a HookedEncoder's pre-softmax scores at ``layer`` into the four QK components.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder`.
        tokens: input ids ``[batch, pos]``.
        layer: 0-based block index.
        decomposition: the decomposition of ``blocks.{layer}.hook_resid_pre`` over many contexts
            (e.g. ``accumulate(model, batches, ["blocks.1.hook_resid_pre"]).result()``). Positions it
            does not cover (dropped with ``drop_first``) get ``pos = 0``: they are all cvec.
        heads: 0-based head(s) (default all).
        attention_mask: padding mask for the forward pass (1 = token); its additive form is kept
            in ``additive_mask`` so that ``total()`` still equals ``scores``.
        mean_side: where ``mu`` goes: ``"pos"`` (``x_pos = mu + pos_t``, default) or ``"cvec"``
            (``x_pos = pos_t``, so ``x_cvec = ctx + resid + mu``; the paper's Fig. 27 vs 28).
        bias_side: where ``b_Q``, ``b_K`` go (default ``"pos"``).

    Returns:
        :class:`QKComponents` with the model's actual ``scores`` and ``pattern`` for the heads.
    """
    _check_side("mean_side", mean_side)
    check_int_in_range("layer", layer, 0, len(model.blocks) - 1)
    n_heads = model.cfg.n_heads
    if heads is None:
        heads = list(range(n_heads))
    elif isinstance(heads, int):
        heads = [heads]
    heads = list(heads)
    for h in heads:
        if not isinstance(h, int) or isinstance(h, bool) or not 0 <= h < n_heads:
            raise ValueError(f"heads: each head must be an integer in [0, {n_heads - 1}], got {h!r}")
    if decomposition.d_model != model.cfg.d_model:
        raise ValueError(f"decomposition: d_model {decomposition.d_model} != model's {model.cfg.d_model}")
    names = [block_hook_name(n, layer) for n in ("hook_resid_pre", "attn.hook_attn_scores", "attn.hook_pattern")]
    _, cache = run_chunked(model, tokens, batch_size=max(1, tokens.shape[0]), names=names,
                           return_predictions=False, attention_mask=attention_mask)
    x = cache[names[0]].to(torch.float64)
    T = x.shape[1]
    pos = full_pos(decomposition, T).to(device=x.device, dtype=torch.float64)
    mu = decomposition.mu.to(device=x.device, dtype=torch.float64)
    x_pos = (pos + mu if mean_side == "pos" else pos).expand_as(x)
    x_cvec = x - x_pos
    attn = model.blocks[layer].attn
    idx = torch.tensor(heads, device=attn.W_Q.device)
    comps = qk_components(x_pos, x_cvec, attn.W_Q[idx], attn.W_K[idx], attn.b_Q[idx],
                          attn.b_K[idx], bias_side=bias_side)
    additive = None
    if attention_mask is not None:
        dtype = attn.W_Q.dtype
        additive = padding_mask(attention_mask, dtype)
    return QKComponents(pos_pos=comps.pos_pos, pos_cvec=comps.pos_cvec, cvec_pos=comps.cvec_pos,
                        cvec_cvec=comps.cvec_cvec, scores=cache[names[1]][:, idx],
                        pattern=cache[names[2]][:, idx], additive_mask=additive,
                        heads=tuple(heads), layer=layer)


# ------------------------------------------------------------------ rotated W_QK


@dataclass(frozen=True)
class RotatedWQK:
    """Result of :func:`rotated_wqk` (all float64, ``d x d``).

    Attributes:
        W: ``W_Q W_K^T / sqrt(d_head)``.
        diagonal: ``diag(W)`` ``[d]`` (the paper's red curve).
        rotated: ``V^T (W - diag(W)) V`` with ``V`` the right singular vectors of ``P`` (columns
            ordered by decreasing singular value, completed to an orthonormal basis of ``R^d``).
        denoised: ``rotated`` with entries below ``threshold`` in absolute value set to 0.
        threshold: ``sqrt(2 log(d^2)) * std(rotated)`` unless given.
        basis: ``V`` ``[d, d]``.
    """

    W: Float[Tensor, "d d"]
    diagonal: Float[Tensor, "d"]
    rotated: Float[Tensor, "d d"]
    denoised: Float[Tensor, "d d"]
    threshold: float
    basis: Float[Tensor, "d d"]

    def top_left_fraction(self, K: int) -> float:
        """Share of the denoised energy (sum of squares) in the top-left ``K x K`` block."""
        d = self.denoised.shape[0]
        check_int_in_range("K", K, 1, d)
        e = self.denoised ** 2
        total = float(e.sum())
        return float(e[:K, :K].sum()) / total if total > 0 else float("nan")


def rotated_wqk(
    W_Q: Float[Tensor, "d_model d_head"],
    W_K: Float[Tensor, "d_model d_head"],
    pos: Float[Tensor, "pos d_model"],
    *,
    threshold: float | None = None,
) -> RotatedWQK:
    """Rotate one head's off-diagonal ``W_QK`` into the positional basis and denoise it.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> pos = torch.randn(16, 3, generator=g) @ torch.randn(3, 32, generator=g)
        >>> r = rotated_wqk(torch.randn(32, 8, generator=g), torch.randn(32, 8, generator=g), pos)
        >>> r.rotated.shape, r.threshold > 0
        (torch.Size([32, 32]), True)
    """
    if W_Q.ndim != 2 or W_Q.shape != W_K.shape:
        raise ValueError(f"W_Q, W_K: expected equal shapes [d_model, d_head] (one head), got "
                         f"{tuple(W_Q.shape)} and {tuple(W_K.shape)}")
    if pos.ndim != 2 or pos.shape[1] != W_Q.shape[0]:
        raise ValueError(f"pos: expected [T, {W_Q.shape[0]}], got {tuple(pos.shape)}")
    f64 = torch.float64
    WQ, WK = W_Q.detach().to(f64), W_K.detach().to(f64)
    W = WQ @ WK.T / math.sqrt(W_Q.shape[1])
    diagonal = torch.diagonal(W).clone()
    off = W - torch.diag(diagonal)
    _, _, vh = torch.linalg.svd(pos.detach().to(f64, copy=False).to(W.device), full_matrices=True)
    V = vh.T
    rotated = V.T @ off @ V
    d = W.shape[0]
    if threshold is None:
        threshold = math.sqrt(2 * math.log(d * d)) * float(rotated.std())
    else:
        check_non_negative("threshold", threshold)
    denoised = torch.where(rotated.abs() >= threshold, rotated, torch.zeros_like(rotated))
    return RotatedWQK(W=W, diagonal=diagonal, rotated=rotated, denoised=denoised,
                      threshold=float(threshold), basis=V)


def rotated_wqk_head(model, layer: int, head: int, pos: Float[Tensor, "pos d_model"],
                     *, threshold: float | None = None) -> RotatedWQK:
    """:func:`rotated_wqk` for head ``head`` (0-based) of block ``layer`` (0-based) of a HookedEncoder."""
    check_int_in_range("layer", layer, 0, len(model.blocks) - 1)
    check_int_in_range("head", head, 0, model.cfg.n_heads - 1)
    attn = model.blocks[layer].attn
    return rotated_wqk(attn.W_Q[head], attn.W_K[head], pos, threshold=threshold)
