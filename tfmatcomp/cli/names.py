"""The names the command line offers, written out so that ``tfmatcomp --help`` (and every
command's help) imports neither torch nor TransformerLens. ``tests/test_cli.py`` checks each list
against the library's own (``tfmatcomp.config.PRESETS``, the report's sections, ...)."""

from __future__ import annotations

#: ``tfmatcomp.config.PRESETS``
PRESETS = ("gpt-tiny", "paper-12l12h", "paper-4l8h", "paper-cpu", "tiny")
#: the presets whose model is an encoder (what ``demo`` trains and reports on)
ENCODER_PRESETS = ("paper-12l12h", "paper-4l8h", "paper-cpu", "tiny")
#: ``tfmatcomp.task.data.DISTRIBUTIONS``
DISTRIBUTIONS = ("uniform", "gaussian", "laplace", "gaussian_matched", "laplace_matched")
#: ``tfmatcomp.report.sections.SECTIONS``, in the report's order
REPORT_SECTIONS = ("training", "before_drop", "llc", "components", "copying", "ablation",
                   "transplant", "permutation", "patching", "head_groups", "head_scan",
                   "attention", "structured_masks", "embeddings", "positional", "probes",
                   "nuclear_norm", "ood", "decomposition")
#: the report's sections that run only when asked for (``DEFAULT_SECTIONS`` is the rest)
OPT_IN_SECTIONS = ("llc",)
#: ``tfmatcomp.analyses.dynamics.progress.PROGRESS_MEASURES``
MEASURES = ("L_mask", "row_column_attention_mass", "representation_collapse", "copying",
            "positional_rank")
#: the sections of ``tfmatcomp geometry``
GEOMETRY_SECTIONS = ("table1", "pca", "gram", "clusters", "qk", "theory", "induction")
