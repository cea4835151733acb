"""The rows of docs/reproduction.md that the report does not print as numbers, for one run.

Prints, for a run directory or a bundled run name (pre- and post-shift checkpoints as the report
chooses them): the head scan (each head ablated alone: the largest rises of ``L_mask``), the
token-embedding statistics (norm symmetry about 0, PCA sign and magnitude axes), the positional
embeddings (similarity by row and column, norms per row and column), the everything-but-attention
transplant both ways, and the pre-shift head labels. 256 matrices, sampling seed 0, as the report.

    python scripts/reproduction_extras.py paper-4l8h
    python scripts/reproduction_extras.py runs/paper-cpu/seed-0 --pre-step 5000 --post-step 30000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import tfmatcomp as tm
from tfmatcomp.analyses.embeddings import (positional_embedding_norms, positional_similarity,
                                           token_embedding_norms, token_embedding_pca)
from tfmatcomp.analyses.heads import analyse_heads
from tfmatcomp.experiments import head_ablation_scan, weight_transplant
from tfmatcomp.report.run import RunContext, load_context


def _head_scan(ctx: RunContext, n_samples: int, seed: int) -> None:
    for label, model in (("pre-shift", ctx.pre), ("post-shift", ctx.post)):
        scan = head_ablation_scan(model, ctx.task, n_samples=n_samples, seed=seed)
        cells = sorted(((float(scan.loc[layer, head]), layer + 1, head + 1)
                        for layer in scan.index for head in scan.columns), reverse=True)
        top = ", ".join(f"({layer},{head}) {rise:+.4f}" for rise, layer, head in cells[:6])
        print(f"head scan, {label} (baseline L_mask {scan.attrs['baseline']:.4f}): largest rises "
              f"{top}; largest |change| {max(abs(c[0]) for c in cells):.2e}")


def _embeddings(ctx: RunContext) -> None:
    for label, model in (("pre-shift", ctx.pre), ("post-shift", ctx.post)):
        norms = token_embedding_norms(model)
        by_value = dict(zip(norms["value"].round(6), norms["norm"]))
        pos = sorted(v for v in by_value if v > 0 and -v in by_value)
        a = np.array([by_value[v] for v in pos])
        b = np.array([by_value[-v] for v in pos])
        corr = float(np.corrcoef(a, b)[0, 1])
        rel = float(np.mean(np.abs(a - b)) / np.mean(np.r_[a, b]))
        r_mag = float(np.corrcoef(np.abs(norms["value"]), norms["norm"])[0, 1])
        pca = token_embedding_pca(model).correlations
        axes = "; ".join(f"PC{int(r.pc)} sign r {r.corr_sign:+.2f}, magnitude r "
                         f"{r.corr_magnitude:+.2f}, {r.explained_variance_ratio:.0%} of variance"
                         for r in pca.itertuples())
        sim = positional_similarity(model, ctx.task.n_rows, ctx.task.n_cols)
        pn = positional_embedding_norms(model, ctx.task.n_rows, ctx.task.n_cols)
        rows = pn.groupby("row")["norm"].mean().round(3).tolist()
        cols = pn.groupby("col")["norm"].mean().round(3).tolist()
        print(f"embeddings, {label}: norms of v and -v corr {corr:.2f}, mean difference "
              f"{rel:.1%} of the norm, corr(norm, |v|) {r_mag:+.2f}; {axes}")
        print(f"  positional: same row {sim['same_row']:+.2f}, same column {sim['same_col']:+.2f}, "
              f"other {sim['other']:+.2f}; norm {pn['norm'].min():.3f}-{pn['norm'].max():.3f}, "
              f"mean by row {rows}, by column {cols}")


def _transplant(ctx: RunContext, n_samples: int, seed: int) -> None:
    df = weight_transplant(ctx.pre, ctx.post, ctx.task, params="all_but_attn",
                           n_samples=n_samples, seed=seed)
    for r in df[df["donor"] != "none"].itertuples():
        print(f"transplant all_but_attn: {r.recipient} with the {r.donor} rest: "
              f"L_mask {r.L_mask:.4f}, L_obs {r.L_obs:.2e}")


def _pre_heads(ctx: RunContext, n_samples: int, seed: int) -> None:
    heads = analyse_heads(ctx.pre, ctx.task, n_samples,
                          generator=torch.Generator().manual_seed(seed)).table
    kinds = heads["type"].value_counts().to_dict()
    print(f"pre-shift head labels {kinds}; row mass {heads['row'].min():.3f}-{heads['row'].max():.3f}, "
          f"column mass {heads['column'].min():.3f}-{heads['column'].max():.3f}, identity at most "
          f"{heads['identity'].max():.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="run directory or bundled run name")
    p.add_argument("--pre-step", type=int)
    p.add_argument("--post-step", type=int)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    t0 = time.perf_counter()
    ctx = load_context(args.run, pre_step=args.pre_step, post_step=args.post_step,
                       n_samples=args.samples, seed=args.seed)
    print(f"{args.run}: pre-shift step {ctx.pre_step}, post-shift step {ctx.post_step}")
    _embeddings(ctx)
    _transplant(ctx, args.samples, args.seed)
    _pre_heads(ctx, args.samples, args.seed)
    _head_scan(ctx, args.samples, args.seed)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
