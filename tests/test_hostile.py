"""Hostile files and inputs (issue 47, items 2-4 and 7-9): reads bounded by what a checkpoint can
be, nothing unverified sealed again, JSON without duplicate keys, group files of any shape refused
naming them, a full disk said plainly, and the model's last unchecked sizes and flags."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics import run_seeds
from tfmatcomp.training.sweeps import read_sweep
from tfmatcomp.cli import main
from tfmatcomp.runs import checkpoint as checkpoint_module
from tfmatcomp.runs.checkpoint_files import config_digest, seal_config, sha256_file
from tfmatcomp.runs.layout import (
    CHECKPOINTS_DIR, CONFIG_FILE, GROUP_FILE, METRICS_FILE, RUN_FILE, WEIGHTS_FILE,
    checkpoint_dir_name,
)

MODEL = dict(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)
KW = dict(batch_size=8, eval_batch_size=8, log_every=1, checkpoint_every=3, checkpoint_steps=(),
          device="cpu", progress=False)


def run(out, n_steps=3, **kw):
    return tm.train("tiny", model_cfg=tm.EncoderConfig(**MODEL), out_dir=out, n_steps=n_steps,
                    **{**KW, **kw})


def checkpoint(tmp_path: Path) -> Path:
    return tm.save_checkpoint(tm.HookedEncoder(tm.EncoderConfig(**MODEL)), tmp_path / "c", step=0)


def reseal(path: Path, edit) -> None:
    config = json.loads((path / CONFIG_FILE).read_text())
    edit(config)
    (path / CONFIG_FILE).write_text(json.dumps(seal_config(config)))


@pytest.fixture()
def no_hashing(monkeypatch):
    """``no_hashing()``: from then on, fail the test if a checkpoint's file is hashed."""
    def refuse(path):
        raise AssertionError(f"{path} was hashed")
    return lambda: monkeypatch.setattr(checkpoint_module, "sha256_file", refuse)


# --------------------------------------------------------------------- 2. bounded reads
def test_files_a_checkpoint_cannot_have_are_refused_before_any_hashing(tmp_path, no_hashing):
    path = checkpoint(tmp_path)
    extra = {}
    for i in range(3):  # the probe listed 3,000 sparse 64 MiB files, each with its right digest
        (path / f"extra-{i}.bin").write_bytes(b"x" * 100)
        extra[f"extra-{i}.bin"] = sha256_file(path / f"extra-{i}.bin")
    reseal(path, lambda c: c["files"].update(extra))
    no_hashing()
    with pytest.raises(tm.CheckpointError, match=r"lists 3 file\(s\) a checkpoint does not have"):
        tm.load_checkpoint(path)


def test_weights_headers_are_checked_against_the_config_before_hashing(tmp_path, no_hashing):
    path = checkpoint(tmp_path)
    # a config of ~9.7e9 parameters (within MAX_PARAMETERS) that would let a ~230 GB file through
    # the size cap; the weights file is a sparse 2 GiB file with the right digest, as crafted
    big = dict(n_layers=24, d_model=16384, n_heads=128, d_mlp=8192, n_ctx=16)
    (path / WEIGHTS_FILE).unlink()
    with open(path / WEIGHTS_FILE, "wb") as f:
        f.truncate(2 << 30)
    reseal(path, lambda c: c["model"].update(big))
    no_hashing()
    with pytest.raises(tm.CheckpointError, match="not a readable safetensors file"):
        tm.load_checkpoint(path)


def test_other_shapes_in_the_header_are_refused_before_hashing(tmp_path, no_hashing):
    path = checkpoint(tmp_path)
    reseal(path, lambda c: c["model"].update(d_mlp=48))
    no_hashing()
    with pytest.raises(tm.CheckpointError, match="describes a model of"):
        tm.load_checkpoint(path)


def test_a_sound_checkpoint_still_loads_and_hashes_its_files(tmp_path):
    path = checkpoint(tmp_path)
    assert tm.load_checkpoint(path).cfg == tm.EncoderConfig(**MODEL)


# ------------------------------------------------------------------- 3. verify before rewrite
def test_an_unsealed_edit_is_never_sealed_by_stripping_the_state(tmp_path):
    from tfmatcomp.runs.rundir import strip_state

    out = tmp_path / "r"
    run(out, n_steps=3)
    step3 = out / CHECKPOINTS_DIR / checkpoint_dir_name(3)
    config = json.loads((step3 / CONFIG_FILE).read_text())
    config["model"]["layer_norm_eps"] = 0.5  # edited, not sealed again: the load refuses it
    (step3 / CONFIG_FILE).write_text(json.dumps(config))
    before = {p.name: p.read_bytes() for p in step3.iterdir()}
    # what training on to step 6 does to step 3 (it keeps the state of the latest checkpoint only)
    with pytest.warns(UserWarning, match="does not verify"):
        assert strip_state(step3) is False
    assert {p.name: p.read_bytes() for p in step3.iterdir()} == before
    with pytest.raises(tm.CheckpointError, match="changed after it was written"):
        tm.load_checkpoint(step3)  # still refused: the edit was not sealed


def test_stripping_a_sound_checkpoint_still_works(tmp_path):
    from tfmatcomp.runs.rundir import strip_state

    out = tmp_path / "r"
    run(out, n_steps=3)
    step3 = out / CHECKPOINTS_DIR / checkpoint_dir_name(3)
    assert strip_state(step3) is True
    assert not tm.runs.layout.has_training_state(step3)
    assert tm.load_checkpoint(step3).cfg == tm.EncoderConfig(**MODEL)


# ------------------------------------------------------------------------ 4. duplicate keys
def _duplicate(text: str, key: str, value: str) -> str:
    """``text`` (a JSON object) with ``key`` given a second time, first, as ``value``."""
    return "{" + json.dumps(key) + ": " + value + ", " + text.strip()[1:]


@pytest.mark.parametrize("key", ["step", "files", "config_sha256", "model"])
def test_duplicate_keys_in_config_json_are_refused(tmp_path, key):
    path = checkpoint(tmp_path)
    text = (path / CONFIG_FILE).read_text()
    (path / CONFIG_FILE).write_text(_duplicate(text, key, '"other"'))  # the digest covers the last
    with pytest.raises(tm.CheckpointError, match=f"holds the key '{key}' twice"):
        tm.load_checkpoint(path)


def test_duplicate_keys_in_run_and_group_files_are_refused(tmp_path):
    out = tmp_path / "r"
    run(out)
    (out / RUN_FILE).write_text(_duplicate((out / RUN_FILE).read_text(), "seed", "7"))
    with pytest.raises(tm.runs.rundir.RunDirError, match="'seed' twice"):
        tm.runs.rundir.run_configs(out)
    g = tmp_path / "g"
    g.mkdir()
    (g / GROUP_FILE).write_text('{"seeds": [0], "seeds": [1]}')
    with pytest.raises(ValueError, match="seeds.json.*'seeds' twice"):
        run_seeds(g)
    (tmp_path / "sweep.json").write_text('{"runs": {}, "runs": {}, "seeds": [], "fields": []}')
    with pytest.raises(ValueError, match="sweep.json.*'runs' twice"):
        read_sweep(tmp_path)


def test_a_log_row_with_a_duplicate_key_is_set_aside(tmp_path):
    out = tmp_path / "r"
    run(out)
    with open(out / METRICS_FILE, "a") as f:
        f.write('{"step": 99, "step": 3, "eval_L_mask": 1.0}\n')
    with pytest.warns(UserWarning, match="1 unreadable line"):
        metrics = tm.read_metrics(out)
    assert list(metrics["step"]) == [1, 2, 3]  # neither 99 nor a second 3


def test_a_duplicate_key_on_the_command_line_is_refused_naming_it(tmp_path, capsys):
    argv = ["train", "--run-dir", str(tmp_path / "r"), "--steps", "2", "--intervention",
            '{"kind": "freeze", "groups": ["mlp"], "groups": ["all"]}']
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--intervention" in err and "'groups' twice" in err, err


# ----------------------------------------------------------------------- 7. group files
@pytest.mark.parametrize("content", ["[0, 1]", '{"seeds": 5}', '{"seeds": ["../../etc"]}',
                                     '{"seeds": [-1]}', '{"seeds": [true]}', '"seeds"'])
def test_a_malformed_seeds_json_is_refused_naming_it(tmp_path, capsys, content):
    g = tmp_path / "g"
    g.mkdir()
    (g / GROUP_FILE).write_text(content)
    with pytest.raises(ValueError, match=f"seeds.json: {g / GROUP_FILE}"):
        run_seeds(g)
    for argv in (["dynamics", str(g), "-o", str(tmp_path / "d.csv")],
                 ["report", str(g), "-o", str(tmp_path / "r.html")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(g / GROUP_FILE) in err, err
        assert "please report" not in err


def test_a_malformed_seeds_json_refuses_a_group_resume(tmp_path):
    g = tmp_path / "g"
    g.mkdir()
    (g / GROUP_FILE).write_text("[0, 1]")
    with pytest.raises(tm.runs.rundir.RunDirError, match="seeds.json"):
        tm.train_many("tiny", seeds="0-1", model_cfg=tm.EncoderConfig(**MODEL), out_dir=g,
                      n_steps=2, resume=True, **KW)


# --------------------------------------------------------------------------- 8. a full disk
def _full_disk_safetensors(*args, **kwargs):
    raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                          'message: "No space left on device" })')


def test_a_full_disk_at_a_checkpoint_names_the_file_and_the_run_resumes(tmp_path, capsys,
                                                                         monkeypatch):
    out = tmp_path / "r"
    argv = ["train", "--run-dir", str(out), "--steps", "3", "--batch-size", "8", "--log-every", "1",
            "--checkpoint-every", "3", "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    capsys.readouterr()
    monkeypatch.setattr(tm.runs.checkpoint_files, "save_file", _full_disk_safetensors)
    argv6 = [*argv, "--resume"]
    argv6[argv6.index("--steps") + 1] = "6"
    assert main(argv6) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert WEIGHTS_FILE in err and "disk is full" in err and "intact" in err, err
    assert "please report" not in err
    assert tm.load_checkpoint(out / CHECKPOINTS_DIR / checkpoint_dir_name(3)) is not None
    monkeypatch.undo()
    assert main(argv6) == 0  # space again: the run resumes and finishes
    assert list(tm.list_checkpoints(out)) == [3, 6]


def test_a_full_disk_in_the_metrics_log_names_it(tmp_path, monkeypatch):
    from tfmatcomp.runs.files import DiskFullError

    out = tmp_path / "r"
    run(out)
    real_write = os.write

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(METRICS_FILE):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(DiskFullError, match=f"{METRICS_FILE} could not be written: the disk is full"):
        run(out, n_steps=6, resume=True)


def test_a_full_disk_while_replacing_a_file_leaves_it_as_it_was(tmp_path, monkeypatch):
    from tfmatcomp.runs.files import DiskFullError, replace_file

    (tmp_path / "seeds.json").write_text("old")

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(DiskFullError, match="seeds.json could not be written.*intact"):
        replace_file(tmp_path / "seeds.json", "new")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["seeds.json"]
    assert (tmp_path / "seeds.json").read_text() == "old"


# ---------------------------------------------------------------- 9. the model's leftovers
def test_a_million_layers_are_refused_at_once():
    thin = dict(d_model=8, n_heads=2, d_mlp=32)  # 7.7e8 weights: within MAX_PARAMETERS
    with pytest.raises(ValueError, match=r"n_layers: .*1024"):
        tm.EncoderConfig(n_layers=10**6, **thin)
    assert tm.EncoderConfig(n_layers=1024, **thin).n_layers == 1024


def test_a_huge_composition_is_refused():
    from tfmatcomp.interventions import Composition, UniformAttentionAblation

    part = UniformAttentionAblation([(0, 0)])
    with pytest.raises(ValueError, match="at most 1,000"):
        Composition([part] * 200_000)
    assert len(Composition([part] * 1000).parts) == 1000


def test_names_filter_matching_nothing_is_refused_with_a_suggestion():
    model = tm.HookedEncoder(tm.EncoderConfig(**MODEL))
    tokens = torch.zeros(2, 16, dtype=torch.long)
    with pytest.raises(ValueError, match=r"did you mean \['blocks.0.hook_resid_post'"):
        model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_pots")
    with pytest.raises(ValueError, match="did you mean"):
        model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_pattern", "blocks.9.hook_z"])
    with pytest.raises(ValueError, match="matches no hook"):
        model.run_with_cache(tokens, names_filter=lambda name: name.endswith("nothing"))
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    assert list(cache.keys()) == ["blocks.0.hook_resid_post"]


def test_remove_batch_dim_on_a_batch_of_8_is_refused_as_transformer_lens_does():
    model = tm.HookedEncoder(tm.EncoderConfig(**MODEL))
    with pytest.raises(ValueError, match="batch size 8"):
        model.run_with_cache(torch.zeros(8, 16, dtype=torch.long), remove_batch_dim=True)
    _, cache = model.run_with_cache(torch.zeros(1, 16, dtype=torch.long), remove_batch_dim=True)
    assert cache["blocks.0.hook_resid_post"].shape == (16, 16)


def test_freeze_all_for_the_whole_run_is_refused():
    from tfmatcomp.interventions import Freeze

    with pytest.raises(ValueError, match=r"Freeze\('all'\) for the whole run would train nothing"):
        Freeze("all")
    assert Freeze("all", end_step=100).groups == ("all",)  # a pause
    assert Freeze("all", except_groups=["mlp"]).except_groups == ("mlp",)


def test_an_interrupt_leaves_is_caching_as_it_was(monkeypatch):
    model = tm.HookedEncoder(tm.EncoderConfig(**MODEL))
    real = model.get_caching_hooks

    def interrupted(*args, **kwargs):
        real(*args, **kwargs)  # TransformerLens sets is_caching here
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "get_caching_hooks", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.run_with_cache(torch.zeros(1, 16, dtype=torch.long))
    assert model.is_caching is False


# ------------------------------------------------------------- 5. every number has a range
BIG = str(2**63)


def test_every_numeric_argument_of_every_command_has_a_stated_range():
    from tfmatcomp.cli import BOUNDS, build_parser, int_list

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    checked = 0
    for name, sub in commands.items():
        for action in sub._actions:
            if action.type in (int, float, int_list):
                flag = max(action.option_strings, key=len)
                assert (name, flag) in BOUNDS or flag in BOUNDS, (name, flag)
                assert " in [" in action.help or " in (" in action.help, (name, flag, action.help)
                checked += 1
    assert checked >= 30


@pytest.mark.parametrize("argv, flag", [
    (["train", "--run-dir", "{tmp}/r", "--nproc", BIG], "--nproc"),
    (["train", "--run-dir", "{tmp}/r", "--batch-size", BIG], "--batch-size"),
    (["sweep", "--run-dir", "{tmp}/s", "--batch-size", BIG], "--batch-size"),
    (["dynamics", "tiny", "-o", "{tmp}/d.csv", "--samples", BIG], "--samples"),
    (["report", "tiny", "-o", "{tmp}/r.html", "--samples", BIG], "--samples"),
    (["demo", "--bundled", "-o", "{tmp}/r.html", "--samples", BIG], "--samples"),
    (["geometry", "{tmp}/model", "{tmp}/text", "-o", "{tmp}/g.html", "--batch-size", BIG],
     "--batch-size"),
    (["dynamics", "tiny", "-o", "{tmp}/d.csv", "--sample-seed", "-1"], "--sample-seed"),
    (["dynamics", "tiny", "-o", "{tmp}/d.csv", "--sample-seed", BIG], "--sample-seed"),
    (["dynamics", "tiny", "-o", "{tmp}/d.csv", "--steps", f"0,{BIG}"], "--steps"),
    (["train", "--run-dir", "{tmp}/r", "--checkpoint-steps", "-5"], "--checkpoint-steps"),
    (["train", "--run-dir", "{tmp}/r", "--lr", "1e300"], "--lr"),
], ids=lambda v: " ".join(v[:1] + v[-2:]) if isinstance(v, list) else None)
def test_a_number_out_of_range_is_refused_in_one_line_naming_it(tmp_path, capsys, monkeypatch,
                                                                 argv, flag):
    import tfmatcomp.distributed

    def no_launch(*args, **kwargs):
        raise AssertionError("launched processes")

    monkeypatch.setattr(tfmatcomp.distributed, "launch", no_launch)
    argv = [a.replace("{tmp}", str(tmp_path / "sub")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"tfmatcomp {argv[0]}: error: {flag}:"), err
    assert "must be" in err and "please report" not in err
    assert not (tmp_path / "sub").exists()


# --------------------------------------------------- 6. contradictions and outputs, up front
@pytest.mark.parametrize("pre, post", [("6000", "2000"), ("4000", "4000")])  # tiny's steps
def test_a_pre_step_not_before_the_post_step_is_refused_before_any_work(tmp_path, capsys, pre,
                                                                        post):
    out = tmp_path / "r.html"
    assert main(["report", "tiny", "-o", str(out), "--pre-step", pre, "--post-step", post]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pre-shift step" in err and "before" in err, err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--figure", "-o"])
def test_an_unwritable_output_is_refused_before_the_work(tmp_path, capsys, monkeypatch, flag):
    import tfmatcomp.analyses.dynamics as dynamics

    def no_work(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(dynamics, "over_checkpoints", no_work)
    csv = tmp_path / "d.csv"
    argv = ["dynamics", "tiny", "-o", str(csv), "--figure", str(tmp_path / "f.html")]
    argv[argv.index(flag) + 1] = "/dev/null/x"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{flag}: cannot write /dev/null/x" in err, err
    assert list(tmp_path.iterdir()) == []


def test_missing_output_folders_are_refused_the_same_way_in_every_command(tmp_path, capsys):
    """Issue 46: a missing output folder is refused in one line before any work, in every
    command (tests/test_cli.py covers report and demo), not made."""
    csv = tmp_path / "a" / "b" / "d.csv"
    argv = ["dynamics", "tiny", "-o", str(csv), "--samples", "8", "--batch-size", "8",
            "--measures", "L_mask", "--steps", "2000,6000"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err and list(tmp_path.iterdir()) == []
    csv = tmp_path / "d.csv"
    argv[3] = str(csv)
    argv[-1] = "1,6000"
    assert main(argv) == 2  # no checkpoint at step 1: nothing is left behind
    assert "steps" in capsys.readouterr().err and list(tmp_path.iterdir()) == []
    argv[-1] = "2000,6000"
    assert main(argv) == 0, capsys.readouterr().err
    assert csv.exists()
