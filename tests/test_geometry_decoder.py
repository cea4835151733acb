"""The geometry command on HookedDecoders: the QK split at the pre-LN block's LayerNorm output, the
a GPT-2 read through HookedDecoder.from_hf measuring what transformers computes, and the CLI end to end on a saved HookedDecoder checkpoint."""

from __future__ import annotations

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.task.corpus import Document
from tfmatcomp.training.lm import CharTokenizer, train_lm, text_sampler, encode_documents
from tfmatcomp.geometry.models import DecoderGeometry, load_geometry_model

TEXTS = {"one": "the cat sat on the mat and the dog sat on the log " * 8,
         "two": "a bird flew over a tree while a fish swam under a boat " * 8,
         "three": "big red trucks drive past small blue houses every day " * 8}


def _random_decoder(seed: int = 0, d_vocab: int = 30, n_ctx: int = 16) -> tm.HookedDecoder:
    """A small decoder with every weight random, LayerNorm scales and shifts included (the QK site
    is after them, so unit scales and zero shifts could hide a wrong site)."""
    model = tm.HookedDecoder(tm.DecoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32,
                                              n_ctx=n_ctx, d_vocab=d_vocab), seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.ndim < 2 else 0.3))
    return model.eval()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("decoder-corpus")
    for name, text in TEXTS.items():
        (d / f"{name}.txt").write_text(text)
    return d


def test_decoder_qk_components_sum_to_scores_at_the_ln1_output():
    model = _random_decoder()
    gm = DecoderGeometry(model)
    tokens = torch.randint(0, 30, (12, 16), generator=torch.Generator().manual_seed(1))
    acc = gm.accumulate([tokens], drop_first=1, progress=False, total=1)
    _, cache = model.run_with_cache(tokens)
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    for layer in range(2):
        dec = acc.result(f"blocks.{layer}.ln1")
        # the site: ln1's output with its scale and shift, not TransformerLens's hook_normalized
        ln_out = cache[f"blocks.{layer}.ln1.hook_normalized"] * model.blocks[layer].ln1.w \
            + model.blocks[layer].ln1.b
        assert torch.allclose(dec.mu, ln_out[:, 1:].double().mean((0, 1)), atol=1e-5)
        assert not torch.allclose(dec.mu, cache[f"blocks.{layer}.ln1.hook_normalized"][:, 1:]
                                  .double().mean((0, 1)), atol=1e-2)
        qk = gm.qk(tokens[:3], layer, dec)
        total = qk.total()
        assert torch.allclose(total[..., causal], qk.scores[..., causal], atol=1e-5)
        assert torch.allclose(total.softmax(-1).float(),
                              cache[f"blocks.{layer}.attn.hook_pattern"][:3], atol=1e-5)
        # every component carries something: the split is not all on one side
        assert all(float(getattr(qk, c).abs().max()) > 1e-3 for c in
                   ("pos_pos", "pos_cvec", "cvec_pos", "cvec_cvec"))
    stream = [acc.result(k).mu for k in gm.stream_keys]
    assert torch.allclose(stream[1], cache["blocks.1.hook_resid_pre"][:, 1:].double().mean((0, 1)),
                          atol=1e-5)


def test_gpt2_read_through_from_hf_measures_what_transformers_computes(tmp_path):
    """A GPT-2 directory is converted with HookedDecoder.from_hf; its stream, attention inputs and
    QK components equal those computed here from transformers' own module: its hidden_states, the
    outputs of h[l].ln_1 and the query / key columns of c_attn (the reading the geometry command
    had before it used the conversion)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tfmatcomp.decomposition import decompose
    from tfmatcomp.geometry.qk import full_pos, qk_components

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=30, n_embd=16, n_layer=2, n_head=2, n_positions=16,
                                      bos_token_id=None, eos_token_id=None))
    with torch.no_grad():  # random LayerNorms too
        for name, p in gpt2.named_parameters():
            if "ln" in name:
                p.copy_(torch.randn(p.shape) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    gpt2.save_pretrained(tmp_path / "gpt2")
    from tests.test_geometry_command import _tokenizer

    _tokenizer("gpt2").save_pretrained(tmp_path / "gpt2")
    gm, _ = load_geometry_model(tmp_path / "gpt2")
    assert isinstance(gm, DecoderGeometry) and gm.family == "gpt2" and gm.causal
    tokens = torch.randint(0, 30, (10, 16), generator=torch.Generator().manual_seed(2))
    acc = gm.accumulate([tokens], drop_first=1, progress=False, total=1)

    body = gpt2.transformer.eval()
    ln_1: dict[int, torch.Tensor] = {}
    hooks = [block.ln_1.register_forward_hook(lambda m, a, o, l=l: ln_1.__setitem__(l, o))
             for l, block in enumerate(body.h)]
    try:
        with torch.no_grad():
            hidden = body(tokens, output_hidden_states=True).hidden_states
    finally:
        for h in hooks:
            h.remove()
    theirs = list(hidden) + [ln_1[l] for l in range(len(body.h))]
    for key, act in zip(gm.stream_keys + gm.attention_input_keys, theirs):
        ours, ref = acc.result(key), decompose(act, drop_first=1)
        assert torch.allclose(ours.mu, ref.mu, atol=1e-4) and torch.allclose(ours.pos, ref.pos, atol=1e-4)

    layer, d, H = 1, 16, 2
    qk = gm.qk(tokens[:2], layer, acc.result(gm.attention_input_keys[layer]))
    ref = decompose(ln_1[layer], drop_first=1)
    x = ln_1[layer][:2].double()
    x_pos = (full_pos(ref, 16) + ref.mu).expand_as(x)
    W, b = body.h[layer].attn.c_attn.weight, body.h[layer].attn.c_attn.bias  # Conv1D: x W + b

    def heads(w):  # [d, d] -> [head, d, d_head]
        return w.reshape(d, H, d // H).permute(1, 0, 2)

    want = qk_components(x_pos, x - x_pos, heads(W[:, :d]), heads(W[:, d:2 * d]),
                         b[:d].reshape(H, d // H), b[d:2 * d].reshape(H, d // H))
    for c in ("pos_pos", "pos_cvec", "cvec_pos", "cvec_cvec"):
        assert torch.allclose(getattr(qk, c), getattr(want, c), atol=1e-4)


def _save_char_decoder(tmp_path, tokenizer: CharTokenizer):
    model = _random_decoder(d_vocab=tokenizer.vocab_size, n_ctx=16)
    return tm.save_checkpoint(model, tmp_path / "ckpt", step=0,
                              metadata={"tokenizer": tokenizer.to_dict(), "family": "char-gpt"})


def test_cli_geometry_on_a_saved_hooked_decoder_checkpoint(tmp_path, corpus):
    from tfmatcomp.cli import main

    tok = CharTokenizer.from_text("".join(TEXTS.values()) + "\n")
    path = _save_char_decoder(tmp_path, tok)
    out = tmp_path / "g.html"
    assert main(["geometry", str(path), str(corpus), "-o", str(out), "--contexts", "12",
                 "--positions", "16", "--second-pass", "4", "--no-progress"]) == 0
    page = out.read_text()
    assert "Table 1 per layer" in page and "char-gpt (ours)" in page and "blocks.l.ln1" in page
    assert "NanoGPT (paper)" in page  # a small decoder is shown beside the paper's NanoGPT too
    for key in ("table1", "pca", "gram", "clusters", "qk", "theory", "induction"):
        assert f'id="{key}"' in page
    # its weights file names the same checkpoint
    gm, tokenizer = load_geometry_model(path / "model.safetensors")
    assert isinstance(gm, DecoderGeometry) and tokenizer == tok
    # a checkpoint without a tokenizer is refused with a reason
    bare = tm.save_checkpoint(_random_decoder(), tmp_path / "bare", step=0)
    with pytest.raises(ValueError, match="records no tokenizer"):
        load_geometry_model(bare)
    assert main(["geometry", str(bare), str(corpus), "-o", str(out)]) == 2
    enc = tm.save_checkpoint(tm.HookedEncoder(tm.get_preset("tiny").model), tmp_path / "enc", step=0)
    with pytest.raises(ValueError, match="HookedEncoder checkpoint"):
        load_geometry_model(enc)


def test_run_geometry_reads_a_train_lm_run_directory(tmp_path):
    docs = [Document(k, v) for k, v in TEXTS.items()]
    tok = CharTokenizer.from_documents(docs)
    cfg = tm.DecoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16,
                           d_vocab=tok.vocab_size)
    run = train_lm(cfg, text_sampler(encode_documents(docs, tok), 16), tokenizer=tok, n_steps=3,
                   batch_size=4, log_every=3, out_dir=tmp_path / "run", metadata={"family": "tiny"})
    assert run.path == tmp_path / "run" / "checkpoints" / "step_0000003"
    assert list(tm.read_metrics(tmp_path / "run")["step"]) == [3]
    report = run_geometry_small(tmp_path / "run", docs, tmp_path / "g.html")
    assert report.failed == [] and len(report.summary) == 2
    with pytest.raises(ValueError, match="characters not in the tokenizer"):
        run_geometry_small(tmp_path / "run", [Document("x", "\u00e9" * 200)], tmp_path / "h.html")


def run_geometry_small(model_dir, text, out):
    from tfmatcomp.report.geometry import run_geometry

    return run_geometry(model_dir, text, out, n_contexts=9, n_positions=16, n_second=3,
                        batch_size=9, sections=["table1", "qk"], progress=False)
