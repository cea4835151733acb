"""The state of one run: what a checkpoint's training state must bring back for a resume to
continue the exact trajectory of an uninterrupted run.

A :class:`RunState` holds the model, its optimizer, the training and evaluation streams' seeded
generators, the step counter and the training clock. It knows nothing of files (that is
:class:`~tfmatcomp.runs.run_directory.RunDirectory`) or of the loop (that is the host,
:class:`~tfmatcomp.Trainer`).

Example:
    >>> import torch, tfmatcomp as tm
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    >>> state = RunState.fresh(model, torch.optim.Adam(model.parameters()), seed=0,
    ...                        device=torch.device("cpu"))
    >>> tensors, json_state = state.training_state()
    >>> sorted(tensors), json_state["step"]
    (['rng.eval', 'rng.train'], 0)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from tfmatcomp.runs.checkpoint import ConfigMismatchError
from tfmatcomp.runs.layout import STATE_FILE
from tfmatcomp.runs.rundir import RunDirError

__all__ = ["RunState"]


class RunState:
    """A run's model, optimizer, generators, step and clock (see the module docstring)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 train_gen: torch.Generator, eval_gen: torch.Generator):
        self.model, self.optimizer = model, optimizer
        self.train_gen, self.eval_gen = train_gen, eval_gen
        #: optimizer updates so far
        self.step = 0
        #: training seconds so far (carried over a resume)
        self.elapsed_s = 0.0

    @classmethod
    def fresh(cls, model: nn.Module, optimizer: torch.optim.Optimizer, seed: int,
              device: torch.device) -> RunState:
        """A run at step 0: the training stream seeded ``seed + 1``, evaluation ``seed + 2``."""
        return cls(model, optimizer, torch.Generator(device).manual_seed(seed + 1),
                   torch.Generator(device).manual_seed(seed + 2))

    def training_state(self, with_weights: bool = False
                       ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(tensors, json_state)``: everything besides the weights needed to resume exactly
        (the float32 weights too when ``with_weights``: a checkpoint that rounds them)."""
        opt = self.optimizer.state_dict()
        tensors: dict[str, torch.Tensor] = {
            "rng.train": self.train_gen.get_state(), "rng.eval": self.eval_gen.get_state()}
        for idx, st in opt["state"].items():
            for key, value in st.items():
                tensors[f"optimizer.{idx}.{key}"] = torch.as_tensor(value)
        if with_weights:
            tensors.update({f"weights.{k}": v for k, v in self.model.state_dict().items()})
        state = {"step": self.step, "elapsed_s": self.elapsed_s,
                 "param_groups": opt["param_groups"]}
        return tensors, state

    def load_training_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        """Bring back what :meth:`training_state` saved."""
        opt_state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, idx, name = key.split(".", 2)
                opt_state.setdefault(int(idx), {})[name] = value
        # the saved groups would bring back the saved run's Adam implementation: keep this run's
        groups = [{**saved, **{k: ours[k] for k in ("fused", "foreach") if k in ours}}
                  for saved, ours in zip(state["param_groups"], self.optimizer.param_groups)]
        self.optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
        weights = {k[len("weights."):]: v for k, v in tensors.items() if k.startswith("weights.")}
        if weights:  # float32 weights kept with the state of a half-precision checkpoint
            self.model.load_state_dict(weights, strict=True)
        self.train_gen.set_state(tensors["rng.train"])
        self.eval_gen.set_state(tensors["rng.eval"])
        self.step = int(state["step"])
        self.elapsed_s = float(state.get("elapsed_s", 0.0))

    @torch.no_grad()
    def copy_weights(self, model: nn.Module) -> None:
        """Take ``model``'s weights (a checkpoint's, loaded)."""
        for p, q in zip(self.model.parameters(), model.parameters()):
            p.copy_(q)

    def check_state(self, path: Path, step: int | None, state: dict[str, Any]) -> None:
        """Refuse a training state that disagrees with its checkpoint's step or with this run's
        optimizer settings, before anything is changed or deleted.

        Raises:
            RunDirError: ``state.json``'s step is not the checkpoint's.
            ConfigMismatchError: its learning rate or Adam settings are not this run's.
        """
        saved = state.get("step")
        if not isinstance(saved, int) or isinstance(saved, bool) or (step is not None and saved != step):
            raise RunDirError(f"out_dir: {path / STATE_FILE} says step {saved!r} but the checkpoint "
                              f"is step {step}; refusing to resume from it (nothing was removed)")
        groups = state.get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(self.optimizer.param_groups):
            raise RunDirError(f"out_dir: {path / STATE_FILE} holds {type(groups).__name__} "
                              f"param_groups; expected {len(self.optimizer.param_groups)}")
        for group, ours in zip(groups, self.optimizer.param_groups):
            for key in ("lr", "betas", "eps", "weight_decay", "amsgrad"):
                theirs = group.get(key) if isinstance(group, dict) else None
                mine = ours[key]
                if (list(theirs) if isinstance(theirs, (list, tuple)) else theirs) != (
                        list(mine) if isinstance(mine, tuple) else mine):
                    raise ConfigMismatchError(
                        f"{'lr' if key == 'lr' else 'optimizer'}: {path / STATE_FILE} records "
                        f"Adam {key} {theirs!r}, this run has {mine!r}; resuming would not continue "
                        "the same trajectory")
