# %% [markdown]
# # Quickstart
#
# Train the CPU `tiny` preset briefly, then use the run bundled in the package (10,000 steps of the
# same preset) to see the whole story: the copying plateau, the sudden drop, and what changed in the
# model. Measure the papers' losses, run the copying check, look at an attention pattern, and save /
# load a checkpoint.
#
# Runs offline on a CPU in well under a minute. `TFMATCOMP_EXAMPLE_STEPS` sets the number of
# training steps of the brief run (CI uses fewer).

# %%
import os
import tempfile

import torch

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics import detect_drop

STEPS = int(os.environ.get("TFMATCOMP_EXAMPLE_STEPS", "100"))

# %% [markdown]
# ## Train
#
# A fresh batch of 4x4 rank-1 matrices every step, Adam at a constant rate. A few hundred steps
# reach the copying phase: `L_obs` (observed entries) is small, `L_mask` (masked entries) sits near
# the mean square of the masked values, 1/9, because the model predicts about 0 at every MASK.

# %%
preset = tm.get_preset("tiny")
result = tm.train(preset, n_steps=STEPS, batch_size=64, log_every=max(STEPS // 4, 1),
                  progress=False)
print(result.metrics[["step", "train_L_obs", "eval_L_obs", "eval_L_mask"]].to_string(index=False))

# %% [markdown]
# ## The bundled run: plateau, then a sudden drop
#
# The package ships a 10,000-step run of this preset: its metrics log and six checkpoints.

# %%
run = tm.pretrained.run_dir("tiny")
metrics = tm.read_metrics(run)
print(metrics.loc[metrics.step % 2000 == 0, ["step", "eval_L_obs", "eval_L_mask"]].to_string(index=False))
drop = detect_drop(metrics)
print(f"drop at step {drop.drop_step:.0f}: L_mask {drop.plateau_level:.3f} -> {drop.final_level:.3f}")
print("bundled checkpoints:", list(tm.list_checkpoints(run)))

# %% [markdown]
# ## Measure the pre- and post-shift models
#
# Losses pool the entries of the whole batch (see docs/concepts/conventions.md).

# %%
task = preset.task.build()
batch = task.sample(512, generator=torch.Generator().manual_seed(0))
models = {"pre-shift": tm.load_pretrained("tiny", step="pre"),
          "post-shift": tm.load_pretrained("tiny", step="post")}
for name, model in models.items():
    with torch.no_grad():
        out = tm.losses(model(batch.tokens), batch)
    print(f"{name:>10s}: " + ", ".join(f"{k} {v.item():.4f}" for k, v in out.items()))

# %% [markdown]
# ## The copying check (the workshop paper, Table 1)
#
# Replace every MASK by the token of a value m: a copying model predicts about m at the masked
# entries, so `L'_mask` (the error against m) is small. After the shift, MASK is no longer read as 0
# (row m = 0), but a substituted real value is still copied: to the model it is an observed entry.

# %%
for name, model in models.items():
    for m in (0.0, 0.44, -0.24):
        tokens = batch.tokens if m == 0.0 else batch.with_mask_value(m)
        with torch.no_grad():
            out = model(tokens)
        print(f"{name:>10s}, m = {m:+.2f}: L'_mask {tm.L_mask_prime(out, batch, m).item():.4f}")

# %% [markdown]
# ## Look inside
#
# `run_with_cache` returns TransformerLens's ActivationCache; hook names are TransformerLens's.
# Where does a masked entry look? For each head of layer 1 (0-based), the attention mass that masked
# queries put on their own row and on their own column (each including the query itself).

# %%
model = models["post-shift"]
_, cache = model.run_with_cache(batch.tokens[:128])
pattern = cache["blocks.1.attn.hook_pattern"]          # [batch, head, query_pos, key_pos]
masked = batch.masked[:128]
for head in range(model.cfg.n_heads):
    p = pattern[:, head][masked]                        # [n_masked_queries, key_pos]
    q = masked.nonzero()[:, 1]                          # their positions
    same_row = (torch.arange(16)[None] // 4 == q[:, None] // 4).float()
    same_col = (torch.arange(16)[None] % 4 == q[:, None] % 4).float()
    print(f"head {head}: attention on the query's row {(p * same_row).sum(1).mean():.2f}, "
          f"column {(p * same_col).sum(1).mean():.2f}")

# %% [markdown]
# ## Checkpoints
#
# safetensors + JSON; a run directory's latest checkpoint is found automatically.

# %%
with tempfile.TemporaryDirectory() as tmp:
    path = tm.save_checkpoint(model, os.path.join(tmp, "ckpt"), task_cfg=preset.task, step=20000)
    loaded = tm.load_checkpoint(path)
    with torch.no_grad():
        same = torch.equal(loaded(batch.tokens), model(batch.tokens))
    print("reloaded model gives identical predictions:", same)
    assert same
