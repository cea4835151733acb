"""The causal-experiment sections: copying, ablations, transplant, permutation, patching, head
groups, the per-head scan."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from tfmatcomp.analyses.heads import label_group_ablation, LABEL_GROUPS
from tfmatcomp.experiments import reference as paper
from tfmatcomp.experiments import (
    activation_patching,
    attention_ablation,
    copying_check,
    head_ablation_scan,
    head_group_ablation,
    permutation_summary,
    positional_permutation,
    weight_transplant,
)
from tfmatcomp.plotting.experiments import (
    head_scan_heatmap,
    loss_bars_figure,
    patching_figure,
    patching_head_heatmap,
)
from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections.base import Section, num


def _copying(ctx: RunContext, s: Section) -> None:
    s.items.append(copying_check(ctx.models, ctx.task, n_samples=2 * ctx.n_samples, seed=ctx.seed))
    values = paper.PAPER_COPYING["low-rank"]
    m_values = [k for k in values if k != "MASK"]
    s.text = ("MASK tokens replaced by the token of a value m: a copying model outputs m at masked "
              "entries, so L'_mask (MSE to m) is small. Paper, pre-shift: L'_mask "
              + ", ".join(f"{num(values[k]['L_mask_prime'])} for m = {k}" for k in ["MASK", *m_values])
              + ", on rank-2 and on full-rank random matrices alike.")


def _ablation(ctx: RunContext, s: Section) -> None:
    s.items.append(attention_ablation(ctx.models, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed))
    pre, post = paper.PAPER_ABLATION_ALL[paper.PRE], paper.PAPER_ABLATION_ALL[paper.POST]
    s.text = ("Uniform ablation of every head (softmax probabilities set to 1/n^2). Paper: pre-shift "
              f"L_mask {num(pre['baseline']['L_mask'])} -> {num(pre['ablated']['L_mask'])} (attention "
              f"is irrelevant while copying); post-shift L_obs {num(post['baseline']['L_obs'])} -> "
              f"{num(post['ablated']['L_obs'])} and L_mask {num(post['baseline']['L_mask'])} -> "
              f"{num(post['ablated']['L_mask'])} (back to the plateau).")


def _transplant(ctx: RunContext, s: Section) -> None:
    # checkpoint paths, so that the table's intervention column names the donor by path and step
    s.items.append(weight_transplant(ctx.checkpoints[ctx.pre_step], ctx.checkpoints[ctx.post_step],
                                     ctx.task, n_samples=ctx.n_samples, seed=ctx.seed))
    t = paper.PAPER_TRANSPLANT
    s.text = ("Query, key and value weights and biases of every layer swapped between the pre- and "
              "post-shift checkpoints. Paper: pre-shift with post-shift Q/K/V keeps L_mask at "
              f"{num(t[(paper.PRE, paper.POST)]['L_mask'])}; post-shift with pre-shift Q/K/V gives "
              f"L_obs {num(t[(paper.POST, paper.PRE)]['L_obs'])}.")


#: How many random permutations the ``permutation`` section runs per model (seeds seed .. seed + k - 1).
PERMUTATIONS = 5


def _permutation(ctx: RunContext, s: Section) -> None:
    table = positional_permutation(ctx.models, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed,
                                   n_permutations=PERMUTATIONS)
    summary = permutation_summary(table)
    shown = table.assign(permutation=["baseline" if c == "baseline" else f"seed {k}" for c, k in
                                      zip(table["condition"], table["permutation_seed"])])
    s.items += [loss_bars_figure(shown, x="permutation", metric="L_mask",
                                 title=f"L_mask with {PERMUTATIONS} random positional permutations"),
                summary, table]
    v = paper.PAPER_PERMUTATION[paper.POST]
    ours = "; ".join(
        f"{r['model']}: L_mask {num(r['L_mask_baseline'])} unpermuted, {num(r['L_mask_mean'])} on average "
        f"(std {num(r['L_mask_std'])}, {num(r['L_mask_min'])}-{num(r['L_mask_max'])}), L_obs "
        f"{num(r['L_obs_baseline'])} -> {num(r['L_obs_mean'])} ({num(r['L_obs_min'])}-{num(r['L_obs_max'])})"
        for _, r in summary.iterrows())
    s.text = (f"Positional embeddings randomly permuted (position i is represented as pi(i)), "
              f"{PERMUTATIONS} permutations (seeds {ctx.seed}..{ctx.seed + PERMUTATIONS - 1}) on the "
              "same matrices; one permutation is one draw, so the table gives the mean, standard "
              f"deviation, min and max over them. Copying needs no position; completion does. Here: "
              f"{ours}. Paper, post-shift (one permutation): L_obs {num(v['L_obs'])}, "
              f"L_mask {num(v['L_mask'])}.")


def _patching(ctx: RunContext, s: Section) -> None:
    table = activation_patching({"post-shift": ctx.post}, ctx.task, n_samples=ctx.n_samples,
                                seed=ctx.seed, per_head=True)
    per_head = table["head"].notna()
    s.items += [patching_figure(table), patching_head_heatmap(table), table[~per_head]]
    heads = table[per_head & (table["entries"] == "masked")]
    s.items.append(heads.pivot_table(index="layer", columns="head", values="mse_to_X",
                                     aggfunc="first").rename_axis(columns=None).reset_index()
                   .rename(columns=lambda c: c if c == "layer" else f"head {c}"))
    v = paper.PAPER_PATCHING["masked"]
    t = table[table["entries"] == "masked"].set_index("patched")
    none, every = t.loc["none"], t.loc["all"]
    layers = table[(table["entries"] == "masked") & table["layer"].notna() & table["head"].isna()]
    best = heads.loc[heads["mse_to_X"].idxmin()] if len(heads) else None
    s.text = ("Attention outputs (hook_z) recorded on X are written into the run on -X with the same "
              "mask: all layers together, each layer alone, and each head alone (layers and heads "
              "0-based in the tables, 1-based in the heatmap). The all-layers row at masked entries "
              "is true by construction (column by_construction): at masked positions the X and -X "
              "runs read the same input (MASK at the same position), and attention is the only "
              "place positions mix, so writing every head's output from X reproduces f(X) there for "
              "any model, trained or not. It shows nothing about this model; only the per-layer "
              "and per-head rows do: which part of the attention alone carries the completion. "
              f"Here, at masked entries: unpatched MSE(f_p, X) {num(none['mse_to_X'])}, MSE(f_p, -X) "
              f"{num(none['mse_to_neg_X'])}; all layers {num(every['mse_to_X'])} / "
              f"{num(every['mse_to_neg_X'])} (= the model's own L_mask on X); "
              + ", ".join(f"layer {int(r['layer'])} alone {num(r['mse_to_X'])} / {num(r['mse_to_neg_X'])}"
                          for _, r in layers.iterrows())
              + (f"; the head that moves f_p furthest towards X alone is ({int(best['layer'])}, "
                 f"{int(best['head'])}) (0-based), MSE(f_p, X) {num(best['mse_to_X'])}"
                 if best is not None else "")
              + f". Paper, all layers patched (true by construction as here): MSE(f_p, X) about "
              f"{num(v['mse_to_X'])} and MSE(f_p, -X) about {num(v['mse_to_neg_X'])} at masked "
              "entries; the papers give no per-layer or per-head values.")


def _head_groups(ctx: RunContext, s: Section) -> None:
    cfg = ctx.post.cfg
    paper_shape = cfg.n_layers >= 4 and cfg.n_heads >= 8
    own = label_group_ablation({"post-shift": ctx.post}, ctx.task, n_samples=ctx.n_samples,
                               seed=ctx.seed)
    fixed = head_group_ablation({"post-shift": ctx.post}, ctx.task,
                                groups="paper" if paper_shape else "layers",
                                n_samples=ctx.n_samples, seed=ctx.seed)
    s.items.append(pd.concat([own, fixed], ignore_index=True))
    v = paper.PAPER_HEAD_GROUP_VALUES["uninterpretable"]

    def said(name: str, what: str) -> str:
        r = own[own["group"] == name].iloc[0]
        if not r["heads"]:
            return f"no head is labelled {what} in this model, so that group is empty"
        kinds = Counter(part.rsplit(" ", 1)[-1] for part in r["head_types"].split("; "))
        return (f"the heads labelled {what}, {r['heads_paper']} ("
                + ", ".join(f"{n} {k}" for k, n in kinds.most_common())
                + f"), ablated together move L_mask from {num(r['L_mask_without'])} to "
                f"{num(r['L_mask_with'])} ({num(r['ratio_L_mask'])}x) and L_obs from "
                f"{num(r['L_obs_without'])} to {num(r['L_obs_with'])}")

    s.text = ("Groups of heads ablated together (uniform attention), with the ratio to the unablated "
              "loss. First the workshop paper's test in this model's own terms: each post-shift "
              "head is labelled from its mean attention on the same matrices (as in the attention "
              "section; 1-based labels, each head's label in column head_types), and "
              f"{said(LABEL_GROUPS[0], 'neither row, column nor identity')}; "
              f"{said(LABEL_GROUPS[1], 'row or column')}. "
              f"Paper (4L8H): ablating its uninterpretable heads "
              f"{paper.PAPER_HEAD_GROUPS['uninterpretable']} moves L_mask only from "
              f"{num(v['L_mask_without'])} to {num(v['L_mask_with'])}. "
              + ("The papers' own groups (by their 4L8H labels) follow." if paper_shape else
                 "This model is smaller than the papers', so instead of their groups each layer's "
                 "heads form a group."))


def _head_scan(ctx: RunContext, s: Section) -> None:
    for label, model in ctx.models.items():
        scan = head_ablation_scan(model, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed)
        s.items.append(head_scan_heatmap(scan, title=f"{label}: change in L_mask when one head is "
                                                     "ablated (layers x heads, 1-based labels)"))
    s.text = ("Every head ablated alone; the cell is the change in L_mask. Before the shift no head "
              "matters; after it a few heads carry the completion. Each cell ran "
              "UniformAttentionAblation([(layer, head)]) (0-based); head_ablation_scan(...)"
              ".attrs['interventions'] holds each cell's JSON.")
