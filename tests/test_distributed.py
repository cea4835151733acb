"""tfmatcomp.distributed on CPU with 2 gloo processes.

One torchrun job (this file run as a script on 2 ranks, started once per session by the
``job`` fixture) trains and decomposes; the tests compare what it wrote with single-process runs:

* data-parallel losses = single-process losses with the same global batch (rtol 1e-5: only the
  order of float additions differs);
* a sharded decomposition = the single-process one to 1e-10 in float64;
* rank 0 alone writes the run directory;
* a resume at another world size (1 -> 2 and 2 -> 1) continues the same log;
* seeds spread over ranks give one ordinary run directory per seed.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import tfmatcomp as tm
from tfmatcomp import cli, distributed
from tfmatcomp.runs.layout import GROUP_FILE, LOCK_FILE, METRICS_FILE, RUN_FILE

ROOT = Path(__file__).resolve().parents[1]
#: The runs' configuration: tiny preset, a few steps, a global batch of 16 (8 per rank).
RUN = dict(batch_size=16, log_every=2, checkpoint_every=2, checkpoint_steps=(), device="cpu",
           progress=False)
CLI_RUN = ["--batch-size", "16", "--log-every", "2", "--checkpoint-every", "2",
           "--device", "cpu", "--no-progress"]
RTOL = 1e-5  # data-parallel vs one process: same batch, same math, other summation order
GRAM_RTOL = 1e-5
DECOMP_TOL = 1e-10


# --------------------------------------------------------------------------- the 2-rank job
def _batches(n: int = 5) -> list[tm.MatrixBatch]:
    g = torch.Generator().manual_seed(7)
    task = tm.get_preset("tiny").task.build()
    return [task.sample(6 + i, generator=g) for i in range(n)]  # unequal sizes, 3 + 2 per rank


def _spy(out: Path) -> dict[str, int]:
    """Count the calls through which a trainer writes to a run directory."""
    from tfmatcomp.runs import rundir
    from tfmatcomp.training import trainer as training

    calls = {"lock": 0, "save": 0, "log": 0}

    def counting(name, fn):
        def wrapper(*a, **k):
            result = fn(*a, **k)
            if name != "log" or result is not None:
                calls[name] += 1
            return result
        return wrapper

    rundir.RunDirLock.acquire = counting("lock", rundir.RunDirLock.acquire)
    training.save_checkpoint = counting("save", training.save_checkpoint)
    training.Trainer.open_log = counting("log", training.Trainer.open_log)
    return calls


def _worker(out: Path) -> None:
    """One rank of the job (run under torchrun by the ``job`` fixture)."""
    faulthandler.dump_traceback_later(300, exit=True)  # a hang fails the job, with tracebacks
    torch.set_num_threads(1)
    assert distributed.init("cpu")  # one process group for the whole job
    rank = int(os.environ["RANK"])
    calls = _spy(out)
    # data-parallel training through the command line, as `torchrun -m tfmatcomp train` runs it
    assert cli.main(["train", "--run-dir", str(out / "ddp"), "--steps", "6", *CLI_RUN]) == 0
    # resume at world size 2 a run that one process trained to step 4
    assert cli.main(["train", "--run-dir", str(out / "resume"), "--steps", "8", "--resume",
                     *CLI_RUN]) == 0
    (out / f"calls-{rank}.json").write_text(json.dumps({**calls, "pid": os.getpid()}))
    # seeds across ranks: rank 0 trains seed 0, rank 1 seeds 1 and 2
    distributed.train_many("tiny", seeds="0-2", n_steps=4, out_dir=out / "seeds", **RUN)
    # sharded decomposition
    model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    acc = distributed.accumulate(model, _batches(), progress=False)
    torch.save({str(n): acc.result(n) for n in acc.names}, out / f"decomp-{rank}.pt")
    distributed.shutdown()


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    tm.train("tiny", n_steps=4, out_dir=out / "resume", **RUN)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    status = distributed.launch(2, [str(Path(__file__)), str(out)], env=env)
    assert status == 0, "the 2-rank job failed (its output is above)"
    return out


def _metrics(run: Path) -> pd.DataFrame:
    return tm.read_metrics(run).drop(columns="elapsed_s")


def _assert_same_log(run: Path, reference: pd.DataFrame) -> None:
    log = _metrics(run)
    assert list(log["step"]) == list(reference["step"])
    pd.testing.assert_frame_equal(log, reference.drop(columns="elapsed_s"), rtol=RTOL, atol=0)


# -------------------------------------------------------------------------------- the tests
def test_data_parallel_losses_equal_one_process(job):
    single = tm.train("tiny", n_steps=6, **RUN).metrics
    _assert_same_log(job / "ddp", single)


def test_rank0_alone_writes_the_run_directory(job):
    calls = [json.loads((job / f"calls-{r}.json").read_text()) for r in (0, 1)]
    assert calls[1]["lock"] == calls[1]["save"] == calls[1]["log"] == 0
    assert calls[0]["lock"] >= 2 and calls[0]["save"] == 3 + 2 and calls[0]["log"] == 2
    lines = (job / "ddp" / METRICS_FILE).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [2, 4, 6]  # one writer: no doubled rows
    holder = json.loads((job / "ddp" / LOCK_FILE).read_text())
    assert holder["pid"] == calls[0]["pid"]
    run = json.loads((job / "ddp" / RUN_FILE).read_text())
    assert (run["world_size"], run["backend"]) == (2, "gloo")


def test_resume_at_another_world_size_continues_the_log(job, tmp_path):
    reference = tm.train("tiny", n_steps=8, **RUN).metrics
    _assert_same_log(job / "resume", reference)          # 1 process, then 2
    resumed = tm.train("tiny", n_steps=8, out_dir=job / "ddp", resume=True, **RUN)
    assert resumed.step == 8
    _assert_same_log(job / "ddp", reference)             # 2 processes, then 1


def test_seeds_across_ranks_write_one_run_per_seed(job):
    assert json.loads((job / "seeds" / GROUP_FILE).read_text())["seeds"] == [0, 1, 2]
    for seed in (0, 1, 2):
        single = tm.train("tiny", n_steps=4, seed=seed, **RUN).metrics
        log = _metrics(job / "seeds" / f"seed-{seed}")
        # seed 0 runs alone on rank 0 (the single-seed program); 1 and 2 batched (vmap)
        pd.testing.assert_frame_equal(log, single.drop(columns="elapsed_s"), rtol=1e-4, atol=1e-6)


def test_sharded_decomposition_equals_one_process(job):
    model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
    reference = tm.decomposition.accumulate(model, _batches(), progress=False)
    for rank in (0, 1):
        sharded = torch.load(job / f"decomp-{rank}.pt", weights_only=False)
        assert list(sharded) == [str(n) for n in reference.names]
        for name in reference.names:
            got, want = sharded[str(name)], reference.result(name)
            assert got.n_contexts == want.n_contexts == sum(6 + i for i in range(5))
            for field in ("mu", "pos", "ctx", "centered_gram", "pos_counts", "ctx_counts"):
                a, b = getattr(got, field), getattr(want, field)
                assert a.dtype == torch.float64
                # each rank shifts its float32 Grams by its own first batch (exact_gram=False):
                # they agree to float32 rounding of the centered second moment
                tol = GRAM_RTOL * b.abs().max().item() if field == "centered_gram" else DECOMP_TOL
                assert (a - b).abs().max().item() <= tol, (name, field)


# ------------------------------------------------------------ launching, and one process
def test_nproc_launches_torchrun_without_itself(monkeypatch):
    seen = []
    monkeypatch.setattr(distributed.group.subprocess, "call", lambda cmd, env=None: seen.append(cmd) or 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["train", "--nproc", "2", "--run-dir", "runs/x", "--steps", "3"]
    assert cli.main(argv) == 0
    assert seen[0][1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "tfmatcomp", "train", "--run-dir", "runs/x", "--steps", "3"]


def test_single_process_falls_back_and_bad_arguments():
    assert distributed.world_size() == 1 and not distributed.init()
    with pytest.raises(ValueError, match="no process group"):
        distributed.DistributedTrainer("tiny")
    with pytest.raises(ValueError, match="nproc"):
        distributed.torchrun_command(0, [])
    acc = tm.decomposition.DecompositionAccumulator()
    assert distributed.all_reduce_accumulator(acc) is acc


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
