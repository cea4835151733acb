"""One forward pass and one ``run_with_cache`` of a BERT-base-shaped masked-LM encoder: ours,
TransformerLens 3.9's HookedEncoder (when installed) and transformers' eager ``BertForMaskedLM``.

All three hold the same random weights (one ``BertForMaskedLM``; ours through
``HookedEncoder.from_pretrained``, TransformerLens's through its own ``convert_bert_weights``) and
read the same batch (``--batch`` texts of ``--pos`` random token ids, the last quarter of every
other row padded). Timed, alternating the runs so that a change of load slows all alike:

* ``transformers, forward``: ``BertForMaskedLM(input_ids, attention_mask=...)``, eager attention;
* ``ours, forward`` / ``ours, run_with_cache``: logits, and logits plus every hook cached;
* ``TransformerLens 3.9, forward`` / ``run_with_cache``: the same.

Each row's time is its fastest of ``--repeats`` runs (the one least disturbed by other
processes); the ratio is to transformers' forward. Before timing, the logits of the three are
compared (max |difference| printed). Nothing is downloaded.

Usage::

    python benchmarks/encoder_forward.py [--layers 12] [--batch 2] [--pos 128] [--repeats 5]
        [--threads 1] [--small]

``--small``: a 2-layer d_model 64 model, for a quick check that the script runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import time
import warnings

import torch
from transformers import BertConfig, BertForMaskedLM, BertForPreTraining

from tfmatcomp import HookedEncoder


def _tl3_model(hf: BertForMaskedLM):
    """TransformerLens 3.9's HookedEncoder with ``hf``'s weights, or None when 3.9 is not here."""
    try:
        version = importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:
        return None, "not installed"
    if not version.startswith("3."):
        return None, f"TransformerLens {version} has no HookedEncoder"
    from transformer_lens import HookedEncoder as TLHookedEncoder
    from transformer_lens.config import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.bert import convert_bert_weights

    c = hf.config
    pre = BertForPreTraining(c).eval()           # its converter also reads pooler and NSP head
    pre.load_state_dict(hf.state_dict(), strict=False)
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size, d_head=c.hidden_size // c.num_attention_heads,
        n_heads=c.num_attention_heads, d_mlp=c.intermediate_size, n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings, eps=c.layer_norm_eps, d_vocab=c.vocab_size,
        act_fn="gelu", attention_dir="bidirectional", original_architecture="BertForMaskedLM",
        device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TLHookedEncoder(cfg, move_to_device=False)
    model.load_state_dict(convert_bert_weights(pre, cfg), strict=False)
    return model.eval(), version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--pos", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    d, heads, mlp, vocab = (64, 4, 256, 1000) if args.small else (768, 12, 3072, 30522)
    layers = 2 if args.small else args.layers
    hf = BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                                    num_attention_heads=heads, intermediate_size=mlp,
                                    max_position_embeddings=max(512, args.pos),
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                    attn_implementation="eager")).eval()
    ours = HookedEncoder.from_pretrained(hf)
    tl, tl_note = _tl3_model(hf)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1000 if not args.small else 5, vocab, (args.batch, args.pos), generator=g)
    mask = torch.ones_like(tokens)
    mask[1::2, args.pos - args.pos // 4:] = 0
    types = torch.zeros_like(tokens)

    runs = {
        "transformers, forward": lambda: hf(input_ids=tokens, attention_mask=mask).logits,
        "ours, forward": lambda: ours(tokens, types, mask),
        "ours, run_with_cache": lambda: ours.run_with_cache(tokens, types, mask)[0],
    }
    if tl is not None:
        runs["TransformerLens 3.9, forward"] = lambda: tl(tokens, token_type_ids=types,
                                                          one_zero_attention_mask=mask)
        runs["TransformerLens 3.9, run_with_cache"] = lambda: tl.run_with_cache(
            tokens, token_type_ids=types, one_zero_attention_mask=mask)[0]
    real = mask.bool()
    with torch.no_grad():
        reference = runs["transformers, forward"]()
        for name, fn in runs.items():
            diff = (fn()[real] - reference[real]).abs().max().item()
            print(f"max |logits - transformers'|  {name:38s} {diff:.2e}")
        best = {name: float("inf") for name in runs}
        for _ in range(args.repeats):
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
    base = best["transformers, forward"]
    shape = f"{layers} layers, d_model {d}, {heads} heads, d_mlp {mlp}, vocab {vocab}"
    print(f"\n{shape}; batch {args.batch} x {args.pos}; {args.threads} thread(s); fastest of "
          f"{args.repeats}; TransformerLens: {tl_note}")
    print("| run | seconds | ratio to transformers forward |")
    print("| --- | --- | --- |")
    for name, t in best.items():
        print(f"| {name} | {t:.3f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
