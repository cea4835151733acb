"""No write follows a link (issue 47, item 1): a symlink, hard link or fifo planted in a run
directory, at a file's name, at a temporary file's name, or at a folder's, is refused or replaced,
never written through. Each case checks that the outside file is byte-identical afterwards, and
for dangling links that nothing was created."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tfmatcomp as tm
from tfmatcomp.cli import main
from tfmatcomp.runs.layout import (
    BAD_LINES_FILE, CHECKPOINTS_DIR, CONFIG_FILE, GROUP_FILE, LOCK_FILE, METRICS_FILE, RUN_FILE,
    checkpoint_dir_name, seed_dir,
)
from tfmatcomp.runs.rundir import RunDirError, RunDirLock, remove_leftovers

MODEL = dict(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)
KW = dict(batch_size=8, eval_batch_size=8, log_every=2, checkpoint_every=2, checkpoint_steps=(),
          device="cpu", progress=False)
SECRET = b"the owner's file: must never change\n"


def run(out, n_steps=4, **kw):
    return tm.train("tiny", model_cfg=tm.EncoderConfig(**MODEL), out_dir=out, n_steps=n_steps,
                    **{**KW, **kw})


def group(out, n_steps=4, **kw):
    return tm.train_many("tiny", seeds="0-1", model_cfg=tm.EncoderConfig(**MODEL), out_dir=out,
                         n_steps=n_steps, **{**KW, **kw})


@pytest.fixture()
def outside(tmp_path) -> Path:
    """A folder outside the run directory, holding one file of its owner's."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "v.txt").write_bytes(SECRET)
    return folder


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def untouched(folder: Path) -> bool:
    return contents(folder) == {"v.txt": SECRET}


# ------------------------------------------------------------------------------- the lock
@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resume"])
def test_a_lock_symlink_is_refused_and_its_target_untouched(tmp_path, outside, resume):
    out = tmp_path / "r"
    if resume:
        run(out)
        (out / LOCK_FILE).unlink()
    else:
        out.mkdir()
    os.symlink(outside / "v.txt", out / LOCK_FILE)
    with pytest.raises(RunDirError, match=r"\.lock is a symbolic link"):
        run(out, n_steps=6, resume=resume)
    assert untouched(outside)


def test_a_dangling_lock_symlink_creates_nothing(tmp_path, outside):
    out = tmp_path / "r"
    out.mkdir()
    os.symlink(outside / "new.txt", out / LOCK_FILE)
    with pytest.raises(RunDirError, match="symbolic link"):
        run(out)
    assert untouched(outside) and not (outside / "new.txt").exists()


def test_a_lock_symlink_through_the_cli_is_one_line_exit_2(tmp_path, outside, capsys):
    out = tmp_path / "r"
    run(out)
    (out / LOCK_FILE).unlink()
    os.symlink(outside / "v.txt", out / LOCK_FILE)
    argv = ["train", "--run-dir", str(out), "--resume", "--steps", "6", "--batch-size", "8",
            "--no-progress", "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "symbolic link" in err, err
    assert untouched(outside)


def test_a_group_and_a_seed_lock_symlink_are_refused(tmp_path, outside):
    out = tmp_path / "g"
    out.mkdir()
    os.symlink(outside / "v.txt", out / LOCK_FILE)
    with pytest.raises(RunDirError, match="symbolic link"):
        group(out)
    assert untouched(outside)
    (out / LOCK_FILE).unlink()
    seed_dir(out, 1).mkdir()
    os.symlink(outside / "v.txt", seed_dir(out, 1) / LOCK_FILE)
    with pytest.raises(RunDirError, match="symbolic link"):
        group(out, resume=True)
    assert untouched(outside)


def test_a_hard_linked_or_fifo_lock_is_refused(tmp_path, outside):
    out = tmp_path / "r"
    out.mkdir()
    os.link(outside / "v.txt", out / LOCK_FILE)
    with pytest.raises(RunDirError, match="hard link"):
        RunDirLock(out).acquire()
    assert untouched(outside)
    (out / LOCK_FILE).unlink()
    os.mkfifo(out / LOCK_FILE)
    with pytest.raises(RunDirError, match="not a regular file"):
        RunDirLock(out).acquire()


def test_the_lock_still_excludes_a_second_trainer(tmp_path):
    with RunDirLock(tmp_path / "r"):
        with pytest.raises(tm.runs.rundir.RunDirLockedError, match=f"pid {os.getpid()}"):
            RunDirLock(tmp_path / "r").acquire()
    with RunDirLock(tmp_path / "r"):  # released: free again
        pass


# ------------------------------------------------------------------ replaced files, temporaries
def test_a_planted_run_json_tmp_link_is_not_written_through(tmp_path, outside):
    out = tmp_path / "r"
    run(out)
    os.symlink(outside / "v.txt", out / (RUN_FILE + ".tmp"))
    run(out, n_steps=6, resume=True)
    assert untouched(outside)
    assert not (out / RUN_FILE).is_symlink() and json.loads((out / RUN_FILE).read_text())
    assert not os.path.lexists(out / (RUN_FILE + ".tmp"))  # removed as a leftover


def test_a_dangling_config_json_tmp_link_creates_nothing_and_loses_no_checkpoint(tmp_path, outside):
    out = tmp_path / "r"
    run(out, n_steps=6)
    ckpt = out / CHECKPOINTS_DIR / checkpoint_dir_name(6)
    os.symlink(outside / "config.json", ckpt / (CONFIG_FILE + ".tmp"))
    run(out, n_steps=8, resume=True)  # strips step 6's state: its config.json is rewritten
    assert untouched(outside) and not (outside / "config.json").exists()
    assert tm.load_checkpoint(ckpt).cfg == tm.EncoderConfig(**MODEL)


def test_run_json_and_seeds_json_links_are_replaced_not_followed(tmp_path, outside):
    out = tmp_path / "r"
    out.mkdir()
    os.symlink(outside / "v.txt", out / RUN_FILE)  # a failed start's file: the run may start
    run(out)
    assert untouched(outside) and not (out / RUN_FILE).is_symlink()
    g = tmp_path / "g"
    g.mkdir()
    os.symlink(outside / "v.txt", g / GROUP_FILE)
    group(g)
    assert untouched(outside) and json.loads((g / GROUP_FILE).read_text())["seeds"] == [0, 1]


def test_the_sweep_files_are_replaced_not_followed(tmp_path, outside):
    out = tmp_path / "s"
    out.mkdir()
    os.symlink(outside / "sweep.json", out / "sweep.json")  # dangling
    for name in ("sweep.csv", "sweep.html"):
        os.symlink(outside / "v.txt", out / name)
    argv = ["sweep", "--run-dir", str(out), "--grid", "d_model=16", "--steps", "2",
            "--batch-size", "8", "--log-every", "1", "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    assert untouched(outside) and not (outside / "sweep.json").exists()
    assert not any((out / n).is_symlink() for n in ("sweep.json", "sweep.csv", "sweep.html"))


# ----------------------------------------------------------------------------------- appends
def test_a_metrics_log_link_is_replaced_or_refused_never_appended_to(tmp_path, outside):
    out = tmp_path / "r"
    run(out)
    log = (out / METRICS_FILE).read_bytes()
    (out / METRICS_FILE).unlink()
    (outside / "log").write_bytes(log)
    os.symlink(outside / "log", out / METRICS_FILE)
    run(out, n_steps=6, resume=True)  # resume rewrites the log: the link is replaced
    assert (outside / "log").read_bytes() == log and not (out / METRICS_FILE).is_symlink()
    assert list(tm.read_metrics(out)["step"]) == [2, 4, 6]
    (outside / "log").unlink()
    (out / METRICS_FILE).unlink()
    os.symlink(outside / "gone", out / METRICS_FILE)  # dangling: refused, nothing created
    with pytest.raises(ValueError, match=f"{METRICS_FILE} cannot be read"):
        run(out, n_steps=8, resume=True)
    assert untouched(outside) and not (outside / "gone").exists()


def test_a_bad_lines_link_receives_nothing(tmp_path, outside):
    out = tmp_path / "r"
    run(out)
    with open(out / METRICS_FILE, "a") as f:
        f.write("not json\n")
    os.symlink(outside / "v.txt", out / BAD_LINES_FILE)
    with pytest.raises(RunDirError, match="symbolic link"), pytest.warns(UserWarning):
        run(out, n_steps=6, resume=True)
    assert untouched(outside)


def test_open_append_refuses_links_fifos_and_hard_links(tmp_path, outside):
    from tfmatcomp.runs.files import open_append

    os.symlink(outside / "gone.txt", tmp_path / "dangling")
    os.link(outside / "v.txt", tmp_path / "hard")
    os.mkfifo(tmp_path / "fifo")
    for name, words in [("dangling", "symbolic link"), ("hard", "hard link"),
                        ("fifo", "not a regular file")]:
        with pytest.raises(RunDirError, match=words):
            open_append(tmp_path / name)
    assert untouched(outside) and not (outside / "gone.txt").exists()
    with open_append(tmp_path / "log") as f:
        f.write("a\n")
    assert (tmp_path / "log").read_text() == "a\n"


def test_replace_file_and_remove_entry_never_follow(tmp_path, outside):
    from tfmatcomp.runs.files import remove_entry, replace_file

    os.symlink(outside, tmp_path / "folder-link")
    os.symlink(outside / "v.txt", tmp_path / "file-link")
    remove_entry(tmp_path / "folder-link")
    replace_file(tmp_path / "file-link", "new")
    assert untouched(outside)
    assert (tmp_path / "file-link").read_text() == "new" and not (tmp_path / "folder-link").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file-link", "outside"]  # no temporary


# ------------------------------------------------------------------------------ folder links
def test_a_checkpoints_folder_link_is_refused(tmp_path, outside):
    out = tmp_path / "r"
    run(out)
    (out / CHECKPOINTS_DIR).rename(tmp_path / "moved")
    os.symlink(outside, out / CHECKPOINTS_DIR)
    with pytest.raises(RunDirError, match="checkpoints is a symbolic link"):
        run(out, n_steps=6, resume=True)
    assert untouched(outside)


def test_a_step_folder_link_is_refused(tmp_path, outside):
    out = tmp_path / "r"
    run(out, n_steps=4)
    step4 = out / CHECKPOINTS_DIR / checkpoint_dir_name(4)
    step4.rename(outside / "step4")
    os.symlink(outside / "step4", step4)
    before = contents(outside)
    with pytest.raises(RunDirError, match="step_0000004 is a symbolic link"):
        run(out, n_steps=6, resume=True)
    assert contents(outside) == before


def test_a_seed_folder_link_is_refused(tmp_path, outside):
    out = tmp_path / "g"
    group(out)
    seed_dir(out, 1).rename(tmp_path / "moved")
    os.symlink(outside, seed_dir(out, 1))
    with pytest.raises(RunDirError, match="seed-1 is a symbolic link"):
        group(out, n_steps=6, resume=True)
    assert untouched(outside)


def test_leftovers_are_found_with_lstat_and_removed_without_following(tmp_path, outside):
    out = tmp_path / "r"
    run(out)
    ckpts = out / CHECKPOINTS_DIR
    os.symlink(outside / "gone", ckpts / ".step_0000009.tmp-abc")  # dangling
    os.symlink(outside, ckpts / ".step_0000010.old-123")
    os.symlink(outside / "gone", out / ".metrics.jsonl.abcd1234.tmp")
    removed = remove_leftovers(out)
    assert sorted(removed) == [".metrics.jsonl.abcd1234.tmp", f"{CHECKPOINTS_DIR}/.step_0000009.tmp-abc",
                               f"{CHECKPOINTS_DIR}/.step_0000010.old-123"]
    assert untouched(outside) and not (outside / "gone").exists()
