"""Real value <-> token id, exactly as the matrix-completion papers tokenize, but rounding correctly.

Values live on the grid ``[-10, 10]`` in steps of ``0.01``. The id of a value ``v`` is
``1 + round(100 * (v + 10))``: ``-10.00 -> 1``, ``0.00 -> 1001``, ``10.00 -> 2001``. Id ``0`` is the
``MASK`` token. The vocabulary therefore has 2002 entries.

The papers' reference code converts with a truncating cast, which maps 36 values at or below
``-5.01`` one id too low. :class:`ValueTokenizer` rounds in float64 and is exact on the whole grid.

Example:
    >>> import torch
    >>> from tfmatcomp import ValueTokenizer
    >>> tok = ValueTokenizer()
    >>> tok.encode(torch.tensor([-10.0, 0.0, 0.44, 10.0])).tolist()
    [1, 1001, 1045, 2001]
    >>> [round(v, 2) for v in tok.decode(torch.tensor([0, 1001, 1045])).tolist()]
    [0.0, 0.0, 0.44]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

__all__ = ["ValueTokenizer", "MASK_TOKEN_ID"]

MASK_TOKEN_ID = 0

#: The largest vocabulary a tokenizer may have (the paper's has 2,002 ids).
MAX_VOCAB_SIZE = 10_000_000


@dataclass(frozen=True)
class ValueTokenizer:
    """Maps values on the grid ``[v_min, v_max]`` (step ``1 / scale``) to ids ``1..`` and MASK to 0.

    Attributes:
        v_min: smallest representable value (paper: -10).
        v_max: largest representable value (paper: 10).
        scale: grid points per unit (paper: 100, i.e. two decimals).
        mask_token_id: id of the MASK token (paper: 0).
    """

    v_min: float = -10.0
    v_max: float = 10.0
    scale: int = 100
    mask_token_id: int = MASK_TOKEN_ID

    def __post_init__(self) -> None:
        from tfmatcomp.validation import check_positive_float

        for name in ("v_min", "v_max"):
            value = getattr(self, name)
            if isinstance(value, (bool, str, complex)) or not _finite(value):
                raise ValueError(f"{name}: must be a finite real number, got {value!r}")
        if not self.v_min < self.v_max:
            raise ValueError(f"v_min, v_max: need v_min < v_max, got v_min={self.v_min!r}, "
                             f"v_max={self.v_max!r}")
        check_positive_float("scale", self.scale)
        if isinstance(self.mask_token_id, bool) or self.mask_token_id != MASK_TOKEN_ID:
            raise ValueError(f"mask_token_id: must be {MASK_TOKEN_ID}, the one id that is not a "
                             f"value's (values take ids 1..vocab_size-1), got {self.mask_token_id!r}")
        n = (self.v_max - self.v_min) * self.scale + 2
        if not n <= MAX_VOCAB_SIZE:
            raise ValueError(f"scale: (v_max - v_min) * scale + 2 ids must be at most "
                             f"{MAX_VOCAB_SIZE:,}, got {n:.4g}")

    @property
    def vocab_size(self) -> int:
        """Number of ids: the grid points plus MASK (2002 for the paper's tokenizer)."""
        return int(round((self.v_max - self.v_min) * self.scale)) + 2

    @property
    def grid(self) -> Float[Tensor, "n_values"]:
        """Every representable value, in id order (ids 1, 2, ...), as float64."""
        n = self.vocab_size - 1
        return torch.arange(n, dtype=torch.float64) / self.scale + self.v_min

    def round(self, values: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
        """Round values to the grid's precision (two decimals for the paper), keeping dtype."""
        v = values.to(torch.float64)
        return (torch.round(v * self.scale) / self.scale).to(values.dtype)

    def encode(self, values: Float[Tensor, "..."]) -> Int[Tensor, "..."]:
        """Token ids of ``values`` (any shape). Values are rounded to the nearest grid point.

        Raises:
            ValueError: if ``values`` holds NaN or a value outside ``[v_min, v_max]``.
        """
        if not torch.is_tensor(values):
            values = torch.as_tensor(values)
        if values.is_complex():
            raise ValueError(f"values: must be real numbers, got dtype {values.dtype}")
        v = values.to(torch.float64)
        if torch.isnan(v).any():
            raise ValueError("values: contains NaN; every value must be a real number in "
                             f"[{self.v_min}, {self.v_max}]")
        half_step = 0.5 / self.scale
        if v.numel() and (v.min() < self.v_min - half_step or v.max() > self.v_max + half_step):
            raise ValueError(
                f"values: must lie in [{self.v_min}, {self.v_max}]; got min {v.min().item():.4g}, "
                f"max {v.max().item():.4g}")
        ids = torch.round((v - self.v_min) * self.scale).to(torch.long) + 1
        return ids.clamp_(1, self.vocab_size - 1)

    def decode(self, ids: Int[Tensor, "..."], mask_value: float = 0.0) -> Float[Tensor, "..."]:
        """Values of token ids (float32); MASK decodes to ``mask_value`` (0 as in the papers).

        Raises:
            ValueError: if an id is outside ``[0, vocab_size)``.
        """
        ids = torch.as_tensor(ids)
        self.check_ids(ids, name="ids")
        values = (ids.to(torch.float64) - 1) / self.scale + self.v_min
        values = torch.where(ids == self.mask_token_id, torch.full_like(values, mask_value), values)
        return values.to(torch.float32)

    def check_ids(self, ids: Tensor, name: str = "tokens") -> None:
        """Raise ``ValueError`` naming ``name`` unless every id is in ``[0, vocab_size)``."""
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"{name}: token ids must be an integer tensor, got dtype {ids.dtype}")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(
                f"{name}: token ids must lie in [0, {self.vocab_size - 1}]; got min "
                f"{ids.min().item()}, max {ids.max().item()}")


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        return False
