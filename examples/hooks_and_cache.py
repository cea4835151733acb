# %% [markdown]
# # Hooks and the activation cache
#
# The hook names and shapes of `HookedEncoder`, the post-LN identities between them, and three ways
# of editing activations: `run_with_hooks`, the `hooks()` context manager, and the library's
# intervention objects. Ends with a per-head ablation scan written by hand.
#
# Uses the post-shift checkpoint of the run bundled in the package; runs offline on a CPU in
# seconds.

# %%
import pandas as pd
import torch

import tfmatcomp as tm
from tfmatcomp.interventions import UniformAttentionAblation

model = tm.load_pretrained("tiny", step="post")          # the tiny preset after its drop
batch = tm.get_preset("tiny").task.build().sample(256, generator=torch.Generator().manual_seed(0))

# %% [markdown]
# ## Every hook and its shape
#
# Layers are 0-based. (The papers label them from 1.)

# %%
predictions, cache = model.run_with_cache(batch.tokens)
shapes = pd.DataFrame(
    [(name, tuple(cache[name].shape)) for name in model.hook_dict
     if name in cache and not name.startswith("blocks.1.")],
    columns=["hook", "shape"])
print(shapes.to_string(index=False))
print(f"... and the same for blocks.1; {len(cache)} cached activations in all")

# %% [markdown]
# ## Post-LN identities
#
# BERT normalizes after each residual addition, so a block's output is `ln2(resid_post)`, which is
# the next block's `resid_pre`; `resid_post` itself is not. A LayerNorm's `hook_normalized` is
# TransformerLens's `(x - mean) / scale`, *before* its gain `w` and bias `b`; the full LayerNorm
# outputs are `hook_normalized_resid_mid` (LN1, the MLP input) and `hook_normalized_resid_post` (LN2).

# %%
c = cache
assert torch.allclose(c["blocks.0.hook_resid_mid"],
                      c["blocks.0.hook_resid_pre"] + c["blocks.0.hook_attn_out"], atol=1e-5)
assert torch.allclose(c["blocks.0.hook_resid_post"],
                      c["blocks.0.hook_normalized_resid_mid"] + c["blocks.0.hook_mlp_out"], atol=1e-5)
assert torch.equal(c["blocks.0.hook_normalized_resid_post"], c["blocks.1.hook_resid_pre"])
ln1 = model.blocks[0].ln1
assert torch.allclose(c["blocks.0.hook_normalized_resid_mid"],
                      c["blocks.0.ln1.hook_normalized"] * ln1.w + ln1.b, atol=1e-5)
assert torch.allclose(c["blocks.0.attn.hook_pattern"].sum(-1), torch.tensor(1.0), atol=1e-5)
print("identities hold")

# %% [markdown]
# Masked positions carry only their positional embedding: the MASK row of `W_E` is zero.

# %%
print("token embedding norm at masked entries:",
      c["embed.hook_embed"][batch.masked].norm(dim=-1).max().item())

# %% [markdown]
# ## Only what you need: `names_filter`

# %%
_, small = model.run_with_cache(batch.tokens, names_filter=lambda name: name.endswith("hook_z"))
print(sorted(small.keys()))

# %% [markdown]
# ## Editing activations
#
# A hook gets the activation and the HookPoint and returns the replacement. Here: zero the output
# of head 1 in layer 1 (`hook_z` is `[batch, pos, head, d_head]`), the head that puts most of a
# masked entry's attention on its own row.

# %%
def zero_head(head):
    def hook(z, hook):
        z = z.clone()
        z[:, :, head] = 0
        return z
    return hook


base = tm.losses(predictions, batch)
with torch.no_grad():
    edited = model.run_with_hooks(batch.tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head(1))])
after = tm.losses(edited, batch)
for key in ("L_obs", "L_mask"):
    print(f"{key}: {base[key].item():.4f} -> {after[key].item():.4f}")

# %% [markdown]
# The same with the `hooks()` context manager, and with an intervention object (the papers'
# uniform attention ablation of every head). No hook stays registered afterwards.

# %%
with model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero_head(1))]), torch.no_grad():
    assert torch.equal(model(batch.tokens), edited)

with torch.no_grad():
    ablated = UniformAttentionAblation("all").run(model, batch.tokens)
print("all heads uniform:", {k: round(v.item(), 4) for k, v in tm.losses(ablated, batch).items()})
assert model.active_hook_count() == 0

# %% [markdown]
# ## A per-head ablation scan, by hand
#
# Make one head's pattern uniform (1/n over the n keys) and record the change in `L_obs` and
# `L_mask`. (`tfmatcomp.experiments` has this scan ready-made.)

# %%
def uniform_head(head):
    def hook(pattern, hook):
        pattern = pattern.clone()
        pattern[:, head] = 1.0 / pattern.shape[-1]
        return pattern
    return hook


rows = []
for layer in range(model.cfg.n_layers):
    for head in range(model.cfg.n_heads):
        with torch.no_grad():
            out = model.run_with_hooks(
                batch.tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", uniform_head(head))])
        loss = tm.losses(out, batch)
        rows.append({"layer": layer, "head": head, "paper_label": f"({layer + 1}, {head + 1})",
                     "dL_obs": (loss["L_obs"] - base["L_obs"]).item(),
                     "dL_mask": (loss["L_mask"] - base["L_mask"]).item()})
print(pd.DataFrame(rows).to_string(index=False, float_format="%+.1e"))
