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

from tfmatcomp.config import PRESETS, EncoderConfig, Preset, TaskConfig, TrainConfig, get_preset
from tfmatcomp.data import MatrixBatch, MatrixCompletionTask
from tfmatcomp.metrics import L_mask_prime, losses, masked_mse
from tfmatcomp.model import HookedEncoder, UnknownHookError
from tfmatcomp.tokenizer import MASK_TOKEN_ID, ValueTokenizer
from tfmatcomp.checkpoint import (CheckpointError, ConfigMismatchError, list_checkpoints,
                                  load_checkpoint, save_checkpoint)
from tfmatcomp.training import Trainer, TrainResult, read_metrics, train

__version__ = "0.1.0"

__all__ = [
    "EncoderConfig", "TaskConfig", "TrainConfig", "Preset", "PRESETS", "get_preset",
    "MatrixBatch", "MatrixCompletionTask", "ValueTokenizer", "MASK_TOKEN_ID",
    "HookedEncoder", "UnknownHookError", "losses", "masked_mse", "L_mask_prime",
    "CheckpointError", "ConfigMismatchError", "list_checkpoints", "load_checkpoint",
    "save_checkpoint", "Trainer", "TrainResult", "read_metrics", "train",
]
