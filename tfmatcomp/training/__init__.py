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

import importlib


def __getattr__(name: str):
    """A submodule on first use (``tm.training.<module>`` without importing it first), as when
    ``import tfmatcomp`` imported everything."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
