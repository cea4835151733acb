"""The ``paper-cpu`` preset: the papers' task and model shape, only narrower (docs/paper-cpu.md)."""

from __future__ import annotations

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics.drop import detect_drop
from tfmatcomp.interventions import UniformAttentionAblation
from tfmatcomp.report.run import SeedGroup


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


# ---- the bundled run (tfmatcomp/pretrained/paper-cpu): the acceptance, on fresh matrices


def test_bundled_paper_cpu_completes_and_needs_its_attention(fresh_7x7, l_mask):
    post, pre = tm.load_pretrained("paper-cpu", step="post"), tm.load_pretrained("paper-cpu", "pre")
    assert post.cfg == tm.get_preset("paper-cpu").model  # 4 layers x 8 heads, d_model 256
    l_post, l_pre = l_mask(post, fresh_7x7), l_mask(pre, fresh_7x7)
    assert l_post < 0.035  # nuclear-norm minimization: 0.0338 on 512 such matrices
    assert l_pre > 8 * l_post
    every_head = [(layer, head) for layer in range(4) for head in range(8)]
    with UniformAttentionAblation(every_head).applied(post):
        assert l_mask(post, fresh_7x7) > 0.15  # back near the plateau's 0.22


def test_bundled_paper_cpu_brackets_its_drop_and_keeps_every_seed():
    info = tm.pretrained.run_info("paper-cpu")
    drop = detect_drop(tm.read_metrics(tm.pretrained.run_dir("paper-cpu")))
    assert drop.has_drop and drop.reason == "sudden drop"
    assert info["pre_shift_step"] < drop.drop_start < drop.drop_end <= info["post_shift_step"]
    steps = tm.pretrained.available()["paper-cpu"].steps
    assert any(drop.drop_start <= s <= drop.drop_end for s in steps)  # a checkpoint inside it
    group = SeedGroup.load(tm.pretrained.run_dir("paper-cpu") / info["group"])
    assert info["seed"] in group.dropped
    assert group.seeds == [0, 1, 2, 3]  # every seed trained to 30,000 steps keeps its log
