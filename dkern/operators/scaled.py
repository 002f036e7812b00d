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


class IdentityPlusRowScaled(Operator):
    """``B = I + S K S`` on the flattened (n·t) vectors of (n, t) arrays, with ``S`` a
    symmetric (t, t) matrix per row: ``(B V)ᵢ = Vᵢ + Sᵢ (K (S V))ᵢ``, K acting on each of
    the t columns of V.

    The system matrix of Newton's method for a softmax likelihood over t classes: with
    ``Sᵢ² = Wᵢ / c``, ``Wᵢ = diag(πᵢ) − πᵢπᵢᵀ`` (the likelihood's Hessian at row i) it is
    :class:`IdentityPlusScaled`'s ``I + D K D`` with the classes coupled: SPD as one system
    of n·t unknowns, not as t systems side by side, so its vectors are the flattened
    arrays (:func:`flat_rows`, :func:`unflat_rows`), shape (n·t, 1).

    Parameters
    ----------
    base : Operator
        The square K, shape (n, n).
    S : dask.array.Array of shape (n, t, t)
        The per-row matrices.
    """

    def __init__(self, base: Operator, S: da.Array) -> None:
        if not base.is_square or S.ndim != 3 or S.shape[0] != base.shape[0] \
                or S.shape[1] != S.shape[2]:
            raise ValueError(f"I + S K S needs a square K and S of shape (n, t, t) with "
                             f"n = {base.shape[0]}; got K {base.shape} and S {S.shape}.")
        self.base, self.S, self.t = base, S.rechunk((base.col_chunks, -1, -1)), S.shape[1]
        n = base.shape[0] * self.t
        self.shape, self.dtype = (n, n), base.dtype
        self.col_chunks = tuple(c * self.t for c in base.col_chunks)

    @property
    def is_square(self) -> bool:
        return True

    def _matvec(self, V: da.Array) -> da.Array:
        if V.shape[1] != 1:
            raise ValueError(f"I + S K S takes one flattened vector, shape ({self.shape[0]}, 1);"
                             f" got {V.shape}.")
        U = unflat_rows(V.rechunk((self.col_chunks, -1)), self.t)
        return flat_rows(U + rows_times(self.S, self.base._matvec(rows_times(self.S, U))))


def flat_rows(V: da.Array) -> da.Array:
    """(n, t) as its row-major (n·t, 1) vector, chunk by chunk."""
    t = V.shape[1]
    return V.rechunk({1: -1}).map_blocks(_reshape, shape=(-1, 1), dtype=V.dtype,
                                         meta=np.empty((0, 0), V.dtype),
                                         chunks=(tuple(c * t for c in V.chunks[0]), (1,)))


def unflat_rows(v: da.Array, t: int) -> da.Array:
    """The (n, t) array of a row-major (n·t, 1) vector whose chunks hold whole rows."""
    return v.map_blocks(_reshape, shape=(-1, t), dtype=v.dtype, meta=np.empty((0, 0), v.dtype),
                        chunks=(tuple(c // t for c in v.chunks[0]), (t,)))


def _reshape(block: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    return block.reshape(shape)


def rows_times(S: da.Array, V: da.Array) -> da.Array:
    """``Sᵢ Vᵢ`` for every row i: S (n, t, t), V (n, t); (n, t) chunked like S's rows."""
    return da.blockwise(_rows_times_block, "ij", S, "ijk", V.rechunk((S.chunks[0], -1)), "ik",
                        concatenate=True, dtype=np.result_type(S.dtype, V.dtype),
                        meta=np.empty((0, 0)), token="dk-rows-times")


def _rows_times_block(S: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One task: ``Sᵢ vᵢ`` for a block of rows."""
    return np.einsum("nij,nj->ni", S, v)
