"""Interventions as data: ``to_dict()`` gives plain JSON-ready data, :func:`from_dict` rebuilds.

Every intervention class has a ``kind`` (a snake_case tag) in one registry, :data:`KINDS`;
``iv.to_dict()`` is ``{"kind": kind, <its parameters>}`` made only of strings, numbers, booleans,
None, lists and dicts, so ``json.dumps`` takes it as it is, and :func:`from_dict` (or
``Intervention.from_dict``) rebuilds an equal intervention: the same kind and parameters, and the
same change to every model's output. Two interventions are equal (``==``) when their dicts are.

=======================================  =========================================================
kind                                     fields (``*`` required)
=======================================  =========================================================
``"uniform_attention_ablation"``         ``heads*`` (``"all"`` or 0-based ``[layer, head]`` pairs)
``"mean_attention_ablation"``            ``heads*``
``"activation_ablation"``                ``hooks*``, ``mode``, ``layers``, ``heads``, ``positions``,
                                         ``mean_value``
``"activation_patch"``                   ``source*``, ``hooks``, ``layers``, ``heads``, ``positions``
``"mask_substitution"``                  ``value*``, ``tokenizer`` (only when not the papers')
``"weight_transplant"``                  ``donor*``, ``params``, ``layers``, ``strict``
``"positional_permutation"``             ``perm`` or ``seed`` (with ``n_positions``)
``"composition"``                        ``parts*`` (a list of such dicts)
=======================================  =========================================================

What is not a plain value is written as a reference where one exists, as numbers where not:

* a donor model loaded from a checkpoint path: ``{"checkpoint": path, "step": N}`` (rebuilding
  loads it and checks the step); a donor held only in memory: its config and the transplanted
  parameters as tensors;
* a patch's source batch: ``{"sample": {"task": ..., "n_samples": n, "seed": s}}`` for a
  :class:`~tfmatcomp.interventions.SampledBatch`, ``{"tokens": tensor}`` for token ids, and
  ``{"activations": {hook name: tensor}}`` (only the patched hooks) for recorded activations;
* a tensor (bool position masks, mean values): ``{"dtype": "float32", "shape": [...], "data":
  nested lists}`` (exact: every float of the common dtypes is a Python float).

A dict with an unknown ``kind``, a missing required field or a field the kind does not have is a
``ValueError`` that names it.

Example:
    >>> import json, torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions import UniformAttentionAblation, MaskSubstitution, from_dict
    >>> iv = MaskSubstitution(0.44) + UniformAttentionAblation([(1, 2)])
    >>> text = json.dumps(iv.to_dict())
    >>> text
    '{"kind": "composition", "parts": [{"kind": "mask_substitution", "value": 0.44}, {"kind": "uniform_attention_ablation", "heads": [[1, 2]]}]}'
    >>> again = from_dict(json.loads(text))
    >>> again == iv
    True
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> tokens = tm.get_preset("tiny").task.build().sample(4, generator=torch.Generator().manual_seed(0)).tokens
    >>> torch.equal(again.run(model, tokens), iv.run(model, tokens))
    True
    >>> from_dict({"kind": "uniform_ablation"})
    Traceback (most recent call last):
    ...
    ValueError: intervention: unknown kind 'uniform_ablation'; known kinds: activation_ablation, activation_patch, attention_logit_scale, composition, freeze, mask_substitution, mean_attention_ablation, positional_permutation, reinitialize, row_column_attention_penalty, row_column_attention_scale, uniform_attention_ablation, weight_transplant
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

__all__ = ["Serializable", "KINDS", "register_kind", "from_dict", "to_json", "check_fields", "tensor_to_data",
           "tensor_from_data", "positions_to_data", "positions_from_data"]

class Serializable(Protocol):
    """What this module needs of an intervention: a ``kind`` tag and ``to_dict()``.

    :class:`~tfmatcomp.interventions.base.Intervention` has both; this module names the protocol
    instead of importing that class, so that ``base`` (which registers every class here) and this
    module do not import each other.
    """

    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]: ...


#: kind -> intervention class; filled by every class that sets ``kind`` (``Intervention.__init_subclass__``).
KINDS: dict[str, type] = {}


def register_kind(cls: type) -> type:
    """Enter ``cls`` in :data:`KINDS` under ``cls.kind`` (refuses a kind taken by another class)."""
    kind = cls.kind
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{cls.__name__}.kind: must be a non-empty string, got {kind!r}")
    if kind in KINDS and KINDS[kind].__qualname__ != cls.__qualname__:
        raise ValueError(f"{cls.__name__}.kind: {kind!r} is already the kind of {KINDS[kind].__name__}")
    KINDS[kind] = cls
    return cls


def check_fields(data: Any, where: str, required: tuple[str, ...] = (),
                 optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """``data`` as a dict after checking it has every ``required`` key and nothing but those and
    ``optional`` ones (a ValueError names the first key missing or every key not allowed).

    Example:
        >>> check_fields({"a": 1}, "x", required=("a", "b"))
        Traceback (most recent call last):
        ...
        ValueError: x: missing field 'b' (fields: a, b)
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a dict, got {type(data).__name__}")
    allowed = (*required, *optional)
    for name in required:
        if name not in data:
            raise ValueError(f"{where}: missing field {name!r} (fields: {', '.join(allowed)})")
    unknown = [k for k in data if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))} (fields: "
                         f"{', '.join(allowed) or 'none'})")
    return dict(data)


#: How deep compositions may nest in :func:`from_dict`.
MAX_DEPTH = 100


def from_dict(data: Mapping[str, Any], where: str = "intervention") -> Serializable:
    """The intervention that ``data`` (from ``to_dict()``, possibly through JSON) describes.

    Raises:
        ValueError: not a dict, no ``kind``, an unknown kind, a missing or unknown field (named,
            with the path to it inside a composition), or a field value its class refuses.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a dict with a 'kind' (from to_dict()), got "
                         f"{type(data).__name__}")
    if where.count(".parts[") > MAX_DEPTH:
        raise ValueError(f"{where.split('.parts[')[0]}: compositions nested more than {MAX_DEPTH} "
                         "deep")
    if "kind" not in data:
        raise ValueError(f"{where}: missing field 'kind' (one of {', '.join(sorted(KINDS))})")
    kind = data["kind"]
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"{where}: unknown kind {kind!r}; known kinds: {', '.join(sorted(KINDS))}")
    fields = check_fields({k: v for k, v in data.items() if k != "kind"}, f"{where} ({kind})",
                          cls._required, cls._optional)
    return cls._from_data(fields, where)


def to_json(intervention: Serializable | None) -> str | None:
    """``json.dumps(intervention.to_dict())``, or None for None (no intervention).

    Example:
        >>> from tfmatcomp.interventions import PositionalPermutation
        >>> to_json(PositionalPermutation(seed=1, n_positions=4))
        '{"kind": "positional_permutation", "seed": 1, "n_positions": 4}'
    """
    return None if intervention is None else json.dumps(intervention.to_dict())


# ------------------------------------------------------------------------------- tensors
def tensor_to_data(t: Tensor) -> dict[str, Any]:
    """A tensor as ``{"dtype", "shape", "data"}`` (nested lists; exact for the usual dtypes).

    Example:
        >>> tensor_to_data(torch.tensor([[True, False]]))
        {'dtype': 'bool', 'shape': [1, 2], 'data': [[True, False]]}
    """
    t = torch.as_tensor(t).detach().cpu()
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": t.tolist()}


def tensor_from_data(data: Any, where: str) -> Tensor:
    """The tensor :func:`tensor_to_data` wrote (on the CPU).

    Example:
        >>> tensor_from_data({"dtype": "float16", "shape": [2], "data": [0.5, 1.0]}, "x")
        tensor([0.5000, 1.0000], dtype=torch.float16)
    """
    data = check_fields(data, where, ("dtype", "shape", "data"))
    dtype = getattr(torch, str(data["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{where}: unknown dtype {data['dtype']!r} (e.g. 'float32', 'int64', 'bool')")
    try:
        t = torch.tensor(data["data"], dtype=dtype)
        return t.reshape([int(n) for n in data["shape"]])
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{where}: data do not form a {data['dtype']} tensor of shape "
                         f"{data['shape']} ({e})") from None


def positions_to_data(positions: Any) -> Any:
    """None, a list of ints, or (for a tensor) :func:`tensor_to_data`."""
    if positions is None:
        return None
    if torch.is_tensor(positions):
        return tensor_to_data(positions)
    return [int(p) for p in positions]


def positions_from_data(data: Any, where: str) -> Any:
    """Inverse of :func:`positions_to_data`."""
    return tensor_from_data(data, where) if isinstance(data, Mapping) else data
