"""Song & Zhong Section 4.1 on a small random GPT-2 built here: repeated random tokens, the four QK
components per head summing to the scores, the three head-type scores, and the figure."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from tfmatcomp.decomposition import accumulate  # noqa: E402
from tfmatcomp.models.decoder import HookedDecoder  # noqa: E402
from tfmatcomp.geometry.induction import (HEAD_TYPES, induction_scores, induction_study,  # noqa: E402
                                          repeated_random_tokens)
from tfmatcomp.geometry.models import DecoderGeometry  # noqa: E402


@pytest.fixture(scope="module")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                       bos_token_id=None, eos_token_id=None)).eval()
    gm = DecoderGeometry(HookedDecoder.from_hf(model).eval(), family="gpt2")
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(50, (8, 32), generator=g) for _ in range(3)]
    acc = gm.accumulate(batches, drop_first=1, progress=False, total=None)
    inputs = {l: acc.result(k) for l, k in enumerate(gm.attention_input_keys)}
    return gm, inputs


def test_repeated_random_tokens_are_periodic_and_seeded():
    a = repeated_random_tokens(torch.tensor([5, 6, 7]), n_tokens=4, n_copies=3, n_sequences=2,
                               prefix=[0], generator=torch.Generator().manual_seed(3))
    b = repeated_random_tokens(torch.tensor([5, 6, 7]), n_tokens=4, n_copies=3, n_sequences=2,
                               prefix=[0], generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (2, 13) and bool((a[:, 0] == 0).all())
    assert torch.equal(a[:, 1:5], a[:, 5:9]) and torch.equal(a[:, 1:5], a[:, 9:13])
    assert set(a[:, 1:].unique().tolist()) <= {5, 6, 7}
    with pytest.raises(ValueError, match="n_copies"):
        repeated_random_tokens(10, n_copies=1)


def test_scores_find_each_planted_head_type():
    T, period, start = 19, 6, 1  # window 3 < period - 1: the three key sets are disjoint
    heads = torch.zeros(1, 3, T, T)
    for i in range(T):
        heads[0, 0, i, max(i - period, 0)] = 1  # self-token
        heads[0, 1, i, max(i - 1, 0)] = 1  # previous token
        heads[0, 2, i, max(i - period + 1, 0)] = 1  # copy
    s = induction_scores(heads, period, start=start)
    for h, kind in enumerate(HEAD_TYPES):
        assert s[kind][h] == 1 and all(s[k][h] == 0 for k in HEAD_TYPES if k != kind)


def test_induction_study_on_random_gpt2_components_sum_to_scores(gpt2):
    gm, inputs = gpt2
    study = induction_study(gm, inputs, n_tokens=5, n_copies=3, n_sequences=2, prefix=[7],
                            generator=torch.Generator().manual_seed(0))
    assert study.tokens.shape == (2, 16) and study.period == 5 and study.start == 1
    assert sorted(study.components) == [0, 1]
    for qk in study.components.values():
        assert torch.allclose(qk.total(), qk.scores, atol=1e-5)
        assert torch.allclose(qk.total().softmax(-1), qk.pattern, atol=1e-6)
    table = study.table
    assert len(table) == 2 * 4 and set(table["type"]) <= set(HEAD_TYPES) | {"other"}
    assert table[list(HEAD_TYPES)].ge(0).all().all() and table[list(HEAD_TYPES)].le(1 + 1e-9).all().all()
    assert study.best("copy") in {(int(r.layer), int(r.head)) for r in table.itertuples()}
    from tfmatcomp.plotting.geometry import induction_figure

    fig = induction_figure(table)
    assert len(fig.data) == 3 and fig.data[0].z.shape == (2, 4)
