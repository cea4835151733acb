"""Real masked-language encoders: HookedEncoder.from_pretrained against transformers.

BERT, RoBERTa and DistilBERT with *every* weight random (LayerNorm gains and biases included),
float32 and float64, on a right-padded batch: our logits and hidden states equal transformers'
(eager attention) at every real token. Also: loading from a directory (safetensors; pickles
refused unless trusted), unsupported architectures refused, text through the checkpoint's
tokenizer, the masked-LM head's TransformerLens 3 names, and tfmatcomp checkpoints of a masked-LM
model.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from transformers import (BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast,
                          DistilBertConfig, DistilBertForMaskedLM, GPT2Config, GPT2LMHeadModel,
                          RobertaConfig, RobertaForMaskedLM)

import tfmatcomp as tm
from tfmatcomp import HookedEncoder
from tfmatcomp.models.conversion.encoders import (ARCHITECTURES, PickledWeightsError,
                                                  UnsupportedArchitectureError)

VOCAB, D, HEADS, LAYERS, MLP, N_POS = 40, 32, 4, 2, 64, 24
BATCH, POS = 3, 12
WORDS = ("[PAD] [UNK] [CLS] [SEP] [MASK] the cat dog sat on mat a big small ran fast "
         "slow red blue").split()
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def _randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1.0 + 0.5 * noise)          # gains far from 1
            else:
                p.copy_(noise / math.sqrt(p.shape[-1]))


def make(arch: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    common = dict(vocab_size=VOCAB, max_position_embeddings=N_POS, attn_implementation="eager")
    bert_like = dict(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=MLP, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, **common)
    if arch == "bert":
        model = BertForMaskedLM(BertConfig(type_vocab_size=2, **bert_like))
    elif arch == "bert-base-model":
        model = BertModel(BertConfig(type_vocab_size=2, **bert_like), add_pooling_layer=False)
    elif arch == "roberta":
        model = RobertaForMaskedLM(RobertaConfig(type_vocab_size=1, pad_token_id=1, **bert_like))
    elif arch == "distilbert":
        model = DistilBertForMaskedLM(DistilBertConfig(dim=D, n_layers=LAYERS, n_heads=HEADS,
                                                       hidden_dim=MLP, dropout=0.0,
                                                       attention_dropout=0.0, **common))
    else:
        raise ValueError(arch)
    model = model.to(dtype).eval()
    _randomize(model, seed)
    return model


def batch(arch: str, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, VOCAB, (BATCH, POS), generator=g)
    mask = torch.ones(BATCH, POS, dtype=torch.long)
    mask[1, 8:] = 0                                   # right padding, as the tokenizers pad
    mask[2, 5:] = 0
    pad = 1 if arch == "roberta" else 0
    tokens[mask == 0] = pad
    types = (torch.randint(0, 2, (BATCH, POS), generator=g) if arch.startswith("bert")
             else torch.zeros(BATCH, POS, dtype=torch.long))
    return tokens, types, mask


def hf_outputs(hf, tokens, types, mask):
    kwargs = dict(input_ids=tokens, attention_mask=mask, output_hidden_states=True)
    if "distilbert" not in type(hf).__name__.lower():
        kwargs["token_type_ids"] = types
    with torch.no_grad():
        out = hf(**kwargs)
    return getattr(out, "logits", None), out.hidden_states


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert", "bert-base-model"])
def test_equal_to_transformers(arch, dtype):
    hf = make(arch, dtype)
    model = HookedEncoder.from_pretrained(hf, dtype=dtype)
    assert model.dtype == dtype
    assert model.cfg.head == ("none" if arch == "bert-base-model" else "masked_lm")
    tokens, types, mask = batch(arch)
    logits_hf, hidden_hf = hf_outputs(hf, tokens, types, mask)
    real = mask.bool()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, types, mask)
        hidden = model.encoder_output(tokens, types, mask)
    tol = TOL[dtype]
    # every layer's output: HF's hidden_states[l + 1] is our blocks.l.hook_normalized_resid_post
    assert torch.allclose(cache["hook_full_embed"][real], hidden_hf[0][real], atol=tol, rtol=0)
    for layer in range(LAYERS):
        ours = cache[f"blocks.{layer}.hook_normalized_resid_post"]
        assert torch.allclose(ours[real], hidden_hf[layer + 1][real], atol=tol, rtol=0), layer
    assert torch.allclose(hidden[real], hidden_hf[-1][real], atol=tol, rtol=0)
    if logits_hf is not None:
        with torch.no_grad():
            logits = model(tokens, types, mask)
        assert logits.shape == (BATCH, POS, VOCAB)
        assert torch.allclose(logits[real], logits_hf[real], atol=10 * tol, rtol=0)


def test_masked_lm_head_has_transformer_lens_3_names():
    model = HookedEncoder.from_pretrained(make("bert"))
    names = dict(model.named_parameters())
    assert {"mlm_head.W", "mlm_head.b", "mlm_head.ln.w", "mlm_head.ln.b", "unembed.W_U",
            "unembed.b_U"} <= set(names)
    assert "readout.W" not in names and "hook_readout" not in model.hook_dict
    assert {"mlm_head.ln.hook_scale", "mlm_head.ln.hook_normalized"} <= set(model.hook_dict)
    assert model.W_U.shape == (D, VOCAB)
    # tied as in the checkpoint: the unembedding is the word embedding, transposed
    assert torch.equal(model.W_U, model.W_E.T)


def test_return_types_follow_the_head():
    model = HookedEncoder.from_pretrained(make("bert"))
    tokens = batch("bert")[0]
    assert model(tokens, return_type="hidden").shape == (BATCH, POS, D)
    assert model(tokens, return_type=None) is None
    with pytest.raises(ValueError, match="return_type: must be one of .*head 'masked_lm'"):
        model(tokens, return_type="loss")
    bare = HookedEncoder.from_pretrained(make("bert-base-model"))
    assert bare(tokens).shape == (BATCH, POS, D)
    with pytest.raises(ValueError, match="head 'none'"):
        bare(tokens, return_type="logits")


def test_roberta_positions_start_after_padding_row():
    hf = make("roberta")
    model = HookedEncoder.from_pretrained(hf)
    offset = hf.config.pad_token_id + 1
    assert model.cfg.n_ctx == N_POS - offset
    assert torch.equal(model.W_pos, hf.roberta.embeddings.position_embeddings.weight[offset:])
    assert model.cfg.n_token_types == 1            # RoBERTa's one type: only zeros accepted
    with pytest.raises(ValueError, match="token_type_ids: must lie in"):
        model(batch("roberta")[0], torch.ones(BATCH, POS, dtype=torch.long))


def test_distilbert_has_no_token_types():
    model = HookedEncoder.from_pretrained(make("distilbert"))
    assert model.cfg.n_token_types == 0 and model.embed.W_token_type is None


def test_unsupported_architecture_refused_in_one_line():
    gpt = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10, n_positions=8))
    with pytest.raises(UnsupportedArchitectureError) as info:
        HookedEncoder.from_pretrained(gpt)
    text = str(info.value)
    assert "\n" not in text and "'gpt2'" in text
    for arch in ARCHITECTURES.values():
        for cls_name in arch.classes.values():
            assert cls_name in text


def tokenizer() -> BertTokenizerFast:
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)})


def test_directory_loads_through_transformers_with_its_tokenizer(tmp_path):
    hf = make("bert")
    hf.save_pretrained(tmp_path)
    tokenizer().save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    model = HookedEncoder.from_pretrained(tmp_path)
    assert model.cfg.head == "masked_lm"
    tokens, types, mask = model.to_tokens(["the cat sat on the mat", "a big [MASK] ran"])
    assert tokens.shape == types.shape == mask.shape == (2, 8)
    assert mask[1].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert model.to_str_tokens("a big [MASK] ran") == ["[CLS]", "a", "big", "[MASK]", "ran", "[SEP]"]
    assert model.to_string(tokens[1, :6]) == "[CLS] a big [MASK] ran [SEP]"
    assert model.cfg.mask_token_id == 4
    logits_hf, _ = hf_outputs(hf, tokens, types, mask)
    with torch.no_grad():
        logits = model(["the cat sat on the mat", "a big [MASK] ran"])
    real = mask.bool()
    assert torch.allclose(logits[real], logits_hf[real], atol=2e-4, rtol=0)
    predicted = model("a big [MASK] ran", return_type="predictions")
    top = logits[1, 3].argmax().item()                # the MASK of the second text
    assert predicted == [model.tokenizer.decode([top])]
    # head "none" from a masked-LM checkpoint: the encoder alone
    assert HookedEncoder.from_pretrained(tmp_path, head="none").cfg.head == "none"


def test_pickled_only_directory_refused_unless_trusted(tmp_path):
    hf = make("distilbert")
    hf.config.save_pretrained(tmp_path)              # the weights as an old checkpoint has them
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(PickledWeightsError, match="trust_pickle=True"):
        HookedEncoder.from_pretrained(tmp_path)
    model = HookedEncoder.from_pretrained(tmp_path, trust_pickle=True, tokenizer=None)
    assert torch.equal(model.W_E, hf.distilbert.embeddings.word_embeddings.weight)


def test_masked_lm_head_asked_of_a_bare_checkpoint_refused(tmp_path):
    make("bert-base-model").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="head='none'"):
        HookedEncoder.from_pretrained(tmp_path, head="masked_lm", tokenizer=None)
    assert HookedEncoder.from_pretrained(tmp_path, tokenizer=None).cfg.head == "none"


def test_text_without_tokenizer_refused():
    model = HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=8,
                                           d_vocab=30, head="masked_lm"))
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        model("the cat")


@pytest.mark.parametrize("head", ["regression", "masked_lm", "none"])
def test_every_head_saves_and_loads_as_a_tfmatcomp_checkpoint(tmp_path, head):
    cfg = tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=6, d_vocab=20,
                           head=head)
    model = HookedEncoder(cfg, seed=3)
    tm.save_checkpoint(model, tmp_path / "c")
    assert json.loads((tmp_path / "c" / "config.json").read_text())["model"]["head"] == head
    loaded = tm.load_checkpoint(tmp_path / "c")
    assert loaded.cfg == cfg
    tokens = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(tokens), loaded(tokens))


def test_head_is_checked():
    with pytest.raises(ValueError, match="head: must be one of"):
        tm.EncoderConfig(head="classifier")
    with pytest.raises(ValueError, match="head: must be"):
        HookedEncoder.from_pretrained(make("bert"), head="regression")


def test_benchmark_script_runs_small():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "encoder_forward.py"), "--small",
                          "--repeats", "1", "--pos", "16"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1",
                                           "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| ours, run_with_cache |" in out.stdout
    assert "| transformers, forward |" in out.stdout


def test_trainer_refuses_a_masked_lm_head():
    cfg = tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=16, head="masked_lm")
    with pytest.raises(ValueError, match="model_cfg: head 'masked_lm' cannot be trained"):
        tm.Trainer("tiny", model_cfg=cfg)
