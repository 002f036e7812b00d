"""The KeOps backend: block functions as KeOps reductions.

KeOps never stores a block: it streams ``k(x_i, z_j)`` through registers (GPU)
or cache (CPU) and reduces over ``j``. Three reductions serve the passes here:

==========================  =================================  ======================
block                        KeOps reduction                    of the formula
==========================  =================================  ======================
:func:`matvec_block_keops`   ``Sum``                            ``k(x, z) v``
:func:`log_sums_block_keops` ``Max_SumShiftExpWeight``          ``log k(x, z)``, ``[1, t]``
:func:`nearest_block_keops`  ``KMin_ArgKMin``                   ``‖x − z‖²``
==========================  =================================  ======================

float32 sums use KeOps' block sum scheme, which keeps float32 throughput with far
smaller rounding error than a plain running sum. A pass whose kernel has no KeOps
form runs numpy's block instead and says so once per process
(:func:`log_fallback_once`).

KeOps compiles each new formula into a shared cache folder, and two processes
compiling the same formula at once corrupt it ("Incorrect info file", seen with
two LocalCluster workers). The first call of a formula in a process therefore
runs under an inter-process file lock; later calls run unlocked.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import threading
from collections.abc import Iterator

import numpy as np

from ..kernels import Gaussian, Kernel
from ..kernels.stationary import keops_scaled_sqdist
from .neighbors import PAD_INDEX, best_k, nearest_block

logger = logging.getLogger(__name__)


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


def keops_log_form_missing(kernel: Kernel | None, box_width: float | None) -> str | None:
    """Why ``log k`` has no KeOps form here, or None when it has one.

    The Gaussian's log is ``-‖x − z‖² / 2ℓ²``, finite at every distance. The box's is 0
    or ``-inf``, and any other kernel's log underflows to ``-inf`` far from the data:
    KeOps' shift by the row maximum would turn a row of ``-inf`` into NaN, where numpy's
    block gives the empty sum ``(-inf, 0)``.
    """
    if box_width is not None:
        return "the box kernel's log weights are 0 or -inf (no KeOps log form)"
    if type(kernel) is not Gaussian:
        return (f"the {type(kernel).__name__} kernel has no KeOps log form (only a dkern "
                "Gaussian has one)")
    return None


#: Log weights are floored here in KeOps' log-sum-exp (log_sums_block_keops): e^-1e300 is 0
#: in float64 as e^-inf is, and a finite floor keeps KeOps' running shift from inf - inf.
LOG_WEIGHT_FLOOR = -1e300
#: Scaled differences below this cannot overflow a squared distance (d up to 10⁸ features):
#: KeOps' log-sums then need no floor.
FAR_REACH = 1e150


def log_sums_block_keops(x: np.ndarray, z: np.ndarray, t: np.ndarray | None = None, *,
                         kernel: Kernel | None, scale: float = 1.0) -> np.ndarray:
    """``[m, s₀, s₁ … s_T]`` of the Gaussian weights ``k(x/scale, z/scale)`` per row of x.

    As :func:`dkern.backends.smoothing.weighted_log_sums_block`, by KeOps'
    ``Max_SumShiftExpWeight`` reduction, which keeps exactly that form:
    ``m = maxⱼ log kᵢⱼ`` and ``s = Σⱼ e^{log kᵢⱼ − m} [1, tⱼ]``.

    Parameters
    ----------
    x : ndarray of shape (n, d)
    z : ndarray of shape (m, d)
    t : ndarray of shape (m, T), optional
    kernel : Gaussian
        Exactly a dkern Gaussian (:func:`keops_log_form_missing`); its lengthscale ℓ
        (scalar or one per feature) times ``scale`` is the width.
    scale : float, default=1.0

    Returns
    -------
    ndarray of shape (n, 2 + T), float64
    """
    from pykeops.numpy import LazyTensor

    if type(kernel) is not Gaussian:
        raise ValueError(f"log_sums_block_keops takes a dkern Gaussian; got {kernel!r}. Other "
                         "kernels have no KeOps log form: use weighted_log_sums_block.")
    x, z = np.ascontiguousarray(x, np.float64), np.ascontiguousarray(z, np.float64)
    ones = np.ones((len(z), 1))
    values = ones if t is None else np.hstack([ones, np.asarray(t, dtype=np.float64)])
    if len(z) == 0 or len(x) == 0:  # the empty sum; KeOps wants rows on both sides
        return np.tile([-np.inf] + [0.0] * values.shape[1], (len(x), 1))
    ell = np.asarray(kernel.lengthscale, dtype=np.float64) * scale
    if ell.ndim and ell.shape != (x.shape[1],):
        raise ValueError(f"Gaussian: lengthscale has {ell.shape[0]} entries but the data has "
                         f"{x.shape[1]} features; give one per feature or a scalar.")
    log_k = keops_scaled_sqdist(x, z, ell, -0.5)
    # Squared distances that overflow give log weights of -inf, and KeOps' running shift
    # from -inf gives e^(-inf + inf) = NaN, in a row's sums (a few such pairs before its
    # maximum) or all of them (every pair). A floor where e^(log k − m) is 0 anyway keeps the
    # shifts finite; a row whose maximum is the floor has only zero weights: the empty sums.
    # Only rows that far need it (the floor costs 10-20% on this formula, measured on CPU).
    reach = (np.abs(x).max() + np.abs(z).max()) / float(np.min(ell))  # largest |x - z| / l
    if not reach < FAR_REACH:
        log_k = log_k.clamp(LOG_WEIGHT_FLOOR, 0.0)
    weights = LazyTensor(np.ascontiguousarray(values)[None, :, :])
    with _first_call_locked(("lse", log_k.formula, x.shape[1], values.shape[1])):
        out = log_k.reduction("Max_SumShiftExpWeight", other=weights, axis=1)
    out = np.asarray(out, dtype=np.float64).reshape(len(x), 1 + values.shape[1])
    empty = out[:, 0] <= LOG_WEIGHT_FLOOR
    out[empty, 0], out[empty, 1:] = -np.inf, 0.0
    return out


def nearest_block_keops(x: np.ndarray, z: np.ndarray, limit: np.ndarray, index: np.ndarray,
                        *, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of z to each row of x by KeOps' ``KMin_ArgKMin`` reduction.

    As :func:`dkern.backends.neighbors.nearest_block` (same arguments, same result):
    KeOps computes ``‖x − z‖²`` from the differences, keeps the first of equal values
    as it walks z in order (ties to the lower index), and the result is ordered by
    (distance, index) once more. A block of fewer than k training rows (or of no query
    row) is numpy's: KeOps' k is part of the compiled formula, one formula per k, not
    per block size.

    Returns
    -------
    (ndarray of shape (n, k), ndarray of shape (n, k))
        Squared distances (float64) and global indices (int64); ``(inf, PAD_INDEX)``
        beyond ``limit``.
    """
    from pykeops.numpy import LazyTensor

    if len(z) < k or len(x) == 0:
        return nearest_block(x, z, limit, index, k=k)
    x, z = np.ascontiguousarray(x, np.float64), np.ascontiguousarray(z, np.float64)
    sqdist = LazyTensor(x[:, None, :]).sqdist(LazyTensor(z[None, :, :]))
    with _first_call_locked(("kmin", sqdist.formula, x.shape[1], int(k))):
        sq, local = sqdist.Kmin_argKmin(int(k), axis=1)
    sq = np.asarray(sq, dtype=np.float64).reshape(len(x), k)
    idx = np.asarray(index, dtype=np.int64)[np.asarray(local).reshape(len(x), k), 0]
    beyond = sq > limit
    sq[beyond], idx[beyond] = np.inf, PAD_INDEX
    return best_k(np.repeat(np.arange(len(x)), k), sq.ravel(), idx.ravel(), len(x), k)


_logged: set[tuple[str, str, str]] = set()


def log_fallback_once(block: str, reason: str, backend: str = "keops") -> None:
    """Log, once per process and reason, that ``block`` runs numpy's block under
    ``backend``."""
    if (backend, block, reason) in _logged:
        return
    _logged.add((backend, block, reason))
    logger.info("backend=%r: %s run with numpy: %s. Results are the same; "
                "only the speed differs.", backend, block, reason)


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
