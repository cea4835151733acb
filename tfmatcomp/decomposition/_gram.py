"""The running second moment ``sum x x^T`` of the accumulator, at half the cost of a GEMM.

The ``d x d`` Gram of every batch is the accumulator's largest cost (``N d^2`` multiply-adds per
layer and batch, in float64). It is symmetric, so on the CPU one BLAS ``syrk`` (through SciPy, on
the tensor's own memory) computes one triangle for half the work; elsewhere (CUDA, other dtypes)
one in-place ``addmm_``. :meth:`RunningGram.full` rebuilds the symmetric matrix.

The ``syrk`` runs on one OpenBLAS thread: left to its default, OpenBLAS starts a worker per core
whose busy-waiting competes with torch's own threads (on a loaded 2-core machine a 2032 x 384
update took 56 ms instead of 8 ms). Where SciPy's BLAS is not an OpenBLAS whose thread count can be
set, the torch ``addmm_`` path is used instead.

Example:
    >>> import torch
    >>> x = torch.randn(100, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> g = RunningGram(5, torch.float64, torch.device("cpu"))
    >>> for rows in x.split(30):
    ...     g.add(rows)
    >>> bool(torch.allclose(g.full(), x.T @ x, rtol=0, atol=1e-12))
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor


@functools.cache
def _openblas_threads() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """``(get, set)`` of the thread count of the OpenBLAS behind ``scipy.linalg.blas``, or None."""
    try:
        import scipy

        libs = sorted((Path(scipy.__file__).parent.parent / "scipy.libs").glob("libscipy_openblas*.so*"))
        for lib in libs:
            handle = ctypes.CDLL(str(lib))  # already loaded by scipy.linalg: the same library
            for prefix in ("scipy_openblas", "openblas"):
                get = getattr(handle, f"{prefix}_get_num_threads", None)
                set_ = getattr(handle, f"{prefix}_set_num_threads", None)
                if get is not None and set_ is not None:
                    get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
                    return get, set_
    except OSError:
        pass
    return None


@contextlib.contextmanager
def _one_blas_thread(threads: tuple[Callable[[], int], Callable[[int], None]]) -> Iterator[None]:
    get, set_ = threads
    before = get()
    set_(1)
    try:
        yield
    finally:
        set_(before)


class RunningGram:
    """``sum over added rows of x x^T`` (``[d, d]``), kept in one contiguous tensor."""

    def __init__(self, d: int, dtype: torch.dtype, device: torch.device):
        self.tensor = torch.zeros(d, d, dtype=dtype, device=device)
        self.shift: Tensor | None = None  # float32 [d], set by the first add_float32
        self._scratch = torch.zeros(0, d, dtype=torch.float32, device=device)
        self._gram32 = torch.zeros(d, d, dtype=torch.float32, device=device)
        self._syrk = self._ssyrk = None
        if device.type == "cpu" and dtype in (torch.float32, torch.float64):
            from scipy.linalg import blas

            self._threads = _openblas_threads()
            if self._threads is not None:
                self._syrk = blas.dsyrk if dtype == torch.float64 else blas.ssyrk
                self._ssyrk = blas.ssyrk
                self._array = self.tensor.numpy()  # the same memory, C order

    def add(self, rows: Float[Tensor, "n d"]) -> None:
        """Add ``rows^T rows`` (rows in the tensor's dtype and device)."""
        if rows.shape[0] == 0:
            return
        if self._syrk is None:
            self.tensor.addmm_(rows.T, rows)
            return
        # A C-order [n, d] array is an F-order [d, n] one: syrk's A A^T is rows^T rows. The target
        # is passed as its F-order transpose, so syrk's upper triangle is our lower one.
        a = rows.contiguous().numpy().T
        c = self._array.T
        with _one_blas_thread(self._threads):
            out = self._syrk(1.0, a, beta=1.0, c=c, trans=0, lower=0, overwrite_c=1)
        if not np.shares_memory(out, c):  # SciPy copied the target after all: write it back
            c[...] = out

    def add_float32(self, rows: Float[Tensor, "n d"], row_sum: Float[Tensor, " d"]) -> None:
        """Add ``rows^T rows`` for float32 ``rows`` whose float64 column sum is ``row_sum``, at
        float32 cost: the batch's Gram is formed in float32 around a fixed shift ``s`` (the first
        batch's mean) and put into the float64 sum as
        ``sum (r - s)(r - s)^T + s S^T + S s^T - n s s^T`` (``S = row_sum``). The shift keeps the
        float32 products small where the mean is large (no cancellation in float32), so the error is
        float32 rounding relative to the *centered* second moment, the size of the rounding already
        in float32 activations. Updates the lower triangle (see :meth:`full`)."""
        n = rows.shape[0]
        if n == 0:
            return
        if self.shift is None:
            self.shift = rows.mean(0)
        if self._scratch.shape[0] < n:
            self._scratch = rows.new_empty(n, rows.shape[1])
        centered = torch.sub(rows, self.shift, out=self._scratch[:n])
        if self._ssyrk is None:
            torch.mm(centered.T, centered, out=self._gram32)
        else:  # one triangle, as in add(); beta=0 overwrites the scratch Gram
            with _one_blas_thread(self._threads):
                out = self._ssyrk(1.0, centered.numpy().T, beta=0.0, c=self._gram32.numpy().T,
                                  trans=0, lower=0, overwrite_c=1)
            if not np.shares_memory(out, self._gram32.numpy()):
                self._gram32.numpy().T[...] = out
        s = self.shift.to(self.tensor.dtype)
        cross = torch.outer(s, row_sum.to(self.tensor.dtype))
        self.tensor += self._gram32
        self.tensor += cross
        self.tensor += cross.T
        self.tensor.addr_(s, s, alpha=-n)

    def replace(self, tensor: Float[Tensor, "d d"]) -> None:
        """Hold ``tensor`` (same layout: a sum of other parts' ``tensor``) from now on."""
        self.tensor = tensor.contiguous()
        if self._syrk is not None:
            self._array = self.tensor.numpy()

    def full(self) -> Float[Tensor, "d d"]:
        """The symmetric sum (a new tensor)."""
        if self._syrk is None:
            return self.tensor.clone()
        lower = self.tensor.tril()
        return lower + lower.tril(-1).T
