import json
import math

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint_files import seal_config
from tfmatcomp.runs.checkpoint import CheckpointError, ConfigMismatchError, load_checkpoint_info
from tfmatcomp.runs.layout import CONFIG_FILE, STATE_FILE, WEIGHTS_FILE

SMALL = dict(n_steps=30, batch_size=16, eval_batch_size=16, log_every=5, checkpoint_every=0,
             device="cpu", progress=False)


def small_cfg():
    return tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)


def metrics_without_time(result):
    return result.metrics.drop(columns="elapsed_s").reset_index(drop=True)


def test_copying_phase_l_obs_drops_10x(trained_tiny):
    m = trained_tiny.metrics
    first, last = m.iloc[0], m.iloc[-1]
    untrained = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    batch = tm.get_preset("tiny").task.build().sample(256, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        l_obs0 = tm.losses(untrained(batch.tokens), batch)["L_obs"].item()
        l_obs1 = tm.losses(trained_tiny.model(batch.tokens), batch)["L_obs"].item()
    assert l_obs1 < l_obs0 / 10
    assert last["eval_L_obs"] < 5e-3
    # still on the copying plateau at masked entries: predictions near 0, L_mask near E[x^2]
    assert last["eval_mean_abs_pred_mask"] < 0.1
    assert 0.05 < last["eval_L_mask"] < 0.2
    assert list(m["step"]) == list(range(25, 301, 25))
    assert set(tm.list_checkpoints(trained_tiny.out_dir)) == {100, 300}
    assert not math.isnan(first["train_L"])


def test_same_seed_same_losses_different_seed_different():
    a = tm.train("tiny", model_cfg=small_cfg(), seed=1, **SMALL)
    b = tm.train("tiny", model_cfg=small_cfg(), seed=1, **SMALL)
    c = tm.train("tiny", model_cfg=small_cfg(), seed=2, **SMALL)
    assert metrics_without_time(a).equals(metrics_without_time(b))
    assert not metrics_without_time(a).equals(metrics_without_time(c))


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    kw = dict(SMALL, checkpoint_steps=(10,))
    full = tm.train("tiny", model_cfg=small_cfg(), out_dir=tmp_path / "full", **kw)
    tm.train("tiny", model_cfg=small_cfg(), out_dir=tmp_path / "cut", **dict(kw, n_steps=10))
    resumed = tm.train("tiny", model_cfg=small_cfg(), out_dir=tmp_path / "cut", resume=True, **kw)
    assert metrics_without_time(full).equals(metrics_without_time(resumed))
    assert tm.read_metrics(tmp_path / "cut")["step"].tolist() == list(range(5, 31, 5))
    for p, q in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)
    # only the latest checkpoint keeps the (large) training state
    cks = tm.list_checkpoints(tmp_path / "cut")
    assert set(cks) == {10, 30}
    assert not (cks[10] / STATE_FILE).exists() and (cks[30] / STATE_FILE).exists()


def test_resume_refuses_a_different_config(tmp_path):
    tm.train("tiny", model_cfg=small_cfg(), out_dir=tmp_path, **dict(SMALL, n_steps=5))
    with pytest.raises(ConfigMismatchError, match="config"):
        tm.train("tiny", model_cfg=tm.EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16),
                 out_dir=tmp_path, resume=True, **SMALL)
    with pytest.raises(ConfigMismatchError, match="lr"):
        tm.train("tiny", model_cfg=small_cfg(), out_dir=tmp_path, resume=True, **dict(SMALL, lr=0.5))


def test_checkpoint_round_trip_and_config_check(tmp_path, tiny_model):
    path = tm.save_checkpoint(tiny_model, tmp_path / "ck", task_cfg=tm.TaskConfig(n_rows=4, rank=1), step=7)
    model, info = load_checkpoint_info(path)
    assert info.step == 7 and info.task_cfg.n_rows == 4
    for a, b in zip(tiny_model.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    assert tm.load_checkpoint(path / WEIGHTS_FILE).cfg == tiny_model.cfg
    with pytest.raises(ConfigMismatchError, match="config"):
        tm.load_checkpoint(path, config=small_cfg())


def test_corrupted_checkpoints_are_refused(tmp_path, tiny_model):
    path = tm.save_checkpoint(tiny_model, tmp_path / "ck")
    weights = path / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF  # flip bits in the tensor data
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        tm.load_checkpoint(path)
    weights.write_bytes(bytes(data[:100]))  # truncated file
    with pytest.raises(CheckpointError):
        tm.load_checkpoint(path)
    (path / CONFIG_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="JSON"):
        tm.load_checkpoint(path)


def test_truncated_weights_without_digest_are_refused_cleanly(tmp_path, tiny_model):
    path = tm.save_checkpoint(tiny_model, tmp_path / "ck")
    cfg = json.loads((path / CONFIG_FILE).read_text())
    cfg["files"] = {}
    (path / CONFIG_FILE).write_text(json.dumps(seal_config(cfg)))
    (path / WEIGHTS_FILE).write_bytes(b"\x10\x00\x00\x00garbage")
    with pytest.raises(CheckpointError, match="safetensors"):
        tm.load_checkpoint(path)


def test_pickles_are_refused(tmp_path, tiny_model):
    pt = tmp_path / "model.pt"
    torch.save(tiny_model.state_dict(), pt)
    with pytest.raises(CheckpointError, match="pickle"):
        tm.load_checkpoint(pt)
    disguised = tmp_path / "weights"
    disguised.write_bytes(pt.read_bytes())
    with pytest.raises(CheckpointError, match="pickle"):
        tm.load_checkpoint(disguised)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        tm.load_checkpoint(tmp_path / "missing")


def test_nan_loss_stops_training_with_a_clear_error():
    model = tm.HookedEncoder(small_cfg(), seed=0)
    with torch.no_grad():
        model.blocks[0].mlp.W_in[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="diverged at step 1"):
        tm.train("tiny", model=model, **SMALL)


def test_training_one_component_alone():
    from tfmatcomp.interventions.during_training import Freeze
    from tfmatcomp.models.param_groups import group_predicate

    base = tm.HookedEncoder(small_cfg(), seed=0)
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    r = tm.train("tiny", model=base, interventions=[Freeze("all", except_groups=["attention"])],
                 **dict(SMALL, n_steps=5))
    attention = group_predicate("attention")
    for n, p in r.model.named_parameters():
        assert torch.equal(p, before[n]) != attention(n), n


def test_cli_train_and_resume(tmp_path, capsys):
    from tfmatcomp.cli import main

    args = ["train", "--preset", "tiny", "--run-dir", str(tmp_path), "--batch-size", "8",
            "--log-every", "5", "--no-progress", "--device", "cpu"]
    assert main(args + ["--steps", "10"]) == 0
    assert main(args + ["--steps", "20", "--resume"]) == 0
    assert tm.read_metrics(tmp_path)["step"].tolist() == [5, 10, 15, 20]
    assert "run written" in capsys.readouterr().out


# ------------------------------------------------- the training keywords, stated once (RunSetup)
def test_every_entry_point_takes_the_training_keywords_of_run_setup():
    from tfmatcomp.training.plan import RunSetup

    setup = RunSetup.from_keywords("tiny", {"out_dir": "runs/x", "overwrite": True, "lr": 1e-3,
                                            "n_steps": 7})
    assert (setup.preset, setup.out_dir, setup.overwrite, setup.progress) == (
        "tiny", "runs/x", True, True)
    assert setup.train_overrides == {"lr": 1e-3, "n_steps": 7}
    model_cfg, task_cfg, train_cfg = setup.configs()
    assert (model_cfg, task_cfg) == (tm.get_preset("tiny").model, tm.get_preset("tiny").task)
    assert (train_cfg.lr, train_cfg.n_steps) == (1e-3, 7)
    trainer = tm.Trainer("tiny", model_cfg=small_cfg(), device="cpu", progress=False, n_steps=7)
    assert (trainer.model_cfg, trainer.train_cfg.n_steps, trainer.progress) == (small_cfg(), 7, False)
    with pytest.raises(TypeError, match="n_step"):  # a misspelt keyword is no TrainConfig field
        tm.Trainer("tiny", n_step=7)
    with pytest.raises(ValueError, match="resume, overwrite"):
        tm.train("tiny", resume=True, overwrite=True)
    with pytest.raises(ValueError, match="resume, overwrite"):
        tm.train_many("tiny", seeds=[0], resume=True, overwrite=True)


def test_a_seed_group_refuses_a_model_or_an_unknown_keyword():
    model = tm.HookedEncoder(small_cfg())
    with pytest.raises(TypeError, match="model"):
        tm.MultiSeedTrainer("tiny", seeds=[0, 1], model=model, progress=False)
    with pytest.raises(TypeError, match="trainable"):
        tm.MultiSeedTrainer("tiny", seeds=[0, 1], trainable=lambda n: True, progress=False)
