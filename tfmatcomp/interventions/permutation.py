"""Positional permutation: the embedding that encoded position ``i`` now represents position ``perm[i]``.

Following the papers (the workshop paper, Section 3.2.1: "the embedding originally encoding position i in the
input now represents position pi(i)"), the new positional table is

    W_pos_new[perm[i]] = W_pos[i]        equivalently        W_pos_new[j] = W_pos[inverse(perm)[j]]

so the token at position ``j`` is added the embedding that used to mean position ``inverse(perm)[j]``.
Only the first ``len(perm)`` rows are permuted (``perm`` is usually over the ``n^2`` positions of the
task); rows beyond stay. Stage ``"weights"``: ``applied`` rewrites ``embed.W_pos`` and restores it
bit-exactly; ``fwd_hooks`` substitutes the new table for the duration of each forward pass, so
``embed.hook_pos_embed`` ``[batch, pos, d_model]`` shows the permuted rows.

Example:
    >>> import torch, tfmatcomp as tm
    >>> from tfmatcomp.interventions import PositionalPermutation
    >>> model = tm.HookedEncoder(tm.EncoderConfig(n_layers=1, n_heads=2, d_model=8, d_mlp=8, n_ctx=3))
    >>> perm = PositionalPermutation([2, 0, 1])
    >>> new = perm.weight_edits(model)["embed.W_pos"]
    >>> torch.equal(new[2], model.W_pos[0]), torch.equal(new[0], model.W_pos[1])
    (True, True)
    >>> PositionalPermutation(seed=0, n_positions=16).permutation().shape  # sized without a model
    torch.Size([16])
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import torch
from torch import Tensor

from tfmatcomp.interventions.base import Intervention
from tfmatcomp.validation import check_int_list, check_positive_int, check_seed

__all__ = ["PositionalPermutation"]


#: The most positions a seeded permutation may have (checked before it is drawn).
MAX_POSITIONS = 1_000_000

class PositionalPermutation(Intervention):
    """Permute the positional embeddings: position ``perm[i]`` gets the embedding of position ``i``.

    Args:
        perm: a permutation of ``0..k-1`` (``k <= n_ctx``), as a sequence or a 1-D tensor.
        seed: instead of ``perm``, draw a uniform random permutation with
            ``torch.randperm(k, generator=torch.Generator().manual_seed(seed))``.
        n_positions: ``k`` for a seeded permutation (default: the model's ``n_ctx``); use the task's
            ``n_rows * n_cols`` when the model has more positions than the task uses.

    Example:
        >>> PositionalPermutation(seed=3, n_positions=4).permutation().tolist()
        [2, 3, 1, 0]
    """

    stage: ClassVar[str] = "weights"
    kind: ClassVar[str] = "positional_permutation"
    _optional = ("perm", "seed", "n_positions")

    def __init__(self, perm: Sequence[int] | Tensor | None = None, *, seed: int | None = None,
                 n_positions: int | None = None):
        if (perm is None) == (seed is None):
            raise ValueError("perm, seed: give exactly one of them")
        check_seed("seed", seed, allow_none=True)
        if perm is not None:
            if torch.is_tensor(perm) and (perm.dtype.is_floating_point or perm.dtype == torch.bool):
                raise ValueError(f"perm: must hold integers, got dtype {perm.dtype}")
            p = torch.tensor(check_int_list("perm", perm.flatten().tolist() if torch.is_tensor(perm)
                                            else perm), dtype=torch.long)
            if p.numel() == 0 or not torch.equal(p.sort().values, torch.arange(p.numel())):
                raise ValueError(f"perm: must be a permutation of 0..k-1, got {p.tolist()}")
            self._perm: Tensor | None = p
        else:
            self._perm = None
        self.seed = seed
        self.n_positions = check_positive_int("n_positions", n_positions, allow_none=True)
        if n_positions is not None and n_positions > MAX_POSITIONS:
            raise ValueError(f"n_positions: at most {MAX_POSITIONS:,} (a model's positions), got "
                             f"{n_positions:,}")

    def _to_data(self) -> dict[str, Any]:
        if self._perm is not None:
            return {"perm": self._perm.tolist()}
        return {"seed": self.seed, "n_positions": self.n_positions}

    def permutation(self, model=None) -> Tensor:
        """The permutation ``perm`` (CPU long tensor); needs ``model`` only for a seeded one without
        ``n_positions``."""
        if self._perm is not None:
            return self._perm
        k = self.n_positions
        if k is None:
            if model is None:
                raise ValueError("model: needed to size a seeded permutation without n_positions")
            k = model.cfg.n_ctx
        elif model is not None and k > model.cfg.n_ctx:  # checked before the permutation is drawn
            raise ValueError(f"n_positions: {k} is more than the model's {model.cfg.n_ctx} "
                             "positions (n_ctx)")
        return torch.randperm(k, generator=torch.Generator().manual_seed(int(self.seed)))

    def describe(self) -> str:
        what = f"seed {self.seed}" if self._perm is None else f"perm {self._perm.tolist()}"
        return (f"positional permutation ({what}): the embedding of position i is used at position "
                "perm[i] (embed.W_pos)")

    def acts_on(self, model) -> list[str]:
        from tfmatcomp.models.hook_names import pos_embed_param_name

        return [pos_embed_param_name(model)]

    def weight_edits(self, model, params: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        name, = self.acts_on(model)  # embed.W_pos (encoder) or pos_embed.W_pos (decoder)
        W = params[name] if params is not None else model.W_pos.detach()
        perm = self.permutation(model)
        if perm.numel() > W.shape[0]:
            raise ValueError(f"perm: has {perm.numel()} entries but the model has only "
                             f"{W.shape[0]} positions (n_ctx)")
        new = W.detach().clone()
        new[perm.to(W.device)] = W[:perm.numel()]
        return {name: new}
