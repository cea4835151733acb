"""The weight files of a checkpoint: dtypes, shards and their index, safe reads of files and headers.

:mod:`tfmatcomp.runs.checkpoint` writes and loads checkpoints through these (the file names are
:mod:`tfmatcomp.runs.layout`'s). A checkpoint's weights are
one ``model.safetensors`` or, when larger than ``max_shard_mb``, shards
``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json`` (transformers' layout:
``{"metadata": {"total_size": bytes}, "weight_map": {tensor name: shard file}}``). Every file a
checkpoint names is opened only if it is a plain file inside the checkpoint directory.

Example:
    >>> import tempfile, torch
    >>> d = Path(tempfile.mkdtemp())
    >>> write_weights({"a": torch.zeros(1000), "b": torch.zeros(1000)}, d, max_bytes=5000)
    >>> sorted(p.name for p in d.iterdir())
    ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors', 'model.safetensors.index.json']
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from huggingface_hub import save_torch_state_dict
from safetensors.torch import load_file, save_file

from tfmatcomp.runs.files import disk_full
from tfmatcomp.runs.layout import CONFIG_FILE, INDEX_FILE, SHARD_NAME, WEIGHTS_FILE
from tfmatcomp.validation import read_json_bounded

__all__ = ["CheckpointError", "checkpoint_dtype", "SAFETENSORS_DTYPES", "MAX_JSON_BYTES",
           "sha256_file", "config_digest", "seal_config", "plain_file", "read_json", "shard_limit",
           "write_weights", "weight_files", "tensor_specs", "load_tensors"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded safely: missing, corrupted, pickled, or inconsistent."""


def sha256_file(path: Path) -> str:
    """The SHA-256 hex digest of the file at ``path``, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: ``config.json`` / ``state.json`` larger than this are refused unread.
MAX_JSON_BYTES = 64 << 20
#: safetensors' dtype names -> the torch dtypes a checkpoint's weights may have.
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                       "BF16": torch.bfloat16}
#: Names :func:`checkpoint_dtype` accepts (``TrainConfig.checkpoint_dtype`` holds the first three).
_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "float64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16,
                "fp16": torch.float16}
_MAX_SHARD_MB = 1 << 20  # a shard limit above 1 TiB is surely a unit mistake
#: safetensors header bytes per tensor entry beyond its name (dtype, shape, offsets), and per file;
#: over-estimates, so that a shard file stays under the limit, header included.
_ENTRY_BYTES, _FILE_BYTES = 160, 64


def config_digest(config: dict[str, Any]) -> str:
    """The SHA-256 of a checkpoint's ``config.json`` content without its own ``config_sha256``
    key, as canonical JSON (sorted keys, no spaces): the digest that covers ``config.json``.

    Example:
        >>> config_digest({"step": 4}) == config_digest({"step": 4, "config_sha256": "x"})
        True
        >>> config_digest({"step": 4}) == config_digest({"step": 5})
        False
    """
    body = {k: v for k, v in config.items() if k != "config_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def seal_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its digest (:func:`config_digest`) under ``config_sha256``: what
    ``config.json`` holds. Whoever rewrites a checkpoint's config seals it again."""
    return {**config, "config_sha256": config_digest(config)}


def plain_file(directory: Path, name: Any) -> Path:
    """``directory / name`` if ``name`` is a plain file name (no separator, not ``..``) of a regular
    file inside ``directory`` (a symlink only if it stays inside); else :class:`CheckpointError`.

    Devices, fifos, sockets and paths leaving the checkpoint (``/dev/zero``, ``../../etc/passwd``)
    are refused before anything is opened, so a crafted ``config.json`` can neither make the loader
    read forever nor read a file outside the checkpoint.
    """
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name
            or "\0" in name or (os.altsep and os.altsep in name)):
        raise CheckpointError(f"path: {directory / CONFIG_FILE} names the file {name!r}; only "
                              "plain file names inside the checkpoint directory are accepted")
    file = directory / name
    try:
        st = file.lstat()
    except FileNotFoundError:
        raise CheckpointError(f"path: {file} is missing") from None
    except OSError as e:
        raise CheckpointError(f"path: {file} cannot be read ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        target = file.resolve()
        if target.parent != directory.resolve():
            raise CheckpointError(f"path: {file} is a symlink to {target}, outside the checkpoint "
                                  "directory; refused")
        st = target.stat()
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"path: {file} is not a regular file (a device, fifo or directory); "
                              "refused")
    return file


def read_json(directory: Path, name: str) -> Any:
    """The JSON content of the plain file ``name`` in ``directory`` (:func:`plain_file`), at most
    :data:`MAX_JSON_BYTES`; :class:`CheckpointError` otherwise."""
    file = plain_file(directory, name)
    try:
        return read_json_bounded("path", file, MAX_JSON_BYTES)
    except ValueError as e:  # too large, not UTF-8, not JSON: named as a checkpoint problem
        raise CheckpointError(str(e)) from None


def checkpoint_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """The weights' dtype that ``dtype`` names: None (keep the model's), a torch floating dtype
    (float32, bfloat16, float16, float64) or one of the names ``"float32"``, ``"bfloat16"``,
    ``"float16"``, ``"float64"``, ``"fp32"``, ``"bf16"``, ``"fp16"``.

    Example:
        >>> checkpoint_dtype("bf16")
        torch.bfloat16
        >>> checkpoint_dtype("int8")
        Traceback (most recent call last):
        ...
        ValueError: dtype: must be None, torch.float32, torch.bfloat16, torch.float16, torch.float64 or one of ['bf16', 'bfloat16', 'float16', 'float32', 'float64', 'fp16', 'fp32'], got 'int8'
    """
    if dtype is None or (isinstance(dtype, torch.dtype) and dtype in _DTYPE_NAMES.values()):
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype]
    raise ValueError(f"dtype: must be None, torch.float32, torch.bfloat16, torch.float16, "
                     f"torch.float64 or one of {sorted(_DTYPE_NAMES)}, got {dtype!r}")


def shard_limit(max_shard_mb: Any) -> int | None:
    """``max_shard_mb`` in bytes (None: no sharding), or ``ValueError`` naming the range.

    Example:
        >>> shard_limit(None), shard_limit(0.5)
        (None, 524288)
    """
    if max_shard_mb is None:
        return None
    ok = (isinstance(max_shard_mb, (int, float)) and not isinstance(max_shard_mb, bool)
          and math.isfinite(max_shard_mb) and 0 < max_shard_mb <= _MAX_SHARD_MB)
    if not ok:
        raise ValueError(f"max_shard_mb: must be None or a number of MiB in (0, {_MAX_SHARD_MB}], "
                         f"got {max_shard_mb!r}")
    return int(max_shard_mb * (1 << 20))


def write_weights(weights: dict[str, torch.Tensor], directory: Path, max_bytes: int | None) -> None:
    """Write ``weights`` into ``directory``: ``model.safetensors``, or, when they do not fit in one
    file of ``max_bytes`` (None: never shard), shards and their index, written by
    ``huggingface_hub.save_torch_state_dict`` (the layout transformers reads). Its split counts
    tensor bytes only; the limit it is given leaves room for every safetensors header, so that
    each shard file stays under ``max_bytes`` (a tensor larger than that alone in its shard)."""
    if max_bytes is None:
        with disk_full(directory / WEIGHTS_FILE):
            save_file(weights, directory / WEIGHTS_FILE)
        return
    headers = _FILE_BYTES + sum(_ENTRY_BYTES + len(k.encode()) for k in weights)
    with disk_full(directory):
        save_torch_state_dict(weights, directory, filename_pattern="model{suffix}.safetensors",
                              max_shard_size=max(1, max_bytes - headers))


def weight_files(path: Path) -> dict[Path, set[str] | None]:
    """The checkpoint's weight files, each with the tensor names its index assigns it (None for
    the single ``model.safetensors``, which holds them all)."""
    if not (path / INDEX_FILE).exists():
        return {plain_file(path, WEIGHTS_FILE): None}
    index = read_json(path, INDEX_FILE)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"path: {path / INDEX_FILE} has no 'weight_map' of tensor name -> "
                              "shard file")
    files: dict[str, set[str]] = {}
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or not SHARD_NAME.fullmatch(name):
            raise CheckpointError(f"path: {path / INDEX_FILE} puts {tensor!r} in {name!r}; "
                                  "expected a shard name model-0000k-of-0000n.safetensors")
        files.setdefault(name, set()).add(tensor)
    out = {}
    for name, tensors in sorted(files.items()):
        if not (path / name).exists():
            raise CheckpointError(f"path: shard {name} of {path} is missing (listed in {INDEX_FILE}"
                                  f" for {len(tensors)} tensors)")
        out[plain_file(path, name)] = tensors
    return out


def tensor_specs(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (shape, dtype)}`` from a safetensors header, without reading any tensor."""
    try:
        with safe_open(file, framework="pt") as f:
            return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
                    for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"path: {file} is not a readable safetensors file ({e})") from None


def load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors ``file`` (a plain file, see :func:`plain_file`), on the CPU;
    :class:`CheckpointError` when it cannot be read."""
    file = plain_file(file.parent, file.name)
    try:
        return load_file(file)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"path: {file} is not a readable safetensors file ({e})") from None
