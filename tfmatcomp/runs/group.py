"""A multi-seed group directory's ``seeds.json``: read in one place, every shape checked.

``seeds.json`` is ``{"seeds": [0, 1, ...], "runs": ["seed-0", "seed-1", ...]}``: the seeds are
distinct integers in ``[0, 2**63 - 1]``. Anything else (a list, ``{"seeds": 5}``, a seed that is a
path) is refused in one line naming the file.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> group = Path(tempfile.mkdtemp())
    >>> _ = (group / "seeds.json").write_text('{"seeds": [0, 1], "runs": ["seed-0", "seed-1"]}')
    >>> read_seeds(group)
    [0, 1]
    >>> _ = (group / "seeds.json").write_text('{"seeds": ["../../etc"]}')
    >>> read_seeds(group)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: seeds.json: .../seeds.json lists the seed '../../etc'; expected {"seeds": [distinct integers in [0, 9223372036854775807]], ...}
"""

from __future__ import annotations

import os
from pathlib import Path

from tfmatcomp.runs.layout import GROUP_FILE
from tfmatcomp.validation import MAX_SEED, is_int, read_json_bounded

__all__ = ["read_seeds", "MAX_GROUP_SEEDS"]

#: The most seeds a ``seeds.json`` may list (more than any group is trained with).
MAX_GROUP_SEEDS = 100_000
_SHAPE = f'{{"seeds": [distinct integers in [0, {MAX_SEED}]], ...}}'


def read_seeds(out_dir: str | os.PathLike) -> list[int]:
    """The seeds that ``out_dir/seeds.json`` lists, sorted.

    Raises:
        ValueError: the file is missing, unreadable, not JSON (or JSON with duplicate keys), or
            not of the shape ``{"seeds": [distinct integers >= 0]}``; the message names the file.
    """
    path = Path(out_dir) / GROUP_FILE
    content = read_json_bounded(GROUP_FILE, path)
    seeds = content.get("seeds") if isinstance(content, dict) else None
    if not isinstance(seeds, list):
        found = (f"'seeds' of type {type(seeds).__name__}" if isinstance(content, dict)
                 else f"a JSON {type(content).__name__}")
        raise ValueError(f"{GROUP_FILE}: {path} holds {found}; expected {_SHAPE}")
    if len(seeds) > MAX_GROUP_SEEDS:
        raise ValueError(f"{GROUP_FILE}: {path} lists {len(seeds):,} seeds, more than the "
                         f"{MAX_GROUP_SEEDS:,} a group may have; refused")
    for s in seeds:
        if not is_int(s) or not 0 <= s <= MAX_SEED:
            raise ValueError(f"{GROUP_FILE}: {path} lists the seed {s!r}; expected {_SHAPE}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{GROUP_FILE}: {path} lists a seed twice ({seeds[:10]}); expected "
                         f"{_SHAPE}")
    return sorted(seeds)
