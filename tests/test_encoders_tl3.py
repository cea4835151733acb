"""HookedEncoder against TransformerLens 3.9's HookedEncoder, on the same random BertForMaskedLM.

TransformerLens 4 removed its HookedEncoder; researchers moving from 3.x want the same numbers
under the same names. Both models get one float64 ``BertForMaskedLM`` with every weight random
(TransformerLens's weights through its own ``convert_bert_weights``, ours through
:meth:`HookedEncoder.from_pretrained`) and one tokenizer; on a padded batch of strings, the tokens,
the logits, ``encoder_output`` and every hook TransformerLens caches must agree.

Runs only where TransformerLens 3.9 is installed (CI's second environment); skipped elsewhere.
"""

from __future__ import annotations

import importlib.metadata
import math

import pytest
import torch

try:
    TL_VERSION = importlib.metadata.version("transformer-lens")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover
    TL_VERSION = "none"
pytestmark = pytest.mark.skipif(not TL_VERSION.startswith("3.9"),
                                reason=f"needs TransformerLens 3.9 (found {TL_VERSION})")

from transformers import BertConfig, BertForMaskedLM, BertForPreTraining, BertTokenizerFast  # noqa: E402

from tfmatcomp import HookedEncoder  # noqa: E402

WORDS = ("[PAD] [UNK] [CLS] [SEP] [MASK] the cat dog sat on mat a big small ran fast slow red "
         "blue").split()
TEXTS = ["the cat sat on the [MASK]", "a big dog ran", "the small red cat ran fast on a blue mat"]
TOL = 1e-10


def _models():
    import warnings

    from transformer_lens import HookedEncoder as TLHookedEncoder
    from transformer_lens.config import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.bert import convert_bert_weights

    cfg = BertConfig(vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=16,
                     type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     attn_implementation="eager")
    hf = BertForMaskedLM(cfg).double().eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(1.0 + 0.5 * noise if "LayerNorm.weight" in name else noise / math.sqrt(p.shape[-1]))
    # TransformerLens's converter also reads the pooler and the NSP head: give it a
    # BertForPreTraining holding the same encoder and masked-LM head
    pre = BertForPreTraining(cfg).double().eval()
    pre.load_state_dict(hf.state_dict(), strict=False)
    tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)})
    tl_cfg = HookedTransformerConfig(
        d_model=32, d_head=8, n_heads=4, d_mlp=64, n_layers=2, n_ctx=16, eps=cfg.layer_norm_eps,
        d_vocab=cfg.vocab_size, act_fn="gelu", attention_dir="bidirectional",
        original_architecture="BertForMaskedLM", dtype=torch.float64, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = TLHookedEncoder(tl_cfg, tokenizer=tokenizer, move_to_device=False)
    theirs.load_state_dict(convert_bert_weights(pre, tl_cfg), strict=False)
    theirs.eval()
    ours = HookedEncoder.from_pretrained(hf, tokenizer=tokenizer, dtype=torch.float64)
    return ours, theirs


@pytest.fixture(scope="module")
def models():
    return _models()


def test_to_tokens_equal(models):
    ours, theirs = models
    for a, b in zip(ours.to_tokens(TEXTS), theirs.to_tokens(TEXTS)):
        assert torch.equal(a, b)


def test_logits_and_encoder_output_equal(models):
    ours, theirs = models
    tokens, types, mask = theirs.to_tokens(TEXTS)
    with torch.no_grad():
        assert torch.allclose(ours(TEXTS), theirs(TEXTS), atol=TOL, rtol=0)
        assert torch.allclose(ours.encoder_output(tokens, types, mask),
                              theirs.encoder_output(tokens, types, mask), atol=TOL, rtol=0)


def test_every_cached_hook_equal(models):
    ours, theirs = models
    with torch.no_grad():
        _, cache_theirs = theirs.run_with_cache(TEXTS)
        _, cache_ours = ours.run_with_cache(TEXTS)
    names = set(cache_theirs.keys())
    assert names <= set(cache_ours.keys()), sorted(names - set(cache_ours.keys()))
    assert any(n.startswith("mlm_head.") for n in names)
    for name in sorted(names):
        a, b = cache_ours[name], cache_theirs[name]
        assert a.shape == b.shape, name
        if name.endswith("hook_attn_scores"):    # padded keys: -inf there, dtype's min here
            masked = torch.isinf(b)
            assert bool((a[masked] < -1e300).all()), name
            a, b = a[~masked], b[~masked]
        assert torch.allclose(a, b, atol=TOL, rtol=0), name
