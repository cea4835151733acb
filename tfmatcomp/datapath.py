"""The library's one data path: models in, a seeded batch, a chunked forward, losses out.

Every analysis walks the same steps::

    load_model / resolve_models      a HookedEncoder, a checkpoint or run directory -> model(s)
    sample_batch                     task.sample(n, generator=CPU Generator().manual_seed(seed)) -> device
    run_chunked / iter_chunks        model(tokens) batch_size matrices at a time, optionally with
                                     fwd_hooks, an Intervention, or names to cache
    losses(..., as_floats=True)      tfmatcomp.losses: L, L_obs, L_mask, mean_abs_pred_mask as floats

Both model kinds walk it: :func:`model_tokens` is what a model reads for a batch (the batch's
tokens for a :class:`~tfmatcomp.HookedEncoder`; for a :class:`~tfmatcomp.HookedDecoder` the GPT
sequence of :mod:`tfmatcomp.task.gpt`: prompt, SEP, values), and a decoder's predictions are its
teacher-forced arg-max values at the matrix entries (:func:`tfmatcomp.task.gpt.predicted_values`),
``[batch, n_rows * n_cols]`` like the encoder's, so losses, interventions and experiments are
the same code for both.

Conventions (also in docs/concepts/conventions.md): ``n_samples`` is how many matrices, ``batch_size``
how many go through one forward pass (a memory bound only: results do not depend on it beyond float
rounding), ``seed`` an int that seeds a CPU ``torch.Generator`` (so a seed gives the same matrices on
every device), ``generator`` an explicit generator passed instead of a seed. Hook names come from
:mod:`tfmatcomp.models.hook_names`.

Forward passes run under ``torch.no_grad()``. Without hooks or cache names a chunk runs as the plain
``model(tokens)`` (the fused kernels); with cache names it runs ``model.run_with_cache(...,
names_filter=names)``, exactly as an analysis calling it directly would.

Precision (:func:`inference_bf16`): a forward pass that returns only predictions (no cache names)
of an encoder with ``d_model >= 256`` on a CPU with bf16 matrix units runs under bf16 autocast,
three to five times faster there; the predictions come back float32 and every loss is computed in
float32 from them (bf16 moves an ``L_mask`` by about 1e-4 at most on the 4L8H d 256 models this
was measured on). Cached activations are always float32. ``bf16=False`` forces float32.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.datapath import run_chunked, sample_batch
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> batch = sample_batch(tm.get_preset("tiny").task.build(), 5, seed=0)
    >>> preds, cache = run_chunked(model, batch, batch_size=2, names=["blocks.0.attn.hook_pattern"])
    >>> preds.shape, cache["blocks.0.attn.hook_pattern"].shape
    (torch.Size([5, 16]), torch.Size([5, 4, 16, 16]))
    >>> sorted(tm.losses(preds, batch, as_floats=True))
    ['L', 'L_mask', 'L_obs', 'mean_abs_pred_mask']
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tfmatcomp.config import TaskConfig, get_preset
from tfmatcomp.task.data import MatrixBatch, MatrixCompletionTask, MatrixMixtureTask
from tfmatcomp.task.metrics import losses
from tfmatcomp.models.decoder import HookedDecoder
from tfmatcomp.task.gpt import predicted_values
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.models.objectives import model_kind
from tfmatcomp.models.objectives import objective_for
from tfmatcomp.validation import check_positive_int

__all__ = [
    "ModelLike", "ModelsLike", "TaskLike", "Inputs", "InterventionLike", "Chunk",
    "load_model", "load_model_info", "load_checkpoints", "resolve_models", "resolve_task",
    "sample_batch", "model_tokens", "positions_needed", "iter_chunks", "run_chunked", "predict",
    "inference_bf16", "per_size_losses",
]

ModelLike = Union[HookedEncoder, HookedDecoder, str, os.PathLike]
ModelsLike = Union[ModelLike, Mapping[str, ModelLike]]
TaskLike = Union[MatrixCompletionTask, MatrixMixtureTask, TaskConfig, str, None]
Inputs = Union[MatrixBatch, Int[Tensor, "batch pos"]]
#: None, an Intervention (anything with ``.applied(model)``), or a function of the chunk returning one.
InterventionLike = Any


# ------------------------------------------------------------------------------------- models
def load_model_info(model: ModelLike, device: torch.device | str | None = None
                    ) -> tuple[HookedEncoder, TaskConfig | None, str]:
    """``(model, task config or None, label)`` for a model or a checkpoint / run directory.

    A model's task config is its ``task_cfg`` (None for a fresh model). A model is moved to ``device`` (when given) and labelled ``"model"``; a path is loaded with
    :func:`tfmatcomp.runs.checkpoint.load_checkpoint_info` and labelled ``"step N"``.

    Example:
        >>> import tfmatcomp as tm
        >>> m, cfg, label = load_model_info(tm.HookedEncoder(tm.get_preset("tiny").model))
        >>> cfg, label
        (None, 'model')
    """
    if model_kind(model) is not None:
        return (model if device is None else model.to(device)), model.task_cfg, "model"
    if isinstance(model, (str, os.PathLike)):
        from tfmatcomp.runs.checkpoint import load_checkpoint_info

        m, info = load_checkpoint_info(model, device=device)
        label = f"step {info.step}" if info.step is not None else str(model)
        return m, info.task_cfg, label
    raise TypeError(f"models: expected a HookedEncoder or HookedDecoder, a checkpoint path, or a mapping of them, "
                    f"got {type(model).__name__}")


def load_model(model: ModelLike, device: torch.device | str | None = None) -> HookedEncoder:
    """A :class:`~tfmatcomp.HookedEncoder` from itself or a checkpoint / run directory.

    Example:
        >>> import tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.get_preset("tiny").model)
        >>> load_model(m) is m
        True
    """
    return load_model_info(model, device)[0]


def load_checkpoints(checkpoints, device: torch.device | str | None = None) -> dict[int, HookedEncoder]:
    """Checkpoints as ``{step: HookedEncoder}``, sorted by step.

    Accepts a dict ``step -> HookedEncoder | path``, a list of checkpoint paths, or a run directory
    (its ``checkpoints/step_*`` folders). Paths are loaded with
    :func:`tfmatcomp.runs.checkpoint.load_checkpoint_info` (the step is read from the checkpoint's metadata).

    Example:
        >>> from tfmatcomp import HookedEncoder, EncoderConfig
        >>> m = HookedEncoder(EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> list(load_checkpoints({20: m, 10: m}))
        [10, 20]
    """
    if isinstance(checkpoints, (str, Path)):
        from tfmatcomp.runs.checkpoint import list_checkpoints

        if not Path(checkpoints).exists():
            raise ValueError(f"checkpoints: {str(checkpoints)!r} does not exist (a bundled run's "
                             f"directory is tfmatcomp.pretrained.run_dir(name))")
        checkpoints = list_checkpoints(checkpoints)
    out: dict[int, HookedEncoder] = {}
    if isinstance(checkpoints, Mapping):
        for step, m in checkpoints.items():
            out[int(step)] = load_model(m, device) if isinstance(m, (str, Path)) else m
    else:
        from tfmatcomp.runs.checkpoint import load_checkpoint_info

        for path in checkpoints:
            model, info = load_checkpoint_info(path, device=device)
            if info.step is None:
                raise ValueError(f"checkpoints: {path} has no step in its metadata; pass a dict "
                                 "step -> path instead")
            out[int(info.step)] = model
    if not out:
        raise ValueError("checkpoints: need at least one checkpoint")
    return dict(sorted(out.items()))


def resolve_task(task: TaskLike, found: Sequence[TaskConfig | None] | None = None) -> MatrixCompletionTask:
    """A :class:`~tfmatcomp.MatrixCompletionTask` from a task, a task config, a preset name, or (when
    None) the first task config found in the checkpoints.

    Example:
        >>> resolve_task("tiny").n_rows
        4
    """
    if isinstance(task, (MatrixCompletionTask, MatrixMixtureTask)):
        return task
    if isinstance(task, TaskConfig):
        return task.build()
    if isinstance(task, str):
        return get_preset(task).task.build()
    if task is None:
        for cfg in found or []:
            if cfg is not None:
                return cfg.build()
        raise ValueError("task: give a MatrixCompletionTask, a TaskConfig or a preset name (the "
                         "models carry no task config)")
    raise TypeError(f"task: expected a MatrixCompletionTask, TaskConfig or preset name, got "
                    f"{type(task).__name__}")


def resolve_models(
    models: ModelsLike,
    task: TaskLike = None,
    device: torch.device | str | None = None,
) -> tuple[dict[str, HookedEncoder], MatrixCompletionTask]:
    """``({label: model}, task)`` from the experiments' ``models`` and ``task`` arguments.

    A single model is labelled ``"model"``, a single checkpoint ``"step N"``.

    Raises:
        ValueError: no task could be found, or the task needs more positions than a model has.

    Example:
        >>> import tfmatcomp as tm
        >>> models, task = resolve_models(tm.HookedEncoder(tm.get_preset("tiny").model), "tiny")
        >>> list(models), task.n_rows
        (['model'], 4)
    """
    items = models.items() if isinstance(models, Mapping) else [(None, models)]
    out: dict[str, HookedEncoder] = {}
    found: list[TaskConfig | None] = []
    for label, m in items:
        model, task_cfg, default = load_model_info(m, device)
        out[str(label) if label is not None else default] = model
        found.append(task_cfg)
    if not out:
        raise ValueError("models: give at least one model")
    task = resolve_task(task, found)
    for label, model in out.items():
        if positions_needed(model, task.n_positions) > model.cfg.n_ctx:
            raise ValueError(f"task: {task.n_rows}x{task.n_cols} matrices need "
                             f"{positions_needed(model, task.n_positions)} positions but model "
                             f"{label!r} has n_ctx {model.cfg.n_ctx}")
    return out, task


# ------------------------------------------------------------------------------------ samples
def sample_batch(
    task: MatrixCompletionTask | TaskConfig | str,
    n_samples: int,
    seed: int | None = None,
    device: torch.device | str | None = None,
    *,
    generator: torch.Generator | None = None,
    observed: Tensor | None = None,
) -> MatrixBatch:
    """``n_samples`` matrices of ``task``, drawn on the CPU and moved to ``device``.

    Args:
        task: a task, a task config or a preset name.
        n_samples: how many matrices.
        seed: seeds a fresh CPU ``torch.Generator`` (default 0), so a seed gives the same matrices
            on every device.
        device: where the batch goes (default: stays on the CPU / the generator's device).
        generator: an explicit generator instead of ``seed`` (it advances; give one or the other).
        observed: a fixed mask ``[pos]`` or ``[n_samples, pos]`` (see :mod:`tfmatcomp.task.masks`) instead
            of the task's random masks.

    Example:
        >>> a = sample_batch("tiny", 3, seed=0)
        >>> b = sample_batch("tiny", 3, generator=torch.Generator().manual_seed(0))
        >>> a.tokens.shape, bool((a.tokens == b.tokens).all())
        (torch.Size([3, 16]), True)
    """
    check_positive_int("n_samples", n_samples)
    if generator is not None and seed is not None:
        raise ValueError("seed, generator: give one or the other, not both")
    if generator is None:
        generator = torch.Generator().manual_seed(int(0 if seed is None else seed))
    task = resolve_task(task)
    batch = task.sample(n_samples, generator=generator, observed=observed)
    return batch if device is None else batch.to(device)


def positions_needed(model, n_positions: int) -> int:
    """Positions ``model`` needs for matrices of ``n_positions`` entries: as many for an encoder,
    ``2 n_positions + 1`` for a decoder (prompt, SEP, values).

    Example:
        >>> import tfmatcomp as tm
        >>> positions_needed(tm.HookedDecoder(tm.DecoderConfig(d_model=8, d_mlp=8, n_ctx=33)), 16)
        33
    """
    return objective_for(model).positions_needed(n_positions)


def model_tokens(model, inputs: Inputs) -> Int[Tensor, "batch seq"]:
    """The token ids ``model`` reads for ``inputs``: a batch's tokens for an encoder, its GPT
    sequence (:func:`tfmatcomp.task.gpt.encode_sequence`) for a decoder; token ids pass through.

    Example:
        >>> import tfmatcomp as tm
        >>> b = sample_batch("tiny", 2, seed=0)
        >>> dec = tm.HookedDecoder(tm.DecoderConfig(d_model=8, d_mlp=8, n_ctx=33))
        >>> model_tokens(dec, b).shape, model_tokens(dec, b.tokens).shape
        (torch.Size([2, 33]), torch.Size([2, 16]))
    """
    return objective_for(model).model_tokens(inputs) if isinstance(inputs, MatrixBatch) else inputs


# ------------------------------------------------------------------------------------ forward
@dataclass(frozen=True)
class Chunk:
    """One chunk of a chunked forward pass (see :func:`iter_chunks`).

    Attributes:
        start: index of the chunk's first matrix in the whole input.
        inputs: the chunk, a :class:`~tfmatcomp.MatrixBatch` or tokens, on the model's device.
        predictions: ``model(tokens)`` of the chunk, or None with ``return_predictions=False``.
        cache: the cached activations of the chunk by hook name (empty without ``names``).
    """

    start: int
    inputs: Inputs
    predictions: Tensor | None
    cache: dict[str, Tensor]

    @property
    def tokens(self) -> Int[Tensor, "chunk pos"]:
        """The chunk's token ids."""
        return self.inputs.tokens if isinstance(self.inputs, MatrixBatch) else self.inputs


def _intervention_for(intervention: InterventionLike, chunk: Inputs):
    if callable(intervention) and not hasattr(intervention, "applied"):
        return intervention(chunk)
    return intervention


@torch.no_grad()
def iter_chunks(
    model: HookedEncoder | HookedDecoder,
    inputs: Inputs,
    *,
    batch_size: int = 256,
    names: Sequence[str] | None = None,
    fwd_hooks: Sequence[tuple[str, Callable]] = (),
    intervention: InterventionLike = None,
    return_predictions: bool = True,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    bf16: bool | None = None,
) -> Iterator[Chunk]:
    """Run ``model`` on ``inputs`` ``batch_size`` matrices at a time, yielding each :class:`Chunk`.

    For analyses that accumulate over chunks (mean attention maps, head scores) instead of keeping
    every activation; :func:`run_chunked` concatenates the chunks.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder` or :class:`~tfmatcomp.HookedDecoder`.
        inputs: a :class:`~tfmatcomp.MatrixBatch` or token ids ``[batch, pos]``; each chunk is moved
            to the model's device.
        batch_size: matrices per forward pass.
        names: hook names to cache (via ``model.run_with_cache(names_filter=names)``); see
            :mod:`tfmatcomp.models.hook_names`.
        fwd_hooks: ``(hook name, function)`` pairs active during each forward pass.
        intervention: None, an :class:`~tfmatcomp.interventions.Intervention`, or a function of the
            chunk returning one (e.g. a patch from that chunk); applied with ``.applied(model)``.
        return_predictions: False to skip the read-out (``return_type=None``) when only the cache
            is wanted.
        attention_mask: a padding mask ``[batch, pos]`` (1 = token) passed to the model, chunked
            with the inputs.
        bf16: run the forward passes under bf16 autocast (predictions still float32); None
            (default): :func:`inference_bf16` decides.

    Example:
        >>> import tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
        >>> tokens = sample_batch("tiny", 5, seed=0).tokens
        >>> [(c.start, c.tokens.shape[0]) for c in iter_chunks(model, tokens, batch_size=2)]
        [(0, 2), (2, 2), (4, 1)]
    """
    check_positive_int("batch_size", batch_size)
    names = list(names) if names is not None else None
    n = inputs.batch_size if isinstance(inputs, MatrixBatch) else inputs.shape[0]
    device = model.device
    decoder = model_kind(model) == "decoder"
    if bf16 is None:
        bf16 = names is None and inference_bf16(model)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else nullcontext
    for start in range(0, n, batch_size):
        chunk = inputs[start:start + batch_size].to(device)
        tokens = model_tokens(model, chunk)
        iv = _intervention_for(intervention, chunk)
        kwargs = {"return_type": ("logits" if decoder else "predictions") if return_predictions
                  else None}
        if attention_mask is not None:
            if decoder:
                raise ValueError("attention_mask: the decoder takes no padding mask")
            kwargs["attention_mask"] = attention_mask[start:start + batch_size].to(device)
        # plain `with` (not ExitStack.enter_context, which an interrupt can stop between a
        # context's __enter__ and registering its __exit__): nothing is left applied
        with (iv.applied(model) if iv is not None else nullcontext()), \
                model.hooks(fwd_hooks=list(fwd_hooks or [])), autocast():
            if names is None:
                preds, cache = model(tokens, **kwargs), {}
            else:
                preds, cache = model.run_with_cache(tokens, names_filter=names, **kwargs)
                cache = {name: cache[name] for name in names}
        if bf16 and preds is not None:
            preds = preds.float()
        if decoder and preds is not None:  # the entries' arg-max values, [chunk, n_rows * n_cols]
            preds = predicted_values(preds, getattr(chunk, "tokenizer", None))
        yield Chunk(start=start, inputs=chunk, predictions=preds, cache=cache)


def run_chunked(
    model: HookedEncoder | HookedDecoder, inputs: Inputs, **options: Any
) -> tuple[Float[Tensor, "batch pos"] | None, dict[str, Tensor]]:
    """``(predictions, cache)`` of ``model`` on all of ``inputs``, concatenated over chunks.

    The arguments are those of :func:`iter_chunks` (``options``: its keywords, ``batch_size``,
    ``names``, ``fwd_hooks``, ``intervention``, ...); ``cache`` holds each of ``names`` over the
    whole input (empty without names), ``predictions`` is None with ``return_predictions=False``.

    Example:
        >>> import tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
        >>> batch = sample_batch("tiny", 3, seed=0)
        >>> preds, _ = run_chunked(model, batch, batch_size=2)
        >>> bool(torch.allclose(preds, model(batch.tokens), atol=1e-5))
        True
    """
    preds: list[Tensor] = []
    caches: dict[str, list[Tensor]] = {}
    for chunk in iter_chunks(model, inputs, **options):
        if chunk.predictions is not None:
            preds.append(chunk.predictions)
        for name, act in chunk.cache.items():
            caches.setdefault(name, []).append(act)
    return (torch.cat(preds) if preds else None), {k: torch.cat(v) for k, v in caches.items()}


def predict(
    model: HookedEncoder | HookedDecoder,
    batch: MatrixBatch,
    intervention: InterventionLike = None,
    batch_size: int = 256,
) -> Float[Tensor, "batch pos"]:
    """Predictions on ``batch``, ``batch_size`` matrices at a time, with ``intervention`` applied.

    Args:
        intervention: None, an :class:`~tfmatcomp.interventions.Intervention`, or a function of the
            chunk (a :class:`~tfmatcomp.MatrixBatch`) returning one (e.g. a patch from that chunk).

    Example:
        >>> import tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
        >>> predict(model, sample_batch("tiny", 3, seed=0), batch_size=2).shape
        torch.Size([3, 16])
    """
    preds, _ = run_chunked(model, batch, batch_size=batch_size, intervention=intervention)
    return preds


#: Narrowest model for which a CPU run takes the fast step by itself: below it the matmuls are too
#: small for bf16 to pay (4L8H at d_model 128 measured no faster; docs/fast-cpu.md).
CPU_MIN_D_MODEL = 256


@functools.cache
def cpu_bf16_units() -> str | None:
    """The CPU's bf16 matrix units, checked at run time: ``"AMX"``, ``"AVX-512 bf16"`` or None.

    Example:
        >>> cpu_bf16_units() in ("AMX", "AVX-512 bf16", None)
        True
    """
    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    if torch.cpu._is_avx512_bf16_supported():
        return "AVX-512 bf16"
    return None

def inference_bf16(model: HookedEncoder | HookedDecoder) -> bool:
    """Whether a predictions-only forward pass of ``model`` runs in bf16 by default: an encoder
    with ``d_model >=`` :data:`CPU_MIN_D_MODEL` on a CPU with bf16 matrix
    units (the rule of the fast training step). Narrower models (``tiny``) stay float32.

    Example:
        >>> import tfmatcomp as tm
        >>> inference_bf16(tm.HookedEncoder(tm.get_preset("tiny").model))
        False
    """
    return (model_kind(model) == "encoder" and model.device.type == "cpu"
            and model.cfg.d_model >= CPU_MIN_D_MODEL and cpu_bf16_units() is not None)


def per_size_losses(
    model: HookedEncoder | HookedDecoder,
    task: TaskLike,
    sizes: Sequence[int] | None = None,
    n_samples: int = 256,
    seed: int = 0,
    batch_size: int = 256,
) -> dict[int, dict[str, float]]:
    """``{n: {"L", "L_obs", "L_mask"}}`` on a test set of ``n x n`` matrices per size (the NeurIPS paper,
    Appendix I: a mixture's per-size test MSE, and sizes it was not trained on).

    Args:
        model: the model (its ``n_ctx`` must cover ``n * n`` for every size).
        task: the task whose rank, mask probability and entry law every size shares (a mixture,
            a single-size task, a task config or a preset name).
        sizes: the sizes to test (default: the mixture's sizes, or the task's ``n_rows``). Sizes
            outside the training mixture are the out-of-distribution test.
        n_samples, seed: each size's test set: ``n_samples`` matrices from ``seed``.

    Example:
        >>> import tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32,
        ...                                           n_ctx=81))
        >>> task = tm.TaskConfig(mixture=(5, 7), rank=1)
        >>> sorted(per_size_losses(model, task, sizes=(5, 7, 9), n_samples=4))
        [5, 7, 9]
    """
    task = resolve_task(task)
    if sizes is None:
        sizes = task.sizes if isinstance(task, MatrixMixtureTask) else (task.n_rows,)
    sizes = [int(n) for n in sizes]
    too_big = [n for n in sizes if positions_needed(model, n * n) > model.cfg.n_ctx]
    if too_big:
        raise ValueError(f"sizes: {too_big} need more than the model's n_ctx {model.cfg.n_ctx} "
                         f"positions; allowed sizes are n with n * n <= {model.cfg.n_ctx}")
    out = {}
    for n in sizes:
        sized = MatrixCompletionTask(n_rows=n, rank=task.rank, p_mask=task.p_mask,
                                     distribution=task.distribution, tokenizer=task.tokenizer)
        batch = sample_batch(sized, n_samples, seed=seed, device=model.device)
        out[n] = _three(losses(predict(model, batch, batch_size=batch_size), batch, as_floats=True))
    return out


def _three(values: dict[str, float]) -> dict[str, float]:
    """``L``, ``L_obs``, ``L_mask`` of :func:`tfmatcomp.losses`' floats: a table's loss columns."""
    return {k: values[k] for k in ("L", "L_obs", "L_mask")}
