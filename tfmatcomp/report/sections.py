"""The report's sections: each calls the library's analyses on a :class:`~.run.RunContext` and says,
in one paragraph, what it shows, with the papers' values (from :mod:`tfmatcomp.experiments.reference`
and :data:`tfmatcomp.analyses.baselines.PAPER_LAMBDA_TABLE`) beside ours.

A section function takes ``(ctx, section)`` and fills ``section.items`` (plotly figures and
DataFrames) and ``section.text``; :data:`SECTIONS` maps each key to its title and function.

Example:
    >>> from tfmatcomp.report.sections import DEFAULT_SECTIONS, OPT_IN_SECTIONS, SECTIONS
    >>> list(SECTIONS)[:3], DEFAULT_SECTIONS[:3], OPT_IN_SECTIONS
    (['training', 'before_drop', 'llc'], ('training', 'before_drop', 'components'), ('llc',))
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

from tfmatcomp.experiments import reference as paper
from tfmatcomp.report.run import RunContext
from tfmatcomp.runs.layout import METRICS_FILE

__all__ = ["Section", "SECTIONS", "OPT_IN_SECTIONS", "DEFAULT_SECTIONS"]


@dataclass
class Section:
    """One report section: a title, a paragraph saying what it shows, and its figures / tables."""

    key: str
    title: str
    text: str = ""
    items: list[Any] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


def _g(x: float) -> str:
    """A number as the prose writes it (3 significant digits; 'n/a' for None / NaN)."""
    return f"{x:.3g}" if isinstance(x, (int, float)) and x == x else "n/a"


def _generator(ctx: RunContext) -> torch.Generator:
    return torch.Generator().manual_seed(ctx.seed)


# ------------------------------------------------------------------------------ training
def _training_text(ctx: RunContext) -> str:
    p = paper.PAPER_TRAINING
    papers = (f"Paper (4L8H, 7x7 rank 2): L_mask sits near {_g(p['plateau_L_mask'])}, drops near step "
              f"{p['drop_step']:,} and ends near {_g(p['final_L_mask'])} (total MSE about "
              f"{_g(p['final_L'])}), a fall of {p['plateau_L_mask'] / p['final_L_mask']:.0f}x.")
    d = ctx.drop
    if ctx.has_drop:
        ours = (f"Here L_mask sits at {_g(d.plateau_level)} on the plateau, leaves it at step "
                f"{d.drop_start:,.0f} and reaches {_g(d.final_level)} by step {d.drop_end:,.0f} "
                f"(a fall of {d.drop_factor:.1f}x). The dashed line marks the drop's mid-point and "
                "the shaded band its onset-to-end extent.")
    else:
        ours = (f"No sudden drop was detected in this run: {d.reason.removeprefix('no drop: ')}. "
                f"L_mask went from {_g(d.plateau_level)} to {_g(d.final_level)}. The model may "
                "still be on its plateau (the plateau's length varies from seed to seed): train it "
                f"longer (tfmatcomp train --out {ctx.run_dir} --resume --steps N with a larger N), "
                "or train several seeds at once (tfmatcomp train --seeds 0-7, or tfmatcomp demo) "
                "and report on one that dropped. The pre- and post-shift comparisons below are "
                "then two points of the same phase and do not show the shift.")
    return ("L_obs falls to near zero within the first few hundred steps (the model copies its "
            "input) while L_mask stays on a plateau near the mean square of the masked entries, "
            f"then drops suddenly. {papers} {ours}")


def _group_text(ctx: RunContext) -> str:
    g = ctx.group
    table = g.table()
    dropped = table[table["has_drop"]]
    n, k = len(table), len(dropped)
    if not k:
        return (f"None of the {n} seeds of this run dropped within its {int(table['last_step'].max()):,} "
                "steps: train them longer.")
    typical = g.typical_seed()
    # of an even count the median lies between two onsets; typical_seed takes the earlier one
    even = " (of an even count, the earlier of the two middle ones)" if k % 2 == 0 else ""
    if ctx.run_seed == typical:
        which = (f"This report analyses seed {ctx.run_seed}, the seed whose onset is the median of "
                 f"those that dropped{even}.")
    elif ctx.run_seed in g.dropped:
        which = (f"This report analyses seed {ctx.run_seed} (onset "
                 f"{g.drops[ctx.run_seed].drop_start:,.0f}); the seed whose onset is the median of "
                 f"those that dropped is seed {typical}{even}.")
    else:
        which = f"This report analyses seed {ctx.run_seed}."
    return (f"{k} of {n} seeds dropped; their onsets range from step {dropped['onset'].min():,.0f} "
            f"to {dropped['onset'].max():,.0f} (median {dropped['onset'].median():,.0f}), with a "
            f"median fall of {dropped['fall_factor'].median():.1f}x. The papers, too, see the "
            f"plateau's length vary with the seed. {which}")


def _training(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.plotting.dynamics import drop_steps_figure, loss_curve_figure, seed_curves_figure

    if ctx.metrics is None or ctx.drop is None:
        s.text = "This run has no (or too short a) metrics.jsonl, so there is no loss curve to show."
        return
    s.items += [loss_curve_figure(ctx.metrics, drop=ctx.drop), pd.DataFrame([ctx.drop.as_dict()])]
    s.text = _training_text(ctx)
    if ctx.group is not None and len(ctx.group.seeds) > 1:
        s.items += [seed_curves_figure(ctx.group.metrics, ctx.group.drops, highlight=ctx.run_seed),
                    drop_steps_figure(ctx.group.drops), ctx.group.table()]
        s.text += " " + _group_text(ctx)


def _components(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.analyses.dynamics import PAPER_COMPONENTS, summarize_drops
    from tfmatcomp.plotting.dynamics import component_training_figure
    from tfmatcomp.training.trainer import read_metrics

    saved = ctx.run_dir / "components"
    logs = {g: saved / g / METRICS_FILE for g in (*PAPER_COMPONENTS, "all")}
    s.text = ("Each group (attention, MLP, token embeddings, positional embeddings) re-initialized "
              "and trained alone, everything else frozen at its post-shift value; 'all' re-initializes "
              "and trains every parameter (normal training). Paper (Fig. 8): MLPs and token "
              "embeddings converge without a plateau, attention and positional embeddings plateau "
              "and then drop, positional embeddings longest, each before the full model's drop. ")
    if not all(p.exists() for p in logs.values()):
        # Five training runs as long as the run itself: far too long for a report to start on its
        # own (a short run would show no plateau), so the section says how to produce them.
        bundled = Path(__file__).resolve().parents[1] / "pretrained"
        where = ("a copy of this bundled run (the package's own files stay as shipped)"
                 if bundled in ctx.run_dir.resolve().parents else str(ctx.run_dir))
        s.text += (f"Not computed for this run: it needs five training runs as long as the run "
                   f"itself. Run tfmatcomp.analyses.dynamics.component_training(<post-shift checkpoint>, "
                   f"out_dir=<run directory>/components, n_steps=<the run's step count>) on "
                   f"{where} and build the report on it again; it reads the curves from there.")
        return
    df = pd.concat([read_metrics(p).assign(component=g) for g, p in logs.items()], ignore_index=True)
    s.items += [component_training_figure(df), summarize_drops(df, ["eval_L_mask"], by="component")]
    s.text += f"Curves read from {saved}."


# ------------------------------------------------------------------- causal experiments
def _copying(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import copying_check

    s.items.append(copying_check(ctx.models, ctx.task, n_samples=2 * ctx.n_samples, seed=ctx.seed))
    values = paper.PAPER_COPYING["low-rank"]
    m_values = [k for k in values if k != "MASK"]
    s.text = ("MASK tokens replaced by the token of a value m: a copying model outputs m at masked "
              "entries, so L'_mask (MSE to m) is small. Paper, pre-shift: L'_mask "
              + ", ".join(f"{_g(values[k]['L_mask_prime'])} for m = {k}" for k in ["MASK", *m_values])
              + ", on rank-2 and on full-rank random matrices alike.")


def _ablation(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import attention_ablation

    s.items.append(attention_ablation(ctx.models, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed))
    pre, post = paper.PAPER_ABLATION_ALL[paper.PRE], paper.PAPER_ABLATION_ALL[paper.POST]
    s.text = ("Uniform ablation of every head (softmax probabilities set to 1/n^2). Paper: pre-shift "
              f"L_mask {_g(pre['baseline']['L_mask'])} -> {_g(pre['ablated']['L_mask'])} (attention "
              f"is irrelevant while copying); post-shift L_obs {_g(post['baseline']['L_obs'])} -> "
              f"{_g(post['ablated']['L_obs'])} and L_mask {_g(post['baseline']['L_mask'])} -> "
              f"{_g(post['ablated']['L_mask'])} (back to the plateau).")


def _transplant(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import weight_transplant

    # checkpoint paths, so that the table's intervention column names the donor by path and step
    s.items.append(weight_transplant(ctx.checkpoints[ctx.pre_step], ctx.checkpoints[ctx.post_step],
                                     ctx.task, n_samples=ctx.n_samples, seed=ctx.seed))
    t = paper.PAPER_TRANSPLANT
    s.text = ("Query, key and value weights and biases of every layer swapped between the pre- and "
              "post-shift checkpoints. Paper: pre-shift with post-shift Q/K/V keeps L_mask at "
              f"{_g(t[(paper.PRE, paper.POST)]['L_mask'])}; post-shift with pre-shift Q/K/V gives "
              f"L_obs {_g(t[(paper.POST, paper.PRE)]['L_obs'])}.")


#: How many random permutations the ``permutation`` section runs per model (seeds seed .. seed + k - 1).
PERMUTATIONS = 5


def _permutation(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import permutation_summary, positional_permutation
    from tfmatcomp.plotting.experiments import loss_bars_figure

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
        f"{r['model']}: L_mask {_g(r['L_mask_baseline'])} unpermuted, {_g(r['L_mask_mean'])} on average "
        f"(std {_g(r['L_mask_std'])}, {_g(r['L_mask_min'])}-{_g(r['L_mask_max'])}), L_obs "
        f"{_g(r['L_obs_baseline'])} -> {_g(r['L_obs_mean'])} ({_g(r['L_obs_min'])}-{_g(r['L_obs_max'])})"
        for _, r in summary.iterrows())
    s.text = (f"Positional embeddings randomly permuted (position i is represented as pi(i)), "
              f"{PERMUTATIONS} permutations (seeds {ctx.seed}..{ctx.seed + PERMUTATIONS - 1}) on the "
              "same matrices; one permutation is one draw, so the table gives the mean, standard "
              f"deviation, min and max over them. Copying needs no position; completion does. Here: "
              f"{ours}. Paper, post-shift (one permutation): L_obs {_g(v['L_obs'])}, "
              f"L_mask {_g(v['L_mask'])}.")


def _patching(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import activation_patching
    from tfmatcomp.plotting.experiments import patching_figure, patching_head_heatmap

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
              f"Here, at masked entries: unpatched MSE(f_p, X) {_g(none['mse_to_X'])}, MSE(f_p, -X) "
              f"{_g(none['mse_to_neg_X'])}; all layers {_g(every['mse_to_X'])} / "
              f"{_g(every['mse_to_neg_X'])} (= the model's own L_mask on X); "
              + ", ".join(f"layer {int(r['layer'])} alone {_g(r['mse_to_X'])} / {_g(r['mse_to_neg_X'])}"
                          for _, r in layers.iterrows())
              + (f"; the head that moves f_p furthest towards X alone is ({int(best['layer'])}, "
                 f"{int(best['head'])}) (0-based), MSE(f_p, X) {_g(best['mse_to_X'])}"
                 if best is not None else "")
              + f". Paper, all layers patched (true by construction as here): MSE(f_p, X) about "
              f"{_g(v['mse_to_X'])} and MSE(f_p, -X) about {_g(v['mse_to_neg_X'])} at masked "
              "entries; the papers give no per-layer or per-head values.")


def _head_groups(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.analyses.heads import LABEL_GROUPS, label_group_ablation
    from tfmatcomp.experiments import head_group_ablation

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
                + f"), ablated together move L_mask from {_g(r['L_mask_without'])} to "
                f"{_g(r['L_mask_with'])} ({_g(r['ratio_L_mask'])}x) and L_obs from "
                f"{_g(r['L_obs_without'])} to {_g(r['L_obs_with'])}")

    s.text = ("Groups of heads ablated together (uniform attention), with the ratio to the unablated "
              "loss. First the workshop paper's test in this model's own terms: each post-shift "
              "head is labelled from its mean attention on the same matrices (as in the attention "
              "section; 1-based labels, each head's label in column head_types), and "
              f"{said(LABEL_GROUPS[0], 'neither row, column nor identity')}; "
              f"{said(LABEL_GROUPS[1], 'row or column')}. "
              f"Paper (4L8H): ablating its uninterpretable heads "
              f"{paper.PAPER_HEAD_GROUPS['uninterpretable']} moves L_mask only from "
              f"{_g(v['L_mask_without'])} to {_g(v['L_mask_with'])}. "
              + ("The papers' own groups (by their 4L8H labels) follow." if paper_shape else
                 "This model is smaller than the papers', so instead of their groups each layer's "
                 "heads form a group."))


def _head_scan(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import head_ablation_scan
    from tfmatcomp.plotting.experiments import head_scan_heatmap

    for label, model in ctx.models.items():
        scan = head_ablation_scan(model, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed)
        s.items.append(head_scan_heatmap(scan, title=f"{label}: change in L_mask when one head is "
                                                     "ablated (layers x heads, 1-based labels)"))
    # the cells' interventions (the same for both models), written out by the table renderer
    s.items.append(pd.DataFrame([{"layer": l, "head": h, "intervention": text}
                                 for (l, h), text in scan.attrs["interventions"].items()]))
    s.text = ("Every head ablated alone; the cell is the change in L_mask. Before the shift no head "
              "matters; after it a few heads carry the completion.")


# ---------------------------------------------------------------------- representations
def _attention(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.analyses.heads import analyse_heads, head_score_evolution
    from tfmatcomp.task.masks import row_mask
    from tfmatcomp.plotting.heads import (attention_grid_figure, head_score_evolution_figure,
                                          head_types_figure)

    n = min(ctx.n_samples, 256)
    for step in ctx.steps_around_drop(4):
        a = analyse_heads(ctx.model_at(step), ctx.task, n, generator=_generator(ctx))
        s.items.append(attention_grid_figure(a.mean_patterns, table=a.table,
                                             title=f"step {step:,}: mean attention over random masks"))
    post = analyse_heads(ctx.post, ctx.task, n, generator=_generator(ctx))
    s.items += [head_types_figure(post.table), post.table]
    rows = ctx.task.n_rows
    observed = row_mask(rows, ctx.task.n_cols, masked_rows=(rows // 2,), keep=(0,))
    structured = analyse_heads(ctx.post, ctx.task, n, observed=observed, generator=_generator(ctx))
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


def _before_drop(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.analyses.dynamics import lead_time_summary, lead_times, over_checkpoints
    from tfmatcomp.analyses.dynamics.progress import PROGRESS_MEASURES
    from tfmatcomp.plotting.dynamics import measures_figure

    s.text = ("The progress measures of Gopalani and Hu (NeurIPS 2025) at every checkpoint, on one "
              "fixed batch: attention mass from masked entries onto their own row and column's "
              "observed entries (what the post-shift row and column heads read), the collapse of "
              "the masked positions' hidden states onto one direction, the copying check, and the "
              "positional rank of the decomposition. ")
    first = min(ctx.checkpoints)
    if ctx.has_drop and not any(first < st < ctx.drop.drop_end for st in ctx.checkpoints):
        s.text += (f"Not computed: timing them against the drop needs checkpoints between the "
                   f"first one (step {first:,}) and the drop's end (step {ctx.drop.drop_end:,.0f}), "
                   f"and this run has steps {', '.join(f'{st:,}' for st in sorted(ctx.checkpoints))} "
                   "only.")
        return
    measures = {k: f for k, f in PROGRESS_MEASURES.items() if k != "L_mask"}
    table = over_checkpoints(ctx.run_dir, measures, n_samples=min(ctx.n_samples, 256),
                             seed=ctx.seed)
    last = ctx.post.cfg.n_layers
    shown = ["row_column_attention_mass.max_head", "row_column_attention_mass.layer0",
             f"representation_collapse.layer{last}", "copying.L_mask_prime",
             f"positional_rank.layer{last}"]
    s.items.append(measures_figure(table, ctx.metrics, measures=shown,
                                   title="Progress measures at every checkpoint"))
    steps = sorted(table["step"].unique())
    spacing = int(min(b - a for a, b in zip(steps, steps[1:]))) if len(steps) > 1 else 0
    if not ctx.has_drop:
        s.text += "No drop was detected in this run, so there is no onset to time them against."
        return
    leads = lead_times(table, ctx.run_dir)
    summary = lead_time_summary(leads).sort_values("median_lead", ascending=False)
    s.items.append(summary.round(0))
    moved = summary[summary["median_lead"] > 0]
    head = summary.set_index("measure")["median_lead"].get("row_column_attention_mass.max_head")
    s.text += (f"A measure's lead is the loss's onset (step {ctx.drop.drop_start:,.0f}) minus the "
               "first checkpoint from which on it stays 10% of the way from its plateau value to "
               f"its final value; with checkpoints {spacing:,} steps apart (at the closest), a "
               f"lead is exact to that spacing. {len(moved)} of {len(summary)} measures moved "
               "before the loss")
    if head is not None and head == head:
        s.text += (f"; the strongest head's attention on its own row and column (the first sign "
                   f"of the drop over eight seeds of tiny) by {head:,.0f} steps")
    s.text += (". Slow, steady changes on the plateau (L_obs still falling after copying, the "
               "embeddings' collapse) cross their 10% mark early without timing the drop. Over "
               "the seeds of a group: tfmatcomp dynamics GROUP --lead (docs/dynamics.md, lead "
               "times).")


#: The sampler settings of the report's ``llc`` section (the calibration on the bundled ``tiny``
#: run, docs/dynamics.md); a test or a user may swap in others before building a report.
LLC_SETTINGS = None  # None: tfmatcomp.analyses.dynamics.llc.LLCSettings()
#: How many checkpoints the ``llc`` section estimates at, at most: all of a run's checkpoints when it
#: has no more, else pre-shift, those nearest the drop and post-shift.
LLC_CHECKPOINTS = 6


def _llc(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.analyses.dynamics import lead_times, over_checkpoints
    from tfmatcomp.analyses.dynamics.llc import LLCSettings, llc_measure
    from tfmatcomp.plotting.dynamics import measures_figure

    settings = LLC_SETTINGS or LLCSettings()
    measure = llc_measure(settings, ["all"], seed=ctx.seed)  # ImportError without the llc extra
    steps = (sorted(ctx.checkpoints) if len(ctx.checkpoints) <= LLC_CHECKPOINTS
             else ctx.steps_around_drop(LLC_CHECKPOINTS))
    table = over_checkpoints(ctx.run_dir, {"llc": measure}, n_samples=settings.n_matrices,
                             seed=ctx.seed, steps=steps)
    wide = table.pivot_table(index="step", columns="measure", values="value").reset_index()
    wide.columns.name = None
    wide = wide.rename(columns={"llc.all": "LLC", "llc.all.std": "std over chains",
                                "llc.all.drift": "drift", "llc.all.stable": "stable"})
    wide["stable"] = wide["stable"].astype(bool)
    wide = wide[["step", "LLC", "std over chains", "drift", "stable"]]
    s.items += [measures_figure(table, ctx.metrics, measures=["llc.all"],
                                title="Local learning coefficient of the whole model"),
                wide.round(4)]
    s.text = ("The local learning coefficient (Lau et al. 2023; estimated with devinterp's SGLD "
              "sampler, tfmatcomp.analyses.dynamics.llc) of the whole model at "
              f"{len(steps)} checkpoints, on the training loss over {settings.n_matrices} fixed "
              f"matrices: {settings.n_chains} chains of {settings.n_burnin} burn-in and "
              f"{settings.n_draws} draws, step size {_g(settings.lr)}, localization "
              f"{_g(settings.localization)}, nbeta {_g(settings.effective_nbeta)}, batch "
              f"{settings.batch_size}, seed {ctx.seed}. These settings are the calibration on the "
              "bundled tiny run; another model needs its own (docs/dynamics.md). ")
    unstable = wide.loc[~wide["stable"], "step"].tolist()
    s.text += (f"{len(wide) - len(unstable)} of {len(wide)} estimates are stable (chains agree "
               "within 15% and the draws are flat after burn-in)"
               + (f"; unstable at steps {', '.join(f'{int(x):,}' for x in unstable)}, read those "
                  "values with care. " if unstable else ". "))
    if ctx.has_drop:
        lead = lead_times(table, ctx.run_dir).set_index("measure")["lead"].get("llc.all")
        s.text += (f"Does it move before the loss? Against the loss's onset (step "
                   f"{ctx.drop.drop_start:,.0f}), exact only to the spacing of these few "
                   "checkpoints: ")
        if lead is None or lead != lead:
            s.text += "it did not leave its plateau value at them."
        else:
            s.text += (f"it left its plateau value {abs(lead):,.0f} steps "
                       f"{'before' if lead > 0 else 'after'} it.")


def _embeddings(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.analyses.embeddings import (checkpoint_token_projection, positional_embedding_pca,
                                      token_embedding_norms, token_embedding_pca)
    from tfmatcomp.plotting.embeddings import (checkpoint_projection_figure,
                                               positional_pca_figure, token_norms_figure,
                                               token_pca_figure)

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
    from tfmatcomp.datapath import sample_batch
    from tfmatcomp.plotting.probes import probe_table_figure
    from tfmatcomp.analyses.probes import probe_layers

    batch = sample_batch(ctx.task, 2 * ctx.n_samples, seed=ctx.seed, device=ctx.post.device)
    for label, model in ctx.models.items():
        table = probe_layers(model, batch, generator=_generator(ctx))
        s.items += [probe_table_figure(table, title=f"{label}: linear probes per layer"), table]
    s.text = ("Linear probes (least squares, held-out matrices) from each layer's hidden state of an "
              "element to its masked row, its value (masked and observed entries separately) and the "
              "top singular vector of X. Paper (12-layer model): the masked row is decoded best in "
              "layers 3 and 4; the singular vector is not linearly decodable.")


def _structured_masks(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.analyses.heads import analyse_heads
    from tfmatcomp.task.masks import column_mask, row_mask
    from tfmatcomp.plotting.heads import structured_mask_pairs_figure

    t, n = ctx.task, min(ctx.n_samples, 256)
    middle_row, middle_col = t.n_rows // 2, t.n_cols // 2
    row = analyse_heads(ctx.post, t, n, generator=_generator(ctx),
                        observed=row_mask(t.n_rows, t.n_cols, masked_rows=(middle_row,), keep=0))
    col = analyse_heads(ctx.post, t, n, generator=_generator(ctx),
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
    from tfmatcomp.analyses.embeddings import positional_embedding_norms, positional_similarity
    from tfmatcomp.plotting.embeddings import positional_norms_figure

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


# ------------------------------------------------------------------------- baselines
def _nuclear_norm(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.analyses.baselines import PAPER_LAMBDA_TABLE, compare_with_model, lambda_table
    from tfmatcomp.plotting.baselines import lambda_table_figure, model_vs_nuclear_norm_figure

    comparison = compare_with_model(ctx.post, task=ctx.task, n_samples=ctx.n_samples, seed=ctx.seed)
    lambdas = lambda_table(task=ctx.task, model=ctx.post, n_samples=ctx.n_samples, seed=ctx.seed)
    s.items += [model_vs_nuclear_norm_figure(comparison), comparison,
                lambda_table_figure(lambdas), lambdas]
    masks = [v[1] for v in PAPER_LAMBDA_TABLE.values()]
    totals = [v[2] for v in PAPER_LAMBDA_TABLE.values()]
    lams = list(PAPER_LAMBDA_TABLE)
    s.text = ("The post-shift model against nuclear-norm minimization on the same matrices, across "
              f"p_mask, and the regularized solver across lambda. Paper (7x7 rank 2): nuclear norm "
              f"L_mask {_g(min(masks))}-{_g(max(masks))} and L {_g(min(totals))}-{_g(max(totals))} "
              f"for lambda {_g(min(lams))}..{_g(max(lams))}; BERT beats it (L_mask "
              f"{_g(paper.PAPER_TRAINING['final_L_mask'])}).")


def _ood(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.analyses.ood import evaluate_ood
    from tfmatcomp.plotting.baselines import ood_figure

    table = evaluate_ood(ctx.post, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed)
    s.items += [ood_figure(table), table]
    rows = table[(table["method"] == "model") & (table["group"] == "distribution")]
    bound = table["train_max_abs"].iloc[0]
    laws = "; ".join(f"{r['value']}: {100 * r['frac_outside_train_range']:.1f}% outside, L_mask "
                     f"{_g(r['L_mask'])}" for _, r in rows.iterrows()) or "no other law was tried"
    train = table[(table["method"] == "model") & (table["group"] == "in_distribution")].iloc[0]
    s.text = ("The post-shift model on inputs it was not trained on (other laws of the factors' "
              "entries, other ranks and shapes, full-rank matrices), next to nuclear-norm "
              "minimization on the same inputs. Gaussian N(0, 1) and Laplace(0, 1) factors have "
              "three and six times the variance of the training Uniform[-1, 1] factors, so many of "
              "their entries lie beyond the largest value seen in training "
              f"(|entry| <= {_g(bound)} for this task), tokens the model never saw; the *_matched "
              "laws have the same shapes scaled to the training variance (factor variance 1/3), "
              "which separates another law from unseen values. Column frac_outside_train_range "
              f"gives the share of entries beyond the training range. Here (training L_mask "
              f"{_g(train['L_mask'])}): {laws}. Paper: the model degrades gracefully on nearby "
              "distributions.")


# --------------------------------------------------------------------- decomposition
def _decomposition(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.datapath import sample_batch
    from tfmatcomp.decomposition import accumulate, residual_pass, residual_stream_names
    from tfmatcomp.geometry import model_summary_table, qk_decomposition, row_column_r2
    from tfmatcomp.plotting.decomposition import (gram_figure, pos_pca_figure, qk_figure,
                                                  spectrum_figure)

    t = ctx.task
    gen = _generator(ctx)
    batches = [sample_batch(t, 256, generator=gen, device=ctx.post.device).tokens
               for _ in range(max(1, (8 * ctx.n_samples) // 256))]
    for label, model in ctx.models.items():
        table = model_summary_table(model, batches, progress=False)
        table.insert(0, "model", label)
        s.items.append(table)
    names = residual_stream_names(ctx.post)
    acc = accumulate(ctx.post, batches, names, progress=False)
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


SECTIONS: dict[str, tuple[str, Callable[[RunContext, Section], None]]] = {
    "training": ("Training: plateau and sudden drop", _training),
    "before_drop": ("Before the drop: progress measures and their lead", _before_drop),
    "llc": ("Before the drop: the local learning coefficient", _llc),
    "components": ("Component-wise training (Fig. 8)", _components),
    "copying": ("Copying check (Table 1)", _copying),
    "ablation": ("Uniform attention ablation", _ablation),
    "transplant": ("Weight transplant (model switching)", _transplant),
    "permutation": ("Positional permutation", _permutation),
    "patching": ("Activation patching X -> -X", _patching),
    "head_groups": ("Head-group ablation", _head_groups),
    "head_scan": ("Per-head ablation scan", _head_scan),
    "attention": ("Attention heads over training", _attention),
    "structured_masks": ("Heads under structured masks: row / column pairs", _structured_masks),
    "embeddings": ("Embeddings", _embeddings),
    "positional": ("Positional embeddings per position", _positional),
    "probes": ("Linear probes", _probes),
    "nuclear_norm": ("Nuclear-norm baseline", _nuclear_norm),
    "ood": ("Out-of-distribution inputs", _ood),
    "decomposition": ("Position / context decomposition", _decomposition),
}

#: Sections computed only when asked for by name: ``llc`` needs the optional ``llc`` extra
#: (devinterp) and takes about 40 s per checkpoint on ``tiny``.
OPT_IN_SECTIONS: tuple[str, ...] = ("llc",)
#: What a report computes by default: every section but the opt-in ones.
DEFAULT_SECTIONS: tuple[str, ...] = tuple(k for k in SECTIONS if k not in OPT_IN_SECTIONS)
