"""Where an intervention acts: hook names, layers, heads, positions, and the papers' head labels.

Layers and heads are 0-based in code. The papers write ``(layer, head)`` 1-based, with ranges such as
``(4,5-7)``; :func:`paper_heads` converts their notation, :func:`paper_label` writes it back.

A *block-relative* hook name such as ``"attn.hook_z"`` or ``"hook_resid_pre"`` stands for that hook in
every block (or in the blocks given by ``layers``); a full name such as ``"blocks.1.attn.hook_z"`` or
``"embed.hook_pos_embed"`` stands for itself (:func:`tfmatcomp.models.hook_names.resolve_hook_names`,
re-exported here).

Example:
    >>> from tfmatcomp.interventions.sites import paper_heads, paper_label
    >>> paper_heads("(3,3), (4,2), (4,5-7)")
    [(2, 2), (3, 1), (3, 4), (3, 5), (3, 6)]
    >>> paper_label([(2, 2), (3, 1), (3, 4), (3, 5), (3, 6)])
    '(3,3), (4,2), (4,5-7)'
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence, Union

import numpy as np
import torch
from jaxtyping import Bool
from torch import Tensor

from tfmatcomp.models.hook_names import resolve_hook_names  # re-exported: hook names live in hook_names.py
from tfmatcomp.validation import check_int_list

__all__ = [
    "Head", "HeadSpec", "PositionSpec", "paper_heads", "paper_label", "resolve_heads",
    "resolve_hook_names", "describe_site", "head_axis", "position_axis", "site_mask",
    "check_head_spec", "check_hook_list",
]

Head = tuple[int, int]
HeadSpec = Union[str, Iterable[Head]]
PositionSpec = Union[None, Sequence[int], Tensor]

# hooks whose activation has a head axis, and which axis it is
_HEAD_AXIS = {"hook_q": 2, "hook_k": 2, "hook_v": 2, "hook_z": 2,
              "hook_attn_scores": 1, "hook_pattern": 1}


def paper_heads(spec: str | Iterable[tuple[int, int | str]]) -> list[Head]:
    """Convert the papers' 1-based ``(layer, head)`` labels to 0-based pairs.

    Args:
        spec: a string in the papers' notation, e.g. ``"(2,2-4), (2,6)"`` (ranges with ``-`` or an
            en dash are inclusive), or pairs ``[(4, 3), (4, "5-7")]``.

    Returns:
        0-based ``(layer, head)`` pairs, in the order written.

    Example:
        >>> paper_heads([(1, 1), (4, "5-6")])
        [(0, 0), (3, 4), (3, 5)]
    """
    if isinstance(spec, str):
        found = re.findall(r"\(\s*(\d+)\s*,\s*([\d\s\-\u2013]+?)\s*\)", spec)
        rest = re.sub(r"\(\s*\d+\s*,\s*[\d\s\-\u2013]+?\s*\)", "", spec)
        if not found or rest.strip(" ,;") != "":
            raise ValueError(f"spec: cannot read {spec!r}; expected the papers' notation such as "
                             "'(3,3), (4,2), (4,5-7)' (1-based)")
        pairs: list[tuple[int, int | str]] = [(int(a), b) for a, b in found]
    else:
        pairs = list(spec)
    out: list[Head] = []
    for pair in pairs:
        try:
            layer, heads = pair
        except (TypeError, ValueError):
            raise ValueError(f"spec: expected (layer, head) pairs, got {pair!r}") from None
        layer = int(layer)
        text = str(heads).replace("\u2013", "-").replace(" ", "")
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
        if m is None:
            raise ValueError(f"spec: head {heads!r} of layer {layer} is not a number or a range a-b")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if layer < 1 or lo < 1 or hi < lo:
            raise ValueError(f"spec: labels are 1-based; got layer {layer}, heads {lo}..{hi}")
        out.extend((layer - 1, h - 1) for h in range(lo, hi + 1))
    return out


def paper_label(heads: Head | Iterable[Head] | int, head: int | None = None) -> str:
    """The papers' 1-based label of 0-based ``(layer, head)`` pairs, contiguous heads as ranges.

    Takes one pair ``(layer, head)`` (also as two arguments ``paper_label(layer, head)``) or an
    iterable of pairs.

    Example:
        >>> paper_label([(1, 1), (1, 2), (1, 3), (1, 5)])
        '(2,2-4), (2,6)'
        >>> paper_label((3, 2)), paper_label(3, 2)
        ('(4,3)', '(4,3)')
    """
    from numbers import Integral

    if head is not None:
        heads = [(heads, head)]
    elif isinstance(heads, tuple) and len(heads) == 2 and all(
            isinstance(x, Integral) and not isinstance(x, bool) for x in heads):
        heads = [heads]
    parts: list[str] = []
    items = [(int(l), int(h)) for l, h in heads]
    i = 0
    while i < len(items):
        layer, start = items[i]
        end = start
        while i + 1 < len(items) and items[i + 1] == (layer, end + 1):
            i += 1
            end += 1
        parts.append(f"({layer + 1},{start + 1})" if end == start
                     else f"({layer + 1},{start + 1}-{end + 1})")
        i += 1
    return ", ".join(parts)


def check_head_spec(heads: Any, name: str = "heads") -> str | list[Head]:
    """``"all"`` or the 0-based ``(layer, head)`` pairs as a list of ``(int, int)``, else ValueError.

    Example:
        >>> check_head_spec([(0, 1)]), check_head_spec("all")
        ([(0, 1)], 'all')
        >>> check_head_spec([(0, "a")])
        Traceback (most recent call last):
        ...
        ValueError: heads: expected 'all' or 0-based (layer, head) pairs of integers, got (0, 'a')
    """
    if isinstance(heads, str):
        if heads != "all":
            raise ValueError(f"{name}: a string must be 'all' (use paper_heads() for the papers' "
                             f"1-based labels), got {heads!r}")
        return "all"
    if not hasattr(heads, "__iter__"):
        raise ValueError(f"{name}: expected 'all' or 0-based (layer, head) pairs, got {heads!r}")
    out: list[Head] = []
    for pair in heads:
        ok = (isinstance(pair, (tuple, list)) or torch.is_tensor(pair)) and len(pair) == 2
        if ok:
            try:
                layer, head = check_int_list(name, pair, lo=0)
            except ValueError:
                ok = False
        if not ok:
            raise ValueError(f"{name}: expected 'all' or 0-based (layer, head) pairs of integers, "
                             f"got {pair!r}")
        out.append((layer, head))
    return out


def check_hook_list(hooks: Any, name: str = "hooks") -> list[str]:
    """One hook name or an iterable of them, as a non-empty list of strings, else ValueError.

    Example:
        >>> check_hook_list("hook_resid_pre")
        ['hook_resid_pre']
    """
    items = [hooks] if isinstance(hooks, str) else (list(hooks) if hasattr(hooks, "__iter__")
                                                    else None)
    if not items or not all(isinstance(h, str) for h in items):
        raise ValueError(f"{name}: expected a hook name or a non-empty list of hook names (e.g. "
                         f"'hook_resid_pre', 'blocks.1.attn.hook_z'), got {hooks!r}")
    return items


def resolve_heads(n_layers: int, n_heads: int, heads: HeadSpec) -> list[Head]:
    """Validate 0-based ``(layer, head)`` pairs (or ``"all"``) against a model's shape.

    Duplicates are dropped, order kept.

    Example:
        >>> resolve_heads(2, 2, "all")
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    heads = check_head_spec(heads)
    if heads == "all":
        return [(l, h) for l in range(n_layers) for h in range(n_heads)]
    out: list[Head] = []
    for layer, head in heads:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"heads: ({layer}, {head}) is out of range; layers are 0..{n_layers - 1}"
                             f" and heads 0..{n_heads - 1} (0-based; convert the papers' 1-based "
                             "labels with paper_heads())")
        if (layer, head) not in out:
            out.append((layer, head))
    return out


def check_positions(positions: Any, name: str = "positions") -> PositionSpec:
    """``positions`` if it is None, integer indices (a sequence or an integer tensor) or a bool
    mask; fractional or non-numeric positions raise ``ValueError`` (they are never truncated).

    Example:
        >>> check_positions([0, 3])
        [0, 3]
        >>> check_positions([0.5])
        Traceback (most recent call last):
        ...
        ValueError: positions: must be integer indices or a bool mask, got [0.5]
    """
    if positions is None:
        return None
    if torch.is_tensor(positions):
        ok = positions.dtype == torch.bool or not (positions.dtype.is_floating_point
                                                   or positions.dtype.is_complex)
    else:
        try:
            items = list(positions)
        except TypeError:
            items = [positions]
        ok = all((isinstance(p, (int, np.integer)) and not isinstance(p, bool))
                 or (torch.is_tensor(p) and p.ndim == 0 and not p.dtype.is_floating_point
                     and not p.dtype.is_complex and p.dtype != torch.bool) for p in items)
        ok = ok or (len(items) > 0 and all(isinstance(p, (bool, np.bool_)) for p in items))
    if not ok:
        raise ValueError(f"{name}: must be integer indices or a bool mask, got {positions!r}")
    return positions


def describe_site(layers: Sequence[int] | None, heads: Sequence[int] | None,
                  positions: PositionSpec, all_layers: str = "") -> str:
    """The layers / heads / positions part of an intervention's description.

    Example:
        >>> describe_site([1], None, None), describe_site(None, [0, 2], [3], all_layers=" all layers")
        (' layers [1]', ' all layers heads [0, 2] chosen positions')
    """
    return "".join([f" layers {layers}" if layers is not None else all_layers,
                    f" heads {heads}" if heads is not None else "",
                    " chosen positions" if positions is not None else ""])


def head_axis(hook_name: str) -> int | None:
    """The head axis of the activation at ``hook_name`` (2 for q/k/v/z, 1 for scores/pattern)."""
    return _HEAD_AXIS.get(hook_name.rsplit(".", 1)[-1])


def position_axis(hook_name: str) -> int:
    """The position axis: the query axis (2) for attention scores / patterns, else 1."""
    return 2 if head_axis(hook_name) == 1 else 1


def site_mask(
    shape: Sequence[int],
    hook_name: str,
    heads: Sequence[int] | None = None,
    positions: PositionSpec = None,
    device: torch.device | str | None = None,
) -> Bool[Tensor, "..."] | None:
    """A bool tensor broadcastable to ``shape``, True at the chosen heads and positions.

    Args:
        shape: shape of the activation at ``hook_name``.
        hook_name: decides which axes are heads and positions (see :func:`head_axis`).
        heads: head indices (0-based) or None for all; only for hooks with a head axis.
        positions: None (all), position indices, or a bool tensor ``[pos]`` / ``[batch, pos]``
            (e.g. ``batch.masked``: patch only at each matrix's masked entries). For attention
            scores / patterns these are query positions.

    Returns:
        None when both are None (every entry is selected).

    Example:
        >>> site_mask((2, 3, 4, 5), "blocks.0.attn.hook_z", heads=[1]).shape
        torch.Size([1, 1, 4, 1])
    """
    if heads is None and positions is None:
        return None
    ndim = len(shape)
    mask = torch.ones([1] * ndim, dtype=torch.bool, device=device)
    if heads is not None:
        ax = head_axis(hook_name)
        if ax is None:
            raise ValueError(f"heads: {hook_name!r} has no head axis; heads can be chosen only at "
                             f"{sorted(_HEAD_AXIS)}")
        idx = torch.as_tensor(list(heads), dtype=torch.long)
        if idx.numel() and (idx.min() < 0 or idx.max() >= shape[ax]):
            raise ValueError(f"heads: {idx.tolist()} out of range 0..{shape[ax] - 1} at {hook_name}")
        sel = torch.zeros(shape[ax], dtype=torch.bool)
        sel[idx] = True
        view = [1] * ndim
        view[ax] = shape[ax]
        mask = mask & sel.to(mask.device).view(view)
    if positions is not None:
        ax = position_axis(hook_name)
        n_pos = shape[ax]
        pos = torch.as_tensor(check_positions(positions)) if not torch.is_tensor(positions) \
            else check_positions(positions)
        view = [1] * ndim
        if pos.dtype == torch.bool:
            if pos.ndim == 1 and pos.shape[0] == n_pos:
                view[ax] = n_pos
            elif pos.ndim == 2 and pos.shape[1] == n_pos and pos.shape[0] in (1, shape[0]):
                view[0], view[ax] = pos.shape[0], n_pos
            else:
                raise ValueError(f"positions: a bool mask must have shape [{n_pos}] or "
                                 f"[{shape[0]}, {n_pos}] at {hook_name}, got {tuple(pos.shape)}")
            sel = pos
        else:
            idx = pos.to(torch.long).flatten()
            if idx.numel() and (idx.min() < -n_pos or idx.max() >= n_pos):
                raise ValueError(f"positions: {idx.tolist()} out of range 0..{n_pos - 1} at {hook_name}")
            sel = torch.zeros(n_pos, dtype=torch.bool)
            sel[idx] = True
            view[ax] = n_pos
        mask = mask & sel.to(mask.device).reshape(view)
    return mask
