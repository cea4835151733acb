"""The papers' toolkit on text: masking, the masked-LM metric, ablations, permutation, patching,
probes and the decomposition on a (random) masked-LM encoder with a real tokenizer."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

from tfmatcomp import HookedEncoder
from tfmatcomp.analyses.text_probes import decomposition_text, probe_text, text_hidden_states
from tfmatcomp.experiments.masked_lm import (IGNORE, attention_ablation_text, evaluate,
                                             head_scan_text, mask_text, masked_lm_metrics,
                                             patch_texts, positional_permutation_text,
                                             uniform_attention_hooks)
from tfmatcomp.interventions import UniformAttentionAblation

WORDS = ("[PAD] [UNK] [CLS] [SEP] [MASK] the cat dog sat on mat a big small ran fast slow red "
         "blue and").split()
TEXTS = ["the cat sat on the mat", "a big dog ran fast", "the small red cat ran and sat",
         "a blue mat", "the dog and the cat sat on a big red mat", "a cat ran"]


@pytest.fixture(scope="module")
def model():
    hf = BertForMaskedLM(BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64,
                                    max_position_embeddings=24, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "LayerNorm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)})
    return HookedEncoder.from_pretrained(hf, tokenizer=tokenizer)


def test_mask_text_hides_real_tokens_only_and_is_seeded(model):
    batch = mask_text(model, TEXTS, fraction=0.2, seed=3)
    special = torch.tensor(model.tokenizer.all_special_ids)
    assert (batch.masked.sum(1) >= 1).all()
    assert not (batch.masked & (batch.attention_mask == 0)).any()
    assert (batch.tokens[batch.masked] == model.tokenizer.mask_token_id).all()
    assert not torch.isin(batch.labels[batch.masked], special).any()
    assert (batch.labels[batch.attention_mask == 0] == IGNORE).all()
    again = mask_text(model, TEXTS, fraction=0.2, seed=3)
    assert torch.equal(again.tokens, batch.tokens)
    assert not torch.equal(mask_text(model, TEXTS, fraction=0.2, seed=4).masked, batch.masked)
    with pytest.raises(ValueError, match="fraction"):
        mask_text(model, TEXTS, fraction=0.0)


def test_masked_lm_metrics_are_cross_entropy_and_accuracy(model):
    batch = mask_text(model, TEXTS, fraction=0.3, seed=0)
    logits = torch.randn(*batch.tokens.shape, len(WORDS), generator=torch.Generator().manual_seed(1))
    m = masked_lm_metrics(logits, batch)
    sel = batch.masked
    assert m["L_mask"] == pytest.approx(F.cross_entropy(logits[sel], batch.labels[sel]).item())
    assert m["acc_mask"] == pytest.approx((logits[sel].argmax(-1) == batch.labels[sel]).float().mean().item())
    obs = (batch.labels != IGNORE) & ~sel
    assert m["L_obs"] == pytest.approx(F.cross_entropy(logits[obs], batch.labels[obs]).item())


def test_uniform_hooks_equal_the_papers_ablation_without_padding(model):
    batch = mask_text(model, ["the cat sat on a mat"] * 3, seed=0)
    heads = [(0, 1), (1, 2)]
    with torch.no_grad(), model.hooks(fwd_hooks=uniform_attention_hooks(model, heads)):
        ours = model(batch.tokens)
    theirs = UniformAttentionAblation(heads).run(model, batch.tokens)
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_uniform_hooks_spread_over_real_tokens_only(model):
    batch = mask_text(model, TEXTS, seed=0)
    hooks = uniform_attention_hooks(model, [(1, 3)], batch.attention_mask)
    with model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(batch.tokens, **batch.model_kwargs())
    pattern = cache["blocks.1.attn.hook_pattern"][:, 3]                  # [batch, query, key]
    n_real = batch.attention_mask.sum(1)
    expected = batch.attention_mask[:, None, :] / n_real[:, None, None]
    assert torch.allclose(pattern, expected.expand_as(pattern).float())
    assert not torch.equal(cache["blocks.1.attn.hook_pattern"][:, 2], pattern)   # others kept


def test_ablation_scan_and_permutation_tables(model):
    batch = mask_text(model, TEXTS, seed=0)
    clean = evaluate(model, batch)
    table = attention_ablation_text(model, batch)
    assert table["ablated"].tolist() == ["none", "all", "layer 0", "layer 1"]
    assert table["L_mask"].iloc[0] == pytest.approx(clean["L_mask"])
    assert table["dL_mask"].iloc[0] == 0 and (table["dL_mask"].iloc[1:] != 0).all()
    scan = head_scan_text(model, batch)
    assert len(scan) == 8 and set(scan.columns) >= {"layer", "head", "dL_mask", "acc_mask"}
    perm = positional_permutation_text(model, batch, seeds=(0, 1))
    assert len(perm) == 3 and perm["L_mask"].iloc[0] == pytest.approx(clean["L_mask"])
    assert (perm["L_mask"].iloc[1:] != perm["L_mask"].iloc[0]).all()


def test_patching_between_texts(model):
    same = patch_texts(model, "the [MASK] sat on the mat", "the [MASK] sat on the mat", "cat")
    tokens, types, attn = model.to_tokens("the [MASK] sat on the mat")
    with torch.no_grad():
        clean = model(tokens, types, attn)[0, 2].log_softmax(-1)[WORDS.index("cat")]
    assert same.shape == (2, tokens.shape[1])
    assert torch.allclose(same, clean.expand_as(same), atol=1e-5)
    other = patch_texts(model, "the [MASK] sat on the mat", "a dog ran fast on a mat", "cat")
    assert other.shape == (2, 9)                      # padded to the longer text
    assert (other[:, :8] - clean).abs().max() > 1e-3  # a different text moves the prediction
    assert torch.allclose(other[:, 8], clean.expand(2), atol=1e-5)  # a padded key: no effect
    with pytest.raises(ValueError, match="one MASK"):
        patch_texts(model, "the cat sat", "a dog ran", "cat")


def test_probes_and_decomposition_on_text(model):
    batch = mask_text(model, TEXTS * 4, fraction=0.3, seed=0)
    states = text_hidden_states(model, batch)
    assert len(states) == 3 and states[0].dtype == torch.float64
    probes = probe_text(model, batch)
    assert probes["layer"].tolist() == [0, 1, 2]
    assert probes["r2_position"].iloc[0] > 0.5            # random W_pos: position is readable
    assert probes["r2_hidden_token"].notna().all()
    dec = decomposition_text(model, batch)
    assert dec["layer"].tolist() == [0, 1, 2] and (dec["relative_norm"] > 0).all()
