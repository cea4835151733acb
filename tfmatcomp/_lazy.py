"""Packages whose submodules load on first use: ``tm.training.plan`` without importing it first."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def submodules_on_first_use(package: str) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``package``: ``package.<name>`` imports the submodule.

    A name that is no submodule raises ``AttributeError``, as a missing attribute would; an import
    error inside an existing submodule is raised as it is.
    """

    def __getattr__(name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__
