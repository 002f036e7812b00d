"""The Nyström operator ``K_nm = K(X, C)``: the Gram operator against M centres.

It is a :class:`~dkern.operators.gram.GramOperator` whose columns are the
centres ``C`` (M × d, held by the client and one chunk on the cluster), plus
what Falkon needs beyond ``K_nm β``, each a :func:`pairwise_reduce` over X's
row chunks:

* ``K_nmᵀ K_nm v``: the backend's ``normal_matvec`` block per row chunk, summed
  over the chunks, so the data are read once per CG iteration;
* ``K_nmᵀ Y``: the transpose operator's product, summed over the chunks.

Only M-sized results ever leave the cluster. When ``K_nm`` is small enough
(``cache_blocks``), its row blocks are computed once and persisted on the
workers, and each product becomes BLAS passes over them (the block functions
below) instead of kernel evaluations.
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

from ..backends import resolve_backend
from ..backends.numpy_backend import single_threaded_blas
from ..io import as_rows
from ..kernels import Kernel, check_n_features
from .base import data_rows
from .gram import GramOperator
from .memory import fits_in_task
from .pairwise import pairwise_reduce


def cached_matvec_block(K: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One task: ``K v`` from a cached block K of shape (n_i, M); shape (n_i, t)."""
    with single_threaded_blas():
        return K @ v.astype(K.dtype, copy=False)


def cached_normal_block(K: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One task: ``Kᵀ (K v)`` from a cached block K of shape (n_i, M); shape (M, t)."""
    with single_threaded_blas():
        return K.T @ (K @ v.astype(K.dtype, copy=False))


def cached_rmatvec_block(K: np.ndarray, c: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One task: ``Kᵀ y`` from a cached block K = k(x_i, C) (the centres ``c`` are in K
    already); shape (M, t)."""
    with single_threaded_blas():
        return K.T @ y.astype(K.dtype, copy=False)


class NystromOperator(GramOperator):
    """``K_nm[i, j] = kernel(X[i], C[j])`` for n row-chunked points and M centres.

    Parameters
    ----------
    kernel : Kernel
    X : array-like of shape (n, d)
        numpy, dask or Zarr; rows may be chunked.
    centers : ndarray of shape (M, d)
        Held by the client; one chunk on the cluster (M is small).
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
    dtype : {None, numpy.float32, numpy.float64}
        Compute dtype; by default float32 data stays float32, anything else is float64.
    name : str, default="dk-knm-v"
        Prefix of the keys of ``op @ v``'s block tasks on the dashboard (e.g.
        ``"dk-predict"``); the other products have their own names
        (``dk-ktk-v``, ``dk-kt-y``).
    """

    def __init__(self, kernel: Kernel, X: Any, centers: Any, backend: str = "auto",
                 dtype: Any = None, name: str = "dk-knm-v") -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel must be a dkern kernel such as dkern.kernels.Gaussian(1.0); "
                            f"got {type(kernel).__name__}.")
        Xd = data_rows(X, dtype=dtype)
        C = np.asarray(centers, dtype=Xd.dtype)
        if C.ndim != 2 or C.shape[1] != Xd.shape[1] or len(C) == 0:
            raise ValueError(f"centers must have shape (M, {Xd.shape[1]}) with M >= 1 to "
                             f"match X of shape {Xd.shape}; got shape {C.shape}.")
        check_n_features(kernel, C.shape[1])
        if not np.all(np.isfinite(C)):
            raise ValueError("centers contain NaN or infinity; pick centres among finite rows.")
        Cd = da.from_array(C, chunks=C.shape, name=f"dk-centers-{tokenize(C)}")
        super().__init__(kernel, Xd, Cd, resolve_backend(backend), name=name, labels=("X", "C"))
        self.C = C
        self.cached: da.Array | None = None

    def cache_blocks(self, max_bytes: int) -> bool:
        """Compute ``K_nm`` once and persist its row blocks, with X, if they take <= ``max_bytes``.

        Later products then read the cached blocks instead of re-evaluating the
        kernel (the Falkon iteration becomes memory-bound BLAS), and whatever else
        reads X (a row sample) reads the persisted copy, not its store. Returns whether
        it cached; the memory used is ``n · (M + d) · itemsize`` over the workers. When
        ``K_nm`` is too large (in all, or one row block for one task of a worker:
        :func:`~dkern.operators.memory.fits_in_task`) but X fits, X alone is persisted,
        so passes stop re-reading (and re-verifying) it from its store.
        """
        knm_bytes = self.shape[0] * self.shape[1] * self.dtype.itemsize
        if knm_bytes + self.X.nbytes > max_bytes or not fits_in_task(self.X, self.shape[1]):
            if self.X.nbytes <= max_bytes:
                (self.X,) = dask.persist(self.X)
            return False
        self.X, self.cached = dask.persist(self.X, self.kernel_blocks())
        return True

    def _matvec(self, V: da.Array) -> da.Array:
        if self.cached is None:
            return super()._matvec(V)
        out = pairwise_reduce(cached_matvec_block, self.cached, V, over="cols",
                              width=V.shape[1], name=f"{self.task_name}-c",
                              labels=("X", "V"))
        return out.astype(self.dtype, copy=False)

    def normal_matvec(self, v: Any) -> da.Array:
        """``K_nmᵀ (K_nm v)`` for v of shape (M,) or (M, t), lazily; shape (M, t), float64.

        .. math:: K_{nm}^\\top K_{nm} v = \\sum_{\\text{chunks } i} K(X_i, C)^\\top K(X_i, C)\\, v
        """
        V = self.as_operand(np.asarray(v, dtype=np.float64).reshape(self.shape[1], -1))
        if self.cached is not None:
            return pairwise_reduce(cached_normal_block, self.cached, V, over="rows",
                                   width=V.shape[1], name="dk-ktk-v-c",
                                   labels=("X", "V"))
        return pairwise_reduce(self.blocks.normal_matvec, self.X, self.Z, [(V, "cols")],
                               over="rows", width=V.shape[1], name="dk-ktk-v",
                               labels=self.labels, kernel=self.kernel)

    def rmatvec(self, Y: Any) -> da.Array:
        """``K_nmᵀ Y`` for Y of shape (n,) or (n, t), lazily; shape (M, t), float64."""
        Yd = as_rows(Y, name="y", ndim=(1, 2), dtype=np.float64)
        if Yd.shape[0] != self.shape[0]:
            raise ValueError(f"y must have {self.shape[0]} rows, one per row of X; got shape "
                             f"{Yd.shape}.")
        Y2 = Yd.reshape(Yd.shape[0], -1).rechunk((self.X.chunks[0], -1))
        if self.cached is None:
            transpose = GramOperator(self.kernel, self.Z, self.X, self.backend,
                                     name="dk-kt-y", labels=("C", "X"))
            return (transpose @ Y2).astype(np.float64)
        return pairwise_reduce(cached_rmatvec_block, self.cached, self.Z, [(Y2, "rows")],
                               over="rows", width=Y2.shape[1], name="dk-kt-y-c",
                               labels=("X", "C"))

    def __repr__(self) -> str:
        return f"<NystromOperator shape={self.shape} dtype={self.dtype}>"
