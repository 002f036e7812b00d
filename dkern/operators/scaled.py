"""``I + D K D``: the identity plus a square operator scaled by a diagonal on both sides."""

from __future__ import annotations

import dask.array as da
import numpy as np

from .base import Operator


class IdentityPlusScaled(Operator):
    """``B = I + D K D`` with ``D = diag(d)``, lazily: ``B V = V + d ⊙ K (d ⊙ V)``.

    The system matrix of Newton's method for a logistic likelihood: with ``d = W^{1/2}``
    it is Rasmussen & Williams' (2006) ``B = I + W^{1/2} K W^{1/2}`` (Alg. 3.1 line 5,
    Alg. 3.2 line 5), SPD with eigenvalues in ``[1, 1 + max(d)² λ_max(K)]``, so block CG
    solves it without a preconditioner for kernels of moderate scale.

    Parameters
    ----------
    base : Operator
        The square K, shape (n, n).
    d : dask.array.Array of shape (n,) or (n, t)
        One diagonal for every column of V, or column j of ``d`` for column j of V (t
        problems' systems solved side by side).
    """

    def __init__(self, base: Operator, d: da.Array) -> None:
        if not base.is_square:
            raise ValueError(f"I + D K D needs a square operator over one set of points "
                             f"(gram(kernel, X)); got shape {base.shape} with Z given.")
        if d.ndim not in (1, 2) or d.shape[0] != base.shape[0]:
            raise ValueError(f"d must have shape ({base.shape[0]},) or ({base.shape[0]}, t) "
                             f"to scale an operator of shape {base.shape}; got {d.shape}.")
        d2 = d[:, None] if d.ndim == 1 else d  # shape: (n, 1) or (n, t)
        self.base, self.d = base, d2.rechunk((base.col_chunks, -1))
        self.shape, self.dtype, self.col_chunks = base.shape, base.dtype, base.col_chunks

    @property
    def is_square(self) -> bool:
        return True

    def _matvec(self, V: da.Array) -> da.Array:
        KdV = self.base._matvec(self.d * V)
        if len(V.chunks[1]) != 1 or len(KdV.chunks[1]) != 1:
            return V + self.d * KdV
        # one layer instead of two elementwise ones, its meta given: a CG step builds this
        # graph every iteration, and dask's metadata inference cost more than small blocks.
        # d, (n, 1) or (n, t), enters through its own column index (one chunk) and
        # broadcasts in the block as it did in dask's layers.
        dtype = np.result_type(V.dtype, self.d.dtype, KdV.dtype)
        return da.blockwise(_plus_scaled_block, "ij", V, "ij", self.d, "ik", KdV, "ij",
                            concatenate=True, dtype=dtype, meta=np.empty((0, 0), dtype),
                            token="dk-scale")


def _plus_scaled_block(v: np.ndarray, d: np.ndarray, kdv: np.ndarray) -> np.ndarray:
    """One task: ``v + d ⊙ K(d ⊙ v)`` for a block of rows (d broadcast over columns)."""
    return v + d * kdv
