"""Component-wise training (the NeurIPS paper Sec. 4, Fig. 8).

**Component-wise training.** :func:`train_component` takes a trained model (or checkpoint),
re-initializes one component group with the model's own initialization (a fresh
:class:`~tfmatcomp.HookedEncoder` built from an explicit seed / generator, whose parameters in the
group are copied over), freezes everything else and trains the group with
:func:`tfmatcomp.train`, which logs the usual metrics. The groups are those of
:mod:`tfmatcomp.models.param_groups` (shared with weight transplants: :data:`~tfmatcomp.models.param_groups.GROUPS`),
which follow HuggingFace BERT's modules: ``attention`` (alias ``attn``: Q, K, V, O and the
LayerNorm after attention), ``mlp`` (both MLP layers and the LayerNorm after them),
``token_embed`` (``W_E``), ``pos_embed`` (``W_pos``), plus ``embed`` (all embedding parameters
including their LayerNorm), ``all`` and the finer groups used by transplants.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from tfmatcomp._progress import wanted
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.models.objectives import model_kind
from tfmatcomp.interventions.during_training import Freeze, Reinitialize
from tfmatcomp.models.param_groups import group_parameter_names
from tfmatcomp.validation import is_int

__all__ = ["PAPER_COMPONENTS", "reinitialize_component", "train_component", "component_training"]

#: The four groups of the NeurIPS paper, Fig. 8.
PAPER_COMPONENTS: tuple[str, ...] = ("attention", "mlp", "token_embed", "pos_embed")


@torch.no_grad()
def reinitialize_component(
    model: HookedEncoder,
    group: str | Sequence[str],
    seed: int | torch.Generator = 0,
) -> HookedEncoder:
    """A copy of ``model`` whose ``group`` parameters are freshly initialized.

    The fresh values come from the model's own initialization: a new ``HookedEncoder(model.cfg)``
    initialized from ``seed`` (an int, or an explicit CPU ``torch.Generator`` passed to
    ``init_weights``), whose parameters in the group are copied over. Every other parameter is
    copied bit for bit. ``model`` itself is not modified.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4), seed=0)
        >>> r = reinitialize_component(m, "mlp", seed=1)
        >>> torch.equal(r.embed.W_E, m.embed.W_E), torch.equal(r.blocks[0].mlp.W_in, m.blocks[0].mlp.W_in)
        (True, False)
    """
    if model_kind(model) != "encoder":
        raise ValueError(f"model: expected a HookedEncoder, got {type(model).__name__}")
    names = set(group_parameter_names(model, group))
    if not names:
        raise ValueError(f"group: {group!r} selects no parameter of this model")
    if isinstance(seed, torch.Generator):
        fresh = HookedEncoder(model.cfg, seed=0)
        fresh.init_weights(seed)
    elif is_int(seed):
        fresh = HookedEncoder(model.cfg, seed=seed)
    else:
        raise ValueError(f"seed: expected an int or a torch.Generator, got {type(seed).__name__}")
    out = HookedEncoder(model.cfg, seed=0).to(device=model.device, dtype=model.dtype)
    fresh_params = dict(fresh.named_parameters())
    for name, p in out.named_parameters():
        src = fresh_params[name] if name in names else model.get_parameter(name)
        p.copy_(src.to(device=p.device, dtype=p.dtype))
    out.train(model.training)
    return out


def _load_source(source, task_cfg, train_cfg):
    if model_kind(source) == "encoder":
        return source, task_cfg, train_cfg
    if isinstance(source, (str, os.PathLike)):
        from tfmatcomp.runs.checkpoint import load_checkpoint_info

        model, info = load_checkpoint_info(source)
        return model, task_cfg or info.task_cfg, train_cfg or info.train_cfg
    raise ValueError(f"source: expected a HookedEncoder or a checkpoint path, got {type(source).__name__}")


def train_component(
    source: HookedEncoder | str | os.PathLike,
    group: str | Sequence[str],
    *,
    reinit_seed: int | torch.Generator = 0,
    task_cfg=None,
    train_cfg=None,
    preset: str = "tiny",
    out_dir: str | os.PathLike | None = None,
    device: torch.device | str | None = None,
    progress: bool | None = None,
    **train_overrides: Any,
):
    """Re-initialize ``group`` of a trained model, freeze the rest, and train the group.

    One case of the interventions during training: the run is :func:`tfmatcomp.train` from the
    trained model with ``interventions=[Reinitialize(group, step=0, seed=reinit_seed),
    Freeze("all", except_groups=group)]`` (:mod:`tfmatcomp.config`), recorded in its
    ``run.json`` and checkpoints like any run's, so it resumes like any run.

    Args:
        source: the trained model or a checkpoint path (its task and training configs are then
            the defaults). The source model is not modified.
        group: a component group (see :data:`tfmatcomp.models.param_groups.GROUPS`) or several.
        reinit_seed: seed of the fresh initialization of the group (the model's own
            initialization, as :func:`reinitialize_component` draws it from an int seed); a CPU
            generator gives the seed as its next random integer.
        task_cfg, train_cfg: override the checkpoint's configs (required for a model without a
            checkpoint unless ``preset`` has the right ones).
        preset: fallback preset for configs the source does not give.
        out_dir: run directory for the metrics log (``metrics.jsonl``) and checkpoints.
        train_overrides: TrainConfig fields, e.g. ``n_steps=2000, log_every=20, seed=0``.

    Returns:
        The :class:`tfmatcomp.training.trainer.TrainResult` of :func:`tfmatcomp.train` (``.metrics`` has
        the usual columns; ``.model`` the trained model).

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
        >>> r = train_component(m, "pos_embed", task_cfg=tm.TaskConfig(n_rows=4, rank=1),
        ...                     n_steps=4, batch_size=8, log_every=2, device="cpu")
        >>> list(r.metrics["step"])
        [2, 4]
    """
    from tfmatcomp.training.trainer import train

    model, task_cfg, train_cfg = _load_source(source, task_cfg, train_cfg)
    groups = [group] if isinstance(group, str) else list(group)
    group_parameter_names(model, groups)  # an unknown group fails here, naming it
    if isinstance(reinit_seed, torch.Generator):
        reinit_seed = int(torch.randint(2**62, (1,), generator=reinit_seed))
    elif not is_int(reinit_seed):
        raise ValueError(f"reinit_seed: expected an int or a torch.Generator, got "
                         f"{type(reinit_seed).__name__}")
    interventions = [Reinitialize(groups, step=0, seed=int(reinit_seed)),
                     Freeze("all", except_groups=groups)]
    if "all" in groups:
        interventions.pop()  # nothing is frozen: normal training from a fresh model
    return train(preset, model=copy.deepcopy(model), task_cfg=task_cfg, train_cfg=train_cfg,
                 out_dir=out_dir, device=device, progress=wanted(progress), interventions=interventions,
                 **train_overrides)


def component_training(
    source: HookedEncoder | str | os.PathLike,
    groups: Sequence[str] = PAPER_COMPONENTS,
    *,
    include_all: bool = True,
    reinit_seed: int = 0,
    out_dir: str | os.PathLike | None = None,
    progress: bool | None = None,
    **options: Any,
) -> pd.DataFrame:
    """The NeurIPS paper Fig. 8: train each group alone (others frozen at their trained values).

    Each group gets the same ``reinit_seed`` and the same training seed (``seed=`` in ``options``),
    so runs differ only in what is trainable. With ``include_all`` a run that re-initializes and
    trains every parameter (the paper's "All components", i.e. normal training) is added.

    Args:
        source, options: as :func:`train_component` (``n_steps=``, ``log_every=``, ...).
        out_dir: if given, each run logs to ``out_dir/<group>/``.
        progress: each run's training bar (None: when watched; :mod:`tfmatcomp._progress`).

    Returns:
        The concatenated metrics logs with a ``component`` column.

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, n_ctx=16))
        >>> df = component_training(m, ["mlp"], task_cfg=tm.TaskConfig(n_rows=4, rank=1),
        ...                         n_steps=2, batch_size=4, log_every=1, device="cpu")
        >>> sorted(set(df["component"]))
        ['all', 'mlp']
    """
    model, task_cfg, train_cfg = _load_source(source, options.pop("task_cfg", None),
                                              options.pop("train_cfg", None))
    names = list(groups) + (["all"] if include_all and "all" not in groups else [])
    frames = []
    for g in names:
        run_dir = Path(out_dir) / g if out_dir is not None else None
        res = train_component(model, g, reinit_seed=reinit_seed, task_cfg=task_cfg,
                              train_cfg=train_cfg, out_dir=run_dir, progress=progress, **options)
        df = res.metrics.copy()
        df.insert(0, "component", g)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
