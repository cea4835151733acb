"""The matrix-completion task: sampling, masks, tokens and losses (below the models).

* :mod:`~tfmatcomp.task.data`: low-rank matrices, masks, tokenized batches, X -> -X;
* :mod:`~tfmatcomp.task.masks`: which entries a batch hides;
* :mod:`~tfmatcomp.task.tokenizer`: values <-> token ids (the papers' grid of 0.01);
* :mod:`~tfmatcomp.task.metrics`: ``L``, ``L_mask``, ``L_obs`` and ``L'_mask``;
* :mod:`~tfmatcomp.task.gpt`: the GPT (decoder) variant of the task.
"""

import importlib


def __getattr__(name: str):
    """A submodule on first use (``tm.task.<module>`` without importing it first), as when
    ``import tfmatcomp`` imported everything."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
