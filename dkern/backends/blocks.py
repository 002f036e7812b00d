"""The block functions a backend provides: all an operator computes on one chunk pair.

An operator (:mod:`dkern.operators`) walks the (row chunk × column chunk) grid
and combines partial results; what happens inside one pair is a method of a
backend object, so operators never know which backend they hold:

============================  =====================================  ==============
method                         computes (x: n_i × d, z: m_j × d)      shape
============================  =====================================  ==============
``kernel_matvec(x, z, v)``     ``k(x, z) @ v``                        (n_i, t)
``normal_matvec(x, c, v)``     ``k(x, c)ᵀ (k(x, c) @ v)``             (M, t)
``kernel_block(x, z)``         ``k(x, z)``, dense (small m only)      (n_i, m_j)
``kernel_diag(x)``             ``k(x_i, x_i)``                        (n_i,)
============================  =====================================  ==============

Data blocks are positional and the kernel a keyword, as
:func:`~dkern.operators.pairwise.pairwise_reduce` calls block functions.
Reductions come back in float64 whatever the input precision; dense blocks and
diagonals keep x's dtype. Every method runs BLAS single-threaded: dask runs
tasks side by side, one per core. Kernels refuse values that overflow
(:func:`dkern.kernels.base.finite_values`); the products here are checked too (a
pass over their small output), as a sum of finite kernel values may still overflow.
"""

from __future__ import annotations

import numpy as np

from ..kernels import Kernel
from ..kernels.base import finite_values
from .keops_backend import matvec_block_keops
from .numpy_backend import matvec_block_numpy, single_threaded_blas
from .nystrom_normal import normal_matvec_block_keops, normal_matvec_block_numpy
from .projections import KeopsProjections, ProjectionBlocks

__all__ = ["BlockBackend", "KeopsBlocks", "NumpyBlocks", "block_backend"]


class NumpyBlocks(ProjectionBlocks):
    """Cache-sized tiles of kernel values, each folded into the result by one BLAS call."""

    name = "numpy"

    def kernel_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        """``kernel(x, z) @ v``; shape (n_i, t), float64."""
        return finite_values(matvec_block_numpy(kernel, x, z, v), kernel, x, z, v)

    def normal_matvec(self, x: np.ndarray, c: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        """``kernel(x, c)ᵀ (kernel(x, c) @ v)``; shape (M, t), float64."""
        return finite_values(normal_matvec_block_numpy(kernel, x, c, v), kernel, x, c, v)

    def kernel_block(self, x: np.ndarray, z: np.ndarray, *, kernel: Kernel) -> np.ndarray:
        """The dense block ``kernel(x, z)``; shape (n_i, m_j), x's dtype."""
        with single_threaded_blas():
            return np.asarray(kernel(x, z), dtype=x.dtype)

    def kernel_diag(self, x: np.ndarray, *, kernel: Kernel) -> np.ndarray:
        """``kernel(x_i, x_i)`` for each row; shape (n_i,), x's dtype."""
        return np.asarray(kernel.diag(x), dtype=x.dtype)


class KeopsBlocks(KeopsProjections, NumpyBlocks):
    """KeOps reductions for the products; dense blocks and diagonals as numpy's.

    KeOps streams kernel values through registers and never stores a block, so
    what must be stored (a dense block, a diagonal) is the numpy backend's work.
    """

    name = "keops"

    def kernel_matvec(self, x: np.ndarray, z: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        return finite_values(matvec_block_keops(kernel, x, z, v), kernel, x, z, v)

    def normal_matvec(self, x: np.ndarray, c: np.ndarray, v: np.ndarray, *,
                      kernel: Kernel) -> np.ndarray:
        return finite_values(normal_matvec_block_keops(kernel, x, c, v), kernel, x, c, v)


BlockBackend = NumpyBlocks  # the interface every backend's blocks implement
_BLOCKS: dict[str, BlockBackend] = {"numpy": NumpyBlocks(), "keops": KeopsBlocks()}


def block_backend(name: str) -> BlockBackend:
    """The block functions of a concrete backend (``"numpy"`` or ``"keops"``), as
    returned by :func:`~dkern.backends.resolve_backend`."""
    try:
        return _BLOCKS[name]
    except KeyError:
        raise ValueError(f"block_backend takes a concrete backend, 'numpy' or 'keops'; got "
                         f"{name!r}. Resolve 'auto' with resolve_backend first.") from None
