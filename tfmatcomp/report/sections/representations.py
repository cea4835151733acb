"""The representation sections: attention heads over training and under structured masks,
embeddings, positional embeddings, probes."""

from __future__ import annotations

import pandas as pd

from tfmatcomp.analyses.embeddings import (
    checkpoint_token_projection,
    positional_embedding_norms,
    positional_embedding_pca,
    positional_similarity,
    token_embedding_norms,
    token_embedding_pca,
)
from tfmatcomp.analyses.heads import analyse_heads, head_score_evolution
from tfmatcomp.analyses.probes import probe_layers
from tfmatcomp.datapath import sample_batch
from tfmatcomp.plotting.embeddings import (
    checkpoint_projection_figure,
    positional_norms_figure,
    positional_pca_figure,
    token_norms_figure,
    token_pca_figure,
)
from tfmatcomp.plotting.heads import (
    attention_grid_figure,
    head_score_evolution_figure,
    head_types_figure,
    structured_mask_pairs_figure,
)
from tfmatcomp.plotting.probes import probe_table_figure
from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections.base import Section, seed_generator
from tfmatcomp.task.masks import column_mask, row_mask


def _attention(ctx: RunContext, s: Section) -> None:
    n = min(ctx.n_samples, 256)
    for step in ctx.steps_around_drop(4):
        a = analyse_heads(ctx.model_at(step), ctx.task, n, generator=seed_generator(ctx))
        s.items.append(attention_grid_figure(a.mean_patterns, table=a.table,
                                             title=f"step {step:,}: mean attention over random masks"))
    post = analyse_heads(ctx.post, ctx.task, n, generator=seed_generator(ctx))
    s.items += [head_types_figure(post.table), post.table]
    rows = ctx.task.n_rows
    observed = row_mask(rows, ctx.task.n_cols, masked_rows=(rows // 2,), keep=(0,))
    structured = analyse_heads(ctx.post, ctx.task, n, observed=observed, generator=seed_generator(ctx))
    s.items.append(attention_grid_figure(structured.mean_patterns, table=structured.table,
                                         observed=observed, n_rows=rows, n_cols=ctx.task.n_cols,
                                         title=f"step {ctx.post_step:,}: structured mask (row "
                                               f"{rows // 2} masked but its first entry)"))
    evolution = head_score_evolution({st: ctx.model_at(st) for st in ctx.checkpoints}, ctx.task,
                                     n_samples=min(n, 128), seed=ctx.seed)
    for score in ("row", "column"):
        s.items.append(head_score_evolution_figure(evolution, score=score))
    s.text = ("Mean attention maps (layers x heads, 1-based labels) at steps around the drop, the "
              "head types assigned from pattern geometry after the shift, a structured row mask, "
              "and row / column scores over training. Paper: unstructured heads before the shift; "
              "row, column and identity heads after it.")


def _embeddings(ctx: RunContext, s: Section) -> None:
    t = ctx.task
    s.items += [
        token_norms_figure(token_embedding_norms(ctx.post)),
        token_pca_figure(token_embedding_pca(ctx.post)),
        positional_pca_figure(positional_embedding_pca(ctx.post, t.n_rows, t.n_cols)),
        checkpoint_projection_figure(checkpoint_token_projection(
            {st: ctx.model_at(st) for st in ctx.steps_around_drop(6)})),
    ]
    s.text = ("Post-shift token embeddings (norm against value, PCA), positional embeddings (PCA, "
              "coloured by row and by column), and token embeddings of earlier checkpoints projected "
              "on the final top-2 components. Paper: norms symmetric about 0, a sign axis and a "
              "magnitude axis, positions clustering by column, and token embeddings reaching their "
              "final layout before the drop.")


def _probes(ctx: RunContext, s: Section) -> None:
    batch = sample_batch(ctx.task, 2 * ctx.n_samples, seed=ctx.seed, device=ctx.post.device)
    for label, model in ctx.models.items():
        table = probe_layers(model, batch, generator=seed_generator(ctx))
        s.items += [probe_table_figure(table, title=f"{label}: linear probes per layer"), table]
    s.text = ("Linear probes (least squares, held-out matrices) from each layer's hidden state of an "
              "element to its masked row, its value (masked and observed entries separately) and the "
              "top singular vector of X. Paper (12-layer model): the masked row is decoded best in "
              "layers 3 and 4; the singular vector is not linearly decodable.")


def _structured_masks(ctx: RunContext, s: Section) -> None:
    t, n = ctx.task, min(ctx.n_samples, 256)
    middle_row, middle_col = t.n_rows // 2, t.n_cols // 2
    row = analyse_heads(ctx.post, t, n, generator=seed_generator(ctx),
                        observed=row_mask(t.n_rows, t.n_cols, masked_rows=(middle_row,), keep=0))
    col = analyse_heads(ctx.post, t, n, generator=seed_generator(ctx),
                        observed=column_mask(t.n_rows, t.n_cols, masked_cols=(middle_col,), keep=0))
    keys = ["layer", "head", "paper_label"]
    scores = ["type", "masked_row", "observed_copy", "mask_ignore"]
    table = row.table[keys + scores].merge(col.table[keys + scores], on=keys,
                                           suffixes=(" (row mask)", " (column mask)"))
    s.items += [structured_mask_pairs_figure(row, col, title=(
        f"step {ctx.post_step:,}: row {middle_row} masked but its first entry (R) / column "
        f"{middle_col} masked but its first entry (C), 0-based; heads 1-based")), table]
    s.text = ("Each head's mean attention (same matrices, one fixed mask each) under a row mask and "
              "under the matching column mask, as pairs. Paper (Sec. 3.2, Figs. 5 and 23): "
              "masked-row heads light up only on the masked line and attend to its one observed "
              "entry, observed-copy heads are near identity maps, mask-ignore heads skip the masked "
              "entries, and longest-contiguous-column heads move with the mask.")


def _positional(ctx: RunContext, s: Section) -> None:
    t = ctx.task
    rows = []
    for label, model in ctx.models.items():
        norms = positional_embedding_norms(model, t.n_rows, t.n_cols)
        s.items.append(positional_norms_figure(norms, title=f"{label}: l2 norm of the positional "
                                               "embedding per position (colour = row)"))
        by = norms.groupby("col")["norm"].mean()
        rows.append({"model": label, "mean norm": norms["norm"].mean(),
                     "min": norms["norm"].min(), "max": norms["norm"].max(),
                     "column-mean spread": by.max() - by.min(),
                     **positional_similarity(model, t.n_rows, t.n_cols)})
    s.items.append(pd.DataFrame(rows))
    s.text = ("The norm of W_pos at every position of the matrix (row-major), before and after the "
              "shift, and the mean cosine similarity of centred positional embeddings within a row, "
              "within a column and otherwise. Paper: positional embeddings cluster by column, and "
              "only after the drop (Fig. 7c, Fig. 10).")
