"""The Nyström normal-equation block: ``K(x, C)ᵀ (K(x, C) v)`` for one row chunk.

Falkon's conjugate gradient needs ``K_nmᵀ K_nm v`` once per iteration. Over one
row chunk ``x`` that is ``Σ_tiles K_tᵀ (K_t v)``: each tile of kernel values
``K_t = K(x_tile, C)`` is used twice while it is still in cache, so the pass
reads the data once and never holds more than one tile of the n × M matrix.
"""

from __future__ import annotations

import numpy as np

from ..kernels import Kernel
from .keops_backend import matvec_block_keops
from .numpy_backend import TILE_BYTES, single_threaded_blas


def normal_matvec_block_numpy(kernel: Kernel, x: np.ndarray, C: np.ndarray, v: np.ndarray,
                              tile_rows: int | None = None) -> np.ndarray:
    """``K(x, C)ᵀ (K(x, C) v)`` holding one ``tile_rows × M`` kernel tile at a time.

    .. math:: \\mathrm{out} = \\sum_{\\text{tiles } t} K(x_t, C)^\\top (K(x_t, C)\\, v)

    Parameters
    ----------
    kernel : Kernel
    x : ndarray of shape (n_i, d)
        One row chunk of the data.
    C : ndarray of shape (M, d)
        The Nyström centres.
    v : ndarray of shape (M, t)
    tile_rows : int, optional
        Rows per tile; default: as many as fit in ``TILE_BYTES`` (4 MiB) of kernel values.

    Returns
    -------
    ndarray of shape (M, t), float64
    """
    if tile_rows is None:
        tile_rows = max(1, TILE_BYTES // (max(1, C.shape[0]) * np.dtype(x.dtype).itemsize))
    out = np.zeros((C.shape[0], v.shape[1]), dtype=np.float64)
    v = v.astype(np.result_type(x.dtype, np.float32), copy=False)
    with single_threaded_blas():
        for i0 in range(0, x.shape[0], tile_rows):
            Kt = kernel(x[i0:i0 + tile_rows], C)  # shape: (tile_rows, M)
            out += Kt.T @ (Kt @ v)
    return out


def normal_matvec_block_keops(kernel: Kernel, x: np.ndarray, C: np.ndarray,
                              v: np.ndarray) -> np.ndarray:
    """``K(x, C)ᵀ (K(x, C) v)`` as two KeOps sum reductions; memory O((n_i + M)·(d + t)).

    Both reductions are the Gram backend's ``kernel(X, Z) @ V`` formula (first
    over the centres, then over the rows), so no new formula is compiled.

    Parameters
    ----------
    kernel : Kernel
    x : ndarray of shape (n_i, d)
    C : ndarray of shape (M, d)
    v : ndarray of shape (M, t)

    Returns
    -------
    ndarray of shape (M, t), float64
    """
    w = matvec_block_keops(kernel, x, C, v)  # shape: (n_i, t)
    return matvec_block_keops(kernel, C, x, w)
