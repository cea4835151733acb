"""The hook plumbing both hooked models share (:class:`~tfmatcomp.HookedEncoder`,
:class:`~tfmatcomp.HookedDecoder`): checked hook names, the interrupt-safe ``hooks`` context,
``run_with_cache``, ``unfused``, token checks and the weights stacked over layers.

A subclass sets ``cfg`` (with ``n_ctx``, ``d_vocab``), ``embed.W_E`` and ``blocks`` (each with
``attn`` and ``mlp``), and calls ``setup()`` at the end of its ``__init__``.

Example:
    >>> import tfmatcomp as tm
    >>> from tfmatcomp.models.hooked_base import HookedBase
    >>> isinstance(tm.HookedEncoder(tm.get_preset("tiny").model), HookedBase)
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from typing import Any, Callable, Iterator

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import ActivationCache, FactoredMatrix, HookedRootModule

from tfmatcomp._interrupts import Undoable, undo_all
from tfmatcomp.validation import check_bool, check_seed, shape_text

__all__ = ["HookedBase", "UnknownHookError"]

class UnknownHookError(ValueError):
    """A hook name that the model does not have."""


class _HookContext(Undoable):
    """``HookedBase.hooks``: hooks added at a new context level, removed on exit (idempotent)."""

    def __init__(self, model, fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
        self.model, self.fwd, self.bwd = model, list(fwd_hooks), list(bwd_hooks)
        for what, pairs in (("fwd_hooks", self.fwd), ("bwd_hooks", self.bwd)):
            for pair in pairs:
                if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and callable(pair[1])):
                    raise ValueError(f"{what}: each entry must be a (hook name, function) pair, "
                                     f"got {pair!r}")
        self.reset_hooks_end, self.clear_contexts = reset_hooks_end, clear_contexts
        self.level: int | None = None

    def _apply(self) -> "HookedBase":
        model = self.model
        for name, _ in self.fwd + self.bwd:
            model._check_hook_name(name)
        self.level = model.context_level + 1
        model.context_level = self.level
        for direction, pairs in (("fwd", self.fwd), ("bwd", self.bwd)):
            for name, hook in pairs:
                model._enable_hook(name=name, hook=hook, dir=direction)
        return model

    def _undo(self) -> None:
        if self.level is None:
            return
        level, model = self.level, self.model
        steps = []
        if self.reset_hooks_end:
            def reset() -> None:
                try:
                    model.reset_hooks(self.clear_contexts, including_permanent=False, level=level)
                except Exception:  # fall back to each hook point, so that none keeps a hook
                    undo_all([(f"the hooks at {name}", lambda hp=hp: hp.remove_hooks(
                        "both", including_permanent=False, level=level))
                        for name, hp in model.hook_dict.items()])
            steps.append(("the hooks added", reset))
        steps += [(f"the hook {getattr(fn, '__name__', fn)!r}", fn.release)
                  for _, fn in self.fwd + self.bwd if callable(getattr(fn, "release", None))]
        self.level = None
        try:
            undo_all(steps)
        finally:
            model.context_level = level - 1



class HookedBase(HookedRootModule):
    """TransformerLens's ``HookedRootModule`` with checked hook names and interrupt-safe contexts."""

    cfg: Any
    #: the config dataclass this model is built from
    cfg_class: type
    #: the class ``run_with_cache`` wraps the activations in (the encoder's refuses pre-LN helpers)
    _cache_class: type = ActivationCache

    def __init__(self, cfg: Any, seed: int = 0):
        """Check ``cfg`` is this model's config class (``cfg_class``) and ``seed``, then keep cfg."""
        super().__init__()
        if not isinstance(cfg, self.cfg_class):
            name = self.cfg_class.__name__
            raise TypeError(f"cfg: expected {'an' if name[0] in 'AEIOU' else 'a'} {name}, got "
                            f"{type(cfg).__name__}")
        check_seed("seed", seed)
        # the model's own copy (equal to ``cfg``): it records the model's device for
        # TransformerLens's tools, which read ``model.cfg.device``
        self.cfg = dataclasses.replace(cfg)
        object.__setattr__(self.cfg, "device", torch.device("cpu"))
        #: the task the model was trained on, when known (set by ``load_checkpoint``,
        #: ``load_pretrained`` and the trainer): analyses use it when given no task
        self.task_cfg = None

    @staticmethod
    def _with_batch_axis(matrices: Any, observed: Any) -> tuple[Tensor, Tensor | None]:
        """``to_tokens``'s ``matrices`` (and ``observed``) as tensors with a batch axis:
        ``[n_rows, n_cols]`` becomes ``[1, n_rows, n_cols]``; other shapes but
        ``[batch, n_rows, n_cols]`` raise ``ValueError`` naming ``matrices``."""
        matrices = torch.as_tensor(matrices)
        if matrices.ndim not in (2, 3):
            raise ValueError(f"matrices: expected [batch, n_rows, n_cols] or [n_rows, n_cols], got "
                             f"shape {tuple(matrices.shape)}")
        if matrices.ndim == 2:
            matrices = matrices[None]
            observed = None if observed is None else torch.as_tensor(observed)[None]
        return matrices, observed

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """Re-initialize every parameter from ``generator`` (CPU), as HuggingFace does for BERT
        and GPT-2: LayerNorm weights 1, biases 0, every other weight normal with standard
        deviation ``cfg.init_range / init_divisor(name)``, in parameter order; the parameters
        whose :meth:`init_divisor` is None are left to :meth:`init_own_weights`, called last."""
        std = self.cfg.init_range
        for name, p in self.named_parameters():
            divisor = self.init_divisor(name)
            if divisor is None:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "w":  # LayerNorm weight
                p.fill_(1.0)
            elif leaf.startswith("b"):  # biases, LayerNorm bias
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * std / divisor)
        self.init_own_weights(generator)

    def init_divisor(self, name: str) -> float | None:
        """What divides ``cfg.init_range`` for parameter ``name`` in :meth:`init_weights` (1 here),
        or None for a parameter the model initializes in :meth:`init_own_weights`."""
        return 1.0

    def init_own_weights(self, generator: torch.Generator) -> None:
        """The model's own initialization after the shared one of :meth:`init_weights` (nothing
        here)."""

    def check_tokens(self, tokens: Tensor, name: str = "tokens") -> None:
        """Raise ``ValueError`` naming ``name`` unless ``tokens`` is a valid ``[batch, pos]`` id tensor."""
        if not torch.is_tensor(tokens) or tokens.ndim != 2:
            raise ValueError(f"{name}: expected an integer tensor [batch, pos], got "
                             f"{shape_text(tokens)}")
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise ValueError(f"{name}: token ids must be integers, got dtype {tokens.dtype}")
        if tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(f"{name}: sequence length {tokens.shape[1]} exceeds n_ctx "
                             f"{self.cfg.n_ctx}; allowed lengths are 1..{self.cfg.n_ctx}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.cfg.d_vocab):
            raise ValueError(f"{name}: token ids must lie in [0, {self.cfg.d_vocab - 1}]; got min "
                             f"{tokens.min().item()}, max {tokens.max().item()}")


    # ------------------------------------------------------ hook name checks
    def _check_hook_name(self, name: Any) -> None:
        if isinstance(name, str) and name not in self.hook_dict:
            close = difflib.get_close_matches(name, list(self.hook_dict), n=3)
            hint = f"; did you mean {close}?" if close else "; see model.hook_dict for all names"
            raise UnknownHookError(f"hook name: {name!r} is not a hook of this model{hint}")

    def _check_names_filter(self, names_filter: Any) -> None:
        """Refuse a ``names_filter`` that matches no hook (TransformerLens returns an empty cache):
        unknown names get a did-you-mean, a function that selects nothing says so."""
        if names_filter is None:
            return
        if isinstance(names_filter, str):
            self._check_hook_name(names_filter)
        elif isinstance(names_filter, (list, tuple)):
            for name in names_filter:
                self._check_hook_name(name)
            if not names_filter:
                raise UnknownHookError("names_filter: an empty list caches nothing; give hook "
                                       "names (see model.hook_dict), or None for every hook")
        elif callable(names_filter) and not any(names_filter(n) for n in self.hook_dict):
            raise UnknownHookError("names_filter: the function matches no hook of this model, so "
                                   "the cache would be empty; see model.hook_dict for the names")

    def add_hook(self, name, hook, dir="fwd", is_permanent=False, level=None, prepend=False) -> None:
        self._check_hook_name(name)
        super().add_hook(name, hook, dir=dir, is_permanent=is_permanent, level=level,
                         prepend=prepend)

    def hooks(self, fwd_hooks=[], bwd_hooks=[], reset_hooks_end=True, clear_contexts=False):
        """TransformerLens's ``hooks`` context, after checking the hook names, and safe against
        interrupts: an exception or a KeyboardInterrupt at any point of entering, of the body or of
        leaving removes every hook it added (see ``tfmatcomp._interrupts``). On exit it also
        calls ``fn.release()`` of every hook function that has one (weight edits in hook form put
        the original parameters back that way)."""
        return _HookContext(self, fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts)

    def run_with_cache(self, *model_args: Any, return_cache_object: bool = True,
                       remove_batch_dim: bool = False, **kwargs: Any):
        """Run the model and cache activations, as TransformerLens's ``run_with_cache``.

        Returns ``(output, cache)`` with ``cache`` a ``transformer_lens.ActivationCache`` (for
        the encoder an :class:`~tfmatcomp.models.cache.EncoderActivationCache`, whose pre-LN helpers
        raise instead of returning wrong numbers; a plain dict when
        ``return_cache_object=False``). Accepts ``names_filter``, ``device``, ``remove_batch_dim``
        and the forward's keyword arguments.
        """
        self._check_names_filter(kwargs.get("names_filter"))
        if remove_batch_dim and model_args and torch.is_tensor(model_args[0]):
            batch = model_args[0].shape[0] if model_args[0].ndim > 0 else 1
            if batch != 1:  # TransformerLens's rule (an AssertionError there)
                raise ValueError(f"remove_batch_dim: cannot remove the batch dimension from a "
                                 f"cache of batch size {batch}; it needs a batch of 1")
        was_caching = getattr(self, "is_caching", False)
        try:
            out, cache = super().run_with_cache(*model_args, **kwargs)
        finally:  # TransformerLens sets it before its hooks' context: an interrupt there left it
            self.is_caching = was_caching
        if remove_batch_dim:  # here, not in TransformerLens: 3.x fails on [batch, pos] hooks
            cache = {name: act[0] for name, act in cache.items()}
        if return_cache_object:
            cache = self._cache_class(cache, self, has_batch_dim=not remove_batch_dim)
        return out, cache

    @contextlib.contextmanager
    def unfused(self, layer_norm: bool = True) -> Iterator["HookedBase"]:
        """Inside this context every attention and LayerNorm takes its explicit, hookable path
        (with ``layer_norm=False`` only the attention: the fast CPU step's choice).

        Outside it, a component with no active hook uses a fused kernel (SDPA, ``F.layer_norm``):
        the same function, but rounded differently (~1e-7). Use this context when comparing runs
        bit for bit, e.g. a run with a hook against one without.

        Example:
            >>> import torch, tfmatcomp as tm
            >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
            >>> tokens = torch.ones(2, 16, dtype=torch.long)
            >>> with model.unfused():
            ...     same = torch.equal(model(tokens), model.run_with_cache(tokens)[0])
            >>> same
            True
        """
        modules = [m for m in self.modules() if hasattr(m, "fused")
                   and (layer_norm or hasattr(m, "W_Q"))]
        before = [m.fused for m in modules]
        for m in modules:
            m.fused = False
        try:
            yield self
        finally:
            for m, flag in zip(modules, before):
                m.fused = flag

    @classmethod
    def uninitialized(cls, cfg: Any, device: torch.device | str | None = None):
        """The model for ``cfg`` without its random initialization (its weights are whatever memory
        held, or shapes only on ``device="meta"``): for loading weights into, at no cost of
        random draws (which on the meta device would also import torch's compiler).

        Example:
            >>> import tfmatcomp as tm
            >>> shell = tm.HookedEncoder.uninitialized(tm.get_preset("tiny").model, device="meta")
            >>> type(shell).__name__, shell.W_E.device.type
            ('HookedEncoder', 'meta')
        """
        shell = type(cls.__name__, (cls,), {"init_weights": lambda self, generator: None})
        with torch.device(device) if device is not None else contextlib.nullcontext():
            model = shell(cfg)
        model.__class__ = cls
        if device is not None:
            object.__setattr__(model.cfg, "device", torch.device(device))
        return model

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """TransformerLens's switch: with True every attention layer computes each head's output
        ``z @ W_O`` separately at ``blocks.{l}.attn.hook_result`` ``[batch, pos, head, d_model]``
        (``cache["result", l]``; their sum plus ``b_O`` is ``hook_attn_out``). Off by default: it
        costs memory, and the attention takes its explicit path while it is on.

        Example:
            >>> import torch, tfmatcomp as tm
            >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
            >>> model.set_use_attn_result(True)
            >>> _, cache = model.run_with_cache(torch.ones(2, 16, dtype=torch.long))
            >>> cache["result", 0].shape
            torch.Size([2, 16, 4, 64])
        """
        check_bool("use_attn_result", use_attn_result)
        for block in self.blocks:
            block.attn.use_attn_result = use_attn_result

    def active_hook_count(self) -> int:
        """Number of hook functions currently registered on the model's hook points (0 when clean)."""
        return sum(len(hp.fwd_hooks) + len(hp.bwd_hooks) for hp in self.hook_dict.values())

    # ----------------------------------------------------- stacked weights
    def _stack(self, get: Callable[[nn.Module], Tensor]) -> Tensor:
        return torch.stack([get(block) for block in self.blocks])

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.W_E

    @property
    def W_Q(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._stack(lambda b: b.attn.W_Q)

    @property
    def W_K(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._stack(lambda b: b.attn.W_K)

    @property
    def W_V(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._stack(lambda b: b.attn.W_V)

    @property
    def W_O(self) -> Float[Tensor, "n_layers n_heads d_head d_model"]:
        return self._stack(lambda b: b.attn.W_O)

    @property
    def b_Q(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._stack(lambda b: b.attn.b_Q)

    @property
    def b_K(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._stack(lambda b: b.attn.b_K)

    @property
    def b_V(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._stack(lambda b: b.attn.b_V)

    @property
    def b_O(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stack(lambda b: b.attn.b_O)

    @property
    def W_in(self) -> Float[Tensor, "n_layers d_model d_mlp"]:
        return self._stack(lambda b: b.mlp.W_in)

    @property
    def W_out(self) -> Float[Tensor, "n_layers d_mlp d_model"]:
        return self._stack(lambda b: b.mlp.W_out)

    @property
    def b_in(self) -> Float[Tensor, "n_layers d_mlp"]:
        return self._stack(lambda b: b.mlp.b_in)

    @property
    def b_out(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stack(lambda b: b.mlp.b_out)

    @property
    def QK(self) -> FactoredMatrix:
        """``W_Q @ W_K^T`` per head, ``[n_layers, n_heads, d_model, d_model]`` (TransformerLens's QK:
        the bilinear form of the attention scores, before the ``1/sqrt(d_head)`` scale and biases).

        Example:
            >>> import tfmatcomp as tm
            >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
            >>> model.QK.shape, model.all_head_labels[:2]
            (torch.Size([2, 4, 64, 64]), ['L0H0', 'L0H1'])
        """
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """``W_V @ W_O`` per head, ``[n_layers, n_heads, d_model, d_model]`` (TransformerLens's OV)."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def all_head_labels(self) -> list[str]:
        """``["L0H0", "L0H1", ...]``, layer-major, as TransformerLens labels heads."""
        return [f"L{l}H{h}" for l in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]

    @property
    def device(self) -> torch.device:
        return self.embed.W_E.device

    def _apply(self, fn, recurse: bool = True):
        """``nn.Module._apply`` (behind ``.to``, ``.cuda``, ``.half``), then ``cfg.device`` set to
        where the weights now are."""
        out = super()._apply(fn, recurse)
        if getattr(self, "embed", None) is not None:
            object.__setattr__(self.cfg, "device", self.embed.W_E.device)
        return out

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.W_E.dtype

