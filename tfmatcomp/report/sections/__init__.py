"""The report's sections: each calls the library's analyses on a :class:`~.run.RunContext` and says,
in one paragraph, what it shows, with the papers' values (from :mod:`tfmatcomp.experiments.reference`
and :data:`tfmatcomp.analyses.baselines.PAPER_LAMBDA_TABLE`) beside ours.

A section function takes ``(ctx, section)`` and fills ``section.items`` (plotly figures and
DataFrames) and ``section.text``; :data:`SECTIONS` maps each key to its title and function. One
module per part of the story: :mod:`.training`, :mod:`.dynamics` (before the drop),
:mod:`.experiments` (the causal experiments), :mod:`.representations`, :mod:`.baselines`,
:mod:`.decomposition`; :mod:`.base` holds :class:`Section`.

Example:
    >>> from tfmatcomp.report.sections import DEFAULT_SECTIONS, OPT_IN_SECTIONS, SECTIONS
    >>> list(SECTIONS)[:3], DEFAULT_SECTIONS[:3], OPT_IN_SECTIONS
    (['training', 'before_drop', 'llc'], ('training', 'before_drop', 'components'), ('llc',))
"""

from __future__ import annotations

from typing import Callable

from tfmatcomp.report.run import RunContext
from tfmatcomp.report.sections.base import Section
from tfmatcomp.report.sections.baselines import _nuclear_norm, _ood
from tfmatcomp.report.sections.decomposition import _decomposition
from tfmatcomp.report.sections.dynamics import _before_drop, _llc
from tfmatcomp.report.sections.experiments import (_ablation, _copying, _head_groups, _head_scan,
                                                   _patching, _permutation, _transplant)
from tfmatcomp.report.sections.representations import (_attention, _embeddings, _positional,
                                                        _probes, _structured_masks)
from tfmatcomp.report.sections.training import _components, _training

__all__ = ["Section", "SECTIONS", "OPT_IN_SECTIONS", "DEFAULT_SECTIONS"]


SECTIONS: dict[str, tuple[str, Callable[[RunContext, Section], None]]] = {
    "training": ("Training: plateau and sudden drop", _training),
    "before_drop": ("Before the drop: progress measures and their lead", _before_drop),
    "llc": ("Before the drop: the local learning coefficient", _llc),
    "components": ("Component-wise training (Fig. 8)", _components),
    "copying": ("Copying check (Table 1)", _copying),
    "ablation": ("Uniform attention ablation", _ablation),
    "transplant": ("Weight transplant (model switching)", _transplant),
    "permutation": ("Positional permutation", _permutation),
    "patching": ("Activation patching X -> -X", _patching),
    "head_groups": ("Head-group ablation", _head_groups),
    "head_scan": ("Per-head ablation scan", _head_scan),
    "attention": ("Attention heads over training", _attention),
    "structured_masks": ("Heads under structured masks: row / column pairs", _structured_masks),
    "embeddings": ("Embeddings", _embeddings),
    "positional": ("Positional embeddings per position", _positional),
    "probes": ("Linear probes", _probes),
    "nuclear_norm": ("Nuclear-norm baseline", _nuclear_norm),
    "ood": ("Out-of-distribution inputs", _ood),
    "decomposition": ("Position / context decomposition", _decomposition),
}

#: Sections computed only when asked for by name: ``llc`` needs the optional ``llc`` extra
#: (devinterp) and takes about 40 s per checkpoint on ``tiny``.
OPT_IN_SECTIONS: tuple[str, ...] = ("llc",)
#: What a report computes by default: every section but the opt-in ones.
DEFAULT_SECTIONS: tuple[str, ...] = tuple(k for k in SECTIONS if k not in OPT_IN_SECTIONS)
