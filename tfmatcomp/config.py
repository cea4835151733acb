"""Model, task and training configurations, and the named presets.

Presets are reachable by name from Python and from the command line (``--preset``):

* ``paper-4l8h``: the papers' main model: 7x7 rank-2 matrices, 4 layers, 8 heads, d_model 768,
  d_mlp 3072, Adam lr 1e-4, batch 256, 50,000 steps.
* ``paper-12l12h``: the papers' large model (12 layers, 12 heads, lr 5e-5).
* ``paper-cpu``: the papers' task and 4-layer 8-head shape at d_model 256 (d_mlp 1024, init std
  0.05, lr 3e-4, batch 128, bf16 checkpoints): trainable on a CPU's bf16 matrix units (see
  docs/paper-cpu.md for the search that chose it).
* ``tiny``: a CPU-sized model that shows the plateau and the sudden drop in minutes (see
  docs/tiny-preset.md for how it was chosen).
* ``gpt-tiny``: the GPT variant (a :class:`DecoderConfig`, trained on :mod:`tfmatcomp.task.gpt`'s
  sequences) at the tiny preset's matrix size: it shows the copy transition at observed entries;
  no configuration searched so far drops at masked entries (see docs/gpt-variant.md).

Example:
    >>> from tfmatcomp import EncoderConfig, get_preset
    >>> EncoderConfig.from_preset("paper-4l8h").d_head
    96
    >>> get_preset("tiny").task.n_rows
    4
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from tfmatcomp.validation import (
    check_bool,
    check_choice,
    check_int_in_range,
    check_int_list,
    check_positive_float,
    check_positive_int,
    check_seed,
    is_int,
)

if TYPE_CHECKING:
    from tfmatcomp.interventions.during_training import DuringTraining

__all__ = ["EncoderConfig", "DecoderConfig", "TaskConfig", "TrainConfig", "Preset", "PRESETS", "get_preset"]


#: :attr:`EncoderConfig.head`'s choices.
ENCODER_HEADS = ("regression", "masked_lm", "none")


@dataclass(frozen=True)
class EncoderConfig:
    """Shape and numerics of a post-LN BERT encoder with a real-valued read-out.

    Attributes:
        n_layers, n_heads, d_model, d_mlp: the usual sizes; ``d_head = d_model // n_heads``
            unless given.
        n_ctx: number of learned absolute positions (``n_rows * n_cols`` for the task).
        d_vocab: vocabulary size (2002 for the value tokenizer).
        d_out: read-out width (1: one real value per position).
        n_token_types: token-type embeddings (0: none, as in the papers).
        learned_mask_embedding: False (paper): the MASK row of the token embedding is zero and never
            trained, so masked positions carry only their positional embedding. True: MASK has a
            trained embedding like any other token.
        mask_token_id: the MASK id (0).
        layer_norm_eps, init_range, act_fn: as HuggingFace BERT (1e-12, 0.02, exact GELU).
        head: what sits on the last block: ``"regression"`` (the papers' ``Linear(d_model,
            d_out)`` read-out, ``readout``), ``"masked_lm"`` (BERT's masked-LM head with
            TransformerLens 3's names: ``mlm_head`` (dense, activation ``act_fn``, LayerNorm) then
            ``unembed`` to ``d_vocab`` logits) or ``"none"`` (the bare encoder, as ``BertModel``).
    """

    n_layers: int = 4
    n_heads: int = 8
    d_model: int = 768
    d_mlp: int = 3072
    n_ctx: int = 49
    d_vocab: int = 2002
    d_head: int | None = None
    d_out: int = 1
    n_token_types: int = 0
    learned_mask_embedding: bool = False
    mask_token_id: int = 0
    layer_norm_eps: float = 1e-12
    init_range: float = 0.02
    act_fn: str = "gelu"
    head: str = "regression"

    #: TransformerLens's ``cfg.device`` and ``cfg.n_key_value_heads`` (read by its patching
    #: helpers): not fields, never serialized; a model's own config copy holds its device.
    device: ClassVar[Any] = None
    n_key_value_heads: ClassVar[int | None] = None

    def __post_init__(self) -> None:
        check_positive_int("d_out", self.d_out)
        check_choice("head", self.head, ENCODER_HEADS)
        _check_shape(self)
        if not is_int(self.n_token_types) or self.n_token_types < 0:
            raise ValueError(f"n_token_types: must be an integer >= 0, got {self.n_token_types!r}")
        check_bool("learned_mask_embedding", self.learned_mask_embedding)
        check_int_in_range("mask_token_id", self.mask_token_id, 0, self.d_vocab - 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EncoderConfig":
        """Build from a dict, refusing unknown keys (a sign of a config from another program)."""
        return _from_dict(cls, data, "config")

    @classmethod
    def from_preset(cls, name: str) -> "EncoderConfig":
        """The model part of a named preset (see :data:`PRESETS`)."""
        return get_preset(name).model


@dataclass(frozen=True)
class DecoderConfig:
    """Shape and numerics of a pre-LN GPT-2-style decoder (:class:`tfmatcomp.HookedDecoder`).

    Attributes:
        n_layers, n_heads, d_model, d_mlp: the usual sizes; ``d_head = d_model // n_heads``
            unless given.
        n_ctx: number of learned absolute positions (the longest sequence).
        d_vocab: vocabulary size; the unembedding maps ``d_model`` to ``d_vocab`` logits.
        layer_norm_eps, init_range, act_fn: as GPT-2 (1e-5, 0.02, ``gelu_new``, the tanh GELU).

    Example:
        >>> from tfmatcomp import DecoderConfig
        >>> cfg = DecoderConfig(n_layers=2, n_heads=2, d_model=64, d_mlp=256, n_ctx=99)
        >>> cfg.d_head, cfg.act_fn
        (32, 'gelu_new')
    """

    n_layers: int = 2
    n_heads: int = 2
    d_model: int = 768
    d_mlp: int = 3072
    n_ctx: int = 99
    d_vocab: int = 2003
    d_head: int | None = None
    layer_norm_eps: float = 1e-5
    init_range: float = 0.02
    act_fn: str = "gelu_new"

    #: as on :class:`EncoderConfig`: TransformerLens's ``cfg.device`` / ``n_key_value_heads``
    device: ClassVar[Any] = None
    n_key_value_heads: ClassVar[int | None] = None
    #: TransformerLens's architecture flags, with its meanings, read by its ``ActivationCache``
    #: helpers (``decompose_resid``, ``apply_ln_to_stack``, ``logit_lens``, ...). Constants of this
    #: decoder, not fields, never serialized: every block has an MLP (``attn_only`` False); every
    #: LayerNorm (``ln1``, ``ln2``, ``ln_final``) centers, scales and has a gain and a bias
    #: (``normalization_type`` ``"LN"``, not folded); ``ln_final`` is a LayerNorm, not an RMSNorm
    #: (``final_rms`` False); positions are learned and added to the embedding
    #: (``positional_embedding_type`` ``"standard"``).
    attn_only: ClassVar[bool] = False
    normalization_type: ClassVar[str] = "LN"
    final_rms: ClassVar[bool] = False
    positional_embedding_type: ClassVar[str] = "standard"

    def __post_init__(self) -> None:
        _check_shape(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DecoderConfig":
        """Build from a dict, refusing unknown keys."""
        return _from_dict(cls, data, "config")


#: The most weights a model config may describe (checked before anything is allocated).
MAX_PARAMETERS = 10**10
#: The most layers a model config may have: building a model takes time per layer (about a
#: millisecond each), so a million thin layers would hang the constructor within MAX_PARAMETERS.
MAX_LAYERS = 1024


def _check_shape(cfg: "EncoderConfig | DecoderConfig") -> None:
    """The checks both model configs share: sizes, ``d_head`` (filled in when None), numerics."""
    for name in ("n_layers", "n_heads", "d_model", "d_mlp", "n_ctx", "d_vocab"):
        check_positive_int(name, getattr(cfg, name))
    check_positive_int("d_head", cfg.d_head, allow_none=True)
    if cfg.d_head is None:
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model: {cfg.d_model} is not divisible by n_heads "
                             f"{cfg.n_heads}; pass d_head explicitly")
        object.__setattr__(cfg, "d_head", cfg.d_model // cfg.n_heads)
    n_params = (cfg.n_layers * (4 * cfg.d_model * cfg.n_heads * cfg.d_head + 2 * cfg.d_model * cfg.d_mlp)
                + (cfg.d_vocab + cfg.n_ctx) * cfg.d_model)
    if n_params > MAX_PARAMETERS:
        raise ValueError(f"n_layers, d_model, d_mlp, n_heads, d_head, d_vocab, n_ctx: the model would "
                         f"have about {n_params:.3g} weights; at most {MAX_PARAMETERS:.0e} are allowed")
    check_int_in_range("n_layers", cfg.n_layers, 1, MAX_LAYERS)
    check_positive_float("layer_norm_eps", cfg.layer_norm_eps)
    check_positive_float("init_range", cfg.init_range)
    check_choice("act_fn", cfg.act_fn, ("gelu", "gelu_new", "relu"))


@dataclass(frozen=True)
class TaskConfig:
    """Parameters of :class:`tfmatcomp.MatrixCompletionTask` (serializable).

    Attributes:
        mixture: sizes ``n`` of a uniform mixture of ``n x n`` matrices
            (:class:`~tfmatcomp.task.data.MatrixMixtureTask`, one size per batch); empty: one size,
            ``n_rows x n_cols``. With a mixture, ``n_rows`` is its largest size and ``n_cols``
            is None.

    Example:
        >>> cfg = TaskConfig(mixture=(5, 7, 9), rank=1)
        >>> cfg.n_rows, cfg.n_positions, type(cfg.build()).__name__
        (9, 81, 'MatrixMixtureTask')
    """

    n_rows: int = 7
    n_cols: int | None = None
    rank: int | None = 2
    p_mask: float = 0.3
    distribution: str = "uniform"
    mixture: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.mixture:
            mixture = tuple(check_int_list("mixture", self.mixture, lo=1))
            if self.n_cols is not None:
                raise ValueError("n_cols: a mixture holds square sizes; leave n_cols None")
            object.__setattr__(self, "mixture", mixture)
            object.__setattr__(self, "n_rows", max(self.mixture))
        self.build()  # the task checks every field, naming it and its allowed values

    def build(self):
        """The :class:`~tfmatcomp.task.data.MatrixCompletionTask` (or, with ``mixture``, the
        :class:`~tfmatcomp.task.data.MatrixMixtureTask`) this config describes."""
        from tfmatcomp.task.data import MatrixCompletionTask, MatrixMixtureTask

        if self.mixture:
            return MatrixMixtureTask(sizes=self.mixture, rank=self.rank, p_mask=self.p_mask,
                                     distribution=self.distribution)
        return MatrixCompletionTask(n_rows=self.n_rows, n_cols=self.n_cols, rank=self.rank,
                                    p_mask=self.p_mask, distribution=self.distribution)

    @property
    def n_positions(self) -> int:
        return self.n_rows * (self.n_cols or self.n_rows)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.mixture:
            d["mixture"] = list(self.mixture)
        else:
            del d["mixture"]  # single-size configs serialize as before mixtures existed
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TaskConfig":
        return _from_dict(cls, data, "task config")


#: Weight dtypes a training run may write its checkpoints in (``TrainConfig.checkpoint_dtype``).
CHECKPOINT_DTYPES = ("float32", "bfloat16", "float16")
_MAX_SHARD_MB = 1 << 20


@dataclass(frozen=True)
class TrainConfig:
    """Online training hyper-parameters (paper defaults for paper-4l8h).

    Attributes:
        n_steps: optimizer steps; a fresh batch is sampled at every step.
        batch_size, eval_batch_size: training batch and fresh evaluation batch (256, 64).
        lr: constant Adam learning rate (no warm-up, no decay, no clipping).
        seed: seeds the model initialization and both data streams.
        log_every: steps between metrics-log lines.
        checkpoint_steps: steps at which a checkpoint is always written (paper: 4,000 pre-shift,
            14,000, 16,000, 20,000, and the last step).
        checkpoint_every: also write a checkpoint every this many steps (0: never).
        fast: the fast training step of :mod:`tfmatcomp.training.fast_step` (bf16 matmuls with float32
            weights and Adam state; on CUDA also ``torch.compile`` and no host synchronization
            between logging steps). None (default): on where it pays and the run allows it (an
            encoder, all parameters trainable, no hooks): on CUDA, and on a CPU with AMX or
            AVX-512 bf16 for ``d_model >= 256``; False: never; True: whenever the run allows it.
        checkpoint_dtype: dtype of the checkpoints' weights: ``"float32"`` (default),
            ``"bfloat16"`` or ``"float16"`` (half the size; loads as float32). The training state
            of the latest checkpoint keeps float32 weights, so resuming stays exact.
        max_shard_mb: split each checkpoint's weights into shards of at most this many MiB
            (see :func:`tfmatcomp.save_checkpoint`); None: one file.
        interventions: interventions during training
            (:class:`~tfmatcomp.interventions.during_training.DuringTraining`: attention-logit
            scaling, row/column attention scaling, a row/column attention penalty, freezing,
            re-initializing), applied in order;
            given as objects or their dicts (JSON), recorded in ``run.json`` and every checkpoint,
            and part of what a resume must match. On CUDA a run with any takes the float32 step; on a
            CPU only the attention penalty does (the fast step applies the others).
    """

    n_steps: int = 50_000
    batch_size: int = 256
    eval_batch_size: int = 64
    lr: float = 1e-4
    seed: int = 0
    log_every: int = 100
    checkpoint_steps: tuple[int, ...] = (4_000, 14_000, 16_000, 20_000)
    checkpoint_every: int = 5_000
    fast: bool | None = None
    checkpoint_dtype: str = "float32"
    max_shard_mb: float | None = None
    interventions: tuple["DuringTraining", ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.interventions, (str, bytes, dict)) or not hasattr(
                self.interventions, "__iter__"):
            raise ValueError(f"interventions: must be a list of interventions during training, "
                             f"got {self.interventions!r}")
        if self.interventions:  # (the presets have none: config imports no intervention module)
            from tfmatcomp.interventions.during_training import during_training_from_dict

            object.__setattr__(self, "interventions", tuple(
                during_training_from_dict(d) for d in self.interventions))
        else:
            object.__setattr__(self, "interventions", ())
        if not (self.fast is None or isinstance(self.fast, bool)):
            raise ValueError(f"fast: must be None (auto: where it pays), True or False, got "
                             f"{self.fast!r}")
        check_choice("checkpoint_dtype", self.checkpoint_dtype, CHECKPOINT_DTYPES)
        if self.max_shard_mb is not None:
            mb = self.max_shard_mb
            if isinstance(mb, (bool, str)) or not isinstance(mb, (int, float)) or not (
                    0 < mb <= _MAX_SHARD_MB):  # NaN fails the comparison too
                raise ValueError(f"max_shard_mb: must be None or a number of MiB in "
                                 f"(0, {_MAX_SHARD_MB}], got {mb!r}")
        for name in ("n_steps", "batch_size", "eval_batch_size", "log_every"):
            check_positive_int(name, getattr(self, name))
        check_positive_float("lr", self.lr)
        check_seed("seed", self.seed)
        if not is_int(self.checkpoint_every) or self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every: must be an integer >= 0 (0: never), got "
                             f"{self.checkpoint_every!r}")
        steps = check_int_list("checkpoint_steps", self.checkpoint_steps, lo=0)
        object.__setattr__(self, "checkpoint_steps", tuple(steps))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["checkpoint_steps"] = list(self.checkpoint_steps)
        if self.interventions:
            d["interventions"] = [i.to_dict() for i in self.interventions]
        else:
            del d["interventions"]  # configs without any serialize as before they existed
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        return _from_dict(cls, data, "train config")


@dataclass(frozen=True)
class Preset:
    """A named bundle: model, task and training configuration."""

    name: str
    model: EncoderConfig | DecoderConfig
    task: TaskConfig
    train: TrainConfig
    description: str = ""


def _from_dict(cls, data: dict[str, Any], what: str):
    if not isinstance(data, dict):
        raise ValueError(f"{what}: expected a dict of fields, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{what}: unknown keys {unknown}; allowed keys are {sorted(names)}")
    return cls(**data)


def _paper_preset(name: str, n_layers: int, n_heads: int, lr: float, description: str,
                  d_model: int = 768, init_range: float = 0.02, **train: Any) -> Preset:
    """Gopalani et al.'s setup, which every paper preset shares (7x7 rank-2 with 30% masked,
    ``d_mlp = 4 d_model``, a fresh batch every step, checkpoints around the drop, their weights
    in bf16 shards of at most 15 MiB: 57 MiB for paper-4l8h; the latest one's training state stays
    float32, so resuming is exact); they differ in size, init and lr, and ``train`` overrides the
    papers' schedule (50k steps of 256 matrices)."""
    return Preset(
        name=name,
        model=EncoderConfig(n_layers=n_layers, n_heads=n_heads, d_model=d_model,
                            d_mlp=4 * d_model, n_ctx=49, init_range=init_range),
        task=TaskConfig(n_rows=7, rank=2, p_mask=0.3),
        train=TrainConfig(**{"n_steps": 50_000, "batch_size": 256, "eval_batch_size": 64, "lr": lr,
                             "checkpoint_steps": (4_000, 14_000, 16_000, 20_000),
                             "checkpoint_every": 5_000, "checkpoint_dtype": "bfloat16",
                             "max_shard_mb": 15, **train}),
        description=description,
    )


PRESETS: dict[str, Preset] = {
    "paper-4l8h": _paper_preset(
        "paper-4l8h", n_layers=4, n_heads=8, lr=1e-4,
        description="Gopalani et al.: 4 layers x 8 heads x 768, 7x7 rank-2, 50k steps at lr 1e-4."),
    "paper-12l12h": _paper_preset(
        "paper-12l12h", n_layers=12, n_heads=12, lr=5e-5,
        description="Gopalani et al.'s large model: 12 layers x 12 heads, lr 5e-5."),
    "paper-cpu": _paper_preset(
        "paper-cpu", n_layers=4, n_heads=8, lr=3e-4, d_model=256, init_range=0.05,
        n_steps=30_000, batch_size=128, checkpoint_every=1_000,
        description="The papers' task and model shape (7x7 rank-2, 4 layers x 8 heads) at width "
                    "256 for a CPU: init std 0.05, lr 3e-4, batch 128 (docs/paper-cpu.md)."),
    "tiny": Preset(
        name="tiny",
        model=EncoderConfig(n_layers=2, n_heads=4, d_model=64, d_mlp=256, n_ctx=16,
                            init_range=0.1),
        task=TaskConfig(n_rows=4, rank=1, p_mask=0.2),
        train=TrainConfig(n_steps=10_000, batch_size=128, eval_batch_size=64, lr=1e-3,
                          log_every=50, checkpoint_steps=(4_000,), checkpoint_every=1_000),
        description="CPU preset: 4x4 rank-1 with 20% masked, 2 layers x 4 heads x 64, weights "
                    "initialized at std 0.1; L_mask drops near step 5,500 (docs/tiny-preset.md).",
    ),
    "gpt-tiny": Preset(
        name="gpt-tiny",
        model=DecoderConfig(n_layers=2, n_heads=2, d_model=64, d_mlp=256, n_ctx=33, d_vocab=2003),
        task=TaskConfig(n_rows=4, rank=1, p_mask=0.3),
        train=TrainConfig(n_steps=1_000, batch_size=128, eval_batch_size=64, lr=1e-3,
                          log_every=50, checkpoint_steps=(50, 100, 150, 200, 250, 300),
                          checkpoint_every=500),
        description="GPT variant (the NeurIPS paper App. G) scaled down for a CPU: 4x4 rank-1, a 2-layer "
                    "2-head decoder x 64 on prompt / SEP / values; the copy transition near step "
                    "150, bracketed by checkpoints; no drop at masked entries was found (see "
                    "docs/gpt-variant.md).",
    ),
}


def get_preset(name: str | Preset) -> Preset:
    """The preset called ``name`` (a :class:`Preset` is returned as it is).

    Raises:
        ValueError: for an unknown name or another type, listing the known names.
    """
    if isinstance(name, Preset):
        return name
    if not isinstance(name, str):
        raise ValueError(f"preset: must be a preset name {sorted(PRESETS)} or a Preset, got "
                         f"{name!r}")
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset: unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None


def dumps(obj: Any) -> str:
    """JSON text of a config dataclass (used in checkpoints)."""
    return json.dumps(obj.to_dict(), indent=2, sort_keys=True)
