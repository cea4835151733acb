"""Many seeds of one configuration, trained at once as one batched program.

The K models' parameters are stacked along a new leading axis
(:func:`torch.func.stack_module_state`) and the model's own forward runs on all of them through
:func:`torch.func.vmap` over :func:`torch.func.functional_call`; one Adam steps the stacked
parameters. Adam is elementwise, so this is K independent optimizers. Nothing is re-implemented: the
forward is :class:`~tfmatcomp.HookedEncoder`'s (its explicit attention and LayerNorm path, since the
fused kernels have no batching rule).

Each seed behaves as its single-seed run (:func:`tfmatcomp.train` with ``seed=s``): the same
initialization, the same training and evaluation streams (each seed has its own generators), the
same metrics log and checkpoints in its own run directory ``OUT/seed-{s}/``, each loadable and
resumable as an ordinary run. Its trajectory equals the single-seed run's up to float rounding
(batched matmuls round differently; see docs/concepts/training.md on trajectories that part).

Example:
    >>> import tfmatcomp as tm
    >>> runs = tm.train_many("tiny", seeds=[0, 1], n_steps=20, batch_size=16, log_every=10,
    ...                      progress=False)
    >>> runs.seeds, list(runs[1].metrics["step"])
    ([0, 1], [10, 20])
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from tqdm.auto import tqdm

from tfmatcomp.validation import read_json_bounded
from tfmatcomp.runs import rundir
from tfmatcomp.runs.layout import (
    GROUP_FILE, has_training_state, latest_checkpoint, list_checkpoints, seed_dir,
)
from tfmatcomp.config import EncoderConfig, Preset, TaskConfig, TrainConfig, get_preset
from tfmatcomp.task.metrics import losses
from tfmatcomp.models.encoder import HookedEncoder, UncheckedForward
from tfmatcomp.training.trainer import (
    Trainer, TrainResult, _check_n_steps, _check_resume_overwrite, _resume_and_run,
)

__all__ = ["MultiSeedTrainer", "MultiSeedResult", "train_many", "parse_seeds",
           "write_group_file"]


#: The most seeds one group may train (each is a full training run).
MAX_SEEDS = 10_000


def parse_seeds(text: str | int | Sequence[int]) -> list[int]:
    """Seeds from ``"0-7"``, ``"0,3,5"``, ``"0-3,8"``, an int or a sequence; sorted, no repeats,
    at most :data:`MAX_SEEDS` of them (checked before any list is built).

    Example:
        >>> parse_seeds("0-3,8"), parse_seeds(5), parse_seeds([2, 1])
        ([0, 1, 2, 3, 8], [5], [1, 2])
    """
    if isinstance(text, int) and not isinstance(text, bool):
        seeds = [text]
    elif isinstance(text, str):
        seeds = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if m is None:
                raise ValueError(f"seeds: cannot read {part!r}; write e.g. '0-7' or '0,3,5'")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise ValueError(f"seeds: range {part!r} runs backwards")
            if hi - lo + 1 + len(seeds) > MAX_SEEDS:
                raise ValueError(f"seeds: at most {MAX_SEEDS:,} seeds, got {text!r}")
            seeds.extend(range(lo, hi + 1))
    else:
        seeds = [int(s) for s in text]
    if len(seeds) > MAX_SEEDS:
        raise ValueError(f"seeds: at most {MAX_SEEDS:,} seeds, got {len(seeds):,}")
    if not seeds or any(s < 0 for s in seeds):
        raise ValueError(f"seeds: give at least one non-negative seed, got {text!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: {text!r} repeats a seed")
    return sorted(seeds)


@dataclass
class MultiSeedResult:
    """What :func:`train_many` returns: one :class:`~tfmatcomp.training.trainer.TrainResult` per seed.

    Index it by seed (``result[3].model``), iterate over ``(seed, TrainResult)`` pairs, or read every
    seed's log at once from :attr:`metrics` (a ``seed`` column added).
    """

    seeds: list[int]
    results: dict[int, TrainResult]
    out_dir: Path | None
    step: int

    def __getitem__(self, seed: int) -> TrainResult:
        return self.results[seed]

    def __iter__(self) -> Iterator[tuple[int, TrainResult]]:
        return iter(self.results.items())

    def __len__(self) -> int:
        return len(self.results)

    @property
    def metrics(self) -> pd.DataFrame:
        frames = [r.metrics.assign(seed=s) for s, r in self.results.items()]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


class MultiSeedTrainer:
    """Train several seeds of one configuration at once (see the module docstring).

    Args:
        preset, model_cfg, task_cfg, train_cfg, device, progress, train_overrides: as
            :class:`~tfmatcomp.Trainer`; ``train_overrides`` may not set ``seed``.
        seeds: the seeds (a sequence, an int, or text such as ``"0-7"``).
        out_dir: the group's directory; seed ``s`` writes its run to ``out_dir/seed-{s}``.
            None keeps everything in memory. As for a single run, training from step 0 refuses a
            directory that already holds runs, and the group directory and every seed's
            directory are locked while the trainer writes.
        overwrite: clear ``out_dir`` (every seed's directory with it) before training from step 0.
    """

    def __init__(
        self,
        preset: str | Preset = "tiny",
        *,
        seeds: str | int | Sequence[int],
        model_cfg: EncoderConfig | None = None,
        task_cfg: TaskConfig | None = None,
        train_cfg: TrainConfig | None = None,
        out_dir: str | os.PathLike | None = None,
        device: torch.device | str | None = None,
        progress: bool = True,
        overwrite: bool = False,
        **train_overrides: Any,
    ):
        if "seed" in train_overrides:
            raise ValueError("seed: give the seeds with seeds=..., not seed=")
        self.seeds = parse_seeds(seeds)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.overwrite = bool(overwrite)
        self._lock = rundir.RunDirLock(self.out_dir) if self.out_dir is not None else None
        self._claimed = False
        self.progress = progress
        self.trainers = [
            Trainer(preset, model_cfg=model_cfg, task_cfg=task_cfg, train_cfg=train_cfg,
                    out_dir=seed_dir(out_dir, s) if out_dir is not None else None, device=device,
                    progress=False, **{**train_overrides, "seed": s})
            for s in self.seeds]
        first = self.trainers[0]
        if first.is_decoder:
            raise ValueError("preset: the batched multi-seed trainer runs the encoder task only; "
                             "train a decoder preset (e.g. gpt-tiny) one seed at a time")
        self.train_cfg, self.task, self.device = first.train_cfg, first.task, first.device
        self._build()

    # ------------------------------------------------------------------ stacking
    def _build(self) -> None:
        """Stack the trainers' parameters and optimizer states into the batched program."""
        models = [t.model for t in self.trainers]
        self.names = [n for n, _ in models[0].named_parameters()]
        params, _ = torch.func.stack_module_state(models)
        self.params = {n: params[n].detach().clone().requires_grad_(True) for n in self.names}
        self.optimizer = torch.optim.Adam(list(self.params.values()), lr=self.train_cfg.lr)
        self._load_optimizer_states()
        stateless = copy.deepcopy(models[0]).to("meta")
        single = len(self.trainers) == 1
        for module in stateless.modules():
            if hasattr(module, "fused"):
                # SDPA / fused LayerNorm have no vmap batching rule; one seed needs no vmap.
                module.fused = single
        forward = UncheckedForward(stateless)
        keys = {n: f"model.{n}" for n in self.names}

        def one(params: dict[str, Tensor], tokens: Tensor) -> Tensor:
            return torch.func.functional_call(forward, {keys[n]: p for n, p in params.items()},
                                              (tokens,))

        if single:  # the single-seed trainer's own (fused) program, on the stacked parameters
            self._forward = lambda params, tokens: one(
                {n: p[0] for n, p in params.items()}, tokens[0])[None]
        else:
            self._forward = torch.func.vmap(one)

    def _load_optimizer_states(self) -> None:
        """Stacked Adam state from the seeds' own optimizers (non-empty after a resume)."""
        per_seed = [[t.optimizer.state.get(p, {}) for p in t.model.parameters()]
                    for t in self.trainers]
        for i, name in enumerate(self.names):
            states = [seed[i] for seed in per_seed]
            if not states[0]:
                continue
            steps = {float(s["step"]) for s in states}
            if len(steps) != 1:
                raise ValueError(f"seeds: optimizer steps differ between seeds for {name}: {steps}")
            self.optimizer.state[self.params[name]] = {
                "step": states[0]["step"].clone(),
                "exp_avg": torch.stack([s["exp_avg"] for s in states]),
                "exp_avg_sq": torch.stack([s["exp_avg_sq"] for s in states])}

    @torch.no_grad()
    def _sync_to_trainers(self) -> None:
        """Write the stacked weights and Adam state back into each seed's trainer."""
        for k, t in enumerate(self.trainers):
            for name, p in zip(self.names, t.model.parameters()):
                p.copy_(self.params[name][k])
                st = self.optimizer.state.get(self.params[name])
                if st:
                    t.optimizer.state[p] = {"step": st["step"].clone(),
                                            "exp_avg": st["exp_avg"][k].clone(),
                                            "exp_avg_sq": st["exp_avg_sq"][k].clone()}

    # ------------------------------------------------------------------- running
    def models(self) -> dict[int, HookedEncoder]:
        """``{seed: model}`` with the current weights (each an ordinary HookedEncoder)."""
        self._sync_to_trainers()
        return {s: t.model for s, t in zip(self.seeds, self.trainers)}

    def forward(self, tokens: Int[Tensor, "seed batch pos"]) -> Float[Tensor, "seed batch pos"]:
        """All seeds' predictions, seed ``k`` on ``tokens[k]``."""
        if tokens.ndim != 3 or tokens.shape[0] != len(self.seeds):
            raise ValueError(f"tokens: expected [seed={len(self.seeds)}, batch, pos], got "
                             f"{tuple(tokens.shape)}")
        self.trainers[0].model.check_tokens(tokens.flatten(0, 1))
        return self._forward(self.params, tokens)

    def _sample(self, generators: list[torch.Generator], batch_size: int):
        batches = [self.task.sample(batch_size, generator=g, device=self.device) for g in generators]
        return batches, torch.stack([b.tokens for b in batches])

    @torch.no_grad()
    def evaluate(self) -> list[dict[str, float]]:
        """Each seed's losses on a fresh batch from its own evaluation stream."""
        batches, tokens = self._sample([t.eval_gen for t in self.trainers],
                                       self.train_cfg.eval_batch_size)
        predictions = self.forward(tokens)
        return [{k: v.item() for k, v in losses(predictions[i], b).items()}
                for i, b in enumerate(batches)]

    def _zero_padding_grad(self) -> None:
        """Keep the untrained MASK embedding at zero: under ``vmap`` the embedding's backward
        honours ``padding_idx`` for the first stacked model only (torch 2.13), so its gradient
        row is cleared here for every seed, as ``F.embedding(padding_idx=...)`` does for one."""
        padding_idx = self.trainers[0].model.embed.padding_idx
        grad = self.params["embed.W_E"].grad
        if padding_idx is not None and grad is not None:
            grad[:, padding_idx] = 0

    @property
    def step(self) -> int:
        return self.trainers[0].step

    # ------------------------------------------------------------- run directory
    def _claim(self, resuming: bool) -> None:
        """Lock the group directory and every seed's (see :meth:`Trainer._claim`)."""
        if self._lock is None:
            return
        try:
            self._claim_group(resuming)
            for t in self.trainers:
                t._claim(resuming)
        except BaseException:
            self.close()
            raise

    def _claim_group(self, resuming: bool) -> None:
        """Lock the group directory; the first time, check that this group may train there."""
        if not self._lock.held:
            self._lock.acquire()
            if not self._claimed:
                _check_group_dir(self.out_dir, self.seeds, resuming, self.overwrite)
                self._claimed = True

    def _write_group_file(self) -> None:
        """Record the group's seeds in ``out_dir/seeds.json``."""
        write_group_file(self.out_dir, self.seeds)

    def close(self) -> None:
        """Release the locks on the group directory and every seed's (done at the end of
        every :meth:`run`)."""
        for t in self.trainers:
            t.close()
        if self._lock is not None:
            self._lock.release()

    def resume(self) -> bool:
        """Continue every seed from the latest step at which all seeds have a checkpoint with
        training state; False when none has one (every seed then starts again from step 0; see
        :meth:`Trainer.resume`).

        Raises:
            ValueError: if some seeds have a resumable checkpoint and others none, or the group
                directory was trained with other seeds.
            RunDirError: see :meth:`Trainer.resume`.
        """
        if self.out_dir is None:
            raise ValueError("out_dir: resume needs a run directory")
        self._claim(resuming=True)
        _check_resumable(self.out_dir, self.seeds)
        if not any([t.resume() for t in self.trainers]):
            return False
        steps = {t.step for t in self.trainers}
        if len(steps) > 1:
            # A crash between two seeds' saves: all seeds still hold state at the earlier step.
            target = min(steps)
            for t in self.trainers:
                if t.step != target:
                    _resume_at(t, target)
        self._build()
        return True

    def run(self, n_steps: int | None = None) -> MultiSeedResult:
        """Train every seed until step ``n_steps`` (default: the config's).

        Raises:
            ValueError: ``n_steps`` is not a positive integer, or is below the current step.
            RunDirError: see ``out_dir`` in the class docstring.
        """
        cfg = self.train_cfg
        n_steps = _check_n_steps(cfg.n_steps if n_steps is None else n_steps, self.step,
                                 self.out_dir)
        logs = []
        try:
            if self.out_dir is not None:
                self._claim(resuming=False)
                self._write_group_file()
            logs = [t.open_log() for t in self.trainers]
        except BaseException:
            self.close()
            raise
        bar = tqdm(total=n_steps, initial=self.step, disable=not self.progress,
                   desc=f"train {len(self.seeds)} seeds", dynamic_ncols=True)
        train_gens = [t.train_gen for t in self.trainers]
        try:
            t0 = time.perf_counter() - self.trainers[0].elapsed_s
            while self.step < n_steps:
                batches, tokens = self._sample(train_gens, cfg.batch_size)
                values = torch.stack([b.values for b in batches])
                predictions = self.forward(tokens)
                per_seed = (predictions.float() - values.float()).pow(2).mean(dim=(1, 2))
                if not torch.isfinite(per_seed).all():
                    bad = [s for s, ok in zip(self.seeds, torch.isfinite(per_seed).tolist()) if not ok]
                    raise FloatingPointError(f"training diverged at step {self.step + 1} for seeds "
                                             f"{bad}; try a lower lr (now {cfg.lr})")
                self.optimizer.zero_grad(set_to_none=True)
                per_seed.sum().backward()
                self._zero_padding_grad()
                self.optimizer.step()
                for t in self.trainers:
                    t.step += 1
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == n_steps:
                    elapsed = time.perf_counter() - t0
                    evals = self.evaluate()
                    records = []
                    for k, t in enumerate(self.trainers):
                        t.elapsed_s = elapsed
                        with torch.no_grad():
                            train = losses(predictions[k].detach(), batches[k])
                        records.append(t.log(train, evals[k], logs[k]))
                    median = sorted(r["eval_L_mask"] for r in records)[len(records) // 2]
                    bar.set_postfix(median_L_mask=f"{median:.3f}")
                if self.out_dir is not None and self.trainers[0].checkpoint_due(self.step):
                    self._sync_to_trainers()
                    for t in self.trainers:
                        t.elapsed_s = time.perf_counter() - t0
                        t.save(strip_older=False)
                    for t in self.trainers:  # only once every seed has its new checkpoint
                        t.strip_older_states()
        finally:
            bar.close()
            for f in logs:
                if f is not None:
                    f.close()
            self.close()
        models = self.models()
        results = {s: TrainResult(model=models[s].eval(), metrics=pd.DataFrame(t.records),
                                  out_dir=t.out_dir, step=t.step)
                   for s, t in zip(self.seeds, self.trainers)}
        return MultiSeedResult(seeds=self.seeds, results=results, out_dir=self.out_dir,
                               step=self.step)


def _check_group_dir(out_dir: Path, seeds: list[int], resuming: bool, overwrite: bool) -> None:
    """Check that the group of ``seeds`` may train in ``out_dir`` (whose lock the caller holds):
    a resume needs a group of the same seeds there, a fresh start an empty directory."""
    if not resuming:
        rundir.check_fresh(out_dir, overwrite)
        return
    rundir.check_kind(out_dir, group=True)
    path = out_dir / GROUP_FILE
    if not path.exists():
        return
    try:
        theirs = [int(s) for s in read_json_bounded(GROUP_FILE, path)["seeds"]]
    except (ValueError, KeyError, TypeError) as e:
        raise rundir.RunDirError(f"out_dir: {path} is unreadable ({e}); pass overwrite=True "
                                 "to start this directory again") from None
    if sorted(theirs) != seeds:
        diff = sorted(set(theirs) ^ set(seeds))
        raise ValueError(f"seeds: {diff} differ: {out_dir} holds the group of seeds "
                         f"{sorted(theirs)}, this call asks for {seeds}; resume with the "
                         "same seeds or choose another directory")


def _check_resumable(out_dir: Path, seeds: list[int]) -> None:
    """Refuse a group in which some seeds have a resumable checkpoint and others none."""
    missing = [s for s in seeds if latest_checkpoint(seed_dir(out_dir, s), with_state=True) is None]
    if missing and len(missing) < len(seeds):
        raise ValueError(f"seeds: {missing} have no resumable checkpoint under {out_dir}; "
                         "resume them separately or start a new directory")


def write_group_file(out_dir: str | os.PathLike, seeds: list[int]) -> None:
    """Record a group of seed runs (``out_dir/seed-S``) in ``out_dir/seeds.json``, which
    :class:`~tfmatcomp.report.SeedGroup` and the report read."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / GROUP_FILE).write_text(json.dumps(
        {"seeds": seeds, "runs": [seed_dir(".", s).name for s in seeds]}, indent=2))


def _resume_at(trainer: Trainer, step: int) -> None:
    """Reload ``trainer`` from its checkpoint at ``step`` (which must hold training state)."""
    path = list_checkpoints(trainer.out_dir).get(step)
    if path is None or not has_training_state(path):
        raise ValueError(f"seeds: {trainer.out_dir} has no resumable checkpoint at step {step}")
    trainer._restore(path)


def train_many(
    preset: str | Preset = "tiny",
    *,
    seeds: str | int | Sequence[int],
    model_cfg: EncoderConfig | None = None,
    task_cfg: TaskConfig | None = None,
    train_cfg: TrainConfig | None = None,
    out_dir: str | os.PathLike | None = None,
    device: torch.device | str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    **train_overrides: Any,
) -> MultiSeedResult:
    """Train one configuration for several seeds at once (see :class:`MultiSeedTrainer`).

    Seed ``s`` gets the run directory ``out_dir/seed-{s}``, an ordinary run: its checkpoints load
    with :func:`tfmatcomp.load_checkpoint` and it resumes with :func:`tfmatcomp.train` too.
    ``resume`` and ``overwrite`` work as in :func:`tfmatcomp.train`, on the group as a whole.

    Example:
        >>> import tfmatcomp as tm
        >>> runs = tm.train_many("tiny", seeds="0-2", n_steps=10, batch_size=8, log_every=5,
        ...                      progress=False)
        >>> [(s, r.step) for s, r in runs]
        [(0, 10), (1, 10), (2, 10)]
    """
    _check_resume_overwrite(resume, overwrite)
    trainer = MultiSeedTrainer(preset, seeds=seeds, model_cfg=model_cfg, task_cfg=task_cfg,
                               train_cfg=train_cfg, out_dir=out_dir, device=device,
                               progress=progress, overwrite=overwrite, **train_overrides)
    return _resume_and_run(trainer, resume)
