"""The lazy Gram operator ``K(X, Z)`` over dask row chunks; never materialised.

``op @ V`` is :func:`~dkern.operators.pairwise.pairwise_reduce` with the
backend's ``kernel_matvec`` block: one task per (row chunk of X, row chunk of
Z) evaluates its kernel block times its block of V (tiled by the backend, so a
task's memory is bounded whatever the chunk sizes), and a tree reduction adds
the partial sums over Z's chunks.
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np

from ..backends import block_backend, resolve_backend
from ..kernels import Kernel, check_n_features
from .base import Operator, data_rows
from .memory import fits_in_task
from .pairwise import pairwise_map, pairwise_reduce, pairwise_rows


class GramOperator(Operator):
    """``K[i, j] = kernel(X[i], Z[j])`` as a lazy operator of shape (n, m).

    Build it with :func:`dkern.gram`. Memory of one matvec task: the row blocks
    ``X_i`` (n_i × d) and ``Z_j`` (m_j × d), ``V_j`` (m_j × t), the float64
    partial sum (n_i × t), and for the numpy backend one kernel tile of 4 MiB
    (plus two temporaries of that size); never an n × m matrix.
    """

    def __init__(self, kernel: Kernel, X: da.Array, Z: da.Array | None, backend: str, *,
                 name: str = "dk-gram-mv", labels: tuple[str, str] = ("X", "Z")) -> None:
        check_n_features(kernel, X.shape[1])
        self.kernel, self.X, self.backend = kernel, X, backend
        self.task_name, self.labels = name, labels
        self.blocks = block_backend(backend)
        self.Z = X if Z is None else Z
        self.cached: da.Array | None = None  # the kernel blocks, once cache_blocks() ran
        self.shape = (X.shape[0], self.Z.shape[0])
        self.dtype = X.dtype
        self.col_chunks = self.Z.chunks[0]

    @property
    def is_square(self) -> bool:
        return self.Z is self.X

    def cache_blocks(self, max_bytes: int) -> bool:
        """Compute the kernel values once and persist their blocks, if they take at most
        ``max_bytes`` and one row chunk's blocks fit a task; return whether it cached.

        Later products multiply the cached (n_i, m_j) blocks (memory-bound BLAS) instead
        of evaluating the kernel again: worth it when many products follow (a CG solve with
        many right-hand sides). The memory used is ``n · m · itemsize`` over the workers.
        """
        if self.shape[0] * self.shape[1] * self.dtype.itemsize > max_bytes or not fits_in_task(
                self.X, max(self.col_chunks)):
            return False
        (self.cached,) = dask.persist(self.kernel_blocks())
        return True

    def _matvec(self, V: da.Array) -> da.Array:
        if self.cached is not None:
            return da.dot(self.cached, V.astype(self.dtype, copy=False))
        total = pairwise_reduce(self.blocks.kernel_matvec, self.X, self.Z, [(V, "cols")],
                                over="cols", width=V.shape[1], name=self.task_name,
                                labels=self.labels, kernel=self.kernel)
        return total.astype(self.dtype, copy=False)

    def gradient_matvec(self, V: Any) -> da.Array:
        """``∂K/∂θ_p V`` for every log-hyperparameter p (``kernel.theta``'s order), lazy.

        One pass over the chunk pairs, as a matvec, with the backend's
        ``kernel_grad_matvec`` block: each task holds a tile of the (tile, m_j, p)
        derivative, never a whole ∂K.

        Parameters
        ----------
        V : array-like of shape (m, t)

        Returns
        -------
        dask.array.Array of shape (n, t, p), float64
        """
        Vd = V if isinstance(V, da.Array) else da.from_array(np.asarray(V))
        Vd = Vd.rechunk((self.col_chunks, -1))
        t, p = Vd.shape[1], len(self.kernel.theta)
        total = pairwise_reduce(self.blocks.kernel_grad_matvec, self.X, self.Z, [(Vd, "cols")],
                                over="cols", width=t * p, name="dk-grad-mv",
                                labels=self.labels, kernel=self.kernel)
        return total.reshape(self.shape[0], t, p)

    def diag(self) -> da.Array:
        """``kernel(X[i], X[i])`` for a square operator; shape (n,)."""
        if not self.is_square:
            raise ValueError(f"diag() needs a square operator gram(kernel, X); this one has "
                             f"shape {self.shape} with Z given.")
        return pairwise_rows(self.blocks.kernel_diag, self.X, width=None, dtype=self.dtype,
                             name="dk-diag", kernel=self.kernel)

    def kernel_blocks(self) -> da.Array:
        """The kernel values as a lazy (n, m) dask array, chunked like X's rows by Z's.

        For a few columns (m small): persisting it keeps ``n · m`` values on the
        cluster; never compute it whole on the client.
        """
        return pairwise_map(self.blocks.kernel_block, self.X, self.Z, dtype=self.dtype,
                            name="dk-kblocks", labels=self.labels,
                            kernel=self.kernel)

    @property
    def T(self) -> GramOperator:
        """The transpose ``K(Z, X)`` (kernels are symmetric functions)."""
        if self.is_square:
            return self
        return GramOperator(self.kernel, self.Z, self.X, self.backend, name=self.task_name,
                            labels=self.labels[::-1])


def gram(kernel: Kernel, X: Any, Z: Any = None, *, backend: str = "auto",
         dtype: Any = None, check_finite: bool = True,
         name: str = "dk-gram-mv") -> GramOperator:
    """The lazy Gram operator ``K(X, Z)``, never materialised.

    Parameters
    ----------
    kernel : Kernel
        A dkern kernel, e.g. ``dkern.kernels.Gaussian(lengthscale=2.0)``.
    X : array-like of shape (n, d)
        numpy, dask or Zarr array, or ``(url, path)`` of an array in a Zarr store.
        Rows may be chunked; the feature axis must be one chunk.
    Z : array-like of shape (m, d), optional
        Same forms as X; ``None`` gives the square operator ``K(X, X)``.
    backend : {"auto", "numpy", "keops", "triton"}, default="auto"
        How blocks are computed; ``"auto"`` logs its choice and reason.
    dtype : {None, numpy.float32, numpy.float64}
        Compute dtype; by default float32 data stays float32, anything else is float64.
    check_finite : bool, default=True
        Reject NaN/Inf in X and Z (lazily, as chunks are read, for dask/Zarr input).
    name : str, default="dk-gram-mv"
        Prefix of the keys of ``op @ V``'s block tasks as the dashboard shows them, e.g.
        ``"dk-predict"`` (dkern's own names are listed in cluster/task-names.md).

    Returns
    -------
    GramOperator
        Supports ``op @ V`` for V of shape (m,) or (m, t), ``op.T``, ``op.diag()``
        and ``op + alpha`` (``K + alpha I``, square operators only).
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a dkern kernel such as dkern.kernels.Gaussian(1.0); "
                        f"got {type(kernel).__name__}.")
    concrete = resolve_backend(backend)
    Xd = data_rows(X, name="X", dtype=dtype, check_finite=check_finite)
    Zd = None
    if Z is not None:
        Zd = data_rows(Z, name="Z", dtype=Xd.dtype, check_finite=check_finite)
        if Zd.shape[1] != Xd.shape[1]:
            raise ValueError(f"X and Z must have the same number of features; got X of shape "
                             f"{Xd.shape} and Z of shape {Zd.shape}.")
    return GramOperator(kernel, Xd, Zd, concrete, name=name)
