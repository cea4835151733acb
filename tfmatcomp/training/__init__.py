"""Training: the trainer, its fast step, many seeds at once, and sweeps.

* :mod:`~tfmatcomp.training.loop`: the one training loop and the step protocol every way of
  training plugs into;
* :mod:`~tfmatcomp.training.objectives`: one objective per model kind (encoder, decoder);
* :mod:`~tfmatcomp.training.trainer`: :class:`Trainer` / :func:`train`, one seed;
* :mod:`~tfmatcomp.training.steps`: the float32 and fast steps a :class:`Trainer` plugs in;
* :mod:`~tfmatcomp.training.fast_step`: the bf16 / compiled step and when it is taken;
* :mod:`~tfmatcomp.training.multiseed`: :func:`train_many`, seeds batched with ``vmap``;
* :mod:`~tfmatcomp.training.sweeps`: :func:`sweep` over configurations.

The run directory a trainer writes belongs to :mod:`tfmatcomp.runs`.
"""
