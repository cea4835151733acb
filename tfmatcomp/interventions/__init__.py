"""Composable interventions: change one thing in the model, run it, measure.

Each intervention says where it acts (:meth:`~Intervention.acts_on`) and what it does
(:meth:`~Intervention.describe`); it can be turned into TransformerLens forward hooks
(``model.run_with_hooks(tokens, fwd_hooks=iv.fwd_hooks(model))``) or applied as a context manager
(``with iv.applied(model): ...``). ``a + b`` (or :func:`compose`) composes them; the order is
documented in :mod:`tfmatcomp.interventions.base`. Every intervention (and a composition) is also
plain data: ``iv.to_dict()`` is JSON-ready and :func:`from_dict` rebuilds it
(:mod:`tfmatcomp.interventions.serialize`). See docs/interventions.md.

=================================  =========  ===============================================
intervention                       stage      acts at
=================================  =========  ===============================================
:class:`UniformAttentionAblation`  hooks      ``blocks.{l}.attn.hook_pattern``
:class:`MeanAttentionAblation`     hooks      ``blocks.{l}.attn.hook_pattern``
:class:`ActivationAblation`        hooks      any hook (heads / positions optional)
:class:`ActivationPatch`           hooks      any hook; default ``blocks.{l}.attn.hook_z``
:class:`MaskSubstitution`          tokens     ``embed.hook_embed``
:class:`WeightTransplant`          weights    parameters (default Q/K/V of all layers)
:class:`PositionalPermutation`     weights    ``embed.W_pos``
=================================  =========  ===============================================

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions import UniformAttentionAblation
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> batch = tm.get_preset("tiny").task.build().sample(16, generator=torch.Generator().manual_seed(0))
    >>> pred = UniformAttentionAblation("all").run(model, batch.tokens)
    >>> sorted(tm.losses(pred, batch))[:2]
    ['L', 'L_mask']
"""


from tfmatcomp._lazy import submodules_on_first_use
from tfmatcomp.interventions.ablation import (ActivationAblation, MeanAttentionAblation,
                                              UniformAttentionAblation)
from tfmatcomp.interventions.base import (STAGES, Composition, HookFn, Intervention, compose,
                                          order_hooks)
from tfmatcomp.interventions.during_training import (AttentionLogitScale, DuringTraining, Freeze,
                                                     Reinitialize, RowColumnAttentionPenalty,
                                                     RowColumnAttentionScale)
from tfmatcomp.interventions.patching import ActivationPatch, SampledBatch, negation_patch
from tfmatcomp.interventions.permutation import PositionalPermutation
from tfmatcomp.interventions.serialize import KINDS, from_dict, to_json
from tfmatcomp.interventions.sites import paper_heads, paper_label, resolve_heads, resolve_hook_names
from tfmatcomp.interventions.tokens import MaskSubstitution
from tfmatcomp.interventions.transplant import DonorMismatchError, WeightTransplant
from tfmatcomp.interventions.weights import parameter_override_hooks

__all__ = [
    "Intervention", "Composition", "compose", "HookFn", "STAGES", "order_hooks",
    "UniformAttentionAblation", "MeanAttentionAblation", "ActivationAblation",
    "WeightTransplant", "DonorMismatchError",
    "PositionalPermutation", "ActivationPatch", "negation_patch", "MaskSubstitution",
    "parameter_override_hooks", "paper_heads", "paper_label", "resolve_heads",
    "resolve_hook_names", "SampledBatch", "KINDS", "from_dict", "to_json",
    "DuringTraining", "AttentionLogitScale", "RowColumnAttentionScale", "RowColumnAttentionPenalty",
    "Freeze", "Reinitialize",
]


__getattr__ = submodules_on_first_use(__name__)
