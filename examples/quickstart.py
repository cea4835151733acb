# %% [markdown]
# # Quickstart
#
# Train the CPU `tiny` preset briefly, measure the papers' losses, check that the young model
# *copies* its input, look at an attention pattern, and save / load a checkpoint.
#
# Runs offline on a CPU in well under a minute. `TFMATCOMP_EXAMPLE_STEPS` sets the number of
# training steps (CI uses fewer).

# %%
import os
import tempfile

import torch

import tfmatcomp as tm

STEPS = int(os.environ.get("TFMATCOMP_EXAMPLE_STEPS", "150"))

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
model, task = result.model, preset.task.build()
print(result.metrics[["step", "train_L_obs", "eval_L_obs", "eval_L_mask"]].to_string(index=False))

# %% [markdown]
# ## Measure
#
# Losses pool the entries of the whole batch (see docs/concepts/conventions.md).

# %%
batch = task.sample(512, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    predictions = model(batch.tokens)
for name, value in tm.losses(predictions, batch).items():
    print(f"{name:>20s} {value.item():.4f}")

# %% [markdown]
# ## The copying check (seed 000, Table 1)
#
# Replace every MASK by the token of a value m: a copying model predicts about m at the masked
# entries, so `L'_mask` (the error against m) is small while `L_mask` (against the truth) is not.

# %%
for m in (0.0, 0.44, -0.24):
    tokens = batch.tokens if m == 0.0 else batch.with_mask_value(m)
    with torch.no_grad():
        out = model(tokens)
    print(f"m = {m:+.2f}: L'_mask {tm.L_mask_prime(out, batch, m).item():.4f}, "
          f"L_obs {tm.losses(out, batch)['L_obs'].item():.4f}")

# %% [markdown]
# ## Look inside
#
# `run_with_cache` returns TransformerLens's ActivationCache; hook names are TransformerLens's.

# %%
_, cache = model.run_with_cache(batch.tokens[:64])
pattern = cache["blocks.0.attn.hook_pattern"]          # [batch, head, query_pos, key_pos]
print("pattern", tuple(pattern.shape))
print("mean attention of head 0 (layer 0), query position 5, over the 16 keys:")
print(pattern[:, 0, 5].mean(0).view(4, 4).numpy().round(3))

# %% [markdown]
# ## Checkpoints
#
# safetensors + JSON; a run directory's latest checkpoint is found automatically.

# %%
with tempfile.TemporaryDirectory() as tmp:
    path = tm.save_checkpoint(model, os.path.join(tmp, "ckpt"), task_cfg=preset.task, step=STEPS)
    loaded = tm.load_checkpoint(path)
    with torch.no_grad():
        same = torch.equal(loaded(batch.tokens), predictions)
    print("reloaded model gives identical predictions:", same)
    assert same
