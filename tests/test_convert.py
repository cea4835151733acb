import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertModel

from tfmatcomp import EncoderConfig, HookedEncoder


def random_bert(n_token_types=1, pad=0, seed=0):
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=2002, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=16, type_vocab_size=n_token_types,
                     pad_token_id=pad, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     attn_implementation="eager")
    bert = BertModel(cfg, add_pooling_layer=False).eval()
    with torch.no_grad():  # make LayerNorms and biases non-trivial too
        for p in bert.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return bert


def compare(bert, model, tokens, token_type_ids=None, attention_mask=None):
    out = bert(tokens, token_type_ids=token_type_ids, attention_mask=attention_mask,
               output_hidden_states=True, output_attentions=True)
    hidden, cache = model.run_with_cache(tokens, token_type_ids=token_type_ids,
                                         attention_mask=attention_mask, return_type="hidden")
    assert torch.allclose(out.last_hidden_state, hidden, atol=1e-5)
    assert torch.allclose(out.hidden_states[0], cache["hook_full_embed"], atol=1e-5)
    for l in range(model.cfg.n_layers):
        assert torch.allclose(out.hidden_states[l + 1], cache[f"blocks.{l}.hook_normalized_resid_post"], atol=1e-5)
        assert torch.allclose(out.attentions[l], cache[f"blocks.{l}.attn.hook_pattern"], atol=1e-5)


def test_from_hf_matches_bert_and_readout():
    bert = random_bert()
    readout = torch.nn.Linear(32, 1)
    model = HookedEncoder.from_hf(bert, readout)
    tokens = torch.randint(0, 2002, (4, 16), generator=torch.Generator().manual_seed(0))
    compare(bert, model, tokens)
    ref = readout(bert(tokens).last_hidden_state).squeeze(-1)
    assert torch.allclose(model(tokens), ref, atol=1e-5)


def test_token_types_and_padding_mask():
    bert = random_bert(n_token_types=2)
    model = HookedEncoder.from_hf(bert)
    assert model.cfg.n_token_types == 2
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 2002, (3, 12), generator=g)
    tt = torch.randint(0, 2, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, 8:] = 0
    compare(bert, model, tokens, tt, mask)


def test_to_hf_matches_ours_and_round_trip_is_exact():
    cfg = EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=16)
    model = HookedEncoder(cfg, seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.1)
        model.embed.W_E[0].zero_()
    bert, readout = model.to_hf()
    tokens = torch.randint(0, 2002, (4, 16), generator=torch.Generator().manual_seed(2))
    compare(bert, model, tokens)
    assert torch.allclose(readout(bert(tokens).last_hidden_state).squeeze(-1), model(tokens), atol=1e-5)
    back = HookedEncoder.from_hf(bert, readout)
    assert back.cfg == cfg
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k


def test_hf_round_trip_is_exact():
    bert = random_bert()
    bert2, _ = HookedEncoder.from_hf(bert).to_hf()
    for k, v in bert.state_dict().items():
        assert torch.equal(v, bert2.state_dict()[k]), k


def test_accepts_models_with_a_bert_attribute():
    mlm = BertForMaskedLM(random_bert().config)
    model = HookedEncoder.from_hf(mlm)
    assert torch.equal(model.W_pos, mlm.bert.embeddings.position_embeddings.weight)
    with pytest.raises(TypeError, match="bert"):
        HookedEncoder.from_hf(torch.nn.Linear(2, 2))


def test_learned_mask_embedding_round_trip():
    cfg = EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=9, learned_mask_embedding=True)
    model = HookedEncoder(cfg, seed=0)
    bert, readout = model.to_hf()
    assert bert.config.pad_token_id is None
    assert HookedEncoder.from_hf(bert, readout).cfg == cfg
