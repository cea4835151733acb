"""Activation patching: write activations recorded on a source run into the target run.

The papers' causal intervention (the workshop paper Appendix J, the NeurIPS paper Appendix F): run the model on ``X``,
store the attention heads' outputs before the output projection (``blocks.{l}.attn.hook_z``,
``[batch, pos, head, d_head]``) of all layers, then run on ``-X`` with the same mask while writing the
stored values in; measure the output against ``X`` and ``-X``. The papers' text patches all layers;
their code patched only the last one. Here any hooks, layers, heads and positions can be chosen; the
defaults are the papers' text (``hook_z`` of every layer, all heads, all positions), and
:func:`negation_patch` builds the whole recipe from one batch.

The source is either recorded activations (an ``ActivationCache`` from ``model.run_with_cache`` or a
``{hook name: tensor}`` dict) or inputs (a :class:`~tfmatcomp.MatrixBatch`, token ids, or a
:class:`SampledBatch`: the seeded batch ``sample_batch(task, n_samples, seed)``, which ``to_dict``
writes as those three numbers instead of the tokens) that are run once, without gradients, when the
hooks are built. Source and target must have the same batch size and sequence length.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions import negation_patch
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=16, n_ctx=16))
    >>> x = tm.MatrixCompletionTask(4, rank=1).sample(8, generator=torch.Generator().manual_seed(0))
    >>> patch, target = negation_patch(x)              # source X, target -X, hook_z of all layers
    >>> patch.acts_on(model)
    ['blocks.0.attn.hook_z', 'blocks.1.attn.hook_z']
    >>> f_p = patch.run(model, target.tokens)          # f_p(-X, X) in the papers' notation
    >>> f_p.shape
    torch.Size([8, 16])
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping

import torch
from jaxtyping import Int
from torch import Tensor

from tfmatcomp.config import TaskConfig
from tfmatcomp.task.data import MatrixBatch, MatrixCompletionTask
from tfmatcomp.interventions.base import FwdHook, HookFn, Intervention
from tfmatcomp.interventions.serialize import (check_fields, positions_from_data, positions_to_data,
                                               tensor_from_data, tensor_to_data)
from tfmatcomp.interventions.sites import (PositionSpec, check_hook_list, check_positions, describe_site,
                                           resolve_hook_names, site_mask)
from tfmatcomp.task.tokenizer import ValueTokenizer
from tfmatcomp.validation import check_int_list, check_positive_int, check_seed

__all__ = ["ActivationPatch", "SampledBatch", "negation_patch"]


@dataclass(frozen=True)
class SampledBatch:
    """A batch given by how it is drawn: ``tfmatcomp.datapath.sample_batch(task, n_samples, seed)``.

    As a patch's source it is written as data by these three values, not by its tokens.

    Args:
        task: a :class:`~tfmatcomp.TaskConfig`, a :class:`~tfmatcomp.MatrixCompletionTask` (with
            the papers' tokenizer) or a preset name; kept as a ``TaskConfig`` with ``n_cols``
            written out, so equal tasks give equal records.
        n_samples: how many matrices; seed: seeds the CPU generator.

    Example:
        >>> s = SampledBatch("tiny", 3, seed=0)
        >>> s.tokens.shape, SampledBatch.from_dict(s.to_dict()) == s
        (torch.Size([3, 16]), True)
    """

    task: TaskConfig
    n_samples: int
    seed: int = 0

    def __post_init__(self) -> None:
        from tfmatcomp.datapath import resolve_task

        task = self.task
        if not isinstance(task, (TaskConfig, MatrixCompletionTask, str)):
            raise ValueError(f"task: expected a TaskConfig, a MatrixCompletionTask or a preset "
                             f"name, got {type(task).__name__}")
        task = resolve_task(task)
        if task.tokenizer != ValueTokenizer():
            raise ValueError("task: a SampledBatch is written as a TaskConfig, which has the "
                             "papers' tokenizer; this task has another one")
        task = TaskConfig(n_rows=task.n_rows, n_cols=task.n_cols, rank=task.rank,  # explicit n_cols
                          p_mask=task.p_mask, distribution=task.distribution)
        object.__setattr__(self, "task", task)
        object.__setattr__(self, "n_samples", check_positive_int("n_samples", self.n_samples))
        check_seed("seed", self.seed)
        object.__setattr__(self, "seed", int(self.seed))

    def batch(self) -> MatrixBatch:
        """The batch (drawn afresh on the CPU; the same every time)."""
        from tfmatcomp.datapath import sample_batch

        return sample_batch(self.task, self.n_samples, self.seed)

    @property
    def tokens(self) -> Int[Tensor, "batch pos"]:
        """The batch's token ids."""
        return self.batch().tokens

    def to_dict(self) -> dict[str, Any]:
        """``{"task": task config dict, "n_samples": n, "seed": s}``."""
        return {"task": self.task.to_dict(), "n_samples": self.n_samples, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "sample") -> "SampledBatch":
        """Inverse of :meth:`to_dict` (a ValueError names a missing or unknown field)."""
        data = check_fields(data, where, ("task", "n_samples"), ("seed",))
        return cls(TaskConfig.from_dict(data["task"]), data["n_samples"], data.get("seed", 0))


class ActivationPatch(Intervention):
    """Replace activations of the target run by those of a source run at chosen sites.

    Args:
        source: an ``ActivationCache`` / ``{hook name: tensor}`` mapping holding every patched hook,
            or a :class:`~tfmatcomp.MatrixBatch` / token ids ``[batch, pos]`` / :class:`SampledBatch`
            to run as the source.
        hooks: hook name(s), full or block-relative (default ``"attn.hook_z"``).
        layers: 0-based layers for block-relative names (default: all).
        heads: 0-based head indices (hooks with a head axis only; default: all).
        positions: position indices or a bool mask ``[pos]`` / ``[batch, pos]`` (query positions for
            scores / patterns; default: all).

    Example:
        >>> import torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_mlp=8, n_ctx=4))
        >>> a, b = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5, 6, 7, 8]])
        >>> patch = ActivationPatch(b, hooks="blocks.1.hook_resid_pre")
        >>> torch.equal(patch.run(model, a), model(b))
        True
    """

    stage: ClassVar[str] = "hooks"
    kind: ClassVar[str] = "activation_patch"
    _required = ("source",)
    _optional = ("hooks", "layers", "heads", "positions")

    def __init__(
        self,
        source: Any,
        hooks: str | Iterable[str] = "attn.hook_z",
        layers: Iterable[int] | None = None,
        heads: Iterable[int] | None = None,
        positions: PositionSpec = None,
    ):
        #: the source batch, when given as one: each model reads it its own way (model_tokens)
        self._batch = source if isinstance(source, MatrixBatch) else None
        if isinstance(source, MatrixBatch):
            source = source.tokens
        if not (torch.is_tensor(source) or isinstance(source, SampledBatch)
                or hasattr(source, "__getitem__")):
            raise TypeError(f"source: expected an ActivationCache, a dict, a MatrixBatch, token ids "
                            f"or a SampledBatch, got {type(source).__name__}")
        self.source = source
        self.hooks = check_hook_list(hooks)
        self.layers = None if layers is None else check_int_list("layers", layers, lo=0)
        self.heads = None if heads is None else check_int_list("heads", heads, lo=0)
        self.positions = check_positions(positions)

    def _recorded_names(self) -> list[str]:
        """The keys of recorded activations that this patch reads (full or block-relative match)."""
        if not hasattr(self.source, "keys"):
            raise ValueError(f"source: a {type(self.source).__name__} without keys() cannot be "
                             "written as data; pass a dict or an ActivationCache")
        rel = [re.compile(r"blocks\.(\d+)\." + re.escape(h) + "$") for h in self.hooks]

        def wanted(name: str) -> bool:
            if name in self.hooks:
                return True
            found = [m for m in (r.match(name) for r in rel) if m]
            return any(self.layers is None or int(m.group(1)) in self.layers for m in found)

        return [n for n in self.source.keys() if wanted(n)]

    def _to_data(self) -> dict[str, Any]:
        src = self.source
        if isinstance(src, SampledBatch):
            source: dict[str, Any] = {"sample": src.to_dict()}
        elif torch.is_tensor(src):
            source = {"tokens": tensor_to_data(src)}
        else:
            source = {"activations": {n: tensor_to_data(src[n]) for n in self._recorded_names()}}
        return {"source": source, "hooks": list(self.hooks), "layers": self.layers,
                "heads": self.heads, "positions": positions_to_data(self.positions)}

    @classmethod
    def _from_data(cls, fields: dict[str, Any], where: str) -> "ActivationPatch":
        src = check_fields(fields["source"], f"{where}.source", (), ("sample", "tokens", "activations"))
        if len(src) != 1:
            raise ValueError(f"{where}.source: expected exactly one of 'sample', 'tokens', "
                             f"'activations', got {sorted(src) or 'none'}")
        (form, value), = src.items()
        if form == "sample":
            fields["source"] = SampledBatch.from_dict(value, f"{where}.source.sample")
        elif form == "tokens":
            fields["source"] = tensor_from_data(value, f"{where}.source.tokens")
        else:
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}.source.activations: expected a dict hook name -> tensor")
            fields["source"] = {n: tensor_from_data(t, f"{where}.source.activations[{n!r}]")
                                for n, t in value.items()}
        fields["positions"] = positions_from_data(fields.get("positions"), f"{where}.positions")
        return cls(**fields)

    def describe(self) -> str:
        src = ("a source run" if torch.is_tensor(self.source) else
               f"a source run on {self.source.n_samples} matrices sampled with seed "
               f"{self.source.seed}" if isinstance(self.source, SampledBatch) else
               "recorded activations")
        extra = describe_site(self.layers, self.heads, self.positions, all_layers=" all layers")
        return f"activation patch from {src} at {', '.join(self.hooks)}{extra} (0-based)"

    def acts_on(self, model) -> list[str]:
        return resolve_hook_names(model, self.hooks, self.layers)

    def source_activations(self, model) -> dict[str, Tensor]:
        """``{hook name: source activation}`` for every patched hook (runs the source if needed)."""
        names = self.acts_on(model)
        if torch.is_tensor(self.source) or isinstance(self.source, SampledBatch):
            from tfmatcomp.datapath import model_tokens

            batch = self.source.batch() if isinstance(self.source, SampledBatch) else self._batch
            tokens = self.source if batch is None else model_tokens(model, batch)
            with torch.no_grad():
                _, cache = model.run_with_cache(tokens.to(model.device),
                                                names_filter=lambda n: n in names)
            return {n: cache[n].detach() for n in names}
        out: dict[str, Tensor] = {}
        for n in names:
            try:
                out[n] = self.source[n].detach()
            except KeyError:
                raise ValueError(f"source: has no activation for hook {n!r}; record it with "
                                 "model.run_with_cache(tokens, names_filter=...)") from None
        return out

    def fwd_hooks(self, model) -> list[FwdHook]:
        hooks: list[FwdHook] = []
        for name, src in self.source_activations(model).items():
            def fn(act: Tensor, hook: Any = None, name: str = name, src: Tensor = src) -> Tensor:
                if src.shape != act.shape:
                    raise ValueError(f"source: activation at {name} has shape {tuple(src.shape)}, "
                                     f"the target run's has {tuple(act.shape)} (same batch size and "
                                     "length needed)")
                new = src.to(device=act.device, dtype=act.dtype)
                mask = site_mask(act.shape, name, self.heads, self.positions, act.device)
                return new.clone() if mask is None else torch.where(mask, new, act)

            hooks.append((name, HookFn(fn, "edit", f"patch {name}")))
        return hooks


def negation_patch(
    batch: MatrixBatch,
    hooks: str | Iterable[str] = "attn.hook_z",
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    positions: PositionSpec = None,
) -> tuple[ActivationPatch, MatrixBatch]:
    """The papers' X -> -X recipe: ``(patch with source X, target batch -X with the same mask)``.

    Run the target under the patch to get ``f_p(-X, X)``; compare it with ``batch.values`` (X) and
    ``target.values`` (-X) at masked / observed entries.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> x = tm.MatrixCompletionTask(4, rank=1).sample(2, generator=torch.Generator().manual_seed(0))
        >>> patch, target = negation_patch(x, layers=[1])
        >>> torch.equal(target.values, -x.values), torch.equal(target.observed, x.observed)
        (True, True)
    """
    if not isinstance(batch, MatrixBatch):
        raise TypeError(f"batch: expected a MatrixBatch, got {type(batch).__name__}")
    return ActivationPatch(batch, hooks=hooks, layers=layers, heads=heads, positions=positions), batch.negated()
