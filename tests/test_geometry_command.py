"""``tfmatcomp geometry`` on small random BERT and GPT-2 models saved in the test: loaders, QK split
of a decoder, the theorems' measurements, the CLI end to end, and the page in a headless browser."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from tfmatcomp.report.geometry import SECTIONS, run_geometry  # noqa: E402
from tfmatcomp.task.corpus import cut_contexts, read_documents  # noqa: E402
from tfmatcomp.geometry.models import DecoderGeometry, load_geometry_model  # noqa: E402
from tfmatcomp.geometry.theory import (kernel_factorization_error, low_frequency_error,  # noqa: E402
                                       positional_projection, theorem1_table)

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _tokenizer(kind: str):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIALS + WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if kind == "bert":
        return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                       cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def _save_model(kind: str, out) -> str:
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    n = len(SPECIALS) + len(WORDS)
    if kind == "bert":
        model = BertForMaskedLM(BertConfig(vocab_size=n, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=64,
                                           max_position_embeddings=64, pad_token_id=0))
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=n, n_embd=32, n_layer=2, n_head=4,
                                           n_positions=64, bos_token_id=None, eos_token_id=None))
    model.save_pretrained(out)
    _tokenizer(kind).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    g = torch.Generator().manual_seed(0)
    for i in range(3):  # three documents, each drawing from its own half of the words
        words = WORDS[(i * 6) % 14:(i * 6) % 14 + 8]
        idx = torch.randint(0, len(words), (150,), generator=g)
        (d / f"doc{i}.txt").write_text(" ".join(words[j] for j in idx))
    return d


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def model_dir(request, tmp_path_factory):
    return _save_model(request.param, tmp_path_factory.mktemp(request.param))


def test_contexts_are_balanced_by_document(corpus):
    docs = read_documents(corpus)
    ctx = cut_contexts(docs, lambda s: [WORDS.index(w) for w in s.split()], n_contexts=9,
                       n_positions=10, prefix_ids=[99])
    assert ctx.tokens.shape == (9, 10) and (ctx.tokens[:, 0] == 99).all()
    assert torch.bincount(ctx.labels).tolist() == [3, 3, 3]
    assert ctx.names == ("doc0.txt", "doc1.txt", "doc2.txt")
    with pytest.raises(ValueError, match="n_positions"):
        cut_contexts(docs, lambda s: s.split(), n_contexts=2, n_positions=10_000)


def test_gpt2_stream_matches_hidden_states_and_qk_sums_to_scores(tmp_path):
    from transformers import GPT2Model

    path = _save_model("gpt2", tmp_path / "gpt2")
    gm, _ = load_geometry_model(path)
    assert isinstance(gm, DecoderGeometry) and gm.family == "gpt2" and gm.causal
    tokens = torch.randint(5, 25, (6, 12), generator=torch.Generator().manual_seed(1))
    acc = gm.accumulate([tokens], drop_first=0, progress=False, total=1)
    hf = GPT2Model.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True, output_attentions=True)
    for i, key in enumerate(gm.stream_keys):  # the accumulated stream is transformers' hidden_states
        assert torch.allclose(acc.result(key).mu, out.hidden_states[i].double().mean((0, 1)), atol=1e-5)
    for layer in range(gm.n_layers):
        dec = acc.result(gm.attention_input_keys[layer])
        qk = gm.qk(tokens[:2], layer, dec)
        causal = torch.ones(12, 12, dtype=torch.bool).tril()
        total, scores = qk.total(), qk.scores
        assert torch.allclose(total[..., causal], scores[..., causal], atol=1e-5)
        # and softmax of the four components' sum is transformers' own attention pattern
        assert torch.allclose(total.softmax(-1).float(), out.attentions[layer][:2], atol=1e-5)


def test_bert_qk_sums_to_scores(tmp_path):
    gm, _ = load_geometry_model(_save_model("bert", tmp_path / "bert"))
    assert not gm.causal and gm.attention_input_keys[1] == gm.stream_keys[1]
    tokens = torch.randint(5, 25, (6, 12), generator=torch.Generator().manual_seed(1))
    acc = gm.accumulate([tokens], drop_first=1, progress=False, total=1)
    qk = gm.qk(tokens[:2], 1, acc.result(gm.attention_input_keys[1]))
    assert torch.allclose(qk.total(), qk.scores.double(), atol=1e-5)


def test_theorem1_bound_holds_and_smooth_bases_have_small_error():
    t = torch.arange(64, dtype=torch.float64)
    smooth = torch.stack([torch.cos(math.pi * (t + 0.5) / 64), torch.cos(2 * math.pi * (t + 0.5) / 64)], 1)
    assert low_frequency_error(smooth, 3) < 1e-10   # DCT vectors themselves
    rough = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert low_frequency_error(rough, 3) > 0.5
    df = theorem1_table(rough, ks=(1, 2, 4))
    assert (df["error"] <= df["bound_m1"]).all()


def test_kernel_factorization_error_grows_with_incoherence():
    g = torch.Generator().manual_seed(0)
    d, T = 64, 16
    pos = torch.randn(T, 2, generator=g, dtype=torch.float64) @ torch.eye(2, d, dtype=torch.float64)
    proj = positional_projection(pos, 2)
    W = torch.randn(d, d, generator=g, dtype=torch.float64) / d
    c_incoherent = torch.randn(T, d, generator=g, dtype=torch.float64) @ (torch.eye(d) - proj)
    leak = torch.randn(T, d, generator=g, dtype=torch.float64) @ proj
    small = kernel_factorization_error(pos, c_incoherent, W, proj)["relative"]
    big = kernel_factorization_error(pos, c_incoherent + leak, W, proj)["relative"]
    assert small < 1e-12 < 0.05 < big


def test_run_geometry_writes_every_section(model_dir, corpus, tmp_path):
    report = run_geometry(model_dir, corpus, tmp_path / "g.html", n_contexts=18, n_positions=16,
                          n_second=6, batch_size=6, progress=False)
    assert report.failed == []
    text = report.path.read_text()
    for key in SECTIONS:
        assert f'id="{key}"' in text
    assert "BERT (paper)" in text and "GPT-2 (paper)" in text
    assert text.count('class="plotly-graph-div"') >= 9
    assert len(report.summary) == 3 and (report.summary["n_positions"] == 15).all()


def test_cli_geometry_end_to_end_and_in_a_headless_browser(tmp_path, corpus):
    from tfmatcomp.cli import main

    path = _save_model("gpt2", tmp_path / "gpt2")
    out = tmp_path / "geometry.html"
    assert main(["geometry", path, str(corpus), "-o", str(out), "--contexts", "12",
                 "--positions", "12", "--second-pass", "4", "--no-progress"]) == 0
    assert "Table 1 per layer" in out.read_text()
    assert main(["geometry", str(tmp_path / "nothing"), str(corpus), "-o", str(out)]) == 2
    from tests.test_report import _chromium

    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed")
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=30000", "--dump-dom", out.as_uri()],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not [line for line in proc.stderr.splitlines()
                if "CONSOLE" in line and re.search(r"Uncaught|Error", line)]
    assert proc.stdout.count('class="main-svg"') >= out.read_text().count('class="plotly-graph-div"')


def test_a_pickled_bert_checkpoint_is_refused_naming_the_directory(tmp_path):
    import pickle

    from tfmatcomp.geometry.models import load_geometry_model

    out = _save_model("bert", tmp_path / "bert")
    for f in Path(out).glob("*.safetensors"):
        f.unlink()
    with open(Path(out) / "pytorch_model.bin", "wb") as f:
        pickle.dump({"not": "weights"}, f)
    with pytest.raises(ValueError, match="model_dir: the weights in .* cannot be loaded"):
        load_geometry_model(out)
