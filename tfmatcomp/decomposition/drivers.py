"""Model drivers: stream a model's activations into the decomposition from hooks.

:func:`accumulate` (first pass: the means) and :func:`residual_pass` (second pass: residuals of
chosen contexts) run our :class:`~tfmatcomp.HookedEncoder` or any TransformerLens-style model (e.g.
a TransformerBridge) through ``run_with_hooks``, or any ``nn.Module`` (e.g. a transformers BERT,
see :func:`hf_bert_modules`) through plain forward hooks, so the full cache is never stored.

Example:
    >>> import tfmatcomp as tm
    >>> len(residual_stream_names(tm.HookedEncoder(tm.get_preset("tiny").model)))
    3
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable

import torch
from torch import Tensor, nn

from tfmatcomp.decomposition.accumulator import DecompositionAccumulator
from tfmatcomp.decomposition.formula import check_mask
from tfmatcomp.decomposition.result import Decomposition
from tfmatcomp.models.hook_names import residual_stream_names

__all__ = ["accumulate", "residual_pass", "hf_bert_modules"]


def hf_bert_modules(bert: nn.Module) -> dict[str, nn.Module]:
    """Sub-modules of a transformers BERT whose outputs are ``hidden_states[0..L]``.

    ``{"hidden_states.0": bert.embeddings, "hidden_states.1": bert.encoder.layer[0], ...}``; pass as
    ``modules=`` to :func:`accumulate` to stream a ``BertModel`` through plain forward hooks.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> bert = BertModel(BertConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        ...                             intermediate_size=16, vocab_size=30))
        >>> list(hf_bert_modules(bert))
        ['hidden_states.0', 'hidden_states.1', 'hidden_states.2']
    """
    inner = getattr(bert, "bert", bert)
    try:
        layers = list(inner.encoder.layer)
        embeddings = inner.embeddings
    except AttributeError:
        raise ValueError(f"bert: {type(bert).__name__} has no .embeddings / .encoder.layer; pass "
                         "modules= yourself") from None
    out = {"hidden_states.0": embeddings}
    out.update({f"hidden_states.{i + 1}": layer for i, layer in enumerate(layers)})
    return out


def _unpack_batch(batch: Any) -> tuple[Tensor, Tensor | None]:
    if torch.is_tensor(batch):
        return batch, None
    if hasattr(batch, "tokens") and torch.is_tensor(getattr(batch, "tokens")):  # MatrixBatch
        return batch.tokens, None
    if isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise ValueError(f"batches: a mapping batch needs 'input_ids', got keys {list(batch)}")
        return batch["input_ids"], batch.get("attention_mask")
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(f"batches: each item must be a token tensor, a MatrixBatch, a mapping with "
                     f"input_ids / attention_mask, or (tokens, mask); got {type(batch).__name__}")


def _model_device(model: nn.Module) -> torch.device | None:
    for p in model.parameters():
        return p.device
    return None


def _output_tensor(output: Any) -> Tensor:
    if torch.is_tensor(output):
        return output
    if isinstance(output, (tuple, list)) and output and torch.is_tensor(output[0]):
        return output[0]
    for attr in ("last_hidden_state", "hidden_states"):
        value = getattr(output, attr, None)
        if torch.is_tensor(value):
            return value
    raise ValueError(f"modules: cannot find a [batch, pos, d] tensor in a {type(output).__name__} output")


def _run(model: nn.Module, tokens: Tensor, mask: Tensor | None, fwd_hooks, forward_kwargs) -> None:
    kwargs = dict(forward_kwargs or {})
    if mask is not None:
        kwargs["attention_mask"] = mask
    from tfmatcomp.models.objectives import model_kind

    if model_kind(model) == "encoder":
        kwargs.setdefault("return_type", None)
    if fwd_hooks is None:
        model(tokens, **kwargs)
    else:
        model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, **kwargs)


def _feed(
    model: nn.Module,
    batches: Iterable[Any],
    sink: Callable[[str, Tensor, Tensor | None], None],
    names: Sequence[str] | None,
    modules: Mapping[str, nn.Module] | None,
    progress: bool | None,
    total: int | None,
    desc: str,
    forward_kwargs: Mapping[str, Any] | None,
) -> int:
    """Run ``model`` over ``batches``, calling ``sink(name, activation, mask)`` from hooks."""
    from tfmatcomp._progress import check_progress, tracked

    check_progress(progress)

    if modules is not None and names is not None:
        raise ValueError("names / modules: give one of them (hook names for run_with_hooks, or "
                         "modules for plain forward hooks)")
    if modules is None:
        if not hasattr(model, "run_with_hooks"):
            raise ValueError(f"model: {type(model).__name__} has no run_with_hooks; pass modules= "
                             "(name -> nn.Module whose output to decompose)")
        names = list(names) if names is not None else residual_stream_names(model)
        if not names:
            raise ValueError("names: empty")
    device = _model_device(model)
    current: dict[str, Tensor | None] = {"mask": None}
    handles = []
    if modules is not None:
        for name, module in modules.items():
            def fn(mod, args, output, _name=name):
                sink(_name, _output_tensor(output), current["mask"])
            handles.append(module.register_forward_hook(fn))
    # hook names: registered once for the whole stream (TransformerLens's ``hooks`` context) rather
    # than by one run_with_hooks per batch; the hooks read the current batch's mask
    held = modules is None and hasattr(model, "hooks")
    stream_hooks = contextlib.nullcontext()
    if held:
        stream_hooks = model.hooks(fwd_hooks=[
            (name, lambda act, hook, _n=name: sink(_n, act, current["mask"])) for name in names])
    n_tokens = 0
    try:
        with torch.no_grad(), stream_hooks:
            for batch in tracked(batches, desc, progress, total=total, unit="batch"):
                tokens, mask = _unpack_batch(batch)
                if device is not None:
                    tokens = tokens.to(device)
                    mask = None if mask is None else mask.to(device)
                # checked and made bool once per batch, not once per hooked layer
                sink_mask = None if mask is None else check_mask(mask, tokens[..., None])
                current["mask"] = sink_mask
                hooks = None
                if modules is None and not held:
                    hooks = [(name, (lambda act, hook, _n=name, _m=sink_mask: sink(_n, act, _m)))
                             for name in names]
                _run(model, tokens, mask, hooks, forward_kwargs)
                n_tokens += int(tokens.numel() if mask is None else mask.sum())
    finally:
        for handle in handles:
            handle.remove()
    return n_tokens


def accumulate(
    model: nn.Module,
    batches: Iterable[Any],
    names: Sequence[str] | None = None,
    *,
    modules: Mapping[str, nn.Module] | None = None,
    accumulator: DecompositionAccumulator | None = None,
    drop_first: int = 0,
    keep_ctx: bool = True,
    second_moment: bool = True,
    progress: bool | None = None,
    total: int | None = None,
    forward_kwargs: Mapping[str, Any] | None = None,
) -> DecompositionAccumulator:
    """Stream a model's activations over ``batches`` into a :class:`DecompositionAccumulator`.

    Each batch is run once with hook functions that feed the accumulator and return nothing, so no
    activation is stored beyond the forward pass itself.

    Args:
        model: a HookedEncoder or any TransformerLens-style module with ``run_with_hooks`` (e.g. a
            TransformerBridge), or any ``nn.Module`` together with ``modules``.
        batches: iterable of token tensors ``[batch, T]``, :class:`~tfmatcomp.MatrixBatch` objects,
            mappings with ``input_ids`` (and ``attention_mask``: 1 = real token), or
            ``(tokens, mask)`` pairs. A mask is passed to the model as ``attention_mask`` and makes
            the decomposition padding-aware.
        names: hook names to decompose (default :func:`residual_stream_names`).
        modules: instead of hook names, ``{name: submodule}`` whose forward outputs to decompose
            (torch forward hooks; e.g. :func:`hf_bert_modules` for a transformers BERT).
        accumulator: continue an existing accumulator (its settings win over the next three).
        drop_first, keep_ctx, second_moment: see :class:`DecompositionAccumulator`.
        progress: a bar over the batches (None: on a terminal or in a notebook, not in a pipe or
            under pytest; :mod:`tfmatcomp._progress`).
        total: number of batches, for the progress bar.
        forward_kwargs: extra keyword arguments for every forward call.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        >>> task = tm.MatrixCompletionTask(4, rank=1)
        >>> g = torch.Generator().manual_seed(0)
        >>> acc = accumulate(model, (task.sample(16, generator=g) for _ in range(3)), progress=False)
        >>> acc.n_contexts(), acc.result("blocks.1.hook_resid_pre").pos.shape
        (48, torch.Size([16, 64]))
    """
    acc = accumulator or DecompositionAccumulator(drop_first=drop_first, keep_ctx=keep_ctx,
                                                  second_moment=second_moment)
    _feed(model, batches, acc.update_one, names, modules, progress, total, "decompose",
          forward_kwargs)
    return acc


def residual_pass(
    model: nn.Module,
    accumulator: DecompositionAccumulator,
    batch: Any,
    names: Sequence[str] | None = None,
    *,
    modules: Mapping[str, nn.Module] | None = None,
    forward_kwargs: Mapping[str, Any] | None = None,
) -> dict[str | int, Decomposition]:
    """Second pass: full decompositions (with ``resid`` and ``cvec``) of the contexts in ``batch``.

    Runs the model once on ``batch`` (any form :func:`accumulate` accepts), capturing only the
    requested activations, and returns ``{name: accumulator.residuals(name, h, mask)}``.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        >>> task = tm.MatrixCompletionTask(4, rank=1)
        >>> g = torch.Generator().manual_seed(0)
        >>> acc = accumulate(model, [task.sample(32, generator=g)], progress=False)
        >>> out = residual_pass(model, acc, task.sample(4, generator=g))
        >>> out["blocks.1.hook_resid_pre"].cvec.shape
        torch.Size([4, 16, 64])
    """
    if names is None and modules is None:
        names = [n for n in accumulator.names]
    captured: dict[str, tuple[Tensor, Tensor | None]] = {}

    def sink(name, h, mask):
        captured[name] = (h.detach(), mask)

    _feed(model, [batch], sink, names, modules, False, None, "residuals", forward_kwargs)
    return {name: accumulator.residuals(name, h, mask) for name, (h, mask) in captured.items()}
