"""The papers' causal experiments as functions that return tidy pandas tables.

The common arguments, which each function's docstring refers to rather than repeats:

* ``models``: a :class:`~tfmatcomp.HookedEncoder` or :class:`~tfmatcomp.HookedDecoder`, a
  checkpoint path, or ``{label: model or path}``; the papers' own model (4 layers, 8 heads,
  d_model 768: :func:`is_papers_model`) labelled ``"pre-shift"`` / ``"post-shift"`` gets the
  papers' numbers in ``paper_4l8h_*`` columns (other models get no such columns).
* ``task``: the matrix task (default: the checkpoints' own).
* ``n_samples``: matrices (the papers' counts by default, 256 for most).
* ``seed``: seeds the batch (the same for every condition); the same seed gives the same table.
* ``batch_size``: matrices per forward pass.
* ``progress``: a progress bar; None (default) shows one on a terminal or in a notebook and none
  in a pipe or under pytest (:mod:`tfmatcomp._progress`), True / False force it.

Tables keep each row's intervention as JSON in ``df.attrs["interventions"]``;
:func:`with_interventions` adds it as a column.
See docs/interventions.md. Head groups from a model's own head labels (the workshop paper's
"uninterpretable" test for any shape) sit one layer up, with the labels:
:func:`tfmatcomp.analyses.heads.label_group_ablation`.

=============================  ======================================================  ==========
function                       what                                                    paper
=============================  ======================================================  ==========
:func:`copying_check`          L'_mask, L_obs with MASK -> m, low-rank and random      Table 1
:func:`attention_ablation`     losses with / without ablating all (or some) heads      3.1.2, 3.2.1
:func:`weight_transplant`      Q/K/V (or other) transplant pre <-> post                3.1.2, 3.2.1
:func:`positional_permutation` losses with permuted positional embeddings              3.2.1
:func:`permutation_summary`    mean / std / min / max over the permutations            3.2.1
:func:`activation_patching`    X -> -X patch at hook_z: all, per layer, per head       App. J
:func:`head_group_ablation`    head groups, losses without / with and ratios           002 App. L
:func:`head_ablation_scan`     layers x heads table of the change in L_mask            (ours)
:func:`attention_change`       per head: attention on same row / column / self / SEP   001 Fig. 12
=============================  ======================================================  ==========

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments import attention_ablation
    >>> df = attention_ablation(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=16)
    >>> list(df.columns)[:6]
    ['model', 'heads', 'variant', 'condition', 'L', 'L_obs']
"""


from tfmatcomp._lazy import submodules_on_first_use
from tfmatcomp.experiments.attention_change import attention_change, attention_targets
from tfmatcomp.experiments.ablation import attention_ablation, head_ablation_scan, head_group_ablation
from tfmatcomp.experiments.copying import copying_check
from tfmatcomp.experiments.patching import activation_patching
from tfmatcomp.experiments.permutation import permutation_summary, positional_permutation
from tfmatcomp.experiments.reference import PAPER_HEAD_GROUPS, PAPER_LABEL
from tfmatcomp.experiments.table import is_papers_model, with_interventions
from tfmatcomp.experiments.transplant import weight_transplant

__all__ = [
    "copying_check", "attention_ablation", "weight_transplant", "positional_permutation",
    "permutation_summary",
    "activation_patching", "head_group_ablation", "head_ablation_scan", "PAPER_HEAD_GROUPS",
    "PAPER_LABEL", "attention_change", "attention_targets", "with_interventions", "is_papers_model",
]


__getattr__ = submodules_on_first_use(__name__)
