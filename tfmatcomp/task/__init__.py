"""The matrix-completion task: sampling, masks, tokens and losses (below the models).

* :mod:`~tfmatcomp.task.data`: low-rank matrices, masks, tokenized batches, X -> -X;
* :mod:`~tfmatcomp.task.masks`: which entries a batch hides;
* :mod:`~tfmatcomp.task.tokenizer`: values <-> token ids (the papers' grid of 0.01);
* :mod:`~tfmatcomp.task.metrics`: ``L``, ``L_mask``, ``L_obs`` and ``L'_mask``;
* :mod:`~tfmatcomp.task.gpt`: the GPT (decoder) variant of the task.
"""

from tfmatcomp._lazy import submodules_on_first_use


__getattr__ = submodules_on_first_use(__name__)
