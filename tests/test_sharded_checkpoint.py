"""Sharded, half-precision checkpoints (issue 10, deliverable 3): written like transformers'
``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``, read by every loader, and
the single-file layout still loads."""

from __future__ import annotations

import json

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint_files import seal_config, sha256_file
from tfmatcomp.datapath import load_checkpoints
from tfmatcomp.runs.layout import CONFIG_FILE, INDEX_FILE, WEIGHTS_FILE

CFG = tm.get_preset("tiny").model
MODEL = tm.HookedEncoder(CFG, seed=3)
LIMIT_MB = 0.1  # the tiny model's fp32 weights (~0.9 MiB) in several shards; W_E alone is larger


def _shards(path):
    return sorted(p for p in path.iterdir() if p.name.startswith("model-"))


def _same(a, b, **tol):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], **tol, msg=k)


def test_sharded_fp32_round_trip_is_exact_and_shards_respect_the_limit(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "c", step=7, max_shard_mb=LIMIT_MB)
    shards = _shards(path)
    assert len(shards) > 2 and not (path / WEIGHTS_FILE).exists()
    assert [p.name for p in shards][0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((path / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(MODEL.state_dict())
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in MODEL.state_dict().values())
    limit = int(LIMIT_MB * (1 << 20))
    too_big = {n for n, t in MODEL.state_dict().items() if t.numel() * t.element_size() > limit}
    assert too_big == {"embed.W_E"}
    for shard in shards:
        held = [n for n, f in index["weight_map"].items() if f == shard.name]
        # a tensor larger than the limit alone in its shard; every other shard under the limit
        assert shard.stat().st_size <= limit or held == ["embed.W_E"]
    model, info = tm.runs.checkpoint.load_checkpoint_info(path)
    assert info.step == 7 and model.dtype == torch.float32
    _same(model, MODEL, rtol=0, atol=0)
    for name in (shards[1].name, INDEX_FILE):  # a shard or the index names the checkpoint too
        _same(tm.load_checkpoint(path / name), MODEL, rtol=0, atol=0)


def test_bf16_checkpoint_loads_as_float32_within_bf16_rounding(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "c", dtype=torch.bfloat16, max_shard_mb=LIMIT_MB)
    assert json.loads((path / CONFIG_FILE).read_text())["dtype"] == "bfloat16"
    single = tm.save_checkpoint(MODEL, tmp_path / "s", dtype="bf16")
    total = sum(p.stat().st_size for p in _shards(path))
    assert total < 0.55 * sum(t.numel() * 4 for t in MODEL.state_dict().values())
    for p in (path, single):
        model = tm.load_checkpoint(p)
        assert model.dtype == torch.float32 and model.device.type == "cpu"
        _same(model, MODEL, rtol=2 ** -8, atol=0)  # bf16 keeps 8 significant bits
        for k, v in model.state_dict().items():
            assert torch.equal(v, MODEL.state_dict()[k].to(torch.bfloat16).float()), k


def test_every_loader_reads_a_sharded_run(tmp_path):
    out = tmp_path / "run"
    tm.train("tiny", n_steps=4, batch_size=8, log_every=2, checkpoint_every=2, out_dir=out,
             progress=False, checkpoint_dtype="bfloat16", max_shard_mb=LIMIT_MB)
    checkpoints = tm.list_checkpoints(out)
    assert list(checkpoints) == [2, 4] and all(_shards(p) for p in checkpoints.values())
    models = load_checkpoints(out)
    assert sorted(models) == [2, 4] and models[4].dtype == torch.float32
    assert tm.load_checkpoint(out).cfg == CFG  # a run directory: its latest checkpoint


def test_resume_from_bf16_checkpoints_is_exact(tmp_path):
    """The latest checkpoint's training state keeps the float32 weights, so a resumed run follows
    the uninterrupted one bit for bit although its weights files are bfloat16."""
    kw = dict(batch_size=8, log_every=2, checkpoint_every=2, progress=False,
              checkpoint_dtype="bfloat16", max_shard_mb=LIMIT_MB)
    full = tm.train("tiny", n_steps=6, out_dir=tmp_path / "a", **kw)
    tm.train("tiny", n_steps=4, out_dir=tmp_path / "b", **kw)
    resumed = tm.train("tiny", n_steps=6, out_dir=tmp_path / "b", resume=True, **kw)
    assert full.metrics.equals(resumed.metrics.assign(elapsed_s=full.metrics["elapsed_s"]))
    _same(full.model, resumed.model, rtol=0, atol=0)


def test_missing_shard_is_a_clear_error(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "c", max_shard_mb=LIMIT_MB)
    gone = _shards(path)[1]
    gone.unlink()
    with pytest.raises(tm.CheckpointError, match=f"{gone.name} is missing"):
        tm.load_checkpoint(path)


def test_index_that_disagrees_with_its_shards_is_refused(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "c", max_shard_mb=LIMIT_MB)
    index = json.loads((path / INDEX_FILE).read_text())
    first, second = _shards(path)[:2]
    index["weight_map"] = {k: (second.name if v == first.name else v)
                           for k, v in index["weight_map"].items()}
    (path / INDEX_FILE).write_text(json.dumps(index))
    config = json.loads((path / CONFIG_FILE).read_text())
    config["files"][INDEX_FILE] = sha256_file(path / INDEX_FILE)  # re-digested, as a forger would
    (path / CONFIG_FILE).write_text(json.dumps(seal_config(config)))
    with pytest.raises(tm.CheckpointError, match="other tensors"):
        tm.load_checkpoint(path)


def test_single_file_layout_still_loads(tmp_path):
    path = tm.save_checkpoint(MODEL, tmp_path / "c")
    assert sorted(p.name for p in path.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    _same(tm.load_checkpoint(path / WEIGHTS_FILE), MODEL, rtol=0, atol=0)
    # a limit the whole model fits under writes the single file too
    path = tm.save_checkpoint(MODEL, tmp_path / "d", max_shard_mb=15)
    assert not (path / INDEX_FILE).exists() and (path / WEIGHTS_FILE).exists()


@pytest.mark.parametrize("kwargs, words", [
    (dict(dtype=torch.int8), ["dtype", "torch.bfloat16", "bf16"]),
    (dict(dtype="half-ish"), ["dtype", "bfloat16"]),
    (dict(max_shard_mb=0), ["max_shard_mb", "(0, 1048576]"]),
    (dict(max_shard_mb=-3), ["max_shard_mb", "MiB"]),
    (dict(max_shard_mb=float("nan")), ["max_shard_mb"]),
    (dict(max_shard_mb="15"), ["max_shard_mb"]),
    (dict(max_shard_mb=True), ["max_shard_mb"]),
])
def test_bad_dtype_or_shard_limit_names_the_argument(tmp_path, kwargs, words):
    with pytest.raises(ValueError) as info:
        tm.save_checkpoint(MODEL, tmp_path / "c", **kwargs)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("field, value, words", [
    ("checkpoint_dtype", "int8", ["checkpoint_dtype", "bfloat16"]),
    ("max_shard_mb", 0, ["max_shard_mb", "(0, 1048576]"]),
    ("fast", "yes", ["fast", "None"]),
])
def test_train_config_checks_the_new_fields(field, value, words):
    with pytest.raises(ValueError) as info:
        tm.TrainConfig(**{field: value})
    assert all(w in str(info.value) for w in words), str(info.value)


def test_old_train_config_without_the_new_fields_loads():
    old = {k: v for k, v in tm.TrainConfig().to_dict().items()
           if k not in ("fast", "checkpoint_dtype", "max_shard_mb")}
    cfg = tm.TrainConfig.from_dict(old)
    assert (cfg.fast, cfg.checkpoint_dtype, cfg.max_shard_mb) == (None, "float32", None)
    assert tm.TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_shards_are_written_by_huggingface_hub(tmp_path):
    """save_torch_state_dict writes the shards: each carries its {"format": "pt"} header."""
    from safetensors import safe_open

    path = tm.save_checkpoint(MODEL, tmp_path / "c", max_shard_mb=LIMIT_MB)
    for shard in _shards(path):
        with safe_open(shard, framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
