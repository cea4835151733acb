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

import contextlib
import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from tfmatcomp.runs import rundir
from tfmatcomp.runs.layout import GROUP_FILE, seed_dir
from tfmatcomp.config import Preset
from tfmatcomp.interventions.during_training import Reinitialize
from tfmatcomp.models.encoder import HookedEncoder, UncheckedForward
from tfmatcomp.task.data import MatrixBatch
from tfmatcomp.training.loop import Schedule, TrainingStep, check_n_steps, resume_and_run, run_loop
from tfmatcomp.models.objectives import OBJECTIVES
from tfmatcomp.training.plan import BATCHED_STEP, RunPlan, parse_seeds, plan_run
from tfmatcomp.training.trainer import Trainer, TrainResult

__all__ = ["MultiSeedTrainer", "MultiSeedResult", "VmapStep", "train_many", "run_plan", "run_group",
           "write_group_file", "parse_seeds", "BATCHED_STEP"]


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
        preset: as :class:`~tfmatcomp.Trainer`.
        seeds: the seeds (a sequence, an int, or text such as ``"0-7"``).
        keywords: the fields of :class:`~tfmatcomp.training.plan.RunSetup` and
            :class:`~tfmatcomp.TrainConfig` fields, as :class:`~tfmatcomp.Trainer` takes them
            (the TrainConfig fields may not include ``seed``), except that ``out_dir`` is the
            group's directory: seed ``s`` writes its run to ``out_dir/seed-{s}``. None keeps
            everything in memory. As for a single run, training from step 0 refuses a directory
            that already holds runs, and the group directory and every seed's directory are
            locked while the trainer writes; ``overwrite`` clears ``out_dir`` (every seed's
            directory with it) before training from step 0.
    """

    def __init__(self, preset: str | Preset = "tiny", *,
                 seeds: str | int | Sequence[int] | None = None, plan: RunPlan | None = None,
                 **keywords: Any):
        if plan is None:
            if seeds is None:
                raise TypeError("seeds: give the seeds (or a plan)")
            plan = plan_run(preset, keywords, seeds=seeds, batched=True)
        elif keywords or seeds is not None:
            raise TypeError("plan: give a plan or seeds and keywords, not both")
        elif plan.seeds is None or not plan.batched:
            raise ValueError("plan: not the plan of a batched group of seeds")
        refused = next((iv for iv in plan.train_cfg.interventions if not iv.batched), None)
        if refused is not None:
            raise ValueError(f"interventions: the batched multi-seed program cannot carry a "
                             f"{refused.kind} (inside vmap); train_many trains such seeds one at "
                             "a time")
        if plan.train_cfg.fast:
            raise ValueError("fast: the batched multi-seed program runs float32; train_many "
                             "trains fast seeds one at a time on the fast step")
        #: the group's plan, decided at the entry point
        self.run_plan = plan
        self.seeds = list(plan.seeds)
        self.out_dir = plan.out_dir
        self.overwrite = plan.overwrite
        self._lock = rundir.RunDirLock(self.out_dir) if self.out_dir is not None else None
        self._claimed = False
        self.progress = plan.progress
        self.trainers = [Trainer.from_plan(plan.for_seed(s)) for s in self.seeds]
        first = self.trainers[0]
        if first.objective is not OBJECTIVES["encoder"]:
            raise ValueError("preset: the batched multi-seed trainer runs the encoder task only; "
                             "train a decoder preset (e.g. gpt-tiny) one seed at a time")
        self.train_cfg, self.task, self.device = first.train_cfg, first.task, first.device
        #: the interventions during training, ready to apply (None without any)
        self.plan = first.plan
        self._build()

    @classmethod
    def from_plan(cls, plan: RunPlan) -> MultiSeedTrainer:
        """The trainer of a batched group's ``plan`` (:mod:`tfmatcomp.training.plan`)."""
        return cls(plan=plan)

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
        #: the model whose hooks the stacked forward runs (interventions during training)
        self.stateless = stateless
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

    def sample(self, generators: list[torch.Generator], batch_size: int
               ) -> tuple[list[MatrixBatch], Int[Tensor, "seed batch pos"]]:
        """One batch per seed, seed ``k``'s from ``generators[k]``, and their tokens stacked."""
        batches = [self.task.sample(batch_size, generator=g, device=self.device) for g in generators]
        return batches, torch.stack([b.tokens for b in batches])

    @torch.no_grad()
    def evaluate(self) -> list[dict[str, float]]:
        """Each seed's losses on a fresh batch from its own evaluation stream."""
        batches, tokens = self.sample([t.eval_gen for t in self.trainers],
                                       self.train_cfg.eval_batch_size)
        with self.intervened(self.step - 1):
            predictions = self.forward(tokens)
        metrics = self.trainers[0].objective.metrics
        return [{k: v.item() for k, v in metrics(predictions[i], b).items()}
                for i, b in enumerate(batches)]

    def zero_padding_grad(self) -> None:
        """(Called between the backward pass and the optimizer step.) Keep the untrained MASK embedding at zero: under ``vmap`` the embedding's backward
        honours ``padding_idx`` for the first stacked model only (torch 2.13), so its gradient
        row is cleared here for every seed, as ``F.embedding(padding_idx=...)`` does for one."""
        padding_idx = self.trainers[0].model.embed.padding_idx
        grad = self.params["embed.W_E"].grad
        if padding_idx is not None and grad is not None:
            grad[:, padding_idx] = 0

    @property
    def step(self) -> int:
        return self.trainers[0].step

    def intervened(self, step: int):
        """The hooks of the interventions during training active at the update from ``step``,
        attached to the stacked forward for the body of a ``with``."""
        return (self.plan.applied(self.stateless, step) if self.plan
                else contextlib.nullcontext())

    def fresh_parameters(self, reinit: Reinitialize) -> list[dict[str, Tensor]]:
        """Each seed's freshly initialized weights that ``reinit`` copies."""
        return [t.fresh_parameters(reinit)[0] for t in self.trainers]

    # ------------------------------------------------------------- run directory
    def claim(self, resuming: bool) -> None:
        """Lock the group directory and every seed's (see :meth:`Trainer.claim`)."""
        if self._lock is None:
            return
        try:
            self.claim_group(resuming)
            for t in self.trainers:
                t.claim(resuming)
        except BaseException:
            self.close()
            raise

    def claim_group(self, resuming: bool) -> None:
        """Lock the group directory; the first time, check that this group may train there
        (:func:`~tfmatcomp.runs.rundir.check_group`)."""
        if not self._lock.held:
            self._lock.acquire()
            if not self._claimed:
                rundir.check_group(self.out_dir, self.seeds, resuming, self.overwrite)
                self._claimed = True

    def record_group(self) -> None:
        """Record the group's seeds in ``out_dir/seeds.json`` (:func:`write_group_file`)."""
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
        self.claim(resuming=True)
        rundir.check_group_resumable(self.out_dir, self.seeds)
        if not any([t.resume_latest() for t in self.trainers]):
            return False
        steps = {t.step for t in self.trainers}
        if len(steps) > 1:
            # A crash between two seeds' saves: all seeds still hold state at the earlier step.
            target = min(steps)
            for t in self.trainers:
                if t.step != target:
                    _resume_at(t, target)
        for t in self.trainers:
            t.strip_older_states()
        self._build()
        return True

    # ------------------------------------------------------------- the loop's host
    @property
    def schedule(self) -> Schedule:
        """When the seeds log and checkpoint (all on the same steps)."""
        return self.trainers[0].schedule

    @property
    def runs(self) -> list[Trainer]:
        """The runs the loop advances together: one per seed."""
        return self.trainers

    def start(self) -> None:
        """Claim the group directory and every seed's, and record the group's seeds."""
        if self.out_dir is not None:
            self.claim(resuming=False)
            self.record_group()

    def save_checkpoints(self) -> None:
        """Every seed's checkpoint; older checkpoints lose their training state only once every
        seed has its new one (a crash in between leaves a step that all seeds can resume)."""
        self._sync_to_trainers()
        for t in self.trainers:
            t.save(strip_older=False)
        for t in self.trainers:
            t.strip_older_states()

    def postfix(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        """The progress bar's median masked loss over the seeds."""
        median = sorted(r["eval_L_mask"] for r in rows)[len(rows) // 2]
        return {"median_L_mask": f"{median:.3f}"}

    def run(self, n_steps: int | None = None) -> MultiSeedResult:
        """Train every seed until step ``n_steps`` (default: the config's), through
        :func:`~tfmatcomp.training.loop.run_loop` with a :class:`VmapStep`.

        Raises:
            ValueError: ``n_steps`` is not a positive integer, or is below the current step.
            FloatingPointError: a seed's loss was not finite (the message names the seeds).
            RunDirError: see ``out_dir`` in the class docstring.
        """
        n_steps = check_n_steps(self.train_cfg.n_steps if n_steps is None else n_steps,
                                self.step, self.out_dir)
        run_loop(self, VmapStep(self), n_steps, desc=f"train {len(self.seeds)} seeds")
        models = self.models()
        results = {s: TrainResult(model=models[s].eval(), metrics=pd.DataFrame(t.records),
                                  out_dir=t.out_dir, step=t.step)
                   for s, t in zip(self.seeds, self.trainers)}
        return MultiSeedResult(seeds=self.seeds, results=results, out_dir=self.out_dir,
                               step=self.step)


class VmapStep(TrainingStep):
    """One update of every seed of a :class:`MultiSeedTrainer` as one batched program: each seed's
    batch from its own training stream, the stacked forward (``vmap``), the sum of the seeds'
    MSEs (so each seed gets its own gradient), one Adam step on the stacked parameters. A
    non-finite loss of any seed raises :class:`FloatingPointError` naming the seeds."""

    def __init__(self, group: MultiSeedTrainer):
        self.group = group

    def update(self) -> tuple[Tensor, list]:
        g, cfg = self.group, self.group.train_cfg
        if g.plan:
            g.plan.reinitialize(g.step, g.params, g.optimizer, g.fresh_parameters)
        batches, tokens = g.sample([t.train_gen for t in g.trainers], cfg.batch_size)
        values = torch.stack([b.values for b in batches])
        with g.intervened(g.step):
            predictions = g.forward(tokens)
        per_seed = (predictions.float() - values.float()).pow(2).mean(dim=(1, 2))
        if not torch.isfinite(per_seed).all():
            bad = [s for s, ok in zip(g.seeds, torch.isfinite(per_seed).tolist()) if not ok]
            raise FloatingPointError(f"training diverged at step {g.step + 1} for seeds "
                                     f"{bad}; try a lower lr (now {cfg.lr})")
        g.optimizer.zero_grad(set_to_none=True)
        per_seed.sum().backward()
        g.zero_padding_grad()
        if g.plan:
            g.plan.drop_frozen_grads(g.step, g.params)
        g.optimizer.step()
        return predictions, batches

    def train_metrics(self, update: tuple[Tensor, list]) -> list[dict[str, Tensor]]:
        predictions, batches = update
        objective = self.group.trainers[0].objective
        with torch.no_grad():
            return [objective.metrics(predictions[k].detach(), b) for k, b in enumerate(batches)]

    def evaluate(self) -> list[dict[str, float]]:
        return self.group.evaluate()


def write_group_file(out_dir: str | os.PathLike, seeds: list[int]) -> None:
    """Record a group of seed runs (``out_dir/seed-S``) in ``out_dir/seeds.json``, which
    :class:`~tfmatcomp.report.SeedGroup` and the report read.

    Seeds the file already lists whose run directory is still there stay in the group, so seeds
    trained into one directory by separate calls (``--seeds 1``, later ``--seeds 2``) form one
    group."""
    from tfmatcomp.runs.files import replace_file
    from tfmatcomp.runs.group import read_seeds

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        listed = read_seeds(out_dir)
    except ValueError:
        listed = []  # no file yet, or one this function did not write: start the group afresh
    seeds = sorted({int(s) for s in seeds} | {s for s in listed if seed_dir(out_dir, s).is_dir()})
    replace_file(out_dir / GROUP_FILE, json.dumps(
        {"seeds": seeds, "runs": [seed_dir(".", s).name for s in seeds]}, indent=2))


def _resume_at(trainer: Trainer, step: int) -> None:
    """Reload ``trainer`` from its checkpoint at ``step`` (which must hold training state)."""
    path = trainer.directory.checkpoint_at(step)
    if path is None:
        raise ValueError(f"seeds: {trainer.out_dir} has no resumable checkpoint at step {step}")
    trainer.restore(path)


def train_many(preset: str | Preset = "tiny", *, seeds: str | int | Sequence[int],
               resume: bool = False, **keywords: Any) -> MultiSeedResult:
    """Train one configuration for several seeds at once (see :class:`MultiSeedTrainer`).

    Seed ``s`` gets the run directory ``out_dir/seed-{s}``, an ordinary run: its checkpoints load
    with :func:`tfmatcomp.load_checkpoint` and it resumes with :func:`tfmatcomp.train` too.
    ``keywords`` are those of :class:`MultiSeedTrainer`; ``resume`` and ``overwrite`` work as in
    :func:`tfmatcomp.train`, on the group as a whole. A run that takes the fast step on a CPU
    (``d_model >= 256`` on a CPU with bf16 matrix units; see :mod:`tfmatcomp.training.fast_step`),
    one with ``fast=True``, and one with an attention penalty are trained one seed after another
    with :func:`tfmatcomp.train` instead of the batched float32 program (on a GPU the batched
    program stays, being nearly free per seed); each seed's ``run.json`` says which step trained
    it.

    Example:
        >>> import tfmatcomp as tm
        >>> runs = tm.train_many("tiny", seeds="0-2", n_steps=10, batch_size=8, log_every=5,
        ...                      progress=False)
        >>> [(s, r.step) for s, r in runs]
        [(0, 10), (1, 10), (2, 10)]
    """
    return run_group(plan_run(preset, keywords, resume=resume, seeds=seeds))


def run_plan(plan: RunPlan) -> TrainResult | MultiSeedResult:
    """Train ``plan``, one run's (:meth:`~tfmatcomp.Trainer.from_plan`) or a group's
    (:func:`run_group`), resuming when it says so: what ``tfmatcomp train`` runs in one process."""
    if plan.seeds is None:
        return resume_and_run(Trainer.from_plan(plan), plan.resume)
    return run_group(plan)


def run_group(plan: RunPlan) -> MultiSeedResult:
    """Train a group's ``plan``: as one batched program (:class:`MultiSeedTrainer`), or, for a plan
    the batched program does not train (an attention penalty, collected outside ``vmap``; the
    fast step on a CPU or asked for with ``fast=True``), each seed in turn as an ordinary run
    into the same ``out_dir/seed-{s}`` directories and ``seeds.json``."""
    if plan.batched:
        return resume_and_run(MultiSeedTrainer.from_plan(plan), plan.resume)
    if plan.out_dir is not None:
        write_group_file(plan.out_dir, list(plan.seeds))
    results = {s: resume_and_run(Trainer.from_plan(plan.for_seed(s)), plan.resume)
               for s in plan.seeds}
    return MultiSeedResult(seeds=list(plan.seeds), results=results, out_dir=plan.out_dir,
                           step=min(r.step for r in results.values()))
