"""Weight edits: the model's own forward pass, run with some parameters replaced.

Nothing here computes an activation: the transformer math lives in :mod:`tfmatcomp.models.components`
only, and a weight edit decides which tensors those components read. Two ways:

* :func:`assigned_parameters` (what ``applied`` uses): inside the context the named
  ``nn.Parameter`` objects hold the new tensors (their ``.data`` is swapped, the objects stay the
  same, so optimizers and references stay valid); the original tensors are put back untouched on
  exit, also after an exception or an interrupt at any point (``_ParameterSwap``).
* :func:`parameter_override_hooks` (what ``fwd_hooks`` uses): two hooks that substitute the
  parameters for the duration of one forward pass, as ``torch.func.functional_call`` does (the
  modules read plain tensors in place of their ``nn.Parameter`` entries). At ``embed.hook_embed``,
  the first hook point of the forward pass, the new tensors go in; at ``hook_readout``, the last,
  the original ``nn.Parameter`` objects come back. When a forward pass stops before
  ``hook_readout`` (it raised, or ``return_type="hidden"``), :meth:`tfmatcomp.HookedEncoder.hooks`
  (which ``run_with_hooks`` uses) puts them back when it removes the hooks
  (:attr:`~tfmatcomp.interventions.hook_fn.HookFn.release`). The substituted tensors are constants
  of the autograd graph: gradients through such a run are those of the edited model and do not
  flow into the replaced parameters.

The one parameter read before the first hook point is the token embedding ``embed.W_E``. A new
``embed.W_E`` is applied at ``embed.hook_embed`` by recovering each position's token id from the
activation (an exact row of the model's ``W_E``: the embedding is a lookup, :func:`lookup_ids`) and
embedding it again with the component's own lookup (:meth:`~tfmatcomp.models.components.BertEmbed.token_embed`)
and the new table. This needs the rows of ``W_E`` to be distinct and ``hook_embed`` not to have
been edited by anything but a token substitution; otherwise a ``ValueError`` says so, and
``applied`` is the way to go.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions.weights import parameter_override_hooks
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
    >>> tokens = torch.tensor([[1, 2, 0, 3]])
    >>> hooks = parameter_override_hooks(model, {"blocks.0.mlp.b_out": torch.ones(8)})
    >>> [name for name, _ in hooks]
    ['embed.hook_embed', 'hook_readout']
    >>> with assigned_parameters(model, {"blocks.0.mlp.b_out": torch.ones(8)}):
    ...     want = model(tokens)
    >>> torch.equal(model.run_with_hooks(tokens, fwd_hooks=hooks), want)
    True
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from tfmatcomp._interrupts import Undoable, undo_all
from tfmatcomp.interventions.hook_fn import FwdHook, HookFn

__all__ = ["parameter_override_hooks", "assigned_parameters", "checked_edits", "lookup_ids"]


def checked_edits(model, edits: Mapping[str, Tensor], who: str = "overrides") -> dict[str, Tensor]:
    """``edits`` as detached copies on each parameter's device and dtype, after checking them.

    Raises:
        ValueError: (naming ``who``) unknown parameter names or wrong shapes.

    Example:
        >>> import torch, tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> checked_edits(m, {"readout.b": [0.5]})["readout.b"]
        tensor([0.5000])
    """
    params = dict(model.named_parameters())
    unknown = sorted(set(edits) - set(params))
    if unknown:
        raise ValueError(f"{who}: unknown parameter names {unknown[:5]}; see "
                         "model.named_parameters()")
    out: dict[str, Tensor] = {}
    for name, value in edits.items():
        p = params[name]
        value = torch.as_tensor(value)
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(f"{who}: new value of {name!r} must have shape {tuple(p.shape)}, got "
                             f"{tuple(value.shape)}")
        out[name] = value.detach().to(device=p.device, dtype=p.dtype).clone()
    return out


class _ParameterSwap(Undoable):
    """Context: some ``nn.Parameter`` objects hold other tensors; :func:`assigned_parameters`.

    The snapshot ``[(parameter, original tensor), ...]`` is taken before the first swap; undoing
    assigns every original tensor back (cheap: references, no copies; idempotent), also when an
    exception or interrupt stopped the swaps half-way (``tfmatcomp._interrupts``).
    """

    def __init__(self, model, edits: Mapping[str, Tensor], who: str = "overrides"):
        self.model, self.edits, self.who = model, edits, who
        self.saved: list[tuple[torch.nn.Parameter, Tensor]] = []

    def _apply(self) -> Any:
        new = checked_edits(self.model, self.edits, self.who)
        params = dict(self.model.named_parameters())
        self.saved = [(params[name], params[name].data) for name in new]
        for (param, _), value in zip(self.saved, new.values()):
            param.data = value
        return self.model

    def _undo(self) -> None:
        def restore(param, original) -> None:
            param.data = original

        saved, self.saved = self.saved, []
        undo_all([(f"a parameter of shape {tuple(original.shape)}",
                   lambda p=param, o=original: restore(p, o)) for param, original in saved])


def assigned_parameters(model, edits: Mapping[str, Tensor], who: str = "overrides") -> _ParameterSwap:
    """Context: the named parameters hold the values of ``edits`` (yields the model).

    The ``nn.Parameter`` objects stay the same; their ``.data`` is swapped for copies of the new
    values and the original tensors are put back, untouched, on exit, also after an exception or a
    KeyboardInterrupt at any point of entering or leaving (``_ParameterSwap``). Activations
    cached inside the context keep the values they had (``hook_pos_embed`` is a view of ``W_pos``).

    Example:
        >>> import torch, tfmatcomp as tm
        >>> m = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
        >>> with assigned_parameters(m, {"embed.ln.w": torch.zeros(8)}):
        ...     m.embed.ln.w.sum().item()
        0.0
        >>> m.embed.ln.w.sum().item()
        8.0
    """
    return _ParameterSwap(model, edits, who)


class _Substitution:
    """Plain tensors in place of some ``nn.Parameter`` entries of a model's modules, and back.

    Both directions write every slot (no "already done" flag that an interrupted loop could leave
    wrong), so ``exit`` restores every original ``nn.Parameter`` whatever stopped ``enter``.
    """

    def __init__(self, model, new: Mapping[str, Tensor]):
        self.slots = []
        for name, value in new.items():
            prefix, _, leaf = name.rpartition(".")
            module = model.get_submodule(prefix)
            self.slots.append((module, leaf, module._parameters[leaf], value))

    def enter(self) -> None:
        for module, leaf, _, value in self.slots:
            module._parameters[leaf] = value

    def exit(self) -> None:
        for module, leaf, original, _ in self.slots:
            module._parameters[leaf] = original


def lookup_ids(embedded: Tensor, table: Tensor, what: str = "embed.W_E") -> Tensor:
    """Ids ``i`` with ``table[i] == embedded[..., :]`` exactly (inverse of an embedding lookup).

    Raises:
        ValueError: when some vector is not exactly a row of ``table``.

    Example:
        >>> table = torch.randn(5, 3)
        >>> lookup_ids(table[torch.tensor([[4, 0, 2]])], table).tolist()
        [[4, 0, 2]]
    """
    flat = embedded.reshape(-1, embedded.shape[-1])
    ids = torch.cdist(flat.float(), table.float()).argmin(-1) if flat.shape[0] else \
        torch.zeros(0, dtype=torch.long, device=flat.device)
    if not torch.equal(table[ids], flat):
        raise ValueError(f"{what}: the activations are not exact rows of the model's {what}, so the "
                         "token ids cannot be recovered (was this hook point edited by an earlier "
                         "hook?); apply the weight edit with .applied(model) instead")
    return ids.view(embedded.shape[:-1])


def parameter_override_hooks(
    model,
    overrides: Mapping[str, Tensor],
    label: str = "weights",
) -> list[FwdHook]:
    """Forward hooks that run ``model``'s own forward pass with ``overrides`` for its parameters.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder`.
        overrides: ``{parameter name: new value}`` (same shapes); values are copied to the
            parameter's device and dtype. Parameters not named keep their live values.
        label: shown in the hooks' ``repr``.

    Returns:
        ``[("embed.hook_embed", put the new values in), ("hook_readout", put the originals back)]``
        for the encoder; for the decoder ``[("hook_embed", put them in)]`` (no hook follows its
        unembedding, so the originals come back when ``model.hooks()`` removes the hooks)
        (see the module docs); the model's parameters are the originals again after every
        ``run_with_hooks`` / ``model.hooks()`` context.

    Raises:
        ValueError: unknown parameter names, wrong shapes, or (for ``embed.W_E``) a table whose
            rows are not distinct.
    """
    from tfmatcomp.models.hook_names import embed_hook_name, readout_hook_name

    new = checked_edits(model, overrides)
    table = model.embed.W_E  # the nn.Parameter object: the original rows, also while substituted
    if "embed.W_E" in new and torch.unique(table.detach(), dim=0).shape[0] != table.shape[0]:
        raise ValueError("embed.W_E: some rows are identical, so token ids cannot be recovered from "
                         "the embedding in hook form; apply the weight edit with .applied(model)")
    sub = _Substitution(model, new)

    def put_in(embedded: Tensor, hook: Any = None) -> Tensor | None:
        ids = lookup_ids(embedded, table.detach()) if "embed.W_E" in new else None
        sub.enter()
        return None if ids is None else getattr(model.embed, "token_embed", model.embed)(ids)

    def put_back(activation: Tensor, hook: Any = None) -> None:
        sub.exit()

    hooks = [(embed_hook_name(model), HookFn(put_in, "edit", f"{label}: parameters in", sub.exit))]
    last = readout_hook_name(model)  # None (decoder): they go back when the hooks are removed
    if last is not None:
        hooks.append((last, HookFn(put_back, "read", f"{label}: parameters back")))
    return hooks
