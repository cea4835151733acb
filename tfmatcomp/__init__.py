"""tfmatcomp: hook-based interpretability for BERT trained on low-rank matrix completion.

Example:
    >>> import torch, tfmatcomp
    >>> preset = tfmatcomp.get_preset("tiny")
    >>> model = tfmatcomp.HookedEncoder(preset.model, seed=0)
    >>> task = preset.task.build()
    >>> batch = task.sample(8, generator=torch.Generator().manual_seed(0))
    >>> sorted(tfmatcomp.losses(model(batch.tokens), batch))
    ['L', 'L_mask', 'L_obs', 'mean_abs_pred_mask']
"""

from tfmatcomp.config import (PRESETS, DecoderConfig, EncoderConfig, Preset, TaskConfig, TrainConfig,
                              get_preset)
from tfmatcomp.task.data import MatrixBatch, MatrixCompletionTask
from tfmatcomp.task.metrics import L_mask_prime, losses, mse
from tfmatcomp.models.encoder import HookedEncoder, UnknownHookError
from tfmatcomp.models.decoder import HookedDecoder
from tfmatcomp.task.tokenizer import MASK_TOKEN_ID, ValueTokenizer
from tfmatcomp.runs.checkpoint import (CheckpointError, ConfigMismatchError, list_checkpoints,
                                  load_checkpoint, save_checkpoint)
from tfmatcomp.training.trainer import Trainer, TrainResult, read_metrics, train
from tfmatcomp.training.multiseed import MultiSeedResult, MultiSeedTrainer, train_many
from tfmatcomp.pretrained import load_pretrained
from tfmatcomp.training.sweeps import SweepResult, sweep

__version__ = "0.1.0"

__all__ = [
    "EncoderConfig", "TaskConfig", "TrainConfig", "Preset", "PRESETS", "get_preset",
    "MatrixBatch", "MatrixCompletionTask", "ValueTokenizer", "MASK_TOKEN_ID",
    "HookedEncoder", "HookedDecoder", "DecoderConfig", "UnknownHookError", "losses", "mse",
    "L_mask_prime",
    "CheckpointError", "ConfigMismatchError", "list_checkpoints", "load_checkpoint",
    "save_checkpoint", "Trainer", "TrainResult", "read_metrics", "train", "train_many",
    "MultiSeedTrainer", "MultiSeedResult", "load_pretrained", "sweep", "SweepResult",
]

# Analysis modules load on first use (``tfmatcomp.experiments`` ...), so ``import tfmatcomp`` stays
# light: plotly, scipy and cvxpy are imported only by the analyses that need them.
_SUBMODULES = {
    "task", "models", "training", "runs", "analyses", "interventions", "experiments",
    "decomposition", "geometry", "distributed", "plotting", "report", "interop",
    "pretrained",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"tfmatcomp.{name}")
    raise AttributeError(f"module 'tfmatcomp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES)
