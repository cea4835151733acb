"""Analyses of trained models that are not interventions.

* :mod:`~tfmatcomp.analyses.probes`: linear probes by layer;
* :mod:`~tfmatcomp.analyses.embeddings`: embedding norms, PCA and clustering;
* :mod:`~tfmatcomp.analyses.heads`: attention-head scores and the head taxonomy;
* :mod:`~tfmatcomp.analyses.dynamics`: the drop in the loss curve, component-wise training;
* :mod:`~tfmatcomp.analyses.baselines`: nuclear-norm minimization and its comparison;
* :mod:`~tfmatcomp.analyses.ood`: out-of-distribution inputs;
"""

from tfmatcomp._lazy import submodules_on_first_use


__getattr__ = submodules_on_first_use(__name__)
