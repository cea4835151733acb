# %% [markdown]
# # Position / context / residual decomposition of our models
#
# Split the residual stream of the bundled `tiny` run (4x4 rank-1 matrices, 2 layers x 4 heads,
# width 64) into `h = mu + pos + ctx + resid` (Song & Zhong 2023), before and after the loss drop,
# and measure the pieces: the per-layer summary table, how much of the positional basis is
# explained by the matrix's rows and columns, and the QK score components of one head.
#
# Runs offline on a CPU in seconds (no training: the checkpoints ship with the package).
# Figures are written as HTML files to `--out DIR`, or `$TFMATCOMP_EXAMPLE_OUT`, or a fresh
# temporary directory; open them in a browser (plotly.js is written once, next to them).

# %%
import argparse
import os
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint import list_checkpoints, load_checkpoint_info
from tfmatcomp.decomposition import accumulate, residual_pass
from tfmatcomp.geometry import model_summary_table, qk_decomposition, row_column_r2, summary_table
from tfmatcomp.plotting.decomposition import pos_pca_figure, qk_figure, spectrum_figure

parser = argparse.ArgumentParser(description="pos/ctx/resid decomposition of the bundled tiny run")
parser.add_argument("--out", default=os.environ.get("TFMATCOMP_EXAMPLE_OUT"),
                    help="directory for the HTML figures (default: $TFMATCOMP_EXAMPLE_OUT or a temp dir)")
args, _ = parser.parse_known_args()  # parse_known_args: also works inside a Jupyter kernel
out_dir = Path(args.out or tempfile.mkdtemp(prefix="tfmatcomp-decomposition-"))
out_dir.mkdir(parents=True, exist_ok=True)

torch.set_num_threads(1)
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 20)
pd.set_option("display.float_format", lambda v: f"{v:.4g}")
t_start = time.perf_counter()

# %% [markdown]
# ## The bundled checkpoints
#
# `"pre"` is step 2,000 (the copying plateau) and `"post"` step 10,000 (after the drop near step
# 5,600). The task configuration is read from the checkpoint itself.

# %%
run = tm.pretrained.run_dir("tiny")
ckpts = list_checkpoints(run)
models, task = {}, None
for label in ("pre", "post"):
    step = tm.pretrained.resolve_step("tiny", label)
    model, info = load_checkpoint_info(ckpts[step])
    models[f"{label}-shift (step {step})"] = model.eval()
    task = info.task_cfg.build()
print(f"task: {task.n_rows}x{task.n_cols}, rank {task.rank}, p_mask {task.p_mask}")

eval_batch = task.sample(256, generator=torch.Generator().manual_seed(0))
for label, model in models.items():
    with torch.no_grad():
        losses = tm.losses(model(eval_batch.tokens), eval_batch)
    print(f"{label:>26s}: " + ", ".join(f"{k} {v.item():.4f}" for k, v in losses.items()))

# %% [markdown]
# ## Stream the residual stream into the accumulator
#
# `accumulate` runs the model over batches with hooks that only feed running sums (the cache is
# never built). The default names are the residual stream `h^(0..L)`: row 0 = embeddings, row `l`
# = output of block `l - 1` (the paper's "Layer l"). Every context is one matrix, every position one
# entry (`t = 4 * row + col`); no position is dropped, so `pos` has one row per entry.
#
# Both models see the same 256 matrices (4 batches of 64, generator seed 1).

# %%
N_BATCHES, BATCH = 4, 64


def batches():
    g = torch.Generator().manual_seed(1)
    return [task.sample(BATCH, generator=g) for _ in range(N_BATCHES)]


accs = {label: accumulate(model, batches(), progress=False, total=N_BATCHES)
        for label, model in models.items()}

# %% [markdown]
# ## Per-layer summary table (Song & Zhong, Table 1)
#
# `model_summary_table` streams the model and tabulates in one call (here on the same batches,
# so it must agree with `summary_table` of the accumulator above). Columns: ScreeNOT rank of
# `pos` (with `k` capped at 7: `T = 16` positions), stable rank, relative norm of `pos` in the
# centered activations, and the incoherence `max |cos(pos_t, ctx_c)|`. No cluster labels here, so
# the similarity columns are NaN and left out.

# %%
COLS = ["layer", "name", "rank_estimate", "screenot_k", "stable_rank", "relative_norm",
        "incoherence_max", "incoherence_mean", "n_contexts"]
for label, model in models.items():
    table = model_summary_table(model, batches(), progress=False, total=N_BATCHES)
    same = table[COLS[2:]].equals(summary_table(accs[label])[COLS[2:]])
    print(f"== {label}  (layer 0 = embeddings; equals summary_table(acc): {same})")
    print(table[COLS].to_string(index=False))
    print()

# %% [markdown]
# ## The positional basis on the matrix grid
#
# `row_column_r2` reshapes `pos` into the 4x4 grid and splits its variance into what row means
# explain, what column means explain, and the rest. A share well above the chance level (3/15 for
# rows, 3/15 for columns on a 4x4 grid) says the layer knows which row / column a position is in.

# %%
rows = []
for label, acc in accs.items():
    for layer, (name, dec) in enumerate(acc.results().items()):
        shares = row_column_r2(dec.pos, task.n_rows, task.n_cols)
        rows.append({"model": label, "layer": layer, "name": name, "row_r2": shares.row,
                     "col_r2": shares.col, "interaction": shares.interaction,
                     "pos_norm": float(dec.pos.norm())})
print(pd.DataFrame(rows).to_string(index=False))

# %% [markdown]
# ## Residuals (second pass) and figures
#
# Residuals need the accumulated means, so they come from a second pass over a few contexts
# (`residual_pass`, 32 matrices). The figures: top-2 PCA of `pos` with sampled `cvec` per layer
# (Fig. 1), the spectra of `P`, `Cvec`, `R` with the DCT of the positional Gram (Fig. 3), and the
# four QK components of head 0 of layer 1 (Fig. 4). Layers and heads are 0-based in titles.

# %%
written = []
for label, model in models.items():
    slug = label.split("-")[0]
    acc = accs[label]
    second = residual_pass(model, acc, task.sample(32, generator=torch.Generator().manual_seed(2)))
    decs = {f"h^({i}) {name}": dec for i, (name, dec) in enumerate(second.items())}
    final = list(second.values())[-1]
    figs = {
        f"pos_pca_{slug}.html": pos_pca_figure(decs, n_rows=task.n_rows, n_cols=task.n_cols,
                                               title=f"pos (blue) and cvec (red), {label}"),
        f"spectrum_{slug}.html": spectrum_figure(final, title=f"spectra, last layer, {label}"),
    }
    tokens = task.sample(1, generator=torch.Generator().manual_seed(3)).tokens
    qk = qk_decomposition(model, tokens, 1, acc.result("blocks.1.hook_resid_pre"))
    err = float((qk.total() - qk.scores.to(torch.float64)).abs().max())
    shares = {k: float(v.pow(2).mean()) for k, v in qk.as_dict().items()}
    total = sum(shares.values())
    print(f"{label}: layer-1 QK components, mean square share over heads "
          + ", ".join(f"{k} {v / total:.2f}" for k, v in shares.items())
          + f"  (sum - scores: max |err| {err:.1e})")
    figs[f"qk_layer1_head0_{slug}.html"] = qk_figure(qk, head=0, title=f"QK components, layer 1 head 0, {label}")
    for fname, fig in figs.items():
        fig.write_html(out_dir / fname, include_plotlyjs="directory")
        written.append(fname)

print(f"\nwrote {len(written)} figures to {out_dir}: {', '.join(written)}")
print(f"done in {time.perf_counter() - t_start:.1f} s")
