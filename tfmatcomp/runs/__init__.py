"""Run directories and checkpoints: the files a training run leaves behind.

* :mod:`~tfmatcomp.runs.layout`: the name of every file and folder in a run directory, and the one
  function that lists a run's checkpoints;
* :mod:`~tfmatcomp.runs.rundir`: the run directory's files, its lock and its resume checks;
* :mod:`~tfmatcomp.runs.checkpoint`: saving, listing and loading checkpoints;
* :mod:`~tfmatcomp.runs.checkpoint_files`: the checkpoint's files on disk (safetensors shards,
  JSON config, digests).
"""

from tfmatcomp._lazy import submodules_on_first_use


__getattr__ = submodules_on_first_use(__name__)
