"""The hooked models: encoder, decoder, their cache and hook names, built from ``components``.

* :mod:`~tfmatcomp.models.components`: the transformer math, one small module per idea;
* :mod:`~tfmatcomp.models.hooked_base`: what both models share (hooks, caching, devices);
* :mod:`~tfmatcomp.models.encoder`: :class:`HookedEncoder`, the papers' post-LN BERT;
* :mod:`~tfmatcomp.models.decoder`: :class:`HookedDecoder`, a pre-LN GPT;
* :mod:`~tfmatcomp.models.cache`, :mod:`~tfmatcomp.models.hook_names`,
  :mod:`~tfmatcomp.models.param_groups`: caches, hook names, named groups of weights;
* :mod:`~tfmatcomp.models.conversion`: to and from HuggingFace BERT and GPT-2;
* :mod:`~tfmatcomp.models.objectives`: what differs between model kinds in training (tokens,
  loss, metrics), one objective per kind, registered once.
"""

from tfmatcomp._lazy import submodules_on_first_use


__getattr__ = submodules_on_first_use(__name__)
