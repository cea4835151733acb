"""The fast training step: what :class:`~tfmatcomp.Trainer` runs on CUDA when nothing watches.

On a GPU the explicit step spends most of its time waiting: on the host, which reads values back
(token checks, the finiteness test of the loss) and so stalls the queue every step, and on kernel
launches. :class:`FastStep` removes both:

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

It runs only where nothing may look inside the model: an encoder with every parameter trainable
and no hook attached (:func:`blocker`, :func:`hooks_attached`). Everything else, and any run with
``TrainConfig.fast=False``, keeps the explicit step, which is also the default off CUDA, so CPU
results are unchanged bit for bit.

Example (forced on CPU, as the tests do; on CUDA ``tm.train`` chooses it by itself):
    >>> import tfmatcomp as tm
    >>> r = tm.train("tiny", n_steps=4, batch_size=8, log_every=2, progress=False, fast=True)
    >>> list(r.metrics["step"])
    [2, 4]
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor, nn

from tfmatcomp.components.layer_norm import _hooked
from tfmatcomp.data import MatrixBatch, MatrixCompletionTask
from tfmatcomp.metrics import masked_mse
from tfmatcomp.model import HookedEncoder

__all__ = ["FastStep", "use_fast", "blocker", "hooks_attached", "sample_batch", "numerics"]

#: ``torch.compile`` mode for inductor (None: its default). ``"max-autotune-no-cudagraphs"``
#: autotunes the matmuls (minutes of compilation); ``"reduce-overhead"`` adds CUDA graphs.
COMPILE_MODE: str | None = None


def use_fast(fast: bool | None, device: torch.device, blocked_by: str | None) -> bool:
    """Whether a run takes the fast step: ``fast`` (``TrainConfig.fast``) if given, else on CUDA
    only; never when ``blocked_by`` (from :func:`blocker`) names a reason.

    Raises:
        ValueError: ``fast=True`` for a run that cannot take the fast step.

    Example:
        >>> use_fast(None, torch.device("cpu"), None), use_fast(None, torch.device("cuda"), None)
        (False, True)
    """
    if blocked_by is not None:
        if fast:
            raise ValueError(f"fast: the fast step cannot train {blocked_by}; pass fast=False "
                             "or leave it None")
        return False
    return bool(fast) if fast is not None else torch.device(device).type == "cuda"


def blocker(model: nn.Module, trainable: object, own_step: bool) -> str | None:
    """Why a run must keep the explicit step (None: it may take the fast one).

    Args:
        model: the model trained.
        trainable: the trainer's parameter filter (component-wise training) or None.
        own_step: the trainer class replaces the training step (data-parallel training).
    """
    if not isinstance(model, HookedEncoder):
        return f"a {type(model).__name__} (the fast step trains the encoder)"
    if trainable is not None:
        return "a subset of the parameters (component-wise training)"
    if own_step:
        return "a trainer with its own training step"
    return None


def hooks_attached(model: nn.Module) -> bool:
    """True when a hook (TransformerLens, plain PyTorch, or an instance-level ``forward``) may
    read or edit the model: its run keeps the explicit step, which calls every hook."""
    points = getattr(model, "hook_dict", {}).values()
    return any(_hooked(hp) for hp in points) or any(
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
    """One training update of an encoder, compiled, in bf16 autocast, without host syncs.

    Args:
        model: the :class:`~tfmatcomp.HookedEncoder` trained (float32 weights).
        optimizer: its optimizer (build Adam with ``fused=True`` on CUDA).
        autocast_dtype: the autocast dtype (bf16), or None for float32.
        compile: compile the forward pass and the loss; False runs them eagerly.
        backend, mode: for ``torch.compile`` (default: inductor with :data:`COMPILE_MODE` on
            CUDA, ``aot_eager`` elsewhere).

    Example:
        >>> import tfmatcomp as tm
        >>> model = tm.HookedEncoder(tm.get_preset("tiny").model, seed=0)
        >>> step = FastStep(model, torch.optim.Adam(model.parameters(), lr=1e-3), compile=False)
        >>> batch = tm.MatrixCompletionTask(4, rank=1).sample(8, torch.Generator().manual_seed(0))
        >>> step.update(batch).shape, step.check_finite(1)
        (torch.Size([8, 16]), None)
    """

    def __init__(self, model: HookedEncoder, optimizer: torch.optim.Optimizer, *,
                 autocast_dtype: torch.dtype | None = torch.bfloat16, compile: bool = True,
                 backend: str | None = None, mode: str | None = None):
        self.model, self.optimizer = model, optimizer
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        forward = self._forward_loss
        if compile:
            cuda = self.device.type == "cuda"
            backend = backend or ("inductor" if cuda else "aot_eager")
            mode = (mode or COMPILE_MODE) if backend == "inductor" else None
            forward = torch.compile(forward, backend=backend, mode=mode)
        self._forward = forward
        self._bad = torch.zeros((), dtype=torch.bool, device=self.device)
        self._checked = 0

    def _forward_loss(self, tokens: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            predictions = self.model._run(tokens)  # no token checks: they read values back
        return predictions, masked_mse(predictions, values)  # the loss in float32

    def update(self, batch: MatrixBatch) -> Tensor:
        """One optimizer update on ``batch``; returns the predictions it used. Never reads a
        tensor back: a non-finite loss only sets a flag for :meth:`check_finite`."""
        predictions, loss = self._forward(batch.tokens, batch.values)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._bad |= ~torch.isfinite(loss.detach())
        return predictions

    def check_finite(self, step: int) -> None:
        """Raise ``FloatingPointError`` if a loss since the last check (up to ``step``) was not
        finite. Reads one value back: call it where the trainer logs or checkpoints."""
        if bool(self._bad):
            raise FloatingPointError(
                f"training diverged between steps {self._checked + 1} and {step}: a loss was not "
                "finite (the fast step checks at logging steps); try a lower lr, or fast=False "
                "to stop at the first bad step")
        self._checked = step
