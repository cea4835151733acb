"""Attention-head analysis: mean attention maps and a geometric head taxonomy.

The papers (the workshop paper Section 3 and Appendices E, G, H; the NeurIPS paper Section 3.2.2 and Appendix M) read
the 4L8H model's attention maps averaged over samples, under random masks and under structured
masks (:mod:`tfmatcomp.task.masks`), and name head types:

* **row** heads attend to the query's row (block-diagonal maps), **column** heads to its column
  ("parallel off-diagonal" maps), **identity** heads to the query itself (diagonal maps);
* **masked-row** heads are active mainly for queries in masked rows, where they attend to the
  (only) observed entries of that row;
* **observed-copy** heads are roughly identity maps, except that masked queries attend to the
  observed entries of their row;
* **mask-ignore** ("observed-only") heads put their attention on observed entries only;
* **longest-contiguous-column** heads attend, in each row, to the entry in the column with the
  longest contiguous run of observed entries;
* **input-processing** heads (first layer) are static across masks and inputs.

This package turns each description into a score computed from the attention probabilities
(``blocks.{l}.attn.hook_pattern``, ``[batch, head, query, key]``) and the mask, then classifies
heads by thresholds. Its modules:

* :mod:`tfmatcomp.analyses.heads.scores`: the registry :data:`SCORES`, where each score's name, definition
  and computation are written once (``print(score_table())`` shows the definitions; the Heads guide
  renders the same table), the streaming :class:`HeadScoreAccumulator` and :func:`head_scores`;
* :mod:`tfmatcomp.analyses.heads.classify`: :class:`HeadThresholds` and :func:`classify_heads` (one ``type``
  per head by a priority order, and every passing type);
* :mod:`tfmatcomp.analyses.heads.analysis`: a model's maps on samples of a task (:func:`analyse_heads`) and
  across checkpoints (:func:`head_score_evolution`).
* :mod:`tfmatcomp.analyses.heads.groups`: head groups from a model's own labels
  (:func:`label_head_groups`: the heads that are neither row, column nor identity heads, and the
  row + column heads) and their ablation (:func:`label_group_ablation`), the workshop paper's
  "uninterpretable heads" test for any shape.

Layers and heads are 0-based (``layer``, ``head`` columns); ``paper_label`` is the papers' 1-based
``"(layer, head)"`` (:func:`tfmatcomp.interventions.sites.paper_label`, re-exported here).

Example:
    >>> import torch
    >>> from tfmatcomp import HookedEncoder, EncoderConfig, MatrixCompletionTask
    >>> from tfmatcomp.analyses.heads import analyse_heads
    >>> model = HookedEncoder(EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
    >>> task = MatrixCompletionTask(n_rows=4, rank=1)
    >>> res = analyse_heads(model, task, n_samples=8, generator=torch.Generator().manual_seed(0))
    >>> res.mean_patterns.shape, res.table["paper_label"].tolist()
    (torch.Size([2, 2, 16, 16]), ['(1,1)', '(1,2)', '(2,1)', '(2,2)'])
"""

from __future__ import annotations

from tfmatcomp.analyses.heads.analysis import (HeadAnalysis, analyse_heads, attention_patterns, head_score_evolution,
                                      mean_attention_patterns)
from tfmatcomp.analyses.heads.classify import HEAD_TYPES, TYPE_SCORE, HeadThresholds, classify_heads
from tfmatcomp.analyses.heads.groups import (INTERPRETABLE_TYPES, LABEL_GROUPS, label_group_ablation,
                                            label_head_groups)
from tfmatcomp.analyses.heads.scores import (SCORE_COLUMNS, SCORES, HeadScore, HeadScoreAccumulator, Pooled,
                                    head_scores, score_table)
from tfmatcomp.models.hook_names import pattern_hook_names
from tfmatcomp.interventions.sites import paper_label

__all__ = [
    "HEAD_TYPES",
    "SCORE_COLUMNS",
    "SCORES",
    "TYPE_SCORE",
    "HeadScore",
    "Pooled",
    "score_table",
    "HeadThresholds",
    "HeadScoreAccumulator",
    "HeadAnalysis",
    "pattern_hook_names",
    "attention_patterns",
    "mean_attention_patterns",
    "head_scores",
    "classify_heads",
    "analyse_heads",
    "head_score_evolution",
    "INTERPRETABLE_TYPES",
    "LABEL_GROUPS",
    "label_head_groups",
    "label_group_ablation",
    "paper_label",
]
