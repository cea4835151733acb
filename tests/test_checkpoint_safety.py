"""A crafted checkpoint cannot lead the loader astray, and the CLI fails early and cleanly (issue 13,
findings 4, 7 and 9)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint import _parameter_count
from tfmatcomp.cli import main
from tfmatcomp.runs.checkpoint_files import config_digest, seal_config
from tfmatcomp.runs.layout import CONFIG_FILE, WEIGHTS_FILE

MODEL = tm.HookedEncoder(tm.get_preset("tiny").model)
DIGEST = "0" * 64


def _crafted(tmp_path: Path, edit) -> Path:
    path = tm.save_checkpoint(MODEL, tmp_path / "ckpt", step=0)
    config = json.loads((path / CONFIG_FILE).read_text())
    edit(config, path)
    # sealed again, as whoever crafts a config would: the checks below the digest are under test
    (path / CONFIG_FILE).write_text(json.dumps(seal_config(config)))
    return path


def _add_file(name, link_to=None):
    def edit(config, path):
        config["files"][name] = DIGEST
        if link_to is not None:
            os.symlink(link_to, path / name)
    return edit


CRAFTED = {
    "absolute /dev/zero": (_add_file("/dev/zero"), ["'/dev/zero'", "plain file names"]),
    "parent traversal": (_add_file("../../../../etc/passwd"), ["plain file names"]),
    "symlink to /dev/zero": (_add_file("zero", "/dev/zero"), ["symlink", "outside"]),
    "symlink to /etc/passwd": (_add_file("pw", "/etc/passwd"), ["symlink", "outside"]),
    "empty name": (_add_file(""), ["plain file names"]),
    "dot-dot": (_add_file(".."), ["plain file names"]),
    "files not a dict": (lambda c, p: c.update(files=[WEIGHTS_FILE]), ["'files'", "SHA-256"]),
    "digest not a string": (lambda c, p: c["files"].update({WEIGHTS_FILE: 3}), ["digest"]),
    "huge d_model": (lambda c, p: c["model"].update(d_model=2**22), ["weights", "at most"]),
    "huge n_layers": (lambda c, p: c["model"].update(n_layers=10**9), ["weights", "at most"]),
    "other shapes, same count": (lambda c, p: c["model"].update(n_heads=8, d_head=8),
                                 ["do not match", "shape"]),
    "NaN init_range": (lambda c, p: c["model"].update(init_range=float("nan")), ["init_range"]),
    "step not an int": (lambda c, p: c.update(step="latest"), ["step"]),
}


@pytest.mark.parametrize("edit, words", CRAFTED.values(), ids=list(CRAFTED))
def test_crafted_config_is_refused(tmp_path, edit, words):
    path = _crafted(tmp_path, edit)
    with pytest.raises(tm.CheckpointError) as info:
        tm.load_checkpoint(path)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_config_json_that_is_a_device_or_fifo_is_refused(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "a", step=0)
    (path / CONFIG_FILE).unlink()
    os.symlink("/dev/zero", path / CONFIG_FILE)
    with pytest.raises(tm.CheckpointError, match="outside"):
        tm.load_checkpoint(path)
    path = tm.save_checkpoint(MODEL, tmp_path / "b", step=0)
    (path / WEIGHTS_FILE).unlink()
    os.mkfifo(path / WEIGHTS_FILE)
    with pytest.raises(tm.CheckpointError, match="not a regular file"):
        tm.load_checkpoint(path)


def test_symlink_inside_the_checkpoint_is_fine(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "ckpt", step=0)
    (path / "weights.bin.real").write_bytes((path / WEIGHTS_FILE).read_bytes())
    (path / WEIGHTS_FILE).unlink()
    os.symlink("weights.bin.real", path / WEIGHTS_FILE)
    assert tm.load_checkpoint(path).cfg == MODEL.cfg


def test_parameter_count_matches_the_model():
    for cfg in [tm.get_preset("tiny").model,
                tm.EncoderConfig(n_layers=1, n_heads=2, d_model=6, d_mlp=5, n_ctx=3, d_vocab=7,
                                 d_head=4, n_token_types=2, d_out=3)]:
        assert _parameter_count(cfg) == sum(p.numel() for p in tm.HookedEncoder(cfg).parameters())


def test_loaded_dtype_follows_the_weights(tmp_path):
    path = tm.save_checkpoint(MODEL.to(torch.float64), tmp_path / "ckpt", step=0)
    MODEL.to(torch.float32)
    assert tm.load_checkpoint(path).dtype == torch.float64


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("argv, words", [
    (["demo", "--bundled", "-o", "/etc/hostname/report.html"], ["out", "not a directory"]),
    (["report", "tiny", "-o", "/dev/full"], ["out", "not a regular file"]),
    (["report", "tiny", "-o", "{tmp}/r.html", "--device", "bogus"], ["--device", "'cpu'"]),
    (["report", "tiny", "-o", "{tmp}/r.html", "--samples", "3"], ["n_samples"]),
    (["report", "tiny", "-o", "{tmp}/r.html", "--sample-seed", str(2**64)], ["seed", "2**63 - 1"]),
    (["report", "tiny", "-o", "{tmp}/r.html", "--sections", "nope"], ["sections", "training"]),
    (["train", "--run-dir", "{tmp}/run", "--lr", "inf", "--steps", "2"], ["lr", "finite"]),
    (["train", "--run-dir", "{tmp}/run", "--device", "bogus", "--steps", "2"], ["--device"]),
] + ([] if torch.cuda.is_available() else [
    (["train", "--run-dir", "{tmp}/run", "--device", "cuda", "--steps", "2"], ["CUDA is not available"]),
]), ids=lambda v: " ".join(v) if isinstance(v, list) and v and "-" in "".join(v) else None)
def test_cli_user_error_is_one_line_exit_2_and_leaves_nothing(tmp_path, capsys, argv, words):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"tfmatcomp {argv[0]}: error:"), err
    assert all(w in err for w in words), err
    assert not list(tmp_path.iterdir())          # no report, no run directory


def test_cli_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="lr"):
        main(["--debug", "train", "--run-dir", str(tmp_path / "run"), "--lr", "nan"])
    with pytest.raises(ValueError, match="lr"):
        main(["train", "--run-dir", str(tmp_path / "run"), "--lr", "nan", "--debug"])


def test_failed_report_removes_the_directories_it_created(tmp_path):
    with pytest.raises(ValueError, match="run"):
        tm.report.build_report("no-such-run", tmp_path / "a" / "b" / "r.html")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------- every file read is covered by a digest
def _edit_config(path: Path, edit, seal: bool) -> None:
    config = json.loads((path / CONFIG_FILE).read_text())
    edit(config)
    (path / CONFIG_FILE).write_text(json.dumps(seal_config(config) if seal else config))


def test_an_edited_config_is_refused_unless_verify_is_off(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "c", step=0)
    config = json.loads((path / CONFIG_FILE).read_text())
    assert config["config_sha256"] == config_digest(config) and config["format_version"] == 2
    _edit_config(path, lambda c: c["model"].update(layer_norm_eps=0.5), seal=False)
    with pytest.raises(tm.CheckpointError, match=r"config\.json was changed after it was written"):
        tm.load_checkpoint(path)
    model = tm.load_checkpoint(path, verify=False)  # the explicit opt-out
    assert model.cfg.layer_norm_eps == 0.5


def test_a_config_without_its_digest_is_refused_unless_verify_is_off(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "c", step=0)
    _edit_config(path, lambda c: c.pop("config_sha256"), seal=False)
    with pytest.raises(tm.CheckpointError, match="carries no digest of itself"):
        tm.load_checkpoint(path)
    assert tm.load_checkpoint(path, verify=False).cfg == MODEL.cfg


@pytest.mark.parametrize("files", [None, {}])
def test_weights_without_a_digest_are_refused(tmp_path, files):
    path = tm.save_checkpoint(MODEL, tmp_path / "c", step=0)
    _edit_config(path, (lambda c: c.pop("files")) if files is None else (lambda c: c.update(files={})),
                 seal=True)
    with pytest.raises(tm.CheckpointError, match=r"lists no SHA-256 for \['model\.safetensors'\]"):
        tm.load_checkpoint(path)
    with open(path / WEIGHTS_FILE, "r+b") as f:  # changed bytes: only verify=False accepts them
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x00\x80\x7f")
    assert tm.load_checkpoint(path, verify=False) is not None


def test_a_future_format_version_is_refused(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "c", step=0)
    _edit_config(path, lambda c: c.update(format_version=999), seal=True)
    with pytest.raises(tm.CheckpointError, match="format_version 999; this tfmatcomp reads versions 1 to 2"):
        tm.load_checkpoint(path)


def test_verify_must_be_a_bool(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "c", step=0)
    with pytest.raises(ValueError, match="verify"):
        tm.load_checkpoint(path, verify="no")


def test_the_bundled_checkpoints_are_sealed():
    from tfmatcomp.pretrained import run_dir

    for config_file in sorted((run_dir("tiny") / "checkpoints").glob("*/config.json")):
        config = json.loads(config_file.read_text())
        assert config["config_sha256"] == config_digest(config), config_file


def test_seal_checkpoint_migrates_a_run_written_before_format_2(tmp_path):
    from tfmatcomp.runs.checkpoint import seal_checkpoint

    run = tmp_path / "run"
    tm.train("tiny", n_steps=4, checkpoint_every=2, checkpoint_steps=(), out_dir=run,
             progress=False)
    paths = sorted(tm.list_checkpoints(run).values())
    for path in paths:  # as format version 1 wrote them
        _edit_config(path, lambda c: (c.pop("config_sha256"), c.update(format_version=1)), seal=False)
    with pytest.raises(tm.CheckpointError, match="seal it once"):
        tm.load_checkpoint(paths[0])
    assert seal_checkpoint(run) == paths and seal_checkpoint(run) == []  # once only
    assert json.loads((paths[0] / CONFIG_FILE).read_text())["format_version"] == 2
    tm.train("tiny", n_steps=6, checkpoint_every=2, checkpoint_steps=(), out_dir=run,
             progress=False, resume=True)  # resumes from the sealed checkpoint
    with open(paths[0] / WEIGHTS_FILE, "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x00\x80\x7f")
    _edit_config(paths[0], lambda c: (c.pop("config_sha256")), seal=False)
    with pytest.raises(tm.CheckpointError, match="differs from the SHA-256"):
        seal_checkpoint(paths[0])  # a changed file is never sealed
