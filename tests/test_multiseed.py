"""Many seeds at once: each seed is its single-seed run (up to float rounding), resumes exactly,
and writes ordinary run directories."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.cli import main as cli_main
from tfmatcomp.training.multiseed import MultiSeedTrainer, parse_seeds, write_group_file
from tfmatcomp.training.trainer import processor
from tfmatcomp.runs.layout import GROUP_FILE, RUN_FILE, checkpoint_dir_name, seed_dir

SMALL = dict(model_cfg=tm.EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=16),
             batch_size=16, eval_batch_size=32, log_every=20, device="cpu", progress=False)


@pytest.fixture(scope="module")
def two_seeds():
    return tm.train_many("tiny", seeds=[0, 3], n_steps=200, checkpoint_every=0, **SMALL)


@pytest.mark.parametrize("seed", [0, 3])
def test_each_seed_follows_its_single_seed_run(two_seeds, seed):
    single = tm.train("tiny", seed=seed, n_steps=200, checkpoint_every=0, **SMALL)
    batched = two_seeds[seed]
    assert list(batched.metrics["step"]) == list(single.metrics["step"])
    for col in ("train_L", "eval_L_obs", "eval_L_mask"):
        np.testing.assert_allclose(batched.metrics[col], single.metrics[col], rtol=1e-3, atol=1e-6)
    ours = dict(batched.model.named_parameters())
    for name, p in single.model.named_parameters():
        torch.testing.assert_close(ours[name], p, rtol=1e-3, atol=1e-4, msg=name)


def test_seeds_differ_and_mask_embedding_stays_zero(two_seeds):
    a, b = two_seeds[0].model, two_seeds[3].model
    assert not torch.equal(a.W_pos, b.W_pos)
    for _, result in two_seeds:
        assert torch.count_nonzero(result.model.W_E[tm.MASK_TOKEN_ID]) == 0


def test_resume_reproduces_the_uninterrupted_batched_run(tmp_path):
    kw = dict(SMALL, checkpoint_every=20)
    full = tm.train_many("tiny", seeds="1-2", n_steps=60, out_dir=tmp_path / "full", **kw)
    tm.train_many("tiny", seeds="1-2", n_steps=40, out_dir=tmp_path / "part", **kw)
    resumed = tm.train_many("tiny", seeds="1-2", n_steps=60, out_dir=tmp_path / "part",
                            resume=True, **kw)
    for seed in (1, 2):
        assert resumed[seed].metrics.drop(columns="elapsed_s").equals(
            full[seed].metrics.drop(columns="elapsed_s"))
        log = tm.read_metrics(seed_dir(tmp_path / "part", seed))
        assert list(log["step"]) == [20, 40, 60]


def test_seed_directories_are_ordinary_runs(tmp_path):
    out = tmp_path / "group"
    tm.train_many("tiny", seeds=[0, 1], n_steps=40, out_dir=out, checkpoint_every=20, **SMALL)
    assert json.loads((out / GROUP_FILE).read_text())["seeds"] == [0, 1]
    run = json.loads((seed_dir(out, 1) / RUN_FILE).read_text())
    assert run["seed"] == 1 and run["torch"] == torch.__version__ and run["torch_threads"] >= 1
    # the CPU model too: the same seed, torch and threads are bit-identical only on the same one
    assert run["processor"] == processor("cpu")
    assert torch.backends.cpu.get_cpu_capability() in run["processor"]
    model = tm.load_checkpoint(seed_dir(out, 1))
    assert isinstance(model, tm.HookedEncoder)
    # A single-seed trainer resumes a seed of the group, its Adam state included.
    cont = tm.train("tiny", seed=1, n_steps=60, out_dir=seed_dir(out, 1), resume=True,
                    checkpoint_every=20, **SMALL)
    ref = tm.train("tiny", seed=1, n_steps=60, checkpoint_every=0, **SMALL)
    np.testing.assert_allclose(cont.metrics["eval_L"], ref.metrics["eval_L"], rtol=1e-3)


def test_resume_refuses_a_group_with_a_seed_missing(tmp_path):
    out = tmp_path / "group"
    tm.train_many("tiny", seeds=[0], n_steps=20, out_dir=out, checkpoint_every=20, **SMALL)
    with pytest.raises(ValueError, match=r"seeds: \[1\]"):
        tm.train_many("tiny", seeds=[0, 1], n_steps=40, out_dir=out, resume=True,
                      checkpoint_every=20, **SMALL)


def test_parse_seeds_and_bad_input():
    assert parse_seeds("0-2,5") == [0, 1, 2, 5]
    for bad in ("", "3-1", "a", "1,1", [-1]):
        with pytest.raises(ValueError, match="seeds"):
            parse_seeds(bad)
    with pytest.raises(ValueError, match="seed"):
        MultiSeedTrainer("tiny", seeds=[0], seed=1)
    trainer = MultiSeedTrainer("tiny", seeds=[0, 1], **{k: v for k, v in SMALL.items()
                                                         if k != "progress"})
    with pytest.raises(ValueError, match="tokens"):
        trainer.forward(torch.zeros(3, 2, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        trainer.forward(torch.full((2, 2, 16), 5000, dtype=torch.long))


def test_cli_trains_several_seeds(tmp_path, capsys):
    code = cli_main(["train", "--preset", "tiny", "--seeds", "0-1", "--steps", "10",
                     "--batch-size", "8", "--log-every", "5", "--run-dir", str(tmp_path / "g"),
                     "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "seed 0, step 10" in out and "seed 1, step 10" in out
    assert tm.read_metrics(tmp_path / "g" / "seed-1")["step"].tolist() == [5, 10]


def test_a_crash_between_two_seeds_checkpoints_resumes_at_their_common_step(tmp_path, monkeypatch):
    kw = dict(SMALL, checkpoint_every=10)
    full = tm.train_many("tiny", seeds=[0, 1], n_steps=40, out_dir=tmp_path / "full", **kw)
    real_save = tm.Trainer.save

    def save(self, strip_older=True):
        if self.step == 30 and self.train_cfg.seed == 1:
            raise KeyboardInterrupt  # killed after seed 0 wrote step 30, before seed 1 did
        return real_save(self, strip_older)

    monkeypatch.setattr(tm.Trainer, "save", save)
    with pytest.raises(KeyboardInterrupt):
        tm.train_many("tiny", seeds=[0, 1], n_steps=40, out_dir=tmp_path / "cut", **kw)
    monkeypatch.undo()
    assert set(tm.list_checkpoints(seed_dir(tmp_path / "cut", 0))) == {10, 20, 30}
    with pytest.warns(UserWarning, match=checkpoint_dir_name(30)):
        resumed = tm.train_many("tiny", seeds=[0, 1], n_steps=40, out_dir=tmp_path / "cut",
                                resume=True, **kw)
    for seed in (0, 1):
        assert resumed[seed].metrics.drop(columns="elapsed_s").equals(
            full[seed].metrics.drop(columns="elapsed_s"))
        assert set(tm.list_checkpoints(seed_dir(tmp_path / "cut", seed))) == {10, 20, 30, 40}


def test_resume_of_a_group_is_idempotent_and_never_goes_back(tmp_path):
    """What ``tfmatcomp demo`` relies on: resume=True starts, continues and finishes a group."""
    kw = dict(SMALL, checkpoint_every=10)
    out = tmp_path / "g"
    first = tm.train_many("tiny", seeds=[0, 1], n_steps=20, out_dir=out, resume=True, **kw)
    again = tm.train_many("tiny", seeds=[0, 1], n_steps=20, out_dir=out, resume=True, **kw)
    assert again.step == first.step == 20
    assert tm.read_metrics(seed_dir(out, 1))["step"].tolist() == [20]
    with pytest.raises(ValueError, match="n_steps: 10 is below step 20"):
        tm.train_many("tiny", seeds=[0, 1], n_steps=10, out_dir=out, resume=True, **kw)
    with pytest.raises(ValueError, match=r"seeds: \[2\]"):
        tm.train_many("tiny", seeds=[0, 1, 2], n_steps=30, out_dir=out, resume=True, **kw)


def test_one_seed_is_exactly_the_single_seed_run():
    """With one seed there is nothing to batch: the same fused program, bit for bit."""
    kw = dict(SMALL, n_steps=60, checkpoint_every=0)
    one = tm.train_many("tiny", seeds=[4], **kw)[4]
    single = tm.train("tiny", seed=4, **kw)
    assert one.metrics.drop(columns="elapsed_s").equals(single.metrics.drop(columns="elapsed_s"))
    assert all(torch.equal(p, q) for p, q in zip(one.model.parameters(), single.model.parameters()))


def test_fast_runs_train_one_seed_at_a_time_and_say_so(tmp_path):
    """The batched program is float32: a run that takes the fast step trains each seed on it in
    turn (as train() does), and every seed's run.json names the step that really trained it."""
    from tfmatcomp.training.multiseed import BATCHED_STEP

    kw = dict(n_steps=6, batch_size=8, log_every=3, progress=False)
    fast = tm.train_many("tiny", seeds=[0, 1], out_dir=tmp_path / "fast", fast=True, **kw)
    alone = tm.train("tiny", seed=1, out_dir=tmp_path / "alone", fast=True, **kw)
    for name, p in alone.model.state_dict().items():
        assert torch.equal(p, fast[1].model.state_dict()[name]), name  # the same run, bit for bit
    record = json.loads((seed_dir(tmp_path / "fast", 1) / RUN_FILE).read_text())
    assert record["step"].startswith("fast step")
    assert json.loads((tmp_path / "fast" / GROUP_FILE).read_text())["seeds"] == [0, 1]

    batched = tm.train_many("tiny", seeds=[0, 1], out_dir=tmp_path / "batched", **kw)
    assert batched.seeds == [0, 1]
    record = json.loads((seed_dir(tmp_path / "batched", 0) / RUN_FILE).read_text())
    assert record["step"] == BATCHED_STEP
    with pytest.raises(ValueError, match="fast"):
        MultiSeedTrainer("tiny", seeds=[0, 1], fast=True, **kw)


def test_group_file_keeps_seeds_trained_by_earlier_calls(tmp_path):
    out = tmp_path / "group"
    for s in (1, 2):
        seed_dir(out, s).mkdir(parents=True)
    write_group_file(out, [1])
    write_group_file(out, [2])  # a second call into the same directory (e.g. --seeds 2)
    assert json.loads((out / GROUP_FILE).read_text())["seeds"] == [1, 2]
    seed_dir(out, 1).rmdir()  # a listed seed whose run is gone leaves the group
    write_group_file(out, [2])
    group = json.loads((out / GROUP_FILE).read_text())
    assert group == {"seeds": [2], "runs": ["seed-2"]}
    (out / GROUP_FILE).write_text("not json")  # a damaged file starts the group afresh
    write_group_file(out, [2])
    assert json.loads((out / GROUP_FILE).read_text())["seeds"] == [2]
