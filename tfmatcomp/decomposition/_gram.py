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
        self._syrk = None
        if device.type == "cpu" and dtype in (torch.float32, torch.float64):
            from scipy.linalg import blas

            self._threads = _openblas_threads()
            if self._threads is not None:
                self._syrk = blas.dsyrk if dtype == torch.float64 else blas.ssyrk
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
