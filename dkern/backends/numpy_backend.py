"""The numpy/BLAS backend: one kernel block times one vector block, tiled.

The block ``K(X, Z) @ V`` is computed tile by tile: a tile of ``tile_rows ×
tile_cols`` kernel values is small enough to stay in the core's L2 cache while
BLAS fills it, the kernel's elementwise function transforms it in place, and a
matrix product folds it into the output. Memory traffic, not arithmetic, is
what a big block pays for; cache-sized tiles avoid it. BLAS runs single-threaded
inside a task: parallelism comes from dask running tasks side by side, and a
multithreaded BLAS on tiles this small is slower than one thread (benchmarks/RESULTS.md).

A Gaussian (or ``c * Gaussian``) on few features skips the tiles: the fused C loop of
:mod:`.fused_cpu` computes its products without storing kernel values, where it is built.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from ..kernels import Kernel
from .fused_cpu import matvec_block_fused

#: Default tile: 2048 columns and 4 MiB of kernel values (256 rows in float64,
#: 512 in float32): a tile that stays in a 2 MiB L2 cache while BLAS fills it.
TILE_COLS = 2048
TILE_BYTES = 4 * 2**20


def default_tile(dtype: np.dtype) -> tuple[int, int]:
    """(tile_rows, tile_cols) for kernel values of ``dtype``."""
    return TILE_BYTES // (TILE_COLS * np.dtype(dtype).itemsize), TILE_COLS


def matvec_block_numpy(kernel: Kernel, X: np.ndarray, Z: np.ndarray, V: np.ndarray,
                       tile_rows: int | None = None, tile_cols: int | None = None) -> np.ndarray:
    """``kernel(X, Z) @ V`` without holding more than one tile of the kernel block.

    Parameters
    ----------
    kernel : Kernel
    X : ndarray of shape (n, d)
    Z : ndarray of shape (m, d)
    V : ndarray of shape (m, t)
    tile_rows, tile_cols : int, optional
        Tile shape (default ``default_tile``); peak extra memory is about
        ``3 · tile_rows · tile_cols`` values, 12 MiB by default.

    Returns
    -------
    ndarray of shape (n, t), float64
        Tiles are summed in float64 whatever the input precision.
    """
    if (fused := matvec_block_fused(kernel, X, Z, V)) is not None:  # no tiles to size
        return fused
    if tile_rows is None or tile_cols is None:
        tile_rows, tile_cols = default_tile(X.dtype)
    out = np.zeros((X.shape[0], V.shape[1]), dtype=np.float64)
    with single_threaded_blas():
        for j0 in range(0, Z.shape[0], tile_cols):
            Zt, Vt = Z[j0:j0 + tile_cols], V[j0:j0 + tile_cols]
            for i0 in range(0, X.shape[0], tile_rows):
                out[i0:i0 + tile_rows] += kernel(X[i0:i0 + tile_rows], Zt) @ Vt
    return out


_BLAS_LOCK = threading.Lock()
_blas_users = 0
_blas_limiter: Any = None


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Limit BLAS to one thread while any caller is inside (tasks run side by side instead).

    BLAS's thread count is one setting for the whole process, and dask's threaded
    scheduler enters this from several threads at once. Each entry saving and restoring
    that setting by itself would let a thread save the 1 another had set, and restore it
    last: the process's BLAS would stay single-threaded after the pass (the client's
    M × M factorisations then ran on one core). So the first caller in sets the limit and
    the last one out restores what it found. One limit remains: OpenBLAS 0.3.30 and 0.3.31
    (numpy's and scipy's wheels) ignore a raise of the count, from any thread, while a
    thread that lowered it is alive, so after a pass on dask's threaded scheduler (whose
    pool threads live on) the calling process's BLAS can stay at one thread. Worker
    processes, where BLAS has one thread anyway, are not affected.
    """
    global _blas_users, _blas_limiter
    with _BLAS_LOCK:
        if _blas_users == 0:
            _blas_limiter = _blas_controller().limit(limits=1, user_api="blas")
        _blas_users += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _blas_users -= 1
            if _blas_users == 0:
                _blas_limiter.restore_original_limits()
                _blas_limiter = None


@functools.lru_cache(maxsize=1)
def _blas_controller() -> ThreadpoolController:
    """One controller per process: building it scans the loaded libraries (slow)."""
    return ThreadpoolController()
