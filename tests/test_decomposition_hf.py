"""Decomposition on a transformers BERT: the same summary table through our HookedEncoder (from_hf)
and through the HuggingFace model itself, and the docs' local-directory recipe (save_pretrained ->
from_pretrained, safetensors, offline, BertTokenizer from a local vocab file, text from a file)."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.decomposition import accumulate, decompose, hf_bert_modules, residual_stream_names
from tfmatcomp.geometry import SUMMARY_COLUMNS, model_summary_table, summary_table

transformers = pytest.importorskip("transformers")

NUMERIC = [c for c in SUMMARY_COLUMNS if c not in ("name", "rank_note")]


def _tiny_bert(vocab_size=2002, n_ctx=16, seed=0):
    cfg = transformers.BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=n_ctx, type_vocab_size=1, pad_token_id=0,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager")
    with torch.random.fork_rng(devices=[]):  # transformers' init reads the global RNG: isolate it
        torch.manual_seed(seed)
        return transformers.BertModel(cfg, add_pooling_layer=False).eval()


@pytest.mark.skipif(importlib.util.find_spec("tfmatcomp.models.conversion.bert") is None,
                    reason="tfmatcomp.models.conversion.bert (HookedEncoder.from_hf) does not exist yet")
def test_same_table_for_hooked_encoder_and_transformers_bert(task4):
    bert = _tiny_bert()
    model = tm.HookedEncoder.from_hf(bert).eval()
    g = torch.Generator().manual_seed(0)
    batches = [task4.sample(24, generator=g) for _ in range(3)]
    labels = torch.arange(72) % 3
    ours = model_summary_table(model, batches, labels=labels, progress=False)
    theirs = model_summary_table(bert, batches, labels=labels, modules=hf_bert_modules(bert),
                                 progress=False)
    with torch.no_grad():
        hidden = bert(torch.cat([b.tokens for b in batches]), output_hidden_states=True).hidden_states
    plain = summary_table(list(hidden), labels)  # a plain list of per-layer tensors
    assert len(ours) == 3 and list(ours["name"]) == residual_stream_names(model)
    assert not ours[NUMERIC].isna().any().any()
    for other in (theirs, plain):
        assert list(other["rank_estimate"]) == list(ours["rank_estimate"])
        pd.testing.assert_frame_equal(ours[NUMERIC], other[NUMERIC], rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("tfmatcomp.models.conversion.bert") is None,
                    reason="tfmatcomp.models.conversion.bert (HookedEncoder.from_hf) does not exist yet")
def test_local_directory_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    lines = ["the cat sat on the mat", "a dog ran in the park today",
             "the sun is hot", "we read a book on the mat in the park", "cats and dogs"]
    text_file = tmp_path / "corpus.txt"
    text_file.write_text("\n".join(lines) + "\n")
    words = sorted({w for line in lines for w in line.split()})
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")

    original = _tiny_bert(vocab_size=5 + len(words), n_ctx=32, seed=1)
    model_dir = tmp_path / "bert"
    original.save_pretrained(model_dir, safe_serialization=True)
    assert (model_dir / "config.json").exists() and (model_dir / "model.safetensors").exists()

    # --- the recipe in docs/decomposition.md ---
    bert = transformers.BertModel.from_pretrained(model_dir, local_files_only=True).eval()
    # the vocab file is passed positionally: recent transformers ignore the vocab_file= keyword
    tokenizer = transformers.BertTokenizer(str(vocab_file))
    texts = [l for l in text_file.read_text().splitlines() if l.strip()]
    batches = [tokenizer(texts[i:i + 2], padding=True, truncation=True, max_length=32,
                         return_tensors="pt") for i in range(0, len(texts), 2)]
    assert all(int((b["input_ids"] == tokenizer.unk_token_id).sum()) == 0 for b in batches)
    acc = accumulate(bert, batches, modules=hf_bert_modules(bert), drop_first=1, progress=False)
    table = summary_table(acc)
    # ---
    assert len(table) == 3 and (table["n_contexts"] == len(texts)).all()

    # reference: the in-memory model's hidden states on the same padded batches, decomposed at once
    T = max(b["input_ids"].shape[1] for b in batches)
    pad = lambda x: torch.nn.functional.pad(x, (0, T - x.shape[1]))
    ids = torch.cat([pad(b["input_ids"]) for b in batches])
    mask = torch.cat([pad(b["attention_mask"]) for b in batches])
    assert int(mask[:, 0].min()) == 1 and ids[0, 0] == tokenizer.cls_token_id
    with torch.no_grad():
        hidden = original(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for i, name in enumerate(acc.names):
        ref = decompose(hidden[i], mask, drop_first=1)
        got = acc.result(name)
        assert torch.allclose(got.pos, ref.pos, atol=1e-5) and torch.allclose(got.ctx, ref.ctx, atol=1e-5)
        assert torch.equal(got.pos_counts, ref.pos_counts)

    # and the same statistics through our HookedEncoder built from the reloaded weights
    ours = tm.HookedEncoder.from_hf(bert).eval()
    acc2 = accumulate(ours, batches, drop_first=1, progress=False)
    for hf_name, our_name in zip(acc.names, acc2.names):
        assert torch.allclose(acc.result(hf_name).pos, acc2.result(our_name).pos, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("tfmatcomp.models.conversion.bert") is None,
                    reason="tfmatcomp.models.conversion.bert (HookedEncoder.from_hf) does not exist yet")
def test_transformer_bridge_streams_the_same_statistics(tmp_path, monkeypatch, task4):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bridge_mod = pytest.importorskip("transformer_lens.model_bridge")
    cfg = _tiny_bert().config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        hf = transformers.BertForMaskedLM(cfg).eval()
    ours = tm.HookedEncoder.from_hf(hf).eval()  # before booting: the bridge wraps hf's modules
    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(1997)]) + "\n")
    tokenizer = transformers.BertTokenizer(str(tmp_path / "vocab.txt"))
    hf.save_pretrained(tmp_path)
    bridge = bridge_mod.TransformerBridge.boot_transformers(str(tmp_path), hf_model=hf,
                                                            tokenizer=tokenizer, device="cpu")
    names = residual_stream_names(bridge)
    assert names == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"]
    g = torch.Generator().manual_seed(0)
    batches = [task4.sample(16, generator=g).tokens for _ in range(2)]
    via_bridge = accumulate(bridge, batches, names, progress=False)
    via_ours = accumulate(ours, batches, progress=False)
    for a, b in zip(via_bridge.names, via_ours.names):
        ra, rb = via_bridge.result(a), via_ours.result(b)
        assert torch.allclose(ra.pos, rb.pos, atol=1e-5) and torch.allclose(ra.ctx, rb.ctx, atol=1e-5)
