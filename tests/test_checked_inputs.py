"""Inputs that used to be accepted silently or to fail late (issue 26, checked inputs): each is
refused at the public boundary with a message naming the argument."""

from __future__ import annotations

import pytest
import torch

import tfmatcomp as tm
from tfmatcomp.models.decoder import next_token_loss
from tfmatcomp.interventions import ActivationAblation, from_dict


@pytest.mark.parametrize("kwargs, words", [
    (dict(v_min=10, v_max=-10), ["v_min < v_max"]),
    (dict(scale=-100), ["scale", "> 0"]),
    (dict(scale=0), ["scale", "> 0"]),
    (dict(mask_token_id=5), ["mask_token_id", "must be 0"]),
    (dict(v_min=float("nan")), ["v_min", "finite"]),
    (dict(scale=1e9), ["scale", "at most"]),
])
def test_tokenizer_refuses_bad_ranges_scales_and_mask_ids(kwargs, words):
    with pytest.raises(ValueError) as e:
        tm.ValueTokenizer(**kwargs)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_tokenizer_refuses_complex_values():
    with pytest.raises(ValueError, match="real numbers"):
        tm.ValueTokenizer().encode(torch.tensor([0.5 + 1j]))


def test_attention_mask_must_be_zero_one_or_bool(tiny_model, batch4):
    ones = torch.ones_like(batch4.tokens)
    torch.testing.assert_close(tiny_model(batch4.tokens, attention_mask=ones),
                               tiny_model(batch4.tokens))
    tiny_model(batch4.tokens, attention_mask=ones.bool())
    with pytest.raises(ValueError, match="attention_mask: must hold only 0"):
        tiny_model(batch4.tokens, attention_mask=2 * ones)
    with pytest.raises(ValueError, match="attention_mask: expected shape"):
        tiny_model(batch4.tokens, attention_mask=ones[:, :3])


@pytest.mark.parametrize("weights, words", [
    (torch.tensor([[1.0, -1.0, 1.0]]), "finite and >= 0"),
    (torch.tensor([[1.0, float("nan"), 1.0]]), "finite and >= 0"),
    (torch.tensor([[1.0, 0.0, 0.0]]), "zero at every target"),
    (torch.tensor([1.0, 1.0, 1.0]), "expected shape"),
])
def test_next_token_loss_checks_its_weights(weights, words):
    logits, tokens = torch.zeros(1, 3, 4), torch.tensor([[0, 1, 2]])
    with pytest.raises(ValueError, match=words):
        next_token_loss(logits, tokens, weights)


def test_next_token_loss_needs_two_tokens():
    with pytest.raises(ValueError, match="pos >= 2"):
        next_token_loss(torch.zeros(1, 1, 4), torch.tensor([[0]]))


def test_a_hook_may_not_change_the_activations_shape(tiny_model, batch4):
    with pytest.raises(ValueError, match="hook at blocks.0.hook_resid_pre: returned shape"):
        tiny_model.run_with_hooks(batch4.tokens, fwd_hooks=[
            ("blocks.0.hook_resid_pre", lambda act, hook: act[:, :1])])
    assert tiny_model.active_hook_count() == 0
    out = tiny_model.run_with_hooks(batch4.tokens, fwd_hooks=[
        ("blocks.0.hook_resid_pre", lambda act, hook: act * 0)])  # same shape: fine
    assert out.shape == batch4.tokens.shape


@pytest.mark.parametrize("positions", [[0.5], torch.tensor([1.9]), ["1"]])
def test_positions_must_be_integers_or_a_mask(positions):
    with pytest.raises(ValueError, match="positions: must be integer indices or a bool mask"):
        ActivationAblation(hooks=["hook_z"], positions=positions)
    data = ActivationAblation(hooks=["hook_z"], positions=[1]).to_dict()
    data["positions"] = [1.5]
    with pytest.raises(ValueError, match="positions"):
        from_dict(data)


def test_deeply_nested_compositions_are_refused():
    inner = ActivationAblation(hooks=["hook_z"]).to_dict()
    data = inner
    for _ in range(200):
        data = {"kind": "composition", "parts": [data]}
    with pytest.raises(ValueError, match="nested more than 100 deep"):
        from_dict(data)


def test_lam_true_is_not_lam_one():
    from tfmatcomp.analyses.baselines import complete_nuclear_norm
    from tfmatcomp.datapath import sample_batch

    with pytest.raises(ValueError, match="lam"):
        complete_nuclear_norm(sample_batch("tiny", 2, seed=0), lam=True)


def test_seed_ranges_and_model_sizes_are_bounded_before_allocation():
    with pytest.raises(ValueError, match="at most 10,000 seeds"):
        tm.train_many("tiny", seeds="0-10000000000")
    with pytest.raises(ValueError, match="weights; at most"):
        tm.EncoderConfig(n_layers=10**6)


def test_the_api_checks_devices_as_the_cli_does():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="device: 'cuda' was requested but CUDA is not available"):
        tm.Trainer("tiny", device="cuda", progress=False)


def test_demo_steps_zero_is_refused_not_ignored(tmp_path, capsys):
    from tfmatcomp.cli import main

    code = main(["demo", "--steps", "0", "--run-dir", str(tmp_path / "d"), "-o",
                 str(tmp_path / "r.html"), "--no-progress"])
    assert code == 2 and "--steps: must be an integer in [1, " in capsys.readouterr().err


def test_half_precision_sums_are_refused():
    from tfmatcomp.decomposition import decompose

    h = torch.randn(3, 4, 2)
    with pytest.raises(ValueError, match="sums accumulate in torch.float32 or torch.float64"):
        decompose(h, dtype=torch.float16)


def test_cli_turns_an_unexpected_error_into_one_line(monkeypatch, capsys):
    from tfmatcomp import cli

    def boom(args):
        raise KeyError("rng.train")

    monkeypatch.setitem(cli._COMMANDS, "presets", (lambda p: None, boom))
    assert cli.main(["presets"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KeyError: 'rng.train'" in err and "--debug" in err
    with pytest.raises(KeyError):
        cli.main(["--debug", "presets"])


def test_cli_grid_refuses_infinite_numbers(tmp_path, capsys):
    from tfmatcomp.cli import main

    assert main(["sweep", "--run-dir", str(tmp_path), "--grid", "d_model=1e400"]) == 2
    assert "--grid: '1e400' is not a finite number" in capsys.readouterr().err


def test_hook_entries_must_be_name_function_pairs(tiny_model, batch4):
    with pytest.raises(ValueError, match=r"fwd_hooks: each entry must be a \(hook name, function\) pair"):
        tiny_model.run_with_hooks(batch4.tokens, fwd_hooks=[("blocks.0.hook_resid_pre",)])
    assert tiny_model.active_hook_count() == 0


def test_positional_permutation_sizes_are_checked_before_drawing(tiny_model):
    from tfmatcomp.interventions import PositionalPermutation

    with pytest.raises(ValueError, match="n_positions: at most 1,000,000"):
        PositionalPermutation(seed=0, n_positions=10**9)
    with pytest.raises(ValueError, match="n_positions: 17 is more than the model's 16 positions"):
        PositionalPermutation(seed=0, n_positions=17).permutation(tiny_model)


def test_geometry_positions_too_few_for_the_dropped_tokens_name_positions(tmp_path, capsys):
    from tfmatcomp.cli import main

    code = main(["geometry", str(tmp_path / "no-model"), str(tmp_path / "no-text"), "--positions",
                 "2", "-o", str(tmp_path / "g.html")])
    err = capsys.readouterr().err
    assert code == 2 and "n_positions (--positions): must be at least drop_first + 3 = 4" in err
