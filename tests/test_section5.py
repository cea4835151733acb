"""Section 5 of Song & Zhong on small decoders: the addition data and its accuracy, the smoothness
measures, token randomization, and the three experiments end to end at toy sizes (the real sizes
run in scripts/section5.py; docs/geometry.md has their numbers)."""

from __future__ import annotations

import math

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.decomposition import decompose
from tfmatcomp.models.decoder import next_token_loss
from tfmatcomp.training.lm import text_sampler, train_lm
from tfmatcomp.analyses.training_format import (ADDITION_TOKENIZER, AdditionTask, addition_accuracy,
                                                addition_experiment, answer_accuracy,
                                                randomization_experiment, randomize_tokens,
                                                randomized_sampler)
from tfmatcomp.geometry.positional import positional_profile, positional_table
from tfmatcomp.report.geometry import nanogpt_experiment


def _parse(tokens, weights):
    """(a, b, reversed answer) of every row, and the answer's weighted span as text."""
    out = []
    for t, w in zip(tokens, weights):
        text = ADDITION_TOKENIZER.decode(t)
        body = text.rstrip("#")
        a, rest = body.split("+")
        b, c = rest.split("=")
        span = ADDITION_TOKENIZER.decode(t[w > 0])
        out.append((a, b, c, span))
    return out


@pytest.mark.parametrize("carry", [False, True])
def test_addition_examples_are_correct_and_respect_the_carry_setting(carry):
    task = AdditionTask(max_digits=5, carry=carry)
    tokens, weights = task.sample(400, torch.Generator().manual_seed(0))
    assert tokens.shape == (400, task.n_positions) == (400, 19)
    any_carry = 0
    for a, b, c, span in _parse(tokens, weights):
        assert 2 <= len(a) <= 5 and 2 <= len(b) <= 5 and a[0] != "0" and b[0] != "0"
        assert c.endswith("$") and int(c[:-1][::-1]) == int(a) + int(b) and span == c
        pairs = zip(a[::-1].ljust(5, "0"), b[::-1].ljust(5, "0"))
        any_carry += any(int(x) + int(y) > 9 for x, y in pairs)
    if carry:
        assert any_carry > 300  # independent digits: most 2-5 digit additions carry somewhere
    else:
        assert any_carry == 0
    # the same generator state gives the same batch; lengths can be forced
    again, _ = task.sample(400, torch.Generator().manual_seed(0))
    assert torch.equal(tokens, again)
    short, w = task.sample(50, torch.Generator().manual_seed(1), digits=(1, 1))
    assert all(len(a) == 1 and len(b) == 1 for a, b, _, _ in _parse(short, w))
    with pytest.raises(ValueError, match="digits"):
        task.sample(2, torch.Generator(), digits=(1, 6))


def test_no_carry_digit_pairs_are_uniform_over_the_allowed_pairs():
    """Rejection redraws whole pairs: the inner digit pairs are uniform over the 55 with sum <= 9."""
    task = AdditionTask(max_digits=3, min_digits=3, carry=False)
    a, b = task.operands(6000, torch.Generator().manual_seed(0))
    counts = torch.zeros(10, 10)
    for x, y in zip(a, b):
        counts[(x // 10) % 10, (y // 10) % 10] += 1
    allowed = torch.tensor([[i + j <= 9 for j in range(10)] for i in range(10)])
    assert counts[~allowed].sum() == 0
    share = counts[allowed] / counts.sum()
    assert (share - 1 / 55).abs().max() < 0.009  # ~5 standard errors at 6000 draws


def test_answer_accuracy_is_greedy_exact_match():
    task = AdditionTask(max_digits=3)
    tokens, weights = task.sample(8, torch.Generator().manual_seed(0))
    perfect = torch.nn.functional.one_hot(tokens[:, 1:], ADDITION_TOKENIZER.vocab_size).float()
    logits = torch.cat([perfect, torch.zeros(8, 1, ADDITION_TOKENIZER.vocab_size)], 1)
    assert answer_accuracy(logits, tokens, weights).tolist() == [1.0] * 8
    # a wrong prediction outside the answer does not count; one inside it does
    j = int(weights[0].nonzero()[0]) - 1          # the position predicting the first answer digit
    outside = logits.clone()
    outside[1, 0] = outside[1, 0].roll(1)
    inside = logits.clone()
    inside[0, j] = inside[0, j].roll(1)
    assert answer_accuracy(outside, tokens, weights)[1] == 1.0
    assert answer_accuracy(inside, tokens, weights).tolist() == [0.0] + [1.0] * 7


def test_weighted_loss_counts_only_the_answer():
    task = AdditionTask(max_digits=2)
    tokens, weights = task.sample(4, torch.Generator().manual_seed(0))
    logits = torch.randn(4, task.n_positions, 14, generator=torch.Generator().manual_seed(1))
    scrambled = logits.clone()
    outside = (weights[:, 1:] == 0)
    scrambled[:, :-1][outside] = torch.randn(int(outside.sum()), 14)
    assert torch.allclose(next_token_loss(logits, tokens, weights), next_token_loss(scrambled, tokens, weights))
    assert not torch.allclose(next_token_loss(logits, tokens), next_token_loss(scrambled, tokens))


def test_a_small_decoder_learns_one_digit_addition():
    """The training loop and the accuracy together: one-digit sums are learned in 300 steps."""
    torch.manual_seed(0)
    task = AdditionTask(max_digits=1, carry=True)
    cfg = tm.DecoderConfig(n_layers=2, n_heads=2, d_model=32, d_mlp=64, n_ctx=task.n_positions,
                           d_vocab=ADDITION_TOKENIZER.vocab_size)
    run = train_lm(cfg, task.sampler(), n_steps=300, batch_size=64, lr=3e-3, log_every=300)
    acc = addition_accuracy(run.model, task, n=200)
    assert acc["accuracy"].iloc[0] > 0.9
    fresh = addition_accuracy(tm.HookedDecoder(cfg, seed=0), task, n=200)
    assert fresh["accuracy"].iloc[0] < 0.1


def test_positional_profile_separates_smooth_from_shuffled_bases():
    g = torch.Generator().manual_seed(0)
    t = torch.arange(48.0)[:, None]
    curve = torch.cat([torch.cos(math.pi * t / 48), torch.sin(math.pi * t / 48),
                       torch.cos(2 * math.pi * t / 48)], 1) @ torch.randn(3, 16, generator=g)
    noise = 0.05 * torch.randn(32, 48, 16, generator=g)
    smooth = positional_profile(decompose(curve[None] + noise))
    shuffled = positional_profile(decompose(curve[torch.randperm(48, generator=g)][None] + noise))
    assert smooth["adjacent_cos"] > 0.9 > 0.3 > shuffled["adjacent_cos"]
    assert smooth["low_freq_energy"] > 0.8 > 0.3 > shuffled["low_freq_energy"]
    half = positional_profile(decompose(curve[None] + noise), slice(0, 24))
    assert half["adjacent_cos"] > 0.9


def test_randomize_tokens_keeps_the_first_part_only():
    g = torch.Generator().manual_seed(0)
    tokens = torch.zeros(200, 10, dtype=torch.long)
    half = randomize_tokens(tokens, 0.5, 7, g)
    assert (half[:, :5] == 0).all() and (half[:, 5:] != 0).float().mean() > 0.8
    assert half.max() == 6
    assert randomize_tokens(tokens, 1.0, 7, g).equal(tokens)
    sampler = randomized_sampler(text_sampler(torch.zeros(50, dtype=torch.long), 10), 0.0, 7)
    assert (sampler(100, g) != 0).float().mean() > 0.8
    with pytest.raises(ValueError, match="keep"):
        randomize_tokens(tokens, 1.5, 7, g)


def test_positional_table_reads_every_layer_and_both_halves():
    model = tm.HookedDecoder(tm.DecoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=12,
                                              d_vocab=10), seed=0)
    tokens = torch.randint(0, 10, (32, 12), generator=torch.Generator().manual_seed(0))
    df = positional_table(model, [tokens], halves=True)
    assert list(df["layer"]) == [0, 1, 2]
    assert {"adjacent_cos_first_half", "low_freq_energy_second_half", "stable_rank"} <= set(df)
    # with one token everywhere, layer 0's positional basis is W_pos centered (first one dropped)
    df = positional_table(model, [torch.zeros(8, 12, dtype=torch.long)])
    W = model.W_pos[1:12].detach().double()
    P = W - W.mean(0)
    expected = float((P ** 2).sum() / torch.linalg.matrix_norm(P, 2) ** 2)
    assert abs(df["stable_rank"].iloc[0] - expected) < 1e-6


def test_the_three_experiments_run_end_to_end_at_toy_size(tmp_path):
    r = addition_experiment(max_digits=2, n_layers=1, d_model=16, n_heads=2, n_steps=3,
                            batch_size=8, n_eval=8, n_measure=16, out_dir=tmp_path)
    acc = r["accuracy"]
    assert set(acc["setting"]) == {"carry", "no_carry"} and acc["accuracy"].between(0, 1).all()
    assert list(acc["in_training"][:2]) == [True, True]
    assert (tmp_path / "addition_carry" / "checkpoints" / "step_0000003").is_dir()
    r = randomization_experiment(n_positions=8, n_layers=1, d_model=16, n_heads=2, n_steps=2,
                                 batch_size=4, n_measure=16, max_documents=2)
    assert r["positional"].groupby(["train", "inference"]).ngroups == 9
    r = nanogpt_experiment(n_positions=16, n_layers=1, d_model=16, n_heads=2, n_steps=2,
                           batch_size=4, n_contexts=8, n_second=4, max_documents=3,
                           sections=["table1"], out_dir=tmp_path)
    assert r["row"]["model"] == "char-gpt (ours)" and len(r["summary"]) == 2
    assert r["report"].is_file() and "NanoGPT" not in r["row"]["corpus"]
