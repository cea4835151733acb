"""The GPT variant: sequence format, losses, training, interventions and experiments on a decoder."""

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.task import gpt as gpt_task
from tfmatcomp.datapath import predict, sample_batch
from tfmatcomp.interventions import (ActivationPatch, MaskSubstitution, PositionalPermutation,
                                     UniformAttentionAblation, WeightTransplant, from_dict,
                                     negation_patch)
from tfmatcomp.runs.layout import CHECKPOINTS_DIR, CONFIG_FILE

SMALL = tm.DecoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=33, d_vocab=2003)


@pytest.fixture
def model():
    return tm.HookedDecoder(SMALL, seed=0).eval()


@pytest.fixture
def batch():
    return sample_batch("gpt-tiny", 6, seed=0)


def test_sequence_layout_and_round_trip(batch):
    seq = gpt_task.encode_sequence(batch)
    P = 16
    assert seq.shape == (6, 2 * P + 1)
    assert torch.equal(seq[:, :P], batch.tokens)
    assert bool((seq[:, P] == gpt_task.sep_token_id()).all())
    assert torch.equal(seq[:, P + 1:], batch.tokenizer.encode(batch.values))
    back = gpt_task.decode_sequence(seq, 4, 4)
    for field in ("tokens", "values", "observed"):
        assert torch.equal(getattr(back, field), getattr(batch, field))
    bad = seq.clone()
    bad[:, P] = 5
    with pytest.raises(ValueError, match="separator"):
        gpt_task.decode_sequence(bad, 4, 4)


def test_losses_of_a_perfect_predictor(batch):
    seq = gpt_task.encode_sequence(batch)
    logits = torch.full((6, 33, 2003), -30.0)
    logits[:, 16:32].scatter_(-1, seq[:, 17:, None], 30.0)  # position P + k predicts entry k
    out = gpt_task.gpt_losses(logits, batch)
    assert out["L"].item() == 0 and out["acc_mask"].item() == 1 and out["acc_obs"].item() == 1
    assert out["CE"].item() < 1e-6
    assert torch.equal(gpt_task.predicted_values(logits), batch.values)


def test_datapath_predictions_are_the_teacher_forced_values(model, batch):
    preds = predict(model, batch, batch_size=4)
    logits = model(gpt_task.encode_sequence(batch))
    assert preds.shape == batch.values.shape
    assert torch.equal(preds, gpt_task.predicted_values(logits))


def test_short_training_run_reduces_loss(tmp_path):
    cfg = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=32, d_mlp=64, n_ctx=9, d_vocab=2003)
    r = tm.train("gpt-tiny", model_cfg=cfg, task_cfg=tm.TaskConfig(n_rows=2, rank=1),
                 n_steps=60, batch_size=32, eval_batch_size=16, log_every=10, lr=3e-3,
                 out_dir=tmp_path / "run", progress=False)
    ce = r.metrics["train_CE"].tolist()
    assert ce[-1] < ce[0] - 1.0
    for name in ("eval_L_mask", "eval_acc_mask", "eval_gen_acc_obs", "eval_CE"):
        assert name in r.metrics
    loaded = tm.load_checkpoint(tmp_path / "run")
    assert isinstance(loaded, tm.HookedDecoder)
    assert '"kind": "decoder"' in next((tmp_path / "run" / CHECKPOINTS_DIR).iterdir()
                                       ).joinpath(CONFIG_FILE).read_text()


def test_resume_of_a_decoder_run_continues_exactly(tmp_path):
    cfg = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9, d_vocab=2003)
    kw = dict(model_cfg=cfg, task_cfg=tm.TaskConfig(n_rows=2, rank=1), batch_size=8,
              eval_batch_size=8, log_every=5, checkpoint_every=5, progress=False)
    full = tm.train("gpt-tiny", n_steps=10, out_dir=tmp_path / "a", **kw)
    tm.train("gpt-tiny", n_steps=5, out_dir=tmp_path / "b", **kw)
    resumed = tm.train("gpt-tiny", n_steps=10, out_dir=tmp_path / "b", resume=True, **kw)
    assert resumed.metrics["train_CE"].tolist() == full.metrics["train_CE"].tolist()


def test_uniform_ablation_stays_causal(model, batch):
    tokens = gpt_task.encode_sequence(batch)
    _, cache = UniformAttentionAblation("all").run_with_cache(model, tokens)
    pat = cache["blocks.1.attn.hook_pattern"]
    assert bool((pat.triu(1) == 0).all())
    assert torch.allclose(pat[0, 0, 9, :10], torch.full((10,), 0.1))
    assert torch.allclose(pat.sum(-1), torch.ones(()))
    with torch.no_grad():  # a random decoder's arg-max barely moves; its logits do
        assert not torch.allclose(UniformAttentionAblation("all").run(model, tokens), model(tokens))


def test_negation_patch_on_the_decoder(model, batch):
    patch, target = negation_patch(batch)
    assert patch.acts_on(model) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    # patching every layer's resid_post from X makes the -X run produce X's predictions
    full = ActivationPatch(batch, hooks="blocks.1.hook_resid_post")
    assert torch.equal(predict(model, target, full), predict(model, batch))
    assert predict(model, target, patch).shape == batch.values.shape


def test_weight_transplant_and_permutation_on_the_decoder(model, batch):
    donor = tm.HookedDecoder(SMALL, seed=1).eval()
    iv = WeightTransplant(donor, params="all")
    assert torch.equal(predict(model, batch, iv), predict(donor, batch))
    tokens = gpt_task.encode_sequence(batch)
    with torch.no_grad():  # the hook form (no hook after the unembedding) agrees with applied()
        hooked = model.run_with_hooks(tokens, fwd_hooks=iv.fwd_hooks(model))
    assert torch.allclose(hooked, donor(tokens), atol=1e-5)
    assert torch.equal(model.W_Q, tm.HookedDecoder(SMALL, seed=0).W_Q)
    again = from_dict(iv.to_dict())
    assert torch.equal(predict(model, batch, again), predict(donor, batch))
    assert "pos_embed.W_pos" in WeightTransplant(donor, params="pos_embed").acts_on(model)
    perm = PositionalPermutation(list(range(33))[::-1])
    assert perm.acts_on(model) == ["pos_embed.W_pos"]
    with torch.no_grad():
        assert not torch.allclose(perm.run(model, tokens), model(tokens))


def test_mask_substitution_on_the_decoder(model, batch):
    iv = MaskSubstitution(0.44)
    assert iv.acts_on(model) == ["hook_embed"]
    tokens = gpt_task.encode_sequence(batch)
    with torch.no_grad():
        want = model(iv.transform_tokens(tokens, model))
        got = model.run_with_hooks(tokens, fwd_hooks=iv.fwd_hooks(model))
    assert torch.allclose(got, want, atol=1e-5)


def test_experiment_tables_run_on_a_decoder(model):
    from tfmatcomp.experiments import (activation_patching, attention_ablation, attention_change,
                                       weight_transplant)

    assert len(attention_ablation(model, "gpt-tiny", n_samples=4)) == 2
    assert set(activation_patching(model, "gpt-tiny", n_samples=4)["patched"]) == {
        "none", "all", "layer 0", "layer 1"}
    other = tm.HookedDecoder(SMALL, seed=1)
    assert len(weight_transplant(model, other, "gpt-tiny", n_samples=4)) == 4
    df = attention_change(model, other, "gpt-tiny", n_samples=4)
    assert set(df["target"]) == {"same_row", "same_col", "self", "sep"}
    sums = df[df.target.isin(["self", "sep"])].groupby(["layer", "head"])["before"].sum()
    assert bool((sums <= 1 + 1e-6).all())


def test_attention_targets_on_an_encoder():
    from tfmatcomp.experiments import attention_targets

    df = attention_targets(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=4)
    assert (df["sep"] == 0).all()
    # self + same row + same column <= 1 (the other entries take the rest)
    assert bool(((df["self"] + df["same_row"] + df["same_col"]) <= 1 + 1e-6).all())


def test_n_ctx_checks_name_the_sequence_length():
    with pytest.raises(ValueError, match="33 positions"):
        tm.Trainer("gpt-tiny", model_cfg=tm.DecoderConfig(d_model=8, d_mlp=8, n_ctx=16),
                   progress=False)


def test_batched_trainer_refuses_a_decoder_preset():
    # Both run the encoder's masked-MSE forward; a decoder must say so, not train wrongly.
    with pytest.raises(ValueError, match="multi-seed trainer runs the encoder task only"):
        tm.train_many("gpt-tiny", seeds="0-1", n_steps=1)
