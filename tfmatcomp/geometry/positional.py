"""How smooth a positional basis is, and Table 1's positional columns of a decoder per layer
(Song & Zhong Section 5; :mod:`tfmatcomp.analyses.training_format` measures its trained models
with these).

Smoothness is read two ways (:func:`positional_profile`): the mean cosine between neighbouring
positions ``cos(pos_t, pos_{t+1})`` (near 1 for a smooth curve) and the share of the normalized Gram
matrix's 2-D DCT energy in the lowest ``ceil(T/8)`` frequencies (constant term left out; Fig. 3
right).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor

from tfmatcomp.decomposition import Decomposition
from tfmatcomp.geometry.fourier import gram_dct, low_frequency_energy
from tfmatcomp.geometry.models import DecoderGeometry
from tfmatcomp.geometry.similarity import cosine_matrix
from tfmatcomp.geometry.summary import summary_table
from tfmatcomp.models.decoder import HookedDecoder

__all__ = ["positional_profile", "positional_table"]


def positional_profile(decomposition: Decomposition, positions: slice | None = None) -> dict[str, float]:
    """How smooth a positional basis is: ``adjacent_cos`` (mean ``cos(pos_t, pos_{t+1})``) and
    ``low_freq_energy`` (share of the normalized Gram matrix's DCT energy, constant term left out,
    in the lowest ``ceil(T/8)`` frequencies), over ``positions`` (default all).

    Example:
        >>> import math, torch
        >>> from tfmatcomp.decomposition import decompose
        >>> t = torch.arange(32.0)[:, None]
        >>> smooth = torch.cat([torch.cos(math.pi * t / 32), torch.sin(math.pi * t / 32)], 1)
        >>> h = smooth[None] + 0.01 * torch.randn(16, 32, 2, generator=torch.Generator().manual_seed(0))
        >>> p = positional_profile(decompose(h))
        >>> p["adjacent_cos"] > 0.9, p["low_freq_energy"] > 0.9
        (True, True)
    """
    pos = decomposition.pos if positions is None else decomposition.pos[positions]
    T = pos.shape[0]
    if T < 3:
        raise ValueError(f"positions: need at least 3 positions, got {T}")
    cos = cosine_matrix(pos, pos)
    k = max(2, math.ceil(T / 8))
    return {"adjacent_cos": float(cos.diagonal(1).mean()),
            "low_freq_energy": low_frequency_energy(gram_dct(pos), k, include_dc=False)}


@torch.no_grad()
def positional_table(model: HookedDecoder, batches: Sequence[Tensor], *, drop_first: int = 1,
                     halves: bool = False) -> pd.DataFrame:
    """Per layer of the residual stream: Table 1's positional columns (``rank_estimate``,
    ``stable_rank``, ``relative_norm``) and :func:`positional_profile`, with the first
    ``drop_first`` positions dropped (Appendix A.3).

    Args:
        model: the decoder.
        batches: token batches ``[batch, T]`` (e.g. from a task's sampler).
        drop_first: leading positions dropped.
        halves: also the profile of each half of the positions (``*_first_half``,
            ``*_second_half``; Section 5.1's partial randomization changes the second).

    Example:
        >>> import tfmatcomp as tm
        >>> model = tm.HookedDecoder(tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32,
        ...                                           n_ctx=12, d_vocab=10))
        >>> tokens = torch.randint(0, 10, (16, 12), generator=torch.Generator().manual_seed(0))
        >>> positional_table(model, [tokens]).columns.tolist()[:4]
        ['layer', 'rank_estimate', 'stable_rank', 'relative_norm']
    """
    gm = DecoderGeometry(model)
    acc = gm.accumulate(list(batches), drop_first=drop_first, progress=False, total=None)
    stream = [acc.result(k) for k in gm.stream_keys]
    table = summary_table(stream)[["layer", "rank_estimate", "stable_rank", "relative_norm"]]
    rows = []
    for dec in stream:
        row = positional_profile(dec)
        if halves:
            T = dec.pos.shape[0]
            for name, part in (("first_half", slice(0, T // 2)), ("second_half", slice(T // 2, T))):
                row.update({f"{k}_{name}": v for k, v in positional_profile(dec, part).items()})
        rows.append(row)
    return pd.concat([table.reset_index(drop=True), pd.DataFrame(rows)], axis=1)
