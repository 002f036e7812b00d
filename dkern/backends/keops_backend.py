"""The KeOps backend: one kernel block times one vector block as a KeOps reduction.

KeOps never stores the block: it streams ``k(x_i, z_j) v_j`` through registers
(GPU) or cache (CPU) and sums over ``j``. float32 sums use KeOps' block sum
scheme, which keeps float32 throughput with far smaller rounding error than a
plain running sum.

KeOps compiles each new formula into a shared cache folder, and two processes
compiling the same formula at once corrupt it ("Incorrect info file", seen with
two LocalCluster workers). The first call of a formula in a process therefore
runs under an inter-process file lock; later calls run unlocked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator

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
    formula = kernel.keops_formula(X, Z) * v
    with _first_call_locked((formula.formula, X.shape[1], V.shape[1], dtype.str)):
        out = formula.sum(axis=1, **options)
    return np.asarray(out, dtype=np.float64).reshape(X.shape[0], V.shape[1])


_compiled: set[tuple[object, ...]] = set()
_thread_lock = threading.Lock()
LOCK_FILE = os.path.join(tempfile.gettempdir(), "dkern-keops-compile.lock")


@contextlib.contextmanager
def _first_call_locked(key: tuple[object, ...]) -> Iterator[None]:
    """Hold a process-wide and a machine-wide lock the first time ``key`` runs here."""
    if key in _compiled:
        yield
        return
    with _thread_lock, open(LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
            _compiled.add(key)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
