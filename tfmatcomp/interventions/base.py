"""The intervention protocol, hook functions with a role, and composition.

An :class:`Intervention` says where it acts (:meth:`~Intervention.acts_on`) and what it does
(:meth:`~Intervention.describe`). Each one can be used in two ways:

* as TransformerLens forward hooks: ``model.run_with_hooks(tokens, fwd_hooks=iv.fwd_hooks(model))``;
* as a context manager: ``with iv.applied(model): model(tokens)``; also
  ``iv.run(model, tokens)`` for one forward pass.

Every intervention belongs to one *stage*:

``"tokens"``
    edits the input tokens (:class:`~tfmatcomp.interventions.MaskSubstitution`). As hooks it acts at
    ``embed.hook_embed``, which is exactly equivalent because the token embedding is a lookup; it also
    offers :meth:`~Intervention.transform_tokens` to edit token tensors directly.
``"weights"``
    edits parameters (:class:`~tfmatcomp.interventions.WeightTransplant`,
    :class:`~tfmatcomp.interventions.PositionalPermutation`). ``applied`` gives the affected parameters
    new tensors (the ``nn.Parameter`` objects stay the same) and puts the original tensors back on
    exit, untouched, also after an exception or an interrupt (see below); activations cached inside the context keep the values
    they had (``hook_pos_embed`` is a view of ``W_pos``, for instance). As hooks, the model's own
    forward pass runs on the edited parameters, substituted at the first hook point and put back at
    the last (:func:`~tfmatcomp.interventions.weights.parameter_override_hooks`); ``model.hooks()``
    puts them back also when the forward pass stops early.
``"hooks"``
    edits activations at hook points (ablations, activation patching).

Composition (``a + b``, :func:`compose`, or a list) gives one intervention whose meaning is: *the
model runs on the edited tokens, with the edited weights, and the activation edits are applied at
their hook points in list order*. Concretely, the composed hook list is ordered

1. token edits (stage ``"tokens"``), in list order;
2. weight edits (stage ``"weights"``), applied one after the other in list order, each computed from
   the parameters as left by the previous one;
3. activation edits (stage ``"hooks"``), in list order;
4. read-only hooks last at every hook point (weight edits in hook form put the original parameters
   back from one at ``hook_readout``).

Hooks at one hook point run in the order they are registered, so two activation edits at the same
point compose like functions: the later one sees the output of the earlier one.

Nothing is left behind: after any exception or KeyboardInterrupt, wherever it lands (entering,
the body, leaving), the model has no hook attached and every parameter is the same
``nn.Parameter`` holding its original tensor (``AppliedContext``; ``model.hooks()`` and
``run_with_hooks`` likewise). An interrupt that arrives while a context is being entered or left
is held back until the model is restored, then raised (main thread; see ``tfmatcomp._interrupts``).

Interventions that need a *source run* (activation patching from a batch) run it once, when their
hooks are built, on the model as it stands: without the edits of the composition they belong to (in
``applied``, hooks are built before weights are edited). Record a cache yourself to patch from an
edited run.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions import UniformAttentionAblation, MaskSubstitution
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=2, n_heads=4, d_model=32, d_mlp=64, n_ctx=16))
    >>> batch = tm.MatrixCompletionTask(n_rows=4, rank=1).sample(8, generator=torch.Generator().manual_seed(0))
    >>> iv = MaskSubstitution(0.44) + UniformAttentionAblation("all")
    >>> with iv.applied(model):
    ...     pred = model(batch.tokens)
    >>> model.active_hook_count()
    0
    >>> torch.equal(pred, model.run_with_hooks(batch.tokens, fwd_hooks=iv.fwd_hooks(model)))
    True
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Iterable, Mapping

from jaxtyping import Int
from torch import Tensor

from tfmatcomp._interrupts import Undoable, undo_all
from tfmatcomp.interventions.hook_fn import FwdHook, HookFn, order_hooks
from tfmatcomp.interventions.serialize import from_dict, register_kind
from tfmatcomp.interventions.weights import (assigned_parameters, checked_edits,
                                             parameter_override_hooks)

__all__ = ["Intervention", "Composition", "AppliedContext", "compose", "HookFn", "FwdHook", "STAGES",
           "order_hooks"]

STAGES = ("tokens", "weights", "hooks")


class Intervention:
    """Base class of every intervention (see the module docs for the protocol).

    Subclasses set :attr:`stage` and implement :meth:`describe`, :meth:`acts_on` and, depending on
    the stage, :meth:`fwd_hooks` (tokens, hooks), :meth:`weight_edits` (weights) and
    :meth:`transform_tokens` (tokens). To be written as data they set :attr:`kind` (which enters
    them in :data:`~tfmatcomp.interventions.serialize.KINDS`), ``_required`` / ``_optional``
    (their fields) and implement ``_to_data`` (and ``_from_data`` unless ``cls(**fields)`` does).
    """

    stage: ClassVar[str] = "hooks"
    #: The tag of :meth:`to_dict` (``""``: this class is not written as data).
    kind: ClassVar[str] = ""
    _required: ClassVar[tuple[str, ...]] = ()
    _optional: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind"):
            register_kind(cls)

    # ------------------------------------------------------------------- as data
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data ``{"kind": ..., <parameters>}``; :meth:`from_dict` rebuilds it
        (see :mod:`tfmatcomp.interventions.serialize`).

        Example:
            >>> from tfmatcomp.interventions import UniformAttentionAblation
            >>> UniformAttentionAblation([(0, 1)]).to_dict()
            {'kind': 'uniform_attention_ablation', 'heads': [[0, 1]]}
        """
        if not self.kind:
            raise NotImplementedError(f"{type(self).__name__}: has no kind, so it cannot be written "
                                      "as data (set kind and implement _to_data)")
        return {"kind": self.kind, **self._to_data()}

    def _to_data(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Intervention":
        """The intervention that ``data`` (from :meth:`to_dict`, possibly through JSON) describes.

        Called on a subclass, ``data`` must describe that class (or a subclass of it).

        Example:
            >>> from tfmatcomp.interventions import Intervention, MaskSubstitution
            >>> Intervention.from_dict({"kind": "mask_substitution", "value": -0.24}) == MaskSubstitution(-0.24)
            True
        """
        iv = from_dict(data)
        if not isinstance(iv, cls):
            raise ValueError(f"data: describes a {type(iv).__name__} (kind {iv.kind!r}), not a "
                             f"{cls.__name__}")
        return iv

    @classmethod
    def _from_data(cls, fields: dict[str, Any], where: str) -> "Intervention":
        return cls(**fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        if other is self:
            return True
        try:
            return self.to_dict() == other.to_dict()
        except (NotImplementedError, ValueError):  # not writable as data: equal only to itself
            return False

    def __hash__(self) -> int:
        try:
            return hash(json.dumps(self.to_dict(), sort_keys=True))
        except (NotImplementedError, ValueError):
            return id(self)

    # ---------------------------------------------------------------- what / where
    def describe(self) -> str:
        """One sentence: what the intervention does and where."""
        raise NotImplementedError

    def acts_on(self, model) -> list[str]:
        """Hook names (stages tokens / hooks) or parameter names (stage weights) it touches."""
        raise NotImplementedError

    # ------------------------------------------------------------------ mechanics
    def fwd_hooks(self, model) -> list[FwdHook]:
        """TransformerLens forward hooks ``[(hook_name, fn), ...]`` for ``model.run_with_hooks``.

        Stage ``"weights"``: the hooks of :func:`~tfmatcomp.interventions.weights.parameter_override_hooks`
        for :meth:`weight_edits`; other stages implement it.
        """
        if self.stage == "weights":
            return parameter_override_hooks(model, self.weight_edits(model), type(self).__name__)
        raise NotImplementedError

    def weight_edits(self, model, params: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """New values of the parameters it edits, computed from ``params`` (default: the model's).

        Only stage ``"weights"`` edits parameters; others return ``{}``.
        """
        return {}

    def transform_tokens(self, tokens: Int[Tensor, "batch pos"], model=None) -> Int[Tensor, "batch pos"]:
        """The input tokens as this intervention edits them (identity unless stage ``"tokens"``)."""
        return tokens

    @property
    def parts(self) -> tuple["Intervention", ...]:
        """The elementary interventions (``(self,)`` unless composed)."""
        return (self,)

    def applied(self, model) -> "AppliedContext":
        """Context manager: the model with this intervention in effect (yields the model).

        Weight edits are written into the parameters and restored bit-exactly on exit; hooks are
        registered with ``model.hooks`` and removed on exit. Nothing is left behind after an
        exception or a KeyboardInterrupt at any point of entering, of the body or of leaving
        (``tfmatcomp.interventions.base.AppliedContext``).
        """
        return AppliedContext(Composition([self]), model)

    def run(self, model, tokens: Int[Tensor, "batch pos"], **kwargs: Any) -> Tensor:
        """One forward pass ``model(tokens, **kwargs)`` with the intervention applied."""
        with self.applied(model):
            return model(tokens, **kwargs)

    def run_with_cache(self, model, tokens: Int[Tensor, "batch pos"], **kwargs: Any):
        """``model.run_with_cache(tokens, **kwargs)`` with the intervention applied (the cache shows
        the edited activations)."""
        with self.applied(model):
            return model.run_with_cache(tokens, **kwargs)

    # ----------------------------------------------------------------- composition
    def __add__(self, other: "Intervention | Iterable[Intervention]") -> "Composition":
        return compose(self, other)

    def __radd__(self, other: "Iterable[Intervention]") -> "Composition":
        return compose(other, self)

    def __repr__(self) -> str:
        try:
            return f"<{type(self).__name__}: {self.describe()}>"
        except NotImplementedError:
            return f"<{type(self).__name__}>"


def _flatten(items: Iterable[Any]) -> list[Intervention]:
    out: list[Intervention] = []
    for item in items:
        if isinstance(item, Intervention):
            out.extend(item.parts)
        elif isinstance(item, (list, tuple)):
            out.extend(_flatten(item))
        else:
            raise TypeError(f"interventions: expected Intervention objects, got {type(item).__name__}")
    return out


#: The most parts a :class:`Composition` may have.
MAX_PARTS = 1000


class Composition(Intervention):
    """Several interventions applied as one, in the documented order (module docs).

    Args:
        interventions: interventions (nested compositions and lists are flattened).

    Example:
        >>> from tfmatcomp.interventions import UniformAttentionAblation, Composition
        >>> c = Composition([UniformAttentionAblation([(0, 0)]), UniformAttentionAblation([(1, 2)])])
        >>> len(c.parts)
        2
    """

    stage: ClassVar[str] = "mixed"
    kind: ClassVar[str] = "composition"
    _required = ("parts",)

    def __init__(self, interventions: Iterable[Intervention]):
        self._parts = tuple(_flatten([interventions]))
        if len(self._parts) > MAX_PARTS:
            raise ValueError(f"interventions: a composition of {len(self._parts):,} parts; at most "
                             f"{MAX_PARTS:,} are allowed (each part is applied on every forward "
                             "pass; combine edits of one kind into one intervention)")
        for p in self._parts:
            if p.stage not in STAGES:
                raise ValueError(f"interventions: {type(p).__name__} has unknown stage {p.stage!r}")

    @property
    def parts(self) -> tuple[Intervention, ...]:
        return self._parts

    def _to_data(self) -> dict[str, Any]:
        return {"parts": [p.to_dict() for p in self._parts]}

    @classmethod
    def _from_data(cls, fields: dict[str, Any], where: str) -> "Composition":
        parts = fields["parts"]
        if not isinstance(parts, list):
            raise ValueError(f"{where}.parts: expected a list of interventions' dicts, got "
                             f"{type(parts).__name__}")
        return cls([from_dict(p, f"{where}.parts[{i}]") for i, p in enumerate(parts)])

    def _of(self, stage: str) -> list[Intervention]:
        return [p for p in self._parts if p.stage == stage]

    def describe(self) -> str:
        if not self._parts:
            return "nothing (empty composition)"
        return "; then ".join(p.describe() for p in self._ordered_parts())

    def _ordered_parts(self) -> list[Intervention]:
        return [p for s in STAGES for p in self._of(s)]

    def acts_on(self, model) -> list[str]:
        out: list[str] = []
        for p in self._ordered_parts():
            out.extend(n for n in p.acts_on(model) if n not in out)
        return out

    def weight_edits(self, model, params: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        current = dict(params) if params is not None else {
            n: p.detach() for n, p in model.named_parameters()}
        edits: dict[str, Tensor] = {}
        for p in self._of("weights"):
            new = checked_edits(model, p.weight_edits(model, current), type(p).__name__)
            current.update(new)
            edits.update(new)
        return edits

    def transform_tokens(self, tokens: Tensor, model=None) -> Tensor:
        for p in self._of("tokens"):
            tokens = p.transform_tokens(tokens, model)
        return tokens

    def fwd_hooks(self, model) -> list[FwdHook]:
        hooks: list[FwdHook] = []
        for p in self._of("tokens"):
            hooks.extend(p.fwd_hooks(model))
        if self._of("weights"):
            edits = self.weight_edits(model)
            if edits:
                hooks.extend(parameter_override_hooks(model, edits, label="weights"))
        for p in self._of("hooks"):
            hooks.extend(p.fwd_hooks(model))
        return order_hooks(hooks)

    def applied(self, model) -> "AppliedContext":
        return AppliedContext(self, model)


class AppliedContext(Undoable):
    """What ``applied(model)`` returns: enter it to apply a composition, leave it to undo it.

    Entering (1) builds the hooks of token and activation edits (source runs see a clean model),
    (2) computes the weight edits, one after the other, each from the parameters the previous one
    left, (3) swaps them into the parameters (the originals are kept by reference) and (4) adds the
    hooks with ``model.hooks``. Leaving undoes (4) and (3). The undo is idempotent and runs on any
    exception; a KeyboardInterrupt that lands while entering or leaving is held back until the
    model is restored (entering: the interrupt is raised after undoing) — the mechanism and its
    main-thread caveat are described in ``tfmatcomp._interrupts``. While entering, Ctrl-C is
    therefore answered after the source runs of activation patches, not during them.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> from tfmatcomp.interventions import PositionalPermutation
        >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=8, n_ctx=3))
        >>> W_pos, before = model.W_pos, model.W_pos.detach().clone()
        >>> with PositionalPermutation([2, 0, 1]).applied(model):
        ...     torch.equal(model.W_pos[2], before[0])
        True
        >>> model.W_pos is W_pos, torch.equal(model.W_pos, before)
        (True, True)
    """

    def __init__(self, composition: "Composition", model):
        self.composition, self.model = composition, model
        self.steps: list[Undoable] = []

    def _apply(self) -> Any:
        comp, model = self.composition, self.model
        hooks: list[FwdHook] = []
        for p in comp._of("tokens") + comp._of("hooks"):
            hooks.extend(p.fwd_hooks(model))
        edits = comp.weight_edits(model)
        # each step is listed before it starts, so that _undo also covers a step stopped half-way
        for step in (assigned_parameters(model, edits), model.hooks(fwd_hooks=order_hooks(hooks))):
            self.steps.append(step)
            step._apply()
        return model

    def _undo(self) -> None:
        steps, self.steps = list(reversed(self.steps)), []
        undo_all([(type(step).__name__, step._undo) for step in steps])


def compose(*interventions: Intervention | Iterable[Intervention]) -> Composition:
    """One intervention from several (lists and compositions are flattened), in the documented order.

    Example:
        >>> from tfmatcomp.interventions import compose, UniformAttentionAblation, MaskSubstitution
        >>> c = compose(UniformAttentionAblation("all"), [MaskSubstitution(0.44)])
        >>> [type(p).__name__ for p in c.parts]
        ['UniformAttentionAblation', 'MaskSubstitution']
    """
    return Composition(list(interventions))
