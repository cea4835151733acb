"""Run directories and checkpoints: the files a training run leaves behind.

* :mod:`~tfmatcomp.runs.layout`: the name of every file and folder in a run directory, and the one
  function that lists a run's checkpoints;
* :mod:`~tfmatcomp.runs.rundir`: the run directory's files, its lock and its resume checks;
* :mod:`~tfmatcomp.runs.checkpoint`: saving, listing and loading checkpoints;
* :mod:`~tfmatcomp.runs.checkpoint_files`: the checkpoint's files on disk (safetensors shards,
  JSON config, digests).
"""

import importlib


def __getattr__(name: str):
    """A submodule on first use (``tm.runs.<module>`` without importing it first), as when
    ``import tfmatcomp`` imported everything."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
