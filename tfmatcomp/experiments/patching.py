"""Activation patching X -> -X (the workshop paper Appendix J, the NeurIPS paper Appendix F).

Run the model on ``X`` and record ``hook_z`` (the heads' outputs before the output projection); run it
on ``-X`` (same mask) while writing the recorded values in, giving ``f_p(-X, X)``; compare with ``X``
and with ``-X`` at masked and at observed entries. If the heads carry what the model computes at
masked entries, ``f_p`` follows ``X`` there. Patched sites: all layers together (the papers' text),
each layer alone (their code patched only the last), and with ``per_head=True`` each head alone
(``layers=[l], heads=[h]`` of the same :class:`~tfmatcomp.interventions.ActivationPatch`). Rows with
``patched == "none"`` are the plain run on ``-X``.

True by construction. At a masked position the ``X`` and ``-X`` runs read the same token (MASK)
and the same position, and attention is the only place where positions mix; writing every head's
``hook_z`` of every layer from ``X`` therefore makes every masked position's residual stream, and
so its output, exactly ``f(X)``'s, for **any** encoder, trained or not. The ``"all"`` row at
masked entries (and a one-layer model's layer row, a one-head layer's head row) shows only that;
column ``by_construction`` marks such rows. The per-layer and per-head rows are the informative
ones: which part of the attention alone carries the completion. (A residual-stream hook, e.g.
``"hook_resid_pre"``, makes every patched row true by construction at every entry.)

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.experiments import activation_patching
    >>> df = activation_patching(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny", n_samples=8)
    >>> sorted(set(df["patched"]))
    ['all', 'layer 0', 'layer 1', 'none']
    >>> df[df["by_construction"]][["patched", "entries"]].values.tolist()
    [['all', 'masked']]
    >>> heads = activation_patching(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny",
    ...                             n_samples=8, per_head=True)
    >>> heads[heads["head"].notna()]["patched"].unique()[:2].tolist()
    ['head (0, 0)', 'head (0, 1)']
"""

from __future__ import annotations

import pandas as pd

from tfmatcomp.datapath import ModelsLike, TaskLike, predict, resolve_models, sample_batch
from tfmatcomp.experiments.reference import PAPER_PATCHING, POST
from tfmatcomp.experiments.table import experiment_table, is_papers_model
from tfmatcomp._progress import bar, check_progress
from tfmatcomp.interventions import ActivationPatch, SampledBatch, to_json
from tfmatcomp.interventions.sites import check_hook_list, head_axis
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.models.objectives import model_kind
from tfmatcomp.task.metrics import mse

__all__ = ["activation_patching", "patched_by_construction"]

#: Hooks whose every-head, every-layer patch fixes the attention output at every position.
_ATTENTION_OUTPUT = ("hook_z", "hook_result", "hook_attn_out")
#: Hooks that carry the whole residual stream of a position: patching one fixes everything after.
_RESIDUAL = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")


def patched_by_construction(model, hook: str, layers: list[int] | None, heads: list[int] | None,
                            entries: str) -> bool:
    """Whether patching ``hook`` at ``layers`` / ``heads`` (None: all) from ``X`` into the run on
    ``-X`` gives ``f(X)`` at ``entries`` (``"masked"`` / ``"observed"``) for **any** weights.

    True for an encoder (:class:`~tfmatcomp.HookedEncoder`, which reads each entry at its own
    position) when the patch covers every head of every layer of an attention-output hook
    (``attn.hook_z``, ``attn.hook_result``, ``hook_attn_out``) and ``entries`` is ``"masked"``
    (both runs read MASK there, and attention is the only place positions mix), or when it patches
    a residual-stream hook (``hook_resid_pre`` / ``_mid`` / ``_post``) of any layer (at every
    entry). False otherwise, including every decoder, whose sequence carries the values.

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_mlp=8, n_ctx=4))
        >>> patched_by_construction(m, "attn.hook_z", None, None, "masked")
        True
        >>> patched_by_construction(m, "attn.hook_z", [1], None, "masked")
        False
    """
    if entries not in ("masked", "observed"):
        raise ValueError(f"entries: must be 'masked' or 'observed', got {entries!r}")
    if model_kind(model) != "encoder":
        return False
    name = hook.rsplit(".", 1)[-1]
    if name in _RESIDUAL:
        return True
    if name not in _ATTENTION_OUTPUT or entries != "masked":
        return False
    cfg = model.cfg
    if hook.startswith("blocks."):  # a full name: that one layer
        every_layer = cfg.n_layers == 1
    else:
        every_layer = layers is None or set(layers) >= set(range(cfg.n_layers))
    every_head = heads is None or set(heads) >= set(range(cfg.n_heads))
    return every_layer and every_head


def activation_patching(
    models: ModelsLike,
    task: TaskLike = None,
    *,
    hook: str = "attn.hook_z",
    per_layer: bool = True,
    per_head: bool = False,
    n_samples: int = 256,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool | None = None,
) -> pd.DataFrame:
    """``MSE(f_p, X)`` and ``MSE(f_p, -X)`` at masked and observed entries, for patched layer / head sets.

    Args:
        models, task, n_samples, seed, batch_size: the experiments' common arguments
            (:mod:`tfmatcomp.experiments`). ``seed`` seeds ``X`` (``-X`` has the same mask).
        hook: the block-relative hook patched in each layer (default ``"attn.hook_z"``, the papers').
        per_layer: also patch each layer alone.
        per_head: also patch each head alone (``n_layers * n_heads`` more rows per entry kind;
            ``hook`` must have a head axis, e.g. ``attn.hook_z``, ``attn.hook_v``).
        progress: a bar over the patches (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        Rows per (model, patched, entries): ``patched`` (``"none"``, ``"all"``, ``"layer l"`` or
        ``"head (l, h)"``, 0-based), ``layer`` and ``head`` (the patched layer / head, 0-based;
        None where the row patches no one layer / head), ``entries`` (``"masked"`` /
        ``"observed"``), ``mse_to_X``, ``mse_to_neg_X``, ``by_construction`` (True where the row
        equals ``f(X)`` for any weights, so shows nothing about the model:
        :func:`patched_by_construction`; the ``"all"`` rows at masked entries for ``hook_z``),
        ``paper_4l8h_mse_to_X``, ``paper_4l8h_mse_to_neg_X`` (the papers' model only: all layers,
        masked, post-shift). ``df.attrs["interventions"]``: each row's patch as JSON, run on
        ``-X`` (None for ``"none"``); its source is the seeded batch ``X`` (``SampledBatch(task, n_samples, seed)``), so the record is small.
        Run chunk by chunk, each chunk is patched from the same rows of ``X``, which is the same.

    Raises:
        ValueError: ``per_layer`` / ``per_head`` not a bool, ``hook`` not a hook name, or
            ``per_head`` with a hook that has no head axis.
    """
    for name, flag in (("per_layer", per_layer), ("per_head", per_head)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}: must be True or False, got {flag!r}")
    if not isinstance(hook, str):
        raise ValueError(f"hook: expected one hook name such as 'attn.hook_z', got {hook!r}")
    check_hook_list(hook, "hook")
    if per_head and head_axis(hook) is None:
        raise ValueError(f"per_head: hook {hook!r} has no head axis; per-head patches need one of "
                         "attn.hook_q / hook_k / hook_v / hook_z / hook_attn_scores / hook_pattern")
    check_progress(progress)
    named, task = resolve_models(models, task)
    rows = []
    total = sum(2 + per_layer * m.cfg.n_layers + per_head * m.cfg.n_layers * m.cfg.n_heads
                for m in named.values())
    with bar(total, "activation patching", progress) as b:
        for label, model in named.items():
            _patch_rows(rows, label, model, task, hook, per_layer, per_head, n_samples, seed,
                        batch_size, b)
    df = experiment_table(rows, experiment="activation patching X -> -X", hook=hook,
                          n_samples=n_samples, seed=seed, layers_convention="0-based",
                          target="-X: the batch of the source, negated (same mask)",
                          by_construction=("at masked positions X and -X read the same input, so "
                                           "patching every head of every layer gives f(X) there "
                                           "for any model"))
    for col in ("layer", "head"):
        df[col] = df[col].astype("Int64")
    return df


def _patch_rows(rows, label, model, task, hook, per_layer, per_head, n_samples, seed, batch_size, b):
    """Append the rows of one model to ``rows``, moving the bar ``b`` once per patch."""
    x = sample_batch(task, n_samples, seed, model.device)
    neg = x.negated()
    # (patched, layers, heads): None patches all of them
    sites: list[tuple[str, list[int] | None, list[int] | None]] = [("none", None, None),
                                                                    ("all", None, None)]
    if per_layer:
        sites += [(f"layer {l}", [l], None) for l in range(model.cfg.n_layers)]
    if per_head:
        sites += [(f"head ({l}, {h})", [l], [h]) for l in range(model.cfg.n_layers)
                  for h in range(model.cfg.n_heads)]
    for patched, layers, heads in sites:
        record = None if patched == "none" else ActivationPatch(
            _source(task, x, n_samples, seed), hooks=hook, layers=layers, heads=heads)
        if patched == "none":
            iv = None
        else:
            # the chunk of -X being run; its source is the matching chunk of X (same rows)
            def iv(chunk, layers=layers, heads=heads):
                return ActivationPatch(chunk.negated(), hooks=hook, layers=layers, heads=heads)
        f_p = predict(model, neg, iv, batch_size)
        for entries, where in (("masked", x.masked), ("observed", x.observed)):
            ref = PAPER_PATCHING.get(entries, {}) if (
                label == POST and patched == "all" and hook == "attn.hook_z"
                and is_papers_model(model)) else {}
            rows.append({"model": label, "patched": patched,
                         "layer": layers[0] if layers is not None else None,
                         "head": heads[0] if heads is not None else None,
                         "entries": entries,
                         "mse_to_X": float(mse(f_p, x.values, where)),
                         "mse_to_neg_X": float(mse(f_p, neg.values, where)),
                         "by_construction": patched != "none" and patched_by_construction(
                             model, hook, layers, heads, entries),
                         "paper_4l8h_mse_to_X": ref.get("mse_to_X", float("nan")),
                         "paper_4l8h_mse_to_neg_X": ref.get("mse_to_neg_X", float("nan")),
                         "intervention": to_json(record)})
        b.update()


def _source(task, x, n_samples: int, seed: int):
    """The patch's source as data: the seeded batch X, or its tokens when the task cannot be
    written as a TaskConfig (another tokenizer)."""
    try:
        return SampledBatch(task, n_samples, seed)
    except ValueError:
        return x.tokens.cpu()
