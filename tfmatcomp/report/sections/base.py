"""What every section module shares: the :class:`Section` it fills, and how its prose writes
numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tfmatcomp.report.run import RunContext

__all__ = ["Section", "num", "seed_generator"]


@dataclass
class Section:
    """One report section: a title, a paragraph saying what it shows, and its figures / tables."""

    key: str
    title: str
    text: str = ""
    items: list[Any] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


def num(x: float) -> str:
    """A number as the prose writes it (3 significant digits; 'n/a' for None / NaN).

    Example:
        >>> num(0.123456), num(float("nan")), num(None)
        ('0.123', 'n/a', 'n/a')
    """
    return f"{x:.3g}" if isinstance(x, (int, float)) and x == x else "n/a"


def seed_generator(ctx: RunContext) -> torch.Generator:
    """A fresh generator seeded with the report's sample seed."""
    return torch.Generator().manual_seed(ctx.seed)
