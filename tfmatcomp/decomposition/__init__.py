"""Position / context / residual decomposition of hidden states (Song & Zhong 2023, eqs. 2-3).

For hidden states ``h[c, t]`` of ``C`` contexts (sequences) and ``T`` positions at one layer::

    mu      = mean over (c, t) of h[c, t]                  global mean            [d]
    pos[t]  = mean over c of h[c, t] - mu                  positional basis       [T, d]
    ctx[c]  = mean over t of h[c, t] - mu                  context basis          [C, d]
    resid   = h - mu - pos[t] - ctx[c]                     residual               [C, T, d]
    cvec    = ctx[c] + resid[c, t]

so that ``h = mu + pos + ctx + resid`` exactly. With per-context masks of valid positions (padding)
every mean runs over valid entries only (see :func:`decompose`).

The package, one idea per module:

* :mod:`~tfmatcomp.decomposition.result`: the result type :class:`Decomposition`;
* :mod:`~tfmatcomp.decomposition.formula`: the formula above, written once, used by both paths;
* :mod:`~tfmatcomp.decomposition.batch`: :func:`decompose` and :func:`decompose_cache`;
* :mod:`~tfmatcomp.decomposition.accumulator`: the streaming :class:`DecompositionAccumulator`;
* :mod:`~tfmatcomp.decomposition.drivers`: :func:`accumulate` / :func:`residual_pass` over a model.

Three ways in:

* :func:`decompose` on a tensor ``[C, T, d]`` (any model's activations, e.g. a TransformerBridge
  cache entry), or :func:`decompose_cache` on a TransformerLens ``ActivationCache``;
* :class:`DecompositionAccumulator`, a streaming accumulator over batches for many layers at once,
  holding ``O(L (T + C) d)`` numbers (plus ``d x d`` per layer for the relative norm), whose results
  equal :func:`decompose` on the concatenated data; residuals come from a second pass over a chosen
  subset of contexts (:meth:`DecompositionAccumulator.residuals`, :func:`residual_pass`);
* :func:`accumulate`, which runs the accumulator over a model and an iterable of token batches with
  a progress bar, feeding it from hooks so the full cache is never stored.

Example:
    >>> import torch
    >>> from tfmatcomp.decomposition import decompose
    >>> h = torch.randn(8, 5, 3, generator=torch.Generator().manual_seed(0))
    >>> dec = decompose(h)
    >>> dec.pos.shape, dec.ctx.shape, dec.resid.shape
    (torch.Size([5, 3]), torch.Size([8, 3]), torch.Size([8, 5, 3]))
    >>> bool(torch.allclose(dec.reconstruct(), h.double()))
    True
"""



from tfmatcomp._lazy import submodules_on_first_use
from tfmatcomp.decomposition.accumulator import DecompositionAccumulator
from tfmatcomp.decomposition.batch import decompose, decompose_cache
from tfmatcomp.decomposition.drivers import accumulate, hf_bert_modules, residual_pass
from tfmatcomp.decomposition.result import Decomposition
from tfmatcomp.models.hook_names import residual_stream_names

__all__ = [
    "Decomposition",
    "decompose",
    "decompose_cache",
    "DecompositionAccumulator",
    "accumulate",
    "residual_pass",
    "residual_stream_names",
    "hf_bert_modules",
]


__getattr__ = submodules_on_first_use(__name__)
