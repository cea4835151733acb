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

import importlib


def __getattr__(name: str):
    """A submodule on first use (``tm.models.<module>`` without importing it first), as when
    ``import tfmatcomp`` imported everything."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
