"""One self-contained HTML report of every analysis on a run's pre- and post-shift checkpoints.

``tfmatcomp report RUN -o report.html`` (or :func:`build_report`) walks the papers' story on a
training run: the loss curve and its sudden drop, the copying check, ablations, transplants,
permutations, patching, the per-head scan, attention maps over training, embeddings, probes, the
nuclear-norm baseline, out-of-distribution inputs and the position / context decomposition. Each
section says what it shows and gives the papers' value (4 layers x 8 heads, 7x7 rank-2) beside ours.
Every number comes from the library's analysis functions; this module only arranges them.

``tfmatcomp demo`` trains the tiny preset (or, with ``--bundled``, uses the run shipped in the
package) and writes the report.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.report import build_report
    >>> report = build_report("tiny", "/tmp/tiny-report.html", n_samples=32, progress=False,
    ...                       sections=["training", "copying"])
    >>> report.failed
    []
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from tqdm.auto import tqdm

from tfmatcomp import pretrained
from tfmatcomp.checkpoint import list_checkpoints, load_checkpoint_info
from tfmatcomp.cli import command
from tfmatcomp.model import HookedEncoder

__all__ = ["build_report", "Report", "Section", "RunContext", "SECTIONS", "resolve_run"]


@dataclass
class Section:
    """One report section: a title, a sentence saying what it shows, and its figures / tables."""

    key: str
    title: str
    text: str = ""
    items: list[Any] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


@dataclass
class RunContext:
    """What every section works from: the run, its checkpoints and the pre / post-shift models."""

    run_dir: Path
    checkpoints: dict[int, Path]
    metrics: pd.DataFrame | None
    pre_step: int
    post_step: int
    pre: HookedEncoder
    post: HookedEncoder
    task: Any
    n_samples: int
    seed: int
    step_note: str = ""
    drop: Any = None
    _models: dict[int, HookedEncoder] = field(default_factory=dict)

    @property
    def models(self) -> dict[str, HookedEncoder]:
        """``{"pre-shift": ..., "post-shift": ...}``: the labels experiments know the papers' values for."""
        return {"pre-shift": self.pre, "post-shift": self.post}

    def model_at(self, step: int) -> HookedEncoder:
        if step not in self._models:
            self._models[step] = load_checkpoint_info(self.checkpoints[step],
                                                      device=self.post.device)[0]
        return self._models[step]

    def steps_around_drop(self, k: int = 5) -> list[int]:
        """Up to ``k`` checkpoint steps: pre-shift, those nearest the drop's start, middle and end
        (evenly spaced ones when no drop was detected), and post-shift."""
        inner = [s for s in self.checkpoints if self.pre_step < s < self.post_step]
        if self.drop is not None and self.drop.has_drop:
            targets = np.linspace(self.drop.drop_start, self.drop.drop_end, max(k - 2, 1))
        else:
            targets = np.linspace(self.pre_step, self.post_step, k)[1:-1]
        chosen = {min(inner, key=lambda s: abs(s - t)) for t in targets} if inner else set()
        return [self.pre_step, *sorted(chosen), self.post_step]


@dataclass
class Report:
    """What :func:`build_report` wrote."""

    path: Path
    sections: list[Section]

    @property
    def failed(self) -> list[str]:
        return [s.key for s in self.sections if s.error]


def resolve_run(run: str | os.PathLike) -> Path:
    """A run directory from a path or the name of a bundled run (``"tiny"``).

    Raises:
        ValueError: if ``run`` is neither a run directory with checkpoints nor a bundled run.
    """
    path = Path(run)
    if path.is_dir() and list_checkpoints(path):
        return path
    if isinstance(run, str) and run in pretrained.available():
        return pretrained.run_dir(run)
    raise ValueError(f"run: {run!r} is neither a run directory with checkpoints/ nor a bundled run "
                     f"(bundled: {sorted(pretrained.available())})")


def _choose_steps(run_dir: Path, checkpoints: dict[int, Path], drop: Any,
                  pre_step: int | None, post_step: int | None) -> tuple[int, int, str]:
    steps = list(checkpoints)
    note = ""
    info_file = run_dir / "pretrained.json"
    if (pre_step is None or post_step is None) and info_file.exists():
        info = json.loads(info_file.read_text())
        pre_step = pre_step if pre_step is not None else info.get("pre_shift_step")
        post_step = post_step if post_step is not None else info.get("post_shift_step")
        note = "pre/post-shift steps from the bundled run's pretrained.json"
    if post_step is None:
        post_step = steps[-1]
    if pre_step is None:
        if drop is not None and drop.has_drop:
            # The papers' pre-shift model sits well inside the plateau (step 4,000 of a drop near
            # 15,000): take the last checkpoint before 30% of the detected drop step.
            early = [s for s in steps if s <= 0.3 * drop.drop_step]
            pre_step = early[-1] if early else steps[0]
            note = f"pre-shift = last checkpoint before 30% of the detected drop (step {drop.drop_step:,.0f})"
        else:
            pre_step = steps[0]
            note = "no drop detected in the metrics log: pre-shift = first checkpoint"
    for name, s in (("pre_step", pre_step), ("post_step", post_step)):
        if s not in checkpoints:
            raise ValueError(f"{name}: no checkpoint at step {s}; the run has {steps}")
    return pre_step, post_step, note


def _context(run: str | os.PathLike, pre_step: int | None, post_step: int | None,
             n_samples: int, seed: int, device: torch.device | str | None) -> RunContext:
    from tfmatcomp.dynamics import detect_drop
    from tfmatcomp.training import read_metrics

    run_dir = resolve_run(run)
    checkpoints = list_checkpoints(run_dir)
    metrics = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else None
    drop = (detect_drop(metrics, column="eval_L_mask")
            if metrics is not None and len(metrics) > 10 else None)
    pre_step, post_step, note = _choose_steps(run_dir, checkpoints, drop, pre_step, post_step)
    pre, _ = load_checkpoint_info(checkpoints[pre_step], device=device)
    post, info = load_checkpoint_info(checkpoints[post_step], device=device)
    if info.task_cfg is None:
        raise ValueError(f"run: checkpoint {checkpoints[post_step]} records no task config")
    ctx = RunContext(run_dir=run_dir, checkpoints=checkpoints, metrics=metrics, pre_step=pre_step,
                     post_step=post_step, pre=pre, post=post, task=info.task_cfg.build(),
                     n_samples=n_samples, seed=seed, step_note=note, drop=drop)
    ctx._models.update({pre_step: pre, post_step: post})
    return ctx


# --------------------------------------------------------------------------- sections

def _fmt(x: float) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) and x == x else "n/a"


def _training(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.plotting.dynamics import loss_curve_figure

    if ctx.metrics is None or ctx.drop is None:
        s.text = "This run has no (or too short a) metrics.jsonl, so there is no loss curve to show."
        return
    drop = ctx.drop
    s.items += [loss_curve_figure(ctx.metrics, drop=drop), pd.DataFrame([drop.as_dict()])]
    ours = (f"Here L_mask sits at {_fmt(drop.plateau_level)} and drops to {_fmt(drop.final_level)}"
            f" around step {drop.drop_step:,.0f} (width {drop.drop_width:,.0f} steps)"
            if drop.has_drop else f"No drop was detected here ({drop.reason})")
    s.text = ("L_obs falls to near zero within the first few hundred steps (the model copies its "
              "input) while L_mask stays on a plateau near the variance of the masked entries, then "
              "drops suddenly. Paper (4L8H, 7x7 rank 2): plateau about 0.22, drop near step 15,000, "
              f"final total MSE about 4e-3. {ours}. The dashed line marks the detected drop.")


def _copying(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import copying_check

    s.items.append(copying_check(ctx.models, ctx.task, n_samples=2 * ctx.n_samples, seed=ctx.seed))
    s.text = ("MASK tokens replaced by the token of a value m: a copying model outputs m at masked "
              "entries, so L'_mask (MSE to m) is small. Paper, pre-shift: L'_mask about 3e-4 for "
              "m = MASK (0), 0.44 and -0.24, on rank-2 and on full-rank random matrices.")


def _ablation(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import attention_ablation

    s.items.append(attention_ablation(ctx.models, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed))
    s.text = ("Uniform ablation of every head (softmax probabilities set to 1/n^2). Paper: pre-shift "
              "L_mask 0.2236 -> 0.2236 (attention is irrelevant while copying); post-shift L_obs "
              "9.2e-5 -> 3.7e-3 and L_mask 0.0128 -> 0.2183 (back to the plateau).")


def _transplant(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import weight_transplant

    s.items.append(weight_transplant(ctx.pre, ctx.post, ctx.task, n_samples=ctx.n_samples,
                                     seed=ctx.seed))
    s.text = ("Query, key and value weights and biases of every layer swapped between the pre- and "
              "post-shift checkpoints. Paper: pre-shift with post-shift Q/K/V keeps L_mask at 0.2246; "
              "post-shift with pre-shift Q/K/V gives L_obs 9.5e-4.")


def _permutation(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import positional_permutation

    s.items.append(positional_permutation(ctx.models, ctx.task, n_samples=ctx.n_samples,
                                          seed=ctx.seed))
    s.text = ("Positional embeddings randomly permuted (position i is represented as pi(i)). "
              "Copying needs no position; completion does. Paper, post-shift: L_obs 2.4e-4, L_mask "
              "0.5687.")


def _patching(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import activation_patching
    from tfmatcomp.plotting.experiments import patching_figure

    table = activation_patching({"post-shift": ctx.post}, ctx.task, n_samples=ctx.n_samples,
                                seed=ctx.seed)
    s.items += [patching_figure(table), table]
    s.text = ("Attention outputs (hook_z) recorded on X are written into the run on -X with the same "
              "mask. If attention carries the completion, the masked outputs follow X. Paper, all "
              "layers patched: MSE(f_p, X) about 0.014 and MSE(f_p, -X) about 0.8066 at masked entries.")


def _head_groups(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import head_group_ablation

    cfg = ctx.post.cfg
    paper_shape = cfg.n_layers >= 4 and cfg.n_heads >= 8
    groups = "paper" if paper_shape else "layers"
    s.items.append(head_group_ablation({"post-shift": ctx.post}, ctx.task, groups=groups,
                                       n_samples=ctx.n_samples, seed=ctx.seed))
    s.text = ("Groups of heads ablated together, with the ratio to the unablated loss. Paper "
              "(4L8H): ablating (3,3), (4,2), (4,5-7) moves L_mask only from 0.01428 to 0.01575. "
              + ("The papers' groups are used." if paper_shape else
                 "This model is smaller than the papers', so each layer's heads form a group."))


def _head_scan(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.experiments import head_ablation_scan
    from tfmatcomp.plotting.experiments import head_scan_heatmap

    for label, model in ctx.models.items():
        scan = head_ablation_scan(model, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed)
        s.items.append(head_scan_heatmap(scan, title=f"{label}: change in L_mask when one head is "
                                                     "ablated (layers x heads, 1-based labels)"))
    s.text = ("Every head ablated alone; the cell is the change in L_mask. Before the shift no head "
              "matters; after it a few heads carry the completion.")


def _attention(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.heads import analyse_heads, head_score_evolution
    from tfmatcomp.masks import row_mask
    from tfmatcomp.plotting.heads import (attention_grid_figure, head_score_evolution_figure,
                                          head_types_figure)

    steps = ctx.steps_around_drop(4)
    n = min(ctx.n_samples, 256)
    for step in steps:
        a = analyse_heads(ctx.model_at(step), ctx.task, n,
                          generator=torch.Generator().manual_seed(ctx.seed))
        s.items.append(attention_grid_figure(a.mean_patterns, table=a.table,
                                             title=f"step {step:,}: mean attention over random masks"))
    post = analyse_heads(ctx.post, ctx.task, n, generator=torch.Generator().manual_seed(ctx.seed))
    s.items += [head_types_figure(post.table), post.table]
    rows = ctx.task.n_rows
    observed = row_mask(rows, ctx.task.n_cols, masked_rows=(rows // 2,), keep=(0,))
    structured = analyse_heads(ctx.post, ctx.task, n, observed=observed,
                               generator=torch.Generator().manual_seed(ctx.seed))
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
    from tfmatcomp.embeddings import (checkpoint_token_projection, positional_embedding_pca,
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
    from tfmatcomp.plotting.probes import probe_table_figure
    from tfmatcomp.probes import probe_layers

    batch = ctx.task.sample(2 * ctx.n_samples, generator=torch.Generator().manual_seed(ctx.seed),
                            device=ctx.post.device)
    for label, model in ctx.models.items():
        table = probe_layers(model, batch, generator=torch.Generator().manual_seed(ctx.seed))
        s.items += [probe_table_figure(table, title=f"{label}: linear probes per layer"), table]
    s.text = ("Linear probes (least squares, held-out matrices) from each layer's hidden state of an "
              "element to its masked row, its value (masked and observed entries separately) and the "
              "top singular vector of X. Paper (12-layer model): the masked row is decoded best in "
              "layers 3 and 4; the singular vector is not linearly decodable.")


def _nuclear_norm(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.baselines import compare_with_model, lambda_table
    from tfmatcomp.plotting.baselines import lambda_table_figure, model_vs_nuclear_norm_figure

    comparison = compare_with_model(ctx.post, task=ctx.task, n_samples=ctx.n_samples, seed=ctx.seed)
    lambdas = lambda_table(task=ctx.task, model=ctx.post, n_samples=ctx.n_samples, seed=ctx.seed)
    s.items += [model_vs_nuclear_norm_figure(comparison), comparison,
                lambda_table_figure(lambdas), lambdas]
    s.text = ("The post-shift model against nuclear-norm minimization on the same matrices, across "
              "p_mask, and the regularized solver across lambda. Paper (7x7 rank 2): nuclear norm "
              "L_mask about 0.040-0.043 and L about 0.012-0.0135 for lambda 5e-4..5e-3; BERT beats it.")


def _ood(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.ood import evaluate_ood
    from tfmatcomp.plotting.baselines import ood_figure

    table = evaluate_ood(ctx.post, ctx.task, n_samples=ctx.n_samples, seed=ctx.seed)
    s.items += [ood_figure(table), table]
    s.text = ("The post-shift model on inputs it was not trained on (Gaussian / Laplace entries, other "
              "ranks and shapes, full-rank matrices), next to nuclear-norm minimization on the same "
              "inputs. Paper: the model degrades gracefully on nearby distributions.")


def _decomposition(ctx: RunContext, s: Section) -> None:
    from tfmatcomp.decomposition import accumulate, residual_pass, residual_stream_names
    from tfmatcomp.geometry import model_summary_table, qk_decomposition, row_column_r2
    from tfmatcomp.plotting.decomposition import (gram_figure, pos_pca_figure, qk_figure,
                                                  spectrum_figure)

    t = ctx.task
    gen = torch.Generator().manual_seed(ctx.seed)
    batches = [t.sample(256, generator=gen, device=ctx.post.device).tokens
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
    layer = len(names) - 2
    qk = qk_decomposition(ctx.post, batches[0][:8], layer, results[last], heads=0)
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
    "copying": ("Copying check (Table 1)", _copying),
    "ablation": ("Uniform attention ablation", _ablation),
    "transplant": ("Weight transplant (model switching)", _transplant),
    "permutation": ("Positional permutation", _permutation),
    "patching": ("Activation patching X -> -X", _patching),
    "head_groups": ("Head-group ablation", _head_groups),
    "head_scan": ("Per-head ablation scan", _head_scan),
    "attention": ("Attention heads over training", _attention),
    "embeddings": ("Embeddings", _embeddings),
    "probes": ("Linear probes", _probes),
    "nuclear_norm": ("Nuclear-norm baseline", _nuclear_norm),
    "ood": ("Out-of-distribution inputs", _ood),
    "decomposition": ("Position / context decomposition", _decomposition),
}


# ------------------------------------------------------------------------------ html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222} h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:2em} p.what{max-width:60em;line-height:1.45} table.df{border-collapse:collapse;font-size:13px;
margin:1em 0;display:block;overflow-x:auto} table.df td,table.df th{border:1px solid #ddd;padding:3px 6px;
text-align:right} table.df th{background:#f5f5f5} .error{background:#fee;border:1px solid #c00;padding:1em;
white-space:pre-wrap;font-family:monospace;font-size:12px} .meta{color:#555;font-size:14px}
nav ol{columns:2}
"""


def _table_html(df: pd.DataFrame) -> str:
    return df.to_html(classes="df", index=False, float_format=lambda x: f"{x:.4g}", na_rep="",
                      border=0)


def _render(ctx: RunContext, sections: list[Section], seconds: float) -> str:
    first_figure = True
    body = []
    for s in sections:
        parts = [f'<h2 id="{s.key}">{html.escape(s.title)}</h2>',
                 f'<p class="what">{html.escape(s.text)}</p>']
        if s.error:
            parts.append(f'<div class="error">This section failed:\n{html.escape(s.error)}</div>')
        for item in s.items:
            if isinstance(item, go.Figure):
                parts.append(item.to_html(full_html=False, include_plotlyjs=first_figure,
                                          config={"displaylogo": False}))
                first_figure = False
            elif isinstance(item, pd.DataFrame):
                parts.append(_table_html(item))
            else:
                parts.append(f"<p>{html.escape(str(item))}</p>")
        parts.append(f'<p class="meta">computed in {s.seconds:.1f} s</p>')
        body.append("\n".join(parts))
    toc = "".join(f'<li><a href="#{s.key}">{html.escape(s.title)}</a></li>' for s in sections)
    cfg, tcfg = ctx.post.cfg, ctx.task
    meta = (f"run <code>{html.escape(str(ctx.run_dir))}</code>; model {cfg.n_layers} layers x "
            f"{cfg.n_heads} heads x d_model {cfg.d_model}; task {tcfg.n_rows}x{tcfg.n_cols} rank "
            f"{tcfg.rank}, p_mask {tcfg.p_mask}; pre-shift step {ctx.pre_step:,}, post-shift step "
            f"{ctx.post_step:,} ({html.escape(ctx.step_note or 'chosen by the caller')}); "
            f"{ctx.n_samples} samples per experiment, seed {ctx.seed}; built in {seconds:.0f} s. "
            "Layers and heads are 1-based in figure titles (the papers' labels) and 0-based in "
            "table columns named layer / head.")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>tfmatcomp report</title>"
            f"<style>{_CSS}</style></head><body><h1>tfmatcomp report</h1><p class='meta'>{meta}</p>"
            f"<nav><ol>{toc}</ol></nav>{''.join(body)}</body></html>")


def build_report(
    run: str | os.PathLike = "tiny",
    out: str | os.PathLike = "report.html",
    *,
    pre_step: int | None = None,
    post_step: int | None = None,
    n_samples: int = 256,
    seed: int = 0,
    sections: list[str] | None = None,
    device: torch.device | str | None = None,
    progress: bool = True,
) -> Report:
    """Compute every analysis on a run's pre- and post-shift checkpoints and write one HTML file.

    Args:
        run: a run directory (``metrics.jsonl`` + ``checkpoints/``) or a bundled run's name.
        out: the HTML file to write (self-contained: plotly.js is embedded).
        pre_step, post_step: checkpoints to analyse (default: from the bundled run's metadata, or
            the last checkpoint before 30% of the detected drop, and the last checkpoint).
        n_samples: matrices per experiment (the papers use 256 and 512 for the copying check).
        seed: seeds every sample drawn.
        sections: keys of :data:`SECTIONS` to compute (default: all).
        device: where to run the models (default: CPU).
        progress: show a progress bar over sections.

    Returns:
        A :class:`Report`; sections that raised are listed in ``report.failed`` and shown in the
        HTML with their traceback (the others are still computed).
    """
    if not isinstance(n_samples, int) or n_samples < 8:
        raise ValueError(f"n_samples: must be an integer >= 8, got {n_samples!r}")
    keys = list(SECTIONS) if sections is None else list(sections)
    unknown = [k for k in keys if k not in SECTIONS]
    if unknown:
        raise ValueError(f"sections: unknown {unknown}; choose from {list(SECTIONS)}")
    t0 = time.perf_counter()
    ctx = _context(run, pre_step, post_step, n_samples, seed, device)
    done: list[Section] = []
    bar = tqdm(keys, desc="report", disable=not progress, dynamic_ncols=True)
    for key in bar:
        title, fn = SECTIONS[key]
        bar.set_postfix_str(key)
        section = Section(key=key, title=title)
        start = time.perf_counter()
        try:
            with torch.no_grad():
                fn(ctx, section)
        except Exception:  # a failed analysis must not hide the others; it is shown and reported
            section.error = traceback.format_exc()
            print(f"report: section {key!r} failed:\n{section.error}", file=sys.stderr)
        section.seconds = time.perf_counter() - start
        done.append(section)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_render(ctx, done, time.perf_counter() - t0), encoding="utf-8")
    return Report(path=out, sections=done)


# ------------------------------------------------------------------------------- CLI

def _output_args(p: argparse.ArgumentParser, device_help: str) -> None:
    """Arguments shared by ``report`` and ``demo``."""
    p.add_argument("-o", "--out", default="report.html", help="HTML file to write")
    p.add_argument("--samples", type=int, default=256, help="matrices per experiment (256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sections", help=f"comma-separated subset of: {','.join(SECTIONS)}")
    p.add_argument("--device", help=device_help)
    p.add_argument("--no-progress", action="store_true")


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory (metrics.jsonl + checkpoints/) or a bundled run name")
    p.add_argument("--pre-step", type=int, help="pre-shift checkpoint step")
    p.add_argument("--post-step", type=int, help="post-shift checkpoint step")
    _output_args(p, "cpu or cuda (default: cpu)")


def _write_report(args: argparse.Namespace, run: str | os.PathLike) -> int:
    report = build_report(run, args.out, pre_step=getattr(args, "pre_step", None),
                          post_step=getattr(args, "post_step", None), n_samples=args.samples,
                          seed=args.seed, device=args.device,
                          sections=args.sections.split(",") if args.sections else None,
                          progress=not args.no_progress)
    print(f"report written to {report.path.resolve()}")
    if report.failed:
        print(f"sections that failed: {report.failed}", file=sys.stderr)
        return 1
    return 0


@command("report", _report_args)
def _report(args: argparse.Namespace) -> int:
    """Write the HTML report of a run."""
    return _write_report(args, args.run)


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundled", action="store_true",
                   help="use the run bundled in the package instead of training (seconds, not minutes)")
    p.add_argument("--out-dir", default="runs/tiny-demo", help="where to train (default runs/tiny-demo)")
    p.add_argument("--steps", type=int, help="training steps (default: the tiny preset's)")
    _output_args(p, "training device (default: CUDA when present)")


@command("demo", _demo_args)
def _demo(args: argparse.Namespace) -> int:
    """Train the tiny preset (or use the bundled run) and write the report."""
    if args.bundled:
        run: str | Path = "tiny"
    else:
        from tfmatcomp.training import train

        overrides = {"n_steps": args.steps} if args.steps else {}
        print(f"training the tiny preset into {args.out_dir} (resumes if interrupted)")
        result = train("tiny", out_dir=args.out_dir, device=args.device, resume=True,
                       progress=not args.no_progress, seed=args.seed, **overrides)
        run = result.out_dir
    args.device = None
    return _write_report(args, run)
