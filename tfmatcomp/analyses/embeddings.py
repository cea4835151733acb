"""Token and positional embeddings: norms, PCA, and their evolution across checkpoints.

The workshop paper Section 4 / Appendix F and the NeurIPS paper Section 3.3 / Appendix C look at:

* the l2 norm of the token embeddings of the values -1.5..1.5 (symmetric about 0 post-shift);
* the PCA of the token embeddings (one axis follows the sign of the value, the other its magnitude);
* the l2 norm of the positional embeddings per position, and a 2-D projection of them coloured by
  row and column (the papers use t-SNE; we use PCA, which is deterministic and needs no extra
  dependency, plus a same-row / same-column cosine-similarity summary);
* the projection of the token embeddings of intermediate checkpoints onto the top-2 principal
  components of the final checkpoint's token embeddings (the workshop paper Fig. 7).

Conventions: "token embedding" means the raw row of ``W_E`` (before the embedding LayerNorm and
without the positional embedding); "positional embedding" the raw row of ``W_pos``. Token ids always
come from :class:`~tfmatcomp.ValueTokenizer` ``.encode``. PCA centres the vectors and fixes the sign
of each component so that its largest-magnitude loading is positive.

Example:
    >>> from tfmatcomp import HookedEncoder, EncoderConfig
    >>> from tfmatcomp.analyses.embeddings import token_embedding_norms
    >>> model = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
    >>> df = token_embedding_norms(model, v_min=-0.02, v_max=0.02)
    >>> df["value"].tolist()
    [-0.02, -0.01, 0.0, 0.01, 0.02]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tfmatcomp.datapath import load_checkpoints
from tfmatcomp.geometry.pca import PCAResult, pca
from tfmatcomp.task.tokenizer import ValueTokenizer
from tfmatcomp.validation import check_positive_int

__all__ = [
    "PCAResult",
    "pca",
    "value_grid",
    "token_embeddings",
    "token_embedding_norms",
    "TokenEmbeddingPCA",
    "token_embedding_pca",
    "positional_embedding_norms",
    "PositionalPCA",
    "positional_embedding_pca",
    "positional_similarity",
    "checkpoint_token_projection",
]


# ----------------------------------------------------------------------- token embeddings
def value_grid(v_min: float = -1.5, v_max: float = 1.5,
               tokenizer: ValueTokenizer | None = None) -> Float[Tensor, "n_values"]:
    """Every value of the tokenizer's grid in ``[v_min, v_max]`` (float64, ascending).

    Example:
        >>> value_grid(-0.01, 0.01).tolist()
        [-0.01, 0.0, 0.01]
    """
    tok = tokenizer or ValueTokenizer()
    if not (tok.v_min <= v_min <= v_max <= tok.v_max):
        raise ValueError(f"v_min, v_max: need {tok.v_min} <= v_min <= v_max <= {tok.v_max}, got "
                         f"{v_min!r}, {v_max!r}")
    lo = int(np.ceil(round(v_min * tok.scale, 6)))
    hi = int(np.floor(round(v_max * tok.scale, 6)))
    return torch.arange(lo, hi + 1, dtype=torch.float64) / tok.scale


def _values_and_ids(model, values, v_min, v_max, tokenizer):
    tok = tokenizer or ValueTokenizer()
    if tok.vocab_size != model.cfg.d_vocab:
        raise ValueError(f"tokenizer: vocabulary size {tok.vocab_size} does not match the model's "
                         f"d_vocab {model.cfg.d_vocab}")
    vals = value_grid(v_min, v_max, tok) if values is None else torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    vals = tok.round(vals)
    ids = tok.encode(vals)
    return vals, ids


def token_embeddings(model, values: Tensor | Sequence[float] | None = None, *, v_min: float = -1.5,
                     v_max: float = 1.5, tokenizer: ValueTokenizer | None = None
                     ) -> tuple[Float[Tensor, "n"], Float[Tensor, "n d_model"]]:
    """``(values, W_E[encode(values)])``: raw token embeddings of values (default: the grid
    ``v_min..v_max``), detached, on the model's device.

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> v, e = token_embeddings(m, [0.0, 0.5])
        >>> e.shape
        torch.Size([2, 8])
    """
    vals, ids = _values_and_ids(model, values, v_min, v_max, tokenizer)
    return vals, model.W_E.detach()[ids.to(model.W_E.device)]


def token_embedding_norms(model, values: Tensor | Sequence[float] | None = None, *,
                          v_min: float = -1.5, v_max: float = 1.5,
                          tokenizer: ValueTokenizer | None = None) -> pd.DataFrame:
    """l2 norm of the token embedding of each value: columns ``value``, ``token_id``, ``norm``.

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> token_embedding_norms(m, [0.0])["token_id"].tolist()
        [1001]
    """
    vals, ids = _values_and_ids(model, values, v_min, v_max, tokenizer)
    emb = model.W_E.detach()[ids.to(model.W_E.device)].to(torch.float64)
    return pd.DataFrame({"value": vals.numpy().round(6), "token_id": ids.numpy(),
                         "norm": emb.norm(dim=-1).cpu().numpy()})


@dataclass(frozen=True)
class TokenEmbeddingPCA:
    """PCA of token embeddings, with the axes that follow sign and magnitude.

    Attributes:
        table: one row per value: ``value``, ``token_id``, ``pc1``, ``pc2``, ... (1-based PC names).
        pca: the :class:`PCAResult`.
        correlations: one row per component ``pc``: Pearson correlation of its scores with
            ``sign(value)`` (``corr_sign``) and with ``|value|`` (``corr_magnitude``).
        sign_axis, magnitude_axis: 0-based index of the component most correlated (in absolute
            value) with the sign / magnitude; the papers report magnitude on PC1 (x) and sign on PC2
            (y) post-shift.
    """

    table: pd.DataFrame
    pca: PCAResult
    correlations: pd.DataFrame
    sign_axis: int
    magnitude_axis: int


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    d = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / d) if d > 0 else float("nan")


def token_embedding_pca(model, values: Tensor | Sequence[float] | None = None, *,
                        n_components: int = 2, v_min: float = -1.5, v_max: float = 1.5,
                        tokenizer: ValueTokenizer | None = None) -> TokenEmbeddingPCA:
    """PCA of the token embeddings of ``values`` (default the grid -1.5..1.5) and which component
    correlates with the sign and which with the magnitude of the value.

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> r = token_embedding_pca(m, v_min=-0.5, v_max=0.5)
        >>> list(r.table.columns), r.sign_axis in (0, 1)
        (['value', 'token_id', 'pc1', 'pc2'], True)
    """
    vals, ids = _values_and_ids(model, values, v_min, v_max, tokenizer)
    emb = model.W_E.detach()[ids.to(model.W_E.device)]
    res = pca(emb, n_components)
    scores = res.scores.cpu().numpy()
    v = vals.numpy()
    table = pd.DataFrame({"value": v.round(6), "token_id": ids.numpy()})
    corr_rows = []
    for k in range(n_components):
        table[f"pc{k + 1}"] = scores[:, k]
        corr_rows.append({"pc": k + 1, "corr_sign": _corr(scores[:, k], np.sign(v)),
                          "corr_magnitude": _corr(scores[:, k], np.abs(v)),
                          "explained_variance_ratio": float(res.explained_variance_ratio[k])})
    corr = pd.DataFrame(corr_rows)
    sign_axis = int(np.nanargmax(np.abs(corr["corr_sign"].fillna(0).to_numpy())))
    mag_axis = int(np.nanargmax(np.abs(corr["corr_magnitude"].fillna(0).to_numpy())))
    return TokenEmbeddingPCA(table=table, pca=res, correlations=corr, sign_axis=sign_axis,
                             magnitude_axis=mag_axis)


# ------------------------------------------------------------------ positional embeddings
def _grid_positions(model, n_rows: int, n_cols: int | None):
    n_cols = n_rows if n_cols is None else n_cols
    check_positive_int("n_rows", n_rows)
    check_positive_int("n_cols", n_cols)
    if n_rows * n_cols > model.cfg.n_ctx:
        raise ValueError(f"n_rows, n_cols: {n_rows}x{n_cols} = {n_rows * n_cols} positions exceed the "
                         f"model's n_ctx {model.cfg.n_ctx}")
    k = np.arange(n_rows * n_cols)
    return n_cols, k, k // n_cols, k % n_cols


def positional_embedding_norms(model, n_rows: int, n_cols: int | None = None) -> pd.DataFrame:
    """l2 norm of ``W_pos`` per position: columns ``position`` (0-based), ``row``, ``col``, ``norm``.

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> positional_embedding_norms(m, 2)[["position", "row", "col"]].values.tolist()
        [[0, 0, 0], [1, 0, 1], [2, 1, 0], [3, 1, 1]]
    """
    n_cols, k, rows, cols = _grid_positions(model, n_rows, n_cols)
    norms = model.W_pos.detach()[: len(k)].to(torch.float64).norm(dim=-1).cpu().numpy()
    return pd.DataFrame({"position": k, "row": rows, "col": cols, "norm": norms})


def positional_similarity(model, n_rows: int, n_cols: int | None = None) -> dict[str, float]:
    """Mean cosine similarity between centred positional embeddings of distinct positions in the
    same row, in the same column, and in neither (a numeric version of "positions of a column
    cluster together").

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=9))
        >>> sorted(positional_similarity(m, 3))
        ['other', 'same_col', 'same_row']
    """
    n_cols, k, rows, cols = _grid_positions(model, n_rows, n_cols)
    w = model.W_pos.detach()[: len(k)].to(torch.float64)
    w = w - w.mean(0)
    w = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    cos = (w @ w.T).cpu().numpy()
    same_row = rows[:, None] == rows[None, :]
    same_col = cols[:, None] == cols[None, :]
    off = ~np.eye(len(k), dtype=bool)
    out = {}
    for name, sel in (("same_row", same_row & off), ("same_col", same_col & off),
                      ("other", ~same_row & ~same_col)):
        out[name] = float(cos[sel].mean()) if sel.any() else float("nan")
    return out


@dataclass(frozen=True)
class PositionalPCA:
    """PCA of the positional embeddings of an ``n_rows x n_cols`` grid.

    Attributes:
        table: ``position``, ``row``, ``col`` (0-based), ``pc1``, ``pc2``, ...
        pca: the :class:`PCAResult`.
        similarity: :func:`positional_similarity` of the same embeddings.
    """

    table: pd.DataFrame
    pca: PCAResult
    similarity: dict[str, float]


def positional_embedding_pca(model, n_rows: int, n_cols: int | None = None,
                             n_components: int = 2) -> PositionalPCA:
    """2-D (or ``n_components``-D) PCA of the positional embeddings, for plots coloured by row / column.

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=9))
        >>> positional_embedding_pca(m, 3).table.shape
        (9, 5)
    """
    n_cols, k, rows, cols = _grid_positions(model, n_rows, n_cols)
    res = pca(model.W_pos.detach()[: len(k)], n_components)
    table = pd.DataFrame({"position": k, "row": rows, "col": cols})
    scores = res.scores.cpu().numpy()
    for c in range(n_components):
        table[f"pc{c + 1}"] = scores[:, c]
    return PositionalPCA(table=table, pca=res, similarity=positional_similarity(model, n_rows, n_cols))


# --------------------------------------------------------------------------- checkpoints
def checkpoint_token_projection(checkpoints, values: Tensor | Sequence[float] | None = None, *,
                                final_step: int | None = None, n_components: int = 2,
                                v_min: float = -1.5, v_max: float = 1.5,
                                tokenizer: ValueTokenizer | None = None) -> pd.DataFrame:
    """Token embeddings of every checkpoint projected on the final checkpoint's top principal
    components (the workshop paper Fig. 7; after Liu et al.'s grokking analysis).

    The final checkpoint (largest step unless ``final_step`` is given) defines the centre and the
    components; every checkpoint's embeddings are centred with that same centre.

    Args:
        checkpoints: ``{step: HookedEncoder | path}``, a list of checkpoint paths, or a run
            directory (see :func:`tfmatcomp.datapath.load_checkpoints`).
        values: values whose embeddings are projected (default the grid ``v_min..v_max``).

    Returns:
        DataFrame: ``step``, ``value``, ``token_id``, ``pc1``, ``pc2``, ... and
        ``distance_to_final`` (per step, ``||P_step - P_final||_F / ||P_final||_F`` over all values,
        repeated on each row of the step; 0 at the final step).

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> cfg = EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4)
        >>> df = checkpoint_token_projection({0: HookedEncoder(cfg, seed=1), 100: HookedEncoder(cfg)},
        ...                                  v_min=-0.1, v_max=0.1)
        >>> sorted(df["step"].unique().tolist()), float(df[df.step == 100]["distance_to_final"].iloc[0])
        ([0, 100], 0.0)
    """
    models = load_checkpoints(checkpoints)
    final = max(models) if final_step is None else int(final_step)
    if final not in models:
        raise ValueError(f"final_step: {final} is not among the checkpoint steps {list(models)}")
    vals, emb_final = token_embeddings(models[final], values, v_min=v_min, v_max=v_max, tokenizer=tokenizer)
    ref = pca(emb_final, n_components)
    final_proj = ref.scores
    frames = []
    for step, model in models.items():
        _, emb = token_embeddings(model, vals, tokenizer=tokenizer)
        proj = ref.project(emb.to(ref.components.device))
        dist = ((proj - final_proj).norm() / final_proj.norm().clamp_min(1e-300)).item()
        df = pd.DataFrame({"step": step, "value": vals.numpy().round(6),
                           "token_id": (tokenizer or ValueTokenizer()).encode(vals).numpy()})
        p = proj.cpu().numpy()
        for c in range(n_components):
            df[f"pc{c + 1}"] = p[:, c]
        df["distance_to_final"] = dist
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
