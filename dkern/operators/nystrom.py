"""The Nyström operator ``K_nm = K(X, C)``: a tall lazy kernel block against M centres.

Falkon needs three products, each a dask graph over the row chunks of X with
the centres ``C`` (M × d) and the small vectors as numpy arguments:

* ``K_nmᵀ K_nm v``: one task per row chunk returns an (M, t) partial sum and a
  tree reduction adds them, so the data are read once per CG iteration;
* ``K_nmᵀ Y``: the same with the right-hand sides chunked like X's rows;
* ``K_nm β``: row-chunked and lazy, for predictions.

Only M-sized results ever leave the cluster. When ``K_nm`` is small enough
(``cache_blocks``), its row blocks are computed once and persisted on the
workers, and each product becomes two BLAS matrix-vector passes over them.
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

from ..backends import matvec_block_keops, matvec_block_numpy, resolve_backend
from ..backends.normal import normal_matvec_block_keops, normal_matvec_block_numpy
from ..backends.numpy_backend import single_threaded_blas
from ..io import as_rows
from ..kernels import Kernel, check_n_features
from .base import data_rows


def normal_block(x: np.ndarray, *, kernel: Kernel, C: np.ndarray, v: np.ndarray,
                 backend: str) -> np.ndarray:
    """One task: ``K(x, C)ᵀ K(x, C) v`` as a (1, M, t) float64 partial sum."""
    if backend == "keops":
        return normal_matvec_block_keops(kernel, x, C, v)[None]
    return normal_matvec_block_numpy(kernel, x, C, v)[None]


def transpose_block(x: np.ndarray, y: np.ndarray, *, kernel: Kernel, C: np.ndarray,
                    backend: str) -> np.ndarray:
    """One task: ``K(C, x) y`` as a (1, M, t) float64 partial sum."""
    block = matvec_block_keops if backend == "keops" else matvec_block_numpy
    return block(kernel, C, x, y)[None]


def kernel_block(x: np.ndarray, *, kernel: Kernel, C: np.ndarray) -> np.ndarray:
    """One task: the kernel block ``K(x, C)``; shape (n_i, M), x's dtype."""
    with single_threaded_blas():
        return kernel(x, C)


def cached_normal_block(K: np.ndarray, *, v: np.ndarray) -> np.ndarray:
    """One task: ``Kᵀ (K v)`` from a cached block K of shape (n_i, M); shape (1, M, t)."""
    with single_threaded_blas():
        return (K.T @ (K @ v.astype(K.dtype, copy=False))).astype(np.float64)[None]


def forward_block(x: np.ndarray, *, kernel: Kernel, C: np.ndarray, beta: np.ndarray,
                  backend: str, out_dtype: np.dtype) -> np.ndarray:
    """One task: ``K(x, C) β``; shape (n_i, t)."""
    block = matvec_block_keops if backend == "keops" else matvec_block_numpy
    return block(kernel, x, C, beta).astype(out_dtype, copy=False)


class NystromOperator:
    """``K_nm[i, j] = kernel(X[i], C[j])`` for n row-chunked points and M centres.

    Parameters
    ----------
    kernel : Kernel
    X : array-like of shape (n, d)
        numpy, dask or Zarr; rows may be chunked.
    centers : ndarray of shape (M, d)
        Held by the client and shipped inside each task (M is small).
    backend : {"auto", "numpy", "keops"}, default="auto"
    dtype : {None, numpy.float32, numpy.float64}
        Compute dtype; by default float32 data stays float32, anything else is float64.
    """

    def __init__(self, kernel: Kernel, X: Any, centers: Any, backend: str = "auto",
                 dtype: Any = None) -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a dkern kernel such as dkern.kernels.Gaussian(1.0); "
                            f"got {type(kernel).__name__}.")
        self.kernel, self.backend = kernel, resolve_backend(backend)
        self.X = data_rows(X, dtype=dtype)
        C = np.asarray(centers, dtype=self.X.dtype)
        if C.ndim != 2 or C.shape[1] != self.X.shape[1] or len(C) == 0:
            raise ValueError(f"centers must have shape (M, {self.X.shape[1]}) with M >= 1 to "
                             f"match X of shape {self.X.shape}; got shape {C.shape}.")
        check_n_features(kernel, C.shape[1])
        if not np.all(np.isfinite(C)):
            raise ValueError("centers contain NaN or infinity; pick centres among finite rows.")
        self.C = C
        self.shape = (self.X.shape[0], C.shape[0])
        self.blocks: da.Array | None = None

    def cache_blocks(self, max_bytes: int) -> bool:
        """Compute ``K_nm`` once and persist its row blocks if it takes <= ``max_bytes``.

        Later products then read the cached blocks instead of re-evaluating the
        kernel (the Falkon iteration becomes memory-bound BLAS). Returns whether
        it cached; the memory used is ``n · M · itemsize`` over the workers. When
        ``K_nm`` is too large but X fits, X is persisted instead, so passes stop
        re-reading (and re-verifying) it from its store.
        """
        nbytes = self.shape[0] * self.shape[1] * self.X.dtype.itemsize
        if nbytes > max_bytes:
            if self.X.nbytes <= max_bytes:
                (self.X,) = dask.persist(self.X)
            return False
        token = tokenize(self.kernel, self.X.name, self.C)
        (self.blocks,) = dask.persist(da.map_blocks(
            kernel_block, self.X, chunks=(self.X.chunks[0], (self.shape[1],)),
            dtype=self.X.dtype, meta=np.empty((0, 0), self.X.dtype),
            name=f"dkern-knm-blocks-{token}", kernel=self.kernel, C=self.C))
        return True

    def normal_matvec(self, v: np.ndarray) -> da.Array:
        """``K_nmᵀ (K_nm v)`` for v of shape (M, t), lazily; shape (M, t), float64.

        .. math:: K_{nm}^\\top K_{nm} v = \\sum_{\\text{chunks } i} K(X_i, C)^\\top K(X_i, C)\\, v
        """
        v = np.asarray(v, dtype=np.float64).reshape(self.shape[1], -1)
        token = tokenize(self.kernel, self.X.name, self.C, v, self.backend)
        chunks = ((1,) * self.X.numblocks[0], (self.shape[1],), (v.shape[1],))
        if self.blocks is not None:
            parts = da.map_blocks(cached_normal_block, self.blocks, chunks=chunks, new_axis=2,
                                  dtype=np.float64, meta=np.empty((0, 0, 0)),
                                  name=f"dkern-knm-normal-cached-{token}", v=v)
            return parts.sum(axis=0, split_every=8, dtype=np.float64)
        parts = da.map_blocks(
            normal_block, self.X,
            chunks=((1,) * self.X.numblocks[0], (self.shape[1],), (v.shape[1],)),
            new_axis=2, dtype=np.float64, meta=np.empty((0, 0, 0)),
            name=f"dkern-knm-normal-{token}",
            kernel=self.kernel, C=self.C, v=v, backend=self.backend)
        return parts.sum(axis=0, split_every=8, dtype=np.float64)

    def rmatvec(self, Y: Any) -> da.Array:
        """``K_nmᵀ Y`` for Y of shape (n,) or (n, t), lazily; shape (M, t), float64."""
        Yd = as_rows(Y, name="y", ndim=(1, 2), dtype=np.float64)
        if Yd.shape[0] != self.shape[0]:
            raise ValueError(f"y must have {self.shape[0]} rows, one per row of X; got shape "
                             f"{Yd.shape}.")
        Yd = Yd.reshape(Yd.shape[0], -1).rechunk((self.X.chunks[0], -1))
        token = tokenize(self.kernel, self.X.name, Yd.name, self.C, self.backend)
        parts = da.map_blocks(transpose_block, self.X, Yd,
            chunks=((1,) * self.X.numblocks[0], (self.shape[1],), (Yd.shape[1],)), new_axis=2,
            dtype=np.float64, meta=np.empty((0, 0, 0)), name=f"dkern-knm-rmatvec-{token}",
            kernel=self.kernel, C=self.C, backend=self.backend)
        return parts.sum(axis=0, split_every=8, dtype=np.float64)

    def matvec(self, beta: np.ndarray) -> da.Array:
        """``K_nm β`` for β of shape (M,) or (M, t), lazily, chunked like X's rows."""
        b = np.asarray(beta, dtype=np.float64)
        if b.ndim not in (1, 2) or b.shape[0] != self.shape[1]:
            raise ValueError(f"beta must have shape ({self.shape[1]},) or ({self.shape[1]}, t), "
                             f"one row per centre; got shape {b.shape}.")
        b2 = b.reshape(self.shape[1], -1)
        token = tokenize(self.kernel, self.X.name, self.C, b2, self.backend)
        out = da.map_blocks(
            forward_block, self.X, chunks=(self.X.chunks[0], (b2.shape[1],)), dtype=self.X.dtype,
            meta=np.empty((0, 0), self.X.dtype), name=f"dkern-knm-matvec-{token}",
            kernel=self.kernel, C=self.C, beta=b2, backend=self.backend, out_dtype=self.X.dtype)
        return out[:, 0] if b.ndim == 1 else out

    def __repr__(self) -> str:
        return f"<NystromOperator shape={self.shape} dtype={self.X.dtype}>"
