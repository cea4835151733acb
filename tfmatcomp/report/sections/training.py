"""The training sections: the loss curve and its drop (every seed's for a group), component-wise
training."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tfmatcomp.analyses.dynamics import PAPER_COMPONENTS, summarize_drops
from tfmatcomp.experiments import reference as paper
from tfmatcomp.plotting.dynamics import (
    component_training_figure,
    drop_steps_figure,
    loss_curve_figure,
    seed_curves_figure,
)
from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections.base import Section, num
from tfmatcomp.runs.layout import METRICS_FILE
from tfmatcomp.training.trainer import read_metrics


def _training_text(ctx: RunContext) -> str:
    p = paper.PAPER_TRAINING
    papers = (f"Paper (4L8H, 7x7 rank 2): L_mask sits near {num(p['plateau_L_mask'])}, drops near step "
              f"{p['drop_step']:,} and ends near {num(p['final_L_mask'])} (total MSE about "
              f"{num(p['final_L'])}), a fall of {p['plateau_L_mask'] / p['final_L_mask']:.0f}x.")
    d = ctx.drop
    if ctx.has_drop:
        ours = (f"Here L_mask sits at {num(d.plateau_level)} on the plateau, leaves it at step "
                f"{d.drop_start:,.0f} and reaches {num(d.final_level)} by step {d.drop_end:,.0f} "
                f"(a fall of {d.drop_factor:.1f}x). The dashed line marks the drop's mid-point and "
                "the shaded band its onset-to-end extent.")
    else:
        ours = (f"No sudden drop was detected in this run: {d.reason.removeprefix('no drop: ')}. "
                f"L_mask went from {num(d.plateau_level)} to {num(d.final_level)}. The model may "
                "still be on its plateau (the plateau's length varies from seed to seed): train it "
                f"longer (tfmatcomp train --run-dir {ctx.run_dir} --resume --steps N with a larger N), "
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
        bundled = Path(__file__).resolve().parents[2] / "pretrained"  # tfmatcomp/pretrained
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
