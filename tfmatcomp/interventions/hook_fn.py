"""Hook functions with a role, and the order in which composed hooks run.

Interventions hand TransformerLens ``(hook_name, fn)`` pairs to ``model.run_with_hooks``; a
:class:`HookFn` is such an ``fn`` that also says what it does (``role``), where it came from
(``label``) and, optionally, what to undo when the hooks are removed (``release``).

Example:
    >>> from tfmatcomp.interventions.hook_fn import HookFn, order_hooks
    >>> read, edit = HookFn(lambda a, h: None, "read"), HookFn(lambda a, h: a)
    >>> [fn.role for _, fn in order_hooks([("x", read), ("x", edit)])]
    ['edit', 'read']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

from torch import Tensor

__all__ = ["HookFn", "FwdHook", "order_hooks"]


@dataclass(frozen=True)
class HookFn:
    """A TransformerLens hook function ``fn(activation, hook) -> new activation | None`` with a role.

    ``role="edit"`` returns a replacement activation (or None to keep it); ``role="read"`` returns
    None and is ordered after every edit at its hook point when interventions compose. ``label``
    names the intervention it came from (shown in ``repr``). ``release``, when given, is called by
    :meth:`tfmatcomp.HookedEncoder.hooks` (and so ``run_with_hooks``) when the hooks are removed,
    also when the forward pass raised or stopped before the last hook point; weight edits in hook
    form use it to put the original parameters back. It must be idempotent and must not depend on
    how far the hook itself got (an interrupt can stop the hook anywhere): put everything back
    unconditionally, as ``weights._Substitution.exit`` does.
    """

    fn: Callable[[Tensor, Any], Tensor | None]
    role: Literal["edit", "read"] = "edit"
    label: str = ""
    release: Callable[[], None] | None = None

    def __call__(self, activation: Tensor, hook: Any = None) -> Tensor | None:
        return self.fn(activation, hook)

    def __repr__(self) -> str:
        return f"HookFn({self.role}{': ' + self.label if self.label else ''})"


FwdHook = tuple[str, Callable[..., Any]]


def order_hooks(hooks: Iterable[FwdHook]) -> list[FwdHook]:
    """Stable reorder: every read-only :class:`HookFn` after all edits (see
    :mod:`tfmatcomp.interventions.base`, composition step 4)."""
    hooks = list(hooks)
    edits = [h for h in hooks if getattr(h[1], "role", "edit") != "read"]
    reads = [h for h in hooks if getattr(h[1], "role", "edit") == "read"]
    return edits + reads
