"""dkern: kernel methods on data larger than memory.

Zarr store -> dask row chunks -> lazy Gram blocks (numpy/BLAS or KeOps) ->
operator matvec -> solvers -> models, on an embedded LocalCluster or any Dask
scheduler. No process ever holds an n×n kernel matrix.
"""

from __future__ import annotations

from . import io, kernels
from ._version import __version__
from .operators import gram
from .runtime import connect

__all__ = ["KernelRidge", "__version__", "connect", "gram", "io", "kernels", "load", "save"]

#: Names served lazily from dkern.models, which needs scikit-learn: `import dkern` works
#: without it, and these import it on first use.
_MODEL_NAMES = ("KernelRidge", "load", "save")


def __getattr__(name: str) -> object:
    if name in _MODEL_NAMES:
        from . import models

        return getattr(models, name)
    raise AttributeError(f"module 'dkern' has no attribute {name!r}")
