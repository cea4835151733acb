"""Plotly figures, one module per analysis area; every function returns a plotly.graph_objects.Figure.

================================  ==========================================================
module                            figures
================================  ==========================================================
:mod:`.dynamics`                  loss curve with the drop, seeds' curves and onsets, components
:mod:`.experiments`               per-head ablation scan, patching bars, loss bars
:mod:`.heads`                     attention grids, head scores / types, score evolution
:mod:`.embeddings`                token norms and PCA, positional PCA, checkpoint projection
:mod:`.probes`                    probe metrics per layer
:mod:`.baselines`                 model vs nuclear norm, lambda table, OOD bars
:mod:`.decomposition`             pos PCA, Gram heatmap, spectra / DCT, QK components
:mod:`.geometry`                  Table 1 per layer, clusters, rotated W_QK, theorems measured
:mod:`.sweeps`                    final L_mask and drop step against a swept value
================================  ==========================================================

In a notebook, figures show in JupyterLab, VS Code and in static HTML (``jupyter nbconvert --to
html``), offline, with no setup call: importing this package in a kernel switches plotly's default
renderer (:mod:`.notebook`). :func:`attention_view` draws one matrix's attention, every head.

Example:
    >>> import tfmatcomp.plotting as tp
    >>> callable(tp.loss_curve_figure) and callable(tp.attention_grid_figure)
    True
"""

from tfmatcomp.plotting.baselines import lambda_table_figure, model_vs_nuclear_norm_figure, ood_figure
from tfmatcomp.plotting.decomposition import gram_figure, pos_pca_figure, qk_figure, spectrum_figure
from tfmatcomp.plotting.dynamics import (component_training_figure, drop_steps_figure,
                                         loss_curve_figure, seed_curves_figure)
from tfmatcomp.plotting.geometry import (label_similarity_figure, layer_measurements_figure,
                                         rotated_wqk_figure, theorem1_figure, theorem2_figure)
from tfmatcomp.plotting.embeddings import (checkpoint_projection_figure, positional_norms_figure,
                                           positional_pca_figure, token_norms_figure,
                                           token_pca_figure)
from tfmatcomp.plotting.experiments import head_scan_heatmap, loss_bars_figure, patching_figure
from tfmatcomp.plotting.notebook import auto_mode as _auto_mode, notebook_mode
from tfmatcomp.plotting.attention import attention_view
from tfmatcomp.plotting.heads import (attention_grid_figure, head_score_evolution_figure,
                                      head_scores_figure, head_types_figure,
                                      structured_mask_pairs_figure)
from tfmatcomp.plotting.probes import probe_table_figure
from tfmatcomp.plotting.sweeps import sweep_figure

__all__ = [
    "loss_curve_figure", "component_training_figure", "seed_curves_figure", "drop_steps_figure",
    "head_scan_heatmap", "patching_figure",
    "loss_bars_figure", "attention_grid_figure", "head_scores_figure", "head_types_figure",
    "head_score_evolution_figure", "token_norms_figure", "token_pca_figure",
    "positional_norms_figure", "positional_pca_figure", "checkpoint_projection_figure",
    "probe_table_figure", "model_vs_nuclear_norm_figure", "lambda_table_figure", "ood_figure",
    "pos_pca_figure", "gram_figure", "spectrum_figure", "qk_figure",
    "layer_measurements_figure", "label_similarity_figure", "rotated_wqk_figure", "theorem1_figure",
    "theorem2_figure", "sweep_figure", "structured_mask_pairs_figure", "notebook_mode", "attention_view",
]

_auto_mode()   # in a notebook kernel: figures that also show in exported HTML
