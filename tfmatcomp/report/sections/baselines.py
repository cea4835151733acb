"""The baseline sections: nuclear-norm minimization and out-of-distribution inputs."""

from __future__ import annotations

from tfmatcomp.analyses.baselines import compare_with_model, lambda_table, PAPER_LAMBDA_TABLE
from tfmatcomp.analyses.ood import evaluate_ood
from tfmatcomp.experiments import reference as paper
from tfmatcomp.plotting.baselines import (
    lambda_table_figure,
    model_vs_nuclear_norm_figure,
    ood_figure,
)
from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections.base import Section, num


def _nuclear_norm(ctx: RunContext, s: Section) -> None:
    comparison = compare_with_model(ctx.post, task=ctx.task, n_samples=ctx.n_samples, seed=ctx.seed)
    lambdas = lambda_table(task=ctx.task, model=ctx.post, n_samples=ctx.n_samples, seed=ctx.seed)
    s.items += [model_vs_nuclear_norm_figure(comparison), comparison,
                lambda_table_figure(lambdas), lambdas]
    masks = [v[1] for v in PAPER_LAMBDA_TABLE.values()]
    totals = [v[2] for v in PAPER_LAMBDA_TABLE.values()]
    lams = list(PAPER_LAMBDA_TABLE)
    s.text = ("The post-shift model against nuclear-norm minimization on the same matrices, across "
              f"p_mask, and the regularized solver across lambda. Paper (7x7 rank 2): nuclear norm "
              f"L_mask {num(min(masks))}-{num(max(masks))} and L {num(min(totals))}-{num(max(totals))} "
              f"for lambda {num(min(lams))}..{num(max(lams))}; BERT beats it (L_mask "
              f"{num(paper.PAPER_TRAINING['final_L_mask'])}).")


def _ood(ctx: RunContext, s: Section) -> None:
    table = evaluate_ood(ctx.post, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed)
    s.items += [ood_figure(table), table]
    rows = table[(table["method"] == "model") & (table["group"] == "distribution")]
    bound = table["train_max_abs"].iloc[0]
    laws = "; ".join(f"{r['value']}: {100 * r['frac_outside_train_range']:.1f}% outside, L_mask "
                     f"{num(r['L_mask'])}" for _, r in rows.iterrows()) or "no other law was tried"
    train = table[(table["method"] == "model") & (table["group"] == "in_distribution")].iloc[0]
    s.text = ("The post-shift model on inputs it was not trained on (other laws of the factors' "
              "entries, other ranks and shapes, full-rank matrices), next to nuclear-norm "
              "minimization on the same inputs. Gaussian N(0, 1) and Laplace(0, 1) factors have "
              "three and six times the variance of the training Uniform[-1, 1] factors, so many of "
              "their entries lie beyond the largest value seen in training "
              f"(|entry| <= {num(bound)} for this task), tokens the model never saw; the *_matched "
              "laws have the same shapes scaled to the training variance (factor variance 1/3), "
              "which separates another law from unseen values. Column frac_outside_train_range "
              f"gives the share of entries beyond the training range. Here (training L_mask "
              f"{num(train['L_mask'])}): {laws}. Paper: the model degrades gracefully on nearby "
              "distributions.")
