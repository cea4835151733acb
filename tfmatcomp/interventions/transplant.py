"""Weight transplant ("model switching"): the recipient temporarily uses a donor's parameters.

The papers copy the query, key and value weights and biases of all layers from one checkpoint into
another (pre-shift -> post-shift and post-shift -> pre-shift), leaving the output projection and the
LayerNorms alone (group ``"qkv"``, the default); a second variant copies everything except attention
(``"all_but_attn"``). ``params`` takes any group of :mod:`tfmatcomp.models.param_groups` (shared with
component-wise training; ``"attention"`` includes ``ln1``, ``"mlp"`` includes ``ln2``, ``"embed"``
includes ``embed.ln``; ``"attn"`` is an alias of ``"attention"``):
``"qkv"``, ``"attn_out"``, ``"attention"``, ``"mlp"``, ``"embed"``, ``"token_embed"``,
``"pos_embed"``, ``"ln"``, ``"readout"``, ``"all_but_attn"``, ``"all"``;
or explicit parameter names (``"blocks.0.attn.W_Q"``), mixed freely. ``layers`` restricts block
parameters to some layers (0-based); parameters outside blocks are not affected by it.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions import WeightTransplant
    >>> cfg = tm.EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_mlp=8, n_ctx=4)
    >>> recipient, donor = tm.HookedEncoder(cfg, seed=0), tm.HookedEncoder(cfg, seed=1)
    >>> t = WeightTransplant(donor)                     # Q/K/V of all layers
    >>> len(t.parameter_names(recipient))
    12
    >>> before = recipient.blocks[0].attn.W_Q.clone()
    >>> with t.applied(recipient):
    ...     torch.equal(recipient.blocks[0].attn.W_Q, donor.blocks[0].attn.W_Q)
    True
    >>> torch.equal(recipient.blocks[0].attn.W_Q, before)
    True
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Iterable, Mapping

import torch
from torch import Tensor

from tfmatcomp.interventions.base import Intervention
from tfmatcomp.interventions.serialize import check_fields, tensor_from_data, tensor_to_data
from tfmatcomp.models.hook_names import check_layers
from tfmatcomp.models.objectives import DEFAULT_KIND, OBJECTIVES, objective_for
from tfmatcomp.models.param_groups import GROUPS, group_predicate
from tfmatcomp.validation import check_bool, check_int_list

__all__ = ["WeightTransplant", "DonorMismatchError"]


class DonorMismatchError(ValueError):
    """The donor's config or parameter shapes differ from the recipient's."""




class WeightTransplant(Intervention):
    """The recipient computes with the donor's parameters for the chosen group(s).

    Args:
        donor: a :class:`~tfmatcomp.HookedEncoder` with the same config as the recipient, or the
            path of a checkpoint (loaded on the CPU; ``to_dict`` then refers to it by path and
            step instead of writing the donor's weights).
        params: a group name (:mod:`tfmatcomp.models.param_groups`), a parameter name, or a list of them. Default
            ``"qkv"``: query, key and value weights and biases of all layers (the papers').
        layers: 0-based layers whose block parameters are transplanted (default: all).
        strict: True (default) refuses a donor whose config differs in any field; False only
            requires equal parameter shapes.

    Stage ``"weights"``: ``applied`` copies the donor's values into the recipient's parameters and
    restores the originals bit-exactly on exit; ``fwd_hooks`` substitutes them for the duration of
    each forward pass instead (:func:`~tfmatcomp.interventions.weights.parameter_override_hooks`).

    Raises:
        DonorMismatchError: (when used) the donor's config or shapes do not match the recipient's.
        ValueError: an unknown group / parameter name, or a selection that is empty.

    Example:
        >>> import tfmatcomp as tm
        >>> cfg = tm.EncoderConfig(n_layers=2, n_heads=2, d_model=8, d_mlp=8, n_ctx=4)
        >>> WeightTransplant(tm.HookedEncoder(cfg), params=["attn_out", "blocks.0.ln1.w"], layers=[0]
        ...                  ).parameter_names(tm.HookedEncoder(cfg))
        ['blocks.0.attn.W_O', 'blocks.0.attn.b_O', 'blocks.0.ln1.w']
    """

    stage: ClassVar[str] = "weights"
    kind: ClassVar[str] = "weight_transplant"
    _required = ("donor",)
    _optional = ("params", "layers", "strict")

    def __init__(self, donor, params: str | Iterable[str] = "qkv", layers: Iterable[int] | None = None,
                 strict: bool = True):
        #: ``{"checkpoint": path, "step": step}`` when the donor was given as a checkpoint path.
        self.donor_checkpoint: dict[str, Any] | None = None
        if isinstance(donor, (str, os.PathLike)):
            from tfmatcomp.runs.checkpoint import load_checkpoint_info

            donor, info = load_checkpoint_info(donor)
            self.donor_checkpoint = {"checkpoint": str(info.path), "step": info.step}
        if not hasattr(donor, "named_parameters") or not hasattr(donor, "cfg"):
            raise TypeError(f"donor: expected a HookedEncoder or HookedDecoder, got "
                            f"{type(donor).__name__}")
        self.donor = donor
        self.params = [params] if isinstance(params, str) else (
            list(params) if hasattr(params, "__iter__") else [])
        if not self.params or not all(isinstance(p, str) for p in self.params):
            raise ValueError(f"params: give a group {sorted(GROUPS)} or parameter name, or a "
                             f"non-empty list of them, got {params!r}")
        self.layers = None if layers is None else sorted(set(check_int_list("layers", layers, lo=0)))
        self.strict = check_bool("strict", strict)

    def describe(self) -> str:
        layers = "all layers" if self.layers is None else f"layers {self.layers} (0-based)"
        ref = self.donor_checkpoint
        donor = "the donor" if ref is None else f"the donor {ref['checkpoint']} (step {ref['step']})"
        return f"weight transplant of {', '.join(self.params)} ({layers}) from {donor}"

    def _to_data(self) -> dict[str, Any]:
        donor = self.donor_checkpoint or {  # no path known: the transplanted values themselves
            **({"kind": kind} if (kind := objective_for(self.donor.cfg).kind) != DEFAULT_KIND
               else {}),
            "config": self.donor.cfg.to_dict(),
            "parameters": {n: tensor_to_data(p) for n, p in self.donor.named_parameters()
                           if n in set(self.parameter_names(self.donor))}}
        return {"donor": dict(donor), "params": list(self.params), "layers": self.layers,
                "strict": self.strict}

    @classmethod
    def _from_data(cls, fields: dict[str, Any], where: str) -> "WeightTransplant":
        where = f"{where}.donor"
        donor = check_fields(fields["donor"], where, (),
                             ("checkpoint", "step", "kind", "config", "parameters"))
        if "checkpoint" in donor:
            check_fields(donor, where, ("checkpoint",), ("step",))
            iv = cls(**{**fields, "donor": donor["checkpoint"]})
            if donor.get("step") is not None and iv.donor_checkpoint["step"] != donor["step"]:
                raise ValueError(f"{where}: checkpoint {donor['checkpoint']} is at step "
                                 f"{iv.donor_checkpoint['step']}, the record says {donor['step']}")
            return iv
        check_fields(donor, where, ("config", "parameters"), ("kind",))
        values = {n: tensor_from_data(t, f"{where}.parameters[{n!r}]")
                  for n, t in dict(donor["parameters"]).items()}
        kind = donor.get("kind", DEFAULT_KIND)
        if kind not in OBJECTIVES:
            raise ValueError(f"{where}.kind: must be one of {sorted(OBJECTIVES)}, got {kind!r}")
        objective = OBJECTIVES[kind]
        model = objective.model_class(objective.config_class.from_dict(donor["config"]))
        if values:
            model = model.to(next(iter(values.values())).dtype)
        own = dict(model.named_parameters())
        with torch.no_grad():
            for n, value in values.items():
                if n not in own or own[n].shape != value.shape:
                    raise ValueError(f"{where}.parameters: {n!r} is not a parameter of shape "
                                     f"{tuple(value.shape)} of a model with this config")
                own[n].copy_(value)
        return cls(**{**fields, "donor": model})

    def parameter_names(self, model) -> list[str]:
        """The recipient parameters that are transplanted, in the model's order."""
        names = [n for n, _ in model.named_parameters()]
        chosen: set[str] = set()
        for item in self.params:
            if item in GROUPS:
                chosen.update(filter(group_predicate(item), names))
            elif item in names:
                chosen.add(item)
            else:
                raise ValueError(f"params: {item!r} is neither a group {sorted(GROUPS)} "
                                 f"nor a parameter name of the model (e.g. {names[1]!r})")
        if self.layers is not None:
            keep = {f"blocks.{l}." for l in check_layers(self.layers, model.cfg.n_layers)}
            chosen = {n for n in chosen if not n.startswith("blocks.") or
                      any(n.startswith(k) for k in keep)}
        if not chosen:
            raise ValueError(f"params: {self.params} with layers {self.layers} selects no parameter")
        return [n for n in names if n in chosen]

    def acts_on(self, model) -> list[str]:
        return self.parameter_names(model)

    def check_donor(self, model) -> None:
        """Raise :class:`DonorMismatchError` unless the donor fits ``model``."""
        if self.strict and self.donor.cfg != model.cfg:
            theirs, ours = self.donor.cfg.to_dict(), model.cfg.to_dict()
            diff = {k: (ours[k], theirs.get(k)) for k in ours if ours[k] != theirs.get(k)}
            raise DonorMismatchError(f"donor: its config differs from the recipient's; (recipient, "
                                     f"donor) per field: {diff}. Pass strict=False to only require "
                                     "equal parameter shapes")
        donor_params = dict(self.donor.named_parameters())
        for name, p in model.named_parameters():
            if name not in donor_params:
                raise DonorMismatchError(f"donor: has no parameter {name!r}")
            if donor_params[name].shape != p.shape:
                raise DonorMismatchError(f"donor: {name!r} has shape {tuple(donor_params[name].shape)}"
                                         f", the recipient's has {tuple(p.shape)}")

    def weight_edits(self, model, params: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        self.check_donor(model)
        donor_params = dict(self.donor.named_parameters())
        own = dict(model.named_parameters())
        return {n: donor_params[n].detach().to(device=own[n].device, dtype=own[n].dtype).clone()
                for n in self.parameter_names(model)}

