"""Bridges to other interpretability libraries (optional extra ``tfmatcomp[interop]``).

Nothing here imports those libraries at import time: :mod:`tfmatcomp.interop.pyvene` imports pyvene
inside its functions, and nnsight needs no bridge at all (``nnsight.NNsight(model)`` traces a
:class:`~tfmatcomp.HookedEncoder` as it is; see docs/coming-from.md).
"""
