"""The KeOps backend: one kernel block times one vector block as a KeOps reduction.

KeOps never stores the block: it streams ``k(x_i, z_j) v_j`` through registers
(GPU) or cache (CPU) and sums over ``j``. float32 sums use KeOps' block sum
scheme, which keeps float32 throughput with far smaller rounding error than a
plain running sum.
"""

from __future__ import annotations

import numpy as np

from ..kernels import Kernel


def matvec_block_keops(kernel: Kernel, X: np.ndarray, Z: np.ndarray, V: np.ndarray) -> np.ndarray:
    """``kernel(X, Z) @ V`` by a KeOps sum reduction; memory O((n + m)·(d + t)).

    Parameters
    ----------
    kernel : Kernel
    X : ndarray of shape (n, d)
    Z : ndarray of shape (m, d)
    V : ndarray of shape (m, t)

    Returns
    -------
    ndarray of shape (n, t), float64
    """
    from pykeops.numpy import LazyTensor

    dtype = np.result_type(X.dtype, np.float32)
    X, Z = np.ascontiguousarray(X, dtype), np.ascontiguousarray(Z, dtype)
    v = LazyTensor(np.ascontiguousarray(V, dtype)[None, :, :])
    options = {"sum_scheme": "block_sum"} if dtype == np.float32 else {}
    out = (kernel.keops_formula(X, Z) * v).sum(axis=1, **options)
    return np.asarray(out, dtype=np.float64).reshape(X.shape[0], V.shape[1])
