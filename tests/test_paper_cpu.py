"""The ``paper-cpu`` preset: the papers' task and model shape, only narrower (docs/paper-cpu.md)."""

from __future__ import annotations

import tfmatcomp as tm


def test_paper_cpu_is_the_papers_task_and_shape():
    cpu, paper = tm.get_preset("paper-cpu"), tm.get_preset("paper-4l8h")
    assert cpu.task == paper.task  # 7x7, rank 2, Uniform[-1, 1] factors, p_mask 0.3
    assert cpu.task.n_rows == 7 and cpu.task.rank == 2 and cpu.task.p_mask == 0.3
    m = cpu.model
    assert (m.n_layers, m.n_heads, m.n_ctx) == (4, 8, 49)
    assert m.d_mlp == 4 * m.d_model
    assert not m.learned_mask_embedding  # the zero, untrained MASK embedding
    # what the search settled (docs/paper-cpu.md)
    assert (m.d_model, m.init_range) == (256, 0.05)
    t = cpu.train
    assert (t.batch_size, t.lr, t.interventions) == (128, 3e-4, ())
    # the run a user trains resumes the search's screens: same seed, lr, batches
    assert t.eval_batch_size == paper.train.eval_batch_size
    # bundle-sized checkpoints
    assert t.checkpoint_dtype == "bfloat16" and t.max_shard_mb < 16


def test_paper_cpu_is_listed_and_trains_one_step(tmp_path):
    assert "paper-cpu" in tm.PRESETS
    result = tm.train("paper-cpu", n_steps=1, batch_size=2, out_dir=tmp_path / "run",
                      checkpoint_every=0, progress=False)
    assert result.model.cfg.d_model == 256
