"""Checkpoints: safetensors weights + a JSON config, written atomically, verified on load. No pickle.

A checkpoint is a directory::

    step_0004000/
        model.safetensors     # HookedEncoder or HookedDecoder weights, or, when saved with
                              # max_shard_mb and larger than it, sharded:
        model-00001-of-00003.safetensors ...      # the shards, and
        model.safetensors.index.json              # {"metadata": {"total_size": bytes},
                                                  #  "weight_map": {tensor name: shard file}}
        config.json           # format, model kind, model / task / train configs, step, SHA-256 of
                              # every file (no "kind": an encoder, as checkpoints written before
                              # the decoder existed)
        state.safetensors     # (optional) optimizer moments and RNG states, for resuming
        state.json            # (optional) the rest of the training state (step, optimizer groups)

Weights may be stored in float32 (the default: the model's dtype), bfloat16 or float16
(``save_checkpoint(..., dtype=torch.bfloat16)``); a half-precision checkpoint loads as a float32
model. Every loader (:func:`load_checkpoint`, :func:`load_checkpoint_info`, and all that go
through them) reads both layouts.

A training run keeps its checkpoints under ``RUN_DIR/checkpoints/step_XXXXXXX/`` next to
``RUN_DIR/metrics.jsonl``.

Example:
    >>> import tempfile, tfmatcomp as tm
    >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
    >>> path = tm.save_checkpoint(model, tempfile.mkdtemp() + "/ckpt", step=0)
    >>> tm.load_checkpoint(path).cfg == model.cfg
    True
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from safetensors.torch import save_file

from tfmatcomp.runs.checkpoint_files import (
    SAFETENSORS_DTYPES, CheckpointError, checkpoint_dtype, config_digest, load_tensors, plain_file,
    read_json, seal_config, sha256_file, shard_limit, tensor_specs, weight_files, write_weights,
)
from tfmatcomp.runs.files import DiskFullError, disk_full, replace_file
from tfmatcomp.runs.layout import (
    CHECKPOINTS_DIR, CONFIG_FILE, INDEX_FILE, SHARD_NAME, STATE_FILE, STATE_TENSORS_FILE,
    WEIGHTS_FILE, checkpoint_dir_name, has_training_state, latest_checkpoint, list_checkpoints,
)
from tfmatcomp.config import DecoderConfig, EncoderConfig, TaskConfig, TrainConfig
from tfmatcomp.models.decoder import HookedDecoder
from tfmatcomp.models.encoder import HookedEncoder
from tfmatcomp.models.objectives import DEFAULT_KIND, OBJECTIVES, objective_for
from tfmatcomp.validation import check_bool, check_device

__all__ = [
    "CheckpointError", "ConfigMismatchError", "CheckpointInfo", "save_checkpoint",
    "load_checkpoint", "load_checkpoint_info", "list_checkpoints", "latest_checkpoint",
    "checkpoint_dir_name", "checkpoint_dtype", "load_training_state", "seal_checkpoint",
    "read_config",
]

FORMAT = "tfmatcomp-checkpoint"
FORMAT_VERSION = 2  # 2: config.json carries its own digest (config_sha256)
_PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt", ".tar", ".zip"}
Model = HookedEncoder | HookedDecoder
ModelConfig = EncoderConfig | DecoderConfig


class ConfigMismatchError(CheckpointError):
    """A checkpoint whose configuration differs from the one the caller expects."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint's ``config.json`` says besides the weights."""

    path: Path
    model_cfg: ModelConfig
    task_cfg: TaskConfig | None = None
    train_cfg: TrainConfig | None = None
    step: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    model: Model,
    path: str | os.PathLike,
    *,
    task_cfg: TaskConfig | None = None,
    train_cfg: TrainConfig | None = None,
    step: int | None = None,
    training_state: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
    dtype: torch.dtype | str | None = None,
    max_shard_mb: float | None = None,
) -> Path:
    """Write ``model`` (and optionally its training state) to the directory ``path``, atomically.

    The files are written to a temporary sibling directory which is then renamed into place, so a
    crash never leaves a half-written checkpoint under ``path``.

    Args:
        model: the model to save (a HookedEncoder or a HookedDecoder; its kind is recorded).
        path: target directory (replaced if it exists).
        task_cfg, train_cfg, step, metadata: recorded in ``config.json``.
        training_state: ``(tensors, json_state)`` from the trainer, for resuming (always written
            as given: half-precision weights never touch the optimizer state).
        dtype: dtype of the stored weights (see :func:`checkpoint_dtype`; default: the model's).
            A ``bfloat16`` / ``float16`` checkpoint takes half the space and loads as float32.
        max_shard_mb: split the weights into ``model-0000k-of-0000n.safetensors`` files of at most
            this many MiB each (header included), listed in ``model.safetensors.index.json``
            (transformers' layout); a tensor larger than the limit gets a shard of its own, which
            is then the one file above the limit. Weights that fit in one shard, and the default
            None, give the single ``model.safetensors``.

    Returns:
        The checkpoint directory.

    Raises:
        ValueError: ``dtype`` is not a floating dtype named by :func:`checkpoint_dtype`, or
            ``max_shard_mb`` is not a number in ``(0, 1048576]``.

    Example:
        >>> import tempfile, torch, tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
        >>> path = save_checkpoint(model, tempfile.mkdtemp() + "/c", dtype=torch.bfloat16,
        ...                        max_shard_mb=0.2)
        >>> sorted(p.name for p in path.iterdir())[:2]
        ['config.json', 'model-00001-of-00002.safetensors']
        >>> load_checkpoint(path).dtype
        torch.float32
    """
    dtype = checkpoint_dtype(dtype)
    max_bytes = shard_limit(max_shard_mb)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        dtype = dtype or model.dtype
        weights = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
        write_weights(weights, tmp, max_bytes)
        if training_state is not None:
            tensors, state = training_state
            with disk_full(tmp / STATE_TENSORS_FILE):
                save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()},
                          tmp / STATE_TENSORS_FILE)
            with disk_full(tmp / STATE_FILE):
                (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True))
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        config = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": _kind_of(model),
            "model": model.cfg.to_dict(),
            "task": task_cfg.to_dict() if task_cfg is not None else None,
            "train": train_cfg.to_dict() if train_cfg is not None else None,
            "step": step,
            "dtype": str(dtype).replace("torch.", ""),
            "metadata": metadata or {},
            "files": files,
        }
        with disk_full(tmp / CONFIG_FILE):
            (tmp / CONFIG_FILE).write_text(json.dumps(seal_config(config), indent=2,
                                                      sort_keys=True))
        for p in tmp.iterdir():
            p.chmod(0o644)
            with open(p, "rb") as f, disk_full(p):
                os.fsync(f.fileno())
        tmp.chmod(0o755)
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except DiskFullError as e:  # named as the checkpoint's file, not its temporary folder's
        shutil.rmtree(tmp, ignore_errors=True)
        raise DiskFullError(path / e.path.name if e.path.parent == tmp else e.path) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _resolve(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() in _PICKLE_SUFFIXES or _looks_pickled(path):
            raise CheckpointError(f"path: {path} looks like a pickle / torch.save file; tfmatcomp "
                                  "only loads safetensors checkpoints (never pickle)")
        if path.name in (WEIGHTS_FILE, INDEX_FILE, CONFIG_FILE) or SHARD_NAME.fullmatch(path.name):
            return path.parent
        raise CheckpointError(f"path: {path} is a file; pass a checkpoint directory holding "
                              "model.safetensors (or its shards) and config.json")
    if not path.is_dir():
        raise CheckpointError(f"path: no checkpoint at {path}")
    if not (path / CONFIG_FILE).exists() and (path / CHECKPOINTS_DIR).is_dir():
        latest = latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(f"path: run directory {path} holds no checkpoints")
        return latest
    weights = INDEX_FILE if (path / INDEX_FILE).exists() else WEIGHTS_FILE
    for name in (CONFIG_FILE, weights):
        if not (path / name).exists():
            pickles = [p.name for p in path.iterdir() if p.suffix.lower() in _PICKLE_SUFFIXES]
            extra = f" (found {pickles}: pickles are refused)" if pickles else ""
            raise CheckpointError(f"path: {path} has no {name}{extra}")
    return path


def _looks_pickled(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4)
    return head[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05") or head == b"PK\x03\x04"


def _read_config(path: Path, verify: bool = True) -> dict[str, Any]:
    """``config.json``, checked: with ``verify`` (the default) its own digest (``config_sha256``,
    :func:`~tfmatcomp.runs.checkpoint_files.seal_config`) and the SHA-256 of every file it lists;
    ``verify=False`` (an explicit opt-out, for checkpoints written by hand) skips the digests.
    Sizes and file types are checked either way. Which files must be listed is checked by the
    readers (:func:`_check_listed`)."""
    config = read_json(path, CONFIG_FILE)
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"path: {path / CONFIG_FILE} is not a tfmatcomp checkpoint config")
    if verify:
        if "config_sha256" not in config:
            raise CheckpointError(f"path: {path / CONFIG_FILE} carries no digest of itself "
                                  "(config_sha256), so it is unverified; refused (a checkpoint "
                                  "written before format version 2: seal it once with "
                                  "tfmatcomp.runs.checkpoint.seal_checkpoint, or load it with "
                                  "verify=False to accept it as it is)")
        if config["config_sha256"] != config_digest(config):
            raise CheckpointError(f"path: {path / CONFIG_FILE} was changed after it was written "
                                  "(its content differs from its config_sha256); refused")
    version = config.get("format_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise CheckpointError(f"path: {path / CONFIG_FILE} has format_version {version!r}; this "
                              f"tfmatcomp reads versions 1 to {FORMAT_VERSION}")
    files = config.get("files", {})
    if not isinstance(files, dict):
        raise CheckpointError(f"path: {path / CONFIG_FILE} has 'files' of type "
                              f"{type(files).__name__}; expected {{file name: SHA-256}}")
    listed = {name: plain_file(path, name) for name in files}  # names and file types: no reads
    extra = sorted(n for n in files if n not in _CHECKPOINT_FILES and not SHARD_NAME.fullmatch(n))
    if extra:
        raise CheckpointError(
            f"path: {path / CONFIG_FILE} lists {len(extra)} file(s) a checkpoint does not have "
            f"({extra[:3]}); a checkpoint holds only {CONFIG_FILE}, {WEIGHTS_FILE} (or "
            f"{INDEX_FILE} and its shards model-0000k-of-0000n.safetensors), "
            f"{STATE_TENSORS_FILE} and {STATE_FILE}; refused before reading any of them")
    cfg = _model_config(path, config)
    weights = weight_files(path)  # the shards' index is read bounded, before it is verified
    _check_weights_fit(path, cfg, weights)  # headers against the config, before any hashing
    strays = sorted(n for n in files if SHARD_NAME.fullmatch(n)
                    and n not in {f.name for f in weights})
    if strays:
        raise CheckpointError(f"path: {path / CONFIG_FILE} lists shards that its weights do not "
                              f"use ({strays[:3]}); refused before reading any of them")
    max_bytes = 3 * 8 * _parameter_count(cfg) + (64 << 20)
    for name, digest in files.items():
        file = listed[name]
        if not isinstance(digest, str) or len(digest) != 64:
            raise CheckpointError(f"path: {path / CONFIG_FILE} gives {name!r} the digest "
                                  f"{digest!r}; expected 64 hex digits (SHA-256)")
        size = file.stat().st_size
        if size > max_bytes:  # before hashing: a huge (or sparse) file would take hours
            raise CheckpointError(f"path: {file} holds {size:,} bytes; a checkpoint of this model "
                                  f"holds at most {max_bytes:,} per file; refused")
        if verify and sha256_file(file) != digest.lower():
            raise CheckpointError(f"path: {file} is corrupted (SHA-256 differs from config.json)")
    return config


#: The files a checkpoint may list besides its shards (``config.json`` carries its own digest).
_CHECKPOINT_FILES = frozenset({WEIGHTS_FILE, INDEX_FILE, STATE_TENSORS_FILE, STATE_FILE})


def read_config(path: str | os.PathLike, verify: bool = True) -> dict[str, Any]:
    """The ``config.json`` of the checkpoint directory ``path``, checked as every loader checks it
    (with ``verify``, its own digest and every listed file's SHA-256).

    Raises:
        CheckpointError: as :func:`load_checkpoint`.
    """
    return _read_config(Path(path), verify)


def _check_listed(path: Path, config: dict[str, Any], names: list[str]) -> None:
    """Every file about to be read has a digest in ``config.json`` (else it is unverified)."""
    unlisted = sorted(n for n in names if n not in config.get("files", {}))
    if unlisted:
        raise CheckpointError(f"path: {path / CONFIG_FILE} lists no SHA-256 for {unlisted}, so "
                              "their content is unverified; refused (load the checkpoint with "
                              "verify=False to accept it as it is)")


def _classes(path: Path, config: dict[str, Any]) -> tuple[type, type]:
    """``(config class, model class)`` of the checkpoint's ``kind`` (one of
    :data:`~tfmatcomp.models.objectives.OBJECTIVES`; an encoder when absent)."""
    kind = config.get("kind", DEFAULT_KIND)
    if not isinstance(kind, str) or kind not in OBJECTIVES:
        raise CheckpointError(f"path: {path / CONFIG_FILE} has kind {kind!r}; expected one of "
                              f"{sorted(OBJECTIVES)}")
    return OBJECTIVES[kind].config_class, OBJECTIVES[kind].model_class


def _model_config(path: Path, config: dict[str, Any]) -> ModelConfig:
    """The model config that ``config.json`` describes (checked, nothing allocated)."""
    try:
        return _classes(path, config)[0].from_dict(config["model"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"path: {path / CONFIG_FILE} has an invalid config ({e})") from None


def _kind_of(model: Any) -> str:
    for kind, objective in OBJECTIVES.items():
        if isinstance(model, objective.model_class):
            return kind
    raise TypeError(f"model: expected a HookedEncoder or a HookedDecoder, got "
                    f"{type(model).__name__}")


def _parameter_count(cfg: ModelConfig) -> int:
    """Parameters of the model ``cfg`` describes, from the sizes alone (nothing is allocated)."""
    return objective_for(cfg).parameter_count(cfg)


def _check_weights_fit(path: Path, cfg: ModelConfig, files: dict[Path, set[str] | None]) -> torch.dtype:
    """Compare the weight files' headers with ``cfg`` (and the shards with their index) before any
    tensor is allocated; returns the weights' dtype. The parameter count is checked first (a config
    of absurd size is refused at once), then every name and shape against a model built on the
    ``meta`` device (no memory)."""
    specs: dict[str, tuple[tuple[int, ...], str]] = {}
    for file, listed in files.items():
        held_here = tensor_specs(file)
        if listed is not None and set(held_here) != listed:
            raise CheckpointError(f"path: {file.name} holds other tensors than {INDEX_FILE} "
                                  f"assigns it in {path}")
        specs.update(held_here)
    name = ", ".join(f.name for f in files) if len(files) < 3 else f"its {len(files)} shards"
    held = sum(math.prod(shape) for shape, _ in specs.values())
    need = _parameter_count(cfg)
    if need != held:
        raise CheckpointError(f"path: {path / CONFIG_FILE} describes a model of {need:,} "
                              f"parameters but {name} holds {held:,} numbers; refused before "
                              "building the model")
    dtypes = {dt for _, dt in specs.values()}
    if len(dtypes) != 1 or not dtypes <= set(SAFETENSORS_DTYPES):
        raise CheckpointError(f"path: {name} in {path} hold dtypes {sorted(dtypes)}; expected one of "
                              f"{sorted(SAFETENSORS_DTYPES)} for every tensor")
    model_cls = objective_for(cfg).model_class
    expected = {k: tuple(v.shape)
                for k, v in model_cls.uninitialized(cfg, device="meta").state_dict().items()}
    found = {k: shape for k, (shape, _) in specs.items()}
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    bad_shapes = {k: (expected[k], v) for k, v in found.items() if k in expected and expected[k] != v}
    if missing or unexpected or bad_shapes:
        raise CheckpointError(
            f"path: weights in {path} do not match its config: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, shape (expected, found) {dict(list(bad_shapes.items())[:5])}")
    return SAFETENSORS_DTYPES[dtypes.pop()]


def load_checkpoint_info(
    path: str | os.PathLike,
    device: torch.device | str | None = None,
    config: ModelConfig | None = None,
    verify: bool = True,
) -> tuple[Model, CheckpointInfo]:
    """Load a checkpoint's model and what its config says (step, task, training config).

    Args:
        path: a checkpoint directory, its ``model.safetensors`` (or a shard, or the shards'
            index), or a run directory (its latest checkpoint is used).
        device: where to put the model (default: CPU).
        config: if given, the checkpoint's model config must equal it.
        verify: check every file against its SHA-256 (``config.json`` against ``config.sha256``,
            the others against the digests ``config.json`` lists) and refuse files without one.
            ``False`` is the explicit opt-out for a checkpoint written or edited by hand.

    The model's class follows the config's ``kind`` (``"encoder"``, the default for checkpoints
    that have none, or ``"decoder"``). Single-file and sharded weights load alike; weights
    stored in bfloat16 or float16 give a float32 model.

    Raises:
        CheckpointError: missing / corrupted / pickled files, or weights that do not fit the config.
        ConfigMismatchError: the checkpoint's config differs from ``config``.
    """
    if device is not None:
        device = check_device("device", device)
    check_bool("verify", verify)
    path = _resolve(path)
    raw = _read_config(path, verify)
    cfg_cls, model_cls = _classes(path, raw)
    try:
        model_cfg = cfg_cls.from_dict(raw["model"])
        task_cfg = TaskConfig.from_dict(raw["task"]) if raw.get("task") else None
        train_cfg = TrainConfig.from_dict(raw["train"]) if raw.get("train") else None
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"path: {path / CONFIG_FILE} has an invalid config ({e})") from None
    metadata = raw.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"path: {path / CONFIG_FILE} has 'metadata' of type "
                              f"{type(metadata).__name__}; expected a JSON object")
    step = raw.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise CheckpointError(f"path: {path / CONFIG_FILE} has step {step!r}; expected an "
                              "integer >= 0 or null")
    if config is not None and config != model_cfg:
        diff = {k: (v, getattr(model_cfg, k, None)) for k, v in config.to_dict().items()
                if getattr(model_cfg, k, None) != v}
        raise ConfigMismatchError(f"config: checkpoint {path} has a different model config; "
                                  f"(expected, found) per field: {diff}")
    files = weight_files(path)
    if verify:
        _check_listed(path, raw, [f.name for f in files]
                      + ([INDEX_FILE] if (path / INDEX_FILE).exists() else []))
    dtype = _check_weights_fit(path, model_cfg, files)  # before anything is allocated
    tensors = {k: v for file in files for k, v in load_tensors(file).items()}
    if dtype in (torch.bfloat16, torch.float16):
        dtype = torch.float32  # half precision is a storage format: the model computes in float32
    model = model_cls.uninitialized(model_cfg).to(dtype)  # every weight is loaded next
    model.load_state_dict(tensors, strict=True)
    model.task_cfg = task_cfg
    if device is not None:
        model = model.to(device)
    info = CheckpointInfo(path=path, model_cfg=model_cfg, task_cfg=task_cfg, train_cfg=train_cfg,
                          step=step, metadata=metadata)
    return model.eval(), info


def load_checkpoint(
    path: str | os.PathLike,
    device: torch.device | str | None = None,
    config: ModelConfig | None = None,
    verify: bool = True,
) -> Model:
    """Load a checkpoint as a ready :class:`HookedEncoder` or :class:`HookedDecoder` (in eval mode).

    See :func:`load_checkpoint_info` for the arguments and errors.
    """
    return load_checkpoint_info(path, device=device, config=config, verify=verify)[0]


def load_training_state(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The ``(tensors, json_state)`` training state saved with a checkpoint (for resuming)."""
    path = _resolve(path)
    config = _read_config(path)
    if not has_training_state(path):
        raise CheckpointError(f"path: {path} has no training state ({STATE_FILE}); it cannot be "
                              "resumed from")
    _check_listed(path, config, [STATE_FILE, STATE_TENSORS_FILE])
    state = read_json(path, STATE_FILE)
    return load_tensors(path / STATE_TENSORS_FILE), state


def seal_checkpoint(path: str | os.PathLike) -> list[Path]:
    """Give checkpoints written before format version 2 the digest of their ``config.json``: an
    explicit, once-only step for your own old checkpoints (loading refuses a config without one).

    ``path`` is a checkpoint or a run directory (every checkpoint in it is sealed). Each file the
    config lists must still match its recorded SHA-256 (checked first); then ``config.json`` is
    rewritten atomically with ``config_sha256`` and ``format_version`` 2. A checkpoint that is
    already sealed is left as it is. Returns the checkpoints it sealed.

    Example:
        >>> import tempfile, json, tfmatcomp as tm
        >>> from tfmatcomp.runs.layout import CONFIG_FILE
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model)
        >>> path = tm.save_checkpoint(model, tempfile.mkdtemp() + "/old")
        >>> config = json.loads((path / CONFIG_FILE).read_text())
        >>> del config["config_sha256"]; _ = (path / CONFIG_FILE).write_text(json.dumps(config))
        >>> [p.name for p in seal_checkpoint(path)], tm.load_checkpoint(path).cfg == model.cfg
        (['old'], True)
    """
    path = Path(path)
    if (path / CONFIG_FILE).exists():
        targets = [path]
    elif (path / CHECKPOINTS_DIR).is_dir():
        targets = list(list_checkpoints(path).values())
    else:
        raise CheckpointError(f"path: {path} is neither a checkpoint nor a run directory")
    sealed = []
    for target in targets:
        config = _read_config(target, verify=False)
        for name, digest in config.get("files", {}).items():
            if sha256_file(plain_file(target, name)) != str(digest).lower():
                raise CheckpointError(f"path: {target / name} differs from the SHA-256 its "
                                      "config.json records; not sealed")
        if config.get("config_sha256") == config_digest(config):
            continue
        config["format_version"] = FORMAT_VERSION
        replace_file(target / CONFIG_FILE, json.dumps(seal_config(config), indent=2, sort_keys=True))
        sealed.append(target)
    return sealed
