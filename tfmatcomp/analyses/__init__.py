"""Analyses of trained models that are not interventions.

* :mod:`~tfmatcomp.analyses.probes`: linear probes by layer;
* :mod:`~tfmatcomp.analyses.embeddings`: embedding norms, PCA and clustering;
* :mod:`~tfmatcomp.analyses.heads`: attention-head scores and the head taxonomy;
* :mod:`~tfmatcomp.analyses.dynamics`: the drop in the loss curve, component-wise training;
* :mod:`~tfmatcomp.analyses.baselines`: nuclear-norm minimization and its comparison;
* :mod:`~tfmatcomp.analyses.ood`: out-of-distribution inputs;
"""

import importlib


def __getattr__(name: str):
    """A submodule on first use (``tm.analyses.<module>`` without importing it first), as when
    ``import tfmatcomp`` imported everything."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
