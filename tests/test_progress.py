"""One progress convention (tfmatcomp/_progress.py): every public function of
``tfmatcomp.experiments`` and ``tfmatcomp.analyses`` either draws a bar on stderr when called with
``progress=True``, or is listed in ``QUICK`` with the reason it needs none."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys

import pytest
import torch

import tfmatcomp as tm
import tfmatcomp.analyses
from tfmatcomp import _progress
from tfmatcomp.datapath import sample_batch

TASK = tm.TaskConfig(n_rows=4, rank=1)
#: tqdm's bar: "desc: 50%|#####     | 1/2 [...]"
BAR = re.compile(r"\d+%\|.*\| *\d+/\d+")

#: functions that need no bar, with the reason
QUICK = {
    "permutation_summary": "summarizes a table it is given",
    "nuclear_norm": "one batched SVD",
    "solve_nuclear_norm_torch": "batched: every matrix in one tensor loop of at most max_iter steps",
    "batch_losses": "arithmetic on given predictions",
    "model_predictions": "one chunked forward pass",
    "comparison_row": "arithmetic on given predictions",
    "check_problem": "checks arguments",
    "detect_drop": "reads a metrics log",
    "summarize_drops": "reads metrics logs",
    "reinitialize_component": "re-draws some weights",
    "run_seeds": "lists directories",
    "row_column_attention_mass": "a measure on one batch: one forward pass",
    "representation_collapse": "a measure on one batch: one forward pass",
    "copying": "a measure on one batch: one forward pass",
    "positional_rank": "a measure on one batch: one forward pass",
    "departure_step": "reads a table",
    "lead_times": "reads a table and a metrics log",
    "lead_time_summary": "summarizes a table",
    "llc_measure": "returns a measure; calling it runs llc, whose bar shows",
    "default_nbeta": "a formula",
    "L_mask": "a measure on one batch: one forward pass",
    "row_column_mass": "arithmetic on given patterns",
    "masked_pair_cosine": "arithmetic on given states",
    "pca": "one SVD",
    "value_grid": "a range of numbers",
    "token_embeddings": "an embedding lookup",
    "token_embedding_norms": "an embedding lookup",
    "token_embedding_pca": "an embedding lookup and one SVD",
    "positional_embedding_norms": "reads one weight",
    "positional_embedding_pca": "reads one weight and one SVD",
    "positional_similarity": "reads one weight",
    "checkpoint_token_projection": "embedding lookups; loading the checkpoints is the cost",
    "score_table": "returns text",
    "pattern_hook_names": "returns names",
    "attention_patterns": "one forward pass on the tokens given",
    "head_scores": "arithmetic on given patterns",
    "classify_heads": "labels a table",
    "label_head_groups": "groups a table",
    "paper_label": "formats a label",
    "ood_conditions": "lists conditions",
    "outside_fraction": "arithmetic on a batch",
    "hidden_states": "one chunked forward pass with a cache",
    "masked_row_targets": "arithmetic on a batch",
    "value_targets": "arithmetic on a batch",
    "top_singular_vector_targets": "one batched SVD",
    "fit_linear_probe": "one least-squares solve",
    "probe_metrics": "arithmetic",
    "split_matrices": "a permutation",
    "expand_grid": "lists configurations",
    "read_sweep": "reads files",
    "sweep_table": "reads files",
    "sweep": "trains: each run's bar is the training bar (progress=)",
    "with_interventions": "adds a column",
    "is_papers_model": "compares a config",
    "addition_accuracy": "one batched evaluation per operand length",
    "answer_accuracy": "arithmetic on given logits",
    "pydoc_data": "reads text",
    "randomize_tokens": "arithmetic on tokens",
    "randomized_sampler": "returns a sampler",
    "small_gpt_config": "returns a config",
    "text_hidden_states": "one forward pass on the texts given",
    "probe_text": "one forward pass and a least-squares fit per layer",
    "decomposition_text": "one forward pass and a decomposition per layer",
}


def _public_functions() -> dict[str, object]:
    mods = [importlib.import_module("tfmatcomp.experiments"), tfmatcomp.analyses]
    mods += [importlib.import_module(m.name)
             for m in pkgutil.walk_packages(tfmatcomp.analyses.__path__, "tfmatcomp.analyses.")]
    out = {}
    for mod in mods:
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if inspect.isfunction(obj):
                out[name] = obj
    return out


@pytest.fixture(scope="module")
def model():
    return tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, n_ctx=16),
                            seed=0).eval()


def _calls(model, tmp_path):
    """``{name: call}``: each long function with small inputs and ``progress=True``."""
    from tfmatcomp import experiments as E
    from tfmatcomp.analyses import baselines as B, heads as H, ood as O, probes as P
    import importlib as _il

    C = _il.import_module("tfmatcomp.analyses.dynamics.components")
    K = _il.import_module("tfmatcomp.analyses.dynamics.checkpoints")
    L = _il.import_module("tfmatcomp.analyses.dynamics.llc")
    F = _il.import_module("tfmatcomp.analyses.training_format")
    from tfmatcomp.analyses.dynamics.progress import copying

    batch = sample_batch(TASK, 8, seed=0)
    kw = dict(n_samples=4, progress=True)
    tiny_llc = L.LLCSettings(n_chains=2, n_draws=3, n_burnin=1, n_matrices=8, batch_size=4)
    return {
        "copying_check": lambda: E.copying_check(model, TASK, random_matrices=False, **kw),
        "attention_ablation": lambda: E.attention_ablation(model, TASK, **kw),
        "weight_transplant": lambda: E.weight_transplant(model, model, TASK, **kw),
        "positional_permutation": lambda: E.positional_permutation(model, TASK, **kw),
        "activation_patching": lambda: E.activation_patching(model, TASK, **kw),
        "head_group_ablation": lambda: E.head_group_ablation(model, TASK, groups="layers", **kw),
        "head_ablation_scan": lambda: E.head_ablation_scan(model, TASK, **kw),
        "attention_targets": lambda: E.attention_targets(model, TASK, batch_size=2, **kw),
        "attention_change": lambda: E.attention_change(model, model, TASK, **kw),
        "solve_nuclear_norm_cvxpy": lambda: B.solve_nuclear_norm_cvxpy(
            batch.values[:2], batch.observed[:2], 4, 4, progress=True),
        "complete_nuclear_norm": lambda: B.complete_nuclear_norm(batch[:2], method="cvxpy",
                                                                 progress=True),
        "compare_with_model": lambda: B.compare_with_model(model, (0.3,), task=TASK, **kw),
        "lambda_table": lambda: B.lambda_table((1e-3,), task=TASK, **kw),
        "train_component": lambda: C.train_component(model, "mlp", task_cfg=TASK, n_steps=2,
                                                     batch_size=4, log_every=1, progress=True),
        "component_training": lambda: C.component_training(
            model, ["mlp"], include_all=False, task_cfg=TASK, n_steps=2, batch_size=4,
            log_every=1, progress=True),
        "over_checkpoints": lambda: K.over_checkpoints("tiny", {"c": copying}, steps=[2000], **kw),
        "llc": lambda: L.llc(model, TASK, settings=tiny_llc, progress=True),
        "mean_attention_patterns": lambda: H.mean_attention_patterns(model, batch.tokens,
                                                                     batch_size=4, progress=True),
        "analyse_heads": lambda: H.analyse_heads(model, TASK, **kw),
        "head_score_evolution": lambda: H.head_score_evolution({0: model, 1: model}, TASK.build(),
                                                               **kw),
        "label_group_ablation": lambda: H.label_group_ablation(model, TASK, **kw),
        "evaluate_ood": lambda: O.evaluate_ood(model, TASK.build(), baseline=False, **kw),
        "probe_layers": lambda: P.probe_layers(model, batch, progress=True),
        "addition_experiment": lambda: F.addition_experiment(
            max_digits=2, n_layers=1, d_model=16, n_heads=2, n_steps=2, batch_size=4, n_eval=4,
            n_measure=8, settings=("carry",), progress=True),
        "randomization_experiment": lambda: F.randomization_experiment(
            n_positions=8, n_layers=1, d_model=16, n_heads=2, n_steps=2, batch_size=4,
            n_measure=8, max_documents=2, progress=True),
    }


def test_every_public_function_draws_a_bar_or_says_why_not(model, tmp_path, capsys):
    functions = _public_functions()
    calls = _calls(model, tmp_path)
    unlisted = sorted(set(functions) - set(QUICK) - set(calls))
    assert not unlisted, f"neither called nor listed as quick: {unlisted}"
    assert not set(QUICK) & set(calls)
    for name, call in calls.items():
        if name in functions:
            assert "progress" in inspect.signature(functions[name]).parameters, name
        call()
        err = capsys.readouterr().err
        assert BAR.search(err), f"{name}(progress=True) drew no bar on stderr: {err!r}"


def test_the_default_is_no_bar_under_pytest_or_in_a_pipe(model, capsys, monkeypatch):
    from tfmatcomp.experiments import attention_ablation

    attention_ablation(model, TASK, n_samples=4)
    assert capsys.readouterr().err == ""
    assert _progress.wanted(None) is False            # PYTEST_CURRENT_TEST is set
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    assert _progress.wanted(None) is False            # captured stderr is no terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert _progress.wanted(None) is True
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert _progress.wanted(None) is False
    assert _progress.wanted(True) is True and _progress.wanted(False) is False
    with pytest.raises(ValueError, match="progress"):
        attention_ablation(model, TASK, n_samples=4, progress="yes")


def test_an_inner_call_moves_the_outer_bar_within_its_step(model, capsys):
    from tfmatcomp.experiments import head_ablation_scan

    seen = []
    with _progress.bar(2, "report", progress=True) as outer:
        with outer.step("heads"):
            head_ablation_scan(model, TASK, n_samples=4)    # progress=None: moves "report"
            seen.append(outer._tqdm.n)
        seen.append(outer._tqdm.n)
    err = capsys.readouterr().err
    assert 0 < seen[0] < 1 and seen[1] == 1               # inside the step, then exactly one step
    assert "head ablation scan" in err and err.count("head ablation scan: ") == 0  # no bar of its own


def test_no_ipywidgets_warning_in_a_notebook(monkeypatch):
    import warnings

    monkeypatch.setattr(_progress, "in_notebook", lambda: True)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)   # as if the notebook extra were missing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cls = _progress._tqdm_class()
    from tqdm.std import tqdm

    assert cls is tqdm


def test_the_notebook_extra_brings_what_tqdm_and_attention_view_use():
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~ \[]", d)[0] for d in extras["notebook"]}
    assert {"ipywidgets", "circuitsvis"} <= names


def test_the_reports_bar_advances_inside_a_section(tmp_path, capsys):
    from tfmatcomp.report import build_report

    build_report("tiny", tmp_path / "r.html", n_samples=8, sections=["head_scan", "copying"],
                 progress=True)
    err = capsys.readouterr().err
    # inside the head_scan section the report's bar names the scan and its heads done so far
    assert re.search(r"report: .*head_scan · head ablation scan \d+/\d+", err), err[-2000:]
    assert re.search(r"report: 100%\|.*\| 2/2", err), err[-2000:]
