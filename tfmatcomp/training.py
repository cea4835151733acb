"""Online training on matrix completion: a fresh batch every step, Adam at a constant rate, MSE.

Seeded and resumable: the model, the training stream and the evaluation stream each have their own
seeded generator, and a checkpoint stores the optimizer and both generators, so resuming continues
the exact trajectory of an uninterrupted run.

Conventions of the metrics log (``RUN_DIR/metrics.jsonl``, one JSON object per logged step):

* ``train_*``: losses of that step's training batch, measured in the forward pass that the update
  used (before the update).
* ``eval_*``: losses on a fresh evaluation batch, measured after the update.
* the checkpoint at step ``s`` holds the weights after ``s`` updates.

Example:
    >>> import tfmatcomp as tm
    >>> result = tm.train("tiny", n_steps=20, batch_size=16, log_every=10, progress=False)
    >>> list(result.metrics["step"])
    [10, 20]
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch
from tqdm.auto import tqdm

from tfmatcomp.checkpoint import (
    ConfigMismatchError, checkpoint_dir_name, latest_checkpoint, list_checkpoints,
    load_checkpoint_info, load_training_state, save_checkpoint,
)
from tfmatcomp.config import EncoderConfig, Preset, TaskConfig, TrainConfig, get_preset
from tfmatcomp.metrics import losses, masked_mse
from tfmatcomp.model import HookedEncoder

__all__ = ["Trainer", "TrainResult", "train", "read_metrics", "default_device"]

METRICS_FILE = "metrics.jsonl"


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    model: HookedEncoder
    metrics: pd.DataFrame
    out_dir: Path | None
    step: int


class Trainer:
    """Online trainer. Prefer :func:`train` unless you need to drive it step by step.

    Args:
        preset: name or :class:`Preset` supplying defaults for the three configs.
        model_cfg, task_cfg, train_cfg: override the preset's configs.
        out_dir: run directory for ``metrics.jsonl`` and ``checkpoints/``; None keeps everything in
            memory (no checkpoints, no resume).
        device: training device (default: CUDA when present, else CPU).
        model: start from this model instead of a fresh one (its config must equal ``model_cfg``
            when both are given).
        trainable: predicate on parameter names; only matching parameters are optimized, the others
            are frozen (used by component-wise training). Default: all.
        progress: show a tqdm progress bar with the current losses.
        train_overrides: :class:`TrainConfig` fields (``n_steps=300, lr=1e-3, ...``).
    """

    def __init__(
        self,
        preset: str | Preset = "tiny",
        *,
        model_cfg: EncoderConfig | None = None,
        task_cfg: TaskConfig | None = None,
        train_cfg: TrainConfig | None = None,
        out_dir: str | os.PathLike | None = None,
        device: torch.device | str | None = None,
        model: HookedEncoder | None = None,
        trainable: Callable[[str], bool] | None = None,
        progress: bool = True,
        **train_overrides: Any,
    ):
        preset = get_preset(preset)
        if model is not None and model_cfg is None:
            model_cfg = model.cfg
        self.model_cfg = model_cfg or preset.model
        self.task_cfg = task_cfg or preset.task
        self.train_cfg = replace(train_cfg or preset.train, **train_overrides)
        self.task = self.task_cfg.build()
        if self.task.n_positions > self.model_cfg.n_ctx:
            raise ValueError(f"task_cfg: {self.task.n_rows}x{self.task.n_cols} matrices need "
                             f"{self.task.n_positions} positions but model_cfg.n_ctx is "
                             f"{self.model_cfg.n_ctx}")
        self.device = torch.device(device) if device is not None else default_device()
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.progress = progress
        self.trainable = trainable
        seed = self.train_cfg.seed
        if model is None:
            model = HookedEncoder(self.model_cfg, seed=seed)
        elif model.cfg != self.model_cfg:
            raise ConfigMismatchError("model: its config differs from model_cfg")
        self.model = model.to(self.device).train()
        params = [p for n, p in self.model.named_parameters() if trainable is None or trainable(n)]
        if trainable is not None:
            for n, p in self.model.named_parameters():
                p.requires_grad_(trainable(n))
        if not params:
            raise ValueError("trainable: selects no parameter")
        self.optimizer = torch.optim.Adam(params, lr=self.train_cfg.lr)
        self.train_gen = torch.Generator(self.device).manual_seed(seed + 1)
        self.eval_gen = torch.Generator(self.device).manual_seed(seed + 2)
        self.step = 0
        self.elapsed_s = 0.0
        self.records: list[dict[str, Any]] = []

    # ------------------------------------------------------------ state
    def training_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, json_state)``: everything besides the weights needed to resume exactly."""
        opt = self.optimizer.state_dict()
        tensors: dict[str, torch.Tensor] = {
            "rng.train": self.train_gen.get_state(), "rng.eval": self.eval_gen.get_state()}
        for idx, st in opt["state"].items():
            for key, value in st.items():
                tensors[f"optimizer.{idx}.{key}"] = torch.as_tensor(value)
        state = {"step": self.step, "elapsed_s": self.elapsed_s,
                 "param_groups": opt["param_groups"],
                 "trainable": [n for n, p in self.model.named_parameters() if p.requires_grad]}
        return tensors, state

    def load_training_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        trainable = [n for n, p in self.model.named_parameters() if p.requires_grad]
        if state.get("trainable", trainable) != trainable:
            raise ConfigMismatchError("trainable: the checkpoint was trained with a different set "
                                      "of trainable parameters")
        opt_state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, idx, name = key.split(".", 2)
                opt_state.setdefault(int(idx), {})[name] = value
        self.optimizer.load_state_dict({"state": opt_state, "param_groups": state["param_groups"]})
        self.train_gen.set_state(tensors["rng.train"])
        self.eval_gen.set_state(tensors["rng.eval"])
        self.step = int(state["step"])
        self.elapsed_s = float(state.get("elapsed_s", 0.0))

    def save(self, strip_older: bool = True) -> Path:
        """Write a checkpoint for the current step (with training state). Older checkpoints keep
        their weights but drop their training state (now, or later through
        :meth:`strip_older_states` when ``strip_older=False``), so disk use stays bounded."""
        if self.out_dir is None:
            raise ValueError("out_dir: the trainer has no run directory to save into")
        path = self.out_dir / "checkpoints" / checkpoint_dir_name(self.step)
        save_checkpoint(self.model, path, task_cfg=self.task_cfg, train_cfg=self.train_cfg,
                        step=self.step, training_state=self.training_state())
        if strip_older:
            self.strip_older_states()
        return path

    def strip_older_states(self) -> None:
        """Drop the training state of every checkpoint but the current step's."""
        for step, p in list_checkpoints(self.out_dir).items():
            if step != self.step and (p / "state.json").exists():
                _strip_state(p)

    def resume(self) -> bool:
        """Continue from the latest checkpoint holding training state; False if there is none.

        Raises:
            ConfigMismatchError: if that checkpoint was written with other configs.
        """
        if self.out_dir is None:
            raise ValueError("out_dir: resume needs a run directory")
        path = latest_checkpoint(self.out_dir, with_state=True)
        if path is None:
            return False
        model, info = load_checkpoint_info(path, config=self.model_cfg)
        if info.task_cfg != self.task_cfg:
            raise ConfigMismatchError(f"task_cfg: checkpoint {path} was trained on {info.task_cfg}, "
                                      f"not {self.task_cfg}")
        theirs = info.train_cfg.to_dict() if info.train_cfg else {}
        ours = self.train_cfg.to_dict()
        changed = {k for k in ("seed", "lr", "batch_size", "eval_batch_size")
                   if theirs.get(k) != ours[k]}
        if changed:
            raise ConfigMismatchError(f"train_cfg: {sorted(changed)} differ from checkpoint {path}; "
                                      "resuming would not continue the same trajectory")
        with torch.no_grad():
            for p, q in zip(self.model.parameters(), model.parameters()):
                p.copy_(q)
        self.load_training_state(*load_training_state(path))
        self.records = [r for r in _read_jsonl(self.out_dir / METRICS_FILE) if r["step"] <= self.step]
        _write_jsonl(self.out_dir / METRICS_FILE, self.records)
        return True

    # ------------------------------------------------------------- loop
    def open_log(self):
        """Create the run directory, write ``run.json`` and open the metrics log for appending
        (None without a run directory)."""
        if self.out_dir is None:
            return None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "run.json").write_text(json.dumps(
            {"model": self.model_cfg.to_dict(), "task": self.task_cfg.to_dict(),
             "train": self.train_cfg.to_dict(), "seed": self.train_cfg.seed,
             "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
             "device": str(self.device)}, indent=2, sort_keys=True))
        return open(self.out_dir / METRICS_FILE, "a")

    def log(self, train: dict[str, Any], evaluation: dict[str, float], log_file=None) -> dict[str, Any]:
        """Append one metrics record for the current step (``train_*`` from the update's forward
        pass, ``eval_*`` from :meth:`evaluate`) and write it to ``log_file``."""
        record: dict[str, Any] = {"step": self.step}
        record.update({f"train_{k}": float(v) for k, v in train.items()})
        record.update({f"eval_{k}": float(v) for k, v in evaluation.items()})
        record["elapsed_s"] = round(self.elapsed_s, 3)
        self.records.append(record)
        if log_file is not None:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
        return record

    def checkpoint_due(self, step: int) -> bool:
        """True when the schedule asks for a checkpoint at ``step``."""
        cfg = self.train_cfg
        return (step in cfg.checkpoint_steps or step == cfg.n_steps
                or (cfg.checkpoint_every > 0 and step % cfg.checkpoint_every == 0))

    @torch.no_grad()
    def evaluate(self, batch_size: int | None = None) -> dict[str, float]:
        """Losses on a fresh batch from the evaluation stream."""
        was_training = self.model.training
        self.model.eval()
        batch = self.task.sample(batch_size or self.train_cfg.eval_batch_size,
                                 generator=self.eval_gen, device=self.device)
        out = {k: v.item() for k, v in losses(self.model(batch.tokens), batch).items()}
        self.model.train(was_training)
        return out

    def run(self, n_steps: int | None = None) -> TrainResult:
        """Train until step ``n_steps`` (default: the config's), logging and checkpointing."""
        n_steps = self.train_cfg.n_steps if n_steps is None else n_steps
        cfg = self.train_cfg
        log_file = self.open_log()
        bar = tqdm(total=n_steps, initial=self.step, disable=not self.progress, desc="train",
                   dynamic_ncols=True)
        self.model.train()
        try:
            t0 = time.perf_counter() - self.elapsed_s
            while self.step < n_steps:
                batch = self.task.sample(cfg.batch_size, generator=self.train_gen, device=self.device)
                predictions = self.model(batch.tokens)
                loss = masked_mse(predictions, batch.values)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"training diverged at step {self.step + 1}: loss is {loss.item()}; "
                        f"try a lower lr (now {cfg.lr})")
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                self.step += 1
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == n_steps:
                    with torch.no_grad():
                        train = losses(predictions.detach(), batch)
                    self.elapsed_s = time.perf_counter() - t0
                    record = self.log(train, self.evaluate(), log_file)
                    bar.set_postfix(L_obs=f"{record['train_L_obs']:.2e}",
                                    L_mask=f"{record['train_L_mask']:.3f}")
                if self.out_dir is not None and self.checkpoint_due(self.step):
                    self.elapsed_s = time.perf_counter() - t0
                    self.save()
        finally:
            bar.close()
            if log_file is not None:
                log_file.close()
        self.model.eval()
        return TrainResult(model=self.model, metrics=pd.DataFrame(self.records),
                           out_dir=self.out_dir, step=self.step)


def train(
    preset: str | Preset = "tiny",
    *,
    model_cfg: EncoderConfig | None = None,
    task_cfg: TaskConfig | None = None,
    train_cfg: TrainConfig | None = None,
    out_dir: str | os.PathLike | None = None,
    device: torch.device | str | None = None,
    resume: bool = False,
    progress: bool = True,
    model: HookedEncoder | None = None,
    trainable: Callable[[str], bool] | None = None,
    **train_overrides: Any,
) -> TrainResult:
    """Train a :class:`HookedEncoder` on matrix completion (see :class:`Trainer` for arguments).

    With ``resume=True`` and an ``out_dir`` holding checkpoints, training continues from the latest
    one and reproduces the uninterrupted run exactly (same seed -> same losses).

    To train several seeds at once as one batched program, use :func:`tfmatcomp.train_many`.

    Example:
        >>> import tfmatcomp as tm
        >>> r = tm.train("tiny", n_steps=10, batch_size=8, log_every=5, progress=False)
        >>> r.step, sorted(c for c in r.metrics.columns if c.startswith("eval_"))[:2]
        (10, ['eval_L', 'eval_L_mask'])
    """
    trainer = Trainer(preset, model_cfg=model_cfg, task_cfg=task_cfg, train_cfg=train_cfg,
                      out_dir=out_dir, device=device, model=model, trainable=trainable,
                      progress=progress, **train_overrides)
    if resume:
        trainer.resume()
    return trainer.run()


def read_metrics(path: str | os.PathLike) -> pd.DataFrame:
    """The metrics log of a run (``RUN_DIR`` or ``RUN_DIR/metrics.jsonl``) as a DataFrame."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"path: no metrics log at {path}")
    return pd.DataFrame(_read_jsonl(path))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut short by a crash: everything after it is unreliable
    return records


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def _strip_state(path: Path) -> None:
    """Drop a checkpoint's training state, rewriting its config's file list atomically."""
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    for name in ("state.safetensors", "state.json"):
        config.get("files", {}).pop(name, None)
    tmp = config_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True))
    os.replace(tmp, config_file)
    for name in ("state.safetensors", "state.json"):
        (path / name).unlink(missing_ok=True)
