"""Training: the trainer, its fast step, many seeds at once, and sweeps.

* :mod:`~tfmatcomp.training.trainer`: :class:`Trainer` / :func:`train`, one seed;
* :mod:`~tfmatcomp.training.fast_step`: the bf16 / compiled step and when it is taken;
* :mod:`~tfmatcomp.training.multiseed`: :func:`train_many`, seeds batched with ``vmap``;
* :mod:`~tfmatcomp.training.sweeps`: :func:`sweep` over configurations.

The run directory a trainer writes belongs to :mod:`tfmatcomp.runs`.
"""
