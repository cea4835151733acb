"""Activation patching X -> -X (the workshop paper Appendix J, the NeurIPS paper Appendix F).

Run the model on ``X`` and record ``hook_z`` (the heads' outputs before the output projection); run it
on ``-X`` (same mask) while writing the recorded values in, giving ``f_p(-X, X)``; compare with ``X``
and with ``-X`` at masked and at observed entries. If the heads carry what the model computes at
masked entries, ``f_p`` follows ``X`` there. Patched sites: all layers together (the papers' text),
and each layer alone (their code patched only the last). Rows with ``patched == "none"`` are the
plain run on ``-X``.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments import activation_patching
    >>> df = activation_patching(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=8)
    >>> sorted(set(df["patched"]))
    ['all', 'layer 0', 'layer 1', 'none']
"""

from __future__ import annotations

import pandas as pd

from tfmatcomp.datapath import ModelsLike, TaskLike, predict, resolve_models, sample_batch
from tfmatcomp.experiments.reference import PAPER_PATCHING, POST
from tfmatcomp.experiments.table import experiment_table
from tfmatcomp.interventions import ActivationPatch, SampledBatch, to_json
from tfmatcomp.task.metrics import mse

__all__ = ["activation_patching"]


def activation_patching(
    models: ModelsLike,
    task: TaskLike = None,
    *,
    hook: str = "attn.hook_z",
    per_layer: bool = True,
    n_samples: int = 256,
    seed: int = 0,
    batch_size: int = 256,
) -> pd.DataFrame:
    """``MSE(f_p, X)`` and ``MSE(f_p, -X)`` at masked and observed entries, for patched layer sets.

    Args:
        models, task, n_samples, seed, batch_size: the experiments' common arguments
            (:mod:`tfmatcomp.experiments`). ``seed`` seeds ``X`` (``-X`` has the same mask).
        hook: the block-relative hook patched in each layer (default ``"attn.hook_z"``, the papers').
        per_layer: also patch each layer alone.

    Returns:
        Rows per (model, patched, entries): ``patched`` (``"none"``, ``"all"`` or ``"layer l"``,
        0-based), ``entries`` (``"masked"`` / ``"observed"``), ``mse_to_X``, ``mse_to_neg_X``,
        ``paper_4l8h_mse_to_X``, ``paper_4l8h_mse_to_neg_X`` (all layers, masked, post-shift),
        ``intervention``: the JSON of the patch, run on ``-X`` (None for ``"none"``); its source is
        the seeded batch ``X`` (``SampledBatch(task, n_samples, seed)``), so the record is small.
        Run chunk by chunk, each chunk is patched from the same rows of ``X``, which is the same.
    """
    named, task = resolve_models(models, task)
    rows = []
    for label, model in named.items():
        x = sample_batch(task, n_samples, seed, model.device)
        neg = x.negated()
        sites = [("none", None), ("all", None)]
        if per_layer:
            sites += [(f"layer {l}", [l]) for l in range(model.cfg.n_layers)]
        for patched, layers in sites:
            record = None if patched == "none" else ActivationPatch(_source(task, x, n_samples, seed),
                                                                     hooks=hook, layers=layers)
            if patched == "none":
                iv = None
            else:
                # the chunk of -X being run; its source is the matching chunk of X (same rows)
                def iv(chunk, layers=layers):
                    return ActivationPatch(chunk.negated(), hooks=hook, layers=layers)
            f_p = predict(model, neg, iv, batch_size)
            for entries, where in (("masked", x.masked), ("observed", x.observed)):
                ref = PAPER_PATCHING.get(entries, {}) if (
                    label == POST and patched == "all" and hook == "attn.hook_z") else {}
                rows.append({"model": label, "patched": patched, "entries": entries,
                             "mse_to_X": float(mse(f_p, x.values, where)),
                             "mse_to_neg_X": float(mse(f_p, neg.values, where)),
                             "paper_4l8h_mse_to_X": ref.get("mse_to_X", float("nan")),
                             "paper_4l8h_mse_to_neg_X": ref.get("mse_to_neg_X", float("nan")),
                             "intervention": to_json(record)})
    return experiment_table(rows, experiment="activation patching X -> -X", hook=hook,
                            n_samples=n_samples, seed=seed, layers_convention="0-based",
                            target="-X: the batch of the source, negated (same mask)")


def _source(task, x, n_samples: int, seed: int):
    """The patch's source as data: the seeded batch X, or its tokens when the task cannot be
    written as a TaskConfig (another tokenizer)."""
    try:
        return SampledBatch(task, n_samples, seed)
    except ValueError:
        return x.tokens.cpu()
