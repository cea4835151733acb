# %% [markdown]
# # Decomposing a HuggingFace BERT loaded from a local directory
#
# The position / context / residual decomposition is not tied to our matrix-completion models:
# any BERT in `transformers` format works. This script follows the recipe of
# `docs/decomposition.md`, entirely offline:
#
# 1. build a small random `BertModel` (there is no network to download a real one) and save it
#    with `save_pretrained` to a local directory (`config.json` + `model.safetensors`);
# 2. write a word-level `vocab.txt` into the same directory and a small text file (three topics,
#    one sentence a line);
# 3. load both back with `from_pretrained(model_dir, local_files_only=True)`;
# 4. tokenize the text file, convert the BERT with `HookedEncoder.from_hf`, and stream it into the
#    decomposition; print the per-layer summary table, with each sentence's topic as its cluster
#    label, and check it against the same statistics taken straight from the transformers model.
#
# Swap in a real checkpoint directory and corpus to reproduce the paper's tables. Files go to
# `--out DIR`, `$TFMATCOMP_EXAMPLE_OUT`, or a fresh temporary directory.

# %%
import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pandas as pd
import torch
from transformers import BertConfig, BertModel, BertTokenizer
from transformers.utils import logging as hf_logging

import tfmatcomp as tm
from tfmatcomp.decomposition import accumulate, hf_bert_modules, residual_stream_names
from tfmatcomp.geometry import model_summary_table, summary_table

parser = argparse.ArgumentParser(description="decomposition of a local transformers BERT")
parser.add_argument("--out", default=os.environ.get("TFMATCOMP_EXAMPLE_OUT"),
                    help="working directory for the model, vocab and text files")
args, _ = parser.parse_known_args()  # parse_known_args: also works inside a Jupyter kernel
work = Path(args.out or tempfile.mkdtemp(prefix="tfmatcomp-hf-bert-"))
work.mkdir(parents=True, exist_ok=True)

torch.set_num_threads(1)
hf_logging.disable_progress_bar()
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 20)
pd.set_option("display.float_format", lambda v: f"{v:.4g}")
t_start = time.perf_counter()

# %% [markdown]
# ## A local text file and a word-level vocabulary
#
# Three topics, eight sentences each. The vocabulary holds BERT's special tokens and every word of
# the text, so `BertTokenizer` maps each word to one id (no word pieces needed). It goes into the
# model directory as `vocab.txt`, where `BertTokenizer.from_pretrained` looks for it.

# %%
TOPICS = {
    "animals": [
        "the cat sleeps on the warm mat all day",
        "a small dog runs after the red ball",
        "the horse eats hay in the old barn",
        "birds sing in the tall trees at dawn",
        "the cat and the dog play in the yard",
        "a fox hides in the woods near the farm",
        "the cow gives milk to the farmer each morning",
        "fish swim in the cold clear river",
    ],
    "weather": [
        "heavy rain falls on the city all night",
        "the sun is hot and the sky is clear",
        "strong wind blows the clouds across the sky",
        "snow covers the hills in the cold winter",
        "a storm brings thunder and rain in the evening",
        "the morning fog lifts when the sun rises",
        "it is cold and windy by the sea today",
        "the summer heat makes the air dry",
    ],
    "cooking": [
        "boil the pasta in salted water for ten minutes",
        "slice the onions and fry them in butter",
        "bake the bread in a hot oven until brown",
        "mix the flour with eggs and warm milk",
        "add salt and pepper to the soup",
        "stir the sauce slowly over a low heat",
        "roast the vegetables with olive oil and garlic",
        "serve the rice with fresh herbs and lemon",
    ],
}
lines, labels = [], []
for k, sentences in enumerate(TOPICS.values()):
    lines += sentences
    labels += [k] * len(sentences)
text_file = work / "corpus.txt"
text_file.write_text("\n".join(lines) + "\n", encoding="utf-8")

words = sorted({w for line in lines for w in line.split()})
model_dir = work / "bert"
model_dir.mkdir(exist_ok=True)
vocab_file = model_dir / "vocab.txt"
vocab_file.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n",
                      encoding="utf-8")
print(f"{len(lines)} sentences in {text_file}, vocabulary of {5 + len(words)} tokens")

# %% [markdown]
# ## A small random BERT, saved and loaded back
#
# `transformers` initializes weights from torch's global generator; `fork_rng` + `manual_seed`
# make that explicit and leave the caller's random state untouched. Dropout is off and attention is
# the eager implementation, so the forward pass is deterministic.

# %%
config = BertConfig(vocab_size=5 + len(words), hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                    type_vocab_size=1, pad_token_id=0, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
with torch.random.fork_rng(devices=[]):
    torch.manual_seed(0)
    original = BertModel(config, add_pooling_layer=False)
original.save_pretrained(model_dir, safe_serialization=True)
print("saved:", sorted(p.name for p in model_dir.iterdir()))

bert = BertModel.from_pretrained(model_dir, local_files_only=True, add_pooling_layer=False,
                                 attn_implementation="eager").eval()
# Note: with transformers >= 5, `BertTokenizer(vocab_file=...)` silently ignores the keyword
# (the parameter is now `vocab`) and maps every word to [UNK]; `from_pretrained` on the directory,
# or the path as the first positional argument, works with both 4.x and 5.x.
tokenizer = BertTokenizer.from_pretrained(model_dir, local_files_only=True)

# %% [markdown]
# ## Tokenize the text file
#
# Batches of 8 sentences, padded to the longest one in each batch; the tokenizer's
# `attention_mask` makes every mean of the decomposition skip the padding. `drop_first=1` drops
# `[CLS]` (the paper drops the first token). Position `t` of `pos` is then absolute position `t + 1`.

# %%
texts = [line for line in text_file.read_text(encoding="utf-8").splitlines() if line.strip()]
batches = [tokenizer(texts[i:i + 8], padding=True, truncation=True, max_length=64,
                     return_tensors="pt") for i in range(0, len(texts), 8)]
print("first sentence ->", tokenizer.convert_ids_to_tokens(batches[0]["input_ids"][0].tolist()))
n_unk = sum(int((b["input_ids"] == tokenizer.unk_token_id).sum()) for b in batches)
assert n_unk == 0, f"{n_unk} [UNK] tokens: the vocabulary was not loaded"

# %% [markdown]
# ## The decomposition through `HookedEncoder.from_hf`
#
# The converted model has TransformerLens hook names; its residual stream `h^(0..L)` is
# `blocks.{l}.hook_resid_pre` and the last block's `hook_normalized_resid_post` (row 0 = the
# embeddings, row `l` = output of block `l - 1`: the paper's "Layer l"). Cluster labels = topics:
# `intra_similarity` / `inter_similarity` are the mean `|cos|` between context vectors of the same /
# different topics. (Random weights: expect little structure beyond shared words.) With padding, late
# positions are averaged over few contexts, so `pos` there is noisy and `relative_norm` can exceed 1;
# the paper cuts a long token stream into equal windows (no padding), where it lies in [0, 1].

# %%
hooked = tm.HookedEncoder.from_hf(bert).eval()
print("hook names:", residual_stream_names(hooked))
table = model_summary_table(hooked, batches, labels=labels, drop_first=1, progress=False,
                            total=len(batches))
COLS = ["layer", "name", "rank_estimate", "screenot_k", "stable_rank", "relative_norm",
        "intra_similarity", "inter_similarity", "incoherence_max", "n_contexts", "n_positions"]
print(table[COLS].to_string(index=False))

# %% [markdown]
# ## The same statistics from the transformers model itself
#
# `hf_bert_modules` hooks `bert.embeddings` and each `bert.encoder.layer[i]` with plain torch forward
# hooks (their outputs are `hidden_states[0..L]`), so no conversion is needed; the table agrees
# with the converted model's to float32 rounding.

# %%
acc = accumulate(bert, batches, modules=hf_bert_modules(bert), drop_first=1, progress=False,
                 total=len(batches))
hf_table = summary_table(acc, labels)
numeric = [c for c in COLS if c not in ("layer", "name")]
diff = (table[numeric] - hf_table[numeric]).abs().max().max()
print("transformers-side hook names:", acc.names)
print(f"max |difference| between the two tables: {diff:.2e}")
assert list(table["rank_estimate"]) == list(hf_table["rank_estimate"])
print(f"done in {time.perf_counter() - t_start:.1f} s (files in {work})")
