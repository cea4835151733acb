"""Training: the one loop, the trainer, its fast step, many seeds at once.

* :mod:`~tfmatcomp.training.loop`: the one training loop and the step protocol every way of
  training plugs into;
* :mod:`~tfmatcomp.training.trainer`: :class:`Trainer` / :func:`train`, one seed;
* :mod:`~tfmatcomp.training.steps`: the float32 and fast steps a :class:`Trainer` plugs in;
* :mod:`~tfmatcomp.training.fast_step`: the bf16 / compiled step and when it is taken;
* :mod:`~tfmatcomp.training.multiseed`: :func:`train_many`, seeds batched with ``vmap``;
* :mod:`~tfmatcomp.training.plan`: :class:`RunPlan`, what an entry point decides once (configs,
  device, seeds, the step, batched or not, run directory, resume);
* :mod:`~tfmatcomp.training.sweeps`: :func:`sweep`, grids of configurations trained and
  summarized.

What differs between model kinds is :mod:`tfmatcomp.models.objectives`.

The run directory a trainer writes belongs to :mod:`tfmatcomp.runs`.
"""

from tfmatcomp._lazy import submodules_on_first_use


__getattr__ = submodules_on_first_use(__name__)
