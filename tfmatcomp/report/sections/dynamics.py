"""The sections before the drop: progress measures and their lead, the local learning coefficient."""

from __future__ import annotations

from tfmatcomp.analyses.dynamics import lead_time_summary, lead_times, over_checkpoints
from tfmatcomp.analyses.dynamics.llc import llc_measure, LLCSettings
from tfmatcomp.analyses.dynamics.progress import PROGRESS_MEASURES
from tfmatcomp.plotting.dynamics import measures_figure
from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections.base import Section, num


def _before_drop(ctx: RunContext, s: Section) -> None:
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
              f"{settings.n_draws} draws, step size {num(settings.lr)}, localization "
              f"{num(settings.localization)}, nbeta {num(settings.effective_nbeta)}, batch "
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
