"""The fast training step: what :class:`~tfmatcomp.Trainer` runs when nothing watches, on CUDA
and on CPUs with bf16 matrix units (AMX or AVX-512 bf16).

On a GPU the explicit step spends most of its time waiting: on the host, which reads values back
(token checks, the finiteness test of the loss) and so stalls the queue every step, and on kernel
launches. On such a CPU it spends most of its time in float32 matmuls, which its AMX tiles run
about ten times faster in bf16. :class:`FastStep` has one path per device kind.

On CPU (:data:`CPU_PATH`):

* the weights are cast to bf16 once per step (``torch.func.functional_call`` over bf16 copies of
  the float32 parameters, so the gradients arrive in float32 on the master weights and Adam's
  state stays float32), and the whole forward pass runs in bf16 through the model's own
  components; the loss is computed in float32;
* attention takes the components' explicit matmul path, not ``scaled_dot_product_attention``,
  whose CPU flash kernel is slow in bf16 backward at these short sequences (measured in
  docs/fast-cpu.md, with SDPA's math path and autocast);
* the process keeps the memory it frees for reuse (:func:`retain_freed_memory`, glibc's
  ``mallopt``), so each step's activations land on pages already mapped instead of faulting in
  fresh ones (up to a fifth of a step at d_model 512);
* Adam is built with ``fused=True``.

On CUDA:

* the forward pass and the loss run under bf16 autocast (the weights, the optimizer and the loss
  stay float32), TF32 matmuls are allowed for what stays float32 (:func:`numerics`, restored
  afterwards, never set at import);
* the forward pass and its loss are compiled with ``torch.compile`` (inductor on CUDA;
  ``aot_eager`` elsewhere, which needs no C compiler), and the caller builds Adam with
  ``fused=True``;
* the batch is drawn on the device by the training stream's device generator, without the value
  checks that read tensors back (:func:`sample_batch`, the same batches as ``task.sample``);
* nothing reads a tensor back between logging steps: a non-finite loss sets a flag on the device
  that :meth:`FastStep.check_finite` reads when the trainer logs or checkpoints.

It runs only where nothing may look inside the model: an encoder with no intervention during training
and no hook attached (:func:`blocker`, :func:`hooks_attached`). Everything else, and any run with
``TrainConfig.fast=False``, keeps the explicit float32 step. Left to itself (``fast=None``) a run
takes the fast step on CUDA, and on a CPU when the model has ``d_model >=`` :data:`~tfmatcomp.datapath.CPU_MIN_D_MODEL`
and the CPU has bf16 matrix units (:func:`~tfmatcomp.datapath.cpu_bf16_units`); :func:`decide` says why not otherwise,
and the trainer writes that reason in its run record. ``tiny`` (d_model 64) therefore keeps the
float32 step, and its runs are unchanged bit for bit.

Example (forced on CPU for a small model, as the tests do):
    >>> import tfmatcomp as tm
    >>> r = tm.train("tiny", n_steps=4, batch_size=8, log_every=2, progress=False, fast=True)
    >>> list(r.metrics["step"])
    [2, 4]
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from tfmatcomp.datapath import CPU_MIN_D_MODEL, cpu_bf16_units
from tfmatcomp.models.components.hook_point import is_hooked
from tfmatcomp.task.data import MatrixBatch, MatrixCompletionTask
from tfmatcomp.task.metrics import mse
from tfmatcomp.models.encoder import HookedEncoder, UncheckedForward
from tfmatcomp.models.objectives import objective_of_class
from tfmatcomp.validation import check_choice

__all__ = ["FastStep", "use_fast", "decide", "retain_freed_memory", "blocker",
           "hooks_attached", "sample_batch", "numerics"]

#: ``torch.compile`` mode for inductor (None: its default). ``"max-autotune-no-cudagraphs"``
#: autotunes the matmuls (minutes of compilation); ``"reduce-overhead"`` adds CUDA graphs.
COMPILE_MODE: str | None = None


#: What the CPU path runs (the choices docs/fast-cpu.md measured).
CPU_PATH = "bf16 weights cast once per step, explicit attention, fused Adam, eager"


@functools.cache
def retain_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse in this process: large blocks come from the heap
    instead of fresh ``mmap`` regions, and the heap is not trimmed. A training step allocates and
    frees the same few hundred MiB of activations every step; without this each step page-faults
    them in again. The process's resident memory then stays at its peak. Done once per process;
    returns whether it was done (False off Linux / glibc).

    Example:
        >>> retain_freed_memory() in (True, False)
        True
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    done = [mallopt(option, value) == 1 for option, value in (
        (m_mmap_threshold, 32 << 20), (m_trim_threshold, (1 << 31) - 1), (m_top_pad, 64 << 20))]
    return all(done)


def decide(fast: bool | None, device: torch.device, blocked_by: str | None,
           d_model: int | None = None) -> tuple[bool, str]:
    """Whether a run takes the fast step, and why (one line for the run's log).

    ``fast`` is ``TrainConfig.fast``: False never, True always (unless ``blocked_by``, from
    :func:`blocker`, names a reason), None where it pays: on CUDA, and on a CPU with bf16 matrix
    units for ``d_model >=`` :data:`~tfmatcomp.datapath.CPU_MIN_D_MODEL`.

    Raises:
        ValueError: ``fast=True`` for a run that cannot take the fast step.

    Example:
        >>> decide(None, torch.device("cpu"), None, d_model=64)
        (False, 'float32 step: d_model 64 < 256, too narrow for bf16 to pay on a CPU')
        >>> decide(False, torch.device("cuda"), None)
        (False, 'float32 step: fast=False')
    """
    device = torch.device(device)
    if blocked_by is not None:
        if fast:
            raise ValueError(f"fast: the fast step cannot train {blocked_by}; pass fast=False "
                             "or leave it None")
        return False, f"float32 step: the fast step cannot train {blocked_by}"
    if fast is False:
        return False, "float32 step: fast=False"
    what = ("fast step: bf16 autocast, compiled" if device.type == "cuda"
            else f"fast step: {CPU_PATH}")
    if fast:
        return True, what + " (fast=True)"
    if device.type == "cuda":
        return True, what
    if device.type != "cpu":
        return False, f"float32 step: no fast step for device {device.type!r}"
    if d_model is not None and d_model < CPU_MIN_D_MODEL:
        return False, (f"float32 step: d_model {d_model} < {CPU_MIN_D_MODEL}, too narrow for "
                       "bf16 to pay on a CPU")
    units = cpu_bf16_units()
    if units is None:
        return False, "float32 step: this CPU has no bf16 matrix units (AMX or AVX-512 bf16)"
    return True, f"{what} (on {units})"


def use_fast(fast: bool | None, device: torch.device, blocked_by: str | None,
             d_model: int | None = None) -> bool:
    """The first half of :func:`decide`: whether a run takes the fast step.

    Raises:
        ValueError: ``fast=True`` for a run that cannot take the fast step.

    Example:
        >>> use_fast(None, torch.device("cpu"), None, d_model=64), use_fast(None, "cuda", None)
        (False, True)
    """
    return decide(fast, device, blocked_by, d_model)[0]


def blocker(model_class: type[nn.Module], own_step: bool,
            interventions: Sequence = (),
            device: torch.device | str = "cpu") -> str | None:
    """Why a run must keep the explicit step (None: it may take the fast one).

    Args:
        model_class: the class of the model trained (decided before any model is built).
        own_step: the trainer class replaces the training step (data-parallel training).
        interventions: the run's interventions during training (``TrainConfig.interventions``):
            the CPU fast step applies attention scaling, freezing and re-initializing (its
            forward runs the components, hooks included); the compiled CUDA step none, and
            neither the attention penalty.
        device: where the run trains.
    """
    objective = objective_of_class(model_class)
    if objective is None or not objective.fast_step:
        return f"a {model_class.__name__} (the fast step trains the encoder)"
    if own_step:
        return "a trainer with its own training step"
    if interventions and torch.device(device).type != "cpu":
        return "interventions during training on CUDA (its step is compiled)"
    refused = next((iv for iv in interventions if not iv.fast_cpu), None)
    if refused is not None:
        return f"a {refused.kind.replace('_', ' ')} (TrainConfig.interventions)"
    return None


def hooks_attached(model: nn.Module) -> bool:
    """True when a hook (TransformerLens, plain PyTorch, or an instance-level ``forward``) may
    read or edit the model: its run keeps the explicit step, which calls every hook."""
    points = getattr(model, "hook_dict", {}).values()
    return any(is_hooked(hp) for hp in points) or any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())


def sample_batch(task, batch_size: int, generator: torch.Generator,
                 device: torch.device) -> MatrixBatch:
    """``task.sample(batch_size, generator, device)``, the same tensors from the same draws, but
    without the value checks that read tensors back to the host (for a
    :class:`~tfmatcomp.MatrixCompletionTask`, whose clamped draws need none; other tasks are
    sampled as usual).

    Example:
        >>> task = MatrixCompletionTask(n_rows=4, rank=1)
        >>> a = sample_batch(task, 8, torch.Generator().manual_seed(0), torch.device("cpu"))
        >>> b = task.sample(8, generator=torch.Generator().manual_seed(0))
        >>> all(torch.equal(x, y) for x, y in ((a.tokens, b.tokens), (a.values, b.values)))
        True
    """
    if not isinstance(task, MatrixCompletionTask):
        return task.sample(batch_size, generator=generator, device=device)
    tok = task.tokenizer
    x = task.sample_matrices(batch_size, generator, device).reshape(batch_size, -1)
    x = x.clamp(tok.v_min, tok.v_max)  # as task.sample: every value on the grid, so no check
    observed = task.sample_observed(batch_size, generator, device)
    ids = torch.round((x.to(torch.float64) - tok.v_min) * tok.scale).to(torch.long) + 1
    ids = ids.clamp_(1, tok.vocab_size - 1)
    tokens = torch.where(observed, ids, torch.full_like(ids, tok.mask_token_id))
    return MatrixBatch(tokens=tokens, values=tok.round(x.float()), observed=observed,
                       n_rows=task.n_rows, n_cols=task.n_cols, tokenizer=tok)


@contextlib.contextmanager
def numerics(device: torch.device) -> Iterator[None]:
    """TF32 matmuls for float32 work on CUDA while the block runs; the previous setting after.

    Example:
        >>> with numerics(torch.device("cpu")):
        ...     pass
        >>> torch.get_float32_matmul_precision()
        'highest'
    """
    before = torch.get_float32_matmul_precision()
    if torch.device(device).type == "cuda":
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


class FastStep:
    """One training update of an encoder in bf16 without host syncs (CPU: bf16 weights cast once
    per step; CUDA: autocast and ``torch.compile``).

    Args:
        model: the :class:`~tfmatcomp.HookedEncoder` trained (float32 weights, the master copy).
        optimizer: its optimizer (build Adam with ``fused=True``).
        autocast_dtype: the reduced dtype (bf16), or None for float32.
        compile: compile the forward pass and the loss (default: on CUDA only).
        backend, mode: for ``torch.compile`` (default: inductor with :data:`COMPILE_MODE` on
            CUDA, ``aot_eager`` elsewhere).
        attention: on CPU, ``"explicit"`` (default: the components' matmul path) or ``"sdpa"``
            (``scaled_dot_product_attention``, for benchmarks/cpu_step_variants.py).

    Example:
        >>> import tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        >>> step = FastStep(model, torch.optim.Adam(model.parameters(), lr=1e-3))
        >>> batch = tm.MatrixCompletionTask(4, rank=1).sample(8, torch.Generator().manual_seed(0))
        >>> predictions = step.update(batch)
        >>> predictions.shape, predictions.dtype, model.blocks[0].mlp.W_in.dtype
        (torch.Size([8, 16]), torch.float32, torch.float32)
    """

    def __init__(self, model: HookedEncoder, optimizer: torch.optim.Optimizer, *,
                 autocast_dtype: torch.dtype | None = torch.bfloat16, compile: bool | None = None,
                 backend: str | None = None, mode: str | None = None,
                 attention: str = "explicit"):
        check_choice("attention", attention, ("explicit", "sdpa"))
        self.model, self.optimizer = model, optimizer
        self.attention = attention
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        cuda = self.device.type == "cuda"
        forward = self._forward_loss if cuda else self._forward_loss_cast
        if compile if compile is not None else cuda:
            backend = backend or ("inductor" if cuda else "aot_eager")
            mode = (mode or COMPILE_MODE) if backend == "inductor" else None
            forward = torch.compile(forward, backend=backend, mode=mode)
        self._forward = forward
        self._unchecked = UncheckedForward(model)
        #: the master weights under their names in ``_unchecked`` (the same Parameter objects
        #: for the whole run: resume and checkpoints copy into them)
        self._weights = [(f"model.{name}", p) for name, p in model.named_parameters()]
        if not cuda:
            retain_freed_memory()
        self._bad = torch.zeros((), dtype=torch.bool, device=self.device)
        self._checked = 0

    def _forward_loss(self, tokens: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """CUDA: the float32 model under autocast."""
        with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            predictions = self._unchecked(tokens)  # no token checks: they read values back
        return predictions, mse(predictions, values)  # the loss in float32

    def _forward_loss_cast(self, tokens: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """CPU: the model's components on bf16 copies of its weights, made once per step (their
        gradients flow back to the float32 weights through the casts)."""
        dtype = self.autocast_dtype or torch.float32
        weights = {name: p.to(dtype) for name, p in self._weights}
        with (self.model.unfused(layer_norm=False) if self.attention == "explicit"
              else contextlib.nullcontext()):
            predictions = torch.func.functional_call(self._unchecked, weights, (tokens,)).float()
        return predictions, mse(predictions, values)  # the loss in float32

    def update(self, batch: MatrixBatch, before_step: Callable[[], None] | None = None) -> Tensor:
        """One optimizer update on ``batch``; returns the (float32) predictions it used. Never
        reads a tensor back on CUDA: a non-finite loss only sets a flag for :meth:`check_finite`.
        ``before_step`` runs between the backward pass and the optimizer step (frozen parameters
        drop their gradients there)."""
        predictions, loss = self._forward(batch.tokens, batch.values)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if before_step is not None:
            before_step()
        self.optimizer.step()
        self._bad |= ~torch.isfinite(loss.detach())
        return predictions.float()

    def check_finite(self, step: int) -> None:
        """Raise ``FloatingPointError`` if a loss since the last check (up to ``step``) was not
        finite. Reads one value back: call it where the trainer logs or checkpoints."""
        if bool(self._bad):
            raise FloatingPointError(
                f"training diverged between steps {self._checked + 1} and {step}: a loss was not "
                "finite (the fast step checks at logging steps); try a lower lr, or fast=False "
                "to stop at the first bad step")
        self._checked = step
