"""The matrix-completion task: low-rank matrices, masks, tokenized batches, and X -> -X.

A matrix ``X = U V^T`` (``U`` of shape ``(n_rows, rank)``, ``V`` of shape ``(n_cols, rank)``, entries
iid Uniform[-1, 1] by default) is flattened row-major into a sequence: position ``k = n_cols * row +
col``. Each entry is observed with probability ``1 - p_mask``; masked entries become the MASK token.
Targets are ``X`` rounded to two decimals (the tokenizer's grid), as in the papers.

The factors' law (:data:`DISTRIBUTIONS`): ``"uniform"`` (Uniform[-1, 1], the papers'),
``"gaussian"`` (N(0, 1)), ``"laplace"`` (Laplace(0, 1)), and the *matched* laws
``"gaussian_matched"`` / ``"laplace_matched"``: the same shapes scaled to the variance of
Uniform[-1, 1], 1/3 (:data:`UNIFORM_FACTOR_VARIANCE`), so that the entries of ``X`` have the
variance they had in training (``rank / 9``). A matched draw is the unmatched one from the same
generator, scaled (``gaussian_matched`` = ``gaussian / sqrt(3)``, ``laplace_matched`` =
``laplace / sqrt(6)``). :attr:`MatrixCompletionTask.max_abs_entry` is the largest ``|entry|`` a
task can produce (``rank`` for uniform factors): entries beyond a model's training value are
tokens it never saw.

Example:
    >>> import torch
    >>> from tfmatcomp import MatrixCompletionTask
    >>> task = MatrixCompletionTask(n_rows=7, rank=2, p_mask=0.3)
    >>> batch = task.sample(4, generator=torch.Generator().manual_seed(0))
    >>> batch.tokens.shape, batch.values.shape, batch.observed.dtype
    (torch.Size([4, 49]), torch.Size([4, 49]), torch.bool)
    >>> neg = batch.negated()          # -X with the same mask
    >>> bool((neg.observed == batch.observed).all())
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tfmatcomp.task.tokenizer import ValueTokenizer
from tfmatcomp.validation import check_device

__all__ = ["MatrixBatch", "MatrixCompletionTask", "MatrixMixtureTask", "Distribution", "DISTRIBUTIONS",
           "UNIFORM_FACTOR_VARIANCE", "FACTOR_VARIANCE", "max_abs_entry"]

Distribution = Literal["uniform", "gaussian", "laplace", "gaussian_matched", "laplace_matched"]
#: The laws of the factors' entries, :data:`Distribution`'s values.
DISTRIBUTIONS: tuple[str, ...] = get_args(Distribution)
#: The variance of a Uniform[-1, 1] factor entry (the papers' training law), which the
#: ``*_matched`` laws share.
UNIFORM_FACTOR_VARIANCE: float = 1.0 / 3.0
#: The variance of one factor entry under each law (before the tokenizer's clipping).
FACTOR_VARIANCE: dict[str, float] = {"uniform": UNIFORM_FACTOR_VARIANCE, "gaussian": 1.0,
                                     "laplace": 2.0, "gaussian_matched": UNIFORM_FACTOR_VARIANCE,
                                     "laplace_matched": UNIFORM_FACTOR_VARIANCE}
# the unit-law draw each *_matched law scales, and by how much (to variance 1/3)
_MATCHED = {"gaussian_matched": ("gaussian", math.sqrt(UNIFORM_FACTOR_VARIANCE)),
            "laplace_matched": ("laplace", math.sqrt(UNIFORM_FACTOR_VARIANCE / 2.0))}


@dataclass(frozen=True)
class MatrixBatch:
    """A tokenized batch of masked matrices (one sequence per matrix, row-major).

    Attributes:
        tokens: input ids, MASK (0) at masked entries. ``[batch, n_rows * n_cols]``.
        values: targets, ``X`` rounded to the tokenizer grid. ``[batch, n_rows * n_cols]``.
        observed: True where the entry is shown to the model. ``[batch, n_rows * n_cols]``.
        n_rows, n_cols: the matrix shape.
        tokenizer: the tokenizer that made ``tokens``.

    Properties are views of the batch's own tensors (``masked``, ``matrices``, ``device``,
    ``batch_size``); methods build something new (``to``, ``negated`` for the ``-X`` batch,
    ``with_mask_value``).
    """

    tokens: Int[Tensor, "batch pos"]
    values: Float[Tensor, "batch pos"]
    observed: Bool[Tensor, "batch pos"]
    n_rows: int
    n_cols: int
    tokenizer: ValueTokenizer = field(default_factory=ValueTokenizer, repr=False)

    @property
    def masked(self) -> Bool[Tensor, "batch pos"]:
        """True at masked (hidden) entries: the complement of ``observed``."""
        return ~self.observed

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @property
    def matrices(self) -> Float[Tensor, "batch n_rows n_cols"]:
        """The targets as matrices ``[batch, n_rows, n_cols]``."""
        return self.values.reshape(-1, self.n_rows, self.n_cols)

    def to(self, device: torch.device | str) -> "MatrixBatch":
        """The same batch on ``device``."""
        return replace(self, tokens=self.tokens.to(device), values=self.values.to(device),
                       observed=self.observed.to(device))

    def negated(self) -> "MatrixBatch":
        """The batch for ``-X`` with the same mask (the papers' activation-patching pair)."""
        return MatrixBatch.from_values(-self.values, self.observed, self.n_rows, self.n_cols,
                                       self.tokenizer)

    def with_mask_value(self, value: float) -> Int[Tensor, "batch pos"]:
        """Tokens with every MASK replaced by the token of the real value ``value``."""
        fill = self.tokenizer.encode(torch.tensor(float(value))).to(self.device)
        return torch.where(self.observed, self.tokens, fill)

    def to_str_tokens(self, i: int = 0) -> list[str]:
        """A label per position of matrix ``i``, in the model's reading order: its 0-based row
        and column and the value the model sees there, ``"(row,col)=0.44"``, or
        ``"(row,col)=MASK"`` where the entry is masked (TransformerLens's ``to_str_tokens`` for
        matrices; :func:`tfmatcomp.plotting.attention_view` and circuitsvis label tokens with it).

        Example:
            >>> import torch
            >>> from tfmatcomp import MatrixBatch
            >>> b = MatrixBatch.from_values(torch.tensor([[0.44, -1.0, 0.0, 2.5]]),
            ...                             torch.tensor([[True, False, True, True]]), 2, 2)
            >>> b.to_str_tokens(0)
            ['(0,0)=0.44', '(0,1)=MASK', '(1,0)=0', '(1,1)=2.5']
        """
        if isinstance(i, bool) or not isinstance(i, int) or not -self.batch_size <= i < self.batch_size:
            raise ValueError(f"i: must be an integer matrix index in [0, {self.batch_size}), got {i!r}")
        decimals = max(0, math.ceil(math.log10(self.tokenizer.scale)))
        values = self.values[i].detach().cpu().tolist()
        observed = self.observed[i].detach().cpu().tolist()
        out = []
        for k, (v, seen) in enumerate(zip(values, observed)):
            r, c = divmod(k, self.n_cols)
            shown = f"{round(v, decimals):.{decimals}f}".rstrip("0").rstrip(".") if seen else "MASK"
            out.append(f"({r},{c})={'0' if shown in ('', '-0') else shown}")
        return out

    def __getitem__(self, index: slice | Tensor) -> "MatrixBatch":
        """A sub-batch (e.g. ``batch[:8]``)."""
        return replace(self, tokens=self.tokens[index], values=self.values[index],
                       observed=self.observed[index])

    @classmethod
    def from_values(
        cls,
        values: Float[Tensor, "batch pos"],
        observed: Bool[Tensor, "batch pos"],
        n_rows: int,
        n_cols: int,
        tokenizer: ValueTokenizer | None = None,
    ) -> "MatrixBatch":
        """Build a batch from target values and an observed-mask (values are rounded to the grid).

        Raises:
            ValueError: on shape mismatch, NaN, or values outside the tokenizer's range.
        """
        tokenizer = tokenizer or ValueTokenizer()
        if values.ndim != 2 or values.shape[1] != n_rows * n_cols:
            raise ValueError(f"values: expected shape [batch, {n_rows * n_cols}] for a "
                             f"{n_rows}x{n_cols} matrix, got {tuple(values.shape)}")
        observed = torch.as_tensor(observed, device=values.device)
        if observed.dtype != torch.bool:
            raise ValueError(f"observed: must be a bool tensor (True = observed), got {observed.dtype}")
        _check_observed_shape(observed, values.shape[0], values.shape[1])
        observed = observed.expand_as(values)
        ids = tokenizer.encode(values)
        values = tokenizer.round(values.float())
        tokens = torch.where(observed, ids, torch.full_like(ids, tokenizer.mask_token_id))
        return cls(tokens=tokens, values=values, observed=observed.clone(), n_rows=n_rows,
                   n_cols=n_cols, tokenizer=tokenizer)


def _check_int(name: str, value: int, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (
            high is not None and value > high):
        allowed = f"an integer in [{low}, {high}]" if high is not None else f"an integer >= {low}"
        raise ValueError(f"{name}: must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class MatrixCompletionTask:
    """Distribution of masked low-rank matrices, tokenized for the encoder.

    Args:
        n_rows: rows of ``X``.
        n_cols: columns of ``X`` (default: ``n_rows``).
        rank: rank of ``X = U V^T``; ``None`` draws a full matrix with iid entries (the papers'
            "random" matrices).
        p_mask: probability that an entry is masked, in ``[0, 1)``.
        distribution: law of the entries of ``U`` and ``V``: ``"uniform"`` (Uniform[-1, 1], the
            papers'), ``"gaussian"`` (N(0, 1)), ``"laplace"`` (Laplace(0, 1)), or
            ``"gaussian_matched"`` / ``"laplace_matched"`` (the same laws with Uniform[-1, 1]'s
            variance 1/3: N(0, 1/3), Laplace(0, 1/sqrt(6))).
        tokenizer: value tokenizer (the papers' by default). Samples outside its range are clipped
            to it, so heavy-tailed laws never fail mid-batch.

    Example:
        >>> task = MatrixCompletionTask(n_rows=4, rank=1)
        >>> task.n_positions, task.max_abs_entry
        (16, 1.0)
        >>> MatrixCompletionTask(n_rows=4, rank=1, distribution="gaussian_matched").factor_variance
        0.3333333333333333
    """

    n_rows: int = 7
    n_cols: int | None = None
    rank: int | None = 2
    p_mask: float = 0.3
    distribution: Distribution = "uniform"
    tokenizer: ValueTokenizer = field(default_factory=ValueTokenizer, repr=False)

    def __post_init__(self) -> None:
        _check_int("n_rows", self.n_rows, 1)
        if self.n_cols is None:
            object.__setattr__(self, "n_cols", self.n_rows)
        _check_int("n_cols", self.n_cols, 1)
        if self.rank is not None:
            _check_int("rank", self.rank, 1, min(self.n_rows, self.n_cols))
        p = self.p_mask
        if not isinstance(p, (int, float)) or p != p or not 0.0 <= p < 1.0:
            raise ValueError(f"p_mask: must be a probability in [0, 1), got {p!r}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution: must be one of {DISTRIBUTIONS}, got {self.distribution!r}")

    @property
    def n_positions(self) -> int:
        """Sequence length ``n_rows * n_cols``."""
        return self.n_rows * self.n_cols

    @property
    def factor_variance(self) -> float:
        """The variance of one entry of ``U`` or ``V`` (:data:`FACTOR_VARIANCE`; 1/3 for the
        papers' Uniform[-1, 1])."""
        return FACTOR_VARIANCE[self.distribution]

    @property
    def max_abs_entry(self) -> float:
        """The largest ``|entry|`` this task can produce: :func:`max_abs_entry` of its law, rank
        and tokenizer (``rank`` for uniform factors, 1 for uniform full-rank matrices; the
        tokenizer's bound for unbounded laws)."""
        return max_abs_entry(self.distribution, self.rank, self.tokenizer)

    def _draw(self, shape: tuple[int, ...], generator: torch.Generator | None,
              device: torch.device | str | None) -> Tensor:
        law, scale = _MATCHED.get(self.distribution, (self.distribution, None))
        if law == "uniform":
            x = torch.rand(shape, generator=generator, device=device) * 2 - 1
        elif law == "gaussian":
            x = torch.randn(shape, generator=generator, device=device)
        else:
            u = torch.rand(shape, generator=generator, device=device).clamp_(1e-7, 1 - 1e-7) - 0.5
            x = -torch.sign(u) * torch.log1p(-2 * u.abs())  # Laplace(0, 1) by inversion
        return x if scale is None else x * scale

    def sample_matrices(self, batch_size: int, generator: torch.Generator | None = None,
                        device: torch.device | str | None = None) -> Float[Tensor, "batch n_rows n_cols"]:
        """Unrounded matrices ``X`` of shape ``[batch, n_rows, n_cols]``."""
        _check_int("batch_size", batch_size, 1)
        device = _device_of(generator, device)
        if self.rank is None:
            return self._draw((batch_size, self.n_rows, self.n_cols), generator, device)
        u = self._draw((batch_size, self.n_rows, self.rank), generator, device)
        v = self._draw((batch_size, self.n_cols, self.rank), generator, device)
        return u @ v.transpose(1, 2)

    def sample_observed(self, batch_size: int, generator: torch.Generator | None = None,
                        device: torch.device | str | None = None) -> Bool[Tensor, "batch pos"]:
        """Bernoulli masks: each entry observed (True) with probability ``1 - p_mask``."""
        _check_int("batch_size", batch_size, 1)
        device = _device_of(generator, device)
        return torch.rand((batch_size, self.n_positions), generator=generator,
                          device=device) >= self.p_mask

    def sample(
        self,
        batch_size: int,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        observed: Bool[Tensor, "*batch pos"] | None = None,
    ) -> MatrixBatch:
        """A fresh batch of masked matrices.

        Args:
            batch_size: number of matrices.
            generator: source of randomness (its device is used when ``device`` is None).
            device: where the batch lives.
            observed: an explicit / structured mask, ``[pos]`` or ``[batch, pos]`` bool with True at
                observed entries; the Bernoulli mask is used when None.
        """
        device = _device_of(generator, device)
        x = self.sample_matrices(batch_size, generator, device).reshape(batch_size, -1)
        x = x.clamp(self.tokenizer.v_min, self.tokenizer.v_max)
        if observed is None:
            observed = self.sample_observed(batch_size, generator, device)
        else:
            observed = torch.as_tensor(observed, device=x.device)
            _check_observed_shape(observed, batch_size, self.n_positions)
            observed = observed.expand(batch_size, -1)
        return MatrixBatch.from_values(x, observed, self.n_rows, self.n_cols, self.tokenizer)


@dataclass(frozen=True)
class MatrixMixtureTask:
    """A uniform mixture of square sizes (the NeurIPS paper, Appendix I): each batch draws one size ``n``
    uniformly from ``sizes`` and holds ``n x n`` matrices of it (no padding: a batch of ``n x n``
    matrices is ``n * n`` positions long, row-major, so a model needs ``max(sizes) ** 2``
    positions). Rank, mask probability and entry law are shared by every size.

    Args:
        sizes: the sizes ``n`` to mix, distinct, each ``>= rank``.
        rank, p_mask, distribution, tokenizer: as :class:`MatrixCompletionTask`.

    Example:
        >>> import torch
        >>> task = MatrixMixtureTask(sizes=(5, 7, 9), rank=1)
        >>> task.n_positions, task.tasks[5].n_positions
        (81, 25)
        >>> g = torch.Generator().manual_seed(0)
        >>> sorted({task.sample(2, generator=g).n_rows for _ in range(20)})
        [5, 7, 9]
    """

    sizes: tuple[int, ...] = (5, 7, 9)
    rank: int | None = 1
    p_mask: float = 0.3
    distribution: Distribution = "uniform"
    tokenizer: ValueTokenizer = field(default_factory=ValueTokenizer, repr=False)

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes) if isinstance(self.sizes, (list, tuple)) else None
        if not sizes or len(set(sizes)) != len(sizes):
            raise ValueError(f"sizes: expected a non-empty sequence of distinct sizes, got "
                             f"{self.sizes!r}")
        object.__setattr__(self, "sizes", sizes)
        tasks = {n: MatrixCompletionTask(n_rows=n, rank=self.rank, p_mask=self.p_mask,
                                         distribution=self.distribution, tokenizer=self.tokenizer)
                 for n in sizes}  # checks every size and the shared fields
        object.__setattr__(self, "_tasks", tasks)

    @property
    def tasks(self) -> dict[int, MatrixCompletionTask]:
        """``{n: the n x n task}`` for every size of the mixture."""
        return dict(self._tasks)

    @property
    def n_rows(self) -> int:
        """The largest size (the one that needs the most positions)."""
        return max(self.sizes)

    @property
    def n_cols(self) -> int:
        return self.n_rows

    @property
    def n_positions(self) -> int:
        """Positions the largest size needs (``max(sizes) ** 2``)."""
        return self.n_rows * self.n_cols

    @property
    def factor_variance(self) -> float:
        """As :attr:`MatrixCompletionTask.factor_variance` (shared by every size)."""
        return FACTOR_VARIANCE[self.distribution]

    @property
    def max_abs_entry(self) -> float:
        """As :attr:`MatrixCompletionTask.max_abs_entry` (shared by every size)."""
        return max_abs_entry(self.distribution, self.rank, self.tokenizer)

    def sample_size(self, generator: torch.Generator | None = None) -> int:
        """One size drawn uniformly from ``sizes`` (one draw from ``generator``)."""
        i = torch.randint(len(self.sizes), (1,), generator=generator,
                          device=_device_of(generator, None))
        return self.sizes[int(i)]

    def sample(
        self,
        batch_size: int,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        observed: Bool[Tensor, "*batch pos"] | None = None,
    ) -> MatrixBatch:
        """A batch of one size drawn uniformly, then :meth:`MatrixCompletionTask.sample` of it.

        ``observed`` needs the drawn size's length, so for fixed masks sample from
        ``tasks[n]`` directly.
        """
        return self._tasks[self.sample_size(generator)].sample(batch_size, generator, device,
                                                               observed)


def max_abs_entry(distribution: str, rank: int | None,
                  tokenizer: ValueTokenizer | None = None) -> float:
    """The largest ``|entry|`` of ``X`` for factors of law ``distribution`` and rank ``rank``
    (None: iid entries of that law), after the sampler's clipping to the tokenizer's range.

    Uniform[-1, 1] factors give ``|X_ij| = |sum_k U_ik V_jk| <= rank`` (1 for iid uniform
    entries); the other laws are unbounded, so their bound is the tokenizer's.

    Example:
        >>> max_abs_entry("uniform", 2), max_abs_entry("uniform", None), max_abs_entry("gaussian", 2)
        (2.0, 1.0, 10.0)
    """
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution: must be one of {DISTRIBUTIONS}, got {distribution!r}")
    tokenizer = tokenizer or ValueTokenizer()
    clip = float(max(abs(tokenizer.v_min), abs(tokenizer.v_max)))
    if distribution != "uniform":
        return clip
    return min(float(1 if rank is None else rank), clip)


def _check_observed_shape(observed: Tensor, batch_size: int, n_positions: int) -> None:
    if observed.ndim not in (1, 2) or observed.shape[-1] != n_positions or (
            observed.ndim == 2 and observed.shape[0] not in (1, batch_size)):
        raise ValueError(f"observed: expected shape [{n_positions}] or [{batch_size}, "
                         f"{n_positions}], got {tuple(observed.shape)}")


def _device_of(generator: torch.Generator | None, device: torch.device | str | None):
    if device is not None:
        return check_device("device", device)
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise ValueError(f"generator: must be a torch.Generator or None, got "
                             f"{type(generator).__name__}")
        return generator.device
    return torch.device("cpu")
