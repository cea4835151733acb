"""Bad inputs are refused with an error naming the argument and its allowed values (issue 13).

One table: (case id, call, expected error type, words the message must contain). Every call must
raise; a call that returns (a silent acceptance) or raises another type fails.
"""

from __future__ import annotations

import math

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.decomposition import DecompositionAccumulator, decompose
from tfmatcomp.geometry.rank import pseudo_noise, screenot, stable_rank
from tfmatcomp.interventions import (
    ActivationAblation,
    ActivationPatch,
    MaskSubstitution,
    MeanAttentionAblation,
    PositionalPermutation,
    UniformAttentionAblation,
    WeightTransplant,
)
from tfmatcomp.validation import check_device, check_output_file, check_seed

NAN, INF = math.nan, math.inf
CFG = tm.get_preset("tiny").model
MODEL = tm.HookedEncoder(CFG)
TOKENS = torch.ones(2, 16, dtype=torch.long)
TASK = tm.MatrixCompletionTask(4, rank=1)
H = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))


def _enc(**kw):
    return lambda: tm.EncoderConfig(**kw)


def _task(**kw):
    return lambda: tm.TaskConfig(**kw)


def _train(**kw):
    return lambda: tm.TrainConfig(**kw)


def _with(t: torch.Tensor, index, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


V = ValueError
CASES = [
    # ---- EncoderConfig: every field, wrong type / NaN / negative / zero
    ("enc n_layers 0", _enc(n_layers=0), V, ["n_layers", "positive integer"]),
    ("enc n_layers float", _enc(n_layers=2.0), V, ["n_layers", "positive integer"]),
    ("enc n_heads str", _enc(n_heads="8"), V, ["n_heads", "positive integer"]),
    ("enc d_model -1", _enc(d_model=-1), V, ["d_model", "positive integer"]),
    ("enc d_model indivisible", _enc(d_model=10, n_heads=3), V, ["d_model", "n_heads"]),
    ("enc d_mlp bool", _enc(d_mlp=True), V, ["d_mlp", "positive integer"]),
    ("enc n_ctx 0", _enc(n_ctx=0), V, ["n_ctx", "positive integer"]),
    ("enc d_vocab None", _enc(d_vocab=None), V, ["d_vocab", "positive integer"]),
    ("enc d_out 0", _enc(d_out=0), V, ["d_out", "positive integer"]),
    ("enc d_head 0", _enc(d_head=0), V, ["d_head", "positive integer or None"]),
    ("enc d_head str", _enc(d_head="a"), V, ["d_head", "positive integer"]),
    ("enc n_token_types -1", _enc(n_token_types=-1), V, ["n_token_types", ">= 0"]),
    ("enc n_token_types str", _enc(n_token_types="a"), V, ["n_token_types", ">= 0"]),
    ("enc learned_mask_embedding 'no'", _enc(learned_mask_embedding="no"), V,
     ["learned_mask_embedding", "True or False"]),
    ("enc learned_mask_embedding 1", _enc(learned_mask_embedding=1), V,
     ["learned_mask_embedding", "True or False"]),
    ("enc mask_token_id out of vocab", _enc(mask_token_id=2002), V, ["mask_token_id", "[0, 2001]"]),
    ("enc mask_token_id str", _enc(mask_token_id="a"), V, ["mask_token_id", "integer"]),
    ("enc layer_norm_eps -1", _enc(layer_norm_eps=-1), V, ["layer_norm_eps", "finite number > 0"]),
    ("enc layer_norm_eps nan", _enc(layer_norm_eps=NAN), V, ["layer_norm_eps", "> 0"]),
    ("enc layer_norm_eps 0", _enc(layer_norm_eps=0.0), V, ["layer_norm_eps", "> 0"]),
    ("enc init_range nan", _enc(init_range=NAN), V, ["init_range", "finite number > 0"]),
    ("enc init_range inf", _enc(init_range=INF), V, ["init_range", "finite"]),
    ("enc init_range -0.02", _enc(init_range=-0.02), V, ["init_range", "> 0"]),
    ("enc init_range str", _enc(init_range="0.02"), V, ["init_range", "> 0"]),
    ("enc act_fn", _enc(act_fn="tanh"), V, ["act_fn", "gelu", "relu"]),
    ("enc from_dict unknown key", lambda: tm.EncoderConfig.from_dict({"n_layer": 2}), V,
     ["unknown keys", "n_layers"]),
    ("enc from_dict list", lambda: tm.EncoderConfig.from_dict([1, 2]), V, ["expected a dict"]),
    # ---- TaskConfig
    ("task n_rows str", _task(n_rows="a"), V, ["n_rows", "integer >= 1"]),
    ("task n_rows 0", _task(n_rows=0), V, ["n_rows", "integer >= 1"]),
    ("task n_cols -2", _task(n_cols=-2), V, ["n_cols", "integer >= 1"]),
    ("task rank > n", _task(n_rows=3, rank=4), V, ["rank", "[1, 3]"]),
    ("task p_mask 1", _task(p_mask=1.0), V, ["p_mask", "[0, 1)"]),
    ("task p_mask nan", _task(p_mask=NAN), V, ["p_mask", "[0, 1)"]),
    ("task p_mask str", _task(p_mask="0.3"), V, ["p_mask", "[0, 1)"]),
    ("task distribution", _task(distribution="cauchy"), V, ["distribution", "uniform"]),
    # ---- TrainConfig
    ("train n_steps 0", _train(n_steps=0), V, ["n_steps", "positive integer"]),
    ("train n_steps 7.5", _train(n_steps=7.5), V, ["n_steps", "positive integer"]),
    ("train batch_size -1", _train(batch_size=-1), V, ["batch_size", "positive integer"]),
    ("train eval_batch_size str", _train(eval_batch_size="64"), V, ["eval_batch_size", "positive"]),
    ("train log_every 0", _train(log_every=0), V, ["log_every", "positive integer"]),
    ("train lr inf", _train(lr=INF), V, ["lr", "finite number > 0"]),
    ("train lr nan", _train(lr=NAN), V, ["lr", "finite number > 0"]),
    ("train lr 0", _train(lr=0.0), V, ["lr", "> 0"]),
    ("train lr str", _train(lr="1e-3"), V, ["lr", "> 0"]),
    ("train seed 2**64", _train(seed=2**64), V, ["seed", "[0, 2**63 - 1]"]),
    ("train seed -1", _train(seed=-1), V, ["seed", "[0, 2**63 - 1]"]),
    ("train seed float", _train(seed=1.0), V, ["seed", "integer"]),
    ("train checkpoint_every -1", _train(checkpoint_every=-1), V, ["checkpoint_every", ">= 0"]),
    ("train checkpoint_every str", _train(checkpoint_every="a"), V, ["checkpoint_every", ">= 0"]),
    ("train checkpoint_steps str", _train(checkpoint_steps="100"), V,
     ["checkpoint_steps", "list of integers"]),
    ("train checkpoint_steps negative", _train(checkpoint_steps=(-5,)), V,
     ["checkpoint_steps", ">= 0"]),
    ("train checkpoint_steps float", _train(checkpoint_steps=(1.5,)), V,
     ["checkpoint_steps", "integers"]),
    # ---- presets
    ("get_preset 123", lambda: tm.get_preset(123), V, ["preset", "tiny"]),
    ("get_preset unknown", lambda: tm.get_preset("huge"), V, ["preset", "tiny"]),
    ("train preset 123", lambda: tm.train(preset=123, out_dir=None), V, ["preset", "tiny"]),
    # ---- the model: seed, tokens, return_type, token types, hooks
    ("model seed 2**64", lambda: tm.HookedEncoder(CFG, seed=2**64), V, ["seed", "2**63 - 1"]),
    ("model seed -1", lambda: tm.HookedEncoder(CFG, seed=-1), V, ["seed", "[0,"]),
    ("model seed str", lambda: tm.HookedEncoder(CFG, seed="0"), V, ["seed", "integer"]),
    ("model cfg dict", lambda: tm.HookedEncoder({"n_layers": 2}), TypeError, ["cfg", "EncoderConfig"]),
    ("model return_type logits", lambda: MODEL(TOKENS, return_type="logits"), V,
     ["return_type", "predictions", "hidden"]),
    ("tokens float", lambda: MODEL(TOKENS.float()), V, ["tokens", "integers"]),
    ("tokens bool", lambda: MODEL(TOKENS.bool()), V, ["tokens", "integers"]),
    ("tokens 1-D", lambda: MODEL(TOKENS[0]), V, ["tokens", "[batch, pos]"]),
    ("tokens 3-D", lambda: MODEL(TOKENS[None]), V, ["tokens", "[batch, pos]"]),
    ("tokens list", lambda: MODEL([[1, 2]]), V, ["tokens", "[batch, pos]"]),
    ("tokens too long", lambda: MODEL(torch.ones(1, 17, dtype=torch.long)), V, ["tokens", "n_ctx"]),
    ("tokens negative", lambda: MODEL(-TOKENS), V, ["tokens", "[0, 2001]"]),
    ("tokens >= d_vocab", lambda: MODEL(TOKENS * 2002), V, ["tokens", "[0, 2001]"]),
    ("token_type_ids without token types", lambda: MODEL(TOKENS, token_type_ids=TOKENS * 5), V,
     ["token_type_ids", "no token types"]),
    ("token_type_ids wrong shape", lambda: MODEL(TOKENS, token_type_ids=TOKENS[:1]), V,
     ["token_type_ids", "shape"]),
    ("token_type_ids float", lambda: MODEL(TOKENS, token_type_ids=TOKENS.float() * 0), V,
     ["token_type_ids", "integers"]),
    ("attention_mask wrong shape", lambda: MODEL(TOKENS, attention_mask=TOKENS[:1]), V,
     ["attention_mask", "shape"]),
    ("hook name typo", lambda: MODEL.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_resid_pr",
                                                                      lambda a, hook: None)]),
     tm.UnknownHookError, ["hook name", "did you mean"]),
    # ---- data
    ("sample batch_size 0", lambda: TASK.sample(0), V, ["batch_size", ">= 1"]),
    ("sample batch_size float", lambda: TASK.sample(2.0), V, ["batch_size", "integer"]),
    ("sample observed wrong shape", lambda: TASK.sample(4, observed=torch.ones(3, 16, dtype=torch.bool)),
     V, ["observed", "[16] or [4, 16]"]),
    ("sample observed 0-D", lambda: TASK.sample(4, observed=torch.tensor(True)), V,
     ["observed", "expected shape"]),
    ("sample observed int", lambda: TASK.sample(2, observed=torch.ones(16, dtype=torch.long)), V,
     ["observed", "bool"]),
    ("from_values observed shape", lambda: tm.MatrixBatch.from_values(
        torch.zeros(2, 16), torch.ones(3, 16, dtype=torch.bool), 4, 4), V, ["observed", "[2, 16]"]),
    ("sample generator not a Generator", lambda: TASK.sample(2, generator=0), V,
     ["generator", "torch.Generator"]),
    ("sample device bogus", lambda: TASK.sample(2, device="bogus"), V, ["device", "'cpu'"]),
    # ---- decomposition
    ("decompose dtype long", lambda: decompose(H, dtype=torch.long), V,
     ["dtype", "floating-point"]),
    ("decompose dtype str", lambda: decompose(H, dtype="float64"), V, ["dtype", "floating-point"]),
    ("decompose NaN", lambda: decompose(_with(H, (0, 0, 0), NAN)), V, ["h", "finite", "1 NaN"]),
    ("decompose inf", lambda: decompose(_with(H, (0, 0, 0), INF)), V, ["h", "finite", "1 inf"]),
    ("decompose int tensor", lambda: decompose(H.long()), V, ["h", "floating-point"]),
    ("decompose 2-D", lambda: decompose(H[0]), V, ["h", "[contexts, positions, d]"]),
    ("decompose drop_first too large", lambda: decompose(H, drop_first=4), V, ["drop_first", "[0, 3]"]),
    ("decompose mask shape", lambda: decompose(H, torch.ones(3, 3, dtype=torch.bool)), V,
     ["mask", "expected shape"]),
    ("accumulator NaN", lambda: DecompositionAccumulator().update({"l": _with(H, (1, 1, 1), NAN)}),
     V, ["activations['l']", "finite"]),
    ("accumulator dtype long", lambda: DecompositionAccumulator(dtype=torch.long), V,
     ["dtype", "floating-point"]),
    ("accumulator dtype str", lambda: DecompositionAccumulator(dtype="float"), V,
     ["dtype", "floating-point"]),
    ("accumulator drop_first -1", lambda: DecompositionAccumulator(drop_first=-1), V,
     ["drop_first", "non-negative"]),
    ("accumulator keep_ctx 'yes'", lambda: DecompositionAccumulator(keep_ctx="yes"), V,
     ["keep_ctx", "True or False"]),
    # ---- rank measures
    ("stable_rank NaN", lambda: stable_rank(torch.full((3, 3), NAN)), V, ["matrix", "finite"]),
    ("stable_rank inf", lambda: stable_rank(_with(torch.eye(3), (0, 0), INF)), V, ["matrix", "finite"]),
    ("stable_rank 1-D", lambda: stable_rank(torch.ones(3)), V, ["matrix", "2-D"]),
    ("screenot 1x1", lambda: screenot(torch.ones(1, 1)), V, ["matrix", "min(m, n) >= 4"]),
    ("screenot NaN", lambda: screenot(torch.full((10, 10), NAN), k=2), V, ["matrix", "finite"]),
    ("screenot k 0", lambda: screenot(torch.eye(10), k=0), V, ["k", "[1, 4]"]),
    ("screenot strategy", lambda: screenot(torch.eye(10), k=2, strategy="median"), V,
     ["strategy", "impute"]),
    ("pseudo_noise too few values", lambda: pseudo_noise(torch.ones(2), k=1), V,
     ["singular_values", "at least 4"]),
    # ---- interventions: heads, layers, hooks, seeds, values
    ("uniform ablation head 'a'", lambda: UniformAttentionAblation([(0, "a")]), V,
     ["heads", "(layer, head) pairs of integers"]),
    ("uniform ablation heads 'some'", lambda: UniformAttentionAblation("some"), V,
     ["heads", "'all'"]),
    ("uniform ablation bare ints", lambda: UniformAttentionAblation([0, 1]), V,
     ["heads", "(layer, head)"]),
    ("mean ablation negative head", lambda: MeanAttentionAblation([(0, -1)]), V,
     ["heads", "(layer, head)"]),
    ("ablation head out of range", lambda: UniformAttentionAblation([(0, 9)]).run(MODEL, TOKENS), V,
     ["heads", "out of range", "0..3"]),
    ("activation ablation heads str", lambda: ActivationAblation("attn.hook_z", heads=["a"]), V,
     ["heads", "list of integers"]),
    ("activation ablation layers str", lambda: ActivationAblation("attn.hook_z", layers="01"), V,
     ["layers", "list of integers"]),
    ("activation ablation hooks int", lambda: ActivationAblation(3), V, ["hooks", "hook name"]),
    ("activation ablation mode", lambda: ActivationAblation("hook_mlp_out", mode="one"), V,
     ["mode", "zero", "mean"]),
    ("activation ablation unknown hook", lambda: ActivationAblation("hook_nope").run(MODEL, TOKENS),
     V, ["hook"]),
    ("patch layers float", lambda: ActivationPatch(TOKENS, layers=[0.5]), V, ["layers", "integers"]),
    ("permutation not a permutation", lambda: PositionalPermutation([0, 0]), V,
     ["perm", "permutation"]),
    ("permutation floats", lambda: PositionalPermutation([0.5, 1.5]), V, ["perm", "integers"]),
    ("permutation float tensor", lambda: PositionalPermutation(torch.tensor([1.0, 0.0])), V,
     ["perm", "integers"]),
    ("permutation seed 2**64", lambda: PositionalPermutation(seed=2**64), V,
     ["seed", "[0, 2**63 - 1]"]),
    ("permutation perm and seed", lambda: PositionalPermutation([0], seed=1), V,
     ["perm, seed", "exactly one"]),
    ("mask substitution NaN", lambda: MaskSubstitution(NAN), V, ["value", "[-10.0, 10.0]"]),
    ("mask substitution 11", lambda: MaskSubstitution(11), V, ["value", "[-10.0, 10.0]"]),
    ("mask substitution str", lambda: MaskSubstitution("x"), V, ["value", "real number"]),
    ("transplant layers str", lambda: WeightTransplant(MODEL, layers=["a"]), V,
     ["layers", "integers"]),
    ("transplant params int", lambda: WeightTransplant(MODEL, params=3), V, ["params", "group"]),
    ("transplant strict str", lambda: WeightTransplant(MODEL, strict="no"), V,
     ["strict", "True or False"]),
    ("paper_heads garbage", lambda: tm.interventions.paper_heads("(a,b)"), V, ["spec", "(3,3)"]),
    # ---- bundled runs and checkpoints
    ("load_pretrained ../x", lambda: tm.load_pretrained("../x"), V, ["name", "pretrained runs", "tiny"]),
    ("load_pretrained path-like", lambda: tm.load_pretrained("../pretrained/tiny"), V,
     ["name", "pretrained runs"]),
    ("load_pretrained int", lambda: tm.load_pretrained(3), V, ["name", "pretrained runs"]),
    ("load_pretrained step", lambda: tm.load_pretrained("tiny", step=7), V, ["step", "has steps"]),
    ("load_checkpoint missing", lambda: tm.load_checkpoint("/nonexistent/ckpt"), tm.CheckpointError,
     ["path", "no checkpoint"]),
    ("load_checkpoint device", lambda: tm.pretrained.load_pretrained("tiny", device="bogus"), V,
     ["device"]),
    # ---- shared checks
    ("check_seed 2**63", lambda: check_seed("seed", 2**63), V, ["seed", "[0, 2**63 - 1]"]),
    ("check_device bogus", lambda: check_device("device", "bogus"), V, ["device", "'cpu'"]),
    ("check_output_file below a file", lambda: check_output_file("out", "/etc/hostname/r.html"), V,
     ["out", "not a directory"]),
    ("check_output_file /dev/full", lambda: check_output_file("out", "/dev/full"), V,
     ["out", "not a regular file"]),
    # ---- the report
    ("report n_samples 3", lambda: tm.report.build_report("tiny", "/tmp/x.html", n_samples=3), V,
     ["n_samples", ">= 8"]),
    ("report seed 2**64", lambda: tm.report.build_report("tiny", "/tmp/x.html", seed=2**64), V,
     ["seed", "2**63 - 1"]),
    ("report sections str", lambda: tm.report.build_report("tiny", "/tmp/x.html", sections="copying"),
     V, ["sections", "list"]),
    ("report unknown section", lambda: tm.report.build_report("tiny", "/tmp/x.html", sections=["x"]),
     V, ["sections", "training"]),
    ("report out below a file", lambda: tm.report.build_report("tiny", "/etc/hostname/r.html"), V,
     ["out", "not a directory"]),
    ("report out /dev/full", lambda: tm.report.build_report("tiny", "/dev/full"), V,
     ["out", "not a regular file"]),
]


def test_table_is_large_and_ids_are_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) >= 60
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("call, error, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_clearly(call, error, words):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"message {message!r} lacks {missing}"


def test_valid_token_type_ids_still_accepted():
    """All-zero ids (HF's default) are fine without token types; real ids with them."""
    out = MODEL(TOKENS, token_type_ids=torch.zeros_like(TOKENS))
    assert torch.equal(out, MODEL(TOKENS))
    model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=1, d_model=4, d_mlp=4, n_ctx=3,
                                              d_vocab=5, n_token_types=2))
    model(torch.ones(1, 3, dtype=torch.long), token_type_ids=torch.tensor([[0, 1, 1]]))


def test_masked_padding_may_hold_nan():
    """Only valid entries must be finite: NaN padding outside the mask is fine."""
    h = _with(H, (0, 3, slice(None)), NAN)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[0, 3] = False
    assert torch.isfinite(decompose(h, mask).mu).all()
