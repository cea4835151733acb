"""The position / context decomposition section (Song & Zhong's measurements on the run)."""

from __future__ import annotations

import dataclasses

import pandas as pd

from tfmatcomp.datapath import sample_batch
from tfmatcomp.decomposition import accumulate, residual_pass, residual_stream_names
from tfmatcomp.geometry import model_summary_table, qk_decomposition, row_column_r2
from tfmatcomp.plotting.decomposition import gram_figure, pos_pca_figure, qk_figure, spectrum_figure
from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections.base import Section, seed_generator


def _decomposition(ctx: RunContext, s: Section) -> None:
    t = ctx.task
    gen = seed_generator(ctx)
    batches = [sample_batch(t, 256, generator=gen, device=ctx.post.device).tokens
               for _ in range(max(1, (8 * ctx.n_samples) // 256))]
    for label, model in ctx.models.items():
        table = model_summary_table(model, batches)   # progress None: moves the report's bar
        table.insert(0, "model", label)
        s.items.append(table)
    names = residual_stream_names(ctx.post)
    acc = accumulate(ctx.post, batches, names)
    results = acc.results()
    residuals = residual_pass(ctx.post, acc, batches[0][:64], names)
    shares = pd.DataFrame([{"residual stream": name, **dataclasses.asdict(row_column_r2(
        res.pos, t.n_rows, t.n_cols))} for name, res in results.items()])
    last = names[-2] if len(names) > 1 else names[0]
    qk = qk_decomposition(ctx.post, batches[0][:8], len(names) - 2, results[last], heads=0)
    s.items += [shares, pos_pca_figure(results, n_rows=t.n_rows, n_cols=t.n_cols),
                gram_figure(results[last]), spectrum_figure(residuals[last]), qk_figure(qk, head=0)]
    s.text = ("Hidden states h = mu + pos + ctx + resid (Song and Zhong) at each residual stream of "
              "the pre- and post-shift models: ScreeNOT rank, stable rank and relative norm of pos, "
              "incoherence of pos and ctx; the share of pos explained by row and by column means of "
              "the matrix grid; PCA of pos with context vectors; the normalized Gram matrix; singular "
              "values and DCT; and the four QK score components of one head. Their BERT-base result: "
              "a low-rank, smooth positional basis (ScreeNOT ranks 9-18 per layer) nearly orthogonal "
              "to the context basis.")
