"""The running second moment ``sum x x^T`` of the accumulator, at half the cost of a GEMM.

The ``d x d`` Gram of every batch is the accumulator's largest cost (``N d^2`` multiply-adds per
layer and batch, in float64). It is symmetric, so on the CPU one BLAS ``syrk`` (through SciPy, on
the tensor's own memory) computes one triangle for half the work; elsewhere (CUDA, other dtypes)
one in-place ``addmm_``. :meth:`RunningGram.full` rebuilds the symmetric matrix.

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

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor


class RunningGram:
    """``sum over added rows of x x^T`` (``[d, d]``), kept in one contiguous tensor."""

    def __init__(self, d: int, dtype: torch.dtype, device: torch.device):
        self.tensor = torch.zeros(d, d, dtype=dtype, device=device)
        self._syrk = None
        if device.type == "cpu" and dtype in (torch.float32, torch.float64):
            from scipy.linalg import blas

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
        out = self._syrk(1.0, a, beta=1.0, c=c, trans=0, lower=0, overwrite_c=1)
        if not np.shares_memory(out, c):  # SciPy copied the target after all: write it back
            c[...] = out

    def full(self) -> Float[Tensor, "d d"]:
        """The symmetric sum (a new tensor)."""
        if self._syrk is None:
            return self.tensor.clone()
        lower = self.tensor.tril()
        return lower + lower.tril(-1).T
