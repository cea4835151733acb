# %% [markdown]
# # Baselines, probes and attention heads on the bundled tiny run
#
# Three analyses of the bundled `tiny` run (4x4 rank-1 matrices, 2 layers x 4 heads, width 64),
# before (step 2,000) and after (step 10,000) its loss drop near step 5,600:
#
# 1. **Nuclear-norm baseline** (the workshop paper Fig. 5 and Appendix D): the post-shift model against
#    nuclear-norm minimization on the same matrices, across masking probabilities and across the
#    regularization weight lambda.
# 2. **Linear probes per layer** (the workshop paper Sec. 5): what the hidden states encode linearly (the
#    masked row, the entry's value, the top singular vector), pre vs post.
# 3. **Attention-head taxonomy** (the workshop paper Sec. 5): per-head scores (row, column, identity, ...)
#    and the resulting head type, pre vs post.
#
# Runs offline on a CPU in seconds, on small samples (64-256 matrices); raise `N` for stable
# numbers. Every random draw goes through an explicit seed.

# %%
import time

import pandas as pd
import torch

import tfmatcomp as tm
from tfmatcomp.analyses.baselines import compare_with_model, lambda_table
from tfmatcomp.runs.checkpoint import list_checkpoints, load_checkpoint_info
from tfmatcomp.analyses.heads import analyse_heads
from tfmatcomp.analyses.probes import probe_layers

torch.set_num_threads(1)
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
pd.set_option("display.float_format", lambda v: f"{v:.4g}")
t_start = time.perf_counter()

N = 128  # matrices per measurement

# %% [markdown]
# ## The bundled checkpoints
#
# The task configuration (tiny: 4x4, rank 1, p_mask 0.2) is read from the checkpoint.

# %%
ckpts = list_checkpoints(tm.pretrained.run_dir("tiny"))
models, task_cfg = {}, None
for label in ("pre", "post"):
    step = tm.pretrained.resolve_step("tiny", label)
    model, info = load_checkpoint_info(ckpts[step])
    models[label] = model.eval()
    task_cfg = info.task_cfg
    print(f"{label}-shift = step {step}")
task = task_cfg.build()
post = models["post"]

# %% [markdown]
# ## 1. Model vs nuclear-norm minimization
#
# For each `p_mask` a fresh batch is drawn (one generator, seed 0); the model predicts from
# `model(batch.tokens)` and the same batch is completed by minimizing the nuclear norm subject to
# agreeing on the observed entries (the batched torch solver). `nuclear_norm` is the mean nuclear
# norm of the completions; `true_nuclear_norm` that of the true matrices.

# %%
t0 = time.perf_counter()
cmp = compare_with_model(post, [0.2, 0.3, 0.5], task=task_cfg, n_samples=N, seed=0)
print(cmp[["p_mask", "method", "L", "L_obs", "L_mask", "n_failed", "nuclear_norm",
           "true_nuclear_norm"]].to_string(index=False))
pivot = cmp.pivot(index="p_mask", columns="method", values="L_mask")
print("L_mask, model / nuclear norm:", ", ".join(
    f"p_mask {p}: {r:.2f}" for p, r in (pivot["model"] / pivot["nuclear_norm"]).items()))
print(f"[{time.perf_counter() - t0:.1f} s]\n")

# %% [markdown]
# The regularized problem `min ||X||_* + (1 / (2 lambda)) ||P_obs(X - M)||^2` at the paper's
# lambdas, on one batch at the training `p_mask`, with the post-shift model on the same batch as a
# last row. The `paper_*` columns hold the paper's values (for 7x7 rank-2 matrices: a different
# task, shown for scale only).

# %%
t0 = time.perf_counter()
lam = lambda_table([5e-4, 1e-3, 5e-3], task=task_cfg, n_samples=N, seed=0, model=post)
print(lam[["method", "lam", "L_obs", "L_mask", "L", "nuclear_norm", "paper_L_mask"]].to_string(index=False))
print(f"[{time.perf_counter() - t0:.1f} s]\n")

# %% [markdown]
# ## 2. Linear probes per layer
#
# One probe per (layer, target), fitted by ridge regression on the hidden states of 192 matrices
# and tested on 64 others (every entry of a matrix is one sample). Probe layers: 0 = embeddings,
# `l` = output of block `l - 1`. Targets: `masked_row` (which row of the matrix is masked, as a
# 0/1 vector), `value` (the true entry, fitted separately on masked and observed entries) and
# `singular_vector` (the top right singular vector, sign-invariant). Same matrices for both models.

# %%
t0 = time.perf_counter()
probe_batch = task.sample(2 * N, generator=torch.Generator().manual_seed(1))
probe_cols = ["layer", "hook_name", "masked_row_cos", "value_masked_corr", "value_masked_r2",
              "value_observed_r2", "singular_vector_cos"]
probes = {}
for label, model in models.items():
    probes[label] = probe_layers(model, probe_batch, ridge=1e-3,
                                 generator=torch.Generator().manual_seed(2))
    print(f"== {label}-shift")
    print(probes[label][probe_cols].to_string(index=False))
last = probes["post"]["layer"].max()
print("correlation of the probed and true value at masked entries, last layer: "
      + ", ".join(f"{k}-shift {v.set_index('layer').loc[last, 'value_masked_corr']:.2f}"
                  for k, v in probes.items()))
print(f"[{time.perf_counter() - t0:.1f} s]\n")

# %% [markdown]
# ## 3. Attention-head taxonomy
#
# `analyse_heads` averages every head's attention over random-mask samples, scores it (`row`:
# attention to the query's row, `column`: to its column, `identity`: to itself, `mask_sink`:
# observed queries parked on masked keys, `entropy`: how uniform) and assigns a type. Heads are
# listed both 0-based (`layer`, `head`) and with the papers' 1-based `paper_label`.

# %%
t0 = time.perf_counter()
head_cols = ["layer", "head", "paper_label", "row", "column", "identity", "mask_sink", "entropy", "type"]
for label, model in models.items():
    res = analyse_heads(model, task, N, generator=torch.Generator().manual_seed(3))
    cols = [c for c in head_cols if c in res.table.columns]
    print(f"== {label}-shift ({res.n_samples} samples)")
    print(res.table[cols].to_string(index=False))
    print("types:", res.table["type"].value_counts().to_dict())
print(f"[{time.perf_counter() - t0:.1f} s]")
print(f"\ndone in {time.perf_counter() - t_start:.1f} s")
