"""Weight edits in hook form: run a model *as if* some parameters had other values.

:func:`parameter_override_hooks` turns ``{parameter name: new value}`` into TransformerLens forward
hooks that recompute, from the new values, exactly the activations those parameters produce, and
leave the model's parameters untouched. It is how weight-editing interventions
(:class:`~tfmatcomp.interventions.WeightTransplant`,
:class:`~tfmatcomp.interventions.PositionalPermutation`) implement ``fwd_hooks``; ``applied`` writes
the parameters instead. Both give the same predictions (checked bit for bit in the tests on CPU).

Which hook recomputes what (``l`` a layer; the recorder hooks read the activation the real module
consumes and are ordered after every edit at their hook point):

* ``blocks.l.attn.W_Q / b_Q`` (K, V alike): edits ``blocks.l.attn.hook_q`` (``hook_k``,
  ``hook_v``); records ``blocks.l.hook_resid_pre``.
* ``blocks.l.attn.W_O / b_O``: edits ``blocks.l.hook_attn_out``; records ``blocks.l.attn.hook_z``.
* ``blocks.l.ln1.w / b``: edits ``blocks.l.ln1.hook_normalized``; records ``blocks.l.hook_resid_mid``
  and ``blocks.l.ln1.hook_scale``.
* ``blocks.l.mlp.W_in / b_in``: edits ``blocks.l.mlp.hook_pre``; records ``blocks.l.ln1.hook_normalized``.
* ``blocks.l.mlp.W_out / b_out``: edits ``blocks.l.hook_mlp_out``; records ``blocks.l.mlp.hook_post``.
* ``blocks.l.ln2.w / b``: edits ``blocks.l.ln2.hook_normalized``; records ``blocks.l.hook_resid_post``
  and ``blocks.l.ln2.hook_scale``.
* ``embed.W_E``: edits ``embed.hook_embed``, from token ids recovered from the lookup (see below).
* ``embed.W_pos``: edits ``embed.hook_pos_embed``.
* ``embed.W_token_type``: edits ``embed.hook_token_type_embed``, from recovered type ids.
* ``embed.ln.w / b``: edits ``embed.ln.hook_normalized``; records ``embed.hook_embed``,
  ``embed.hook_pos_embed`` (and ``embed.hook_token_type_embed``) and ``embed.ln.hook_scale``.
* ``readout.W / b``: edits ``hook_readout``; records the last block's ``hook_normalized_resid_post``.

Token ids are not visible to hooks, so a new ``embed.W_E`` is applied by recovering each position's
id from ``embed.hook_embed`` (an exact row of the model's ``W_E``: the embedding is a lookup) and
looking it up in the new table. This needs the rows of ``W_E`` to be distinct and ``hook_embed`` not
to have been edited by anything but a token substitution; otherwise a ``ValueError`` says so, and
``applied`` (which writes the parameter) is the way to go.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions.weights import parameter_override_hooks
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=16, n_ctx=4))
    >>> tokens = torch.tensor([[1, 2, 0, 3]])
    >>> hooks = parameter_override_hooks(model, {"blocks.0.mlp.b_out": torch.ones(8)})
    >>> sorted({name for name, _ in hooks})
    ['blocks.0.hook_mlp_out', 'blocks.0.mlp.hook_post']
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from tfmatcomp.components.attention import Attention
from tfmatcomp.interventions.base import FwdHook, HookFn, order_hooks

__all__ = ["parameter_override_hooks", "lookup_ids"]


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


def _check_distinct_rows(table: Tensor, what: str) -> None:
    if torch.unique(table.detach(), dim=0).shape[0] != table.shape[0]:
        raise ValueError(f"{what}: some rows are identical, so token ids cannot be recovered from "
                         "the embedding in hook form; apply the weight edit with .applied(model)")


def _layer_norm(x: Tensor, scale: Tensor, w: Tensor, b: Tensor) -> Tensor:
    # the same operations, in the same order, as tfmatcomp.components.LayerNorm
    x = x - x.mean(-1, keepdim=True)
    return x / scale * w + b


def parameter_override_hooks(
    model,
    overrides: Mapping[str, Tensor],
    label: str = "weights",
) -> list[FwdHook]:
    """Forward hooks that make ``model`` compute as if ``overrides`` replaced its parameters.

    Args:
        model: a :class:`~tfmatcomp.HookedEncoder`.
        overrides: ``{parameter name: new value}`` (same shapes); values are moved to the
            parameter's device and dtype. Parameters not named keep their live values.
        label: shown in the hooks' ``repr``.

    Returns:
        ``[(hook_name, HookFn), ...]``, edits first and recorders last (see the module table).

    Raises:
        ValueError: unknown parameter names, wrong shapes, or (for ``embed.W_E`` /
            ``embed.W_token_type``) a table whose rows are not distinct.
    """
    params = dict(model.named_parameters())
    unknown = sorted(set(overrides) - set(params))
    if unknown:
        raise ValueError(f"overrides: unknown parameter names {unknown[:5]}; see "
                         "model.named_parameters()")
    new: dict[str, Tensor] = {}
    for name, value in overrides.items():
        p = params[name]
        value = torch.as_tensor(value)
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(f"overrides: {name!r} must have shape {tuple(p.shape)}, got "
                             f"{tuple(value.shape)}")
        new[name] = value.detach().to(device=p.device, dtype=p.dtype)

    def get(name: str) -> Tensor:
        return new[name] if name in new else params[name]

    state: dict[str, Tensor] = {}
    readers: list[str] = []
    hooks: list[FwdHook] = []

    def read(*names: str) -> None:
        for n in names:
            if n not in readers:
                readers.append(n)

    def edit(hook_name: str, compute: Callable[[Tensor], Tensor], what: str) -> None:
        def fn(act: Tensor, hook: Any = None) -> Tensor:
            return compute(act).to(act.dtype)

        hooks.append((hook_name, HookFn(fn, "edit", f"{label}: {what}")))

    def touched(*names: str) -> bool:
        return any(n in new for n in names)

    for l in range(model.cfg.n_layers):
        pre = f"blocks.{l}."
        for x in "QKV":
            W, b = f"{pre}attn.W_{x}", f"{pre}attn.b_{x}"
            if touched(W, b):
                read(pre + "hook_resid_pre")
                edit(f"{pre}attn.hook_{x.lower()}",
                     lambda act, W=W, b=b, src=pre + "hook_resid_pre":
                         Attention._project(state[src], get(W), get(b)), f"{W}, {b}")
        if touched(pre + "attn.W_O", pre + "attn.b_O"):
            read(pre + "attn.hook_z")

            def attn_out(act: Tensor, pre: str = pre) -> Tensor:
                z, W_O = state[pre + "attn.hook_z"], get(pre + "attn.W_O")
                h, e, d = W_O.shape
                return z.reshape(*z.shape[:2], h * e) @ W_O.reshape(h * e, d) + get(pre + "attn.b_O")

            edit(pre + "hook_attn_out", attn_out, pre + "attn.W_O, b_O")
        for ln, src in (("ln1", "hook_resid_mid"), ("ln2", "hook_resid_post")):
            if touched(f"{pre}{ln}.w", f"{pre}{ln}.b"):
                read(pre + src, f"{pre}{ln}.hook_scale")
                edit(f"{pre}{ln}.hook_normalized",
                     lambda act, ln=f"{pre}{ln}", src=pre + src:
                         _layer_norm(state[src], state[ln + ".hook_scale"], get(ln + ".w"),
                                     get(ln + ".b")), f"{pre}{ln}.w, b")
        if touched(pre + "mlp.W_in", pre + "mlp.b_in"):
            read(pre + "ln1.hook_normalized")
            edit(pre + "mlp.hook_pre",
                 lambda act, pre=pre: state[pre + "ln1.hook_normalized"] @ get(pre + "mlp.W_in")
                 + get(pre + "mlp.b_in"), pre + "mlp.W_in, b_in")
        if touched(pre + "mlp.W_out", pre + "mlp.b_out"):
            read(pre + "mlp.hook_post")
            edit(pre + "hook_mlp_out",
                 lambda act, pre=pre: state[pre + "mlp.hook_post"] @ get(pre + "mlp.W_out")
                 + get(pre + "mlp.b_out"), pre + "mlp.W_out, b_out")

    if "embed.W_E" in new:
        _check_distinct_rows(params["embed.W_E"], "embed.W_E")
        edit("embed.hook_embed",
             lambda act: F.embedding(lookup_ids(act, params["embed.W_E"], "embed.W_E"),
                                     new["embed.W_E"]), "embed.W_E")
    if "embed.W_pos" in new:
        edit("embed.hook_pos_embed",
             lambda act: new["embed.W_pos"][:act.shape[1]].unsqueeze(0).expand(act.shape[0], -1, -1),
             "embed.W_pos")
    if "embed.W_token_type" in new:
        _check_distinct_rows(params["embed.W_token_type"], "embed.W_token_type")
        edit("embed.hook_token_type_embed",
             lambda act: F.embedding(lookup_ids(act, params["embed.W_token_type"],
                                                "embed.W_token_type"), new["embed.W_token_type"]),
             "embed.W_token_type")
    if touched("embed.ln.w", "embed.ln.b"):
        has_type = model.embed.W_token_type is not None
        read("embed.hook_embed", "embed.hook_pos_embed", "embed.ln.hook_scale",
             *(["embed.hook_token_type_embed"] if has_type else []))

        def embed_ln(act: Tensor) -> Tensor:
            x = state["embed.hook_embed"] + state["embed.hook_pos_embed"]
            if has_type:
                x = x + state["embed.hook_token_type_embed"]
            return _layer_norm(x, state["embed.ln.hook_scale"], get("embed.ln.w"), get("embed.ln.b"))

        edit("embed.ln.hook_normalized", embed_ln, "embed.ln.w, b")
    if touched("readout.W", "readout.b"):
        last = (f"blocks.{model.cfg.n_layers - 1}.hook_normalized_resid_post"
                if model.cfg.n_layers else "hook_full_embed")
        read(last)

        def readout(act: Tensor, last: str = last) -> Tensor:
            out = state[last] @ get("readout.W") + get("readout.b")
            return out.squeeze(-1) if out.shape[-1] == 1 else out

        edit("hook_readout", readout, "readout.W, b")

    for name in readers:
        def record(act: Tensor, hook: Any = None, name: str = name) -> None:
            state[name] = act
            return None

        hooks.append((name, HookFn(record, "read", f"{label}: record {name}")))
    return order_hooks(hooks)
