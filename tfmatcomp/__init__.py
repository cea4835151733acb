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
from tfmatcomp.data import MatrixBatch, MatrixCompletionTask
from tfmatcomp.metrics import L_mask_prime, losses, masked_mse
from tfmatcomp.model import HookedEncoder, UnknownHookError
from tfmatcomp.decoder import HookedDecoder
from tfmatcomp.tokenizer import MASK_TOKEN_ID, ValueTokenizer
from tfmatcomp.checkpoint import (CheckpointError, ConfigMismatchError, list_checkpoints,
                                  load_checkpoint, save_checkpoint)
from tfmatcomp.training import Trainer, TrainResult, read_metrics, train
from tfmatcomp.multiseed import MultiSeedResult, MultiSeedTrainer, train_many
from tfmatcomp.pretrained import load_pretrained
from tfmatcomp.sweeps import SweepResult, sweep

__version__ = "0.1.0"

__all__ = [
    "EncoderConfig", "TaskConfig", "TrainConfig", "Preset", "PRESETS", "get_preset",
    "MatrixBatch", "MatrixCompletionTask", "ValueTokenizer", "MASK_TOKEN_ID",
    "HookedEncoder", "HookedDecoder", "DecoderConfig", "UnknownHookError", "losses", "masked_mse",
    "L_mask_prime",
    "CheckpointError", "ConfigMismatchError", "list_checkpoints", "load_checkpoint",
    "save_checkpoint", "Trainer", "TrainResult", "read_metrics", "train", "train_many",
    "MultiSeedTrainer", "MultiSeedResult", "load_pretrained", "sweep", "SweepResult",
]

# Analysis modules load on first use (``tfmatcomp.experiments`` ...), so ``import tfmatcomp`` stays
# light: plotly, scipy and cvxpy are imported only by the analyses that need them.
_SUBMODULES = {
    "interventions", "experiments", "decomposition", "geometry", "probes", "embeddings", "heads",
    "masks", "baselines", "dynamics", "ood", "plotting", "report", "convert", "pretrained",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"tfmatcomp.{name}")
    raise AttributeError(f"module 'tfmatcomp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SUBMODULES)
