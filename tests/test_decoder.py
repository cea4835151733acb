"""HookedDecoder: GPT-2 equivalence both ways, every hook and its shape, causal masking, pattern
edits, checkpoints."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from transformer_lens import ActivationCache

import tfmatcomp as tm
from tfmatcomp.runs.checkpoint_files import seal_config
from tfmatcomp.models.decoder import next_token_loss

transformers = pytest.importorskip("transformers")

CFG = tm.DecoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=40, n_ctx=10, d_vocab=23)
B, P = 3, 10


def _tokens(seed: int = 0, pos: int = P) -> torch.Tensor:
    return torch.randint(0, CFG.d_vocab, (B, pos), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _randomize(module: torch.nn.Module, seed: int, skip: tuple[str, ...] = ()) -> None:
    """Every parameter (LayerNorm gains and biases included) to N(0, 0.5^2) (gains around 1)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if any(s in name for s in skip):
            continue
        noise = torch.randn(p.shape, generator=g) * 0.5
        p.copy_(noise + 1 if name.endswith(("ln1.w", "ln2.w", "ln_final.w", "ln_1.weight",
                                            "ln_2.weight", "ln_f.weight")) else noise)


def _model(seed: int = 0) -> tm.HookedDecoder:
    model = tm.HookedDecoder(CFG, seed=seed)
    _randomize(model, seed, skip=("unembed.b_U",))  # GPT-2's head has no bias
    return model.eval()


def _gpt2(tied: bool) -> torch.nn.Module:
    hf_cfg = transformers.GPT2Config(vocab_size=CFG.d_vocab, n_positions=CFG.n_ctx,
                                     n_embd=CFG.d_model, n_layer=CFG.n_layers, n_head=CFG.n_heads,
                                     n_inner=CFG.d_mlp, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
                                     tie_word_embeddings=tied)
    hf_cfg._attn_implementation = "eager"
    gpt2 = transformers.GPT2LMHeadModel(hf_cfg)
    _randomize(gpt2, 1)
    return gpt2.eval()


# ------------------------------------------------------------------ GPT-2 equivalence
@pytest.mark.parametrize("tied", [True, False])
def test_from_gpt2_matches_gpt2(tied):
    gpt2 = _gpt2(tied)
    model = tm.HookedDecoder.from_hf(gpt2)
    assert model.cfg.layer_norm_eps == gpt2.config.layer_norm_epsilon
    tokens = _tokens()
    with torch.no_grad():
        expected = gpt2(tokens).logits
        torch.testing.assert_close(model(tokens), expected, rtol=1e-5, atol=1e-5)
        with model.unfused():
            torch.testing.assert_close(model(tokens), expected, rtol=1e-5, atol=1e-5)
    back = model.to_hf()
    for k, v in gpt2.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert (back.lm_head.weight is back.transformer.wte.weight) == tied


def test_to_gpt2_matches_model_and_round_trips():
    model = _model()
    gpt2 = model.to_hf()
    assert not gpt2.config.tie_word_embeddings  # the randomized W_U differs from W_E.T
    tokens = _tokens(1)
    with torch.no_grad():
        torch.testing.assert_close(gpt2(tokens).logits, model(tokens), rtol=1e-5, atol=1e-5)
    again = tm.HookedDecoder.from_hf(gpt2)
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k


def test_fresh_model_is_tied_and_bias_is_refused():
    model = tm.HookedDecoder(CFG, seed=0)
    assert torch.equal(model.W_U, model.W_E.T) and model.to_hf().config.tie_word_embeddings
    with torch.no_grad():
        model.unembed.b_U.fill_(0.1)
    with pytest.raises(ValueError, match="b_U"):
        model.to_hf()


def test_decoder_and_gpt2_mapping_form_no_import_cycle():
    # The decoder imports the mapping (for from_hf / to_hf); the mapping must not import the
    # decoder back, not even under TYPE_CHECKING or inside a function.
    from tfmatcomp.models.conversion import gpt2_mapping

    imported = set()
    for node in ast.walk(ast.parse(Path(gpt2_mapping.__file__).read_text())):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert "tfmatcomp.models.decoder" not in imported and "tfmatcomp" not in imported
    assert gpt2_mapping.build_from_gpt2 is tm.models.decoder.build_from_gpt2


def test_loss_is_next_token_cross_entropy():
    model, tokens = _model(), _tokens(2)
    with torch.no_grad():
        logits, loss = model(tokens, return_type="both")
        gpt2_loss = model.to_hf()(tokens, labels=tokens).loss
    torch.testing.assert_close(loss, next_token_loss(logits, tokens))
    torch.testing.assert_close(loss, gpt2_loss, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ hooks
def _expected_shapes() -> dict[str, tuple[int, ...]]:
    d, h, e, m = CFG.d_model, CFG.n_heads, CFG.d_head, CFG.d_mlp
    shapes = {"hook_embed": (B, P, d), "hook_pos_embed": (B, P, d)}
    for l in range(CFG.n_layers):
        blk = f"blocks.{l}."
        shapes.update({blk + n: (B, P, d) for n in (
            "hook_resid_pre", "ln1.hook_normalized", "hook_attn_out", "hook_resid_mid",
            "ln2.hook_normalized", "hook_mlp_out", "hook_resid_post")})
        shapes.update({blk + n: (B, P, 1) for n in ("ln1.hook_scale", "ln2.hook_scale")})
        shapes.update({blk + f"attn.hook_{x}": (B, P, h, e) for x in "qkvz"})
        shapes.update({blk + "attn.hook_attn_scores": (B, h, P, P),
                       blk + "attn.hook_pattern": (B, h, P, P),
                       blk + "mlp.hook_pre": (B, P, m), blk + "mlp.hook_post": (B, P, m)})
    shapes.update({"ln_final.hook_scale": (B, P, 1), "ln_final.hook_normalized": (B, P, d)})
    return shapes


def test_every_hook_and_its_shape():
    model = _model()
    expected = _expected_shapes()
    results = {f"blocks.{l}.attn.hook_result" for l in range(CFG.n_layers)}  # use_attn_result only
    assert set(model.hook_dict) == set(expected) | results
    logits, cache = model.run_with_cache(_tokens())
    assert isinstance(cache, ActivationCache)
    assert {k: tuple(v.shape) for k, v in cache.items()} == expected
    assert logits.shape == (B, P, CFG.d_vocab)


def test_cache_describes_the_forward_pass():
    """Residual arithmetic, the pre-affine LayerNorm value (TransformerLens's ``hook_normalized``)
    and the logits, all recomputed from the cache."""
    model = _model()
    tokens = _tokens()
    logits, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"],
                               cache["hook_embed"] + cache["hook_pos_embed"])
    for l, block in enumerate(model.blocks):
        c = lambda n: cache[f"blocks.{l}.{n}"]  # noqa: E731
        torch.testing.assert_close(c("hook_resid_mid"), c("hook_resid_pre") + c("hook_attn_out"))
        torch.testing.assert_close(c("hook_resid_post"), c("hook_resid_mid") + c("hook_mlp_out"))
        for ln, x in (("ln1", c("hook_resid_pre")), ("ln2", c("hook_resid_mid"))):
            centred = x - x.mean(-1, keepdim=True)
            torch.testing.assert_close(c(f"{ln}.hook_normalized"), centred / c(f"{ln}.hook_scale"))
        torch.testing.assert_close(c("mlp.hook_post"), torch.nn.functional.gelu(
            c("mlp.hook_pre"), approximate="tanh"))
    x = cache[f"blocks.{CFG.n_layers - 1}.hook_resid_post"]
    normalized = cache["ln_final.hook_normalized"]
    torch.testing.assert_close(normalized, (x - x.mean(-1, keepdim=True)) / cache["ln_final.hook_scale"])
    torch.testing.assert_close(logits, (normalized * model.ln_final.w + model.ln_final.b)
                               @ model.W_U + model.b_U, rtol=1e-5, atol=1e-5)


def test_run_with_hooks_and_unknown_names():
    model = _model()
    tokens = _tokens()
    seen = []
    out = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre",
                                                    lambda x, hook: seen.append(x.shape))])
    assert seen == [(B, P, CFG.d_model)] and out.shape == (B, P, CFG.d_vocab)
    assert model.active_hook_count() == 0
    with pytest.raises(tm.UnknownHookError, match="did you mean"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_pr", lambda x, hook: x)])


# ------------------------------------------------------------------ causal masking
def _assert_causal(run):
    """Changing the tokens after position t changes no output at positions <= t."""
    tokens = _tokens(3)
    for t in (0, 4, P - 2):
        other = tokens.clone()
        other[:, t + 1:] = (other[:, t + 1:] + 1) % CFG.d_vocab
        a, b = run(tokens), run(other)
        torch.testing.assert_close(a[:, :t + 1], b[:, :t + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_causal_masking_fused_and_with_hooks():
    model = _model()
    with torch.no_grad():
        _assert_causal(model)
        _assert_causal(lambda t: model.run_with_cache(t)[0])
        _assert_causal(lambda t: model.run_with_hooks(
            t, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: p)]))
    _, cache = model.run_with_cache(_tokens())
    future = torch.ones(P, P, dtype=torch.bool).triu(1)
    for l in range(CFG.n_layers):
        scores = cache[f"blocks.{l}.attn.hook_attn_scores"]
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]
        assert torch.isneginf(scores[..., future]).all() and torch.isfinite(scores[..., ~future]).all()
        assert (pattern[..., future] == 0).all()
        torch.testing.assert_close(pattern.sum(-1), torch.ones(B, CFG.n_heads, P))


# ------------------------------------------------------------------ edits
def test_pattern_edit_takes_effect():
    model = _model()
    tokens = _tokens()
    clean, clean_cache = model.run_with_cache(tokens)
    causal_uniform = torch.ones(P, P).tril()
    causal_uniform = causal_uniform / causal_uniform.sum(-1, keepdim=True)

    def uniform(pattern, hook):
        return causal_uniform.expand_as(pattern).clone()

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", uniform)]):
        edited, cache = model.run_with_cache(tokens)
    assert not torch.allclose(edited, clean)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"],
                               causal_uniform.expand(B, CFG.n_heads, P, P))
    v = cache["blocks.0.attn.hook_v"]  # unchanged upstream of the edit
    torch.testing.assert_close(v, clean_cache["blocks.0.attn.hook_v"])
    expected_z = torch.einsum("qk,bkhe->bqhe", causal_uniform, v)
    torch.testing.assert_close(cache["blocks.0.attn.hook_z"], expected_z)
    assert model.active_hook_count() == 0
    with model.unfused():  # the edit is gone: the clean run again, bit for bit
        assert torch.equal(model(tokens), clean)


# ------------------------------------------------------------------ checks and checkpoints
def test_bad_input_is_named():
    model = _model()
    with pytest.raises(ValueError, match="tokens: sequence length 11 exceeds n_ctx 10"):
        model(torch.zeros(1, 11, dtype=torch.long))
    with pytest.raises(ValueError, match=r"tokens: token ids must lie in \[0, 22\]"):
        model(torch.full((1, 3), 23))
    with pytest.raises(ValueError, match="return_type"):
        model(_tokens(), return_type="predictions")
    with pytest.raises(TypeError, match="cfg: expected a DecoderConfig"):
        tm.HookedDecoder(tm.EncoderConfig())
    with pytest.raises(ValueError, match="act_fn"):
        tm.DecoderConfig(act_fn="swish")


def test_checkpoint_round_trip(tmp_path):
    model = _model(5)
    path = tm.save_checkpoint(model, tmp_path / "ckpt", step=7)
    assert json.loads((path / "config.json").read_text())["kind"] == "decoder"
    loaded = tm.load_checkpoint(path, config=CFG)
    assert isinstance(loaded, tm.HookedDecoder) and loaded.cfg == CFG
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    with pytest.raises(tm.ConfigMismatchError):
        tm.load_checkpoint(path, config=tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16,
                                                         d_mlp=40, n_ctx=10, d_vocab=23))


def test_encoder_checkpoints_without_kind_still_load(tmp_path):
    encoder = tm.HookedEncoder(tm.get_preset("tiny").model)
    path = tm.save_checkpoint(encoder, tmp_path / "enc")
    config = json.loads((path / "config.json").read_text())
    assert config.pop("kind") == "encoder"
    (path / "config.json").write_text(json.dumps(seal_config(config)))  # as written before decoders existed
    assert isinstance(tm.load_checkpoint(path), tm.HookedEncoder)
    config["kind"] = "transformer"
    (path / "config.json").write_text(json.dumps(seal_config(config)))
    with pytest.raises(tm.CheckpointError, match="kind 'transformer'"):
        tm.load_checkpoint(path)


# ------------------------------------------------------------------ matrices <-> tokens <-> text
GPT_CFG = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=33)  # d_vocab 2003


def test_to_tokens_is_the_gpt_sequence():
    from tfmatcomp.task.gpt import decode_sequence, encode_sequence

    model = tm.HookedDecoder(GPT_CFG)
    batch = tm.MatrixCompletionTask(4, rank=1).sample(3, generator=torch.Generator().manual_seed(0))
    values = batch.values.reshape(3, 4, 4)
    tokens = model.to_tokens(values, observed=batch.observed.reshape(3, 4, 4))
    assert torch.equal(tokens, encode_sequence(batch))
    back = decode_sequence(tokens, 4)
    assert torch.equal(back.observed, batch.observed) and torch.equal(back.values, batch.values)
    one = model.to_tokens(values[1])  # one matrix, everything observed
    assert one.shape == (1, 33) and int(one[0, 16]) == 2002 and torch.equal(one[0, :16], one[0, 17:])
    assert model(tokens).shape == (3, 33, 2003)  # the model reads them


def test_to_string_prints_the_sequence_and_to_single_token_reads_it_back():
    model = tm.HookedDecoder(GPT_CFG)
    x = torch.tensor([[[0.5, -0.25], [0.0, 10.0]], [[-10.0, 1.0], [2.5, 0.01]]])
    observed = torch.tensor([[[1, 1], [0, 1]], [[1, 0], [0, 1]]]).bool()
    tokens = model.to_tokens(x, observed)
    texts = model.to_string(tokens)
    assert texts[0] == " 0.50 -0.25\n    ? 10.00\n[SEP]\n 0.50 -0.25\n 0.00 10.00"
    assert texts[1].splitlines()[:2] == ["-10.00      ?", "     ?   0.01"]
    assert model.to_string(tokens[0]) == texts[0]  # one sequence: one string
    for text, row in zip(texts, tokens):
        cells = [c for line in text.splitlines() for c in line.split()]
        assert [model.to_single_token(c) for c in cells] == row.tolist()
    partial = model.to_string(tokens[0, :7])  # a greedy completion under way: a partial row
    assert partial.splitlines()[2:] == ["[SEP]", " 0.50 -0.25"]
    assert model.to_string(tokens[0, :4], n_cols=4) == " 0.50 -0.25     ? 10.00"  # no [SEP]


def test_tokenizer_methods_refuse_bad_input():
    model = tm.HookedDecoder(GPT_CFG)
    x = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="matrices: expected"):
        model.to_tokens(torch.zeros(2))
    with pytest.raises(ValueError, match="observed: expected a bool tensor of shape"):
        model.to_tokens(x, observed=torch.ones(2, 2))
    with pytest.raises(ValueError, match="needs a sequence of 51 tokens.*n_ctx 33"):
        model.to_tokens(torch.zeros(5, 5))
    with pytest.raises(ValueError, match=r"values: must lie in \[-10.0, 10.0\]"):
        model.to_tokens(torch.full((2, 2), 11.0))
    with pytest.raises(ValueError, match="n_cols: the 3 tokens before"):
        model.to_string(torch.tensor([1, 2, 3, 2002]))
    with pytest.raises(ValueError, match="n_cols"):
        model.to_string(torch.tensor([1, 2, 3, 4]), n_cols=3)
    with pytest.raises(ValueError, match="token ids must lie in"):
        model.to_string(torch.tensor([1, 2003]))
    for bad in ("0.444", "abc", "10.01", "nan", "", " ?"):
        with pytest.raises(ValueError, match="string: .* is not one token"):
            model.to_single_token(bad)
    small = tm.HookedDecoder(CFG)  # d_vocab 23: not the matrix vocabulary
    for call in (lambda: small.to_tokens(x), lambda: small.to_string(torch.tensor([1, 2])),
                 lambda: small.to_single_token("0.44")):
        with pytest.raises(ValueError, match="d_vocab is 23.*d_vocab 2003"):
            call()
