"""The run plan (tfmatcomp.training.plan): each entry point reads the preset once and decides the
step once, and everything below takes the plan as it is."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.training import fast_step, multiseed, plan as plan_mod
from tfmatcomp.training.plan import BATCHED_STEP, plan_configs, plan_run

FAST = dict(n_steps=2, batch_size=4, eval_batch_size=4, log_every=2, progress=False,
            device="cpu")
TRAINING = Path(tm.__file__).parent / "training"


@pytest.fixture
def counted(monkeypatch):
    """Count the preset readings and the fast-step decisions."""
    counts: Counter = Counter()
    get_preset, decide = plan_mod.get_preset, fast_step.decide

    def counting_get_preset(*a, **k):
        counts["preset"] += 1
        return get_preset(*a, **k)

    def counting_decide(*a, **k):
        counts["decide"] += 1
        return decide(*a, **k)

    monkeypatch.setattr(plan_mod, "get_preset", counting_get_preset)
    monkeypatch.setattr(fast_step, "decide", counting_decide)
    return counts


def test_only_the_plan_reads_a_preset_or_decides_the_step():
    """No training module but plan.py calls get_preset or fast_step.decide / use_fast."""
    for path in TRAINING.glob("*.py"):
        if path.name in ("plan.py", "fast_step.py"):
            continue
        calls = {node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                 for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
                 and isinstance(node.func, (ast.Attribute, ast.Name))}
        assert not calls & {"get_preset", "decide", "use_fast", "blocker"}, path.name


def test_train_many_reads_the_preset_once_and_decides_the_step_once(counted):
    runs = tm.train_many("tiny", seeds=[0, 1], **FAST)
    assert runs.seeds == [0, 1]
    assert counted == {"preset": 1, "decide": 1}  # before the plan: 4 readings, 3 decisions


def test_sweep_reads_the_preset_once(counted, tmp_path):
    tm.sweep({"lr": [1e-3, 2e-3]}, "tiny", seeds=[0], out_dir=tmp_path, **FAST)
    # before the plan: 7 readings for two configurations; one step decided per configuration
    assert counted == {"preset": 1, "decide": 2}


def test_a_trainer_takes_its_plan_as_it_is(counted, monkeypatch):
    plan = plan_run("tiny", FAST)
    group_plan = plan_configs(plan.model_cfg, plan.task_cfg, plan.train_cfg, device="cpu",
                              seeds="0-2", progress=False)
    assert counted == {"preset": 1, "decide": 2}

    def refuse(*a, **k):
        raise AssertionError("the preset was read or the step decided below the entry point")

    monkeypatch.setattr(fast_step, "decide", refuse)
    monkeypatch.setattr(plan_mod, "get_preset", refuse)
    trainer = tm.Trainer.from_plan(plan)
    assert (trainer.fast, trainer.step_reason, trainer.train_cfg) == (
        plan.fast, plan.step_reason, plan.train_cfg)
    group = tm.MultiSeedTrainer.from_plan(group_plan)
    assert [t.train_cfg.seed for t in group.trainers] == [0, 1, 2]
    assert {t.step_reason for t in group.trainers} == {BATCHED_STEP}


def test_the_plan_is_immutable_and_gives_each_seed_its_own():
    plan = plan_run("tiny", {**FAST, "out_dir": "runs/x"}, seeds="0-2", resume=True)
    with pytest.raises(AttributeError):
        plan.seeds = (5,)  # type: ignore[misc]
    one = plan.for_seed(2)
    assert (one.train_cfg.seed, one.out_dir, one.seeds, one.resume) == (
        2, Path("runs/x/seed-2"), None, True)
    assert plan.batched and one.step_reason == BATCHED_STEP and not one.fast
    with pytest.raises(ValueError, match="seed"):
        plan.for_seed(7)
    with pytest.raises(ValueError, match="seeds=..."):
        plan_run("tiny", {"seed": 3}, seeds="0-1")
    with pytest.raises(ValueError, match="resume, overwrite"):
        plan_run("tiny", {"overwrite": True}, resume=True)
    with pytest.raises(TypeError, match="plan"):
        tm.Trainer("tiny", plan=plan_run("tiny", FAST), lr=1e-3)
    with pytest.raises(ValueError, match="group"):
        tm.Trainer.from_plan(plan)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_demo_decides_as_train_many_does(device, monkeypatch, tmp_path):
    """``tfmatcomp demo`` on a GPU follows train_many's decision (it once trained the seeds one
    by one whenever the fast step was on, which it is by default on CUDA): both take the plan of
    :func:`plan_run` and train it with :func:`run_group`."""
    from tfmatcomp.cli import main

    if device == "cuda":  # decide as on a GPU without one: the plan only needs the device
        monkeypatch.setattr(plan_mod, "check_device", lambda name, d: torch.device(d))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    seen: list = []

    def capture(plan):
        seen.append(plan)
        raise KeyboardInterrupt  # stop before training

    monkeypatch.setattr(multiseed, "run_group", capture)
    with pytest.raises(KeyboardInterrupt):
        tm.train_many("tiny", seeds="0-1", device=device, n_steps=3, progress=False)
    with pytest.raises(KeyboardInterrupt):
        main(["demo", "--run-dir", str(tmp_path / "d"), "--seeds", "0-1", "--no-progress",
              "--steps", "3", "--device", device, "-o", str(tmp_path / "r.html")])
    train_many_plan, demo_plan = seen
    assert demo_plan.batched and train_many_plan.batched  # on a GPU the fast step is on
    assert demo_plan.fast == train_many_plan.fast == (device == "cuda")
    assert (demo_plan.device, demo_plan.step_reason) == (train_many_plan.device,
                                                         train_many_plan.step_reason)


@pytest.mark.parametrize("device, fast, batched", [
    ("cpu", None, True),    # tiny keeps the float32 step on a CPU: batched
    ("cuda", None, True),   # the fast step on a GPU: the batched program stays, nearly free
    ("cpu", True, False),   # fast=True: one seed at a time on the fast step
    ("cuda", True, False),
])
def test_when_a_group_is_batched(device, fast, batched, monkeypatch):
    monkeypatch.setattr(plan_mod, "check_device", lambda name, d: torch.device(d))
    plan = plan_run("tiny", {"device": device, "fast": fast}, seeds="0-1")
    assert plan.batched is batched
    assert plan.for_seed(1).fast is (not batched)


def test_cli_train_in_one_process_does_not_go_through_distributed(monkeypatch, tmp_path):
    from tfmatcomp import distributed
    from tfmatcomp.cli import main

    def refuse(*a, **k):
        raise AssertionError("distributed trainers used in one process")

    monkeypatch.setattr(distributed, "train", refuse)
    monkeypatch.setattr(distributed, "train_many", refuse)
    assert main(["train", "--preset", "tiny", "--steps", "2", "--run-dir", str(tmp_path / "r"),
                 "--no-progress", "--device", "cpu"]) == 0
    assert tm.read_metrics(tmp_path / "r")["step"].tolist() == [2]
