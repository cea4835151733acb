"""tfmatcomp: hook-based interpretability for BERT trained on low-rank matrix completion.

Names load on first use, so ``import tfmatcomp`` is instant and ``tfmatcomp --help`` needs neither
torch nor TransformerLens; ``tfmatcomp.HookedEncoder`` (or ``from tfmatcomp import ...``) imports
what it needs.

Example:
    >>> import torch, tfmatcomp
    >>> preset = tfmatcomp.get_preset("tiny")
    >>> model = tfmatcomp.HookedEncoder(preset.model, seed=0)
    >>> task = preset.task.build()
    >>> batch = task.sample(8, generator=torch.Generator().manual_seed(0))
    >>> sorted(tfmatcomp.losses(model(batch.tokens), batch))
    ['L', 'L_mask', 'L_obs', 'mean_abs_pred_mask']
"""

from __future__ import annotations

import importlib
import sys

__version__ = "0.1.0"

#: public name -> the module that defines it (imported on first use)
_NAMES = {
    "EncoderConfig": "config", "TaskConfig": "config", "TrainConfig": "config", "Preset": "config",
    "PRESETS": "config", "get_preset": "config", "DecoderConfig": "config",
    "MatrixBatch": "task.data", "MatrixCompletionTask": "task.data",
    "ValueTokenizer": "task.tokenizer", "MASK_TOKEN_ID": "task.tokenizer",
    "HookedEncoder": "models.encoder", "UnknownHookError": "models.encoder",
    "HookedDecoder": "models.decoder",
    "losses": "task.metrics", "mse": "task.metrics", "L_mask_prime": "task.metrics",
    "CheckpointError": "runs.checkpoint", "ConfigMismatchError": "runs.checkpoint",
    "list_checkpoints": "runs.checkpoint", "load_checkpoint": "runs.checkpoint",
    "save_checkpoint": "runs.checkpoint",
    "Trainer": "training.trainer", "TrainResult": "training.trainer",
    "read_metrics": "training.trainer", "train": "training.trainer",
    "MultiSeedTrainer": "training.multiseed", "MultiSeedResult": "training.multiseed",
    "train_many": "training.multiseed",
    "load_pretrained": "pretrained",
    "sweep": "training.sweeps", "SweepResult": "training.sweeps",
}

__all__ = list(_NAMES)

# Analysis modules load on first use too (``tfmatcomp.experiments`` ...).
_SUBMODULES = {
    "task", "models", "training", "runs", "analyses", "interventions", "experiments",
    "decomposition", "geometry", "distributed", "plotting", "report", "interop",
    "pretrained", "config", "datapath", "validation",
}


def _load_names() -> None:
    """Import the modules of every public name (what ``import tfmatcomp`` did before it became
    lazy), so that after the first use ``tm.runs.checkpoint``, ``tm.training.plan``, ... are there
    as they always were."""
    for module in dict.fromkeys(_NAMES.values()):
        importlib.import_module(f"tfmatcomp.{module}")
    importlib.import_module("tfmatcomp.training.plan")


def __getattr__(name: str):
    if name in _NAMES:
        _load_names()
        value = getattr(importlib.import_module(f"tfmatcomp.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        _load_names()
        return importlib.import_module(f"tfmatcomp.{name}")
    raise AttributeError(f"module 'tfmatcomp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES) | _SUBMODULES)


if "ipykernel" in sys.modules:  # a notebook: figures that also show in exported HTML
    from tfmatcomp._progress import in_notebook as _in_notebook

    if _in_notebook():
        from tfmatcomp._notebook import auto_mode as _auto_mode

        _auto_mode()
