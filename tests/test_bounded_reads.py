"""Files a hostile or unlucky run directory holds (issue 26, bounded reads): fifos, symlinks to
devices, huge sparse files and malformed JSON are refused with a message naming the file, before
anything blocks, runs out of memory or hashes for hours."""

from __future__ import annotations

import json
import os

import pytest

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint_files import seal_config
from tfmatcomp.runs.rundir import run_configs
from tfmatcomp.validation import read_bounded
from tfmatcomp.runs.layout import CONFIG_FILE, METRICS_FILE, RUN_FILE, STATE_FILE, STATE_TENSORS_FILE

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs fifos (POSIX)")


@pytest.fixture
def run(tmp_path):
    out = tmp_path / "run"
    tm.train("tiny", out_dir=out, n_steps=2, batch_size=4, log_every=1, progress=False)
    return out


def _replace(path, how):
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


@pytest.mark.parametrize("how", ["fifo", "/dev/zero"])
def test_metrics_log_that_is_not_a_file_is_refused(run, how):
    _replace(run / METRICS_FILE, how)
    with pytest.raises(ValueError, match="metrics log: .* not a regular file"):
        tm.read_metrics(run)
    with pytest.raises(ValueError, match="not a regular file"):
        tm.train("tiny", out_dir=run, n_steps=3, batch_size=4, resume=True, progress=False)


@pytest.mark.parametrize("how", ["fifo", "/dev/zero"])
def test_run_json_that_is_not_a_file_is_replaced_never_opened(run, how):
    _replace(run / RUN_FILE, how)
    with pytest.raises(ValueError, match="run.json: .* not a regular file"):
        run_configs(run)
    result = tm.train("tiny", out_dir=run, n_steps=3, batch_size=4, resume=True, progress=False)
    assert result.step == 3 and (run / RUN_FILE).is_file() and not (run / RUN_FILE).is_symlink()
    assert json.loads((run / RUN_FILE).read_text())["train"]["n_steps"] == 3


def test_huge_sparse_checkpoint_file_is_refused_before_hashing(run):
    ckpt = max(tm.list_checkpoints(run).items())[1]
    config = json.loads((ckpt / CONFIG_FILE).read_text())
    (ckpt / STATE_TENSORS_FILE).unlink()
    with open(ckpt / STATE_TENSORS_FILE, "wb") as f:  # a name a checkpoint may have
        f.truncate(1 << 40)  # 1 TiB, sparse
    config["files"][STATE_TENSORS_FILE] = "0" * 64
    (ckpt / CONFIG_FILE).write_text(json.dumps(seal_config(config)))
    with pytest.raises(tm.CheckpointError, match="state.safetensors holds 1,099,511,627,776 bytes"):
        tm.load_checkpoint(ckpt)


@pytest.mark.parametrize("content", ["[]", '{"runs": []}', "{not json"])
def test_malformed_sweep_record_is_refused_naming_the_file(tmp_path, content):
    (tmp_path / "sweep.json").write_text(content)
    with pytest.raises(ValueError, match="sweep.json"):
        tm.training.sweeps.read_sweep(tmp_path)


def test_read_bounded_limits_size_and_refuses_devices(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x" * 100)
    assert read_bounded("f", f, 100) == "x" * 100
    with pytest.raises(ValueError, match="holds 100 bytes, more than the 99"):
        read_bounded("f", f, 99)
    with pytest.raises(ValueError, match="not a regular file"):
        read_bounded("f", "/dev/zero", 10)
    with pytest.raises(ValueError, match="cannot be read"):
        read_bounded("f", tmp_path / "missing", 10)


def _edit_state(ckpt, edit):
    """Edit a checkpoint's state.json and recompute its digest (as a hand edit would)."""
    import hashlib

    state = json.loads((ckpt / STATE_FILE).read_text())
    edit(state)
    (ckpt / STATE_FILE).write_text(json.dumps(state))
    config = json.loads((ckpt / CONFIG_FILE).read_text())
    config["files"][STATE_FILE] = hashlib.sha256((ckpt / STATE_FILE).read_bytes()).hexdigest()
    (ckpt / CONFIG_FILE).write_text(json.dumps(seal_config(config)))


def test_a_state_whose_step_is_not_its_checkpoints_is_refused_and_nothing_is_deleted(tmp_path):
    out = tmp_path / "run"
    tm.train("tiny", out_dir=out, n_steps=6, batch_size=4, log_every=2, checkpoint_every=3,
             progress=False)
    ckpt = tm.list_checkpoints(out)[6]
    _edit_state(ckpt, lambda s: s.update(step=2))
    with pytest.raises(tm.runs.rundir.RunDirError, match="says step 2 but the checkpoint is step 6"):
        tm.train("tiny", out_dir=out, n_steps=8, batch_size=4, log_every=2, checkpoint_every=3,
                 resume=True, progress=False)
    assert sorted(tm.list_checkpoints(out)) == [3, 6]


def test_a_state_with_another_learning_rate_is_refused(tmp_path):
    out = tmp_path / "run"
    tm.train("tiny", out_dir=out, n_steps=4, batch_size=4, log_every=2, progress=False)
    ckpt = tm.list_checkpoints(out)[4]
    _edit_state(ckpt, lambda s: [g.update(lr=100.0) for g in s["param_groups"]])
    with pytest.raises(tm.ConfigMismatchError, match="lr: .* records Adam lr 100.0"):
        tm.train("tiny", out_dir=out, n_steps=6, batch_size=4, log_every=2, resume=True,
                 progress=False)


def test_checkpoint_metadata_must_be_an_object(run):
    ckpt = max(tm.list_checkpoints(run).items())[1]
    config = json.loads((ckpt / CONFIG_FILE).read_text())
    config["metadata"] = [1, 2]
    (ckpt / CONFIG_FILE).write_text(json.dumps(seal_config(config)))
    with pytest.raises(tm.CheckpointError, match="'metadata' of type list"):
        tm.load_checkpoint(ckpt)


def test_a_5000_digit_size_in_a_checkpoint_is_a_checkpoint_error(run):
    ckpt = max(tm.list_checkpoints(run).items())[1]
    text = (ckpt / CONFIG_FILE).read_text()
    config = json.loads(text)
    config["model"]["d_model"] = 12345
    text = json.dumps(config).replace("12345", "9" * 5000)
    (ckpt / CONFIG_FILE).write_text(text)
    with pytest.raises(tm.CheckpointError, match="config.json is not valid JSON"):
        tm.load_checkpoint(ckpt)


def test_training_state_without_its_generators_is_named_not_a_key_error(tmp_path):
    import hashlib

    from safetensors.torch import load_file, save_file

    out = tmp_path / "run"
    tm.train("tiny", out_dir=out, n_steps=4, batch_size=4, log_every=2, progress=False)
    ckpt = tm.list_checkpoints(out)[4]
    tensors = load_file(ckpt / STATE_TENSORS_FILE)
    del tensors["rng.train"]
    save_file(tensors, ckpt / STATE_TENSORS_FILE)
    config = json.loads((ckpt / CONFIG_FILE).read_text())
    config["files"][STATE_TENSORS_FILE] = hashlib.sha256(
        (ckpt / STATE_TENSORS_FILE).read_bytes()).hexdigest()
    (ckpt / CONFIG_FILE).write_text(json.dumps(seal_config(config)))
    with pytest.raises(tm.runs.rundir.RunDirError, match=r"without \['rng.train'\]"):
        tm.train("tiny", out_dir=out, n_steps=6, batch_size=4, log_every=2, resume=True,
                 progress=False)


# ------------------------------------------------------- the geometry command's corpora and models
def test_a_corpus_larger_than_the_limit_is_refused_unread(tmp_path):
    from tfmatcomp.task.corpus import MAX_CORPUS_BYTES, read_documents

    big = tmp_path / "big.txt"
    with open(big, "wb") as f:  # sparse: no disk used, and nothing may read it
        f.truncate(MAX_CORPUS_BYTES + 1)
    with pytest.raises(ValueError, match=r"text: .*big\.txt holds 1,073,741,825 bytes"):
        read_documents(big)
    (tmp_path / "a.txt").write_text("alpha beta")
    with pytest.raises(ValueError, match=r"big\.txt holds"):
        read_documents(tmp_path)  # a directory counts its files together


def test_fifos_and_devices_in_a_corpus_directory_are_skipped(tmp_path):
    from tfmatcomp.task.corpus import read_documents

    (tmp_path / "a.txt").write_text("alpha beta")
    os.mkfifo(tmp_path / "pipe.txt")
    os.symlink("/dev/zero", tmp_path / "zero.txt")
    assert [d.name for d in read_documents(tmp_path)] == ["a.txt"]
    with pytest.raises(ValueError, match="neither a file nor a directory"):
        read_documents(tmp_path / "pipe.txt")


@pytest.mark.parametrize("how", ["fifo", "dev-zero", "sparse-weights"])
def test_a_model_directory_with_an_unreadable_file_is_refused_before_transformers_reads(tmp_path,
                                                                                        how):
    from tfmatcomp.geometry.models import MAX_WEIGHTS_BYTES, load_geometry_model

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    if how == "fifo":
        os.mkfifo(tmp_path / "tokenizer.json")
        match = r"tokenizer\.json is not a regular file"
    elif how == "dev-zero":
        os.symlink("/dev/zero", tmp_path / "vocab.json")
        match = r"vocab\.json is not a regular file"
    else:
        with open(tmp_path / "model.safetensors", "wb") as f:
            f.truncate(MAX_WEIGHTS_BYTES + 1)
        match = r"model\.safetensors holds 17,179,869,185 bytes"
    with pytest.raises(ValueError, match=match):
        load_geometry_model(tmp_path)
