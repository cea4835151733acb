"""The bundled ``paper-4l8h`` run: the papers' own model (4 layers x 8 heads x 768, 50,000 steps at
batch 256), trained once on a GPU (docs/gpu-training.md) and loaded here on the CPU, offline."""

from __future__ import annotations

import tfmatcomp as tm
from tfmatcomp.analyses.dynamics.drop import detect_drop
from tfmatcomp.interventions import UniformAttentionAblation
from tfmatcomp.runs.layout import CHECKPOINTS_DIR


def test_bundled_paper_4l8h_completes_and_needs_its_attention(fresh_7x7, l_mask):
    post = tm.load_pretrained("paper-4l8h", step="post")
    assert post.cfg == tm.get_preset("paper-4l8h").model  # 4 x 8 x 768, the papers' model
    l_post = l_mask(post, fresh_7x7)
    assert l_post <= 0.03  # the papers: 0.0128; nuclear-norm minimization about 0.034
    every_head = [(layer, head) for layer in range(4) for head in range(8)]
    with UniformAttentionAblation(every_head).applied(post):
        assert l_mask(post, fresh_7x7) > 0.12  # back near the plateau's 0.22
    del post
    pre = tm.load_pretrained("paper-4l8h", step="pre")
    assert l_mask(pre, fresh_7x7) >= 0.15  # on the plateau: it copies, it does not complete


def test_bundled_paper_4l8h_is_the_presets_run_and_brackets_its_drop():
    run = tm.pretrained.run_dir("paper-4l8h")
    info = tm.pretrained.run_info("paper-4l8h")
    assert (info["pre_shift_step"], info["post_shift_step"]) == (4_000, 50_000)
    assert tm.pretrained.available()["paper-4l8h"].steps == [4_000, 50_000]
    metrics = tm.read_metrics(run)
    assert int(metrics["step"].iloc[-1]) == tm.get_preset("paper-4l8h").train.n_steps
    drop = detect_drop(metrics)
    assert drop.has_drop and drop.reason == "sudden drop"
    assert info["pre_shift_step"] < drop.drop_start < drop.drop_end < info["post_shift_step"]
    # bundle-sized: bf16 shards under 16 MiB, in transformers' sharded layout
    for step_dir in (run / CHECKPOINTS_DIR).iterdir():
        shards = sorted(step_dir.glob("model-*.safetensors"))
        assert len(shards) > 1 and (step_dir / "model.safetensors.index.json").exists()
        assert all(s.stat().st_size < 16 * 2**20 for s in shards)


def test_paper_presets_write_bundle_sized_checkpoints():
    for name in ("paper-4l8h", "paper-12l12h", "paper-cpu"):
        t = tm.get_preset(name).train
        assert t.checkpoint_dtype == "bfloat16" and t.max_shard_mb < 16, name
