"""Run directories cannot be mixed up: one run per directory, one writer at a time, exact resume
after a kill at any moment (issue 13, findings 1, 2, 3, 5 and 10)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint import ConfigMismatchError
from tfmatcomp.cli import main as cli_main
from tfmatcomp.runs.layout import (
    CHECKPOINTS_DIR, CONFIG_FILE, LOCK_FILE, METRICS_FILE, RUN_FILE, STATE_FILE, STATE_TENSORS_FILE,
    WEIGHTS_FILE, checkpoint_dir_name, seed_dir,
)
from tfmatcomp.runs.rundir import (
    RunDirError, RunDirLock, RunDirLockedError, check_fresh, is_empty, remove_leftovers,
)
from tfmatcomp.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
MODEL = dict(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16)
KW = dict(batch_size=8, eval_batch_size=8, log_every=5, checkpoint_every=10, checkpoint_steps=(),
          device="cpu", progress=False)


def cfg():
    return tm.EncoderConfig(**MODEL)


def run(out, n_steps=20, **kw):
    return tm.train("tiny", model_cfg=cfg(), out_dir=out, n_steps=n_steps, **{**KW, **kw})


def table(result_or_dir):
    m = tm.read_metrics(result_or_dir) if isinstance(result_or_dir, Path) else result_or_dir.metrics
    return m.drop(columns="elapsed_s").reset_index(drop=True)


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


# ------------------------------------------------------------------ 1. one run per directory
def test_a_second_run_into_a_used_directory_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    run(out, seed=0)
    before = snapshot(out)
    with pytest.raises(RunDirError, match=r"out_dir: .*run.*resume=True.*overwrite=True"):
        run(out, n_steps=30, seed=1)
    with pytest.raises(RunDirError, match="out_dir"):
        Trainer("tiny", model_cfg=cfg(), out_dir=out, **{k: v for k, v in KW.items()
                                                          if k != "progress"}).run(10)
    assert snapshot(out) == before
    # the first run still resumes exactly
    resumed = run(out, n_steps=30, seed=0, resume=True)
    assert table(resumed).equals(table(run(tmp_path / "ref", n_steps=30, seed=0)))


def test_overwrite_clears_the_directory_first(tmp_path):
    out = tmp_path / "run"
    run(out, seed=0, checkpoint_every=5)
    again = run(out, seed=1, overwrite=True)
    assert table(again).equals(table(run(tmp_path / "ref", seed=1)))
    assert table(out).equals(table(again))
    assert set(tm.list_checkpoints(out)) == {10, 20}
    with pytest.raises(ValueError, match="resume, overwrite"):
        run(out, resume=True, overwrite=True)


def test_overwrite_never_deletes_files_that_no_run_writes(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="notes.txt"):
        run(tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_failed_start_counts_as_empty(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(FloatingPointError):
        model = tm.HookedEncoder(cfg(), seed=0)
        with torch.no_grad():
            model.blocks[0].mlp.W_in[0, 0] = float("nan")
        tm.train("tiny", model=model, out_dir=out, n_steps=5, **KW)
    assert {p.name for p in out.iterdir()} <= {RUN_FILE, METRICS_FILE, LOCK_FILE}
    assert is_empty(out)
    run(out)  # no resume or overwrite needed
    assert not is_empty(out)


def test_train_many_refuses_a_used_group_or_seed_directory(tmp_path):
    kw = dict(model_cfg=cfg(), n_steps=10, **KW)
    tm.train_many("tiny", seeds=[0, 1], out_dir=tmp_path / "g", **kw)
    with pytest.raises(RunDirError, match="overwrite"):
        tm.train_many("tiny", seeds=[0, 1], out_dir=tmp_path / "g", **kw)
    with pytest.raises(RunDirError, match="overwrite"):
        tm.train_many("tiny", seeds=[2], out_dir=tmp_path / "g", **kw)
    again = tm.train_many("tiny", seeds=[2], out_dir=tmp_path / "g", overwrite=True, **kw)
    assert sorted(p.name for p in (tmp_path / "g").iterdir() if p.is_dir()) == ["seed-2"]
    assert again[2].step == 10
    # a single run is no group, and a group is no single run
    run(tmp_path / "single", n_steps=10)
    with pytest.raises(RunDirError, match="single run"):
        tm.train_many("tiny", seeds=[0], out_dir=tmp_path / "single", resume=True, **kw)
    with pytest.raises(RunDirError, match="multi-seed group"):
        run(tmp_path / "g", resume=True)


def test_cli_refuses_a_used_directory_and_overwrites_on_request(tmp_path, capsys):
    args = ["train", "--run-dir", str(tmp_path), "--batch-size", "8", "--log-every", "5",
            "--no-progress", "--device", "cpu", "--steps", "10"]
    assert cli_main(args) == 0
    assert cli_main(args + ["--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err and str(tmp_path) in err
    assert cli_main(args + ["--seed", "1", "--overwrite"]) == 0
    assert json.loads((tmp_path / RUN_FILE).read_text())["seed"] == 1
    assert tm.read_metrics(tmp_path)["step"].tolist() == [5, 10]
    with pytest.raises(SystemExit):
        cli_main(args + ["--resume", "--overwrite"])


# ------------------------------------------------------- 2. resume from usable state or refuse
@pytest.mark.parametrize("lost", [STATE_FILE, CONFIG_FILE])
def test_resume_without_usable_state_refuses_and_keeps_the_log(tmp_path, lost):
    run(tmp_path, n_steps=20)
    (tm.list_checkpoints(tmp_path)[20] / lost).unlink()
    before = snapshot(tmp_path)
    with pytest.raises(RunDirError, match="no.*usable training state"):
        run(tmp_path, n_steps=30, resume=True)
    assert snapshot(tmp_path) == before
    assert tm.read_metrics(tmp_path)["step"].tolist() == [5, 10, 15, 20]


def test_resume_falls_back_to_the_latest_checkpoint_with_usable_state(tmp_path, monkeypatch):
    ref = run(tmp_path / "ref", n_steps=30)
    out = tmp_path / "run"
    trainer = Trainer("tiny", model_cfg=cfg(), out_dir=out, n_steps=30,
                      **{k: v for k, v in KW.items() if k != "progress"}, progress=False)
    trainer.run(10)
    monkeypatch.setattr(Trainer, "strip_older_states", lambda self: None)  # killed before strip
    trainer.run(20)
    monkeypatch.undo()
    state = tm.list_checkpoints(out)[20] / STATE_TENSORS_FILE
    state.write_bytes(state.read_bytes()[:-8])  # the latest state is damaged
    with pytest.warns(UserWarning, match=checkpoint_dir_name(20)):
        resumed = run(out, n_steps=30, resume=True)
    assert table(resumed).equals(table(ref))
    assert table(out).equals(table(ref))


def test_resume_of_an_empty_or_absent_directory_starts_fresh(tmp_path):
    ref = run(tmp_path / "ref")
    assert table(run(tmp_path / "absent", resume=True)).equals(table(ref))
    # killed before its first checkpoint: the log is cut back to step 0, never doubled
    (tmp_path / "early").mkdir()
    run(tmp_path / "early", n_steps=5, checkpoint_every=0, checkpoint_steps=())
    shutil.rmtree(tmp_path / "early" / CHECKPOINTS_DIR)
    assert table(run(tmp_path / "early", resume=True)).equals(table(ref))
    assert table(tmp_path / "early").equals(table(ref))
    with pytest.raises(ConfigMismatchError, match="seed"):  # ...but only for the same run
        shutil.rmtree(tmp_path / "early" / CHECKPOINTS_DIR)
        run(tmp_path / "early", resume=True, seed=5)


def test_n_steps_below_the_resumed_step_is_an_error(tmp_path, capsys):
    run(tmp_path / "api", n_steps=20)
    with pytest.raises(ValueError, match=r"n_steps: 10 is below step 20"):
        run(tmp_path / "api", n_steps=10, resume=True)
    args = ["train", "--run-dir", str(tmp_path / "cli"), "--batch-size", "8", "--log-every", "5",
            "--no-progress", "--device", "cpu"]
    assert cli_main(args + ["--steps", "10"]) == 0
    assert cli_main(args + ["--steps", "5", "--resume"]) == 2
    assert "n_steps: 5 is below step 10" in capsys.readouterr().err
    trainer = Trainer("tiny", model_cfg=cfg(), device="cpu", progress=False)
    for bad in (-5, 0, 7.5, True, "10"):
        with pytest.raises(ValueError, match="n_steps"):
            trainer.run(bad)


# --------------------------------------------------------------------------- 3. one writer
def _hold_lock_in_another_process(out: Path) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import importlib.util, sys, time
        path = {str(ROOT / "tfmatcomp/runs/rundir.py")!r}  # standalone: no tfmatcomp import
        spec = importlib.util.spec_from_file_location("rundir", path)
        rundir = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rundir)
        lock = rundir.RunDirLock({str(out)!r}).acquire()
        print("held", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_a_second_trainer_fails_at_once_naming_the_holder(tmp_path, monkeypatch):
    import fcntl

    run(tmp_path / "run", n_steps=10)
    proc = _hold_lock_in_another_process(tmp_path / "run")
    flags, flock = [], fcntl.flock
    # "at once": every attempt to take the lock is non-blocking (no wall clock is read: a busy
    # machine must not fail this test)
    monkeypatch.setattr(fcntl, "flock", lambda fd, op: (flags.append(op), flock(fd, op))[1])
    try:
        before = snapshot(tmp_path / "run")
        holder = rf"in use by another trainer \(pid {proc.pid} on host .+, since \d{{4}}-"
        with pytest.raises(RunDirLockedError, match=holder):
            run(tmp_path / "run", n_steps=20, resume=True)
        assert flags and all(op & fcntl.LOCK_NB for op in flags if op & fcntl.LOCK_EX), flags
        with pytest.raises(RunDirLockedError, match=f"pid {proc.pid}"):
            run(tmp_path / "run", n_steps=20, overwrite=True)
        assert snapshot(tmp_path / "run") == before
    finally:
        proc.kill()
        proc.wait()
    # the operating system releases the lock of a killed process
    assert run(tmp_path / "run", n_steps=20, resume=True).step == 20


def test_multi_seed_training_locks_every_seed_directory(tmp_path):
    out = tmp_path / "g"
    kw = dict(model_cfg=cfg(), n_steps=10, **KW)
    with RunDirLock(seed_dir(out, 1)):
        with pytest.raises(RunDirLockedError, match="this process"):
            tm.train_many("tiny", seeds=[0, 1], out_dir=out, **kw)
    with RunDirLock(out):
        with pytest.raises(RunDirLockedError):
            tm.train_many("tiny", seeds=[0, 1], out_dir=out, resume=True, **kw)
    assert tm.train_many("tiny", seeds=[0, 1], out_dir=out, resume=True, **kw).step == 10


def test_a_trainer_notices_that_another_wrote_between_its_runs(tmp_path):
    trainer = Trainer("tiny", model_cfg=cfg(), out_dir=tmp_path, n_steps=30,
                      **{k: v for k, v in KW.items() if k != "progress"}, progress=False)
    trainer.run(10)
    run(tmp_path, n_steps=20, resume=True)
    with pytest.raises(RunDirError, match="changed since this trainer"):
        trainer.run(30)
    assert tm.read_metrics(tmp_path)["step"].tolist() == [5, 10, 15, 20]


# ------------------------------------------------------------------- 5. metrics never dropped
def test_unreadable_metrics_lines_are_set_aside_not_the_rows_after_them(tmp_path):
    ref = run(tmp_path / "ref", n_steps=40)
    out = tmp_path / "run"
    run(out, n_steps=40, checkpoint_every=20)
    log = out / METRICS_FILE
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = b"\x00\xffgarbage\n"  # row 3 of 8
    log.write_bytes(b"".join(lines))
    with pytest.warns(UserWarning, match=r"jsonl: 1 unreadable line\(s\) set aside \(line 3\)"):
        assert tm.read_metrics(out)["step"].tolist() == [5, 10, 20, 25, 30, 35, 40]
    with pytest.warns(UserWarning, match="line 3"):
        resumed = run(out, n_steps=50, resume=True)
    assert resumed.metrics["step"].tolist() == [5, 10, 20, 25, 30, 35, 40, 45, 50]
    assert json.loads((out / "metrics.jsonl.bad").read_text())["line"] == 3
    expected = table(ref)
    assert table(resumed).iloc[:7].equals(expected[expected["step"] != 15].reset_index(drop=True))


def test_read_metrics_keeps_the_rows_after_a_garbage_first_line(tmp_path):
    run(tmp_path, n_steps=20)
    log = tmp_path / METRICS_FILE
    log.write_text("{not json\n" + log.read_text() + '[1, 2]\n{"no_step": 1}\n')
    with pytest.warns(UserWarning, match=r"3 unreadable line\(s\) set aside \(line 1, 6, 7\)"):
        assert tm.read_metrics(tmp_path)["step"].tolist() == [5, 10, 15, 20]


# ---------------------------------------------------------------- 10. leftovers of a kill
def test_resume_removes_temporary_checkpoint_directories(tmp_path):
    ref = run(tmp_path / "ref", n_steps=30)
    out = tmp_path / "run"
    run(out, n_steps=20)
    ckpts = out / CHECKPOINTS_DIR
    (ckpts / ".step_0000030.tmp-abc123").mkdir()
    (ckpts / ".step_0000030.tmp-abc123" / WEIGHTS_FILE).write_bytes(b"half")
    shutil.copytree(ckpts / checkpoint_dir_name(10), ckpts / ".step_0000010.old-4242")
    # caught between the two renames of a replacement: the old checkpoint is put back
    os.replace(ckpts / checkpoint_dir_name(20), ckpts / ".step_0000020.old-4243")
    (out / "metrics.jsonl.tmp").write_text("partial")
    resumed = run(out, n_steps=30, resume=True)
    assert table(resumed).equals(table(ref))
    assert sorted(p.name for p in ckpts.iterdir()) == [checkpoint_dir_name(s) for s in (10, 20, 30)]
    assert not (out / "metrics.jsonl.tmp").exists()


def test_rundir_helpers(tmp_path):
    assert is_empty(tmp_path / "absent") and remove_leftovers(tmp_path / "absent") == []
    (tmp_path / RUN_FILE).write_text("{}")
    check_fresh(tmp_path)  # a failed start: fine
    (tmp_path / METRICS_FILE).write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="already holds a run"):
        check_fresh(tmp_path)
    check_fresh(tmp_path, overwrite=True)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        RunDirLock(tmp_path / "file").acquire()


# ------------------------------------------------------------------- killed, then resumed
LAUNCHER = r'''
import json, os, random, signal, sys, time, traceback
import torch
torch.set_num_threads(1)
import tfmatcomp as tm
from tfmatcomp.training import trainer as training
from tfmatcomp.runs.layout import CHECKPOINTS_DIR

out, marker = sys.argv[1], sys.argv[1] + ".paused"
kw = json.loads(sys.argv[2])
model_cfg = tm.EncoderConfig(**kw.pop("model"))
tm.train("tiny", model_cfg=model_cfg, **dict(kw, n_steps=1))  # warm up before forking

def pause():
    open(marker, "w").close()
    time.sleep(60)

def after_calls(obj, name, n, when=lambda *a: True):
    """Pause at the n-th call of obj.name for which when(*args) holds."""
    real, seen = getattr(obj, name), [0]
    def wrapper(*args, **kwargs):
        if when(*args):
            seen[0] += 1
            if seen[0] == n:
                pause()
        return real(*args, **kwargs)
    setattr(obj, name, wrapper)

report = []
rng = random.Random(0)
for kind, n in json.loads(sys.argv[3]):
    pid = os.fork()
    if pid == 0:  # the trainer
      try:
        if kind == "fsync":  # inside a checkpoint write: its temporary directory half done
            after_calls(os, "fsync", n, lambda fd: ".tmp-" in os.readlink(f"/proc/self/fd/{fd}"))
        elif kind == "rename":  # a complete temporary checkpoint, not yet renamed into place
            after_calls(os, "replace", n, lambda src, dst: ".tmp-" in os.fspath(src))
        elif kind == "log":  # resume rewriting the metrics log
            after_calls(os, "replace", n, lambda src, dst: os.fspath(dst).endswith(".jsonl"))
        elif kind == "strip":  # a new checkpoint written, the older still holding its state
            after_calls(training.Trainer, "strip_older_states", n)
        else:
            open(marker, "w").close()
        tm.train("tiny", model_cfg=model_cfg, out_dir=out, resume=True, **kw)
        code = 0
      except BaseException:
        traceback.print_exc()
        code = 1
      finally:
        os._exit(code)
    deadline, status = time.time() + 60, None
    while not os.path.exists(marker) and time.time() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        time.sleep(0.005)
    if kind == "delay":
        time.sleep(rng.uniform(0.0, n / 1000))
    ckpts = os.path.join(out, CHECKPOINTS_DIR)
    seen = sorted(os.listdir(ckpts)) if os.path.isdir(ckpts) else []
    if status is None:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    report.append({"kind": kind, "killed": killed, "paused": os.path.exists(marker),
                   "entries": seen})
    if os.path.exists(marker):
        os.remove(marker)
print(json.dumps(report))
'''


def test_killed_at_any_moment_the_resumed_run_is_bit_identical(tmp_path):
    """SIGKILL a training run inside checkpoint writes, between a checkpoint and the stripping of
    the older state, while resume rewrites the log, and at random moments; resume each time. The
    final run equals an uninterrupted one bit for bit (same thread count: 1), with no leftovers."""
    kw = dict(n_steps=60, batch_size=8, eval_batch_size=8, log_every=2, checkpoint_every=5,
              checkpoint_steps=(), device="cpu", progress=False)
    out = tmp_path / "run"
    kills = [["fsync", 10], ["log", 1], ["rename", 2], ["strip", 2], ["fsync", 3],
             ["delay", 400], ["delay", 400], ["delay", 400], ["delay", 400]]
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(out), json.dumps(dict(kw, model=MODEL)),
         json.dumps(kills)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert torch.get_num_threads() == 1
    reference = tm.train("tiny", model_cfg=cfg(), out_dir=tmp_path / "ref", **kw)  # meanwhile
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    report = json.loads(stdout.strip().splitlines()[-1])
    for entry in report[:5]:
        assert entry["killed"] and entry["paused"], (entry, report)
    # the kills inside a checkpoint write left a temporary directory behind
    for entry in (report[0], report[2], report[4]):
        assert any(".tmp-" in name for name in entry["entries"]), entry

    resumed = tm.train("tiny", model_cfg=cfg(), out_dir=out, resume=True, **kw)
    assert table(resumed).equals(table(reference))
    assert table(out).equals(table(reference))
    for p, q in zip(resumed.model.parameters(), reference.model.parameters()):
        assert torch.equal(p, q)
    ckpts = sorted(p.name for p in (out / CHECKPOINTS_DIR).iterdir())
    assert ckpts == sorted(p.name for p in (tmp_path / "ref" / CHECKPOINTS_DIR).iterdir())
    assert [s for s, p in tm.list_checkpoints(out).items() if (p / STATE_FILE).exists()] == [60]
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE, CHECKPOINTS_DIR, METRICS_FILE,
                                                     RUN_FILE]


def test_read_metrics_accepts_any_finite_number_as_step(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"step": 0.0, "L": 1}\n{"step": 50.0, "L": 2}\n'
                                            '{"step": NaN, "L": 3}\n{"step": true}\n')
    with pytest.warns(UserWarning, match=r"\(line 3, 4\)"):
        assert tm.read_metrics(tmp_path)["step"].tolist() == [0.0, 50.0]


def test_run_directory_names_are_the_documented_format():
    """The on-disk names are a format (docs/concepts/training.md, bundled runs): renaming one in
    tfmatcomp.runs.layout breaks every run directory already written."""
    from tfmatcomp.runs import layout

    assert (layout.LOCK_FILE, layout.RUN_FILE, layout.METRICS_FILE, layout.BAD_LINES_FILE,
            layout.CHECKPOINTS_DIR, layout.GROUP_FILE) == (
        ".lock", "run.json", "metrics.jsonl", "metrics.jsonl.bad", "checkpoints", "seeds.json")
    assert (layout.CONFIG_FILE, layout.WEIGHTS_FILE, layout.STATE_TENSORS_FILE,
            layout.STATE_FILE) == ("config.json", "model.safetensors", "state.safetensors",
                                   "state.json")
    assert layout.checkpoint_dir_name(4000) == "step_0004000"
    assert seed_dir("g", 3).name == "seed-3"


def test_one_listing_of_checkpoints(tmp_path):
    """list_checkpoints lists complete checkpoints; complete=False every step directory; names
    that are not step_<digits> are never listed."""
    from tfmatcomp.runs.layout import checkpoint_path, list_checkpoints

    for step, complete in ((5, True), (12, False)):
        checkpoint_path(tmp_path, step).mkdir(parents=True)
        if complete:
            (checkpoint_path(tmp_path, step) / CONFIG_FILE).write_text("{}")
    for odd in ("step_x", "step_-1", ".step_0000003.tmp-1", "step_1_000"):
        (tmp_path / CHECKPOINTS_DIR / odd).mkdir()
        (tmp_path / CHECKPOINTS_DIR / odd / CONFIG_FILE).write_text("{}")
    assert list(list_checkpoints(tmp_path)) == [5]
    assert list(list_checkpoints(tmp_path, complete=False)) == [5, 12]
    assert tm.list_checkpoints is list_checkpoints


def test_resume_leaves_training_state_in_its_checkpoint_alone(tmp_path, monkeypatch):
    """Killed between writing a checkpoint and stripping the older one's state, a run holds two
    checkpoints with state; resuming (even with nothing left to train) keeps the state of the
    checkpoint it continues from only."""
    kw = dict(model_cfg=cfg(), batch_size=8, log_every=5, checkpoint_every=5, checkpoint_steps=(),
              device="cpu", progress=False)
    out = tmp_path / "run"
    tm.train("tiny", out_dir=out, n_steps=5, **kw)
    with monkeypatch.context() as m:
        m.setattr(Trainer, "strip_older_states", lambda self: None)  # the kill, in effect
        tm.train("tiny", out_dir=out, n_steps=10, resume=True, **kw)
    assert [s for s, p in tm.list_checkpoints(out).items() if (p / STATE_FILE).exists()] == [5, 10]
    tm.train("tiny", out_dir=out, n_steps=10, resume=True, **kw)
    assert [s for s, p in tm.list_checkpoints(out).items() if (p / STATE_FILE).exists()] == [10]
